"""``estimate(model, job, cluster, plan) -> Estimate``: the one function everything calls.

Assembles the cost models for one plan; each term is computed by the module that owns its formula:
  step = compute + recompute + grad_accumulation + tp_comm + cp_comm + ep_comm + moe_host + pp_comm + pp_bubble
         + dp_comm + optimizer + offload
with compute, recompute, tp, cp, ep and the MoE host wait charged per micro-batch on the stage that sets the
pipeline's pace (pipeline.stage_pace: the last with the LM head, or with uneven stages a middle one holding
more layers: ``paraplan.plan.stage_layers``) and paid m times, the bubble from the schedule over the largest
stage (pipeline.py), the transfers on the critical path (p2p.py), exposed data-parallel/ZeRO traffic
(dataparallel.py), unfused gradient accumulation (accumulation.py), the optimizer step and offload
transfers (offload.py). Memory per GPU is the largest of the first, the largest middle and the last
pipeline stage (memory.py). Every term and the assumptions travel with the result.

The assumption lines come from the term modules too: each ``*_assumption`` sits beside the formula it
qualifies, takes the keywords of :func:`assumptions` it names and ignores the others (``**_``), and
returns its lines (none where it does not apply). PLAN_ASSUMPTIONS and ESTIMATE_ASSUMPTIONS list them in
the order an estimate prints them; a new line is a function in its term module and its place in a list.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from paraplan.costmodels import compute as C
from paraplan.costmodels import memory as M
from paraplan.costmodels.accumulation import grad_accumulation_time
from paraplan.costmodels.attention import (FUSED_ATTENTION_ASSUMPTION, attention_kernel_assumption,
                                           fused_attention_assumption, softmax_exp_assumption)
from paraplan.costmodels.comm import RANK_ORDER_ASSUMPTION, nvlink_domain_assumption, rank_order_assumption
from paraplan.costmodels.compute import (FLOP_CONVENTION, compiled_blocks_assumption, model_read_assumption,
                                        qk_norm_assumption)
from paraplan.costmodels.dataparallel import (DP_OVERLAP_ASSUMPTION, deepspeed_dp_assumption, dp_overlap_assumption,
                                              dp_step_times, expert_tp_replica_allreduce_time, fsdp_once_assumption,
                                              megatron_fsdp_assumption)
from paraplan.costmodels.efficiency import calibration_assumption, curves_for, gemm_level_assumption, with_reference_block
from paraplan.costmodels.fp8 import fp8_assumptions
from paraplan.costmodels.intervals import describe_interval, features_of
from paraplan.costmodels.kernels import Number, micro_batches
from paraplan.costmodels.mamba import ssd_kernel_assumption
from paraplan.costmodels.memory import (RUNTIME_RESERVE_ASSUMPTION, STATES_16BIT, allocator_pressure_assumption,
                                        runtime_reserve_assumption, states_assumption)
from paraplan.costmodels.moe import (ep_overlap_assumption, expert_bias_assumption, expert_wgrad_assumption,
                                     moe_dispatch_assumption, moe_host_assumption, routing_imbalance_assumption)
from paraplan.costmodels.offload import host_link_assumption, optimizer_and_offload_times, optimizer_shard
from paraplan.costmodels.p2p import pipeline_p2p_time, pipeline_transfer_assumption
from paraplan.costmodels.pipeline import (LAST, STAGE_NAMES, bubble_time, compute_busy_share,
                                          deep_pipeline_bubble_assumption, reported_bubble_fraction, stage_pace,
                                          with_stage_concurrency)
from paraplan.costmodels.tpcomm import TP_EXPOSED_ASSUMPTION, tp_overlap_assumption
from paraplan.plan import Plan, StageLayers, check_plan, compute_dtype, model_stage_layers, stage_layer_counts

# names that moved to their term modules, still imported from here outside the cost models
# (paraplan.planner.stages, paraplan.calibration.cases, paraplan.reports, benchmarks/accuracy.py)
from paraplan.costmodels.memory import ALLOCATOR_PRESSURE_HEADROOM_BYTES, churns_allocator  # noqa: F401
from paraplan.costmodels.memory import MEMORY_PRESSURE, MEMORY_TERMS, RUNTIME_RESERVED_BYTES  # noqa: F401
from paraplan.costmodels.pipeline import layers_time  # noqa: F401

SCHEMA = "paraplan.estimate/1"
TIME_TERMS = ("compute", "recompute", "grad_accumulation", "tp_comm", "cp_comm", "ep_comm", "moe_host", "pp_comm",
              "pp_bubble", "dp_comm", "optimizer", "offload")
#: the assumption lines of a plan that changes none of the defaults (an Estimate's default)
ASSUMPTIONS = (STATES_16BIT, RANK_ORDER_ASSUMPTION, TP_EXPOSED_ASSUMPTION, DP_OVERLAP_ASSUMPTION,
               RUNTIME_RESERVE_ASSUMPTION, FUSED_ATTENTION_ASSUMPTION)
#: the assumption lines that depend on the plan alone (:func:`assumptions_for`), in the order printed
PLAN_ASSUMPTIONS = (states_assumption, rank_order_assumption, tp_overlap_assumption, dp_overlap_assumption,
                    fsdp_once_assumption, runtime_reserve_assumption, fused_attention_assumption, compiled_blocks_assumption,
                    fp8_assumptions)
#: then those that read the model, job, cluster, curves or the predicted peak memory, in the order printed
ESTIMATE_ASSUMPTIONS = (model_read_assumption, calibration_assumption, gemm_level_assumption, attention_kernel_assumption,
                        qk_norm_assumption,
                        pipeline_transfer_assumption, deep_pipeline_bubble_assumption, softmax_exp_assumption, moe_dispatch_assumption,
                        routing_imbalance_assumption, moe_host_assumption, expert_wgrad_assumption, expert_bias_assumption,
                        ep_overlap_assumption,
                        nvlink_domain_assumption, megatron_fsdp_assumption, host_link_assumption,
                        deepspeed_dp_assumption, allocator_pressure_assumption, ssd_kernel_assumption)


def assumptions_for(plan) -> tuple[str, ...]:
    """The assumption lines that depend on the plan alone (PLAN_ASSUMPTIONS): its model states (fp32
    ones for fp32 training), the rank order, its own TP / DP overlap, the runtime reserve, how attention
    is priced, its engine's compiled blocks and, under fp8, the recipe's."""
    return tuple(line for say in PLAN_ASSUMPTIONS for line in say(plan=plan))


def assumptions(model, job, cluster, plan, curves, gpu_total) -> tuple[str, ...]:
    """Every assumption line of one plan's estimate, in order: :func:`assumptions_for`, then each of
    ESTIMATE_ASSUMPTIONS given these keywords (``gpu_total``: the predicted peak bytes per GPU)."""
    inputs = dict(model=model, job=job, cluster=cluster, plan=plan, curves=curves, gpu_total=gpu_total)
    return assumptions_for(plan) + tuple(line for say in ESTIMATE_ASSUMPTIONS for line in say(**inputs))


@dataclass(frozen=True)
class Estimate:
    """Predicted step time, throughput and memory of one plan, with breakdowns and assumptions."""
    model: str
    cluster: str
    num_gpus: int
    seq_len: int
    global_batch: int
    plan: Plan
    feasible: bool
    infeasible_reason: str | None
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    time_breakdown_s: Mapping[str, float]
    memory_bytes_per_gpu: Mapping[str, float]
    host_memory_bytes_per_node: float
    nvme_bytes_per_node: float
    details: Mapping[str, Any] = field(default_factory=dict)
    efficiency_curves: Mapping[str, Any] = field(default_factory=dict)
    flop_convention: str = FLOP_CONVENTION
    assumptions: tuple[str, ...] = ASSUMPTIONS
    #: 90 % prediction interval from the calibration residuals of the hardware generation
    #: (:mod:`paraplan.costmodels.intervals`); ``basis`` says where it comes from, or that there is none
    prediction_interval: Mapping[str, Any] = field(default_factory=dict)
    #: the model's parameters as read (total; active per token for a mixture of experts), for a user to
    #: check a config's parse against its model card
    model_params: int = 0
    model_active_params: int = 0

    @property
    def headroom_bytes(self) -> float:
        """GPU memory left beside the predicted peak (negative: over capacity)."""
        return self.details["gpu_memory_bytes"] - self.memory_bytes_per_gpu["total"]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "model": self.model, "model_params": self.model_params,
            "model_active_params": self.model_active_params, "cluster": self.cluster, "num_gpus": self.num_gpus,
            "seq_len": self.seq_len, "global_batch": self.global_batch, "plan": self.plan.to_dict(),
            "feasible": self.feasible, "infeasible_reason": self.infeasible_reason,
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu, "flop_convention": self.flop_convention,
            "time_breakdown_s": dict(self.time_breakdown_s), "memory_bytes_per_gpu": dict(self.memory_bytes_per_gpu),
            "host_memory_bytes_per_node": self.host_memory_bytes_per_node,
            "nvme_bytes_per_node": self.nvme_bytes_per_node, "details": dict(self.details),
            "efficiency_curves": dict(self.efficiency_curves), "assumptions": list(self.assumptions),
            "prediction_interval": dict(self.prediction_interval),
        }


@dataclass(frozen=True)
class StepTerms:
    """Every term of one plan's step, or of a batch of plans' (then each number is a numpy array
    with one entry per plan). Seconds per step, bytes per GPU, FLOPs per step."""
    time: Mapping[str, Number]          # TIME_TERMS -> seconds; they add up to ``step``
    step: Number
    memory: Mapping[str, Number]        # MEMORY_TERMS and "total" -> bytes on the peak stage's GPU
    host_per_gpu: Number                # bytes offloaded to host memory, per GPU
    nvme_per_gpu: Number                # bytes offloaded to NVMe, per GPU
    micro_batches: Number
    flops_model: Number                 # MFU's FLOPs (no recomputation)
    flops_hardware: Number              # HFU's FLOPs (with recomputation)
    dp_comm_total: Number               # data-parallel communication before overlap
    last_stage_is_peak: Number          # the last pipeline stage holds the most memory
    peak_stage: Number                  # FIRST, MIDDLE or LAST: the stage that holds the most memory
    slowest_stage: Number               # FIRST, MIDDLE or LAST: the stage that sets the pace per micro-batch
    stage_layers: StageLayers           # layers per stage (first, largest middle, last, largest)
    bubble_fraction: Number
    warmup_share: Number                # compressed optimizers: share of steps in the uncompressed warm-up
    step_warmup: Number
    step_compressed: Number
    dp_comm_warmup: Number
    dp_comm_compressed: Number
    compute_slowdown: Number = 1.0      # the expected contention slowdown charged (profiled CPUs; 1 elsewhere)


@dataclass(frozen=True)
class MemoryTerms:
    """What a plan (or a batch of plans) holds: GPU memory of the peak stage, host and NVMe under offload,
    and the parameter counts both memory and time read. Bytes per GPU; parameters per GPU."""
    memory: Mapping[str, Number]        # MEMORY_TERMS and "total" -> bytes on the peak stage's GPU
    peak_stage: Number                  # FIRST, MIDDLE or LAST
    host_per_gpu: Number
    nvme_per_gpu: Number
    stage_layers: StageLayers           # with the multi-token-prediction blocks on the last stage
    stage_params: tuple                 # (first, largest middle, last) non-expert parameters
    params: Number                      # the largest stage's
    experts: Number                     # routed-expert parameters
    shard: Number                       # parameters whose optimizer states one GPU owns
    activations_offloaded: Number


    def take(self, index, n: int) -> "MemoryTerms":
        """These terms for the plans at ``index`` of the ``n`` they were computed for (values that are the
        same for every plan, scalars, stay as they are)."""
        def pick(v):
            if isinstance(v, dict):
                return {k: pick(x) for k, x in v.items()}
            if isinstance(v, tuple):
                return type(v)(*map(pick, v)) if hasattr(v, "_fields") else tuple(map(pick, v))
            return v[index] if np.ndim(v) == 1 and np.shape(v)[0] == n else v
        return MemoryTerms(*(pick(getattr(self, f.name)) for f in fields(self)))


def memory_terms(model, job, cluster, plan) -> MemoryTerms:
    """The memory half of :func:`step_terms` (no efficiency curves, no time): what the planner checks
    first, so that it prices time only for candidates that fit."""
    sl = model_stage_layers(model, plan)          # multi-token-prediction blocks on the last stage
    first_params, middle_params, last_params = M.stage_params(model, plan)
    params = np.maximum(np.maximum(first_params, last_params), middle_params)      # the largest stage's
    experts = M.expert_params_per_gpu(model, plan)
    shard = optimizer_shard(params, experts, plan)
    acts_offloaded = M.offloaded_activation_bytes(model, job, plan)
    memory, peak = M.peak_stage_memory(model, job, plan, cluster, sl, (first_params, middle_params, last_params),
                                       experts)
    off = M.offloaded_bytes(job, plan, shard, acts_offloaded)
    return MemoryTerms(memory, peak, off["host"], off["nvme"], sl, (first_params, middle_params, last_params),
                       params, experts, shard, acts_offloaded)


def step_terms(model, job, cluster, plan, curves, mem: MemoryTerms | None = None) -> StepTerms:
    """All time and memory terms for a plan or for a batch of plans (numpy arrays in the fields): the
    per-micro-batch terms of the stage that sets the pace, paid m times, and one call per other term.
    ``mem``: :func:`memory_terms` of the same plans, when the caller has them."""
    if mem is None:
        mem = memory_terms(model, job, cluster, plan)
    m = micro_batches(job, plan)
    base = with_reference_block(curves, cluster)
    charged = with_stage_concurrency(base, plan, m)
    time, step, lt, pace, dp = _time_terms(model, job, cluster, plan, charged, mem, m)
    if np.all(np.asarray(getattr(base, "compute_slowdown", 1.0)) > 1.0):
        # ranks sharing a CPU's cores: the slowdown charged for the share of the time the peers
        # compute, which the estimate gives; a fixed point from "always" (it decreases monotonically)
        for _ in range(CONCURRENCY_PASSES):
            charged = with_stage_concurrency(base, plan, m, compute_busy_share(time, step))
            time, step, lt, pace, dp = _time_terms(model, job, cluster, plan, charged, mem, m)
    flops_model, flops_hw = C.step_flops(model, job, plan)
    sl = mem.stage_layers
    return StepTerms(time=time, step=step, memory=mem.memory, host_per_gpu=mem.host_per_gpu,
                     nvme_per_gpu=mem.nvme_per_gpu, micro_batches=m, flops_model=flops_model, flops_hardware=flops_hw,
                     dp_comm_total=dp.total, last_stage_is_peak=mem.peak_stage == LAST, peak_stage=mem.peak_stage,
                     slowest_stage=pace.stage, stage_layers=sl,
                     bubble_fraction=reported_bubble_fraction(plan, m, sl, lt, time["pp_bubble"]),
                     warmup_share=dp.warmup_share,
                     step_warmup=step - dp.average + dp.warmup, step_compressed=step - dp.average + dp.compressed,
                     dp_comm_warmup=dp.warmup, dp_comm_compressed=dp.compressed,
                     compute_slowdown=getattr(charged, "compute_slowdown", 1.0))


#: iterations of the compute-concurrency fixed point after the first pass (CPU clusters with a contention
#: slowdown only); a numerical setting, not a hardware figure: two bring the charged slowdown within
#: 1 % of its fixed point on validate's layouts (test_profiled)
CONCURRENCY_PASSES = 2


def _time_terms(model, job, cluster, plan, curves, mem: MemoryTerms, m):
    """The time half of :func:`step_terms` on ``curves`` as given: (time terms, step, layer times,
    stage pace, data-parallel times)."""
    lt = C.layer_times(model, job, plan, curves, cluster)
    sl, params, experts, shard = mem.stage_layers, mem.params, mem.experts, mem.shard
    pace = stage_pace(sl, plan, lt, C.head_times(model, job, plan, curves, cluster))
    dp = dp_step_times(model, plan, cluster, curves, m, pace, params, experts)
    optimizer, offload = optimizer_and_offload_times(model, plan, cluster, curves, m, pace, shard, params,
                                                     dp.average, mem.activations_offloaded)
    time = {
        "compute": m * (pace.compute + pace.head_compute),
        "recompute": m * pace.recompute,
        "grad_accumulation": grad_accumulation_time(model, plan, curves, m, params),
        "tp_comm": m * (pace.tp_comm + pace.head_tp) + expert_tp_replica_allreduce_time(experts, plan, cluster),
        "cp_comm": m * pace.cp_comm,
        "ep_comm": m * pace.ep_comm,
        "moe_host": m * pace.moe_host,
        "pp_comm": pipeline_p2p_time(model, job, plan, cluster, m, pace.forward, pace.backward + pace.moe_host),
        "pp_bubble": bubble_time(plan, sl, lt),
        "dp_comm": dp.average,
        "optimizer": optimizer,
        "offload": offload,
    }
    return time, sum(time.values()), lt, pace, dp


def _f(x) -> float:
    return float(np.asarray(x))


def estimate(model, job, cluster, plan: Plan, *, curves=None, max_memory_fraction: float = 1.0) -> Estimate:
    """Predict one plan. Raises ConfigError for a plan that does not match the model, job or cluster;
    a plan that does not fit in memory comes back with ``feasible=False`` and the reason."""
    return estimate_legal(model, job, cluster, check_plan(plan, model, job, cluster), curves=curves,
                          max_memory_fraction=max_memory_fraction)


def estimate_legal(model, job, cluster, plan: Plan, *, curves=None, max_memory_fraction: float = 1.0) -> Estimate:
    """:func:`estimate` of a plan already known to pass :data:`paraplan.plan.RULES` for this model, job
    and cluster, with dp filled: the planner's candidates, which its space admitted through the same
    rules as masks, skip the per-plan check (a third of an exact re-score)."""
    curves = with_reference_block(curves or curves_for(cluster), cluster)
    terms = step_terms(model, job, cluster, plan, curves)
    n = cluster.num_gpus
    step = _f(terms.step)
    tokens_per_s = job.tokens_per_step / step
    peak = cluster.accelerator.peak(compute_dtype(plan.dtype))
    memory = {k: _f(v) for k, v in terms.memory.items()}
    g = cluster.gpus_per_node
    host = _f(terms.host_per_gpu) * g
    nvme = _f(terms.nvme_per_gpu) * g
    reason = infeasibility(memory["total"], host, nvme, cluster, max_memory_fraction)
    domains = nvlink_domain_assumption(cluster)
    return Estimate(
        model=model.name, model_params=model.num_params, model_active_params=model.active_params,
        cluster=cluster.name, num_gpus=n, seq_len=job.seq_len, global_batch=job.global_batch,
        plan=plan, feasible=reason is None, infeasible_reason=reason, step_time_s=step,
        tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / n,
        model_tflops_per_gpu=_f(terms.flops_model) / step / n / 1e12,
        mfu=_f(terms.flops_model) / step / n / peak, hfu=_f(terms.flops_hardware) / step / n / peak,
        time_breakdown_s={k: _f(v) for k, v in terms.time.items()}, memory_bytes_per_gpu=memory,
        host_memory_bytes_per_node=host, nvme_bytes_per_node=nvme,
        details={"micro_batches_per_step": _f(terms.micro_batches),
                 "bubble_fraction": _f(terms.bubble_fraction),
                 "dp_comm_total_s": _f(terms.dp_comm_total),
                 "peak_memory_stage": STAGE_NAMES[int(terms.peak_stage)],
                 "layers_per_stage": stage_layer_counts(model.layers, plan),
                 **({"mtp_blocks_on_last_stage": model.mtp_layers} if model.mtp_layers else {}),
                 **({"hybrid_layers": C.hybrid_layer_breakdown(model, job, plan, curves, cluster)}
                    if getattr(model, "layer_pattern", "") else {}),
                 **({"compute_slowdown": {"all_ranks_busy": float(curves.compute_slowdown),
                                          "expected": _f(terms.compute_slowdown)}}
                    if getattr(curves, "compute_slowdown", 1.0) > 1.0 else {}),
                 "gpu_memory_bytes": cluster.accelerator.memory_bytes,
                 "model_params": model.num_params, "active_params": model.active_params,
                 **({"optimizer_warmup_share": _f(terms.warmup_share),
                     "step_time_warmup_s": _f(terms.step_warmup),
                     "step_time_compressed_s": _f(terms.step_compressed),
                     "dp_comm_warmup_s": _f(terms.dp_comm_warmup),
                     "dp_comm_compressed_s": _f(terms.dp_comm_compressed)} if plan.optimizer != "adam" else {}),
                 # a cluster cut into NVLink domains: the text report shows the assumption with the numbers
                 **({"nvlink_domains": {"count": cluster.num_nodes, "gpus_each": cluster.gpus_per_node,
                                        "assumption": domains[0]}} if domains else {})},
        efficiency_curves=curves.describe(),
        assumptions=assumptions(model, job, cluster, plan, curves, memory["total"]),
        prediction_interval=describe_interval(cluster.accelerator.name, tokens_per_s, step,
                                              _f(terms.flops_model) / step / n / peak, moe=model.moe is not None,
                                              evidence=features_of(model, job, cluster, plan),
                                              calibration_residuals=cluster.accelerator.calibration_residuals))


def infeasibility(gpu_total, host_per_node, nvme_per_node, cluster, max_memory_fraction=1.0) -> str | None:
    """Why a plan does not fit (GPU memory, host memory, NVMe), with the overflow in GiB; None if it fits."""
    gib = 2**30
    reasons = []
    cap = cluster.accelerator.memory_bytes * max_memory_fraction
    if gpu_total > cap:
        reasons.append(f"GPU memory: needs {gpu_total / gib:.1f} GiB per GPU, {cap / gib:.1f} GiB available "
                       f"(over by {(gpu_total - cap) / gib:.1f} GiB)")
    host_cap = cluster.node_system.host_memory_bytes
    if host_per_node > host_cap:
        reasons.append(f"host memory: needs {host_per_node / gib:.0f} GiB per node, {host_cap / gib:.0f} GiB "
                       f"available (over by {(host_per_node - host_cap) / gib:.0f} GiB)")
    nvme_cap = cluster.node_system.nvme_capacity_bytes
    if nvme_per_node > nvme_cap:
        reasons.append(f"NVMe: needs {nvme_per_node / 1e12:.2f} TB per node, {nvme_cap / 1e12:.2f} TB available")
    return "; ".join(reasons) if reasons else None
