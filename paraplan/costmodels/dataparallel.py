"""Data-parallel and ZeRO communication per step, and the part backward does not hide.

Volumes per GPU for the stage's Ψ parameters in 16-bit (Rajbhandari et al. 2019, ZeRO, arXiv:1910.02054 §7),
over N_d = dp·cp ranks (the replicas of a parameter):
  stage 0    all-reduce of gradients once per step (= reduce-scatter + all-gather, 2Ψ)
  stage 1    reduce-scatter of gradients + all-gather of updated parameters once per step (2Ψ)
  stage 2    reduce-scatter of gradients every micro-batch (gradients are not kept whole), one
             all-gather of parameters per step
  stage 3    every micro-batch: all-gather forward, all-gather backward, reduce-scatter (3Ψ),
             issued per wrapped unit (each layer of the stage and the root: FSDP's per-block
             ``fully_shard``, torchtitan, llm-foundry), so a step pays (layers + 1) times the
             latency of each collective: T = units · (2·AG(Ψ/units) + RS(Ψ/units))
  stages 2-3 under pipeline parallelism on an engine that keeps FSDP unsharded across the micro-batches
             (torchtitan's FSDP2 under torch.distributed.pipelining: :func:`fsdp_syncs_once_per_step`):
             one all-gather and one reduce-scatter per step, as stage 1 (2Ψ), whatever the micro-batches
Gradients move in the engine's gradient dtype (:func:`dp_grad_bytes`): Megatron-LM reduces its fp32
main_grad buffer (4 bytes per parameter; 2 with --grad-reduce-in-bf16), torchtitan fp32 (FSDP2's
reduce_dtype), DeepSpeed's BF16_Optimizer fp32 in an all-reduce, the others their 16-bit gradients.
Overlap (bucketed, as Megatron's --overlap-grad-reduce, DeepSpeed overlap_comm and FSDP do;
off with ``plan.overlap_grad_reduce = False``, as in Megatron-LM's 2020-21 "local" DDP):
gradient reduction runs under the backward of the last micro-batch, the parameter all-gather of
stages 1-2 under the next step's first forward (Megatron --overlap-param-gather; exposed before the
forward with ``plan.overlap_param_gather = False``, Megatron-LM's default), ZeRO-3's
gathers are prefetched under each micro-batch's compute (also off with
``overlap_grad_reduce = False``); only the excess is exposed, and the hidden part slows the
compute beneath it by OVERLAP_CONTENTION of its duration. DeepSpeed hides less (its source, in the note
above DP_WINDOWS): its pipeline and ZeRO-0 gradient reduction and its ZeRO-1/2 parameter all-gather run
exposed. Collectives that hide under one window share
it (:func:`dp_exposed`: a stage's dense and expert parameters); the step's windows
(:func:`dp_step_times`) include the time a host-bound MoE layer's GPU waits
for the host and the TP communication a pass waits for, and exclude the time an inter-node ring-attention
exchange or a TP group across nodes holds the links (tpcomm.tp_data_parallel_window_times).

Aleph Alpha's Scaling (engine ``scaling``; src/scaling/core/optimizer/optimizer.py and allreduce.py at
01b9d21) reduces differently, inside ``optimizer.step()`` after the whole backward, so nothing hides
it: every rank all-reduces all of its gradients cast to fp32 (``allreduce_tensor_in_float32``, in
buckets of ``allreduce_bucket_size``; an all-reduce, not a reduce-scatter, even with its ZeRO-1
optimizer), then with ZeRO-1 all-gathers the updated 16-bit parameters (``step_sequel``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time, ranks_per_node
from paraplan.costmodels.fp8 import FP8_GATHER_BYTES_RATIO
from paraplan.costmodels.kernels import Number, element_bytes, megatron_grad_bytes
from paraplan.costmodels.memory import deepspeed_bf16_optimizer, megatron_fp8_params
from paraplan.engines import engine_flag, engine_where, spec_of
from paraplan.plan import Optimizer, expert_data_parallel, quantized_bytes, expert_group_strides, expert_parallel_folded

# Share of an overlapped collective's duration that it costs the compute beneath it (NCCL kernels
# occupy SMs and HBM bandwidth): Lee et al. 2025's measured average (arXiv:2507.03114), for every tier
# (fitted_constants.yaml, collective_overlap_slowdown; tensor- and expert-parallel overlap use it too)
OVERLAP_CONTENTION = fitted("collective_overlap_slowdown")

# Scaling casts its 16-bit gradients to fp32 for the data-parallel all-reduce (allreduce.py:
# ``tensor.to(torch.float32)`` before ``all_reduce``)
SCALING_GRAD_REDUCE_BYTES = 4


def hidden_under(comm, window):
    """Exposed part of a collective overlapped with ``window`` seconds of compute, plus the slowdown
    its hidden part inflicts on that compute."""
    return np.maximum(0.0, comm - window) + OVERLAP_CONTENTION * np.minimum(comm, window)


DP_OVERLAP_ASSUMPTION = ("data-parallel gradient reduction is bucketed and overlaps the last micro-batch's backward; "
                         "ZeRO-3 gathers are prefetched under each micro-batch's compute; dense and expert collectives "
                         "share those windows, which include the time the GPU idles at a dropless MoE layer's sync and "
                         "the tensor-parallel communication each pass waits for, and exclude the time an inter-node "
                         "ring-attention exchange or tensor-parallel group holds the links")
# what replaces it for a plan that does not overlap its data-parallel reduction, and for Scaling's
DP_NO_OVERLAP_ASSUMPTION = ("data-parallel gradient reduction runs after the backward and ZeRO-3's gathers are "
                            "not prefetched: nothing hidden (overlap_grad_reduce off)")
PARAM_GATHER_EXPOSED_ASSUMPTION = ("ZeRO-1/2's all-gather of the updated parameters runs whole between the optimizer "
                                   "step and the next forward, exposed (no --overlap-param-gather)")
SCALING_DP_ASSUMPTION = ("data-parallel reduction as Scaling runs it (engine scaling): an fp32 all-reduce of every "
                         "gradient, then with ZeRO-1 the parameter all-gather, both inside the optimizer step after the "
                         "backward, exposed")


def dp_overlap_assumption(plan, **_) -> tuple[str, ...]:
    """How much of the data-parallel traffic the plan hides (:func:`dp_exposed`): Scaling's exposed
    reduction inside the optimizer step (``Behaviour.reduces_in_optimizer_step``), none without
    ``overlap_grad_reduce``, else the bucketed overlap, and ZeRO-1/2's parameter all-gather exposed
    without ``overlap_param_gather``."""
    if engine_flag(plan, "reduces_in_optimizer_step"):
        return (SCALING_DP_ASSUMPTION,)
    if not plan.overlap_grad_reduce:
        return (DP_NO_OVERLAP_ASSUMPTION,)
    if (not plan.overlap_param_gather and plan.zero in (1, 2) and plan.dp * plan.cp > 1
            and not engine_flag(plan, "dp_collectives_outside_backward")):   # DeepSpeed's line says it
        return (DP_OVERLAP_ASSUMPTION, PARAM_GATHER_EXPOSED_ASSUMPTION)
    return (DP_OVERLAP_ASSUMPTION,)


# Compressed-communication optimizers: (share of steps in the uncompressed warm-up, bytes per element
# sent in the compressed phase relative to 16-bit). The compressed phase sends 1 bit per element
# (1/16 of fp16) through a compressed all-reduce. Warm-up shares follow from each paper's end-to-end
# volume reduction r with a 1/16 compressed phase: w + (1 − w)/16 = 1/r.
#   1-bit Adam (Tang et al. 2021, arXiv:2102.02888): "up to 5x less communication volume" → w ≈ 0.15
#   0/1 Adam (Lu et al. 2022, arXiv:2202.06009): "up to 87% less data volume" → w ≈ 0.07
#   1-bit LAMB (Li et al. 2021, arXiv:2104.06069): "up to 4.6x less communication volume" → w ≈ 0.16
COMPRESSED_OPTIMIZERS = {Optimizer.ONEBIT_ADAM: (0.15, 1 / 16), Optimizer.ZERO_ONE_ADAM: (0.07, 1 / 16),
                         Optimizer.ONEBIT_LAMB: (0.16, 1 / 16)}


def fp8_all_gather_factor(plan):
    """Bytes of a parameter all-gather relative to 16 bit: 1/2 where torchtitan gathers fp8 weights
    (``float8.enable_fsdp_float8_all_gather`` with per-tensor scaling, which paraplan's export turns
    on for ``--dtype fp8`` under FSDP: weights are cast before the all-gather) and where Megatron-LM's
    parameters are fp8 (``plan.fp8_param_gather``: the distributed optimizer and Megatron-FSDP gather
    the fp8 data; 0.28 for fp4 parameters: 0.5625 bytes of NVFP4 data and scales over 2), else 1. The dtypes an engine gathers in fp8 so: its ``Behaviour.fp8_fsdp_gather_dtypes``."""
    fsdp_fp8 = engine_where(plan, lambda spec: plan.dtype in spec.behaviour.fp8_fsdp_gather_dtypes)
    # fp4 parameters (Megatron --fp4-param-gather under nvfp4) gather their 4-bit data and block scales
    return np.where(fsdp_fp8 | megatron_fp8_params(plan), FP8_GATHER_BYTES_RATIO * quantized_bytes(plan.dtype), 1.0)


# torchtitan reduces gradients in fp32 (FP32_GRAD_BYTES): its FSDP2 MixedPrecisionPolicy takes reduce_dtype from
# training.mixed_precision_reduce, default "float32" (pytorch/torchtitan torchtitan/config/job_config.py),
# so fully_shard casts each unsharded 16-bit gradient to fp32 before the reduce-scatter; a replicate-only
# run trains fp32 parameters under autocast, so its all-reduced gradients are fp32 as well
FP32_GRAD_BYTES = 4.0


def dp_grad_bytes(plan):
    """Bytes per parameter that a data-parallel gradient reduction moves: Megatron-LM its main_grad
    buffer (:func:`paraplan.costmodels.kernels.megatron_grad_bytes`), torchtitan fp32 (its reduce_dtype),
    DeepSpeed's BF16_Optimizer fp32 (it reduces its fp32 accumulation buffers: get_grads_for_reduction),
    the others the element size of their gradients (``Behaviour.main_grad_buffer``, ``fp32_grad_reduction``)."""
    fp32 = engine_flag(plan, "fp32_grad_reduction") | deepspeed_bf16_optimizer(plan)
    return np.where(engine_flag(plan, "main_grad_buffer"), megatron_grad_bytes(plan),
                    np.where(fp32, np.maximum(FP32_GRAD_BYTES, element_bytes(plan)), element_bytes(plan)))


# FSDP2 (torch.distributed.fsdp.fully_shard: torchtitan's data parallelism) copies around its collectives
# on the GPU, pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (v2.5-2.9):
#   foreach_all_gather_copy_out  after waiting on each all-gather, on the compute stream, one
#       split_with_sizes_copy moves the gathered flat buffer into every parameter's unsharded tensor:
#       read + write of the unit's gathered bytes (FSDP2_COPY_OUT_ACCESSES), every all-gather: 2 per
#       micro-batch at ZeRO-3 (forward, and backward after reshard_after_forward), 1 at ZeRO-2;
#   foreach_reduce  torch._chunk_cat of the unit's unsharded 16-bit gradients into the reduce-scatter
#       input in reduce_dtype (torchtitan: fp32), on the reduce-scatter stream before each reduce-scatter:
#       read e, write g bytes per parameter.
# all_gather_copy_in copies the rank's own shard only (1/N of it): left out. FSDP1's FlatParameter
# gathers straight into the parameters' storage and Megatron-FSDP and DeepSpeed into persistent
# buffers their parameters view, so only FSDP2 pays these copies.
FSDP2_COPY_OUT_ACCESSES = 2


def fsdp2_copy_times(params, plan, curves, units):
    """(copy-out, chunk-cat) seconds per micro-batch of FSDP2's copies around its collectives for
    ``params`` parameters in ``units`` wrapped units (the note above): copy-out
    gathers · 2 · e_gather · Ψ bytes on the compute stream, gathers = 2 at ZeRO-3, 1 at ZeRO-2;
    chunk-cat (e + g) · Ψ on the reduce-scatter stream ahead of the reduce-scatter (e the 16-bit
    gradient, g :func:`dp_grad_bytes`), one streaming kernel per unit and copy. 0 for other engines, for
    ZeRO-0/1 and for a single data-parallel rank (nothing is sharded)."""
    z = np.asarray(plan.zero)
    fsdp2 = engine_flag(plan, "fsdp2_copies") & (z >= 2)
    gathers = np.where((z == 3) & ~fsdp_syncs_once_per_step(plan), 2.0, 1.0)
    e = element_bytes(plan)
    copy_out = curves.streaming_time(gathers * FSDP2_COPY_OUT_ACCESSES * e * fp8_all_gather_factor(plan) * params,
                                     kernels=gathers * units)
    chunk_cat = curves.streaming_time((e + dp_grad_bytes(plan)) * params, kernels=units)
    sharded = fsdp2 & (np.asarray(plan.dp) * np.asarray(plan.cp) > 1)
    return np.where(sharded, copy_out, 0.0), np.where(sharded, chunk_cat, 0.0)


def fsdp_syncs_once_per_step(plan):
    """Plans whose ZeRO-2/3 collectives run once per step, not once per micro-batch: pipeline-parallel
    plans (pp > 1) at ZeRO-2/3 on an engine that keeps FSDP's parameters unsharded across the
    micro-batches and reduce-scatters the accumulated gradients once, after the last micro-batch's
    backward (``Behaviour.fsdp_syncs_once_under_pp``: torchtitan's FSDP2 under torch.distributed.pipelining,
    the note at its spec). Their traffic is then ZeRO-2's once-per-step pattern: one all-gather of the
    stage's parameters under the first forward, one reduce-scatter of its gradients under the last
    backward (:func:`dp_traffic`); the memory this costs is the engine spec's (unsharded parameters
    and fp32 gradients held through the step)."""
    return engine_flag(plan, "fsdp_syncs_once_under_pp") & (np.asarray(plan.pp) > 1) & (np.asarray(plan.zero) >= 2)


def dp_group(plan, cluster, experts: bool = False):
    """(ranks, ranks per node) of the group that holds replicas of a parameter: dp·cp ranks at
    stride tp; for routed experts the expert-data-parallel group (:func:`paraplan.plan.expert_data_parallel`
    ranks at the stride :func:`paraplan.plan.expert_group_strides` gives)."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp
    if experts:
        edp = expert_data_parallel(plan)
        return edp, ranks_per_node(edp, expert_group_strides(plan)[1], cluster.gpus_per_node)
    return n, ranks_per_node(n, plan.tp, cluster.gpus_per_node)


def expert_tp_replica_allreduce_time(expert_params, plan, cluster):
    """Seconds per step of summing routed experts' gradients over their replicas inside the tp group,
    where ep is carved from data parallelism (every engine but Megatron-Core's folding, which counts
    those replicas in its expert-data-parallel group instead): with etp < tp each expert shard sits on
    tp/etp ranks of a tp group, which split its tokens (the sequence shards), so their gradients differ
    and are all-reduced over those ranks once a step, after the backward (the validation harness's
    sequence-parallel gradient all-reduce). ``expert_params``: the GPU's routed-expert parameters."""
    tp = np.asarray(plan.tp, dtype=float)
    replicas = tp / np.asarray(getattr(plan, "etp", 1), dtype=float)
    applies = (replicas > 1) & ~np.asarray(expert_parallel_folded(plan), dtype=bool) & (np.asarray(expert_params) > 0)
    if not np.any(applies):
        return 0.0
    intra, inter = cluster.links("tp")
    k = ranks_per_node(replicas, 1, cluster.gpus_per_node)
    t = collective_time(ALL_REDUCE, dp_grad_bytes(plan) * np.asarray(expert_params, dtype=float), replicas, k,
                        intra, inter)
    return np.where(applies, t, 0.0)


def compressed_phase_factor(plan):
    """(warm-up share, compressed volume factor) of the plan's optimizer; (1, 1) for Adam."""
    code = np.asarray(plan.optimizer_code)
    warm = np.ones(np.shape(code))
    factor = np.ones(np.shape(code))
    for c, (w, f) in COMPRESSED_OPTIMIZERS.items():
        warm = np.where(code == c, w, warm)
        factor = np.where(code == c, f, factor)
    return warm, factor


# DeepSpeed (deepspeed/runtime; the same in every release since the BF16_Optimizer): its PipelineEngine
# reduces gradients in a ReduceGrads instruction after the pipeline's last backward
# (PipelineEngine._exec_reduce_grads; with the BF16_Optimizer _bf16_reduce_grads, an all-reduce of the
# optimizer's fp32 gradients), DeepSpeedEngine.backward() all-reduces after loss.backward() returns at
# ZeRO-0 (allreduce_gradients -> buffered_allreduce_fallback), and the ZeRO-1/2 optimizer all-gathers its
# updated 16-bit partitions inside step() (stage_1_and_2.py: all_gather_dp_groups, "ready for next round
# forward"): none of these overlaps compute. Only ZeRO-1/2's reduction in backward hooks (overlap_comm,
# which the export sets from overlap_grad_reduce) and ZeRO-3's prefetched gathers hide
# (:func:`deepspeed_exposed`).

def deepspeed_exposed(plan):
    """(gradient reduction exposed, parameter all-gather exposed) per plan, by the DeepSpeed note above:
    the reduction under a pipeline or at ZeRO-0, the ZeRO-1/2 all-gather; nothing for engines without
    ``Behaviour.dp_collectives_outside_backward``."""
    ds = engine_flag(plan, "dp_collectives_outside_backward")
    z = np.asarray(plan.zero)
    return ds & ((np.asarray(plan.pp) > 1) | (z == 0)), ds & ((z == 1) | (z == 2))


def deepspeed_dp_assumption(plan, **_) -> tuple[str, ...]:
    """What a DeepSpeed plan's data-parallel collectives rest on (:func:`dp_traffic`: what DeepSpeed's
    source runs outside the backward, :func:`deepspeed_exposed`)."""
    if not engine_flag(plan, "dp_collectives_outside_backward") or plan.dp * plan.cp <= 1:
        return ()
    grad_exposed, gather_exposed = deepspeed_exposed(plan)
    parts = []
    if bool(grad_exposed):
        parts.append("the gradient reduction runs after the backward, exposed ("
                     + ("PipelineEngine's ReduceGrads" if plan.pp > 1 else "allreduce_gradients at ZeRO-0") + ")")
    if bool(gather_exposed):
        parts.append("the ZeRO optimizer all-gathers the updated 16-bit parameters inside step(), exposed")
    if bool(deepspeed_bf16_optimizer(plan)):
        parts.append("its BF16_Optimizer all-reduces fp32 gradients (4 bytes per parameter)")
    return ("DeepSpeed: " + "; ".join(parts),) if parts else ()


# The windows data-parallel traffic hides under (see the module docstring), by key of :func:`dp_traffic`:
# the last micro-batch's backward, the first micro-batch's forward, every micro-batch's backward (ZeRO-2),
# every micro-batch's forward and backward (ZeRO-3), and none (Scaling)
DP_WINDOWS = ("last_backward", "first_forward", "each_backward", "each_micro", "exposed")


def dp_traffic(params, plan, cluster, *, experts: bool = False, volume_factor=1.0, units=1) -> dict:
    """Seconds of data-parallel / ZeRO collectives per step for ``params`` parameters per GPU, by the
    window they hide under (DP_WINDOWS; ``each_*`` per micro-batch), before any overlap.

    ``units``: how many pieces ZeRO-3 gathers and reduces the stage's parameters in (its wrapped
    units, layers + 1); every piece pays its collective's latency."""
    n, k = dp_group(plan, cluster, experts)
    intra, inter = cluster.links("ep" if experts else "dp")
    size = element_bytes(plan) * params * volume_factor
    grad_size = dp_grad_bytes(plan) * params * volume_factor     # the engine's gradient dtype
    gather_size = size * fp8_all_gather_factor(plan)
    ar = collective_time(ALL_REDUCE, grad_size, n, k, intra, inter)
    rs = collective_time(REDUCE_SCATTER, grad_size, n, k, intra, inter)
    ag = collective_time(ALL_GATHER, gather_size, n, k, intra, inter)
    z = np.asarray(plan.zero)
    units = np.maximum(np.asarray(units, dtype=float), 1.0)
    per_micro3 = units * (2 * collective_time(ALL_GATHER, gather_size / units, n, k, intra, inter)
                          + collective_time(REDUCE_SCATTER, grad_size / units, n, k, intra, inter))
    # Scaling: an fp32 all-reduce of every gradient after the backward, then (ZeRO-1) the 16-bit
    # parameter all-gather, both exposed
    scaling = engine_flag(plan, "reduces_in_optimizer_step")
    scaling_total = 0.0
    if np.any(scaling):                         # priced only where a plan runs on Scaling
        scaling_total = (collective_time(ALL_REDUCE, SCALING_GRAD_REDUCE_BYTES * params * volume_factor,
                                         n, k, intra, inter) + np.where(z >= 1, ag, 0.0))
    some = n > 1
    plain = some & ~scaling
    # the once-per-step gradient reduction (DeepSpeed's BF16_Optimizer all-reduces, ZeRO-1 or not) and
    # the once-per-step parameter all-gather of ZeRO-1/2
    # FSDP under a pipeline that syncs once per step (fsdp_syncs_once_per_step): ZeRO-2/3 reduce-scatter
    # once after the last backward and gather once before the first forward
    once = fsdp_syncs_once_per_step(plan)
    grad_once = np.where((z == 0) | deepspeed_bf16_optimizer(plan), ar, np.where((z == 1) | once, rs, 0.0))
    gather_once = np.where((z == 1) | (z == 2) | once, ag, 0.0)
    ds_grad, ds_gather = deepspeed_exposed(plan)      # what DeepSpeed runs outside the backward
    # ZeRO-1/2's parameter all-gather waits for the optimizer step and precedes the forward, exposed,
    # unless it is overlapped with the first forward (Plan.overlap_param_gather)
    gather_exposed = ds_gather | ~np.asarray(plan.overlap_param_gather, dtype=bool)
    return {"last_backward": np.where(plain & ~ds_grad, grad_once, 0.0),
            "first_forward": np.where(plain & ~gather_exposed, gather_once, 0.0),
            "each_backward": np.where(plain & (z == 2) & ~once, rs, 0.0),
            "each_micro": np.where(plain & (z == 3) & ~once, per_micro3, 0.0),
            "exposed": np.where(some & scaling, scaling_total, 0.0)
            + np.where(plain & ds_grad, grad_once, 0.0) + np.where(plain & gather_exposed, gather_once, 0.0)}


def add_traffic(a: dict, b: dict) -> dict:
    """Two sets of collectives that share the same windows (a stage's dense and expert parameters)."""
    return {key: a[key] + b[key] for key in DP_WINDOWS}


def dp_exposed(traffic: dict, plan, m, t_micro_fwd, t_micro_bwd):
    """(exposed, total) seconds per step of the collectives in ``traffic`` (:func:`dp_traffic`).
    Everything that hides under one window shares it: hidden_under(Σ traffic of the window, window),
    so a stage's dense and expert reductions cannot each claim the whole backward. Without overlap
    (``plan.overlap_grad_reduce`` False) every window is empty and all of it is exposed."""
    overlap = np.asarray(plan.overlap_grad_reduce, dtype=bool)
    bwd = np.where(overlap, t_micro_bwd, 0.0)
    fwd = np.where(overlap, t_micro_fwd, 0.0)
    exposed = (hidden_under(traffic["last_backward"], bwd) + hidden_under(traffic["first_forward"], fwd)
               + m * hidden_under(traffic["each_backward"], bwd)
               + m * hidden_under(traffic["each_micro"], fwd + bwd) + traffic["exposed"])
    total = (traffic["last_backward"] + traffic["first_forward"] + m * traffic["each_backward"]
             + m * traffic["each_micro"] + traffic["exposed"])
    return exposed, total


def dp_exposed_time(params, plan, cluster, m, t_micro_fwd, t_micro_bwd, *, experts: bool = False,
                    volume_factor=1.0, units=1):
    """Exposed seconds of data-parallel / ZeRO communication per step (and the total traffic time)
    for one set of parameters: :func:`dp_exposed` of :func:`dp_traffic`."""
    traffic = dp_traffic(params, plan, cluster, experts=experts, volume_factor=volume_factor, units=units)
    return dp_exposed(traffic, plan, m, t_micro_fwd, t_micro_bwd)


@dataclass(frozen=True)
class DpStepTimes:
    """Seconds per step of a stage's data-parallel / ZeRO collectives (one entry per plan for a batch):
    exposed in the optimizer's uncompressed warm-up (every step for Adam) and in its compressed phase,
    averaged over the two, and before any overlap."""
    warmup: Number
    compressed: Number
    average: Number
    total: Number
    warmup_share: Number         # share of steps in the warm-up (1 for Adam: :func:`compressed_phase_factor`)


def dp_step_times(model, plan, cluster, curves, m, pace, params, experts) -> DpStepTimes:
    """The stage's dense and (MoE) expert collectives (:func:`dp_traffic`, sharing their windows:
    :func:`add_traffic`), exposed under the windows of the pace-setting stage ``pace``
    (:class:`paraplan.costmodels.pipeline.StagePace`) by :func:`dp_exposed`, ZeRO-3 in one piece per
    layer and the root. The windows are a micro-batch's passes with the TP communication they wait for,
    less the time an inter-node ring-attention exchange or TP group already holds the links
    (cpcomm.ring_hidden_on_network, tpcomm.tp_data_parallel_window_times); a host-bound MoE
    layer's wait (the GPU idles, the links are free) counts in the backward's window, where the
    per-micro-batch reductions run. Split between the passes by their compute shares, as before, a
    faster GPU (its memory-bound kernels no faster) moved wait into the forward and shrank the window a
    ZeRO-2 reduce-scatter hides under by more than the step shortened (benchmarks/monotonicity.py:
    Mixtral 8x7B on Megatron-FSDP, peak FLOP rate x2); all in the backward, it cannot. The forward's
    window, which the once-per-step parameter all-gather of ZeRO-1/2 uses, goes without it. Where the
    device's profile measured FSDP2's own cost per wrapped unit and micro-batch (a CPU under gloo:
    hooks, DTensor bookkeeping, buffer copies), ZeRO-3 adds it; elsewhere FSDP2's copies are priced
    (:func:`fsdp2_copy_times`: the copy-out exposed, the chunk-cat with the reduce-scatters it precedes).
    Compressed optimizers average their
    warm-up and compressed phases by :func:`compressed_phase_factor`."""
    warm, factor = compressed_phase_factor(plan)
    units = pace.layers + 1                     # ZeRO-3's wrapped units: each layer and the root
    compressed = bool(np.any(factor != 1))      # else the compressed phase is the warm-up phase

    fsdp_unit = float(getattr(curves, "fsdp_unit_overhead_s", 0.0) or 0.0)
    # FSDP2's copies (fsdp2_copy_times), where no profile measured FSDP2's own cost per unit (which has them)
    copy_out, chunk_cat = (0.0, 0.0) if fsdp_unit else fsdp2_copy_times(
        params + (experts if model.moe is not None else 0.0), plan, curves, units)

    def traffic(volume_factor):
        """The stage's dense and (MoE) expert collectives: they hide under the same windows; FSDP2's
        chunk-cat runs on the reduce-scatter stream, ahead of each reduce-scatter."""
        t = dp_traffic(params, plan, cluster, volume_factor=volume_factor, units=units)
        if model.moe is not None:
            t = add_traffic(t, dp_traffic(experts, plan, cluster, experts=True, volume_factor=volume_factor,
                                          units=units))
        # once per step (fsdp_syncs_once_per_step): the one chunk-cat precedes the one reduce-scatter
        once = fsdp_syncs_once_per_step(plan)
        return {**t, "each_micro": t["each_micro"] + np.where(once, 0.0, chunk_cat),
                "last_backward": t["last_backward"] + np.where(once, chunk_cat, 0.0)}
    # each pass's wall time: its compute and the TP communication it waits for (tpcomm.tp_data_parallel_window_times)
    dp_fwd = np.maximum(0.0, pace.forward + pace.tp_dp_window_forward - pace.cp_hidden_forward)
    dp_bwd = np.maximum(0.0, pace.backward + pace.moe_host + pace.tp_dp_window_backward - pace.cp_hidden_backward)
    dp_warm, dp_total = dp_exposed(traffic(1.0), plan, m, dp_fwd, dp_bwd)
    dp_comp = dp_exposed(traffic(factor), plan, m, dp_fwd, dp_bwd)[0] if compressed else dp_warm
    if fsdp_unit:
        fsdp_own = np.where(np.asarray(plan.zero) == 3, m * (pace.layers + 1) * fsdp_unit, 0.0)
        dp_warm, dp_comp, dp_total = dp_warm + fsdp_own, dp_comp + fsdp_own, dp_total + fsdp_own
    else:   # FSDP2's copy-out waits for each all-gather on the compute stream: nothing hides it
        fsdp_own = np.where(fsdp_syncs_once_per_step(plan), 1.0, m) * copy_out
        dp_warm, dp_comp, dp_total = dp_warm + fsdp_own, dp_comp + fsdp_own, dp_total + fsdp_own
    return DpStepTimes(warmup=dp_warm, compressed=dp_comp, average=warm * dp_warm + (1 - warm) * dp_comp,
                       total=dp_total, warmup_share=warm)


def fsdp_once_assumption(plan, **_) -> tuple[str, ...]:
    """Said when a plan's ZeRO-2/3 collectives run once per step under its pipeline
    (:func:`fsdp_syncs_once_per_step`)."""
    if not bool(np.any(fsdp_syncs_once_per_step(plan))):
        return ()
    return (f"ZeRO-{plan.zero} under pipeline parallelism ({plan.pp} stages): the stage's parameters are gathered once "
            "per step and kept unsharded across the micro-batches, its gradients accumulated unsharded and "
            "reduce-scattered once after the last backward (FSDP under torch.distributed.pipelining); memory holds "
            "the unsharded parameters and gradients, traffic is ZeRO-1's",)


def megatron_fsdp_assumption(plan, **_) -> tuple[str, ...]:
    """What a Megatron-LM plan at ZeRO-2/3 runs: Megatron-FSDP (memory.model_state_bytes, buffer_bytes), the
    sharding strategy its spec's export maps the stage to."""
    export = spec_of(plan).export
    strategy = export.fsdp_strategy.get(plan.zero) if export is not None else None
    if strategy is None:
        return ()
    return (f"ZeRO-{plan.zero} on Megatron-LM is Megatron-FSDP (--use-megatron-fsdp, --data-parallel-sharding-strategy "
            f"{strategy}): main_grad{' and 16-bit parameters' if plan.zero == 3 else ''} sharded over dp x cp, "
            "gathered and reduced per layer in persistent double buffers (--fsdp-double-buffer: two layers' "
            "gradients" + (" and parameters" if plan.zero == 3 else "") + ", counted in buffers)",)
