"""The calibration round trip on this machine: validate -> traces and reports -> calibrate -> re-predict.

Runs ``paraplan validate`` (torchrun, gloo, the harness's GPT, the profiler on for one step whose
Chrome trace each rank keeps) on three layouts of two ranks, ``--rounds`` times in turn (dp2, tp2,
pp2, dp2, tp2, ...: on a shared machine whose load drifts each layout sees the same mix of quiet and
busy moments; a layout's rounds are pooled, medians), then calibrates leave-one-run-out: the
factors fitted on two layouts, the third predicted by the estimator on the calibrated profile, and
prints per layout the measured step, the prediction before (the stored profile as it is) and after,
and both errors; then the factors fitted on all three, and stores them as ``profile:NAME`` and checks
that ``paraplan estimate --cluster profile:NAME`` runs.

    python benchmarks/calibrate_round_trip.py [--rounds 3] [--steps 10] [--db FILE] [--out DIR]
        [--layouts dp2,tp2,pp2,tp2-gb2,pp2-gb4] [--reuse]

``--layouts`` picks from :data:`LAYOUTS` (default: all five). The last two are there so that every knob
a left-out layout needs is constrained by the others: without them tp2 is the only run of many small
(latency-bound) all-reduces, dp2's one gradient all-reduce constrains only the bandwidth, and pp2 the
only one with send/recv, so leaving either out leaves its own communication at the profile's value.
tp2 over two micro-batches (``--global-batch 2``) and pp2 over four (``--global-batch 4``: a smaller
bubble share, twice the transfers) carry the same kernels and collectives in other proportions.
``--reuse`` skips the validates and calibrates the runs already under ``--out`` (``roundK/LAYOUT``),
e.g. to compare two versions of the estimator on the same measurements.

Uses the profile database ``--db`` (default ``$PARAPLAN_PROFILE_DB`` or the cache); the machine must
have a profile there (``paraplan profile --quick``). ``--size test`` runs the round-trip test's model. Prints each
layout's outcome, how many layouts' errors are smaller after (the strict count), and exits 1, as the test fails,
when the test's criterion fails on dp2, tp2 and pp2 (every layout when those did not run):
``calibrate.round_trip_holds``, the mean error smaller after where it exceeds what the repeats resolve (twice the
noise over the square root of the repeats), within that where it did not, and no layout worse by more than twice
that.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

LAYOUTS = {"dp2": ["--dp", "2"], "tp2": ["--tp", "2"], "pp2": ["--pp", "2"],
           "tp2-gb2": ["--tp", "2", "--global-batch", "2"], "pp2-gb4": ["--pp", "2", "--global-batch", "4"]}


#: the model of tests/validation/test_calibrate_round_trip.py (``--size test``): small enough for a test, large
#: enough that the steps are work more than per-call latency and host overhead
TEST_MODEL = ["--layers", "2", "--hidden", "256", "--heads", "4", "--seq-len", "256", "--vocab", "512"]


def validate(name: str, flags: list[str], out: str, steps: int, env: dict) -> None:
    cmd = [sys.executable, "-m", "paraplan.cli", "validate", *flags, "--no-reference", "--steps", str(steps),
           "--out", out]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: validate failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    line = next((ln for ln in r.stdout.splitlines() if "step time measured" in ln), "")
    print(f"  {line}", flush=True)


def modelled_concurrency(run, tables) -> float:
    """c of the estimate's charged contention slowdown for ``run`` (NaN where the estimator has none)."""
    from paraplan.validation.calibrate import charged_slowdown
    charged = charged_slowdown(run, tables)
    return (charged[1] - 1) / (charged[0] - 1) if charged else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--db", default=None)
    ap.add_argument("--out", default=None, help="folder for the validate outputs (default: a temporary one)")
    ap.add_argument("--name", default="round-trip", help="name of the stored calibrated profile")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, from: " + ", ".join(LAYOUTS))
    ap.add_argument("--reuse", action="store_true", help="calibrate the runs already under --out")
    ap.add_argument("--profile", default="local", help="the profile calibrated (default: this machine's)")
    ap.add_argument("--size", choices=("default", "test"), default="default",
                    help="validate's default model, or the round-trip test's (hidden 256, sequence 256, 2 layers)")
    args = ap.parse_args(argv)
    layouts = {k: LAYOUTS[k] for k in args.layouts.split(",")}
    if args.reuse and not args.out:
        sys.exit("--reuse needs --out")
    env = dict(os.environ)
    if args.db:
        env["PARAPLAN_PROFILE_DB"] = args.db
        os.environ["PARAPLAN_PROFILE_DB"] = args.db
    out = args.out or tempfile.mkdtemp(prefix="calibrate-round-trip-")
    t0 = time.perf_counter()
    dirs = []
    for k in range(args.rounds):
        if not args.reuse:
            print(f"round {k + 1}/{args.rounds}", flush=True)
        for name, flags in layouts.items():
            d = os.path.join(out, f"round{k}", name)
            if args.reuse:
                if os.path.isfile(os.path.join(d, "report.json")):
                    dirs.append(d)
                continue
            validate(name, flags + (TEST_MODEL if args.size == "test" else []), d, args.steps, env)
            dirs.append(d)
    from paraplan.validation.calibrate import (base_tables, calibrate, factors_table, loro_table, pool_runs,
                                               resolved_error, round_trip_holds,
                                               predict, read_run, store_calibrated)
    runs = pool_runs([read_run(d) for d in dirs])
    tables, label = base_tables(args.profile, args.db)
    cal = calibrate(runs, tables, label)
    print(f"\n{len(dirs)} validate runs in {time.perf_counter() - t0:.0f} s, pooled into {len(runs)} layouts "
          f"(median of {args.rounds} x {args.steps} timed steps each)\n")
    print("leave-one-run-out (fit on the other layouts, predict this one):")
    print(loro_table(cal))
    print("fitted on all layouts:")
    print(factors_table(cal))
    spreads = {r.name: (min(r.step_times_s), max(r.step_times_s)) for r in runs}
    print("measured step spread (min - max over all timed steps): "
          + ", ".join(f"{n} {1e3 * lo:.0f}-{1e3 * hi:.0f} ms" for n, (lo, hi) in spreads.items()))
    print("compute under the other rank's compute (per rank and round): "
          + "; ".join(f"{r.name} " + " ".join(f"{c:.2f}" for c in r.concurrency) for r in runs))
    print("modelled (the estimate's expected slowdown s_eff = 1 + (s - 1) c, s with every rank busy): "
          + "; ".join(f"{r.name} c {modelled_concurrency(r, tables):.2f}" for r in runs))
    for r in runs:   # measured terms beside the uncalibrated estimate's (the harness's names)
        pred = predict(r, tables)["time_breakdown_s"]
        print(f"  {r.name:<8} " + "  ".join(f"{k} {1e3 * v:.0f}/{1e3 * pred.get(k, 0.0):.0f}"
                                             for k, v in r.measured_terms.items() if v > 1e-4 or pred.get(k, 0) > 1e-4)
              + "  (ms, measured/predicted)")
    fid, run_id = store_calibrated(args.name, cal, tables, args.db)
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", "estimate", "--model", "llama3-8b", "--cluster",
                        f"profile:{args.name}", "--gpus", "2", "--seq-len", "256", "--global-batch", "2",
                        "--micro-batch", "1", "--dp", "2"], env=env, capture_output=True, text=True)
    print(f"\nstored profile:{args.name}; `paraplan estimate --cluster profile:{args.name}` exit {r.returncode}")
    # the test's criterion (calibrate.round_trip_holds) on the plan and two others (dp2, tp2, pp2 where they ran,
    # else every layout); the strict count and each layout's outcome are loro_table's, printed above
    asserted = [x for x in cal.loro if x["run"] in ("dp2", "tp2", "pp2")] or list(cal.loro)
    ok, why = round_trip_holds([(x["run"], abs(x["err_before"]), abs(x["err_after"])) for x in asserted],
                               resolved_error(cal.fit.noise, cal.repeats))
    print(f"leave-one-run-out over {', '.join(x['run'] for x in asserted)}: {why} -> {'holds' if ok else 'FAILS'}")
    return 1 if not ok or r.returncode != 0 else 0

if __name__ == "__main__":
    sys.exit(main())
