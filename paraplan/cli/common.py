"""Flags and helpers every command shares: scenario and plan flags, turning them into objects, and
running a command so that a user's error prints one line and exits 2."""
from __future__ import annotations

import argparse
import sys

from paraplan.errors import ConfigError, ParaplanError


def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return v
    return parse


def add_scenario_args(ap: argparse.ArgumentParser, *, require: bool = True) -> None:
    ap.add_argument("--model", required=require, help="preset name, model YAML/JSON file, or a Hugging Face config.json")
    ap.add_argument("--cluster", required=require, help="system preset (e.g. dgx-a100-80g), a cluster YAML file, "
                    "'local' (this machine's measured profile) or 'profile:NAME' (fingerprint id or hostname)")
    ap.add_argument("--db", default=None, help="profile database for --cluster local/profile:NAME "
                    "(default $PARAPLAN_PROFILE_DB or ~/.cache/paraplan/profiles.sqlite)")
    ap.add_argument("--gpus", type=_positive_int("--gpus"), help="GPU count (default: one node, or the file's)")
    ap.add_argument("--seq-len", type=_positive_int("--seq-len"), default=None, help="tokens per sequence (default 2048)")
    ap.add_argument("--global-batch", type=_positive_int("--global-batch"), default=None,
                    help="sequences per optimizer step (default: 1 per data-parallel rank x micro-batch)")
    ap.add_argument("--moe-imbalance", type=float, default=1.0,
                    help="busiest expert's tokens over the balanced share (1.0 = balanced)")
    ap.add_argument("--network", choices=("rail", "flat"), default=None,
                    help="place groups on a networkx model of the fabric: rail-optimized or flat leaves")
    ap.add_argument("--oversubscription", type=float, default=None,
                    help="leaf-to-spine oversubscription of the fabric (e.g. 2 for 2:1); implies --network rail")


def add_plan_args(ap: argparse.ArgumentParser) -> None:
    from paraplan.plan import DTYPES, OFFLOAD, OPTIMIZERS, RECOMPUTE, SCHEDULES
    g = ap.add_argument_group("plan")
    g.add_argument("--plan", help="a plan file written by `paraplan plan --out` (flags below override it)")
    for name in ("tp", "pp", "cp", "vpp", "micro-batch", "ep", "etp"):
        g.add_argument(f"--{name}", type=_positive_int(f"--{name}"))
    g.add_argument("--sp-mode", choices=("megatron", "ulysses", "ring"),
                   help="sequence parallelism: megatron (with tp), or ulysses / ring over --cp ranks")
    g.add_argument("--optimizer", choices=OPTIMIZERS)
    g.add_argument("--delayed-update", action="store_true", default=None,
                   help="ZeRO-Offload's one-step delayed parameter update (with --offload cpu)")
    g.add_argument("--dp", type=_positive_int("--dp"), help="default: what the GPU count leaves")
    g.add_argument("--sp", action="store_true", default=None, help="Megatron sequence parallelism (needs tp > 1)")
    g.add_argument("--schedule", choices=SCHEDULES)
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    g.add_argument("--recompute", choices=RECOMPUTE)
    g.add_argument("--offload", choices=OFFLOAD)
    g.add_argument("--offload-params", action="store_true", default=None)
    g.add_argument("--dtype", choices=DTYPES)
    g.add_argument("--no-flash-attention", dest="flash_attention", action="store_false", default=None)
    g.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false", default=None)
    g.add_argument("--no-grad-accumulation-fusion", dest="grad_accumulation_fusion", action="store_false",
                   default=None, help="every micro-batch after the first adds its gradients with separate "
                   "kernels (plain PyTorch, DDP no_sync, FSDP); default: fused into the wgrad GEMM (Megatron-LM)")


PLAN_FLAGS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "sp", "schedule", "zero", "recompute", "offload",
              "offload_params", "dtype", "flash_attention", "overlap_grad_reduce", "ep", "etp", "optimizer",
              "delayed_update", "grad_accumulation_fusion")


def plan_from_args(args):
    from paraplan.plan import Plan
    base: dict = {}
    if getattr(args, "plan", None):
        from paraplan.planfile import read_plan_file
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
    elif mode in ("ulysses", "ring"):
        base["cp_mode"] = mode
    return Plan.from_dict(base, source=getattr(args, "plan", None) or "flags")


def scenario_from_args(args):
    from paraplan.scenario import load_cluster
    from paraplan.workloads.presets import load_model
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus, db=getattr(args, "db", None))
    return model, cluster, args.seq_len or 2048


def topology_from_args(args) -> dict | None:
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
