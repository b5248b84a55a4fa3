"""Baseline vs HEAT-style tiled SimpleX step time, side by side, and per-tile measured vs predicted.

    python benchmarks/cf_tiling.py [--threads 1] [--users 2000 --items 8000 --interactions 60000]
                                   [--dim 64 --negatives 128 --batch 512] [--steps 20]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from paraplan.cf import profile as cf_profile
from paraplan.cf.cost import ProfiledRates, Tiling, step_time
from paraplan.cf.plan import plan_tiles
from paraplan.cf.kernels import init_params, train_epoch
from paraplan.cf.model import CFModel
from paraplan.cf.data import synthetic


def per_step(data, model, tiling, steps, repeats=3) -> float:
    best = float("inf")
    for r in range(repeats):
        p = init_params(model, 0)
        train_epoch(p, data, model, tiling=tiling, seed=100 + r, max_steps=3)
        res = train_epoch(p, data, model, tiling=tiling, seed=r, max_steps=steps)
        best = min(best, res.step_seconds)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--users", type=int, default=2000)
    ap.add_argument("--items", type=int, default=8000)
    ap.add_argument("--interactions", type=int, default=60000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=128)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = synthetic(a.users, a.items, a.interactions, seed=0)
    model = CFModel(users=data.users, items=data.items, interactions=data.train_interactions, dim=a.dim,
                    negatives=a.negatives, batch=a.batch, threads=a.threads, learning_rate=40.0)
    t0 = time.perf_counter()
    prof = cf_profile.measure(threads=a.threads, dim=a.dim)
    rates = ProfiledRates(prof, model.row_bytes)
    print(f"profiled this CPU in {time.perf_counter() - t0:.1f} s; {a.threads} thread(s), d={a.dim}, "
          f"n={a.negatives}, B={a.batch}, {data.items} items")
    plan = plan_tiles(model, cf_profile.local_cpu(), rates_for=lambda m: ProfiledRates(prof, m.row_bytes))
    ch = plan.best
    base = per_step(data, model, None, max(3, a.steps // 4), repeats=2)
    tiled = per_step(data, model, (ch.tile_rows, ch.refresh_iterations), a.steps)
    print(f"\n{'kernel':<32}{'measured ms/step':>18}{'predicted ms/step':>19}")
    print(f"{'baseline (gather+bmm+autograd)':<32}{base * 1e3:>18.2f}{step_time(model, None, rates).seconds * 1e3:>19.2f}")
    print(f"{f'tiled N1={ch.tile_rows} N2={ch.refresh_iterations}':<32}{tiled * 1e3:>18.2f}"
          f"{step_time(model, Tiling(ch.tile_rows, ch.refresh_iterations), rates).seconds * 1e3:>19.2f}")
    print(f"speedup tiled vs baseline: {base / tiled:.1f}x measured\n")
    print(f"{'N1':>6}{'N2':>8}{'measured ms':>13}{'predicted ms':>14}{'error':>8}")
    seen = set()
    for c in plan.choices:
        if c.tile_rows in seen:
            continue
        seen.add(c.tile_rows)
        til = (c.tile_rows, c.refresh_iterations)
        m = per_step(data, model, til, a.steps)
        p = step_time(model, Tiling(*til), rates).seconds
        print(f"{c.tile_rows:>6}{c.refresh_iterations:>8}{m * 1e3:>13.2f}{p * 1e3:>14.2f}{(p - m) / m:>8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
