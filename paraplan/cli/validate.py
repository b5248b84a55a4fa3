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

from paraplan import progress
from paraplan.cli.common import (ParaplanArgumentParser, check_in_path, check_out_path, non_negative_int, number,
                                 parse_or_exit_code, positive_int, run_command)
from paraplan.errors import ConfigError, ParaplanError
from paraplan.plan import OFFLOAD, RECOMPUTE
from paraplan.profiles.store import ProfileStore, machine_fingerprint
from paraplan.validation.compare import build_report, comparison_rows, format_table
from paraplan.validation.launch import LaunchOptions
from paraplan.validation.predict import predict_run


# Sizes of the validation run: it runs on this machine, so a few thousand ranks or a model side of
# a million are far past anything it can launch; larger values are refused before torch starts.
MAX_RANKS = 4096
MAX_SIZE = 1_000_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The model ``validate`` builds unless told otherwise: sized so that compute, not gloo's per-call
#: latency, makes the step on a CPU (about 3.7 M parameters; 256 tokens per micro-batch). With the
#: earlier default (hidden 64, sequence 32: 2.3 MB per rank) a step was ~10 ms, mostly collective
#: latency, and the step-time errors ran to -87 %. Measured errors: benchmarks/validate_defaults.py.
DEFAULT_MODEL = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 256, "vocab": 1024}
#: warm-up steps before the timed ones: a fresh process's first passes run slower (allocator, caches)
DEFAULT_WARMUP = 3
#: timed steps: the step time is their median (validation.compare), so a few disturbed steps do not move it
DEFAULT_STEPS = 10


def add_validate_parser(subparsers) -> argparse.ArgumentParser:
    """``validate``: run a plan on real torch under torchrun and report measured vs predicted."""
    p = subparsers.add_parser("validate", help="run a plan on real torch and compare with the "
                              "prediction", description=add_validate_parser.__doc__)
    g = p.add_argument_group("launch")
    g.add_argument("--nproc-per-node", type=positive_int("--nproc-per-node", MAX_RANKS), default=None,
                   help="processes on this node (default: tp*pp*dp / nnodes)")
    g.add_argument("--nnodes", type=positive_int("--nnodes", MAX_RANKS), default=1,
                   help="nodes taking part (torchrun --nnodes; default 1)")
    g.add_argument("--node-rank", type=non_negative_int("--node-rank", MAX_RANKS, "the first node"), default=0,
                   help="this node's index among --nnodes (torchrun --node-rank; default 0)")
    g.add_argument("--rdzv-endpoint", default=None, help="host:port (multi-node)")
    g.add_argument("--timeout", type=number("--timeout", high=MAX_TIMEOUT_S), default=900.0,
                   help="seconds before giving up (> 0)")
    g = p.add_argument_group("plan")
    g.add_argument("--plan", default=None, help="take the layout (tp, pp, dp, cp, ZeRO, optimizer offload, micro-batch, recompute, "
                   "sequence parallelism, interleaving) from a plan file (`paraplan plan --out`); the model stays "
                   "the harness's (the model flags below); flags given override the file")
    g.add_argument("--tp", type=positive_int("--tp", MAX_RANKS), default=None, help="default 1")
    g.add_argument("--pp", type=positive_int("--pp", MAX_RANKS), default=None, help="default 1")
    g.add_argument("--cp", type=positive_int("--cp", MAX_RANKS), default=None,
                   help="context parallelism, run as ring attention over load-balanced causal chunks (default 1)")
    g.add_argument("--dp", type=positive_int("--dp", MAX_RANKS), default=None, help="default: world / (tp*cp*pp)")
    g.add_argument("--ep", type=positive_int("--ep", MAX_RANKS), default=None,
                   help="expert parallelism, carved from dp (needs --experts; default 1)")
    g.add_argument("--etp", type=positive_int("--etp", MAX_RANKS), default=None,
                   help="expert tensor parallelism: 1 (each expert whole on every tp rank, run on its sequence "
                        "shard) or tp (each expert split over the tp group, with ep 1); default 1")
    g.add_argument("--zero", type=int, default=None, choices=(0, 1, 2, 3), help="default 0")
    g.add_argument("--micro-batch", type=positive_int("--micro-batch", MAX_SIZE), default=None, help="default 1")
    g.add_argument("--global-batch", type=positive_int("--global-batch", MAX_SIZE), default=None,
                   help="default: micro*dp*pp")
    g.add_argument("--recompute", default=None, choices=RECOMPUTE, help="default none")
    g.add_argument("--offload", default=None, choices=OFFLOAD,
                   help="cpu: optimizer states and the fp32 master slice in host memory (ZeRO-Offload; "
                        "needs --zero 1 or 2; the harness has no nvme); default none")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism over the tp group (estimate's --sp; needs --tp > 1)")
    g.add_argument("--virtual-stages", type=positive_int("--virtual-stages", MAX_SIZE), default=None,
                   help="interleaved 1F1B chunks (default 1)")
    g.add_argument("--steps", type=positive_int("--steps", MAX_SIZE), default=DEFAULT_STEPS, help="timed steps")
    g.add_argument("--warmup", type=non_negative_int("--warmup", MAX_SIZE, "none"), default=DEFAULT_WARMUP,
                   help="warm-up steps (not timed)")
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=positive_int("--layers", MAX_SIZE), default=None,
                   help=f"transformer blocks (default {DEFAULT_MODEL['layers']}, or the smallest multiple of pp x "
                        f"virtual stages above it: one block per pipeline chunk at least)")
    g.add_argument("--hidden", type=positive_int("--hidden", MAX_SIZE), default=DEFAULT_MODEL["hidden"],
                   help=f"model width (default {DEFAULT_MODEL['hidden']})")
    g.add_argument("--heads", type=positive_int("--heads", MAX_SIZE), default=DEFAULT_MODEL["heads"],
                   help=f"attention heads (default {DEFAULT_MODEL['heads']})")
    g.add_argument("--seq-len", type=positive_int("--seq-len", MAX_SIZE), default=DEFAULT_MODEL["seq_len"],
                   help=f"tokens per sequence (default {DEFAULT_MODEL['seq_len']})")
    g.add_argument("--vocab", type=positive_int("--vocab", MAX_SIZE), default=DEFAULT_MODEL["vocab"],
                   help=f"vocabulary size (default {DEFAULT_MODEL['vocab']})")
    g.add_argument("--seed", type=non_negative_int("--seed", 2**32 - 1, "the default seed"), default=0,
                   help="seed of the initial weights, the same on every rank and in the single-process reference run "
                        "(default 0)")
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


#: validate's layout flags and their defaults where neither the flag nor a plan file gives them
LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "zero": 0, "micro_batch": 1, "recompute": "none",
                   "virtual_stages": 1, "offload": "none"}
#: plan-file field -> validate flag, for the layout the harness runs
PLAN_FILE_LAYOUT = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "etp": "etp", "zero": "zero",
                    "offload": "offload",
                    "micro_batch": "micro_batch",
                    "recompute": "recompute", "vpp": "virtual_stages"}
#: schedules the harness runs as 1F1B (it has no zero-bubble or GPipe schedule of its own)
RUN_AS_1F1B = ("zb-h1", "gpipe")
#: recomputation the harness runs (validation.model.RECOMPUTE_CHOICES, kept here so this check needs no torch)
HARNESS_RECOMPUTE = ("none", "selective", "full", "op-sac")
#: offload the harness runs: the optimizer's states and master slice to host memory (not NVMe, not parameters)
HARNESS_OFFLOAD = ("none", "cpu")


def plan_file_layout(path, given=()) -> tuple[dict, list[str]]:
    """(validate flags, notes) for the layout of a plan file: what the harness runs, and what it runs
    differently (said); a plan using what the harness cannot run (NVMe or parameter offload, fp8;
    recomputation it lacks unless ``given`` holds ``recompute``, the flag that overrides it) is
    refused, naming the field. Context parallelism runs as ring attention (Ulysses is said to run so);
    optimizer offload to host memory runs (NVMe or parameter offload is refused unless --offload replaces it);
    expert parallelism runs on the harness's mixture of experts (``--experts``)."""
    from paraplan.planfile import read_plan_file
    raw = read_plan_file(path)["plan"]
    refuse = [(f"offload {raw.get('offload')}", f"{raw.get('offload')} offload (it offloads the optimizer to host "
               f"memory: none, cpu)", "offload" not in given and (raw.get("offload") or "none") not in HARNESS_OFFLOAD),
              ("offload_params true", "parameter offload", "offload" not in given and bool(raw.get("offload_params"))),
              (f"dtype {raw.get('dtype')}", "fp8", str(raw.get("dtype", "")).startswith(("fp8", "mxfp8"))),
              (f"recompute {raw.get('recompute')}", f"{raw.get('recompute')} recomputation (it runs "
               f"{', '.join(HARNESS_RECOMPUTE)})",
               "recompute" not in given and (raw.get("recompute") or "none") not in HARNESS_RECOMPUTE)]
    for shown_value, what, bad in refuse:
        if bad:
            raise ConfigError("--plan", f"{path}: {shown_value}: the validation harness runs no {what}",
                              accepted="plans with optimizer offload none or cpu, 16-bit or fp32, recompute "
                                       "none, selective, full or op-sac (or set the layout with --tp/--pp/--dp/... instead)")
    flags = {flag: raw[key] for key, flag in PLAN_FILE_LAYOUT.items() if raw.get(key) is not None}
    flags["sequence_parallel"] = bool(raw.get("sp"))
    notes = [f"layout from {path}; the model is the harness's (--layers/--hidden/...), not the plan's"]
    if raw.get("recompute_modules"):
        notes.append(f"recompute modules {raw['recompute_modules']} run as selective (the attention core)")
    if (raw.get("cp") or 1) > 1 and raw.get("cp_mode", "ring") != "ring":
        notes.append(f"cp_mode {raw['cp_mode']} runs as ring attention (the harness's context parallelism)")
    if (raw.get("ep") or 1) > 1:
        notes.append(f"ep {raw['ep']} runs on the harness's mixture of experts (--experts, --top-k), dropless, "
                     f"ep carved from dp")
    if raw.get("schedule") in RUN_AS_1F1B:
        notes.append(f"schedule {raw['schedule']} runs as 1F1B (the harness has no {raw['schedule']} schedule)")
    return flags, notes


#: the harness model's architecture flags and their defaults (a plan file's model gives its own; the
#: attention is the harness's, sdpa under op-sac: resolve_layout_flags)
ARCHITECTURE_DEFAULTS = {"activation": "gelu", "norm": "layernorm", "bias": True, "rotary": False, "qk_norm": False,
                         "attention": "math",
                         "experts": 0, "top_k": 2}
#: the fewest routed experts the harness gives a plan file's mixture-of-experts model (a multiple of ep)
HARNESS_MIN_EXPERTS = 8


def harness_experts(experts: int, top_k: int, expert_width_ratio: float, ep: int, hidden: int,
                    etp: int) -> tuple[int, int, int]:
    """(experts, top-k, expert width) of the harness's small mixture of experts standing in for a model's
    ``experts`` routed experts, ``top_k`` per token, ``expert_width_ratio`` = expert width / hidden: the
    smallest multiple of ``ep`` from HARNESS_MIN_EXPERTS up (or the model's own count, if fewer, where
    ep divides it), the model's share of experts per token (k / E, at least one), and its width ratio on
    the harness's ``hidden``, rounded to a multiple of 8·etp (at least that: whole shards per rank)."""
    n = experts if experts <= HARNESS_MIN_EXPERTS and experts % ep == 0 else -(-max(HARNESS_MIN_EXPERTS, ep) // ep) * ep
    k = max(1, min(n, round(n * top_k / experts)))
    step = 8 * etp
    width = max(step, step * round(hidden * expert_width_ratio / step))
    return n, k, width


def plan_model_experts(path) -> tuple[int, int, float] | None:
    """(routed experts, top-k, expert width / hidden) of a plan file's model where it names a
    mixture-of-experts preset; None for a dense one (or one that no longer reads)."""
    from paraplan.planfile import read_plan_file
    from paraplan.workloads.presets import load_model
    name = (read_plan_file(path).get("scenario") or {}).get("model")
    try:
        model = load_model(name) if name else None
    except ParaplanError:
        return None
    moe = None if model is None else model.moe
    return None if moe is None else (moe.experts, moe.top_k, moe.expert_ffn_hidden / model.hidden)


def plan_model_architecture(path) -> tuple[dict, list[str], int]:
    """(architecture flags, notes, grouped-query ratio) of a plan file's model where it names a preset:
    its activation, norm, biases and positions, which the harness's small model takes, and its query
    heads per key/value head (1 without grouped-query attention), which :func:`harness_kv_heads` fits
    to the harness's heads once the layout is known."""
    from paraplan.planfile import read_plan_file
    from paraplan.workloads.presets import load_model
    name = (read_plan_file(path).get("scenario") or {}).get("model")
    if not name:
        return {}, [], 1
    try:
        m = load_model(name)
    except ParaplanError:   # a model file that is gone or no longer reads: the flags' defaults stay
        return {}, [], 1
    arch = {"activation": m.activation if m.activation in ("gelu", "swiglu") else "gelu",
            "norm": m.norm, "bias": bool(m.bias), "rotary": bool(m.rotary), "qk_norm": bool(m.qk_norm)}
    notes = [f"architecture of {name}: {arch['activation']}, {arch['norm']}, "
             f"{'biases' if arch['bias'] else 'no biases'}, {'rotary' if arch['rotary'] else 'learned'} positions"
             + (", QK-norm" if arch["qk_norm"] else "")]
    ratio = m.heads // m.kv_heads if m.kv_heads and m.heads % m.kv_heads == 0 else 1
    return arch, notes, ratio


def harness_kv_heads(heads: int, tp: int, ratio: int) -> int:
    """Key/value heads for the harness's ``heads`` that come nearest a model's grouped-query ``ratio``
    (query heads per kv head) among those it can run: a divisor of ``heads`` and a multiple of ``tp``
    (whole kv heads per tp rank); of two equally near, the larger ratio. ``heads`` itself (multi-head
    attention) when nothing else qualifies."""
    options = [d for d in range(1, heads + 1) if heads % d == 0 and d % tp == 0] or [heads]
    return min(options, key=lambda d: (abs(heads / d - ratio), d))


def _plan_experts_notes(args) -> list[str]:
    """A plan file's mixture-of-experts model given to the harness (``--experts``, ``--top-k``,
    ``--expert-ffn`` set where not given: :func:`harness_experts`), and the note saying so."""
    found = plan_model_experts(args.plan)
    if found is None:
        return []
    experts, top_k, ratio = found
    ep = args.ep if args.ep is not None else LAYOUT_DEFAULTS["ep"]
    etp = args.etp if args.etp is not None else LAYOUT_DEFAULTS["etp"]
    n, k, width = harness_experts(experts, top_k, ratio, ep, args.hidden, etp)
    args.experts = n
    if args.top_k is None:
        args.top_k = k
    if args.expert_ffn is None:
        args.expert_ffn = width
    return [f"the plan's model routes each token to {top_k} of {experts} experts {ratio:.3g} x hidden wide; the "
            f"harness runs {args.top_k} of {n} experts {args.expert_ffn} wide (--experts, --top-k, --expert-ffn "
            f"set them)"]


def resolve_layout_flags(args) -> list[str]:
    """Fill validate's layout flags: those given, else the plan file's (``--plan``), else LAYOUT_DEFAULTS.
    Returns the notes on what it took or fitted (the plan file's layout and architecture, op-sac's attention,
    the layers a pipeline needs). Idempotent."""
    notes = []
    if getattr(args, "plan", None) and not getattr(args, "_layout_resolved", False):
        given = {flag for flag in LAYOUT_DEFAULTS if getattr(args, flag, None) is not None}
        flags, notes = plan_file_layout(args.plan, given)
        arch, arch_notes, ratio = plan_model_architecture(args.plan)
        notes += arch_notes
        for flag, value in arch.items():
            if getattr(args, flag, None) is None:
                setattr(args, flag, value)
        for flag, value in flags.items():
            if flag == "sequence_parallel":
                args.sequence_parallel = args.sequence_parallel or value
            elif getattr(args, flag, None) is None:
                setattr(args, flag, value)
        if ratio > 1 and getattr(args, "kv_heads", None) is None:
            tp = args.tp if args.tp is not None else LAYOUT_DEFAULTS["tp"]
            if args.heads % tp == 0:   # else check_validate_args names --tp
                args.kv_heads = harness_kv_heads(args.heads, tp, ratio)
                ran = args.heads // args.kv_heads
                notes.append(f"the plan's model has {ratio} query heads per key/value head; the harness's "
                             f"{args.heads} heads run {ran} ({args.kv_heads} kv heads"
                             + (")" if ran == ratio else f": kv heads divide the {args.heads} heads and tp {tp})"))
    if getattr(args, "plan", None) and getattr(args, "experts", None) is None:
        notes += _plan_experts_notes(args)
    if args.attention is None and args.recompute == "op-sac":
        args.attention = "sdpa"
        notes.append("op-sac runs on --attention sdpa: it keeps the fused attention kernel's output")
    for flag, value in {**LAYOUT_DEFAULTS, **ARCHITECTURE_DEFAULTS}.items():
        if getattr(args, flag, None) is None:
            setattr(args, flag, value)
    if getattr(args, "layers", None) is None:
        args.layers = harness_layers(args.pp, args.virtual_stages)
        if args.layers != DEFAULT_MODEL["layers"]:
            notes.append(f"pp {args.pp} x {args.virtual_stages} virtual stages: the harness runs {args.layers} layers "
                         f"(every pipeline chunk needs its own; --layers sets them)")
    args._layout_resolved = True
    return notes


def harness_layers(pp: int, virtual_stages: int) -> int:
    """The harness's default layer count for a pipeline of ``pp`` stages of ``virtual_stages`` chunks
    each: DEFAULT_MODEL's, or the smallest multiple of pp·virtual_stages above it (each chunk runs
    whole layers, an equal number: validation.apply_pp.stage_layers)."""
    chunks = max(1, pp) * max(1, virtual_stages)
    return -(-DEFAULT_MODEL["layers"] // chunks) * chunks


def check_validate_args(args) -> None:
    """Every check of validate's flags that needs no torch, before anything is launched: ranks,
    the model's shape, the report folder. ConfigError naming the flag."""
    resolve_layout_flags(args)
    if args.node_rank >= args.nnodes:
        raise ConfigError("--node-rank", f"{args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes {args.nnodes})")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--rdzv-endpoint", "multi-node runs (--nnodes > 1) need --rdzv-endpoint host:port")
    model_parallel = args.tp * args.cp * args.pp
    if args.nproc_per_node is not None and args.dp is None:
        world = args.nproc_per_node * args.nnodes
        if world % model_parallel:
            raise ConfigError("--nproc-per-node", f"{args.nproc_per_node} x --nnodes {args.nnodes} = {world} ranks "
                              f"is not divisible by --tp {args.tp} x --cp {args.cp} x --pp {args.pp}",
                              accepted=f"a multiple of {model_parallel} ranks")
    if args.nproc_per_node is not None and args.dp is not None:
        world = model_parallel * args.dp
        if world != args.nproc_per_node * args.nnodes:
            raise ConfigError("--nproc-per-node", f"{args.nproc_per_node} x --nnodes {args.nnodes} ranks, but --tp "
                              f"{args.tp} x --cp {args.cp} x --pp {args.pp} x --dp {args.dp} = {world}",
                              accepted=f"{world} ranks in all")
    if model_parallel * (args.dp or 1) > MAX_RANKS:
        raise ConfigError("--tp/--cp/--pp/--dp", f"{model_parallel * (args.dp or 1)} ranks in all, more than this "
                          f"harness launches", accepted=f"at most {MAX_RANKS} ranks")
    if args.hidden % args.heads:
        raise ConfigError("--hidden", f"{args.hidden} is not divisible by --heads {args.heads}")
    if args.heads % args.tp:
        raise ConfigError("--tp", f"--heads {args.heads} is not divisible by --tp {args.tp}")
    kv = args.kv_heads or args.heads
    if args.heads % kv:
        raise ConfigError("--kv-heads", f"--heads {args.heads} is not a multiple of --kv-heads {kv}",
                          accepted=", ".join(str(d) for d in range(1, args.heads + 1) if args.heads % d == 0))
    if kv % args.tp:
        raise ConfigError("--kv-heads", f"{kv} key/value heads do not divide over --tp {args.tp}",
                          accepted=f"a multiple of {args.tp}")
    if args.rotary and (args.hidden // args.heads) % 2:
        raise ConfigError("--rotary", f"rotary positions need an even head size, got --hidden {args.hidden} / "
                          f"--heads {args.heads} = {args.hidden // args.heads}")
    if args.cp > 1:
        if args.seq_len % (2 * args.cp):
            raise ConfigError("--cp", f"--seq-len {args.seq_len} is not divisible by 2 x --cp {args.cp} (ring "
                              f"attention balances 2*cp causal chunks)",
                              accepted=", ".join(str(c) for c in range(1, 65) if args.seq_len % (2 * c) == 0))
        if args.sequence_parallel and (args.seq_len // args.cp) % args.tp:
            raise ConfigError("--sequence-parallel", f"--seq-len {args.seq_len} / --cp {args.cp} is not divisible "
                              f"by --tp {args.tp}")
    check_expert_args(args)
    check_op_sac_args(args)
    if args.virtual_stages > 1 and args.pp == 1:
        raise ConfigError("--virtual-stages", "interleaving needs --pp > 1")
    if args.offload not in HARNESS_OFFLOAD:
        raise ConfigError("--offload", f"{args.offload}: the harness offloads the optimizer to host memory only",
                          accepted=", ".join(HARNESS_OFFLOAD))
    if args.offload != "none" and args.zero not in (1, 2):
        raise ConfigError("--offload", f"{args.offload} with --zero {args.zero}: the harness offloads a ZeRO-sharded "
                          f"optimizer", accepted="--zero 1 or 2 with --offload cpu")
    if args.zero == 3 and args.pp > 1:
        raise ConfigError("--zero", "ZeRO-3 with --pp > 1 is not supported by this harness", accepted="0-2 with pp > 1")
    if args.global_batch and args.global_batch % (args.micro_batch * (args.dp or 1)):
        raise ConfigError("--global-batch", f"{args.global_batch} is not divisible by --micro-batch "
                          f"{args.micro_batch} x dp {args.dp or 1}")
    check_out_path("--out", args.out, folder=True)
    for flag, path in (("--predicted", args.predicted), ("--db", args.db)):
        if path is not None:
            check_in_path(flag, path)


def check_op_sac_args(args) -> None:
    """op-level SAC against the model and layout (validation.model.check_recompute's rules, kept here so
    they run before torch is imported): it needs the fused attention, dense MLPs and cp 1."""
    if args.recompute != "op-sac":
        return
    if args.attention != "sdpa":
        raise ConfigError("--attention", f"{args.attention}: --recompute op-sac keeps the fused attention kernel's "
                          "output, which the math attention has not", accepted="sdpa (or leave --attention out)")
    if args.experts:
        raise ConfigError("--recompute", "the harness runs op-sac on dense MLPs only",
                          accepted="none, selective or full with --experts")
    if args.cp > 1:
        raise ConfigError("--recompute", "the harness runs op-sac without context parallelism (--cp > 1)",
                          accepted="none, selective or full with --cp > 1")


def check_expert_args(args) -> None:
    """The mixture-of-experts flags against the layout (validation.apply_ep.check_ep's rules, kept here so
    they run before torch is imported): --ep needs --experts, divides the experts and dp; under --tp > 1
    experts need --sequence-parallel and run whole on every tp rank (--etp 1) or split over it (--etp =
    --tp, with --ep 1); under ep, below ZeRO-3."""
    experts, ep = args.experts, args.ep
    if ep > 1 and not experts:
        raise ConfigError("--ep", f"{ep} needs a mixture-of-experts model", accepted=f"--experts E with E a multiple of {ep}")
    if experts and args.top_k > experts:
        raise ConfigError("--top-k", f"{args.top_k} exceeds --experts {experts}", accepted=f"1..{experts}")
    if experts and experts % ep:
        raise ConfigError("--ep", f"--experts {experts} is not divisible by --ep {ep}",
                          accepted=", ".join(str(d) for d in range(1, experts + 1) if experts % d == 0))
    if ep > 1:
        dp = args.dp   # as _plan_and_launch resolves it
        if dp is None:
            dp = 1 if args.nproc_per_node is None else args.nproc_per_node * args.nnodes // (args.tp * args.cp * args.pp)
        if dp % ep:
            raise ConfigError("--ep", f"{ep} does not divide dp {dp} (expert parallelism is carved from data "
                              f"parallelism)", accepted=", ".join(str(d) for d in range(1, dp + 1) if dp % d == 0)
                              + " (or give --dp, a multiple of --ep)")
    if args.etp > 1 and not experts:
        raise ConfigError("--etp", f"{args.etp} needs a mixture-of-experts model", accepted="--experts E, or --etp 1")
    if args.etp not in (1, args.tp):
        raise ConfigError("--etp", f"{args.etp}: the harness splits an expert over the whole tp group or not at all "
                          f"(--tp {args.tp})", accepted=f"1, {args.tp}" if args.tp > 1 else "1")
    if args.etp > 1 and ep > 1:
        raise ConfigError("--etp", f"{args.etp} with --ep {ep}: the harness runs expert tensor parallelism with ep 1 "
                          "only", accepted="--etp 1 with --ep > 1, or --ep 1 with --etp = --tp")
    if args.etp > 1 and args.expert_ffn and args.expert_ffn % args.etp:
        raise ConfigError("--expert-ffn", f"{args.expert_ffn} is not divisible by --etp {args.etp} (each expert is "
                          "split over the tp group)", accepted=f"a multiple of {args.etp}")
    if experts and args.tp > 1 and not args.sequence_parallel:
        raise ConfigError("--sequence-parallel", f"mixture-of-experts layers with --tp {args.tp} run under sequence "
                          "parallelism (Megatron-LM requires it)", accepted="--sequence-parallel with --tp > 1 and --experts")
    if ep > 1 and args.zero == 3:
        raise ConfigError("--zero", "ZeRO-3 with --ep > 1 is not run by the harness (FSDP2 would shard experts that "
                          "differ across the data-parallel group)", accepted="0-2 with --ep > 1")


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
    elif args.dp is None:   # check_validate_args refused a world that tp·cp·pp does not divide
        dp = args.nproc_per_node * nnodes // (args.tp * args.cp * args.pp)
    else:
        dp = args.dp
    plan = RunPlan(tp=args.tp, pp=args.pp, dp=dp, cp=args.cp, ep=args.ep, etp=args.etp, zero=args.zero,
                   micro_batch=args.micro_batch,
                   global_batch=args.global_batch or 0, recompute=args.recompute,
                   sequence_parallel=args.sequence_parallel, virtual_stages=args.virtual_stages,
                   offload=args.offload == "cpu",
                   steps=args.steps, warmup=args.warmup)
    nproc = args.nproc_per_node
    if nproc is None:
        if plan.world_size % nnodes:
            raise ConfigError("--nnodes", f"world {plan.world_size} not divisible by {nnodes}")
        nproc = plan.world_size // nnodes
    opts = LaunchOptions(nproc_per_node=nproc, nnodes=nnodes, node_rank=args.node_rank,
                         rdzv_endpoint=args.rdzv_endpoint, timeout_s=args.timeout)
    return plan, opts


def _model_config(args):
    """The GPTConfig the model flags describe (a plan file's architecture where flags leave it)."""
    from paraplan.validation.model import GPTConfig   # torch: only when a run is launched
    resolve_layout_flags(args)
    return GPTConfig(vocab_size=args.vocab, seq_len=args.seq_len, hidden=args.hidden,
                     heads=args.heads, layers=args.layers, seed=args.seed,
                     attention=args.attention, experts=args.experts, top_k=args.top_k,
                     expert_ffn=args.expert_ffn or 0, activation=args.activation, norm=args.norm,
                     bias=args.bias, kv_heads=args.kv_heads or 0, rotary=args.rotary, qk_norm=args.qk_norm)


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launch_with_progress(spec: dict, run_dir: str, opts, plan) -> list[dict]:
    """launch_worker with a bar over the steps of the slowest local rank (progress records)."""
    from paraplan.validation.launch import launch_worker, slowest_progress
    ranks = range(opts.node_rank * opts.nproc_per_node, (opts.node_rank + 1) * opts.nproc_per_node)
    total = plan.warmup + plan.steps + (1 if plan.profile_ops else 0)
    with progress.bar(desc=f"validate: {opts.nproc_per_node} ranks", total=total, unit="step") as b:
        def poll():
            done = slowest_progress(run_dir, ranks)
            if done > b.n:
                b.update(done - b.n)
        return launch_worker(spec, run_dir, opts, on_poll=poll,
                             log_path=os.path.join(os.path.dirname(run_dir), "torchrun.log"))


def plan_label(plan) -> str:
    """Short name of a harness plan: tp2, dp2 zero1, pp2 vpp2, ..."""
    parts = [f"{k}{v}" for k, v in (("tp", plan.tp), ("cp", plan.cp), ("pp", plan.pp), ("dp", plan.dp),
                                    ("ep", getattr(plan, "ep", 1)), ("etp", getattr(plan, "etp", 1))) if v > 1]
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.virtual_stages > 1:
        parts.append(f"vpp{plan.virtual_stages}")
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.recompute != "none":
        parts.append(f"recompute {plan.recompute}")
    if plan.offload:
        parts.append("optimizer offload")
    return " ".join(parts) or "single process"


def run_validate(args) -> int:
    """Launch the plan, check it against a single-process run, write the report. 0 = match."""
    import shutil
    import time

    from paraplan.validation.reference import (SPREAD_FACTOR, compare_to_reference, load_parallel_grads,
                                               reference_run, reference_spread)
    for note in resolve_layout_flags(args):
        print(f"paraplan: note: {note}", file=sys.stderr)
    check_validate_args(args)
    cfg = _model_config(args)
    plan, opts = _plan_and_launch(args)
    predicted, estimate_dict = None, None
    if args.predicted:
        try:
            with open(args.predicted) as f:
                predicted = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError("predicted", f"cannot read {args.predicted}: {e}") from e
    else:
        predicted, est = predict_run(cfg, plan, args.db, allow_profiling=not args.no_profile,
                                     moe_imbalance=args.moe_imbalance)
        estimate_dict = est.to_dict()
    check_ref = not args.no_reference and opts.nnodes == 1
    spec = {"model": asdict(cfg), "plan": asdict(plan), "dump_grads": check_ref}
    run_dir = _run_dir(args.out)
    try:
        t0 = time.perf_counter()
        results = _launch_with_progress(spec, run_dir, opts, plan)
        progress.summary(f"validate: {plan_label(plan)} on {opts.world_size} ranks, "
                         f"{plan.warmup} warm-up + {plan.steps} timed steps in {time.perf_counter() - t0:.1f} s")
        ref_check = None
        if check_ref:
            with progress.step("validate: single-process reference run"):
                ref = reference_run(cfg, plan)
            with progress.step("validate: the reference again, nudged and re-split (its own spread)"):
                spread = reference_spread(cfg, plan, ref)
            ref_check = compare_to_reference(results, ref, load_parallel_grads(run_dir), spread)
            ref_check.pop("parallel_losses", None)
        report = build_report(asdict(plan), results, args.out, predicted=predicted,
                              reference_check=ref_check, model=asdict(cfg),
                              extra={"machine": machine_fingerprint(), "profile_db": args.db,
                                     "estimate": estimate_dict})
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
              f"(predicted with --moe-imbalance {args.moe_imbalance:g})")
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
        return f"{plan_label(plan)}: step time measured {1e3 * m:.1f} ms{noise} (no prediction)"
    return (f"{plan_label(plan)}: step time measured {1e3 * m:.1f} ms{noise}, predicted "
            f"{1e3 * p:.1f} ms, error {100 * (p - m) / m:+.1f} %")


def run_profile(args) -> int:
    """Run the micro-benchmarks and store them; prints a short summary (every row with --rows)."""
    from paraplan.profiles.cluster import noisy_profile_warning
    from paraplan.profiles.store import profile_noise
    from paraplan.validation.profile import ProfileOptions, run_profile as _run, summarize   # torch
    check_profile_args(args)
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
