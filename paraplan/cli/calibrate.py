"""`paraplan calibrate RUN_DIR... [--runs-csv RUNS.csv] [--log FILE...] [--cluster local|profile:NAME|PRESET|FILE.yaml]
[--name NAME] [--write-cluster FILE.yaml] [--db FILE] [--show]`: fit this cluster's efficiency factors to measured runs
(paraplan/validation/calibrate.py)."""
from __future__ import annotations

import json
import sys

from paraplan.cli.common import check_out_path, writing
from paraplan.cli.score import LOG_ONLY, add_log_arguments
from paraplan.errors import ConfigError
from paraplan.io import write_atomic


def cmd_calibrate(args) -> int:
    from paraplan.profiles.cluster import is_profile_spec
    from paraplan.validation.calibrate import (base_tables, calibrate, calibrated_cluster_yaml, estimable,
                                               factors_table, loro_table, loro_verdict, pool_runs, read_run, row_runs,
                                               store_calibrated, trace_vs_estimate, charged_slowdown)
    from paraplan.validation.trace import format_terms
    if not args.runs and not args.runs_csv and not args.log:
        raise ConfigError("runs", "no runs given", accepted="folders `paraplan validate --out DIR` wrote, "
                          "--runs-csv RUNS.csv (the published-run schema) or --log FILE... (training logs)")
    if args.name is not None and (not args.name or len(args.name) > 64 or not args.name.replace("-", "").replace(
            "_", "").replace(".", "").isalnum()):
        raise ConfigError("--name", f"{args.name[:80]!r}", accepted="1-64 letters, digits, '-', '_' or '.'")
    if args.write_cluster is not None:
        check_out_path("--write-cluster", args.write_cluster, folder=False)
    log_flags = [k for k in LOG_ONLY if k != "write_rows" and getattr(args, k, None) is not None]
    if log_flags and not args.log:
        raise ConfigError("--" + log_flags[0].replace("_", "-"), "applies to --log only")
    on_cluster = not is_profile_spec(args.cluster)
    if on_cluster and args.runs:
        raise ConfigError("--cluster", f"{args.cluster!r} is a cluster, not a stored profile: validate folders "
                          "calibrate the profile their prediction used", accepted="local or profile:NAME with "
                          "validate folders; a preset or cluster file with --runs-csv or --log")
    if on_cluster and args.name is not None:
        raise ConfigError("--name", f"stores a calibrated measured profile; {args.cluster!r} is a cluster",
                          accepted="--write-cluster FILE.yaml (then --cluster FILE.yaml), or --cluster local / "
                                   "profile:NAME with --name")
    if not on_cluster and args.write_cluster is not None:
        raise ConfigError("--write-cluster", f"writes a calibrated cluster file; {args.cluster!r} is a measured "
                          "profile", accepted="--name NAME (then --cluster profile:NAME), or --cluster PRESET / "
                                              "FILE.yaml with --write-cluster")
    runs = pool_runs([read_run(p) for p in args.runs])
    tables, label = base_tables(args.cluster, args.db)
    if args.log:
        from paraplan.cli.score import read_logs
        from paraplan.planner.runlogs import case_of
        if on_cluster and args.gpu is None:       # logs that do not name their GPU ran on the cluster calibrated
            from paraplan.hardware.catalog import preset_names
            system = tables.cluster().system.name
            args.gpu = system if system in preset_names("systems") else None
        runs += row_runs([case_of(log, i) for i, log in enumerate(read_logs(args))])
    if args.runs_csv:
        from paraplan.calibration import cases_of_table, read_runs_file, source_name
        from paraplan.reports.score import read_case
        try:
            table = read_runs_file(args.runs_csv)
        except ConfigError as e:         # the file reader names score's positional RUNS.csv
            raise ConfigError("--runs-csv", e.problem, accepted=e.accepted) from None
        cases, skipped = cases_of_table(table, read_case, source_name)
        for i, src, reason in skipped:
            print(f"paraplan: note: --runs-csv row {i} ({src}) skipped: {reason}", file=sys.stderr)
        runs += row_runs(cases)
    runs, unusable = estimable(runs, tables)
    for name, reason in unusable:
        print(f"paraplan: note: {name} skipped: not estimable on {args.cluster}: {reason}", file=sys.stderr)
    if not runs:
        inputs = [f for f, v in (("RUN_DIR", args.runs), ("--runs-csv", args.runs_csv), ("--log", args.log)) if v]
        raise ConfigError(inputs[0] if len(inputs) == 1 else "runs", f"none of the runs can be estimated on {args.cluster}",
                          accepted="runs on the cluster's GPU (--gpu for logs that do not name it)" if on_cluster
                          else "runs in a dtype and on GPU counts the profile measured")
    if args.show:
        for r in runs:
            step, pred = trace_vs_estimate(r, tables)
            print(f"{r.name}: profiled step of the slowest traced rank against the estimate on {args.cluster}")
            if step is None:
                print("  (no traces in this folder)")
            else:
                print(format_terms(step, pred), end="")
            if r.concurrency:
                print("compute under another rank's compute: "
                      + ", ".join(f"{100 * c:.0f} %" for c in r.concurrency) + " of each rank's (the profile's "
                      "contention slowdown was measured with every rank busy)")
                charged = charged_slowdown(r, tables)
                if charged:
                    s, eff = charged
                    print(f"  the estimate expects {100 * (eff - 1) / (s - 1):.0f} % (slowdown charged "
                          f"{eff:.2f}x of the {s:.2f}x measured with every rank busy)")
            print()
    cal = calibrate(runs, tables, label)
    if args.format == "json":
        loro = [{**x, "outcome": loro_verdict(x["err_before"], x["err_after"], cal.resolved)} for x in cal.loro]
        print(json.dumps({"factors": cal.fit.factors, "spread": cal.spread, "unconstrained": cal.fit.unconstrained,
                          "tied": list(cal.fit.tied), "runs": list(cal.fit.runs), "leave_one_run_out": loro,
                          "noise": cal.fit.noise, "repeats": cal.repeats, "resolved": cal.resolved,
                          "base": args.cluster}, indent=1))
    else:
        against = f"cluster {args.cluster}" if on_cluster else f"{args.cluster} (profile run {tables.get('run_id')})"
        print(f"calibrated on {len(runs)} run(s) against {against}")
        print(factors_table(cal), end="")
        print()
        print(loro_table(cal), end="")
    if args.name:
        if not cal.fit.factors:
            raise ConfigError("--name", "nothing was fitted: no knob is constrained by these runs",
                              accepted="runs whose terms the knobs move (see the table)")
        fid, run_id = store_calibrated(args.name, cal, tables, args.db)
        print(f"stored as profile:{args.name} (machine {fid}, run {run_id}): "
              f"--cluster profile:{args.name} estimates and plans with it", file=sys.stderr)
    if args.write_cluster:
        if not cal.fit.factors:
            raise ConfigError("--write-cluster", "nothing was fitted: no knob is constrained by these runs",
                              accepted="runs whose terms the knobs move (see the table)")
        import datetime
        text = calibrated_cluster_yaml(cal, tables, runs, datetime.date.today().isoformat())
        with writing("--write-cluster", args.write_cluster):
            write_atomic(args.write_cluster, text)
        print(f"wrote {args.write_cluster}: --cluster {args.write_cluster} estimates and plans with the factors",
              file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add ``calibrate`` to the subparsers."""
    p = subparsers.add_parser(
        "calibrate", help="fit this cluster's efficiency factors to measured runs (validate folders)",
        description="Fit factors on the profile's GEMM, attention, memory-bound, optimizer and per-collective times "
                    "to the measured step terms and profiler traces of `paraplan validate` runs; print them with "
                    "their leave-one-run-out spread, which knobs the runs do not constrain, and each run's "
                    "leave-one-run-out step-time error before and after; with --name store the calibrated profile "
                    "(use it as --cluster profile:NAME). See docs/calibrate.md.")
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="folders `paraplan validate --out` wrote")
    p.add_argument("--runs-csv", default=None, metavar="RUNS.csv",
                   help="measured runs in the published-run CSV schema (`paraplan score`'s input), each estimated "
                        "at its GPU count on the profile: one equation on its step time")
    add_log_arguments(p, "read real runs' logs as runs", "each one equation on its step time")
    p.add_argument("--cluster", default="local",
                   help="what to calibrate: local (default) or profile:NAME, a measured profile; or a system preset "
                        "(dgx-h100) or cluster file, for runs given as rows or logs (each estimated on it at its GPU "
                        "count, network tier included)")
    p.add_argument("--db", default=None, help="profile database (default $PARAPLAN_PROFILE_DB or ~/.cache)")
    p.add_argument("--name", default=None, help="store the calibrated profile under this name (a measured profile)")
    p.add_argument("--write-cluster", default=None, metavar="FILE.yaml",
                   help="write the calibrated cluster as a cluster file (a preset or cluster file --cluster; "
                        "then --cluster FILE.yaml)")
    p.add_argument("--show", action="store_true",
                   help="first print each run's traced terms beside the estimate's (gemm, attention, memory, "
                        "optimizer, each collective and its overlap, idle)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (default) or json: factors, spread, unconstrained knobs, leave-one-run-out rows")
    p.set_defaults(func=cmd_calibrate)
