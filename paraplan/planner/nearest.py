"""The nearest plans that fit, for a plan whose estimate does not: the same plan with one change (or, where
no single change fits, two), each change one a user makes with a flag, ranked by predicted step time.

The changes tried (:func:`memory_changes`), each only where the plan's engine offers it and
:func:`paraplan.plan.check_plan` accepts the result:

* recomputation heavier than the plan's (the engine's modes);
* a smaller micro-batch (halved down to 1; the global batch stays, so more micro-batches);
* a higher ZeRO stage;
* the engine's memory switches that are off (16-bit gradient buffer, fp8 parameters, the precision-aware
  optimizer, Transformer Engine's cross-entropy) and PyTorch's expandable segments;
* sequence parallelism where tp > 1 runs without it;
* interleaving undone (vpp 1, 1F1B: fewer micro-batches in flight);
* twice the tensor-, pipeline- or context-parallel degree on half the data-parallel ranks (same GPUs);
* optimizer offload to the CPU where the engine runs it.

Where none of these fits, :func:`fastest_fitting_plan` searches every layout of the plan's engine and number
format on the same GPUs (:func:`paraplan.planner.search.search`) and offers the fastest that fits, as the
fields it changes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

from paraplan.costmodels.estimate import estimate
from paraplan.engines import spec_of
from paraplan.errors import ConfigError
from paraplan.plan import Plan, check_plan
from paraplan.planner.search import plan_field_changes, search, with_topology
from paraplan.planner.space import SpaceOptions

#: memory switches tried on where the engine offers them (``EngineSpec.offers``) and the plan has them off
MEMORY_SWITCHES = ("grad_reduce_bf16", "fp8_param_gather", "precision_aware_optimizer", "te_cross_entropy")
#: at most this many single changes are combined in pairs when none fits alone (the ones that save most memory)
PAIRED_CHANGES = 8


@dataclass(frozen=True)
class FittingChange:
    """A change to the plan (plan field -> value) under which its estimate fits, with that estimate's
    step time and memory per GPU."""
    change: tuple[tuple[str, object], ...]
    plan: Plan
    step_time_s: float
    memory_bytes: float


def memory_changes(plan: Plan) -> list[dict]:
    """The single changes tried (module docstring), as plan-field dicts; not yet checked against the
    engine's rules or the model."""
    spec = spec_of(plan)
    out: list[dict] = [{"recompute": m} for m in spec.recompute if m not in ("none", plan.recompute)]
    mb = plan.micro_batch // 2
    while mb >= 1:
        out.append({"micro_batch": mb})
        mb //= 2
    out += [{"zero": z} for z in spec.zero_stages if z > plan.zero]
    out += [{k: True} for k in MEMORY_SWITCHES if spec.offers(k) and not getattr(plan, k)]
    if not plan.expandable_segments:
        out.append({"expandable_segments": True})
    if plan.tp > 1 and not plan.sp:
        out.append({"sp": True})
    if plan.vpp > 1:
        out.append({"vpp": 1, "schedule": "1f1b"})
    if plan.dp % 2 == 0:
        for axis in ("tp", "pp", "cp"):
            out.append({axis: 2 * getattr(plan, axis), "dp": plan.dp // 2}
                       | ({"sp": True} if axis == "tp" else {}))
    if plan.offload == "none":
        out.append({"offload": "cpu"})
    return out


def _fitting(model, job, cluster, plan: Plan, change: dict, topology: dict | None):
    """(the changed plan's estimate, the plan) where the engine's rules and check_plan accept it; None else.
    With ``topology`` (``--network`` / ``--oversubscription``) the changed plan's own groups are placed on the
    fabric, as ``estimate`` places them when the change is typed."""
    try:
        candidate = check_plan(replace(plan, **change), model, job, cluster)
    except ConfigError:
        return None
    placed = with_topology(cluster, candidate, topology) if topology else cluster
    return estimate(model, job, placed, candidate), candidate


def nearest_fitting_plans(model, job, cluster, plan: Plan, limit: int = 3,
                          topology: dict | None = None) -> list[FittingChange]:
    """Up to ``limit`` changed plans whose estimates fit, fastest first: single changes
    (:func:`memory_changes`); where none fits, pairs of the :data:`PAIRED_CHANGES` single changes that save the
    most memory. Empty when nothing tried fits (the planner's search, ``paraplan plan``, looks wider).
    ``cluster`` is the cluster before any fabric placement; ``topology`` places each changed plan."""
    plan = plan.with_dp_for(cluster.num_gpus)
    tried = []
    for change in memory_changes(plan):
        got = _fitting(model, job, cluster, plan, change, topology)
        if got is not None:
            tried.append((change, *got))
    fits = [t for t in tried if t[1].feasible]
    if not fits:
        frugal = sorted(tried, key=lambda t: t[1].memory_bytes_per_gpu["total"])[:PAIRED_CHANGES]
        for (a, _, _), (b, _, _) in combinations(frugal, 2):
            if set(a) & set(b):
                continue
            got = _fitting(model, job, cluster, plan, a | b, topology)
            if got is not None and got[0].feasible:
                fits.append((a | b, *got))
    fits.sort(key=lambda t: (t[1].step_time_s, len(t[0])))
    return [FittingChange(tuple(change.items()), p, e.step_time_s, e.memory_bytes_per_gpu["total"])
            for change, e, p in fits[:limit]]


def fastest_fitting_plan(model, job, cluster, plan: Plan, topology: dict | None = None) -> FittingChange | None:
    """The fastest plan that fits on the same GPUs with the plan's engine and number format (the planner's
    search, its memory limit the whole GPU, re-scored on ``topology`` where given), as the plan fields it
    changes; None where nothing fits."""
    plan = plan.with_dp_for(cluster.num_gpus)
    found = search(model, job, cluster, options=SpaceOptions(fixed={"engine": plan.engine, "dtype": plan.dtype}),
                   top=1, max_memory_fraction=1.0, topology=topology).best
    if found is None:
        return None
    change = tuple((name, new) for name, _, new in plan_field_changes(plan, found.plan))
    return FittingChange(change, found.plan, found.step_time_s, found.memory_bytes_per_gpu["total"])
