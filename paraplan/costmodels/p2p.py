"""Pipeline-parallel transfers: the send/recv of a stage's boundary activation per tp rank
(:func:`p2p_time`), DeepSpeed's receive-side all-gather (:func:`p2p_receive_gather_time`), and the
seconds per step of those on the critical path (:func:`pipeline_p2p_time`, ``pp_comm``), counted by
:mod:`paraplan.costmodels.pipeline`'s schedules; :func:`pipeline_transfer_assumption` says which.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.comm import ALL_GATHER, SEND_RECV, ring_time
from paraplan.costmodels.kernels import element_bytes, tokens_per_rank
from paraplan.costmodels.pipeline import (overlapped_p2p_crossings, p2p_messages_on_critical_path,
                                          pipeline_crossings_on_critical_path)
from paraplan.costmodels.tpcomm import TP_OVERLAP_CONTENTION, tp_collective_time
from paraplan.engines import engine_flag

# A transfer that overlaps compute slows it as a data-parallel or tensor-parallel collective does
# (dataparallel.OVERLAP_CONTENTION, tpcomm.TP_OVERLAP_CONTENTION: one fitted figure)
P2P_OVERLAP_CONTENTION = TP_OVERLAP_CONTENTION


def stage_output_bytes(model, job, plan):
    """Bytes of the boundary activation b·(s/cp)·h one tp rank of a stage returns (a sequence shard,
    ÷ tp, under sequence parallelism)."""
    T = tokens_per_rank(job, plan)
    return T * model.hidden * element_bytes(plan) / np.where(np.asarray(plan.sp, dtype=bool), np.asarray(plan.tp, dtype=float), 1.0)


def p2p_time(model, job, plan, cluster):
    """One pipeline send/recv of a micro-batch's boundary activation, per tp rank (intra-node only
    when the whole pipeline fits in a node):

    * generic: the replicated output split over tp (Megatron-LM 2021's scatter-gather optimisation, the
      code of the published 2021 runs); under sequence parallelism the output is a sequence shard already;
    * Megatron-LM today (Megatron-Core) sends each stage's output as it is: schedules.get_tensor_shapes
      divides the sequence by tp only under sequence parallelism and p2p_communication has no
      scatter-gather (megatron/core/pipeline_parallel at NVIDIA/Megatron-LM 00c2c0a), so without sequence
      parallelism every tp rank sends the whole replicated activation;
    * Scaling likewise (PipeCommunicator.send_data, src/scaling/core/nn/parallel_module/communicator.py
      at 01b9d21);
    * DeepSpeed's PipelineEngine partitions what it sends over the tp group (``pipe_partitioned`` and
      ``grad_partitioned``, on by default with tp > 1: deepspeed/runtime/pipe/engine.py at 03f6f75,
      PartitionedTensor) and the receiver gathers it back (:func:`p2p_receive_gather_time`)."""
    out = stage_output_bytes(model, job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    as_it_is = engine_flag(plan, "p2p_sends_whole_output")
    partitioned = engine_flag(plan, "p2p_partitions_over_tp")
    size = np.where(as_it_is, out, np.where(partitioned, out / t, np.where(sp, out, out / t)))
    span = np.asarray(plan.tp) * plan.cp * plan.dp * plan.pp
    inside = span <= cluster.gpus_per_node
    intra, inter = cluster.links("pp")
    return np.where(inside, ring_time(SEND_RECV, size, 2, intra), ring_time(SEND_RECV, size, 2, inter))


def p2p_receive_gather_time(model, job, plan, cluster):
    """Seconds per crossing a receiving stage spends putting a partitioned transfer back together:
    DeepSpeed's PipelineEngine all-gathers the received activation (forward) or gradient (backward)
    over the tp group (``PartitionedTensor.full()``, deepspeed/runtime/pipe/engine.py at 03f6f75)
    before it can compute; 0 on the other engines and at tp = 1. (Megatron-LM's 2021 scatter-gather
    did the same; it is not priced, as before.)"""
    gathers = engine_flag(plan, "p2p_partitions_over_tp") & (np.asarray(plan.tp) > 1)
    if not np.any(gathers):
        return 0.0
    return np.where(gathers, tp_collective_time(ALL_GATHER, stage_output_bytes(model, job, plan), plan, cluster), 0.0)


def pipeline_p2p_time(model, job, plan, cluster, m, t_micro_fwd, t_micro_bwd):
    """Seconds per step of pipeline transfers on the critical path (``pp_comm``): every transfer
    (:func:`~paraplan.costmodels.pipeline.p2p_messages_on_critical_path`) at :func:`p2p_time` P, and
    DeepSpeed's receive-side gathers, except the steady-state crossings Megatron-Core's interleaved
    schedule overlaps (:func:`~paraplan.costmodels.pipeline.overlapped_p2p_crossings`, 2·m·v). There each
    iteration runs one model chunk's forward and one's backward, W = (t_micro_fwd + t_micro_bwd) / v
    (``t_micro_bwd`` with recomputation and, from the caller, a host-bound MoE layer's wait for the host,
    when the links are free, as for the data-parallel windows), while its two transfers (an activation to
    the next stage, a gradient to the previous one, on different links) run beside it: the iteration takes
    max(W, P) and each transfer's hidden part slows the compute by P2P_OVERLAP_CONTENTION of its duration
    (as a data-parallel collective's does), so m·v · (max(0, P − W) + 2·P2P_OVERLAP_CONTENTION·min(P, W))
    shows."""
    p2p = p2p_time(model, job, plan, cluster)
    iterations = overlapped_p2p_crossings(plan, m) / 2
    window = (t_micro_fwd + t_micro_bwd) / np.asarray(plan.vpp, dtype=float)
    overlapped = iterations * (np.maximum(0.0, p2p - window) + 2 * P2P_OVERLAP_CONTENTION * np.minimum(p2p, window))
    return ((p2p_messages_on_critical_path(plan, m) - 2 * iterations) * p2p + overlapped
            + pipeline_crossings_on_critical_path(plan, m) * p2p_receive_gather_time(model, job, plan, cluster))


def pipeline_transfer_assumption(plan, **_) -> tuple[str, ...]:
    """How a pipelined plan's stage-to-stage transfers are priced (:func:`pipeline_p2p_time`)."""
    if plan.pp <= 1:
        return ()
    if float(overlapped_p2p_crossings(plan, 1)) > 0:
        return ("pipeline transfers: the interleaved schedule's steady-state sends and receives overlap the next "
                "model chunks' compute (Megatron-Core overlap_p2p_comm, on with virtual stages); fill and drain "
                "transfers are exposed",)
    return ("pipeline transfers: every send and receive between stages is on the critical path (no overlap with "
            "compute in this engine and schedule)",)
