"""Pipeline schedules: bubble and step time.

With per-micro-batch stage time t (forward + backward, communication and recomputation included)
and m micro-batches over p stages, a flush-based schedule takes (m + p − 1)·t when stages are
equal; the idle part, the bubble, is (p − 1)·t, i.e. a fraction (p − 1)/m of the ideal
(GPipe and 1F1B, Narayanan et al. 2021 §2.2.1). Interleaving v model chunks per GPU divides it by
v ((p − 1)/(v·m), §2.2.2). ZB-H1 (Qi et al. 2024, arXiv:2401.10241) defers weight gradients to
fill the drain and reaches (p − 1)/(3m) under its T_F = T_B = T_W assumption.
ZB-H1, ZBV, DualPipe and DualPipeV (:func:`bubble_time`) are priced from the stage's forward F, full
backward B and weight-gradient part W (ZB-H1 (p − 1)(F + B − 2W), which is the (p − 1)/(3m) above at
equal times and wider under recomputation): ZBV (Qi et al. 2024 sec. 6; two chunks per rank in a V) attains ZB-H2's
(p − 1)(F + B − 3W) at half-stage chunks, 0 when T_F = T_B = T_W; DualPipe (DeepSeek-V3 technical
report, arXiv:2412.19437, Table 2; github.com/deepseek-ai/DualPipe README) (p/2 − 1)(F&B + B − 3W)
with two parameter copies and p + 1 micro-batches in flight; DualPipeV, DualPipe cut in half onto p
ranks with two V-placed chunks each (torch.distributed.pipelining ScheduleDualPipeV), the same
formula over 2p half-size chunks. DualPipe's overlap of one micro-batch's forward with another's
backward hides the expert-parallel all-to-all (``paraplan.costmodels.moe.ep_exposed_time``).
Unequal stages (the LM head on the last): the slowest stage sets the steady-state pace,
T = (m − 1)·t_max + Σ t_i, so extra work on the last stage is paid m times: :func:`stage_pace` is
that stage's time per micro-batch by term, which the step pays m times, and :func:`bubble_time` the
(p − 1) idle slots of the largest stage.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.costmodels.kernels import Number, micro_batches
from paraplan.engines import engine_flag
from paraplan.plan import Schedule, StageLayers

FIRST, MIDDLE, LAST = 0, 1, 2       # pipeline stages as StepTerms names them
STAGE_NAMES = ("first", "middle", "last")


#: schedules that place two model chunks on every rank in a V (rank r holds chunks r and 2p − 1 − r):
#: torch.distributed.pipelining's ScheduleZBVZeroBubble and ScheduleDualPipeV ("ZBV requires exactly 2
#: stages per rank"; generate_stage_to_rank_mapping(..., style="v"), torch/distributed/pipelining/
#: schedules.py, PyTorch 2.13)
V_SCHEDULES = (Schedule.ZBV, Schedule.DUALPIPE_V)
#: schedules whose forward of one micro-batch runs beside the backward of another (F&B chunks), which
#: is what hides the expert-parallel all-to-all: DualPipe's _forward_backward_chunk (dualpipe/dualpipe.py
#: at bb214e8) and ScheduleDualPipeV's OVERLAP_F_B actions
OVERLAPPED_FB_SCHEDULES = (Schedule.DUALPIPE, Schedule.DUALPIPE_V)

# The weight-gradient part W of a layer's backward: the weight GEMMs, half the backward's GEMMs, so W is
# about half the backward B (Qi et al. 2024 Table 1: B = sbh(24h + 8s), W = sbh·24h per layer, whose
# ratio tends to 1 when s ≪ 3h; attention's extra 8s·sbh sits in B). Recomputation belongs to B (it runs
# before the input gradient), never to W. A modelling assumption: paraplan does not time W apart.
WEIGHT_GRAD_SHARE_OF_BACKWARD = 0.5


def is_schedule(plan, *schedules):
    """Boolean array: the plan's schedule is one of ``schedules``."""
    sc = np.asarray(plan.schedule_code)
    return np.isin(sc, [int(s) for s in schedules])


def chunks_per_rank(plan):
    """Model chunks one pipeline rank holds: vpp under the interleaved schedule, 2 under ZBV and DualPipeV
    (the V placement) and DualPipe (one stage of each direction's pipeline), 1 otherwise."""
    sc = np.asarray(plan.schedule_code)
    v = np.asarray(plan.vpp, dtype=float)
    two = is_schedule(plan, Schedule.ZBV, Schedule.DUALPIPE, Schedule.DUALPIPE_V)
    return np.where(sc == Schedule.INTERLEAVED, v, np.where(two, 2.0, 1.0))


def parameter_copies(plan):
    """Copies of its stage's parameters a pipeline rank holds: 2 under DualPipe, whose rank r holds stage r
    of the forward-direction pipeline and stage p − 1 − r of the reverse one (DualPipe(modules=(m0, m1)),
    dualpipe/dualpipe.py at bb214e8; "DualPipe requires keeping two copies of the model parameters",
    DeepSeek-V3 technical report sec. 3.2.1; README table: Parameter 2×), with their gradients and
    optimizer states; 1 otherwise (DualPipeV folds the two copies onto one)."""
    return np.where(is_schedule(plan, Schedule.DUALPIPE) & (np.asarray(plan.pp) > 1), 2.0, 1.0)


def bubble_factor(plan):
    """Multiplier on the (p − 1)·t bubble under T_F = T_B = T_W (F = W = B/2 for a full backward B):
    1 (GPipe, 1F1B), 1/v (interleaved), 1/3 (ZB-H1), 0 (ZBV), (p − 2)/(3(p − 1)) (DualPipe,
    (p/2 − 1)(F + 2B − 3W) = (p − 2)·F against (p − 1)·3F), 1/3 (DualPipeV, (p − 1)(F + 2B − 3W)/2).
    :func:`bubble_time` prices the new schedules from the stage's own F, B and W."""
    sc = np.asarray(plan.schedule_code)
    v = np.asarray(plan.vpp, dtype=float)
    p = np.asarray(plan.pp, dtype=float)
    dualpipe = (p - 2) / np.maximum(3 * (p - 1), 1.0)
    return np.where(sc == Schedule.INTERLEAVED, 1 / v,
                    np.where((sc == Schedule.ZB_H1) | (sc == Schedule.DUALPIPE_V), 1 / 3,
                             np.where(sc == Schedule.ZBV, 0.0, np.where(sc == Schedule.DUALPIPE, dualpipe, 1.0))))


def bubble_fraction(plan, m):
    """Bubble ÷ ideal compute time: (p − 1)/m · factor."""
    return (np.asarray(plan.pp, dtype=float) - 1) / np.asarray(m, dtype=float) * bubble_factor(plan)


#: the 1F1B / GPipe bubble share of the compute from which deep_pipeline_bubble_assumption prints its line (a
#: reporting threshold: half the compute idle)
LARGE_BUBBLE_FRACTION = 0.5


def deep_pipeline_bubble_assumption(job, plan, **_) -> tuple[str, ...]:
    """Said when a plain 1F1B or GPipe pipeline idles half its compute or more, (p − 1)/m ≥
    LARGE_BUBBLE_FRACTION: a deep pipeline over few micro-batches, as the global batch leaves the largest
    jobs (Llama 3 405B on 16,384 H100: 16 stages over 16 micro-batches a replica, Llama 3 paper arXiv:2407.21783
    Table 4). Runs at that depth interleave (the same paper, sec. 3.3.2: V stages per rank, bubble
    (p − 1)/(V·m)); a published layout that does not state its virtual stages is priced as written."""
    p = int(plan.pp)
    if p <= 1 or not bool(is_schedule(plan, Schedule.ONE_F_ONE_B, Schedule.GPIPE)):
        return ()
    m = float(micro_batches(job, plan))
    share = (p - 1) / max(m, 1.0)
    if share < LARGE_BUBBLE_FRACTION:
        return ()
    return (f"pipeline bubble: {p} stages over {m:.0f} micro-batches idle (p - 1)/m = {100 * share:.0f} % of the "
            f"compute under {Schedule(plan.schedule_code).label}; an interleaved schedule "
            f"with v virtual stages per rank cuts it to (p - 1)/(v m) (--schedule interleaved --vpp v), as the "
            f"published runs at this depth do",)


def layers_time(n, lt):
    """Seconds per micro-batch of ``n`` layers: forward, backward, recomputation, their collectives and
    the MoE host wait (every per-layer term of :func:`paraplan.costmodels.compute.layer_times` the
    step pays; the one sum the stage pace, the bubble and the planner's per-layer costs share)."""
    return (n * (lt["forward"] + lt["backward"]) + n * lt["recompute"] + n * lt["tp_comm"] + n * lt["cp_comm"]
            + n * lt["ep_comm"] + n * lt["moe_host"])


def slowest_stage(sl: StageLayers, p, lt, ht):
    """The stage that sets the pipeline's pace per micro-batch (the slowest stage
    is paid m times): the last (its layers plus the LM head and loss, ties go to it), else the
    largest middle stage, else the first (its layers plus the embedding)."""
    last = layers_time(sl.last, lt) + ht["head"] + ht["tp_comm"]
    middle = layers_time(sl.middle, lt)
    first = layers_time(sl.first, lt) + np.where(np.asarray(p) > 1, ht["embedding"], 0.0)
    return np.where((last >= middle) & (last >= first), LAST, np.where(middle >= first, MIDDLE, FIRST))


@dataclass(frozen=True)
class StagePace:
    """Seconds per micro-batch of the stage that sets the pipeline's pace (:func:`slowest_stage`), by
    term (one entry per plan for a batch of plans): its ``layers`` layers' terms, which
    ``layers_time`` sums, and the head's it holds besides."""
    stage: Number                # FIRST, MIDDLE or LAST
    layers: Number
    compute: Number              # its layers' forward + backward
    recompute: Number
    tp_comm: Number
    cp_comm: Number
    ep_comm: Number
    moe_host: Number             # a host-bound MoE layer's wait for the host
    layers_time: Number          # :func:`layers_time` of its layers
    head_compute: Number         # LM head and loss on the last stage (and the embedding with pp = 1), embedding on the first
    head_tp: Number              # the LM head's tensor-parallel collectives on the last stage
    forward: Number              # its layers' forward
    backward: Number             # their backward and recomputation
    cp_hidden_forward: Number    # the time an inter-node ring-attention exchange holds the links, forward
    cp_hidden_backward: Number   # and backward (cpcomm.ring_hidden_on_network)
    tp_dp_window_forward: Number   # what TP communication adds to the data-parallel windows, forward
    tp_dp_window_backward: Number  # and backward (tpcomm.tp_data_parallel_window_times)


def stage_pace(sl: StageLayers, plan, lt, ht) -> StagePace:
    """The pace-setting stage's terms per micro-batch from the per-layer terms ``lt``
    (:func:`paraplan.costmodels.compute.layer_times`) and the head's ``ht``
    (:func:`paraplan.costmodels.compute.head_times`): each layer term × the stage's layers, plus the
    LM head and loss on the last stage (and the embedding with pp = 1) or the embedding on the first."""
    p = np.asarray(plan.pp, dtype=float)
    slow = slowest_stage(sl, p, lt, ht)
    layers = np.where(slow == LAST, sl.last, np.where(slow == MIDDLE, sl.middle, sl.first))
    recompute = layers * lt["recompute"]
    return StagePace(
        stage=slow, layers=layers, compute=layers * (lt["forward"] + lt["backward"]), recompute=recompute,
        tp_comm=layers * lt["tp_comm"], cp_comm=layers * lt["cp_comm"], ep_comm=layers * lt["ep_comm"],
        moe_host=layers * lt["moe_host"], layers_time=layers_time(layers, lt),
        head_compute=np.where(slow == LAST, ht["head"] + np.where(p == 1, ht["embedding"], 0.0),
                              np.where(slow == FIRST, ht["embedding"], 0.0)),
        head_tp=np.where(slow == LAST, ht["tp_comm"], 0.0),
        forward=layers * lt["forward"], backward=layers * lt["backward"] + recompute,
        cp_hidden_forward=layers * lt["cp_hidden_forward"], cp_hidden_backward=layers * lt["cp_hidden_backward"],
        tp_dp_window_forward=layers * lt["tp_dp_window_forward"],
        tp_dp_window_backward=layers * lt["tp_dp_window_backward"])


def forward_backward_weight(n, lt):
    """(F, B, W) seconds per micro-batch of ``n`` layers: :func:`layers_time` split in proportion to
    the layers' forward and backward (with recomputation) compute, each carrying its share of the
    layers' communication; W is WEIGHT_GRAD_SHARE_OF_BACKWARD of the backward without recomputation."""
    t = layers_time(n, lt)
    f, b, r = np.asarray(lt["forward"]), np.asarray(lt["backward"]), np.asarray(lt["recompute"])
    total = np.maximum(f + b + r, 1e-30)
    forward = t * f / total
    return forward, t - forward, t * WEIGHT_GRAD_SHARE_OF_BACKWARD * b / total


def schedule_bubble(p, sc, f, b, w):
    """Bubble seconds of the schedules priced from F, B, W (forward, full backward, its weight part, of
    the stage per micro-batch) over p ranks; NaN for the others. Each formula from its source:

    * ZB-H1: (p − 1)·(F + B − 2W) (Qi et al. 2024 sec. 2.1, T_F + T_B − T_W with T_B the input gradient;
      DeepSeek-V3 Table 2's ZB1P row), a third of 1F1B's at equal times.
    * ZBV: (p − 1)·max(0, F + B − 3W)/2. ZB-H2's bubble, (p − 1)(T_F + T_B − 2T_W) with T_B the input
      gradient (Qi et al. 2024 sec. 2.2), is (p − 1)(F + B − 3W) with a full B; ZB-V reaches it at half-
      stage chunks (sec. 6: "zero bubble" with ZB-H2's memory at 1F1B's; 0 when T_F = T_B = T_W, the
      sail-sg table "Bubble Rate 0").
    * DualPipe: (p/2 − 1)·max(0, F&B + B − 3W), F&B = F + B: the overlapped pair's compute does not
      shrink, what it hides is communication (DeepSeek-V3 Table 2).
    * DualPipeV: DualPipe on 2p half-size chunks, (p − 1)·max(0, F&B + B − 3W)/2."""
    fb = f + b
    zb_h1 = (p - 1) * np.maximum(0.0, f + b - 2 * w)
    zbv = (p - 1) * np.maximum(0.0, f + b - 3 * w) / 2
    dualpipe = np.maximum(p / 2 - 1, 0.0) * np.maximum(0.0, fb + b - 3 * w)
    dualpipe_v = (p - 1) * np.maximum(0.0, fb + b - 3 * w) / 2
    return np.where(sc == Schedule.ZB_H1, zb_h1,
                    np.where(sc == Schedule.ZBV, zbv, np.where(sc == Schedule.DUALPIPE, dualpipe,
                                                               np.where(sc == Schedule.DUALPIPE_V, dualpipe_v, np.nan))))


def reported_bubble_fraction(plan, m, sl: StageLayers, lt, bubble):
    """The bubble ÷ ideal compute time an estimate reports: :func:`bubble_fraction` for GPipe, 1F1B and
    interleaved; for the schedules priced from F, B and W (:func:`bubble_time`) their ``bubble`` seconds ÷
    (m × the largest stage's :func:`layers_time`), so the share said agrees with the time charged."""
    p = np.asarray(plan.pp, dtype=float)
    fbw = is_schedule(plan, Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPE, Schedule.DUALPIPE_V) & (p > 1)
    ideal = np.asarray(m, dtype=float) * layers_time(sl.largest, lt)
    return np.where(fbw, np.asarray(bubble) / np.maximum(ideal, 1e-30), bubble_fraction(plan, m))


def bubble_time(plan, sl: StageLayers, lt):
    """Seconds per step of the bubble (``pp_bubble``): (p − 1) idle slots of the largest stage's
    layers (:func:`layers_time` of ``sl.largest``) × :func:`bubble_factor`; the zero-bubble schedules
    (ZB-H1, ZBV, DualPipe, DualPipeV) from that stage's F, B and W (:func:`schedule_bubble`), so that
    recomputation, which lengthens B and not W, widens their bubble as it does in the runs."""
    p = np.asarray(plan.pp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    plain = (p - 1) * layers_time(sl.largest, lt) * bubble_factor(plan)
    new = is_schedule(plan, Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPE, Schedule.DUALPIPE_V)
    if not np.any(new):
        return plain
    return np.where(new & (p > 1), schedule_bubble(p, sc, *forward_backward_weight(sl.largest, lt)), plain)


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
    model-chunk boundary forward and backward, and (p − 1) more in fill and drain: 2·(m·v + p − 1),
    v the chunks per rank (:func:`chunks_per_rank`: ZBV's two chunks double the pipeline traffic, the
    sail-sg table's "Pipeline Communication Volume 2x"; DualPipe's two chunks are one stage of each
    direction, each micro-batch crossing p − 1 boundaries as under 1F1B); zero without pipelining."""
    p = np.asarray(plan.pp, dtype=float)
    v = np.where(is_schedule(plan, Schedule.DUALPIPE), 1.0, chunks_per_rank(plan))
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


def effective_compute_slowdown(slowdown, plan, m, busy=1.0):
    """The expected compute slowdown of ranks that share one machine's cores: the slowdown measured
    with every rank busy (the profile's contention block: n ranks busy / one alone) charged for the
    share c of a rank's compute during which the other ranks compute too,

        slowdown_eff = 1 + (slowdown − 1) · c,
        c = busy · ((g − 1) + g (p − 1) · overlap) / (g p − 1),   g = ranks per stage (tp·cp·dp)

    a rank's peers in its own stage run its kernels' schedule (the same busy window), those of the
    p − 1 other stages compute in it for :func:`stage_overlap` of the time (pipeline fill and drain),
    and inside its busy window a peer computes ``busy`` of the time (:func:`compute_busy_share`: the
    rest it waits on collectives and transfers; 1 = always). Measured on the 2-core development
    machine: pp 2 with 2 micro-batches computed 90.8 ms per rank against 101.0 ms for dp 2 doing the
    same work; in a quiet round of validate's model measured compute / predicted with the full
    slowdown (1.9) was 0.97 for dp 2, 0.70 for tp 2 and 0.67 for pp 2, and the traces' share of a
    rank's compute under the other's (``trace.compute_concurrency``) 0.74-0.97, 0.46-0.88 and
    0.36-0.68 (docs/calibrate.md)."""
    p = np.asarray(plan.pp, dtype=float)
    g = np.asarray(plan.tp, dtype=float) * np.asarray(plan.cp, dtype=float) * np.asarray(plan.dp, dtype=float)
    n = g * p
    peers = (g - 1) + g * (p - 1) * stage_overlap(plan, m)
    share = np.where(n > 1, np.clip(busy, 0.0, 1.0) * peers / np.maximum(n - 1, 1.0), 1.0)
    return 1.0 + (np.asarray(slowdown, dtype=float) - 1.0) * share


def compute_busy_share(time: dict, step):
    """Share of a rank's busy window (the step less the pipeline bubble) in which it computes: the
    compute terms (forward and backward, recompute, gradient accumulation, host MoE work, optimizer)
    over ``step − pp_bubble``; the exposed collectives, transfers and offload are waits, in which a
    rank leaves the machine's cores to its peers. ``time``: the estimator's step terms."""
    work = sum(np.asarray(time.get(k, 0.0), dtype=float)
               for k in ("compute", "recompute", "grad_accumulation", "moe_host", "optimizer"))
    window = np.asarray(step, dtype=float) - np.asarray(time.get("pp_bubble", 0.0), dtype=float)
    return np.clip(np.where(window > 0, work / np.where(window > 0, window, 1.0), 1.0), 0.0, 1.0)


def with_stage_concurrency(curves, plan, m, busy=None):
    """``curves`` with their measured compute slowdown of ranks sharing one machine (a profiled CPU:
    ``compute_slowdown`` > 1) replaced by the expected one (:func:`effective_compute_slowdown`:
    pipeline stages compute alone in the fill and drain, and every rank alone while its peers wait
    on communication, ``busy`` of their window computing); unchanged without a slowdown, or
    without pipelining when ``busy`` is not given."""
    slowdown = getattr(curves, "compute_slowdown", 1.0)
    if not np.all(np.asarray(slowdown) > 1.0) or (busy is None and not np.any(np.asarray(plan.pp) > 1)):
        return curves
    return replace(curves, compute_slowdown=effective_compute_slowdown(slowdown, plan, m,
                                                                       1.0 if busy is None else busy))
