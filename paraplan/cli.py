"""paraplan command line: parse, load, call, print. Errors a user can fix print one line, exit 2."""
from __future__ import annotations

import argparse
import json
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
    from paraplan.planner.plan import DTYPES, OFFLOAD, OPTIMIZERS, RECOMPUTE, SCHEDULES
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
    from paraplan.planner.plan import Plan
    base: dict = {}
    if getattr(args, "plan", None):
        from paraplan.planner.planfile import read_plan_file
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
    from paraplan.hardware.catalog import load_cluster
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


def cmd_estimate(args) -> int:
    from paraplan.costmodels.estimate import estimate
    from paraplan.reports.text import render_estimate
    from paraplan.workloads.transformer import TrainingJob
    if getattr(args, "plan", None) and not (args.model and args.cluster):
        from paraplan.planner.planfile import read_plan_file
        scenario = read_plan_file(args.plan)["scenario"]
        for key in ("model", "cluster", "gpus", "seq_len", "global_batch"):
            if getattr(args, key, None) is None:
                setattr(args, key, scenario[key])
    if not args.model or not args.cluster:
        raise ConfigError("--model/--cluster", "both are required (or --plan FILE that names them)")
    model, cluster, seq_len = scenario_from_args(args)
    plan = plan_from_args(args)
    dp = plan.dp or max(1, cluster.num_gpus // plan.model_parallel)
    gbs = args.global_batch or dp * plan.micro_batch
    topology = topology_from_args(args)
    if topology:
        from paraplan.planner.search import with_topology
        cluster = with_topology(cluster, plan.with_dp_for(cluster.num_gpus), topology)
    e = estimate(model, TrainingJob(seq_len, gbs, moe_imbalance=args.moe_imbalance), cluster, plan)
    if args.format == "json":
        print(json.dumps(e.to_dict(), indent=2))
    else:
        print(render_estimate(e))
    return 0


def cmd_list(args) -> int:
    from paraplan.hardware.catalog import load_part, preset_names
    from paraplan.workloads.presets import load_model, model_names
    what = args.what
    if what in ("hardware", "accelerators"):
        print("accelerators")
        for n in preset_names("accelerators"):
            a = load_part("accelerators", n)
            peak = a.peak_flops.get("bf16") or a.peak_flops.get("fp16")
            print(f"  {n:12s} {a.model:28s} {a.memory_bytes / 2**30:6.0f} GiB  {a.memory_bandwidth_bytes_per_s / 1e12:5.2f} TB/s"
                  f"  {peak / 1e12:7.1f} TFLOP/s 16-bit")
    if what in ("hardware", "systems"):
        print("systems (use as --cluster NAME --gpus N)")
        for n in preset_names("systems"):
            s = load_part("systems", n)
            print(f"  {n:14s} {s.gpus_per_node:2d} x {s.accelerator.name:9s} intra {s.intra_node.bandwidth_bytes_per_s / 1e9:5.0f} GB/s"
                  f"  inter {s.inter_node.bandwidth_bytes_per_s / 1e9:6.2f} GB/s/GPU  PCIe{s.pcie_gen}"
                  f"  host {s.host_cpu_sockets} x {s.host_cpu.name}, {s.host_memory_bytes / 2**30:.0f} GiB")
    if what in ("hardware", "cpus"):
        print("CPUs")
        for n in preset_names("cpus"):
            c = load_part("cpus", n)
            caches = " ".join(f"L{x.level} {x.size_bytes // 1024} KiB/{x.shared_by_cores}c" for x in c.caches)
            print(f"  {n:15s} {c.cores:3d} cores {c.frequency_hz / 1e9:.2f} GHz SIMD {c.simd_bits:3d}b  {caches}"
                  f"  DRAM {c.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    if what in ("hardware", "nvme"):
        print("NVMe drives")
        for n in preset_names("nvme"):
            d = load_part("nvme", n)
            print(f"  {n:15s} read {d.read_bytes_per_s / 1e9:.1f} GB/s write {d.write_bytes_per_s / 1e9:.1f} GB/s"
                  f"  {d.capacity_bytes / 1e12:.2f} TB")
    if what == "models":
        print("models (use as --model NAME)")
        for n in model_names():
            print("  " + load_model(n).describe().replace(f"{n}:", f"{n:12s}", 1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paraplan", description="Simulate and plan parallel training layouts.")
    sub = ap.add_subparsers(dest="command", required=True)

    est = sub.add_parser("estimate", help="predict step time, throughput and memory of one plan")
    add_scenario_args(est, require=False)
    add_plan_args(est)
    est.add_argument("--format", choices=("table", "json"), default="table")
    est.set_defaults(func=cmd_estimate)

    ls = sub.add_parser("list", help="show presets")
    ls.add_argument("what", choices=("hardware", "models", "accelerators", "systems", "cpus", "nvme"))
    ls.set_defaults(func=cmd_list)

    for register in _optional_commands():
        register(sub)
    return ap


def _optional_commands():
    """Subcommands that live in their own modules (planner, reports, validation, CF)."""
    out = []
    for module, attr in (("paraplan.planner.cli", "register"), ("paraplan.planner.export_cli", "register"),
                         ("paraplan.reports.cli", "register"),
                         ("paraplan.validation.cli", "register"), ("paraplan.cf_cli", "register")):
        try:
            mod = __import__(module, fromlist=[attr])
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("paraplan"):
                continue
            raise
        out.append(getattr(mod, attr))
    return out


def run_command(func, args) -> int:
    """Run a parsed command: a ParaplanError becomes one line on stderr and exit code 2."""
    try:
        return func(args)
    except ParaplanError as e:
        print(f"paraplan: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
