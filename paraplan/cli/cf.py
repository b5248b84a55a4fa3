"""``paraplan cf``: plan HEAT-style tiles for SimpleX training on a CPU, profile, and validate.

    paraplan cf plan --cpu CPU (--dataset FILE | --users U --items I --interactions N)
                     --dim 64 --negatives 1000 [--threads T] [--format table|json]
    paraplan cf profile --out FILE.json [--threads T] [--dim D]
    paraplan cf validate [--cpu local|NAME] [--out DIR] [--threads T] [--users U ...]

``paraplan.cli`` calls :func:`add_cf_parser` and :func:`run_cf`; :func:`main` is a standalone
entry point for tests.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import numpy as np

from paraplan.cf import profile as cf_profile
from paraplan.cf.cost import ProfiledRates
from paraplan.cf.data import load_lightgcn, read_lightgcn
from paraplan.cf.model import DEFAULT_BATCH, CFModel, default_batch
from paraplan.cf.plan import MIN_TILE_PER_NEGATIVE, heat_tile_rows, plan_tiles
from paraplan.cf.validate import ValidateOptions, prepare_out_dir, run_validate, write_report
from paraplan.cli.common import (MAX_COUNT, ParaplanArgumentParser, check_out_path, non_negative_int,
                                 number, parse_or_exit_code, positive_int, run_command, writing)
from paraplan.errors import ConfigError, ParaplanError, require_extra
from paraplan.hardware.catalog import load_part


MAX_DIM = 1 << 16       # embedding width
MAX_THREADS = 1 << 12


def _common_model(p: argparse.ArgumentParser, *, dim=64, negatives=None) -> None:
    p.add_argument("--dim", type=positive_int("--dim", MAX_DIM), default=dim, help="embedding dimension d")
    p.add_argument("--negatives", type=positive_int("--negatives", MAX_COUNT), default=negatives, required=negatives is None,
                   help="negatives per positive n")
    p.add_argument("--batch", type=positive_int("--batch", MAX_COUNT), default=None,
                   help=f"iterations per step B, a multiple of threads (default {DEFAULT_BATCH} rounded to the "
                        "nearest multiple of threads)")
    p.add_argument("--threads", type=positive_int("--threads", MAX_THREADS), default=None, help="threads T (plan: default all cores)")
    p.add_argument("--margin", type=number("--margin", low=-1.0, high=1.0, low_open=False), default=0.4)
    p.add_argument("--negative-weight", type=number("--negative-weight", high=1e9, low_open=False), default=None)
    p.add_argument("--history", type=non_negative_int("--history", MAX_COUNT, "no history"), default=0, help="history items averaged by the aggregator")
    p.add_argument("--gate", type=number("--gate", high=1.0, low_open=False), default=1.0, help="aggregation gate g (1 = plain MF)")
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="sgd or adam")
    p.add_argument("--min-sampling-space", type=number("--min-sampling-space", high=1e18), default=None,
                   help="minimum (M/N2)·N1 (default max(M/8, 4·items))")
    p.add_argument("--min-rows-per-negative", type=number("--min-rows-per-negative", high=1e9), default=MIN_TILE_PER_NEGATIVE,
                   help=f"minimum tile rows N1 per negative n (default {MIN_TILE_PER_NEGATIVE:g}, HEAT Table 6)")


def add_cf_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``cf`` subcommand (with ``plan``, ``profile``, ``validate``) to a subparsers object."""
    cf = subparsers.add_parser("cf", help="collaborative filtering on CPUs: HEAT-style tile planning")
    sub = cf.add_subparsers(dest="cf_command", metavar="{plan,profile,validate}")
    sub.required = True
    p = sub.add_parser("plan", help="rank tile sizes N1 and refresh intervals N2 for a CPU")
    p.add_argument("--cpu", required=True, help="catalogue CPU name, or 'local' for this machine")
    p.add_argument("--dataset", help="LightGCN train.txt (user item item ...) to take sizes from")
    p.add_argument("--users", type=positive_int("--users", MAX_COUNT))
    p.add_argument("--items", type=positive_int("--items", MAX_COUNT))
    p.add_argument("--interactions", type=positive_int("--interactions", MAX_COUNT), help="training interactions (iterations per epoch)")
    p.add_argument("--profile", help="profile JSON from 'cf profile' (use measured rates)")
    p.add_argument("--cache-level", default=None, help="bound the tile by this level (default last level)")
    p.add_argument("--top", type=positive_int("--top", 1000), default=10, help="rows to show")
    p.add_argument("--format", choices=("table", "json"), default="table")
    _common_model(p)
    q = sub.add_parser("profile", help="measure row-gather time vs working set etc. on this CPU")
    q.add_argument("--out", required=True, help="JSON file to write")
    q.add_argument("--threads", type=positive_int("--threads", MAX_THREADS), default=1)
    q.add_argument("--dim", type=positive_int("--dim", MAX_DIM), default=64)
    q.add_argument("--max-ws-mib", type=positive_int("--max-ws-mib", 1 << 20), default=128)
    v = sub.add_parser("validate", help="run the chosen tiling and a sweep; measured vs predicted")
    v.add_argument("--cpu", default="local", help="'local' (profiled rates) or a catalogue CPU name")
    v.add_argument("--out", help="folder for report.json and the figure")
    v.add_argument("--dataset", help="LightGCN train.txt instead of synthetic data")
    v.add_argument("--test-dataset", help="LightGCN test.txt (else a per-user split of --dataset)")
    v.add_argument("--users", type=positive_int("--users", MAX_COUNT), default=4000)
    v.add_argument("--items", type=positive_int("--items", MAX_COUNT), default=16000)
    v.add_argument("--interactions", type=positive_int("--interactions", MAX_COUNT), default=160000, help="synthetic interactions before the split")
    v.add_argument("--dim", type=positive_int("--dim", MAX_DIM), default=64)
    v.add_argument("--negatives", type=positive_int("--negatives", MAX_COUNT), default=64)
    v.add_argument("--batch", type=positive_int("--batch", MAX_COUNT), default=None,
                   help=f"iterations per step (default {DEFAULT_BATCH} rounded to a multiple of threads)")
    v.add_argument("--threads", type=positive_int("--threads", MAX_THREADS), default=1)
    v.add_argument("--lr", type=number("--lr", high=1e9), default=40.0, help="SGD learning rate for the batch-mean loss")
    v.add_argument("--epochs", type=positive_int("--epochs", MAX_COUNT), default=3, help="training epochs for the quality comparison")
    v.add_argument("--sweep", type=positive_int("--sweep", 1000), default=12, help="tile sizes to measure, chosen included")
    v.add_argument("--repeats", type=positive_int("--repeats", MAX_COUNT), default=5, help="timed epochs per tile (median)")
    v.add_argument("--seed", type=non_negative_int("--seed", 2**32 - 1, "the default seed"), default=0)
    v.add_argument("--profile", help="reuse (or write) a profile JSON")
    v.add_argument("--min-sampling-space", type=number("--min-sampling-space", high=1e18), default=None)
    return cf


def _resolve_batch(batch: int | None, threads: int) -> tuple[int, str | None]:
    """--batch as given (a multiple of threads), or the default rounded to one; the note says so."""
    if batch is None:
        b = default_batch(threads)
        note = None if b == DEFAULT_BATCH else (f"batch {b}: the default {DEFAULT_BATCH} rounded to the nearest "
                                                f"multiple of {threads} threads")
        return b, note
    if isinstance(batch, int) and batch >= 1 and batch % threads:
        lo = max(threads, batch // threads * threads)
        raise ConfigError("batch", f"{batch} is not a multiple of threads ({threads}); each thread takes an "
                          "equal share of a step", accepted=f"multiples of {threads}, e.g. {lo} or {lo + threads}")
    return batch, None


def _model_from(args, batch: int, threads: int) -> CFModel:
    """The CF model from --dataset or --users/--items/--interactions and the model flags."""
    if args.dataset:
        lists = read_lightgcn(args.dataset)
        if not lists:
            raise ConfigError("--dataset", f"{args.dataset} holds no users", accepted="lines of 'user item item ...'")
        users = max(lists) + 1
        items = max((int(v.max()) for v in lists.values() if len(v)), default=0) + 1
        inter = sum(len(v) for v in lists.values())
    else:
        missing = [f"--{k}" for k in ("users", "items", "interactions") if getattr(args, k) is None]
        if missing:
            raise ConfigError("dataset", f"give --dataset FILE or all of --users --items --interactions "
                              f"(missing {' '.join(missing)})")
        users, items, inter = args.users, args.items, args.interactions
    kw = dict(users=users, items=items, interactions=inter, dim=args.dim, negatives=args.negatives,
              batch=batch, margin=args.margin, history=args.history, gate=args.gate,
              optimizer=args.optimizer)
    if args.negative_weight is not None:
        kw["negative_weight"] = args.negative_weight
    return CFModel(threads=threads, **kw)


def _cpu(name: str):
    """This machine's CPU for 'local', else a catalogue CPU."""
    if name == "local":
        return cf_profile.local_cpu()
    return load_part("cpus", name)


def _run_plan(args) -> int:
    """``cf plan``: rank tilings for the CPU and print them (table or JSON), saying what was relaxed."""
    cpu = _cpu(args.cpu)
    threads = args.threads
    if threads is not None and threads < 1:
        raise ConfigError("threads", f"must be a positive integer, got {threads}")
    rates_for = None
    if args.profile:
        prof = cf_profile.load(args.profile)
        rates_for = lambda m: ProfiledRates(prof, m.row_bytes)  # noqa: E731
        threads = prof.threads
    if threads is None:
        threads = cpu.cores
    batch, batch_note = _resolve_batch(args.batch, threads)
    model = _model_from(args, batch, threads)
    try:
        # with a profile, numbers that cannot be real measurements (a log of 0, 0/0) stop here
        with np.errstate(all="raise") if args.profile else contextlib.nullcontext():
            plan = plan_tiles(model, cpu, rates_for=rates_for, min_sampling_space=args.min_sampling_space,
                              cache_level=args.cache_level, top=args.top, min_tile_per_negative=args.min_rows_per_negative)
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError) as e:
        if not args.profile:
            raise
        # the profile's lists are the user's file: shapes that do not fit together end here
        raise ConfigError("--profile", f"{args.profile}: its measured tables do not fit together "
                          f"({type(e).__name__}: {str(e)[:100]})", accepted="a profile written by `paraplan cf profile`") from e
    notes = ([batch_note] if batch_note else []) + [r.describe() for r in plan.relaxed]
    if args.format == "json":
        print(json.dumps({"cpu": cpu.name, "rates": plan.rates_name, "threads": threads, "batch": batch,
                          "min_sampling_space": plan.min_sampling_space,
                          "min_rows_per_negative": plan.min_rows_per_negative,
                          "relaxed": [r.as_dict() for r in plan.relaxed], "notes": notes,
                          "ranking": "predicted epoch time, fastest first",
                          "baseline_epoch_s": plan.baseline_epoch_s, "rejected": plan.rejected,
                          "choices": [c.as_dict() for c in plan.choices]}, indent=1))
        return 0
    print(f"cf plan on {cpu.name} ({plan.rates_name}), {threads} threads, batch {batch}, d={model.dim}, "
          f"n={model.negatives}, M={model.iterations_per_epoch}, min sampling space {plan.min_sampling_space:.0f}, "
          f"min rows per negative {plan.min_rows_per_negative:g}")
    for note in notes:
        print(f"note: {note}")
    print("ranked by predicted epoch time, fastest first (space = negative sampling space (M/N2)·N1, "
          "larger is closer to uniform sampling)")
    print(f"{'rank':>4} {'N1':>7} {'N2':>8} {'T':>4} {'epoch s':>10} {'space':>12} {'tile KiB':>9} {'level':>5} regime")
    for c in plan.choices:
        print(f"{c.rank:>4} {c.tile_rows:>7} {c.refresh_iterations:>8} {c.threads:>4} {c.predicted_epoch_s:>10.3f} "
              f"{c.sampling_space:>12.0f} {c.footprint_bytes / 1024:>9.1f} {c.tile_level:>5} {c.regime}")
    print(f"baseline (untiled) predicted epoch: {plan.baseline_epoch_s:.3f} s; rejected: {plan.rejected}")
    try:
        print(f"HEAT Algorithm 1 capacity rule (T·N1 rows of 4d bytes in the aggregate L2; for HEAT's C++ "
              f"kernel): N1 = {heat_tile_rows(cpu, threads, model.dim)}")
    except ParaplanError:
        pass
    return 0


def _run_profile(args) -> int:
    """``cf profile``: measure this CPU and write the profile JSON."""
    check_out_path("--out", args.out, folder=False)
    require_extra("torch", "paraplan cf profile")
    prof = cf_profile.measure(threads=args.threads, dim=args.dim, max_ws_bytes=args.max_ws_mib * 2**20)
    with writing("--out", args.out):
        path = cf_profile.save(prof, args.out)
    for w, t in zip(prof.ws_bytes, prof.row_time_s):
        print(f"  working set {w / 1024:>10.0f} KiB  {t * 1e9:7.2f} ns/row")
    print(f"bmm {prof.flops_per_s / 1e9:.1f} GFLOP/s; stream {[round(b / 1e9, 1) for b in prof.stream_bytes_per_s]}"
          f" GB/s; tiled step fixed {prof.tiled_step_fixed_s * 1e3:.3f} ms; wrote {path}")
    return 0


def _run_validate(args) -> int:
    """``cf validate``: run the chosen tiling and a sweep, print measured vs predicted."""
    if args.out is not None:
        check_out_path("--out", args.out, folder=True)
    require_extra("torch", "paraplan cf validate")
    if args.out is not None:
        prepare_out_dir(args.out)   # before the run: a bad --out fails in a second, not after minutes
    data = None
    if args.dataset:
        data = load_lightgcn(args.dataset, args.test_dataset, seed=args.seed)
    opts = ValidateOptions(users=args.users, items=args.items, interactions=args.interactions, dim=args.dim,
                           negatives=args.negatives, batch=_resolve_batch(args.batch, max(args.threads, 1))[0],
                           threads=args.threads,
                           learning_rate=args.lr, epochs=args.epochs, sweep=args.sweep, repeats=args.repeats,
                           seed=args.seed, cpu=args.cpu, profile_path=args.profile,
                           min_sampling_space=args.min_sampling_space)
    rep = run_validate(opts, data=data)
    c, b = rep["chosen_tile"], rep["best_measured_tile"]
    print(f"chosen N1={c['tile_rows']} N2={c['refresh_iterations']} (measured rank {rep['chosen_measured_rank']}"
          f"/{rep['tiles_measured']}); best measured N1={b['tile_rows']} N2={b['refresh_iterations']}; "
          f"chosen/best time {rep['chosen_vs_best_time_ratio']:.2f}")
    print(f"epoch-time MAPE {rep['epoch_time_mape']:.1%} over {rep['tiles_measured']} tiles "
          f"({rep['epoch_time_mape_feasible']:.1%} over the {rep['feasible_tiles_measured']} feasible); speedup vs baseline {rep['speedup_vs_baseline']:.1f}x "
          f"(predicted {rep['speedup_vs_baseline_predicted']:.1f}x)")
    print(f"recall@20 tiled {rep['recall_at_20_tiled']:.4f} vs untiled {rep['recall_at_20_untiled']:.4f}; "
          f"ndcg@20 {rep['ndcg_at_20_tiled']:.4f} vs {rep['ndcg_at_20_untiled']:.4f}")
    if args.out:
        with writing("--out", args.out):
            path, fig = write_report(rep, args.out)
        print(f"wrote {path} and {fig}")
    return 0


def run_cf(args) -> int:
    """Run a parsed ``cf`` command (errors are turned into one line by ``paraplan.cli.run_command``)."""
    return {"plan": _run_plan, "profile": _run_profile, "validate": _run_validate}[args.cf_command](args)


def main(argv=None) -> int:
    """Stand-alone ``cf`` CLI (used by tests); ParaplanError -> one line, exit code 2."""
    parser = ParaplanArgumentParser(prog="paraplan")
    add_cf_parser(parser.add_subparsers(dest="command"))
    args, code = parse_or_exit_code(parser, argv)
    if args is None:
        return code
    if args.command != "cf":
        parser.print_usage(sys.stderr)
        return 2
    return run_command(run_cf, args)


def register(subparsers) -> None:
    """Hook for the main ``paraplan`` parser."""
    add_cf_parser(subparsers).set_defaults(func=run_cf)


if __name__ == "__main__":
    sys.exit(main())
