"""Time a 50-point what-if sweep with re-planning (a full plan search at every point).

Llama 3 70B on DGX H100: GPUs 8..4096 (10 values) x sequence length 2k..32k (5 values), global
batch 512 sequences. Prints the time for the sweep (the 50 searches), for the figures and for
writing the report folder; the issue asks for the whole under a minute.

    python benchmarks/whatif_speed.py [--out DIR] [--jobs N] [--serial-too]

The points run in worker processes, one per core (``run_points``); ``--jobs 1`` runs them here one after
the other, and ``--serial-too`` times both in this run and checks that they give the same results.
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
    from paraplan.reports.sweep import Scenario, default_jobs, parse_sweep, resolve_points, run_points
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="report folder (default: a temporary one)")
    ap.add_argument("--jobs", type=int, help="worker processes for the points (default: one per core)")
    ap.add_argument("--serial-too", action="store_true", help="also time the points in one process and compare")
    args = ap.parse_args(argv)
    sc = Scenario(model="llama3-70b", cluster="dgx-h100", global_batch=512,
                  sweeps=(parse_sweep("gpus=8..4096"), parse_sweep("seq_len=2k..32k")),
                  price_per_gpu_hour=2.5, train_tokens=15e12)
    t0 = time.perf_counter()
    points = resolve_points(sc)
    results = run_points(points, sc, progress=True, jobs=args.jobs)
    t_sweep = time.perf_counter() - t0
    if args.serial_too:
        t1 = time.perf_counter()
        serial = run_points(points, sc, progress=True, jobs=1)
        t_serial = time.perf_counter() - t1
        same = [(r.estimate, r.reason, r.candidates) for r in serial] == \
            [(r.estimate, r.reason, r.candidates) for r in results]
        print(f"sweep in one process: {t_serial:6.2f} s; in worker processes: {t_sweep:6.2f} s "
              f"({t_serial / t_sweep:.2f}x), results {'identical' if same else 'DIFFER'}")
        t0 += t_serial
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
    print(f"sweep with re-planning: {t_sweep:6.2f} s ({t_sweep / n * 1e3:.0f} ms per point, "
          f"{args.jobs or default_jobs()} job(s))")
    print(f"figures (incl. tp x pp heat-map): {t_fig:6.2f} s")
    print(f"write PNG+SVG+CSV+HTML:           {total - t_sweep - t_fig:6.2f} s")
    print(f"total:                            {total:6.2f} s  -> {out}")
    return 0 if n == 50 and total < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
