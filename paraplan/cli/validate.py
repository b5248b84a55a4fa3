"""Command-line front ends: ``paraplan validate`` and ``paraplan profile``.

``add_validate_parser`` / ``add_profile_parser`` attach the subcommands to the project CLI's
subparsers; ``main(argv)`` is a stand-alone entry point with just these two (used by tests).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace

from paraplan.cli.common import (ParaplanArgumentParser, check_in_path, check_out_path, non_negative_int, number,
                                 parse_or_exit_code, positive_int, run_command)
from paraplan.errors import ConfigError
from paraplan.plan import RECOMPUTE
from paraplan.profiles.store import ProfileStore, machine_fingerprint
from paraplan.validation.compare import build_report, comparison_rows, format_table
from paraplan.validation.launch import LaunchOptions, launch_worker
from paraplan.validation.predict import predict_run


# Sizes of the validation run: it runs on this machine, so a few thousand ranks or a model side of
# a million are far past anything it can launch; larger values are refused before torch starts.
MAX_RANKS = 4096
MAX_SIZE = 1_000_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def add_validate_parser(subparsers) -> argparse.ArgumentParser:
    """``validate``: run a plan on real torch under torchrun and report measured vs predicted."""
    p = subparsers.add_parser("validate", help="run a plan on real torch and compare with the "
                              "prediction", description=add_validate_parser.__doc__)
    g = p.add_argument_group("launch")
    g.add_argument("--nproc-per-node", type=positive_int("--nproc-per-node", MAX_RANKS), default=None,
                   help="processes on this node (default: tp*pp*dp / nnodes)")
    g.add_argument("--nnodes", type=positive_int("--nnodes", MAX_RANKS), default=1)
    g.add_argument("--node-rank", type=non_negative_int("--node-rank", MAX_RANKS, "the first node"), default=0)
    g.add_argument("--rdzv-endpoint", default=None, help="host:port (multi-node)")
    g.add_argument("--timeout", type=number("--timeout", high=MAX_TIMEOUT_S), default=900.0,
                   help="seconds before giving up (> 0)")
    g = p.add_argument_group("plan")
    g.add_argument("--tp", type=positive_int("--tp", MAX_RANKS), default=1)
    g.add_argument("--pp", type=positive_int("--pp", MAX_RANKS), default=1)
    g.add_argument("--dp", type=positive_int("--dp", MAX_RANKS), default=None, help="default: world / (tp*pp)")
    g.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    g.add_argument("--micro-batch", type=positive_int("--micro-batch", MAX_SIZE), default=1)
    g.add_argument("--global-batch", type=positive_int("--global-batch", MAX_SIZE), default=None,
                   help="default: micro*dp*pp")
    g.add_argument("--recompute", default="none", choices=RECOMPUTE)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--virtual-stages", type=positive_int("--virtual-stages", MAX_SIZE), default=1,
                   help="interleaved 1F1B chunks")
    g.add_argument("--steps", type=positive_int("--steps", MAX_SIZE), default=3, help="timed steps")
    g.add_argument("--warmup", type=non_negative_int("--warmup", MAX_SIZE, "none"), default=1,
                   help="warm-up steps (not timed)")
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=positive_int("--layers", MAX_SIZE), default=4)
    g.add_argument("--hidden", type=positive_int("--hidden", MAX_SIZE), default=64)
    g.add_argument("--heads", type=positive_int("--heads", MAX_SIZE), default=4)
    g.add_argument("--seq-len", type=positive_int("--seq-len", MAX_SIZE), default=32)
    g.add_argument("--vocab", type=positive_int("--vocab", MAX_SIZE), default=256)
    g.add_argument("--seed", type=non_negative_int("--seed", 2**32 - 1, "the default seed"), default=0)
    g.add_argument("--attention", default="math", choices=["math", "sdpa"],
                   help="materialised softmax (default) or fused SDPA")
    g = p.add_argument_group("report")
    g.add_argument("--predicted", default=None, help="JSON file with step_time_s, "
                   "memory_bytes_per_rank, time_breakdown_s")
    g.add_argument("--db", default=None, help="profile database (default under ~/.cache); without "
                   "--predicted the plan is predicted by `estimate` on this machine's profile in it")
    g.add_argument("--no-profile", action="store_true",
                   help="do not profile this machine when the database has no profile of it (error)")
    g.add_argument("--no-reference", action="store_true",
                   help="skip the single-process correctness check")
    g.add_argument("--out", required=True, help="directory for report.json and figures")
    p.set_defaults(func=run_validate)
    return p


def add_profile_parser(subparsers) -> argparse.ArgumentParser:
    """``profile``: micro-benchmark this machine into the SQLite profile store."""
    p = subparsers.add_parser("profile", help="measure GEMMs, attention, memory and "
                              "collectives on this machine", description=add_profile_parser.__doc__)
    p.add_argument("--quick", action="store_true", help="small grid (about a minute or less)")
    p.add_argument("--db", default=None, help="SQLite file (default ~/.cache/paraplan/profiles.sqlite)")
    p.add_argument("--world-sizes", type=positive_int("--world-sizes", MAX_RANKS), nargs="+", default=None,
                   help="collective world sizes (default 2 4)")
    p.add_argument("--no-collectives", action="store_true", help="skip the torchrun part")
    p.set_defaults(func=run_profile)
    return p


def check_validate_args(args) -> None:
    """Every check of validate's flags that needs no torch, before anything is launched: ranks,
    the model's shape, the report folder. ConfigError naming the flag."""
    if args.node_rank >= args.nnodes:
        raise ConfigError("--node-rank", f"{args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes {args.nnodes})")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--rdzv-endpoint", "multi-node runs (--nnodes > 1) need --rdzv-endpoint host:port")
    if args.nproc_per_node is not None and args.dp is None:
        world = args.nproc_per_node * args.nnodes
        if world % (args.tp * args.pp):
            raise ConfigError("--nproc-per-node", f"{args.nproc_per_node} x --nnodes {args.nnodes} = {world} ranks "
                              f"is not divisible by --tp {args.tp} x --pp {args.pp}",
                              accepted=f"a multiple of {args.tp * args.pp} ranks")
    if args.nproc_per_node is not None and args.dp is not None:
        world = args.tp * args.pp * args.dp
        if world != args.nproc_per_node * args.nnodes:
            raise ConfigError("--nproc-per-node", f"{args.nproc_per_node} x --nnodes {args.nnodes} ranks, but --tp "
                              f"{args.tp} x --pp {args.pp} x --dp {args.dp} = {world}",
                              accepted=f"{world} ranks in all")
    if args.tp * args.pp * (args.dp or 1) > MAX_RANKS:
        raise ConfigError("--tp/--pp/--dp", f"{args.tp * args.pp * (args.dp or 1)} ranks in all, more than this "
                          f"harness launches", accepted=f"at most {MAX_RANKS} ranks")
    if args.hidden % args.heads:
        raise ConfigError("--hidden", f"{args.hidden} is not divisible by --heads {args.heads}")
    if args.heads % args.tp:
        raise ConfigError("--tp", f"--heads {args.heads} is not divisible by --tp {args.tp}")
    if args.virtual_stages > 1 and args.pp == 1:
        raise ConfigError("--virtual-stages", "interleaving needs --pp > 1")
    if args.zero == 3 and args.pp > 1:
        raise ConfigError("--zero", "ZeRO-3 with --pp > 1 is not supported by this harness", accepted="0-2 with pp > 1")
    if args.global_batch and args.global_batch % (args.micro_batch * (args.dp or 1)):
        raise ConfigError("--global-batch", f"{args.global_batch} is not divisible by --micro-batch "
                          f"{args.micro_batch} x dp {args.dp or 1}")
    check_out_path("--out", args.out, folder=True)
    for flag, path in (("--predicted", args.predicted), ("--db", args.db)):
        if path is not None:
            check_in_path(flag, path)


def check_profile_args(args) -> None:
    """profile's flags (collective world sizes, the database path), checked before torch starts."""
    bad = [w for w in args.world_sizes or () if w < 2]
    if bad:
        raise ConfigError("--world-sizes", f"collectives need >= 2 processes, got {bad}", accepted="integers >= 2")
    if args.db is not None:
        check_out_path("--db", args.db, folder=False)


def _plan_and_launch(args):
    """The RunPlan and the torchrun options the flags describe."""
    from paraplan.validation.worker import RunPlan   # torch: only when a run is launched
    check_validate_args(args)
    nnodes = args.nnodes
    if args.nproc_per_node is None and args.dp is None:
        dp = 1
    elif args.dp is None:
        world = args.nproc_per_node * nnodes
        if world % (args.tp * args.pp):
            raise ConfigError("--nproc-per-node", f"world {world} is not divisible by tp({args.tp})"
                              f" * pp({args.pp})")
        dp = world // (args.tp * args.pp)
    else:
        dp = args.dp
    plan = RunPlan(tp=args.tp, pp=args.pp, dp=dp, zero=args.zero, micro_batch=args.micro_batch,
                   global_batch=args.global_batch or 0, recompute=args.recompute,
                   sequence_parallel=args.sequence_parallel, virtual_stages=args.virtual_stages,
                   steps=args.steps, warmup=args.warmup)
    nproc = args.nproc_per_node
    if nproc is None:
        if plan.world_size % nnodes:
            raise ConfigError("--nnodes", f"world {plan.world_size} not divisible by {nnodes}")
        nproc = plan.world_size // nnodes
    opts = LaunchOptions(nproc_per_node=nproc, nnodes=nnodes, node_rank=args.node_rank,
                         rdzv_endpoint=args.rdzv_endpoint, timeout_s=args.timeout)
    return plan, opts


def run_validate(args) -> int:
    """Launch the plan, check it against a single-process run, write the report. 0 = match."""
    from paraplan.validation.model import GPTConfig   # torch: only when a run is launched
    from paraplan.validation.reference import compare_to_reference, load_parallel_grads, reference_run
    check_validate_args(args)
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=args.seq_len, hidden=args.hidden,
                    heads=args.heads, layers=args.layers, seed=args.seed,
                    attention=args.attention)
    plan, opts = _plan_and_launch(args)
    predicted, estimate_dict = None, None
    if args.predicted:
        try:
            with open(args.predicted) as f:
                predicted = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError("predicted", f"cannot read {args.predicted}: {e}") from e
    else:
        predicted, est = predict_run(cfg, plan, args.db, allow_profiling=not args.no_profile)
        estimate_dict = est.to_dict()
    check_ref = not args.no_reference and opts.nnodes == 1
    spec = {"model": asdict(cfg), "plan": asdict(plan), "dump_grads": check_ref}
    results = launch_worker(spec, args.out, opts)
    ref_check = None
    if check_ref:
        ref = reference_run(cfg, plan)
        ref_check = compare_to_reference(results, ref, load_parallel_grads(args.out))
        ref_check.pop("parallel_losses", None)
    report = build_report(asdict(plan), results, args.out, predicted=predicted,
                          reference_check=ref_check, model=asdict(cfg),
                          extra={"machine": machine_fingerprint(), "profile_db": args.db,
                                 "estimate": estimate_dict})
    print(format_table(comparison_rows(report["measured"], predicted)), end="")
    if ref_check is not None:
        print(f"loss matches single-process reference: {ref_check['matches']} "
              f"(loss rel.err {ref_check['loss_rel_err']:.2e} <= {ref_check['loss_rtol']:g}, "
              f"grad rel.err {ref_check['grad_rel_err']:.2e} <= {ref_check['grad_rtol']:g})")
    print(f"report: {os.path.join(args.out, 'report.json')}")
    return 0 if ref_check is None or ref_check["matches"] else 1


def run_profile(args) -> int:
    """Run the micro-benchmarks and store them; prints a short summary."""
    from paraplan.validation.profile import ProfileOptions, run_profile as _run   # torch
    check_profile_args(args)
    opts = ProfileOptions.quick() if args.quick else ProfileOptions.full()
    if args.world_sizes:
        opts = replace(opts, world_sizes=tuple(args.world_sizes))
    run_id, rows = _run(opts, db=args.db, collectives=not args.no_collectives)
    path = ProfileStore(args.db).path
    for r in rows:
        if r["kind"] == "device":
            continue
        bw = r["bus_bandwidth_bytes_per_s"] or r["bandwidth_bytes_per_s"]
        rate = (f"{r['flops_per_s'] / 1e9:8.1f} GFLOP/s" if r["flops_per_s"] else
                f"{bw / 1e9:8.3f} GB/s" if bw else f"{r['time_s'] * 1e6:8.2f} us")
        print(f"{r['kind']:<10} {r['op']:<16} {str(r['dtype']):<9} n={r['world_size']:<2} "
              f"{json.dumps(r['shape']):<48} {rate}")
    print(f"stored run {run_id} ({len(rows)} rows) in {path}")
    return 0


def main(argv=None) -> int:
    """Stand-alone ``validate`` / ``profile`` CLI; ParaplanError -> one line, exit code 2."""
    ap = ParaplanArgumentParser(prog="paraplan")
    sub = ap.add_subparsers(dest="command", required=True)
    add_validate_parser(sub)
    add_profile_parser(sub)
    args, code = parse_or_exit_code(ap, argv)
    return code if args is None else run_command(args.func, args)


def register(subparsers) -> None:
    """Hook for the main ``paraplan`` parser."""
    add_validate_parser(subparsers).set_defaults(func=run_validate)
    add_profile_parser(subparsers).set_defaults(func=run_profile)


if __name__ == "__main__":
    sys.exit(main())
