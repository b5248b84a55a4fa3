"""Time a 50-point what-if sweep with re-planning (a full plan search at every point).

Llama 3 70B on DGX H100: GPUs 8..4096 (10 values) x sequence length 2k..32k (5 values), global
batch 512 sequences. Prints the time for the sweep (the 50 searches), for the figures and for
writing the report folder; the issue asks for the whole under a minute.

    python benchmarks/whatif_speed.py [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")


def main(argv=None) -> int:
    from paraplan.reports.report import build_figures, WhatIfResult
    from paraplan.reports import data as D
    from paraplan.reports.sweep import Scenario, parse_sweep, resolve_points, run_points
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="report folder (default: a temporary one)")
    args = ap.parse_args(argv)
    sc = Scenario(model="llama3-70b", cluster="dgx-h100", global_batch=512,
                  sweeps=(parse_sweep("gpus=8..4096"), parse_sweep("seq_len=2k..32k")),
                  price_per_gpu_hour=2.5, train_tokens=15e12)
    t0 = time.perf_counter()
    points = resolve_points(sc)
    results = run_points(points, sc, progress=True)
    t_sweep = time.perf_counter() - t0
    r = WhatIfResult(scenario=sc, points=results, table=D.points_table(results, sc))
    build_figures(r)
    t_fig = time.perf_counter() - t0 - t_sweep
    r.seconds = t_sweep + t_fig
    out = args.out or tempfile.mkdtemp(prefix="whatif-speed-") + "/report"
    r.write(out)
    total = time.perf_counter() - t0
    n = len(results)
    cands = sum(x.candidates for x in results)
    print(f"{n} points, {int(r.table['feasible'].sum())} with a plan that fits, {cands:,} candidates scored")
    print(f"sweep with re-planning: {t_sweep:6.2f} s ({t_sweep / n * 1e3:.0f} ms per point)")
    print(f"figures (incl. tp x pp heat-map): {t_fig:6.2f} s")
    print(f"write PNG+SVG+CSV+HTML:           {total - t_sweep - t_fig:6.2f} s")
    print(f"total:                            {total:6.2f} s  -> {out}")
    return 0 if n == 50 and total < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
