"""Planner vs published layouts: for each fully specified published run, where does the published
layout rank among the planner's candidates, and what does the best plan gain (predicted)?

    python benchmarks/plan_vs_published.py

Both sides are predicted with the same estimator; the published layout is scored as published
(its own flags: fused attention or not, gradient-reduce overlap), the search space uses today's
defaults (fused attention, overlap), so part of the gain is software, the rest layout.
"""
from __future__ import annotations

import sys


from paraplan.calibration import load_cases
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.planner.search import score_batch
from paraplan.planner.space import SpaceOptions, compose


def rank_of(case) -> tuple[int, int, float, float]:
    """(rank of the published layout among feasible candidates, feasible count, published s, best s)."""
    curves = analytical_curves(case.cluster.accelerator)
    published = estimate(case.model, case.job, case.cluster, case.plan, curves=curves).step_time_s
    batch, _, _ = compose(case.model, case.job, case.cluster, SpaceOptions())
    step, mem, og, oh, on = score_batch(case.model, case.job, case.cluster, batch, curves, 1.0)
    ok = ~(og | oh | on)
    better = int((step[ok] < published - 1e-12).sum())
    best = float(step[ok].min()) if ok.any() else float("nan")
    return better + 1, int(ok.sum()), published, best


def main() -> int:
    cases, _ = load_cases()
    seen = set()
    print(f"{'published run':66s} {'rank':>7s} {'of':>7s} {'published s':>11s} {'best s':>8s} {'gain':>6s}")
    for c in cases:
        key = (c.model.name, c.cluster.name, c.cluster.num_gpus, c.job, c.plan)
        if key in seen:
            continue
        seen.add(key)
        rank, n, pub, best = rank_of(c)
        print(f"{c.label[:66]:66s} {rank:7d} {n:7d} {pub:11.3f} {best:8.3f} {100 * (pub / best - 1):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
