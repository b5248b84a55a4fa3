"""Command-line front ends: ``paraplan validate`` and ``paraplan profile``.

``validate`` reads a plan as every command does (the shared plan flags over ``--plan FILE``:
:func:`paraplan.cli.common.add_plan_args`), sizes and checks the run without torch
(:func:`paraplan.validation.sizing.size_run`, which says what the harness runs of the plan:
:mod:`paraplan.validation.support`), launches it and prints the comparison.
``add_validate_parser`` / ``add_profile_parser`` attach the subcommands to the project CLI's
subparsers; ``main(argv)`` is a stand-alone entry point with just these two (used by tests).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace

from paraplan import progress
from paraplan.cli.common import (PLAN_FLAGS, ParaplanArgumentParser, add_plan_args, check_in_path, check_out_path,
                                 non_negative_int, number, parse_or_exit_code, plan_from_args, positive_int,
                                 run_command)
from paraplan.errors import ConfigError, require_extra
from paraplan.profiles.store import ProfileStore, machine_fingerprint
from paraplan.validation.compare import build_report, comparison_rows, format_table
from paraplan.validation.config import RunOptions, run_spec
from paraplan.validation.launch import LaunchOptions
from paraplan.validation.predict import predict_run
from paraplan.validation.sizing import (DEFAULT_MODEL, DEFAULT_STEPS, DEFAULT_WARMUP, MAX_RANKS, MAX_SIZE, MODEL_KEYS,
                                        SizedRun, run_label, size_run)
from paraplan.validation.support import REFUSED, RUNS_AS, SUPPORT

MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: the model flags whose name is not the harness model's field
MODEL_FLAG_DEST = {"vocab_size": "vocab"}


def _support_epilog() -> str:
    """What the harness runs differently and refuses, from the support table (validation.support)."""
    def values(s):
        return s.field if s.values == (True,) else f"{s.field} {'|'.join(str(v) for v in s.values)}"
    runs_as = [f"{values(s)} as {s.as_text or s.runs_as}" for s in SUPPORT
               if s.verdict == RUNS_AS and s.values and not isinstance(s.values[0], bool)]
    refused = [values(s) for s in SUPPORT if s.verdict == REFUSED]
    return (f"The plan flags are estimate's. The harness runs {', '.join(runs_as)} and the switches it has not at "
            f"their defaults, each said in a note; it refuses {', '.join(refused)}. The table: docs/validation.md.")


def add_validate_parser(subparsers) -> argparse.ArgumentParser:
    """``validate``: run a plan on real torch under torchrun and report measured vs predicted."""
    p = subparsers.add_parser("validate", help="run a plan on real torch and compare with the "
                              "prediction", description=add_validate_parser.__doc__ + " The layout comes from "
                              "the plan flags (or --plan FILE, flags given overriding it); the model is the "
                              "harness's (the model flags).", epilog=_support_epilog())
    g = p.add_argument_group("launch")
    g.add_argument("--nproc-per-node", type=positive_int("--nproc-per-node", MAX_RANKS), default=None,
                   help="processes on this node (default: tp*cp*pp*dp / nnodes)")
    g.add_argument("--nnodes", type=positive_int("--nnodes", MAX_RANKS), default=1,
                   help="nodes, one validate on each (default 1)")
    g.add_argument("--node-rank", type=non_negative_int("--node-rank", MAX_RANKS, "the first node"), default=0,
                   help="this node's rank, 0..nnodes-1 (default 0)")
    g.add_argument("--rdzv-endpoint", default=None, help="host:port (multi-node)")
    g.add_argument("--timeout", type=number("--timeout", high=MAX_TIMEOUT_S), default=900.0,
                   help="seconds before giving up (> 0)")
    add_plan_args(p)
    # validate's spellings before it took the shared plan flags (the README used --sequence-parallel)
    g = p.add_argument_group("plan, as validate spelled it before")
    g.add_argument("--sequence-parallel", dest="sp", action="store_const", const=True, default=None,
                   help="the same as --sp")
    g.add_argument("--virtual-stages", dest="vpp", type=positive_int("--virtual-stages"), default=None,
                   help="the same as --vpp")
    g = p.add_argument_group("run")
    g.add_argument("--global-batch", type=positive_int("--global-batch", MAX_SIZE, sizes=True), default=None,
                   help="sequences per step (default: micro-batch x dp x pp)")
    g.add_argument("--steps", type=positive_int("--steps", MAX_SIZE), default=DEFAULT_STEPS,
                   help=f"timed steps (default {DEFAULT_STEPS})")
    g.add_argument("--warmup", type=non_negative_int("--warmup", MAX_SIZE, "none"), default=DEFAULT_WARMUP,
                   help=f"warm-up steps, not timed (default {DEFAULT_WARMUP})")
    g = p.add_argument_group("model (the harness's)")
    g.add_argument("--layers", type=positive_int("--layers", MAX_SIZE), default=None,
                   help=f"transformer blocks (default {DEFAULT_MODEL['layers']}, or the smallest multiple of pp x "
                        f"virtual stages above it: one block per pipeline chunk at least)")
    g.add_argument("--hidden", type=positive_int("--hidden", MAX_SIZE), default=None,
                   help=f"hidden size (default {DEFAULT_MODEL['hidden']})")
    g.add_argument("--heads", type=positive_int("--heads", MAX_SIZE), default=None,
                   help=f"attention heads (default {DEFAULT_MODEL['heads']})")
    g.add_argument("--seq-len", type=positive_int("--seq-len", MAX_SIZE, sizes=True), default=None,
                   help=f"tokens per sequence (default {DEFAULT_MODEL['seq_len']})")
    g.add_argument("--vocab", type=positive_int("--vocab", MAX_SIZE), default=None,
                   help=f"vocabulary size (default {DEFAULT_MODEL['vocab_size']})")
    g.add_argument("--seed", type=non_negative_int("--seed", 2**32 - 1, "the default seed"), default=None,
                   help="seed of the initial parameters (default 0)")
    g.add_argument("--attention", default=None, choices=["math", "sdpa"],
                   help="materialised softmax (default) or fused SDPA (the default with --recompute op-sac)")
    g.add_argument("--activation", default=None, choices=["gelu", "swiglu"],
                   help="the MLP's (default gelu, or the plan file's model's)")
    g.add_argument("--norm", default=None, choices=["layernorm", "rmsnorm"],
                   help="default layernorm (or the plan file's model's)")
    g.add_argument("--no-bias", action="store_const", const=False, dest="bias", default=None,
                   help="linear layers without biases (default: with, or as the plan file's model)")
    g.add_argument("--rotary", action="store_const", const=True, default=None,
                   help="rotary positions instead of learned ones (default: learned, or as the plan file's model)")
    g.add_argument("--qk-norm", action="store_const", const=True, default=None, dest="qk_norm",
                   help="RMSNorm over each query and key head before the positions, as Qwen3 (default: none, "
                        "or as the plan file's model)")
    g.add_argument("--kv-heads", type=positive_int("--kv-heads", MAX_SIZE), default=None,
                   help="key/value heads, grouped-query attention (default: one per head)")
    g.add_argument("--experts", type=non_negative_int("--experts", MAX_SIZE, "a dense MLP"), default=None,
                   help="routed experts per layer (a dropless mixture of experts in every block; default 0: dense, "
                        "or a few standing in for a plan file's mixture-of-experts model)")
    g.add_argument("--top-k", type=positive_int("--top-k", MAX_SIZE), default=None,
                   help="experts per token (default 2, or the plan file's model's share of its experts)")
    g.add_argument("--expert-ffn", type=positive_int("--expert-ffn", MAX_SIZE), default=None,
                   help="an expert's inner width (default 4 x hidden, the dense MLP's)")
    g.add_argument("--moe-imbalance", type=number("--moe-imbalance", low=1.0, high=1e6, low_open=False),
                   default=1.0,
                   help="the prediction's busiest expert shard's tokens over the balanced share (estimate's "
                        "--moe-imbalance; default 1.0); the run reports the load it measured")
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
    p.add_argument("--quick", action="store_true", help="small grid (one to two minutes on an idle 2-core machine)")
    p.add_argument("--db", default=None, help="SQLite file (default ~/.cache/paraplan/profiles.sqlite)")
    p.add_argument("--world-sizes", type=positive_int("--world-sizes", MAX_RANKS), nargs="+", default=None,
                   help="collective world sizes (default 2 4)")
    p.add_argument("--no-collectives", action="store_true", help="skip the torchrun part")
    p.add_argument("--rows", action="store_true", help="print every measurement, not just the summary")
    p.set_defaults(func=run_profile)
    return p


def flag_of(field: str) -> str:
    """The validate flag that sets a field a check names (``model.vocab_size`` -> ``--vocab``, ``tp/cp`` ->
    ``--tp/--cp``); a flag or a plan file's ``plan.KEY`` stays as it is."""
    if field.startswith("-") or field.startswith("plan."):
        return field
    if "/" in field:
        return "/".join(flag_of(f) for f in field.split("/"))
    field = field.removeprefix("model.")
    return "--" + MODEL_FLAG_DEST.get(field, field).replace("_", "-")


def check_validate_args(args) -> SizedRun:
    """Every check of validate's flags, before anything is launched (no torch): the ranks, the plan
    (flags over ``--plan``), the model and the run (:func:`paraplan.validation.sizing.size_run`), the
    report's paths. Returns the sized run; a ConfigError names the flag (``--plan`` for a value the file set)."""
    if args.node_rank >= args.nnodes:
        raise ConfigError("--node-rank", f"{args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes {args.nnodes})")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--rdzv-endpoint", "multi-node runs (--nnodes > 1) need --rdzv-endpoint host:port")
    notes = []
    if args.plan is not None:
        check_in_path("--plan", args.plan)
        notes = _tp_switches_off(args)
    plan = plan_from_args(args, default_engine=None)   # the harness is plain PyTorch: generic
    given = {k for k in PLAN_FLAGS if getattr(args, k, None) is not None}
    given |= {"sp", "cp_mode"} if args.sp_mode else set()
    asked = {key: getattr(args, MODEL_FLAG_DEST.get(key, key)) for key in MODEL_KEYS}
    try:
        sized = size_run(plan, asked, RunOptions(global_batch=args.global_batch or 0, steps=args.steps,
                                                 warmup=args.warmup),
                         nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, plan_file=args.plan, flags_given=given)
    except ConfigError as e:
        if e.source:
            raise
        raise ConfigError(flag_of(e.field), e.problem, accepted=e.accepted) from None
    check_out_path("--out", args.out, folder=True)
    for flag, path in (("--predicted", args.predicted), ("--db", args.db)):
        if path is not None:
            check_in_path(flag, path)
    if args.db is not None and not args.predicted:
        ProfileStore(args.db, readonly=True)     # a database it cannot read is named now, not after the run
    return replace(sized, notes=(*sized.notes[:1], *notes, *sized.notes[1:]))


#: a plan file's switches that need a tp group, off where --tp 1 leaves none (and the flag does not ask for them)
TP_SWITCHES = ("sp", "tp_comm_overlap")


def _tp_switches_off(args) -> list[str]:
    """With ``--plan`` and ``--tp 1``: the file's sequence parallelism (and TP overlap) off, as the harness
    ran them before it took a Plan (no flag turns a file's switch off). Returns the note saying so."""
    from paraplan.planfile import read_plan_file
    if args.tp != 1:
        return []
    raw = read_plan_file(args.plan)["plan"]
    off = [k for k in TP_SWITCHES if raw.get(k) is True and getattr(args, k, None) is None]
    for k in off:
        setattr(args, k, False)
    return [f"{' and '.join(off)} of {args.plan} off: --tp 1 leaves no tensor-parallel group"] if off else []


def check_profile_args(args) -> None:
    """profile's flags (collective world sizes, the database path), checked before torch starts."""
    bad = [w for w in args.world_sizes or () if w < 2]
    if bad:
        raise ConfigError("--world-sizes", f"collectives need >= 2 processes, got {bad}", accepted="integers >= 2")
    if args.db is not None:
        check_out_path("--db", args.db, folder=False)
        if os.path.exists(args.db):
            ProfileStore(args.db, timeout_s=5.0)   # not a database, another program's, locked or read-only: said first


def _run_dir(out: str) -> str:
    """A fresh folder for this run's rank files under ``out`` (``.validate-<pid>``); folders
    of earlier runs whose process is gone (killed) are removed first, never read."""
    import shutil
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if name.startswith(".validate-") and name[len(".validate-"):].isdigit():
            pid = int(name[len(".validate-"):])
            if pid == os.getpid() or not _alive(pid):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    path = os.path.join(out, f".validate-{os.getpid()}")
    os.makedirs(path)
    return path


def keep_traces(run_dir: str, out: str) -> list[str]:
    """Move each rank's profiled-step Chrome trace (``trace_rank<N>.json``, worker) from the run's
    scratch folder to ``out/traces/`` (an earlier run's traces there removed first); their paths
    relative to ``out``, sorted by name."""
    import glob
    for stale in glob.glob(os.path.join(out, "traces", "trace_rank*.json")):   # an earlier run's ranks
        os.remove(stale)
    kept = []
    for path in sorted(glob.glob(os.path.join(run_dir, "trace_rank*.json"))):
        dest = os.path.join(out, "traces", os.path.basename(path))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(path, dest)
        kept.append(os.path.relpath(dest, out))
    return kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launch_with_progress(spec: dict, run_dir: str, opts, options: RunOptions) -> list[dict]:
    """launch_worker with a bar over the steps of the slowest local rank (progress records)."""
    from paraplan.validation.launch import launch_worker, slowest_progress
    ranks = range(opts.node_rank * opts.nproc_per_node, (opts.node_rank + 1) * opts.nproc_per_node)
    total = options.warmup + options.steps + (1 if options.profile_ops else 0)
    with progress.bar(desc=f"validate: {opts.nproc_per_node} ranks", total=total, unit="step") as b:
        def poll():
            done = slowest_progress(run_dir, ranks)
            if done > b.n:
                b.update(done - b.n)
        return launch_worker(spec, run_dir, opts, on_poll=poll,
                             log_path=os.path.join(os.path.dirname(run_dir), "torchrun.log"))


def harness_imbalance(args) -> float:
    """The routing imbalance validate predicts its harness at: --moe-imbalance, else 1.0 (the harness's
    MoE reports the busiest rank's load it ran; a trained router's default does not describe it)."""
    return 1.0 if args.moe_imbalance is None else args.moe_imbalance


def run_validate(args) -> int:
    """Launch the plan, check it against a single-process run, write the report. 0 = match."""
    import shutil
    import time

    sized = check_validate_args(args)
    require_extra("torch", "paraplan validate")
    from paraplan.validation.reference import (SPREAD_FACTOR, compare_to_reference, load_parallel_grads,
                                               reference_run, reference_spread)
    for note in sized.notes:
        print(f"paraplan: note: {note}", file=sys.stderr)
    cfg, plan, options = sized.model, sized.plan, sized.options
    opts = LaunchOptions(nproc_per_node=sized.nproc_per_node, nnodes=sized.nnodes, node_rank=args.node_rank,
                         rdzv_endpoint=args.rdzv_endpoint, timeout_s=args.timeout)
    predicted, estimate_dict = None, None
    if args.predicted:
        try:
            with open(args.predicted) as f:
                predicted = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError("predicted", f"cannot read {args.predicted}: {e}") from e
    else:
        predicted, est = predict_run(cfg, plan, options, args.db, allow_profiling=not args.no_profile,
                                     moe_imbalance=harness_imbalance(args))
        estimate_dict = est.to_dict()
    check_ref = not args.no_reference and opts.nnodes == 1
    spec = run_spec(cfg, plan, options, dump_grads=check_ref)
    run_dir = _run_dir(args.out)
    try:
        t0 = time.perf_counter()
        results = _launch_with_progress(spec, run_dir, opts, options)
        progress.summary(f"validate: {run_label(plan)} on {opts.world_size} ranks, "
                         f"{options.warmup} warm-up + {options.steps} timed steps in {time.perf_counter() - t0:.1f} s")
        ref_check = None
        if check_ref:
            with progress.step("validate: single-process reference run"):
                ref = reference_run(cfg, plan, options)
            with progress.step("validate: the reference again, nudged and re-split (its own spread)"):
                spread = reference_spread(cfg, plan, options, ref)
            ref_check = compare_to_reference(results, ref, load_parallel_grads(run_dir), spread)
            ref_check.pop("parallel_losses", None)
        traces = keep_traces(run_dir, args.out)
        report = build_report(plan.to_dict(), results, args.out, predicted=predicted,
                              reference_check=ref_check, model=asdict(cfg),
                              extra={"run": asdict(options), "notes": list(sized.notes),
                                     "machine": machine_fingerprint(), "profile_db": args.db,
                                     "estimate": estimate_dict, "traces": traces})
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(format_table(comparison_rows(report["measured"], predicted)), end="")
    if ref_check is not None:
        print(f"loss matches single-process reference: {ref_check['matches']} "
              f"(loss rel.err first step {ref_check['first_loss_rel_err']:.2e} <= {ref_check['loss_rtol']:g}, "
              f"every step: nearest its tolerance step {ref_check['worst_step']}, {ref_check['worst_step_err']:.2e} "
              f"<= {ref_check['worst_step_tolerance']:.2g}"
              + (f" (1e-4 or {SPREAD_FACTOR:g}x the reference's own spread so far)" if ref_check['worst_step'] > 1 else "")
              + ", "
              f"grad rel.err {ref_check['grad_rel_err']:.2e} <= {ref_check['grad_rtol']:g})")
    print(verdict_line(plan, report))
    load = report["measured"].get("expert_load_busiest")
    if load is not None:
        print(f"experts: the busiest ep rank ran {load:.2f}x its balanced share of routed tokens per MoE layer "
              f"(predicted with --moe-imbalance {harness_imbalance(args):g})")
    print(f"report: {os.path.join(args.out, 'report.json')}")
    return 0 if ref_check is None or ref_check["matches"] else 1


def verdict_line(plan, report: dict) -> str:
    """One human line: the plan, measured and predicted step time and the error."""
    m = report["measured"]["step_time_s"]
    p = (report.get("predicted") or {}).get("step_time_s")
    spread = report["measured"].get("step_times_s") or []
    noise = (f" (median of {len(spread)} steps, {1e3 * min(spread):.1f}-{1e3 * max(spread):.1f} ms)"
             if len(spread) > 1 else "")
    if p is None:
        return f"{run_label(plan)}: step time measured {1e3 * m:.1f} ms{noise} (no prediction)"
    return (f"{run_label(plan)}: step time measured {1e3 * m:.1f} ms{noise}, predicted "
            f"{1e3 * p:.1f} ms, error {100 * (p - m) / m:+.1f} %")


def run_profile(args) -> int:
    """Run the micro-benchmarks and store them; prints a short summary (every row with --rows)."""
    from paraplan.profiles.cluster import noisy_profile_warning
    from paraplan.profiles.store import profile_noise
    check_profile_args(args)
    require_extra("torch", "paraplan profile")
    from paraplan.validation.profile import ProfileOptions, run_profile as _run, summarize   # torch
    opts = ProfileOptions.quick() if args.quick else ProfileOptions.full()
    if args.world_sizes:
        opts = replace(opts, world_sizes=tuple(args.world_sizes))
    run_id, rows = _run(opts, db=args.db, collectives=not args.no_collectives)
    path = ProfileStore(args.db).path
    for r in rows if args.rows else ():
        if r["kind"] == "device":
            continue
        bw = r["bus_bandwidth_bytes_per_s"] or r["bandwidth_bytes_per_s"]
        rate = (f"{r['flops_per_s'] / 1e9:8.1f} GFLOP/s" if r["flops_per_s"] else
                f"{bw / 1e9:8.3f} GB/s" if bw else f"{r['time_s'] * 1e6:8.2f} us")
        sp = "" if r.get("spread") is None else f"  spread {100 * r['spread']:5.1f}%"
        print(f"{r['kind']:<10} {r['op']:<16} {str(r['dtype']):<9} n={r['world_size']:<2} "
              f"{json.dumps(r['shape']):<48} {rate}{sp}")
    for line in summarize(rows):
        print(line)
    print(f"stored run {run_id} ({len(rows)} measurements) in {path}")
    warning = noisy_profile_warning({"noise": profile_noise(rows), "run_id": run_id,
                                     "fingerprint": machine_fingerprint()["id"]})
    if warning:
        print(warning, file=sys.stderr)
    return 0


def main_parser() -> argparse.ArgumentParser:
    """A parser with just ``validate`` and ``profile``."""
    ap = ParaplanArgumentParser(prog="paraplan")
    sub = ap.add_subparsers(dest="command", required=True)
    add_validate_parser(sub)
    add_profile_parser(sub)
    return ap


def main(argv=None) -> int:
    """Stand-alone ``validate`` / ``profile`` CLI; ParaplanError -> one line, exit code 2."""
    args, code = parse_or_exit_code(main_parser(), argv)
    return code if args is None else run_command(args.func, args)


def register(subparsers) -> None:
    """Hook for the main ``paraplan`` parser."""
    add_validate_parser(subparsers).set_defaults(func=run_validate)
    add_profile_parser(subparsers).set_defaults(func=run_profile)


if __name__ == "__main__":
    sys.exit(main())
