r"""Integer programs for pipeline layouts: stage partitioning and per-stage recomputation.

Both problems are solved with pulp and its bundled CBC. Building the model and solving it are
separate functions so that the model can be printed, written out (``problem.writeLP``) or changed
before it is solved. Stages are numbered from 0 (the stage that holds the embedding).

1. Stage partitioning (``build_partition_ilp`` / ``solve_partition_ilp``; ``partition_stages``)
----------------------------------------------------------------------------------------------
Data: layers i = 0 … n−1 in model order, each with time t_i (forward + backward seconds per
micro-batch), model-state bytes w_i and activation bytes a_i per micro-batch in flight; p stages
s = 0 … p−1; micro-batches in flight k_s (1F1B: k_s = min(m, p − s), Narayanan et al. 2021 §2.2.1;
GPipe: k_s = m); fixed bytes F per GPU (runtime reserve) and a cap C per GPU.

Variables (keyed by (layer, stage) and by nothing):
    y[i, s] ∈ {0, 1}   layer i sits on a stage ≤ s          ("on_or_before")
    T ≥ 0               time of the slowest stage              ("bottleneck")
and the assignment follows from y, x[i, s] = y[i, s] − y[i, s − 1] (with y[i, −1] = 0).

    minimise  T
    s.t.  stage_order_{i}_{s}:  y[i, s] ≤ y[i, s + 1]                  (x ≥ 0: each layer on one stage)
          contiguous_{i}_{s}:   y[i + 1, s] ≤ y[i, s]                  (stage numbers never decrease
                                                                        along the model: contiguity)
          nonempty_stage_{s}:   Σ_i x[i, s] ≥ 1
          time_stage_{s}:       Σ_i t_i·x[i, s] ≤ T
          memory_stage_{s}:     Σ_i (w_i + k_s·a_i)·x[i, s] + F ≤ C
          y[i, p − 1] = 1;  y[i, s] = 1 for s ≥ i and y[i, s] = 0 for s < p − n + i
                                (every stage non-empty forces layer i onto a stage in
                                 [max(0, p − n + i), min(i, p − 1)]; fixed by variable bounds)

That is n·p binaries with 2·n·p monotonicity rows, linear in the problem size, and no big-M. In the
solver the times are divided by the largest layer time and bytes by 2³⁰ (GiB) so coefficients are
O(1); values reported back are recomputed exactly from the chosen boundaries, in seconds and bytes.

``partition_stages_dp`` solves the same problem exactly by dynamic programming over
(stage, first layer of the next stage): f_s(j) = min_{i<j} max(f_{s−1}(i), t(i..j)) over the
segments that fit stage s's memory, O(p·n²) vectorised with numpy. Tests check that both agree
with each other and with brute force. Measured: the ILP proves optimality in well under a second
for p ≤ 4 and n ≈ 10, but at p = 64, n = 130 its LP bound (≈ total time / p) is far below the
optimum and CBC cannot close the gap within a minute, nor find a good split cold. So
``partition_stages`` warm-starts CBC from the DP split by default: the answer is then never worse
than the exact DP optimum, and its status says whether CBC also proved it ("Optimal") or ran
out of time ("Feasible (time limit)"). (A bisection over θ with feasibility ILPs and window cuts
"layers i..e must not share a stage" was tried and was slower still on these sizes.) The planner
(``paraplan.planner.stages``) therefore uses the DP alone: it is exact, takes milliseconds at
p = 64, n = 130 where CBC spent its whole 5 s limit failing to prove the same split, and breaks
ties deterministically (the earliest boundary that reaches the optimum, stage by stage); the ILP
stays the formulation the DP is checked against.

2. Per-stage recomputation (``build_recompute_ilp`` / ``solve_recompute_ilp``; ``plan_recompute``)
---------------------------------------------------------------------------------------------------
Megatron-LM's ``--recompute-granularity full --recompute-method block --recompute-num-layers r``
checkpoints the inputs of the first r transformer layers of a stage and recomputes them in
backward; here r is chosen per stage. Data for stage s: L_s layers, base time b_s (per
micro-batch, no recomputation), added time ρ_s per recomputed layer, static bytes M_s (weights,
optimizer states, reserve), in-flight micro-batches k_s, activation bytes per layer and micro-batch
a_s without and c_s with full recomputation (the stored input), and the cap C.

Variables (keyed by stage):
    r[s] ∈ {0, …, L_s}   layers recomputed on stage s         ("recomputed")
    u[s] ∈ {0, 1}        stage s recomputes anything          ("recomputes")
    T ≥ 0                slowest stage time                   ("bottleneck")

    minimise  T, then (tie-break, second solve with T fixed) Σ_s ρ_s·r[s]
    s.t.  time_stage_{s}:       b_s + ρ_s·r[s] ≤ T
          memory_stage_{s}:     M_s + k_s·(L_s·a_s − (a_s − c_s)·r[s]) + a_s·u[s] ≤ C
          recompute_switch_{s}: r[s] ≤ L_s·u[s]

The a_s·u[s] term is the working set of a rematerialised layer: backward recomputes one layer of
one micro-batch at a time, which needs that layer's full activations once (as in
``costmodels.memory.activation_bytes``). Since r[s] only trades time for memory on its own stage,
the optimum recomputes on each stage the fewest layers that fit; the ILP states that directly and
is checked against enumeration of all r vectors. ``recompute_fewest_that_fit`` is that optimum in
closed form (each stage's smallest r that fits, found by enumerating r = 0 … L_s): the same
bottleneck and the same total added time as the ILP; where recomputing costs no time on a stage
(ρ_s = 0, any r is optimal) it recomputes the fewest layers. The planner uses it; CBC's two solves
in a subprocess cost 0.1-0.2 s for what is a loop over at most p·(L_s + 1) values.

Solver: CBC through ``pulp.COIN_CMD(path=<the CBC pulp bundles>, msg=False, timeLimit=time_limit_s, gapRel=0)``
(pulp 3.3 deprecates ``PULP_CBC_CMD``, the same binary; variables are made by ``prob.add_variable``,
pulp 3.3's replacement of ``LpVariable(...)``); the status is checked
before any value is read. An infeasible request raises ``InfeasiblePlan`` saying which stage
overflows and by how much under the best relaxation we can state.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import pulp

from paraplan.errors import ConfigError, InfeasiblePlan, ParaplanError

PARTITION_SCHEDULES = ("1f1b", "gpipe")
DEFAULT_TIME_LIMIT_S = 60.0
GIB = float(2**30)


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerCost:
    """One layer as the pipeline partitioner sees it (embedding and LM head are layers too).

    time_s: forward + backward seconds per micro-batch; weight_bytes: model-state bytes the layer
    puts on a GPU; activation_bytes: activation bytes per micro-batch in flight.
    """
    name: str
    time_s: float
    weight_bytes: float
    activation_bytes: float

    def __post_init__(self):
        for key in ("time_s", "weight_bytes", "activation_bytes"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"layer {self.name!r} {key}", f"must be a finite number ≥ 0, got {v!r}")


@dataclass(frozen=True)
class PipelineSpec:
    """The pipeline a partition is cut for: stages p, micro-batches m, schedule, memory per GPU."""
    stages: int
    micro_batches: int
    schedule: str = "1f1b"
    memory_cap_bytes: float = math.inf
    fixed_bytes_per_stage: float = 0.0

    def __post_init__(self):
        for key in ("stages", "micro_batches"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(key.replace("_", "-"), f"must be a positive integer, got {v!r}")
        if self.schedule not in PARTITION_SCHEDULES:
            raise ConfigError("schedule", f"unknown value {self.schedule!r}", accepted=", ".join(PARTITION_SCHEDULES))
        if not self.memory_cap_bytes > 0:
            raise ConfigError("memory_cap_bytes", f"must be > 0, got {self.memory_cap_bytes!r}")
        if not (math.isfinite(self.fixed_bytes_per_stage) and self.fixed_bytes_per_stage >= 0):
            raise ConfigError("fixed_bytes_per_stage", f"must be a finite number ≥ 0, got {self.fixed_bytes_per_stage!r}")

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Micro-batches whose activations stage s holds at its peak."""
        return in_flight_per_stage(self.stages, self.micro_batches, self.schedule)


def in_flight_per_stage(p: int, m: int, schedule: str) -> tuple[int, ...]:
    """k_s: 1F1B min(m, p − s) (stage 0 holds the most), GPipe m on every stage."""
    if schedule == "gpipe":
        return (m,) * p
    if schedule == "1f1b":
        return tuple(min(m, p - s) for s in range(p))
    raise ConfigError("schedule", f"unknown value {schedule!r}", accepted=", ".join(PARTITION_SCHEDULES))


@dataclass(frozen=True)
class StagePartition:
    """A contiguous split of the layers into stages; ``boundaries[s]`` is stage s's first layer."""
    boundaries: tuple[int, ...]
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    bottleneck_time_s: float
    status: str
    solve_time_s: float

    def layers_per_stage(self, n_layers: int) -> tuple[int, ...]:
        ends = self.boundaries[1:] + (n_layers,)
        return tuple(e - b for b, e in zip(self.boundaries, ends))


@dataclass(frozen=True)
class StageRecomputeCost:
    """One pipeline stage as the recomputation planner sees it (see the module docstring)."""
    layers: int
    base_time_s: float
    static_bytes: float
    in_flight: int
    activation_bytes_per_layer: float
    recomputed_activation_bytes_per_layer: float
    recompute_time_per_layer_s: float

    def __post_init__(self):
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise ConfigError("layers", f"must be an integer ≥ 0, got {self.layers!r}")
        if isinstance(self.in_flight, bool) or not isinstance(self.in_flight, int) or self.in_flight < 1:
            raise ConfigError("in_flight", f"must be a positive integer, got {self.in_flight!r}")
        for key in ("base_time_s", "static_bytes", "activation_bytes_per_layer",
                    "recomputed_activation_bytes_per_layer", "recompute_time_per_layer_s"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(key, f"must be a finite number ≥ 0, got {v!r}")

    def time_s(self, r: int) -> float:
        """Stage time with r layers recomputed."""
        return self.base_time_s + r * self.recompute_time_per_layer_s

    def memory_bytes(self, r: int) -> float:
        """Peak bytes with r layers recomputed (stored inputs + one rematerialised layer)."""
        a, c, k = self.activation_bytes_per_layer, self.recomputed_activation_bytes_per_layer, self.in_flight
        return self.static_bytes + k * ((self.layers - r) * a + r * c) + (a if r > 0 else 0.0)


@dataclass(frozen=True)
class RecomputePlan:
    """Layers recomputed per stage and what it costs."""
    layers_recomputed: tuple[int, ...]
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    added_time_s: float
    status: str
    solve_time_s: float

    @property
    def bottleneck_time_s(self) -> float:
        return max(self.stage_time_s)


class PartitionModel(NamedTuple):
    """The partition ILP: the problem and its variables keyed by domain objects."""
    problem: pulp.LpProblem
    on_or_before: dict[tuple[int, int], pulp.LpVariable]   # y[layer, stage]
    assign: dict[tuple[int, int], pulp.LpAffineExpression]  # x[layer, stage] = y[i, s] − y[i, s−1]
    bottleneck: pulp.LpVariable                              # T, in units of the largest layer time
    time_unit_s: float


class RecomputeModel(NamedTuple):
    """The recomputation ILP: the problem and its variables keyed by stage."""
    problem: pulp.LpProblem
    recomputed: dict[int, pulp.LpVariable]   # r[stage]
    recomputes: dict[int, pulp.LpVariable]   # u[stage]
    bottleneck: pulp.LpVariable              # T, seconds


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _cbc_path() -> str:
    """The CBC binary bundled with pulp 3 (what the deprecated ``PULP_CBC_CMD`` runs), else ``cbc`` on
    PATH (pulp 4 bundles none: ``pip install 'pulp[cbc]'`` installs it)."""
    bundled = pulp.COIN_CMD.executableExtension(pulp.apis.coin_api.pulp_cbc_path)
    return bundled if os.path.isfile(bundled) else (shutil.which("cbc") or "cbc")


def _cbc(time_limit_s: float, warm_start: bool = False) -> pulp.COIN_CMD:
    return pulp.COIN_CMD(path=_cbc_path(), msg=False, timeLimit=time_limit_s, gapRel=0, warmStart=warm_start)


def _check_layers(layers: Sequence[LayerCost], spec: PipelineSpec) -> None:
    if not layers:
        raise ConfigError("layers", "need at least one layer")
    if len(layers) < spec.stages:
        raise InfeasiblePlan(f"{len(layers)} layers cannot fill {spec.stages} pipeline stages "
                             f"(every stage needs at least one layer): {spec.stages - len(layers)} short")


def _stage_range(i: int, n: int, p: int) -> tuple[int, int]:
    """Stages layer i can sit on when every stage is non-empty: [max(0, p − n + i), min(i, p − 1)]."""
    return max(0, p - n + i), min(i, p - 1)


def _stage_memory(layers: Sequence[LayerCost], lo: int, hi: int, k: int, fixed: float) -> float:
    return math.fsum(l.weight_bytes + k * l.activation_bytes for l in layers[lo:hi]) + fixed


def partition_from_boundaries(layers: Sequence[LayerCost], spec: PipelineSpec, boundaries: Sequence[int],
                              *, status: str = "given", solve_time_s: float = 0.0) -> StagePartition:
    """Exact stage times and memory of a split given by each stage's first layer."""
    n = len(layers)
    b = tuple(int(x) for x in boundaries)
    if len(b) != spec.stages or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:] + (n,))):
        raise ConfigError("boundaries", f"{b} is not a split of {n} layers into {spec.stages} non-empty stages")
    ends = b[1:] + (n,)
    times = tuple(math.fsum(l.time_s for l in layers[lo:hi]) for lo, hi in zip(b, ends))
    mem = tuple(_stage_memory(layers, lo, hi, k, spec.fixed_bytes_per_stage)
                for lo, hi, k in zip(b, ends, spec.in_flight))
    return StagePartition(b, times, mem, max(times), status, solve_time_s)


# --------------------------------------------------------------------------------------------
# 1. stage partitioning: ILP
# --------------------------------------------------------------------------------------------
def _partition_core(layers: Sequence[LayerCost], spec: PipelineSpec, name: str):
    """Variables y, x and the rows shared by both formulations (order, contiguity, non-empty, memory)."""
    _check_layers(layers, spec)
    n, p, F, C = len(layers), spec.stages, spec.fixed_bytes_per_stage, spec.memory_cap_bytes
    k = spec.in_flight
    prob = pulp.LpProblem(name, pulp.LpMinimize)
    y = {}
    for i in range(n):
        first, last = _stage_range(i, n, p)
        for s in range(p):
            fixed = 1 if s >= last else (0 if s < first else None)
            # binary; integer with bounds because pulp's LpBinary would reset fixed bounds to [0, 1]
            y[i, s] = prob.add_variable(f"on_or_before_{i}_{s}", lowBound=0 if fixed is None else fixed,
                                        upBound=1 if fixed is None else fixed, cat=pulp.LpInteger)
    x = {(i, s): (y[i, s] - y[i, s - 1]) if s > 0 else pulp.LpAffineExpression(y[i, 0])
         for i in range(n) for s in range(p)}
    for i in range(n):
        for s in range(p - 1):
            prob += y[i, s] <= y[i, s + 1], f"stage_order_{i}_{s}"
    for i in range(n - 1):
        for s in range(p - 1):
            prob += y[i + 1, s] <= y[i, s], f"contiguous_{i}_{s}"
    for s in range(p):
        prob += pulp.lpSum(x[i, s] for i in range(n)) >= 1, f"nonempty_stage_{s}"
        if math.isfinite(C):
            prob += (pulp.lpSum(((l.weight_bytes + k[s] * l.activation_bytes) / GIB) * x[i, s]
                                for i, l in enumerate(layers)) <= (C - F) / GIB), f"memory_stage_{s}"
    return prob, y, x


def build_partition_ilp(layers: Sequence[LayerCost], spec: PipelineSpec) -> PartitionModel:
    """The min-max stage-partitioning ILP of the module docstring."""
    prob, y, x = _partition_core(layers, spec, "pipeline_stage_partition")
    unit = max(l.time_s for l in layers) or 1.0
    T = prob.add_variable("bottleneck", lowBound=0)
    prob += T, "slowest_stage_time"
    for s in range(spec.stages):
        prob += pulp.lpSum((l.time_s / unit) * x[i, s] for i, l in enumerate(layers)) <= T, f"time_stage_{s}"
    return PartitionModel(prob, y, x, T, unit)


def _set_initial_split(model: PartitionModel, n: int, p: int, split: StagePartition) -> None:
    """Initial values y[i, s] = [layer i on a stage ≤ s] and T for CBC's warm start."""
    stage_of = np.searchsorted(np.asarray(split.boundaries), np.arange(n), side="right") - 1
    for (i, s), var in model.on_or_before.items():
        var.setInitialValue(int(stage_of[i] <= s))
    model.bottleneck.setInitialValue(split.bottleneck_time_s / model.time_unit_s)


def _run_cbc(model: PartitionModel, n: int, p: int, time_limit_s: float,
             warm: bool = False) -> tuple[str, tuple[int, ...] | None]:
    """Solve; return (CBC solution status, boundaries or None). Status is read before any value."""
    model.problem.solve(_cbc(max(time_limit_s, 0.01), warm))
    solution = pulp.LpSolution[model.problem.sol_status]
    if pulp.LpStatus[model.problem.status] == "Infeasible" or solution == "No Solution Exists":
        return "Infeasible", None
    if solution not in ("Optimal Solution Found", "Solution Found"):
        return solution, None
    stage_of = [sum(1 for s in range(p) if model.on_or_before[i, s].value() < 0.5) for i in range(n)]
    return solution, tuple(stage_of.index(s) for s in range(p))


def solve_partition_ilp(model: PartitionModel, layers: Sequence[LayerCost], spec: PipelineSpec,
                        *, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                        warm_start: StagePartition | None = None) -> StagePartition:
    """Solve a model from ``build_partition_ilp`` with CBC; status "Optimal" or "Feasible (time limit)".

    ``warm_start`` (e.g. the DP split) is handed to CBC as its first incumbent.
    """
    start = time.perf_counter()
    if warm_start is not None:
        _set_initial_split(model, len(layers), spec.stages, warm_start)
    solution, bounds = _run_cbc(model, len(layers), spec.stages, time_limit_s, warm_start is not None)
    elapsed = time.perf_counter() - start
    if solution == "Infeasible":
        raise explain_partition_infeasible(layers, spec)
    if bounds is None:
        raise ParaplanError(f"CBC found no stage partition within {time_limit_s:g} s ({solution}); "
                            "raise the time limit or use partition_stages_dp")
    label = "Optimal" if solution == "Optimal Solution Found" else "Feasible (time limit)"
    return partition_from_boundaries(layers, spec, bounds, status=label, solve_time_s=elapsed)


def partition_stages(layers: Sequence[LayerCost], spec: PipelineSpec, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                     warm_start: bool = True) -> StagePartition:
    """Split ``layers`` into ``spec.stages`` contiguous stages minimising the slowest stage (ILP).

    Parameters
    ----------
    layers : ordered layers, embedding first and LM head last.
    spec : stages, micro-batches, schedule ('1f1b' or 'gpipe'), memory cap and fixed bytes per GPU.
    time_limit_s : CBC wall-clock limit; on hitting it the best split found is returned with
        status "Feasible (time limit)".
    warm_start : start CBC from the exact DP split (``partition_stages_dp``). CBC then only has to
        prove it optimal, which at p = 64 usually takes longer than the time limit (the LP bound
        of the min-max objective is weak); the split returned is never worse than the DP one.

    Returns
    -------
    StagePartition

    Raises
    ------
    InfeasiblePlan : no split fits; the message names the stage that overflows and by how much.
    """
    seed = partition_stages_dp(layers, spec) if warm_start else None   # raises InfeasiblePlan itself
    return solve_partition_ilp(build_partition_ilp(layers, spec), layers, spec, time_limit_s=time_limit_s,
                               warm_start=seed)


# --------------------------------------------------------------------------------------------
# 1'. stage partitioning: exact dynamic programme
# --------------------------------------------------------------------------------------------
def _segment_tables(layers: Sequence[LayerCost]):
    """Prefix sums so that segment [i, j) sums are P[j] − P[i] (as (n+1)×(n+1) arrays)."""
    def seg(v):
        P = np.concatenate([[0.0], np.cumsum(np.asarray(v, dtype=float))])
        return P[None, :] - P[:, None]
    return (seg([l.time_s for l in layers]), seg([l.weight_bytes for l in layers]),
            seg([l.activation_bytes for l in layers]))


def _minmax_dp(n: int, p: int, stage_cost) -> tuple[float, tuple[int, ...]]:
    """min over contiguous non-empty splits of max_s stage_cost(s)[i, j] (segment [i, j) on stage s).

    ``stage_cost(s)`` returns an (n+1)×(n+1) array, +inf where the segment is not allowed.
    Returns (optimum, boundaries); optimum is +inf when nothing is allowed.
    """
    idx = np.arange(n + 1)
    valid = idx[:, None] < idx[None, :]                      # non-empty segments i < j
    f = np.full(n + 1, np.inf)
    f[0] = -np.inf                                            # nothing placed yet
    choice = []
    for s in range(p):
        cand = np.maximum(f[:, None], np.where(valid, stage_cost(s), np.inf))
        arg = np.argmin(cand, axis=0)
        f = cand[arg, idx]
        choice.append(arg)
    best = float(f[n])
    if not math.isfinite(best):
        return math.inf, ()
    bounds, j = [], n
    for s in range(p - 1, -1, -1):
        j = int(choice[s][j])
        bounds.append(j)
    return best, tuple(reversed(bounds))


def partition_stages_dp(layers: Sequence[LayerCost], spec: PipelineSpec) -> StagePartition:
    """Same problem as ``partition_stages``, solved exactly by dynamic programming in O(p·n²)."""
    _check_layers(layers, spec)
    start = time.perf_counter()
    t, w, a = _segment_tables(layers)
    k, C, F = spec.in_flight, spec.memory_cap_bytes, spec.fixed_bytes_per_stage
    best, bounds = _minmax_dp(len(layers), spec.stages,
                              lambda s: np.where(w + k[s] * a + F <= C, t, np.inf))
    if not bounds:
        raise explain_partition_infeasible(layers, spec)
    return partition_from_boundaries(layers, spec, bounds, status="Optimal",
                                     solve_time_s=time.perf_counter() - start)


def explain_partition_infeasible(layers: Sequence[LayerCost], spec: PipelineSpec) -> InfeasiblePlan:
    """Why no split fits: stages whose lightest single layer overflows, else the least-overflow split."""
    n, p, k, C, F = len(layers), spec.stages, spec.in_flight, spec.memory_cap_bytes, spec.fixed_bytes_per_stage
    head = (f"no split of {n} layers into {p} stages ({spec.schedule}, m={spec.micro_batches}) fits "
            f"{_gib(C)} per GPU")
    # relaxation 1: each stage holds only its lightest admissible single layer
    lonely = []
    for s in range(p):
        cands = [i for i in range(n) if _stage_range(i, n, p)[0] <= s <= _stage_range(i, n, p)[1]]
        need, i = min((_stage_memory(layers, i, i + 1, k[s], F), i) for i in cands)
        if need > C:
            lonely.append(f"stage {s} needs {_gib(need)} even with one layer ({layers[i].name!r}, "
                          f"{k[s]} micro-batches in flight), over by {_gib(need - C)}")
    if lonely:
        return InfeasiblePlan(f"{head}: " + "; ".join(lonely))
    # relaxation 2 (exact): the split that minimises the largest overflow
    _, w, a = _segment_tables(layers)
    over, bounds = _minmax_dp(n, p, lambda s: w + k[s] * a + F - C)
    part = partition_from_boundaries(layers, spec, bounds)
    ends = bounds[1:] + (n,)
    worst = [s for s in range(p) if part.stage_memory_bytes[s] - C >= over * (1 - 1e-12)]
    parts = [f"stage {s} (layers {layers[bounds[s]].name!r}..{layers[ends[s] - 1].name!r}, {k[s]} micro-batches "
             f"in flight) needs {_gib(part.stage_memory_bytes[s])}" for s in worst]
    return InfeasiblePlan(f"{head}: the split that overflows least, boundaries {bounds}, still has "
                          + "; ".join(parts) + f": over by {_gib(over)}")


# --------------------------------------------------------------------------------------------
# 2. per-stage recomputation
# --------------------------------------------------------------------------------------------
def build_recompute_ilp(stages: Sequence[StageRecomputeCost], memory_cap_bytes: float) -> RecomputeModel:
    """The recomputation ILP of the module docstring, first phase (minimise the slowest stage)."""
    if not stages:
        raise ConfigError("stages", "need at least one stage")
    C = memory_cap_bytes
    prob = pulp.LpProblem("per_stage_recomputation", pulp.LpMinimize)
    r = {s: prob.add_variable(f"recomputed_{s}", lowBound=0, upBound=st.layers, cat=pulp.LpInteger)
         for s, st in enumerate(stages)}
    u = {s: prob.add_variable(f"recomputes_{s}", cat=pulp.LpBinary) for s in range(len(stages))}
    T = prob.add_variable("bottleneck", lowBound=0)
    prob += T, "slowest_stage_time"
    for s, st in enumerate(stages):
        a, c, k, L = (st.activation_bytes_per_layer, st.recomputed_activation_bytes_per_layer,
                      st.in_flight, st.layers)
        prob += st.base_time_s + st.recompute_time_per_layer_s * r[s] <= T, f"time_stage_{s}"
        prob += ((st.static_bytes + k * L * a) / GIB - (k * (a - c) / GIB) * r[s] + (a / GIB) * u[s]
                 <= C / GIB), f"memory_stage_{s}"
        prob += r[s] <= L * u[s], f"recompute_switch_{s}"
    return RecomputeModel(prob, r, u, T)


def solve_recompute_ilp(model: RecomputeModel, stages: Sequence[StageRecomputeCost], memory_cap_bytes: float,
                        *, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> RecomputePlan:
    """Two solves: minimise the slowest stage, then with it fixed the total added time."""
    start = time.perf_counter()
    prob = model.problem
    prob.solve(_cbc(time_limit_s))
    if pulp.LpStatus[prob.status] == "Infeasible":
        raise explain_recompute_infeasible(stages, memory_cap_bytes)
    if pulp.LpStatus[prob.status] != "Optimal":
        raise ParaplanError(f"CBC did not solve the recomputation ILP within {time_limit_s:g} s "
                            f"(status {pulp.LpStatus[prob.status]})")
    bottleneck = model.bottleneck.value()
    first = tuple(int(round(model.recomputed[s].value())) for s in range(len(stages)))
    # phase 2: tie-break on total added time with the bottleneck held; the slack (1e-6 of it) is far
    # below one recomputed layer and above CBC's own feasibility tolerance, which can leave the
    # phase-1 value a hair under what its integer solution reaches
    prob += model.bottleneck <= bottleneck + 1e-6 * max(1.0, abs(bottleneck)), "bottleneck_fixed"
    prob.setObjective(pulp.lpSum(st.recompute_time_per_layer_s * model.recomputed[s] for s, st in enumerate(stages)))
    prob.solve(_cbc(time_limit_s))
    if pulp.LpStatus[prob.status] == "Optimal":
        r = tuple(int(round(model.recomputed[s].value())) for s in range(len(stages)))
    else:   # the phase-1 solution is optimal for the bottleneck; only the tie-break is lost
        r = first
    return recompute_plan_from_counts(stages, r, status="Optimal", solve_time_s=time.perf_counter() - start)


def recompute_plan_from_counts(stages: Sequence[StageRecomputeCost], r: Sequence[int], *, status: str = "given",
                               solve_time_s: float = 0.0) -> RecomputePlan:
    """Exact times and memory for given recompute counts per stage."""
    r = tuple(int(x) for x in r)
    return RecomputePlan(r, tuple(st.time_s(x) for st, x in zip(stages, r)),
                         tuple(st.memory_bytes(x) for st, x in zip(stages, r)),
                         math.fsum(x * st.recompute_time_per_layer_s for st, x in zip(stages, r)),
                         status, solve_time_s)


def plan_recompute(stages: Sequence[StageRecomputeCost], memory_cap_bytes: float,
                   *, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> RecomputePlan:
    """Choose layers to recompute per stage so every stage fits, minimising the slowest stage.

    Parameters
    ----------
    stages : one ``StageRecomputeCost`` per pipeline stage (layers, base time, static bytes,
        in-flight micro-batches, activation bytes per layer without / with recomputation, time to
        recompute one layer).
    memory_cap_bytes : bytes per GPU.
    time_limit_s : CBC wall-clock limit per solve.

    Returns
    -------
    RecomputePlan (ties on the slowest stage broken by the least total added time).

    Raises
    ------
    InfeasiblePlan : even the least memory a stage can reach overflows; says by how much.
    """
    return solve_recompute_ilp(build_recompute_ilp(stages, memory_cap_bytes), stages, memory_cap_bytes,
                               time_limit_s=time_limit_s)


def recompute_fewest_that_fit(stages: Sequence[StageRecomputeCost], memory_cap_bytes: float) -> RecomputePlan:
    """The optimum of the recomputation ILP in closed form: on each stage the fewest recomputed layers
    that fit (``plan_recompute``'s slowest stage and, tie-broken, its least added time).

    A stage's r changes only its own time (non-decreasing in r, ρ_s ≥ 0) and memory, so the slowest stage
    is least when every stage takes its smallest feasible r, and so is the total added time Σ ρ_s·r_s.
    Memory is not monotone in r (r ≥ 1 adds one rematerialised layer), hence the enumeration of
    r = 0 … L_s rather than a formula.

    Raises
    ------
    InfeasiblePlan : some stage fits with no r; says which and by how much (as ``plan_recompute``).
    """
    if not stages:
        raise ConfigError("stages", "need at least one stage")
    start = time.perf_counter()
    r = [next((x for x in range(st.layers + 1) if st.memory_bytes(x) <= memory_cap_bytes), None) for st in stages]
    if None in r:
        raise explain_recompute_infeasible(stages, memory_cap_bytes)
    return recompute_plan_from_counts(stages, r, status="Optimal", solve_time_s=time.perf_counter() - start)


def explain_recompute_infeasible(stages: Sequence[StageRecomputeCost], memory_cap_bytes: float) -> InfeasiblePlan:
    """Stages whose least memory (no or full recomputation; memory is linear in r ≥ 1) overflows."""
    C = memory_cap_bytes
    parts = []
    for s, st in enumerate(stages):
        need, r = min((st.memory_bytes(0), 0), (st.memory_bytes(st.layers), st.layers))
        if need > C:
            how = "even with all" if r == st.layers and r > 0 else "with"
            parts.append(f"stage {s} needs {_gib(need)} {how} {r} of {st.layers} layers recomputed "
                         f"({st.in_flight} micro-batches in flight), over by {_gib(need - C)}")
    return InfeasiblePlan(f"no recomputation fits {_gib(C)} per GPU: " + "; ".join(parts))
