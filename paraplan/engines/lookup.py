"""Per-plan lookups into the engine specs, vectorized: a Plan, a PlanBatch that may mix engines, or any
object with an ``engine_code`` attribute (none: the generic engine).

* :func:`engine_flag` — a :class:`Behaviour` field per plan (what cost models read instead of
  comparing engine codes);
* :func:`engine_offers` — whether each plan's engine implements a switch;
* :func:`engine_select` — evaluate a per-engine function (its model states, its buffers) for every
  engine present and combine the results per plan (np.select on the engine code).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from paraplan.engines.spec import BEHAVIOUR_FIELDS, Engine, EngineSpec
from paraplan.engines.specs import SPECS, SWITCHES

if [s.code for s in SPECS] != [int(e) for e in Engine]:
    raise AssertionError("paraplan.engines.SPECS must hold one spec per Engine, in code order")
SWITCH_FIELDS = frozenset(s.field for s in SWITCHES)
for _spec in SPECS:
    if not _spec.switches <= SWITCH_FIELDS:
        raise AssertionError(f"{_spec.label}: unknown switches {sorted(_spec.switches - SWITCH_FIELDS)}")


def engine_codes(plan):
    """The plan's Engine code(s) as an array (generic for an object without one)."""
    return np.asarray(getattr(plan, "engine_code", int(Engine.GENERIC)))


def spec_of(plan) -> EngineSpec:
    """The spec of one plan's engine (a Plan, or a one-plan view)."""
    return SPECS[int(engine_codes(plan))]


def spec_named(label: str | None) -> EngineSpec:
    """The spec of the engine a label names (``--engine``, a plan file's ``engine``); the default
    engine, generic, for None. ConfigError naming ``engine`` for an unknown label."""
    return SPECS[int(Engine.parse(label if label is not None else Engine.GENERIC.label))]


@lru_cache(maxsize=None)
def _flag_table(name: str) -> np.ndarray:
    if name not in BEHAVIOUR_FIELDS:
        raise KeyError(f"no engine behaviour {name!r}; known: {', '.join(sorted(BEHAVIOUR_FIELDS))}")
    return np.array([getattr(s.behaviour, name) for s in SPECS])


def engine_flag(plan, name: str):
    """The :class:`Behaviour` field ``name`` of each plan's engine (a numpy array over a batch, a numpy
    scalar for one plan)."""
    return _flag_table(name)[engine_codes(plan)]


def engine_where(plan, predicate: Callable[[EngineSpec], bool]):
    """Per plan: ``predicate`` of its engine's spec (e.g. whether the plan's dtype is among its
    ``behaviour.fp8_tp_gather_dtypes``)."""
    return np.array([bool(predicate(s)) for s in SPECS])[engine_codes(plan)]


@lru_cache(maxsize=None)
def _offers_table(switch: str) -> np.ndarray:
    if switch not in SWITCH_FIELDS:
        raise KeyError(f"no engine switch {switch!r}; known: {', '.join(sorted(SWITCH_FIELDS))}")
    return np.array([s.offers(switch) for s in SPECS])


def engine_offers(plan, switch: str):
    """Whether each plan's engine implements ``switch`` (a :data:`SWITCHES` field)."""
    return _offers_table(switch)[engine_codes(plan)]


def engine_select(plan, compute: Callable[[EngineSpec], tuple]) -> tuple:
    """``compute(spec)`` (a tuple of per-plan values) for the engine of every plan: evaluated once for
    each engine present, then combined per plan with np.select on the engine code; with one engine
    present its result as it is (the values are those of the one formula, element by element)."""
    codes = engine_codes(plan)
    present = [s for s in SPECS if np.any(codes == s.code)] or [SPECS[int(Engine.GENERIC)]]
    if len(present) == 1:
        return tuple(compute(present[0]))
    results = [tuple(compute(s)) for s in present]
    chosen = [codes == s.code for s in present]
    return tuple(np.select(chosen, [r[i] for r in results]) for i in range(len(results[0])))
