"""Pipeline schedules: bubble and step time.

With per-micro-batch stage time t (forward + backward, communication and recomputation included)
and m micro-batches over p stages, a flush-based schedule takes (m + p − 1)·t when stages are
equal; the idle part, the bubble, is (p − 1)·t, i.e. a fraction (p − 1)/m of the ideal
(GPipe and 1F1B, Narayanan et al. 2021 §2.2.1). Interleaving v model chunks per GPU divides it by
v ((p − 1)/(v·m), §2.2.2). ZB-H1 (Qi et al. 2024, arXiv:2401.10241) defers weight gradients to
fill the drain and reaches (p − 1)/(3m) under its T_F = T_B = T_W assumption.
Unequal stages (the LM head on the last): the slowest stage sets the steady-state pace,
T = (m − 1)·t_max + Σ t_i, so extra work on the last stage is paid m times.
"""
from __future__ import annotations

import numpy as np

from paraplan.engines import engine_flag
from paraplan.plan import Schedule


def bubble_factor(plan):
    """Multiplier on the (p − 1)·t bubble: 1 (GPipe, 1F1B), 1/v (interleaved), 1/3 (ZB-H1)."""
    sc = np.asarray(plan.schedule_code)
    v = np.asarray(plan.vpp, dtype=float)
    return np.where(sc == Schedule.INTERLEAVED, 1 / v, np.where(sc == Schedule.ZB_H1, 1 / 3, 1.0))


def bubble_fraction(plan, m):
    """Bubble ÷ ideal compute time: (p − 1)/m · factor."""
    return (np.asarray(plan.pp, dtype=float) - 1) / np.asarray(m, dtype=float) * bubble_factor(plan)


# Scaling and DeepSpeed run their pipelines as lists of instructions executed one after another, each
# transfer a blocking torch.distributed.send or recv that the stage's stream waits for: a stage's timeline
# carries its receive and its send in each direction, where Megatron-LM pairs them in one batched
# isend/irecv (send_forward_recv_backward).
#   Scaling: ParallelModule.train_step (RecvActivation, ForwardPass, SendActivation, RecvGrad, BackwardPass,
#     SendGrad), PipeCommunicator (src/scaling/core/nn/parallel_module/communicator.py at 01b9d21).
#   DeepSpeed: PipelineEngine's TrainSchedule instructions SendActivation, RecvActivation, SendGrad, RecvGrad
#     (deepspeed/runtime/pipe/engine.py at 03f6f75) through deepspeed/runtime/pipe/p2p.py, whose send and
#     recv refuse async_op and call dist.send / dist.recv.
BLOCKING_P2P_TRANSFERS_PER_CROSSING = 2


def pipeline_crossings_on_critical_path(plan, m):
    """Stage-boundary crossings on the critical path per step: each micro-batch crosses every
    model-chunk boundary forward and backward, and (p − 1) more in fill and drain: 2·(m·v + p − 1);
    zero without pipelining."""
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    return np.where(p > 1, 2 * (m * v + p - 1), 0.0)


def p2p_messages_on_critical_path(plan, m):
    """Pipeline transfers on the critical path per step: one per crossing
    (:func:`pipeline_crossings_on_critical_path`), BLOCKING_P2P_TRANSFERS_PER_CROSSING on the engines
    whose send and receive are separate blocking instructions (``Behaviour.blocking_p2p``)."""
    blocking = engine_flag(plan, "blocking_p2p")
    per_crossing = np.where(blocking, BLOCKING_P2P_TRANSFERS_PER_CROSSING, 1.0)
    return pipeline_crossings_on_critical_path(plan, m) * per_crossing


# Megatron-Core's interleaved schedule overlaps its pipeline transfers with compute (``overlap_p2p_comm``:
# Megatron-LM's arguments.py keeps it, on by default, only with virtual stages and turns it off for the
# non-interleaved schedule; NeMo 2's and Megatron-Bridge's comm-overlap configs set it whenever vp > 1):
# each send and receive is posted asynchronously and waited for only when the next model chunk needs it
# (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving), so in the
# steady state a transfer runs while another chunk computes. The 2(p − 1) transfers of fill and drain are
# waited for by an idle stage and stay on the critical path. Its 1F1B batches each send/recv pair and waits
# (batch_p2p_comm), and the generic engine (Megatron-LM 2021's code, the SC21 runs) had no such overlap.
# (``Behaviour.overlapped_p2p``)


def overlapped_p2p_crossings(plan, m):
    """Crossings per step whose transfer overlaps a model chunk's compute: the 2·m·v steady-state ones
    of Megatron-Core's interleaved schedule (the note above; of the 2·(m·v + p − 1) on the critical
    path, :func:`pipeline_crossings_on_critical_path`); 0 for other engines and schedules."""
    on = (engine_flag(plan, "overlapped_p2p")
          & (np.asarray(plan.schedule_code) == Schedule.INTERLEAVED) & (np.asarray(plan.pp) > 1))
    return np.where(on, 2 * np.asarray(m, dtype=float) * np.asarray(plan.vpp, dtype=float), 0.0)


def stage_overlap(plan, m):
    """Share of a pipeline stage's busy time during which another given stage computes too,
    averaged over the ordered pairs of stages (1 without pipelining).

    Slot model of a flush schedule: stage s computes in the m·v slots [s, s + m·v) (v model chunks
    per rank, 1 for GPipe and 1F1B), so stages i and j share max(0, m·v − |i − j|) slots; the
    p(p − 1) ordered pairs at distance d number 2(p − d):

        overlap = Σ_{d=1}^{p−1} 2(p − d) · max(0, m·v − d) / (m·v) / (p(p − 1))

    e.g. p = 2: (m − 1)/m. It is what matters where ranks share compute (a CPU's cores under
    :func:`effective_compute_slowdown`): in the fill and drain a stage computes alone."""
    p = np.asarray(plan.pp, dtype=float)
    mv = np.asarray(m, dtype=float) * np.asarray(plan.vpp, dtype=float)
    total = np.zeros(np.broadcast(p, mv).shape)
    for d in range(1, int(np.max(p))):
        total = total + np.where(p > d, 2 * (p - d) * np.maximum(0.0, mv - d) / mv, 0.0)
    return np.where(p > 1, total / np.maximum(p * (p - 1), 1.0), 1.0)


def effective_compute_slowdown(slowdown, plan, m):
    """The compute slowdown of ranks that share one machine's cores, scaled by how many of the other
    ranks compute at the same moment. ``slowdown`` is measured with every rank busy (the profile's
    contention block: n ranks busy / one alone); a rank's peers in its own stage (tp, cp, dp) are
    busy with it, those of the p − 1 other stages for :func:`stage_overlap` of its time:

        busy_peers = (g − 1) + g (p − 1) · overlap,   g = ranks per stage
        slowdown_eff = 1 + (slowdown − 1) · busy_peers / (g p − 1)

    Without pipelining it is ``slowdown`` unchanged. Measured on the 2-core VM (pp 2, 2
    micro-batches): compute 90.8 ms per rank against 101.0 ms for dp 2 doing the same work."""
    p = np.asarray(plan.pp, dtype=float)
    g = np.asarray(plan.tp, dtype=float) * np.asarray(plan.cp, dtype=float) * np.asarray(plan.dp, dtype=float)
    n = g * p
    busy = (g - 1) + g * (p - 1) * stage_overlap(plan, m)
    share = np.where(n > 1, busy / np.maximum(n - 1, 1.0), 1.0)
    return 1.0 + (np.asarray(slowdown, dtype=float) - 1.0) * share
