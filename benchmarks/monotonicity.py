"""Does the estimator move the right way? ``python benchmarks/monotonicity.py [--sample N]``

A planner exploits its cost model's kinks as eagerly as its errors: if a faster GPU could make some
plan slower, or a policy that keeps less could hold more, the search would find exactly those plans.
For README-sized scenarios this scores a random sample of the planner's legal candidates
(paraplan.planner.space.compose, its engine switches searched; ``--without-engine-switches``: off) twice, once as they are and once with one thing changed that
should never hurt, and prints how many got worse and by how much at most:

* hardware: twice the inter-node, intra-node, HBM, host-link (PCIe), NVMe or host-memory bandwidth,
  twice the NICs per node, twice the peak FLOP rate (step time must not grow), twice the HBM capacity
  (step time and memory must not change);
* plan switches that only remove work or hide it: gradient-reduction overlap, fused elementwise
  kernels, fused gradient accumulation, TP communication overlap (tp > 1 with sp), expert all-to-all
  overlap (ep > 1), Megatron's fp8 parameters (megatron in fp8 at ZeRO >= 1; neither step time nor
  memory may grow), no recomputation (step time must not grow);
* memory: full recomputation (peak GPU memory must not grow), no recomputation and no offload (it
  must not shrink);
* a twice larger global batch on the same layout (tokens/s must not fall; judged where gradient
  accumulation is fused: unfused, each extra micro-batch adds its gradients, a real cost).

The scenarios cover the generic engine and each named one (Megatron-LM MoE in fp8, torchtitan in fp8
and bf16, DeepSpeed, Scaling), whose code paths differ.

"worse" counts candidates that changed the wrong way by more than 1e-9 relative.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import step_terms
from paraplan.plan import Engine, Offload, Recompute, is_fp8
from paraplan.planner.space import SpaceOptions, compose
from paraplan.scenario import load_scenario
from paraplan.workloads.transformer import TrainingJob

# (model, system, GPUs, sequence, global batch, engine, dtype or None for the search's default)
SCENARIOS = (("llama3-70b", "dgx-h100", 64, 8192, 512, "generic", None),
             ("gpt3-175b", "dgx-a100-80g", 256, 2048, 1536, "generic", None),
             ("mixtral-8x7b", "dgx-h100", 32, 4096, 256, "generic", None),
             ("llama3-8b", "dgx-a100-80g", 16, 4096, 256, "generic", None),
             ("mixtral-8x7b", "dgx-h100", 32, 4096, 256, "megatron", "fp8"),
             ("llama3-70b", "dgx-h100", 64, 8192, 512, "torchtitan", "fp8"),
             ("llama3-8b", "grand-teton-h100", 64, 8192, 96, "torchtitan", None),
             ("gpt3-175b", "dgx-a100-80g", 256, 2048, 1536, "deepspeed", None),
             ("llama1-30b", "dgx-a100-80g", 256, 2048, 2048, "scaling", None))
TOLERANCE = 1e-9


def describe(plan) -> str:
    """The plan's degrees and the modes these checks touch, on one line."""
    offload = "" if plan.offload == "none" else f" offload {plan.offload}{' +params' if plan.offload_params else ''}"
    return (f"{plan.label()} {plan.schedule} ZeRO-{plan.zero} recompute {plan.recompute}{offload}"
            f"{'' if plan.ep == 1 else f' ep{plan.ep}'}")


def scored(model, job, cluster, batch):
    terms = step_terms(model, job, cluster, batch, curves_for(cluster))
    return np.asarray(terms.step, float), {k: np.asarray(v, float) for k, v in terms.memory.items()}


def hardware_variants(cluster) -> dict:
    acc, sysm = cluster.accelerator, cluster.system
    return {
        "inter-node bandwidth x2": cluster.with_system(inter_node=sysm.inter_node.scaled(2)),
        "intra-node bandwidth x2": cluster.with_system(intra_node=sysm.intra_node.scaled(2)),
        "peak FLOP rate x2": cluster.with_system(accelerator=replace(acc, peak_flops={k: 2 * v for k, v in acc.peak_flops.items()})),
        "HBM bandwidth x2": cluster.with_system(accelerator=replace(
            acc, memory_bandwidth_bytes_per_s=2 * acc.memory_bandwidth_bytes_per_s)),
        "HBM capacity x2": cluster.with_system(accelerator=replace(acc, memory_bytes=2 * acc.memory_bytes)),
        "host link (PCIe) bandwidth x2": cluster.with_system(
            pcie_bandwidth_bytes_per_s=2 * sysm.pcie_bandwidth_bytes_per_s,
            host_link_bandwidth_bytes_per_s=2 * sysm.host_link_bytes_per_s),
        "NVMe bandwidth x2": cluster.with_system(nvme=replace(sysm.nvme, read_bytes_per_s=2 * sysm.nvme.read_bytes_per_s,
                                                              write_bytes_per_s=2 * sysm.nvme.write_bytes_per_s)),
        "host memory bandwidth x2": cluster.with_system(host_cpu=replace(
            sysm.host_cpu, memory_bandwidth_bytes_per_s=2 * sysm.host_cpu.memory_bandwidth_bytes_per_s)),
        "NICs per node x2": cluster.with_system(nics_per_node=2 * sysm.nics_per_node),
    }


def _fp8_params_legal(batch):
    """Candidates that may run Megatron-LM's fp8 parameters: engine megatron, an fp8 dtype, ZeRO >= 1."""
    return (np.asarray(batch.engine_code) == Engine.MEGATRON) & is_fp8(batch.dtype) & (np.asarray(batch.zero) >= 1)


# (label, plan field, value, which candidates, what must not happen)
PLAN_SWITCHES = (
    ("gradient-reduction overlap on", "overlap_grad_reduce", True, None, "slower"),
    ("fused elementwise kernels on", "fused_elementwise", True, None, "slower"),
    ("fused gradient accumulation on", "grad_accumulation_fusion", True, None, "slower"),
    ("TP comm overlap on (tp > 1, sp)", "tp_comm_overlap", True, lambda b: (np.asarray(b.tp) > 1) & np.asarray(b.sp, bool), "slower"),
    ("expert all-to-all overlap on (ep > 1)", "ep_comm_overlap", True, lambda b: np.asarray(b.ep) > 1, "slower"),
    ("fp8 parameters on (megatron fp8, ZeRO >= 1): step time", "fp8_param_gather", True, _fp8_params_legal, "slower"),
    ("fp8 parameters on (megatron fp8, ZeRO >= 1): GPU memory", "fp8_param_gather", True, _fp8_params_legal,
     "more memory"),
    ("no recomputation: step time", "recompute_code", int(Recompute.NONE), None, "slower"),
    ("full recomputation: GPU memory", "recompute_code", int(Recompute.FULL), None, "more memory"),
    ("no recomputation: GPU memory", "recompute_code", int(Recompute.NONE), None, "less memory"),
    ("no offload: GPU memory", "offload_code", int(Offload.NONE), None, "less memory"),
)


def worse(kind, step, mem, step2, mem2):
    """(mask of candidates that changed the wrong way, ratio new / old of the quantity judged)."""
    if kind == "slower":
        return step2 > step * (1 + TOLERANCE), step2 / step
    if kind.startswith("more"):
        return mem2["total"] > mem["total"] * (1 + TOLERANCE), mem2["total"] / np.maximum(mem["total"], 1.0)
    return mem2["total"] < mem["total"] * (1 - TOLERANCE), mem["total"] / np.maximum(mem2["total"], 1.0)


def check_scenario(name, system, gpus, seq, global_batch, sample: int, seed: int = 0, engine: str = "generic",
                   dtype: str | None = None, engine_switches: bool = True) -> list[dict]:
    sc = load_scenario(name, system, gpus=gpus, seq_len=seq, global_batch=global_batch)
    model, job, cluster = sc.model, sc.job(), sc.cluster
    fixed = {"engine": engine, **({"dtype": dtype} if dtype else {})}
    # the space the planner searches, its engine switches (TP overlap, fp8 parameters, bf16 reduction) tried
    # off and on as it does; the switch rows below turn each on for every candidate
    candidates, _, _ = compose(model, job, cluster, SpaceOptions(fixed=fixed, engine_switches=engine_switches))
    pick = np.sort(np.random.default_rng(seed).choice(len(candidates), size=min(sample, len(candidates)), replace=False))
    batch = candidates.take(pick)
    step, mem = scored(model, job, cluster, batch)
    rows = []

    def row(change, n, bad, ratio, wrong_way):
        worst = int(np.argmax(np.where(bad, ratio, -np.inf))) if bad.any() else None
        rows.append({"scenario": f"{name} {system} x{gpus} {engine}{' ' + dtype if dtype else ''}", "change": change, "candidates": int(n),
                     "worse": int(bad.sum()), "worst_ratio": float(ratio[worst]) if worst is not None else np.nan,
                     "must_not": wrong_way,
                     "worst_plan": describe(batch.plan(worst)) if worst is not None else ""})

    for change, c2 in hardware_variants(cluster).items():
        step2, mem2 = scored(model, job, c2, batch)
        if change.startswith("HBM capacity"):
            bad = ~np.isclose(step2, step, rtol=TOLERANCE) | ~np.isclose(mem2["total"], mem["total"], rtol=TOLERANCE)
            row(change, len(step), bad, np.maximum(step2 / step, step / step2), "change time or memory")
        else:
            bad, ratio = worse("slower", step, mem, step2, mem2)
            row(change, len(step), bad, ratio, "slower")
    for change, field, value, which, kind in PLAN_SWITCHES:
        column = getattr(batch, field)
        if column is None:
            continue
        mask = np.ones(len(step), bool) if which is None else which(batch)
        step2, mem2 = scored(model, job, cluster, replace(batch, **{field: np.full_like(column, value)}))
        bad, ratio = worse(kind, step, mem, step2, mem2)
        row(change, mask.sum(), bad & mask, np.where(mask, ratio, 0.0), kind)
    bigger = TrainingJob(job.seq_len, 2 * job.global_batch)
    step2, _ = scored(model, bigger, cluster, batch)
    tokens, tokens2 = job.global_batch / step, bigger.global_batch / step2
    # without fused gradient accumulation every micro-batch after the first adds its gradients, so
    # twice the micro-batches cost a little more per token: that is real, and not judged here
    fused = np.asarray(batch.grad_accumulation_fusion, dtype=bool)
    row("global batch x2: tokens/s (fused accumulation)", fused.sum(), fused & (tokens2 < tokens * (1 - TOLERANCE)),
        np.where(fused, tokens / tokens2, 0.0), "fewer tokens/s")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=20000, help="candidates per scenario (default 20000)")
    parser.add_argument("--without-engine-switches", action="store_true",
                        help="sample the space with the engine switches off (the space before issue 64's search)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = [r for (name, system, gpus, seq, gb, engine, dtype) in SCENARIOS
            for r in check_scenario(name, system, gpus, seq, gb, sample=args.sample, engine=engine, dtype=dtype,
                                    engine_switches=not args.without_engine_switches)]
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 120)
    summary = table.groupby(["change", "must_not"], sort=False).agg(
        candidates=("candidates", "sum"), worse=("worse", "sum"), worst_ratio=("worst_ratio", "max")).reset_index()
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    offenders = table[table.worse > 0]
    if len(offenders):
        print("\nworst candidate per scenario and change:")
        print(offenders[["scenario", "change", "worse", "worst_ratio", "worst_plan"]].to_string(
            index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"\n{len(SCENARIOS)} scenarios, {args.sample} candidates each, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
