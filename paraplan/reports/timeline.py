"""The predicted step as a timeline: per pipeline rank, the forward, backward, weight-gradient and
recomputation of every micro-batch in the order the plan's schedule runs them, the bubble, and one track
per communication kind, laid out from an :class:`~paraplan.costmodels.estimate.Estimate`'s own terms.

How it is laid out (:func:`build_timeline`):

1. *Work per micro-batch.* The estimate prices the stage that sets the pipeline's pace
   (``paraplan.costmodels.pipeline.stage_pace``) and pays it m times, so each of its terms ÷ m is one
   micro-batch's: compute, recomputation, the tp / cp / ep collectives and the MoE host wait. The
   estimate knows compute as one total; the timeline splits it forward : backward = 1 : 2 (the backward
   computes the input and the weight gradients, two GEMMs per forward GEMM; Narayanan et al. 2021 §3.2),
   and under the zero-bubble schedules the weight-gradient part W = WEIGHT_GRAD_SHARE_OF_BACKWARD of
   the backward, the share ``paraplan.costmodels.pipeline`` prices their bubble with. Each collective
   term is split between forward and backward in the same 1 : 2, and drawn after the compute it
   follows (in the run it interleaves with each layer's GEMMs). The timeline's ``notes`` (the trace's
   ``otherData``) say which numbers are the estimate's and which a split of them.
2. *Order.* Every rank runs its operations (F, B, W of each micro-batch on each of its model chunks)
   in the schedule's order: GPipe (all forwards, then all backwards), 1F1B (p − r − 1 warm-up
   forwards, then one forward one backward; without pipelining F0 B0 F1 B1 ...), interleaved
   (Megatron-LM's order over v chunks in groups of p micro-batches), and for ZB-H1, ZBV, DualPipe and
   DualPipeV a list schedule in the schedule's chunk placement (:data:`~paraplan.costmodels.pipeline.
   V_SCHEDULES`, DualPipe's two directions) that runs a ready backward before a forward before a weight
   gradient, with the forwards in flight capped — the shape of those schedules, not the engines' exact
   action lists. An operation starts when its rank is free and its input has finished; an input from
   another rank is received first, a blocking receive (the estimate puts every transfer on the critical
   path), the pace rank's receives together ``pp_comm``. The other ranks hold fewer layers than the pace
   rank (no LM head): under GPipe, 1F1B and interleaved their work per micro-batch is the largest
   stage's without the head, which the estimate's bubble is priced on (pp_bubble ÷ ((p − 1)·factor)).
3. *Fitted to the estimate.* The estimate charges the pipeline's idle time by formula (``pp_bubble``:
   ``paraplan.costmodels.pipeline.bubble_time``), the simulation in 2 by construction. The whole
   timeline is re-timed by one piecewise-linear clock that keeps the pace rank's work as it is and
   stretches (or shrinks) its idle stretches to total ``pp_bubble``. So the pace rank's slices add up to
   the estimate's terms and the pipeline phase lasts exactly what the estimate charges; the other ranks
   keep their order and dependencies, their slices re-timed by the same clock.
   Above MAX_OPERATIONS operations, consecutive micro-batches are drawn in groups (the timeline's notes
   say how many).
4. *The step's tail*, on every rank: unfused gradient accumulation, the exposed data-parallel
   communication (``dp_comm``), the optimizer step and the exposed offload transfers. The hidden part of
   the data-parallel communication (``dp_comm_total_s − dp_comm``: the cost model knows its total, not
   when each bucket runs) is drawn under the last backward passes with ``exposed_s`` 0.

The timeline's length is the estimate's step time, and the pace rank's slices, summed by category
(``exposed_s``), are its ``time_breakdown_s`` (tests/reports/test_timeline.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from paraplan.costmodels.pipeline import WEIGHT_GRAD_SHARE_OF_BACKWARD
from paraplan.errors import ConfigError
from paraplan.modes import Schedule

#: Forward : backward compute per micro-batch, where the cost model prices only their sum: the backward runs two
#: GEMMs (input and weight gradient) per forward GEMM (Narayanan et al. 2021 §3.2, 6 = 2 + 4 FLOPs per
#: parameter and token).
FORWARD_SHARE_OF_COMPUTE = 1 / 3

#: Tracks of one pipeline rank, in the order a viewer lists them: (key, name).
TRACKS = (("compute", "compute: forward, backward, recompute"), ("tp", "tp collectives"),
          ("cp", "cp exchange"), ("ep", "ep all-to-all"), ("moe_host", "MoE host wait"),
          ("pp", "pp send/recv"), ("dp", "dp gradient reduction"), ("offload", "offload (host link)"))
TRACK_NAMES = dict(TRACKS)
#: the communication terms paid per micro-batch, with their tracks
PER_MICRO_BATCH_COMM = (("tp_comm", "tp"), ("cp_comm", "cp"), ("ep_comm", "ep"), ("moe_host", "moe_host"))

SPLIT_NOTE = ("the estimate prices forward + backward compute as one total; split 1:2 here "
              "(FORWARD_SHARE_OF_COMPUTE)")
COMM_SPLIT_NOTE = ("the estimate prices this collective per micro-batch as one total; split forward : backward "
                   "1:2 and drawn after the compute (in the run it interleaves with each layer's GEMMs)")
OTHER_RANK_NOTE = ("laid out in the schedule's order and re-timed by the clock that fits the pace rank to the "
                   "estimate (which prices the pace-setting stage only)")


@dataclass(frozen=True)
class Slice:
    """One bar of the timeline: ``rank`` (pipeline rank), ``track`` (a TRACKS key), seconds from the step's
    start; ``category`` is the estimate's time term it belongs to; ``exposed_s`` how much of it is on the
    critical path (0 for communication hidden under compute)."""
    rank: int
    track: str
    name: str
    category: str
    start_s: float
    dur_s: float
    exposed_s: float
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass(frozen=True)
class Timeline:
    """The predicted step of one plan, laid out (:func:`build_timeline`)."""
    slices: tuple[Slice, ...]
    step_time_s: float
    ranks: int                 # pipeline ranks
    pace_rank: int             # the rank whose slices add up to the estimate's terms
    micro_batches: int
    micro_batch_group: int     # micro-batches drawn as one operation (1 unless there are very many)
    chunks_per_rank: int
    schedule: str              # the plan's schedule, "no pipeline" with pp 1
    title: str                 # model, GPUs, cluster
    plan_line: str             # the plan, its micro-batches and step time
    dp_track_name: str
    notes: tuple[str, ...]

    def by_category(self, rank: int | None = None) -> dict[str, float]:
        """Exposed seconds per category on ``rank`` (the pace rank by default)."""
        rank = self.pace_rank if rank is None else rank
        out: dict[str, float] = {}
        for s in self.slices:
            if s.rank == rank:
                out[s.category] = out.get(s.category, 0.0) + s.exposed_s
        return out


class _Op(NamedTuple):
    kind: str        # "F", "B" or "W"
    mb: int
    chunk: int       # global model chunk index in the micro-batch's path


def _schedule_shape(schedule: Schedule, p: int, v: int, m: int):
    """(chunks per micro-batch path C, rank of (mb, chunk), chunks each rank runs per micro-batch)."""
    if schedule == Schedule.INTERLEAVED and v > 1:
        return p * v, (lambda mb, c: c % p), v
    if schedule in (Schedule.ZBV, Schedule.DUALPIPE_V):
        return 2 * p, (lambda mb, c: c if c < p else 2 * p - 1 - c), 2
    if schedule == Schedule.DUALPIPE:
        half = (m + 1) // 2
        return p, (lambda mb, c: c if mb < half else p - 1 - c), 1
    return p, (lambda mb, c: c), 1


def _ordered_lists(schedule: Schedule, p: int, v: int, m: int) -> list[list[_Op]] | None:
    """Each rank's operations in the schedule's fixed order (GPipe, 1F1B, interleaved); None for the
    schedules laid out by the list scheduler."""
    if schedule == Schedule.GPIPE and p > 1:
        return [[_Op("F", i, r) for i in range(m)] + [_Op("B", i, r) for i in range(m)] for r in range(p)]
    if schedule == Schedule.ONE_F_ONE_B or (schedule == Schedule.INTERLEAVED and v == 1):
        out = []
        for r in range(p):
            w = min(p - r - 1, m)
            ops = [_Op("F", i, r) for i in range(w)]
            for i in range(m - w):
                ops += [_Op("F", w + i, r), _Op("B", i, r)]
            out.append(ops + [_Op("B", i, r) for i in range(m - w, m)])
        return out
    if schedule == Schedule.INTERLEAVED and m % p == 0:
        # Megatron-LM's forward_backward_pipelining_with_interleaving: micro-batches in groups of p, the
        # chunks in turn; (p − r − 1)·2 + (v − 1)·p warm-up forwards (megatron/core/pipeline_parallel/
        # schedules.py, get_model_chunk_id / num_warmup_microbatches)
        total = m * v
        out = []
        for r in range(p):
            def fwd(k, r=r):
                return _Op("F", (k // (p * v)) * p + k % p, ((k // p) % v) * p + r)

            def bwd(k, r=r):
                return _Op("B", (k // (p * v)) * p + k % p, (v - 1 - (k // p) % v) * p + r)
            w = min((p - r - 1) * 2 + (v - 1) * p, total)
            ops = [fwd(k) for k in range(w)]
            for k in range(total - w):
                ops += [fwd(w + k), bwd(k)]
            out.append(ops + [bwd(k) for k in range(total - w, total)])
        return out
    return None


def _in_flight_limit(schedule: Schedule, p: int, r: int, m: int) -> int:
    """Forwards a rank may hold before their backward (activation memory): 1F1B's p − r (ZB-H1 keeps it),
    2p half-size chunks for the V schedules (ZB-V's memory equals 1F1B's, Qi et al. 2024 sec. 6), p + 1
    micro-batches for DualPipe (its README), the interleaved warm-up + 1 otherwise."""
    if schedule == Schedule.ZB_H1:
        return max(p - r, 1)
    if schedule in (Schedule.ZBV, Schedule.DUALPIPE_V):
        return 2 * p
    if schedule == Schedule.DUALPIPE:
        return p + 1
    return 2 * (p - r - 1) + p + 1


def _deps(op: _Op, C: int) -> tuple[_Op, ...]:
    """What an operation waits for: the previous chunk's forward, the next chunk's backward (the last
    chunk's own forward), its own backward for a weight gradient."""
    if op.kind == "F":
        return (_Op("F", op.mb, op.chunk - 1),) if op.chunk > 0 else ()
    if op.kind == "W":
        return (_Op("B", op.mb, op.chunk),)
    return (_Op("B", op.mb, op.chunk + 1),) if op.chunk < C - 1 else (_Op("F", op.mb, C - 1),)


def _simulate(schedule: Schedule, p: int, v: int, m: int, split_w: bool, dur: Callable[[_Op], float]
              ) -> tuple[dict[_Op, tuple[float, float]], Any]:
    """Start and end of every operation: each rank runs its next operation (its fixed order, or the list
    scheduler's pick) once the rank is free and what the operation depends on has finished; ``dur(op)``
    includes the receive of its input from another rank."""
    C, rank_of, _ = _schedule_shape(schedule, p, v, m)
    done: dict[_Op, tuple[float, float]] = {}

    def ready_at(op: _Op) -> float | None:
        t = 0.0
        for d in _deps(op, C):
            if d not in done:
                return None
            t = max(t, done[d][1])
        return t

    free = [0.0] * p
    ordered = _ordered_lists(schedule, p, v, m)
    if ordered is not None:
        pos = [0] * p
        progress = True
        while progress:
            progress = False
            for r in range(p):
                while pos[r] < len(ordered[r]):
                    op = ordered[r][pos[r]]
                    t = ready_at(op)
                    if t is None:
                        break
                    start = max(free[r], t)
                    done[op] = (start, start + dur(op))
                    free[r] = done[op][1]
                    pos[r] += 1
                    progress = True
        if any(pos[r] < len(ordered[r]) for r in range(p)):
            raise ValueError("the schedule's order deadlocks")       # a bug, not the user's input
        return done, rank_of
    return _list_schedule(schedule, p, m, C, rank_of, split_w, dur, ready_at, done), rank_of


def _list_schedule(schedule, p, m, C, rank_of, split_w, dur, ready_at, done):
    """The list scheduler: each rank keeps, per chunk and kind, its next micro-batch; of the operations
    whose inputs are there when the rank is free it runs a backward first, then a forward (under the
    in-flight cap; the last chunk's forward, whose backward follows at once, always), then a weight
    gradient; operations are placed in time order, so every decision sees what has finished. A rank's
    pick is recomputed only when its own state or an input of its next operations changed."""
    kinds = ("B", "F", "W") if split_w else ("B", "F")
    queues: list[dict[tuple[str, int], list[int]]] = [dict() for _ in range(p)]
    for mb in range(m):
        for c in range(C):
            r = rank_of(mb, c)
            for k in kinds:
                queues[r].setdefault((k, c), []).append(mb)
    for r in range(p):
        for q in queues[r].values():
            q.reverse()                              # pop() takes the lowest micro-batch
    limit = [_in_flight_limit(schedule, p, r, m) for r in range(p)]
    in_flight = [0] * p
    free = [0.0] * p
    remaining = sum(len(q) for qs in queues for q in qs.values())
    priority = {"B": 0, "F": 1, "W": 2}

    def pick_of(r):
        cands = []
        for (k, c), q in queues[r].items():
            if not q or (k == "F" and in_flight[r] >= limit[r] and c != C - 1):
                continue
            op = _Op(k, q[-1], c)
            t = ready_at(op)
            if t is not None:
                cands.append((t, op))
        if not cands:
            return None
        t0 = max(free[r], min(t for t, _ in cands))
        return t0, min((op for t, op in cands if t <= t0), key=lambda o: (priority[o.kind], o.mb, -o.chunk))

    picks = [pick_of(r) for r in range(p)]
    while remaining:
        best = min((r for r in range(p) if picks[r] is not None), key=lambda r: picks[r][0], default=None)
        if best is None:           # every rank at its cap waiting for a backward that cannot come: widen
            limit = [x + 1 for x in limit]
            picks = [pick_of(r) for r in range(p)]
            continue
        t0, op = picks[best]
        queues[best][(op.kind, op.chunk)].pop()
        done[op] = (t0, t0 + dur(op))
        free[best] = done[op][1]
        in_flight[best] += 1 if op.kind == "F" else (-1 if op.kind == "B" else 0)
        remaining -= 1
        touched = {best}
        if op.kind == "F" and op.chunk + 1 < C:
            touched.add(rank_of(op.mb, op.chunk + 1))
        if op.kind == "B" and op.chunk > 0:
            touched.add(rank_of(op.mb, op.chunk - 1))
        for r in touched:
            picks[r] = pick_of(r)
    return done


def pace_rank_of(estimate) -> int:
    """The rank that sets the pace, as the estimate picks its stage (``pipeline.slowest_stage``): the last
    stage (it holds the LM head) unless a stage holds more layers, then the first of those. Under the V
    placement and DualPipe the last chunk sits on rank 0, so that rank holds the head."""
    layers = list(estimate.details.get("layers_per_stage") or [1])
    p = int(estimate.plan.pp)
    if p == 1:
        return 0
    last = p - 1
    if max(layers) > layers[-1]:
        return layers.index(max(layers))
    return 0 if int(estimate.plan.schedule_code) in (Schedule.ZBV, Schedule.DUALPIPE_V) else last


def dp_track_name(plan) -> str:
    """What the data-parallel track carries for this plan's ZeRO stage."""
    if int(plan.dp) <= 1 and int(plan.ep) <= 1:
        return "dp (no data parallelism)"
    if int(plan.zero) >= 3:
        return "dp all-gather + reduce-scatter (ZeRO-3)"
    if int(plan.zero) >= 1:
        return "dp reduce-scatter + all-gather"
    return "dp all-reduce"


#: Operations (forward, backward, weight gradient of one micro-batch on one model chunk) a timeline lays out
#: one by one; above it consecutive micro-batches are drawn in groups (a 512-micro-batch step on 8 stages
#: with 2 chunks each under ZBV has 24,576)
MAX_OPERATIONS = 30_000


def micro_batch_group(m: int, chunks: int, kinds: int) -> int:
    """Micro-batches drawn as one operation: 1 while the m·chunks·kinds operations stay within
    MAX_OPERATIONS, else the fewest that bring them within it."""
    return max(1, -(-m * chunks * kinds // MAX_OPERATIONS))


def _other_rank_scale(estimate, schedule: Schedule, p: int, v: int, pace_time: float) -> float:
    """Time per micro-batch of the ranks that do not set the pace, ÷ the pace rank's. The estimate prices
    the bubble of GPipe, 1F1B and interleaved on the largest stage's layers without the LM head,
    (p − 1)·layers_time(largest)·factor (``pipeline.bubble_time``), so that stage's time is
    pp_bubble ÷ ((p − 1)·factor); the zero-bubble schedules' formulas split it in F, B and W and are
    not inverted here (1: the pace rank's time)."""
    if p <= 1 or pace_time <= 0 or schedule not in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED):
        return 1.0
    factor = 1.0 / v if schedule == Schedule.INTERLEAVED else 1.0
    largest = float(estimate.time_breakdown_s["pp_bubble"]) / ((p - 1) * factor)
    return float(min(1.0, max(0.05, largest / pace_time)))


def build_timeline(estimate) -> Timeline:
    """Lay out ``estimate``'s predicted step (module docstring). Raises ConfigError for an estimate with
    no step time."""
    plan = estimate.plan
    t = {k: float(x) for k, x in estimate.time_breakdown_s.items()}
    step = float(estimate.step_time_s)
    if not np.isfinite(step) or step <= 0:
        raise ConfigError("--trace", "the estimate has no step time to lay out")
    p = int(plan.pp)
    m = max(1, int(round(float(estimate.details.get("micro_batches_per_step", 1)))))
    schedule = Schedule(int(plan.schedule_code)) if p > 1 else Schedule.ONE_F_ONE_B
    v = int(plan.vpp) if schedule == Schedule.INTERLEAVED else 1
    split_w = p > 1 and schedule in (Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPE, Schedule.DUALPIPE_V)
    chunks = {Schedule.INTERLEAVED: v, Schedule.ZBV: 2, Schedule.DUALPIPE_V: 2}.get(schedule, 1) * p
    group = micro_batch_group(m, chunks, 3 if split_w else 2)
    n = -(-m // group)                       # the operations' "micro-batches": groups of ``group``
    C, rank_of, per_rank = _schedule_shape(schedule, p, v, n)
    pace = pace_rank_of(estimate)

    def size(g: int) -> int:
        return min(m, (g + 1) * group) - g * group

    # one operation's parts on the pace rank, seconds (one micro-batch's work ÷ the chunks a rank runs of it)
    fwd_c = t["compute"] / m * FORWARD_SHARE_OF_COMPUTE / per_rank
    bwd_c = t["compute"] / m * (1 - FORWARD_SHARE_OF_COMPUTE) / per_rank
    w_c = bwd_c * WEIGHT_GRAD_SHARE_OF_BACKWARD if split_w else 0.0
    comm_f = {term: t[term] / m * FORWARD_SHARE_OF_COMPUTE / per_rank for term, _ in PER_MICRO_BATCH_COMM}
    comm_b = {term: t[term] / m * (1 - FORWARD_SHARE_OF_COMPUTE) / per_rank for term, _ in PER_MICRO_BATCH_COMM}
    base = {
        "F": [("compute", "compute", "forward", fwd_c)] + [(term, tr, term, comm_f[term]) for term, tr in PER_MICRO_BATCH_COMM],
        "B": ([("recompute", "compute", "recompute", t["recompute"] / m / per_rank)]
              + [("compute", "compute", "backward", bwd_c - w_c)]
              + [(term, tr, term, comm_b[term]) for term, tr in PER_MICRO_BATCH_COMM]),
        "W": [("compute", "compute", "weight-grad", w_c)],
    }
    pace_time = sum(x[3] for k in base for x in base[k]) * per_rank
    rho = _other_rank_scale(estimate, schedule, p, v, pace_time)

    def crosses(op: _Op) -> bool:
        return any(rank_of(d.mb, d.chunk) != rank_of(op.mb, op.chunk) for d in _deps(op, C))

    # the pipeline transfers: each input that crosses ranks is received before its operation runs (the
    # estimate puts every crossing on the critical path, p2p.pipeline_p2p_time); the pace rank's receives
    # add up to pp_comm
    pace_receives = sum(1 for g in range(n) for c in range(C) for k in ("F", "B")
                        if rank_of(g, c) == pace and crosses(_Op(k, g, c)))
    recv = t["pp_comm"] / pace_receives if pace_receives else 0.0
    cache: dict[tuple[str, bool, bool, int], list] = {}

    def parts(op: _Op) -> list:
        key = (op.kind, rank_of(op.mb, op.chunk) == pace, crosses(op), size(op.mb))
        if key not in cache:
            scale = (1.0 if key[1] else rho) * key[3]
            lst = [(cat, tr, what, x * scale) for cat, tr, what, x in base[op.kind]]
            cache[key] = ([("pp_comm", "pp", "recv", recv)] if key[2] and recv > 0 else []) + lst
        return cache[key]

    done, rank_of = _simulate(schedule, p, v, n, split_w, lambda op: sum(x[3] for x in parts(op)))
    by_rank: list[list[tuple[float, float, _Op]]] = [[] for _ in range(p)]
    for op, (s, e) in done.items():
        by_rank[rank_of(op.mb, op.chunk)].append((s, e, op))
    for r in range(p):
        by_rank[r].sort(key=lambda x: (x[0], x[1]))
    t_sim = max((e for ops in by_rank for _, e, _ in ops), default=0.0)

    def gaps(r: int) -> list[tuple[float, float]]:
        """Each idle stretch of rank r over [0, t_sim]."""
        out, prev = [], 0.0
        for s, e, _ in by_rank[r]:
            if s > prev + 1e-15:
                out.append((prev, s))
            prev = max(prev, e)
        if t_sim > prev + 1e-15:
            out.append((prev, t_sim))
        return out

    pace_gaps = gaps(pace)
    idle = sum(g1 - g0 for g0, g1 in pace_gaps)
    k_bub = t["pp_bubble"] / idle if idle > 0 else 0.0
    # the clock: the pace rank's work keeps its length, its idle stretches take the estimate's pp_bubble
    xs, ys = [0.0], [0.0]
    for g0, g1 in pace_gaps:
        ys += [ys[-1] + (g0 - xs[-1]), ys[-1] + (g0 - xs[-1]) + (g1 - g0) * k_bub]
        xs += [g0, g1]
    if t_sim > xs[-1]:
        ys.append(ys[-1] + (t_sim - xs[-1]))
        xs.append(t_sim)
    X, Y = np.asarray(xs), np.asarray(ys)

    def clock(x: float) -> float:
        return float(np.interp(x, X, Y))

    slices: list[Slice] = []
    notes = [SPLIT_NOTE, COMM_SPLIT_NOTE]
    if p > 1:
        notes.append(f"rank {pace} sets the pace: its slices add up to the estimate's terms; the others are "
                     + OTHER_RANK_NOTE + "; their work per micro-batch is the pace rank's"
                     + (f" x {rho:.3f} (the largest stage without the LM head, which the bubble is priced on)"
                        if rho != 1.0 else ""))
    if recv > 0:
        notes.append(f"every pipeline transfer is a blocking receive of {recv * 1e6:.1f} us before the operation "
                     "it feeds (pp_comm / the pace rank's receives)")
    for flag, what in (("tp_comm_overlap", "tp collectives overlapped with their GEMMs"),
                       ("ep_comm_overlap", "ep all-to-alls hidden under the neighbouring micro-batch's compute")):
        if getattr(plan, flag, False):
            notes.append(f"{what}: the cost model prices only the exposed part, which is what the {flag.split('_')[0]} "
                         "track shows; the hidden part is not drawn")
    if group > 1:
        notes.append(f"micro-batches drawn in groups of {group} (F0-{group - 1} is the forward of micro-batches 0 to "
                     f"{group - 1}): {m} micro-batches would make more than {MAX_OPERATIONS:,} operations")
    label_chunks = C > p
    names = {"forward": "F", "backward": "B", "weight-grad": "W", "recompute": "R"}

    def mb_label(g: int):
        return g if group == 1 else f"{g * group}-{g * group + size(g) - 1}"

    for r in range(p):
        for s, _e, op in by_rank[r]:
            x = s
            mb = mb_label(op.mb)
            suffix = f"{mb}" + (f".{op.chunk}" if label_chunks else "")
            for cat, track, what, d in parts(op):
                a, b = clock(x), clock(x + d)
                x += d
                if b - a <= 0:
                    continue
                name = (names[what] + suffix if what in names else
                        f"recv {op.kind}{suffix}" if what == "recv" else f"{track} {op.kind}{suffix}")
                args = {"micro_batch": mb, "chunk": op.chunk, "exposed_s": b - a} if label_chunks else \
                    {"micro_batch": mb, "exposed_s": b - a}
                slices.append(Slice(r, track, name, cat, a, b - a, b - a, args))
        for g0, g1 in gaps(r):
            a, b = clock(g0), clock(g1)
            if b - a > 0:
                slices.append(Slice(r, "compute", "bubble", "pp_bubble", a, b - a, b - a, {"exposed_s": b - a}))
    t0 = clock(t_sim)
    extra = [("pp_bubble", "compute", "bubble (schedule formula)", t["pp_bubble"] if idle <= 0 else 0.0,
              "the bubble the estimate's formula charges (pipeline.bubble_time) where this layout leaves none"),
             ("pp_comm", "pp", "pp transfers", t["pp_comm"] if not pace_receives else 0.0,
              "pipeline transfers on the critical path (p2p.pipeline_p2p_time), total only")]
    for term, track, name, d, what in extra:
        if d > 0:
            notes.append(f"{term}: {what}; drawn after the pipeline phase")
            for r in range(p):
                slices.append(Slice(r, track, name, term, t0, d, d, {"exposed_s": d, "what": what}))
            t0 += d
    pipe_end = t0

    # the hidden data-parallel communication: under the last backward passes of each rank
    hidden = max(0.0, float(estimate.details.get("dp_comm_total_s", 0.0)) - t["dp_comm"])
    dp_name = dp_track_name(plan)
    if hidden > 0:
        for r in range(p):
            ends = [clock(e) for s, e, op in by_rank[r] if op.kind in ("B", "W")]
            end = max(ends) if ends else pipe_end
            start = max(0.0, end - hidden)
            slices.append(Slice(r, "dp", f"{dp_name} (hidden)", "dp_comm", start, end - start, 0.0,
                                {"exposed_s": 0.0, "hidden_s": hidden,
                                 "what": "overlapped with the backward: the cost model knows only the hidden total "
                                 "(dp_comm_total_s - dp_comm), not when each bucket runs; drawn under the last "
                                 "backward passes" + ("" if end - start >= hidden - 1e-15 else
                                                      ", clipped at the step's start")}))
    tail = [("grad_accumulation", "compute", "gradient accumulation", "unfused adds of every micro-batch's gradients "
             "(the estimate prices them per step)"),
            ("dp_comm", "dp", f"{dp_name} (exposed)", "the data-parallel communication left after the backward"),
            ("optimizer", "compute", "optimizer step", "the optimizer step on the rank's shard"),
            ("offload", "offload", "offload transfers (exposed)", "host or NVMe transfers on the critical path")]
    for term, track, name, what in tail:
        d = t[term]
        if d <= 0:
            continue
        for r in range(p):
            slices.append(Slice(r, track, name, term, t0, d, d, {"exposed_s": d, "what": what}))
        t0 += d
    title = f"{estimate.model} on {estimate.num_gpus} × {estimate.cluster}"
    plan_line = f"{plan.label()}, {m} micro-batches, step {step * 1e3:.1f} ms"
    return Timeline(slices=tuple(sorted(slices, key=lambda s: (s.rank, s.start_s, s.track))), step_time_s=step,
                    ranks=p, pace_rank=pace, micro_batches=m, micro_batch_group=group, chunks_per_rank=per_rank,
                    schedule=str(plan.schedule) if p > 1 else "no pipeline", title=title, plan_line=plan_line,
                    dp_track_name=dp_name,
                    notes=tuple(notes))
