"""Planner speed: full searches the issue names, timed on this machine.

    python benchmarks/planner_speed.py

Prints, per scenario, the candidates composed and evaluated, total search time, and the
vectorized scoring rate (candidates per second); then the time to build the fabric graph of 3072
H100s (2:1 oversubscribed) and place a tp8 dp48 pp8 layout on it (once a timed test; a
benchmark now, as the project's standards ask).
"""
from __future__ import annotations

import sys
import time

from paraplan.hardware.catalog import load_cluster
from paraplan.hardware.topology import build_topology, place_groups
from paraplan.planner.search import search
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

SCENARIOS = [
    ("gpt-1t", "dgx-a100-80g", 3072, 2048, 3072),
    ("llama3-70b", "dgx-h100", 64, 8192, 512),
    ("llama3-405b", "dgx-h100", 2048, 8192, 2048),
    ("gpt3-175b", "dgx-a100-80g", 1024, 2048, 1536),
]


def main() -> int:
    print(f"{'scenario':45s} {'composed':>11s} {'evaluated':>10s} {'search s':>9s} {'vector cand/s':>14s}  best")
    for model, cluster, gpus, seq, gbs in SCENARIOS:
        m, c, j = load_model(model), load_cluster(cluster, gpus), TrainingJob(seq, gbs)
        search(m, j, c, top=3)  # warm caches (YAML, curves)
        t0 = time.perf_counter()
        r = search(m, j, c, top=10)
        wall = time.perf_counter() - t0
        best = r.best
        print(f"{model} / {gpus} x {cluster} s{seq} B{gbs}".ljust(45),
              f"{r.candidates_composed:11,d} {r.candidates_evaluated:10,d} {wall:9.3f} {r.vectorized_rate_per_s:14,.0f}  "
              f"{best.plan.label()} {best.plan.schedule} ZeRO-{best.plan.zero} recompute {best.plan.recompute} "
              f"offload {best.plan.offload} "
              f"{best.step_time_s:.2f} s MFU {100 * best.mfu:.1f}%")
    c = load_cluster("dgx-h100", 3072)
    t0 = time.perf_counter()
    g = build_topology(c, oversubscription=2)
    place_groups(c, tp=8, cp=1, dp=48, pp=8, oversubscription=2)
    print(f"\nfabric of 3072 H100s ({g.number_of_nodes():,d} vertices) built and a tp8 dp48 pp8 layout placed: "
          f"{time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
