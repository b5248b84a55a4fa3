"""Tensor-parallel communication of one layer for one micro-batch: the all-reduces (reduce-scatter +
all-gather under sequence parallelism, the gathers in fp8 where :func:`paraplan.costmodels.fp8.tp_gathers_fp8`),
the all-gathers a sequence-parallel layer (:func:`sp_backward_regather_time`) or op-level SAC
(:func:`op_sac_regather_time`) runs again in its backward, their overlap with the GEMMs
(:func:`tp_exposed_time`), and the vocab-parallel cross-entropy's all-reduces.
"""
from __future__ import annotations

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time, ranks_per_node
from paraplan.costmodels.fp8 import FP8_GATHER_BYTES_RATIO, tp_gathers_fp8
from paraplan.costmodels.kernels import element_bytes, mlp_gemm_forward_times, tokens_per_rank
from paraplan.engines import engine_flag
from paraplan.plan import Recompute, quantized_bytes


def tp_collective_time(kind: str, size_bytes, plan, cluster):
    """Seconds of one collective of ``size_bytes`` over the tensor-parallel group (tp ranks at
    stride 1, on the cluster's tp links)."""
    k = ranks_per_node(plan.tp, 1, cluster.gpus_per_node)
    intra, inter = cluster.links("tp")
    return collective_time(kind, size_bytes, plan.tp, k, intra, inter)


def tp_allreduce_time(model, job, plan, cluster, copies=1.0, fp8_gathers=True):
    """One tensor-parallel all-reduce (or reduce-scatter + all-gather with SP) of T·h activations
    (``copies`` x that many rows: an MoE layer's routed token copies, :func:`moe_tp_collective_copies`).

    With SP the two halves are priced as themselves: on a ring link (one α and bandwidth for all
    collectives) RS + AG equals the all-reduce exactly; a link fitted per collective from a
    profile (gloo on a CPU, say) prices them apart; where the all-gathers carry fp8
    (:func:`tp_gathers_fp8`, and ``fp8_gathers``: False for tensors no fp8 linear reads, the LM
    head's input and an MoE dispatcher's routed tokens) they move half the bytes of the
    reduce-scatters."""
    size = tp_activation_bytes(model, job, plan) * copies
    ar = tp_collective_time(ALL_REDUCE, size, plan, cluster)
    sp = np.asarray(plan.sp, dtype=bool)
    intra, inter = cluster.links("tp")
    if not np.any(sp) or not (intra.per_op or inter.per_op or (fp8_gathers and np.any(tp_gathers_fp8(plan)))):
        return ar
    rs_ag = tp_collective_time(REDUCE_SCATTER, size, plan, cluster) \
        + tp_collective_time(ALL_GATHER, tp_gathered_bytes(model, job, plan, fp8_gathers) * copies, plan, cluster)
    return np.where(sp, rs_ag, ar)


#: tensor-parallel autograd wrappers one layer calls per micro-batch, forward + backward: the attention
#: and the MLP each sit between a conjugate pair (copy-to-tp / reduce-from-tp, or under sequence
#: parallelism gather / reduce-scatter; Shoeybi et al. 2019, fig. 3)
TP_WRAPPER_CALLS_PER_LAYER = 4


def tp_wrapper_host_time(plan, passes, per_call_s):
    """Host seconds per layer and micro-batch of the autograd wrappers around the tensor-parallel
    collectives: ``TP_WRAPPER_CALLS_PER_LAYER · passes / 2 · per_call_s`` where tp > 1 (``passes``: 2,
    or 3 where full recomputation runs the forward again), 0 otherwise. ``per_call_s`` is a wrapper's
    forward + backward on the host beyond its collective, measured by ``paraplan profile`` on the
    profiled CPU device (:attr:`paraplan.costmodels.profiled.ProfiledCurves.tp_call_overhead_s`); the
    analytical (GPU) curves carry none: there the host runs ahead of the device."""
    calls = TP_WRAPPER_CALLS_PER_LAYER * np.asarray(passes, dtype=float) / 2
    return np.where(np.asarray(plan.tp) > 1, calls * float(per_call_s), 0.0)


def tp_activation_bytes(model, job, plan):
    """Bytes of the T·h activation a tensor-parallel collective of one layer carries (16-bit, or fp32)."""
    return tokens_per_rank(job, plan) * model.hidden * element_bytes(plan)


def tp_gathered_bytes(model, job, plan, fp8_gathers=True):
    """Bytes one sequence-parallel all-gather of a layer's block input carries: the T·h activation, fp8
    where the gathers carry fp8 (:func:`tp_gathers_fp8`: FP8_GATHER_BYTES_RATIO of it; ``fp8_gathers``
    False: a tensor no fp8 linear reads, 16-bit whatever the plan)."""
    fp8 = tp_gathers_fp8(plan) & bool(fp8_gathers)
    # an NVFP4 gather carries 0.5625 bytes per element (4-bit data and E4M3 block scales): quantized_bytes
    return tp_activation_bytes(model, job, plan) * np.where(fp8, FP8_GATHER_BYTES_RATIO * quantized_bytes(plan.dtype), 1.0)


def op_sac_regather_time(model, job, plan, cluster):
    """The all-gathers torchtitan's op-level SAC runs again in the backward of one layer and
    micro-batch: its policy saves the outputs of matmuls, attention and reduce-scatters but not of
    all-gathers (torchtitan ``_save_list``: aten.mm, the SDPA kernels,
    _c10d_functional.reduce_scatter_tensor, abs/max for fp8; "communication ops whose outputs should be
    saved to avoid re-communication" lists reduce-scatter and all-to-all only), so under sequence
    parallelism the gathered inputs of the attention and MLP blocks, which the weight gradients of
    their column-parallel projections read, are re-gathered: two all-gathers of T·h (fp8 where
    :func:`tp_gathers_fp8`) per layer, in the backward, where async TP does not reach. 0 for other
    recomputation modes, without sequence parallelism or tensor parallelism."""
    applies = (np.asarray(plan.recompute_code) == Recompute.OP_SAC) & np.asarray(plan.sp, dtype=bool) \
        & (np.asarray(plan.tp) > 1)
    gather = tp_collective_time(ALL_GATHER, tp_gathered_bytes(model, job, plan), plan, cluster)
    return np.where(applies, 2 * gather, 0.0)


def sp_backward_regather_time(model, job, plan, cluster, curves, attention_times, fc1_time):
    """Exposed seconds of the all-gathers a sequence-parallel layer runs again in its backward, per layer
    and micro-batch: the block input of the attention's projections that read it and, in a dense layer,
    of the MLP's first projection (an MoE layer's experts keep their gathered copies; its shared experts
    re-gather as a dense MLP does). Megatron-LM launches each asynchronously before the input-gradient
    GEMM and waits before the weight-gradient GEMM, so it hides under the first: exposed = max(0, gather -
    dgrad) + contention x min(gather, dgrad), dgrad taken as the forward GEMM's time: ``attention_times``
    the attention's projections' (:func:`attention_gemm_forward_times`), ``fc1_time`` the dense MLP's first
    projection's (:func:`mlp_gemm_forward_times`), both as the layer already priced them. 0 without
    sequence or tensor parallelism, under op-level SAC (op_sac_regather_time) and for engines that keep
    the gathered input (``Behaviour.sp_regather``: Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication,
    Korthikanti et al. 2022 sec. 4.2.2, Megatron-DeepSpeed's copy and the generic engine re-gather;
    torchtitan's DTensor matmuls and Scaling keep the gathered input)."""
    applies = engine_flag(plan, "sp_regather") & np.asarray(plan.sp, dtype=bool) & (np.asarray(plan.tp) > 1) \
        & (np.asarray(plan.recompute_code) != Recompute.OP_SAC)
    if not np.any(applies):
        return 0.0
    gather = tp_collective_time(ALL_GATHER, tp_gathered_bytes(model, job, plan), plan, cluster)

    def hidden(window):
        return np.maximum(0.0, gather - window) + TP_OVERLAP_CONTENTION * np.minimum(gather, window)
    attn = hidden(sum(time for time, (_, inp, split) in zip(attention_times, model.attention_gemms)
                      if inp == model.hidden and split != "row"))
    fc1 = hidden(fc1_time)
    share_moe = model.moe_layers / model.layers
    if share_moe and model.moe.shared_experts:
        shared_fc1 = hidden(mlp_gemm_forward_times(model, job, plan, curves,
                                                   width=model.moe.expert_ffn_hidden * model.moe.shared_experts)[0])
    else:
        shared_fc1 = 0.0
    return np.where(applies, attn + (1 - share_moe) * fc1 + share_moe * shared_fc1, 0.0)


def sp_backward_regather_raw_time(model, job, plan, cluster):
    """Seconds the all-gathers of :func:`sp_backward_regather_time` take, hidden or not, per layer and
    micro-batch: one for the attention's block input, one for a dense layer's MLP (and an MoE layer's
    shared experts); 0 where that function is."""
    applies = engine_flag(plan, "sp_regather") & np.asarray(plan.sp, dtype=bool) & (np.asarray(plan.tp) > 1) \
        & (np.asarray(plan.recompute_code) != Recompute.OP_SAC)
    if not np.any(applies):
        return 0.0
    gather = tp_collective_time(ALL_GATHER, tp_gathered_bytes(model, job, plan), plan, cluster)
    share_moe = model.moe_layers / model.layers
    gathers = 1 + (1 - share_moe) + (share_moe if model.moe is not None and model.moe.shared_experts else 0.0)
    return np.where(applies, gathers * gather, 0.0)


# Share of an overlapped TP collective's duration that it costs the GEMM beneath it (NCCL or userbuffer
# copy kernels take SMs and HBM bandwidth): the data-parallel figure (fitted_constants.yaml,
# collective_overlap_slowdown)
TP_OVERLAP_CONTENTION = fitted("collective_overlap_slowdown")
TP_EXPOSED_ASSUMPTION = "tensor-parallel collectives are exposed (no TP comm overlap); backward = 2 x forward GEMM time"
# what replaces it for a plan that overlaps its TP collectives
TP_OVERLAP_ASSUMPTION = ("tensor-parallel collectives overlap the GEMMs next to them (Megatron --tp-comm-overlap: "
                         "forward and backward; torchtitan async TP: the forward's only), the hidden part slowing "
                         f"those GEMMs by {TP_OVERLAP_CONTENTION} of its time; backward = 2 x forward GEMM time")


def tp_exposed_time(tp_comm, gemm_forward, full_recompute, plan, backward_extra=0.0):
    """Exposed tensor-parallel communication of one layer and micro-batch.

    Without overlap all of it. With ``plan.tp_comm_overlap`` (Megatron-LM --tp-comm-overlap, torchtitan
    async TP) each all-gather runs under the GEMM that consumes it and each reduce-scatter under the GEMM
    that produces it, in chunks: the window is the layer's projection GEMMs, forward once (twice more
    with full recomputation), backward twice; exposed = max(0, comm - window) + contention x min(comm,
    window).

    torchtitan's async TP overlaps the forward's collectives only (and their replay under full
    recomputation): its micro-pipelining is a torch.compile pass over the all-gather -> matmul and
    matmul -> reduce-scatter patterns, and its authors measured ~20 % forward against ~8 % end-to-end
    speed-up on Llama 3 70B (TORCHTITAN_ASYNC_TP_SOURCE): the backward's collectives stay exposed, the
    forward ones (2 of 4 all-reduce equivalents per layer, 4 of 6 with full recomputation) overlap
    under the forward GEMMs.

    ``backward_extra``: the seconds the backward's GEMMs take beyond twice the forward's (the routed
    experts' memory-bound weight-gradient GEMMs, moe.routed_experts_wgrad_accumulation_time), part of
    the backward's window: priced at 2 x forward only, that window shrank on a faster GPU by more
    than the backward did."""
    overlap = np.asarray(getattr(plan, "tp_comm_overlap", False), dtype=bool)
    forward_only = engine_flag(plan, "async_tp_forward_only")
    forward_passes = 1 + np.where(full_recompute, 1, 0)
    # each forward pass and the backward run two all-reduce equivalents: the forward's share is f / (f + 1)
    overlappable = np.where(forward_only, forward_passes / (forward_passes + 1) * tp_comm, tp_comm)
    window = gemm_forward * (forward_passes + np.where(forward_only, 0, 2)) \
        + np.where(forward_only, 0.0, backward_extra)                          # backward: its GEMMs twice
    hidden = (tp_comm - overlappable) + np.maximum(0.0, overlappable - window) \
        + TP_OVERLAP_CONTENTION * np.minimum(overlappable, window)
    return np.where(overlap, hidden, tp_comm)


def tp_exposed_by_pass(tp_comm, gemm_forward, full_recompute, plan, backward_extra=0.0):
    """(forward, backward) parts of :func:`tp_exposed_time`, which sum to it: the exposed seconds of the
    collectives of the forward pass, and of the backward with its recomputed forward, split by the
    GEMMs they run beside: 1/(forward passes + 2) in the forward (its GEMMs once; the recomputed
    forward's once and the backward's twice in the backward), with TP overlap or without, Megatron's or
    torchtitan's. One fixed split keeps each part moving the way the whole does: turning overlap on
    shrinks both, and as the GEMMs get faster the forward's part grows by no more than its GEMMs
    shrink (its share of the exposure never exceeds its share of the overlap window), which
    :func:`tp_data_parallel_window_times` relies on."""
    exposed = tp_exposed_time(tp_comm, gemm_forward, full_recompute, plan, backward_extra)
    forward = exposed * tp_pass_share(full_recompute)
    return forward, exposed - forward


def tp_layer_exposed_by_pass(tp_comm, gemm_forward, full_recompute, plan, regather, regather_raw,
                             backward_extra=0.0):
    """(forward, backward) exposed seconds of a layer's TP collectives (``tp_comm``, as for
    :func:`tp_exposed_time`) and of the all-gathers its backward runs again (``regather`` exposed, as
    :func:`sp_backward_regather_time` prices them under their own dgrad GEMM; ``regather_raw`` their
    whole duration). Without TP overlap the re-gathers are Megatron's asynchronous launches before the
    dgrad GEMM, each hidden under it while the other collectives run exposed. With TP overlap they are
    among the overlapped collectives (Transformer Engine's userbuffer overlap runs the backward's
    all-gather of the input beside the dgrad GEMM: ``ub_bulk_dgrad`` in
    transformer_engine/pytorch/module/layernorm_linear.py), under the one window of the layer's GEMMs:
    the dgrad GEMM hides one stream, not two (priced apart, a faster GPU exposed both).

    Returns ((forward, backward) exposed, (forward, backward) whole durations), the durations split as
    the exposure is, for :func:`tp_data_parallel_window_times`."""
    overlap = np.asarray(getattr(plan, "tp_comm_overlap", False), dtype=bool)
    shared = tp_comm + np.where(overlap, regather_raw, 0.0)
    forward, backward = tp_exposed_by_pass(shared, gemm_forward, full_recompute, plan, backward_extra)
    apart = np.where(overlap, 0.0, 1.0)
    share = tp_pass_share(full_recompute)
    return ((forward, backward + apart * regather),
            (share * shared, (1 - share) * shared + apart * regather_raw))


def tp_pass_share(full_recompute):
    """The forward pass's share of a layer's TP collectives in :func:`tp_exposed_by_pass`."""
    return 1.0 / (3 + np.where(full_recompute, 1, 0))


def tp_shares_data_parallel_links(plan, cluster):
    """Whether the tensor-parallel collectives run over the links the data-parallel ones use: the tp
    group spans nodes (fewer of its ranks on a node than tp: both on the inter-node links), or the
    data-parallel group (dp x cp ranks at stride tp) lies within one node (both on NVLink)."""
    t = np.asarray(plan.tp, dtype=float)
    replicas = np.asarray(plan.dp, dtype=float) * np.asarray(plan.cp, dtype=float)
    tp_across = ranks_per_node(plan.tp, 1, cluster.gpus_per_node) < t
    dp_inside = ranks_per_node(replicas, plan.tp, cluster.gpus_per_node) >= replicas
    return tp_across | dp_inside


def tp_data_parallel_window_times(exposed, raw, shares):
    """(forward, backward) seconds per layer and micro-batch that the tensor-parallel communication
    adds to the windows the data-parallel collectives hide under (dataparallel.dp_step_times), from
    its ``exposed`` and ``raw`` (whole duration, hidden or not) seconds per pass.

    The data-parallel collectives run on their own stream for the whole wall time of a pass: its
    compute and the TP collectives it waits for, exposed ones included, where the two use different
    links (TP on NVLink, data parallelism across nodes: the compute stream waits, the links the gathers
    use are free). Where they share links (``shares``: :func:`tp_shares_data_parallel_links`, a TP group
    across nodes or a data-parallel group inside one) the TP collectives hold them for their whole
    duration, hidden or not, and the data-parallel collectives cannot hide in that time: exposed - raw,
    at most 0, as an inter-node ring-attention exchange's (cpcomm.ring_hidden_on_network). Either way, as a pass's
    GEMMs get faster its window (compute + this) shrinks by no more than the compute saved, whereas
    charging both streams against the compute alone let a faster GPU expose both (issue 64: tp16 cp2 ZeRO-3 with TP overlap, 165.5 -> 184.6 s at
    twice the peak)."""
    return tuple(np.where(shares, e - r, e) for e, r in zip(exposed, raw))


def tp_overlap_assumption(plan, **_) -> tuple[str, ...]:
    """Whether the plan's TP collectives are exposed or overlap their GEMMs (:func:`tp_exposed_time`)."""
    return (TP_OVERLAP_ASSUMPTION if getattr(plan, "tp_comm_overlap", False) else TP_EXPOSED_ASSUMPTION,)


TORCHTITAN_ASYNC_TP_SOURCE = ("[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch, "
                              "discuss.pytorch.org/t/209487 (2024): up to ~29 % forward / ~8 % end-to-end speed-up "
                              "on Llama 3 8B, ~20 % / ~8 % on 70B")


def vocab_parallel_loss_allreduce_time(job, plan, cluster):
    """The cross-entropy over a vocabulary split across tp (Megatron's vocab-parallel cross-entropy,
    the validation harness's too) all-reduces three fp32 values per token: the logits' max, the sum
    of the exponentials and the target's logit. Small messages (4·T bytes), so latency-bound: about
    3 α per micro-batch (microseconds on NVLink, a millisecond each under gloo). 0 with tp = 1."""
    return 3 * tp_collective_time(ALL_REDUCE, 4.0 * tokens_per_rank(job, plan), plan, cluster)
