"""Flags and helpers every command shares: scenario and plan flags, turning them into objects, and
running a command so that a user's error prints one line and exits 2.

The plan flags are generated from the fields of :class:`paraplan.plan.Plan`, so a field and its
flag cannot drift apart, and each flag means the same on every command that has it.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, Field, fields

from paraplan.errors import ConfigError, ParaplanError
from paraplan.plan import (CP_MODES, DTYPES, ENGINES, OFFLOAD, OPTIMIZERS, RECOMPUTE, SCHEDULES, STAGE_LAYER_FIELDS,
                           Plan)
from paraplan.planfile import read_plan_file
from paraplan.scenario import Scenario, load_scenario


def positive_int(name: str):
    """An argparse type that accepts integers >= 1 and names the flag in its error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return v
    return parse


def non_negative_int(name: str):
    """An argparse type that accepts integers >= 0 (0: automatic) and names the flag in its error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = -1
        if v < 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer or 0 (automatic), got {text!r}")
        return v
    return parse


def add_scenario_args(ap: argparse.ArgumentParser, *, require: bool = True) -> None:
    """--model, --cluster and what else pins the model, the job and the cluster."""
    ap.add_argument("--model", required=require, help="preset name, model YAML/JSON file, or a Hugging Face config.json")
    ap.add_argument("--cluster", required=require, help="system preset (e.g. dgx-a100-80g), a cluster YAML file, "
                    "'local' (this machine's measured profile) or 'profile:NAME' (fingerprint id or hostname)")
    ap.add_argument("--db", default=None, help="profile database for --cluster local/profile:NAME "
                    "(default $PARAPLAN_PROFILE_DB or ~/.cache/paraplan/profiles.sqlite)")
    ap.add_argument("--gpus", type=positive_int("--gpus"), help="GPU count (default: one node, or the file's)")
    ap.add_argument("--seq-len", type=positive_int("--seq-len"), default=None, help="tokens per sequence (default 2048)")
    ap.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                    help="sequences per optimizer step (default: 1 per data-parallel rank x micro-batch)")
    ap.add_argument("--moe-imbalance", type=float, default=1.0,
                    help="busiest expert's tokens over the balanced share (1.0 = balanced)")
    ap.add_argument("--network", choices=("rail", "flat"), default=None,
                    help="place groups on a networkx model of the fabric: rail-optimized or flat leaves")
    ap.add_argument("--oversubscription", type=float, default=None,
                    help="leaf-to-spine oversubscription of the fabric (e.g. 2 for 2:1); implies --network rail")


# Help text of the plan flags, keyed by Plan field name (fields not listed get no help line).
PLAN_FLAG_HELP = {
    "first_stage_layers": "transformer layers on the first pipeline stage (Megatron-LM "
                          "--decoder-first-pipeline-num-layers); default 0: automatic split",
    "last_stage_layers": "transformer layers on the last pipeline stage (Megatron-LM "
                         "--decoder-last-pipeline-num-layers); default 0: automatic split",
    "dp": "default: what the GPU count leaves",
    "sp": "Megatron sequence parallelism (needs tp > 1)",
    "delayed_update": "ZeRO-Offload's one-step delayed parameter update (with --offload cpu)",
    "grad_accumulation_fusion": "every micro-batch after the first adds its gradients with separate kernels "
                                "(plain PyTorch, DDP no_sync, FSDP); default: fused into the wgrad GEMM "
                                "(Megatron-LM). On plan and whatif without a fixed plan: search unfused plans",
    "engine": "the engine that runs the plan: its model-state layout, buffers and the layouts it offers "
              "(generic: the ZeRO paper's accounting, no restrictions)",
    "dtype": "training precision: bf16, fp16, fp32 (CPU validation), or fp8 linear layers with their scaling "
             "recipe: fp8 (per-tensor current scaling), fp8-delayed, fp8-rowwise, fp8-blockwise, mxfp8 "
             "(Blackwell). On plan and whatif without a fixed plan: search plans in that precision",
    "recompute": "none; selective (Megatron: attention core); full (layer inputs only); op-sac (torchtitan: "
                 "every other matmul output and the attention output)",
    "tp_comm_overlap": "overlap tensor-parallel all-gather/reduce-scatter with the neighbouring GEMMs "
                       "(Megatron-LM --tp-comm-overlap, torchtitan async TP; needs --sp)",
    "fused_elementwise": "eager PyTorch norms and SwiGLU (fp32 upcast, several kernels, more saved "
                         "activations) instead of fused kernels (Megatron-LM with Transformer Engine or Apex)",
}
# Accepted values of the categorical plan fields (the flag's argparse choices).
PLAN_FLAG_CHOICES = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "offload": OFFLOAD, "dtype": DTYPES,
                     "optimizer": OPTIMIZERS, "zero": (0, 1, 2, 3), "engine": ENGINES}
# Plan fields without a flag of their own, and the flag that sets them instead.
PLAN_FIELDS_WITHOUT_FLAG = {"cp_mode": "--sp-mode"}
# Plan fields whose flag, given without any other plan flag, constrains a search (plan, whatif)
# instead of fixing a whole plan to re-estimate.
SEARCH_CONSTRAINT_FLAGS = ("grad_accumulation_fusion", "engine", "dtype")


def _plan_fields() -> list[Field]:
    """The Plan fields that have a flag of their own, in declaration order."""
    return [f for f in fields(Plan) if f.name not in PLAN_FIELDS_WITHOUT_FLAG]


PLAN_FLAGS = tuple(f.name for f in _plan_fields())


def plan_flag_kwargs(f: Field) -> tuple[str, dict]:
    """The option string and add_argument keywords of one Plan field's flag.

    Every flag defaults to None ("not given"), so a plan file or the Plan default fills it.
    """
    default = f.default if f.default is not MISSING else None
    flag = "--" + f.name.replace("_", "-")
    kw: dict = {"dest": f.name, "default": None}
    if f.name in PLAN_FLAG_HELP:
        kw["help"] = PLAN_FLAG_HELP[f.name]
    if isinstance(default, bool):
        if default:
            return "--no-" + flag[2:], {**kw, "action": "store_false"}
        return flag, {**kw, "action": "store_true"}
    if f.name in PLAN_FLAG_CHOICES:
        choices = PLAN_FLAG_CHOICES[f.name]
        return flag, {**kw, "choices": choices, **({} if isinstance(choices[0], str) else {"type": int})}
    if isinstance(default, int):
        return flag, {**kw, "type": (non_negative_int if f.name in STAGE_LAYER_FIELDS else positive_int)(flag)}
    raise TypeError(f"Plan.{f.name}: no rule for a flag of type {f.type}")


def add_plan_args(ap: argparse.ArgumentParser) -> None:
    """``--plan FILE``, one flag per Plan field, and the ``--sp-mode`` shorthand."""
    g = ap.add_argument_group("plan")
    g.add_argument("--plan", help="a plan file written by `paraplan plan --out` (flags below override it)")
    for f in _plan_fields():
        flag, kw = plan_flag_kwargs(f)
        g.add_argument(flag, **kw)
    g.add_argument("--sp-mode", choices=("megatron", *CP_MODES),
                   help="sequence parallelism: megatron (with tp), or ulysses / ring over --cp ranks")


def add_search_args(ap: argparse.ArgumentParser, *, max_memory_fraction: float | None) -> None:
    """The search options ``plan`` and ``whatif`` share: --fix, --no-offload, --max-memory-fraction."""
    ap.add_argument("--fix", action="append", metavar="AXIS=VALUE", help="pin an axis or mode of the search "
                    "(at every point, for whatif), by name: any plan field, e.g. tp=8, zero=1, "
                    "schedule=interleaved, recompute=selective, optimizer=adam, cp_mode=ulysses, dtype=bf16, "
                    "flash_attention=false")
    ap.add_argument("--no-offload", action="store_true", help="do not consider CPU/NVMe offload")
    ap.add_argument("--max-memory-fraction", type=float, default=max_memory_fraction,
                    help="use at most this share of each GPU's memory (default "
                         f"{'1.0' if max_memory_fraction is None else max_memory_fraction})")


def add_plan_flag(ap, name: str) -> None:
    """Just one Plan field's flag, defined as add_plan_args defines it (same dest, same meaning)."""
    flag, kw = plan_flag_kwargs(next(f for f in _plan_fields() if f.name == name))
    ap.add_argument(flag, **kw)


def plan_flags_given(args, *, search_constraints: bool = True) -> bool:
    """Whether ``--plan`` or any plan flag was given; ``search_constraints=False`` leaves out the
    flags that also make sense as a constraint on a search (SEARCH_CONSTRAINT_FLAGS)."""
    names = [k for k in PLAN_FLAGS if search_constraints or k not in SEARCH_CONSTRAINT_FLAGS]
    return bool(getattr(args, "plan", None)) or getattr(args, "sp_mode", None) is not None or any(
        getattr(args, k, None) is not None for k in names)


def plan_from_args(args) -> Plan:
    """The plan the flags describe: ``--plan FILE`` if given, each given flag overriding it."""
    base: dict = {}
    if getattr(args, "plan", None):
        base = read_plan_file(args.plan)["plan"]
    for k in PLAN_FLAGS:
        v = getattr(args, k, None)
        if v is not None:
            base[k] = v
    if base.get("vpp", 1) > 1 and "schedule" not in base:
        base["schedule"] = "interleaved"
    mode = getattr(args, "sp_mode", None)
    if mode == "megatron":
        base["sp"] = True
    elif mode in CP_MODES:
        base["cp_mode"] = mode
    return Plan.from_dict(base, source=getattr(args, "plan", None) or "flags")


def scenario_from_args(args) -> Scenario:
    """The scenario of --model, --cluster, --gpus, --db, --seq-len, --global-batch, --moe-imbalance."""
    return load_scenario(args.model, args.cluster, gpus=args.gpus, seq_len=args.seq_len,
                         global_batch=args.global_batch, moe_imbalance=args.moe_imbalance,
                         db=getattr(args, "db", None))


def topology_from_args(args) -> dict | None:
    """The --network/--oversubscription fabric model, or None when neither is given."""
    if args.network is None and args.oversubscription is None:
        return None
    if args.oversubscription is not None and args.oversubscription < 1:
        raise ConfigError("--oversubscription", f"must be >= 1 (1 = non-blocking), got {args.oversubscription}")
    return {"rail_optimized": args.network != "flat", "oversubscription": args.oversubscription}


def run_command(func, args) -> int:
    """Run a parsed command: a ParaplanError becomes one line on stderr and exit code 2."""
    try:
        return func(args)
    except ParaplanError as e:
        print(f"paraplan: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
