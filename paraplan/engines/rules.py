"""The engine rules of ``paraplan.plan.RULES``, generated from the specs: what each engine offers of
the shared choices (ZeRO stages, recomputation, context-parallel modes, fp8 recipes, optimizers),
the switches it implements (:data:`paraplan.engines.specs.SWITCHES`) and its own refusals. Each is an
:class:`EngineRule`: ``bad(P, scene)`` per plan of ``P`` (arrays, or the search's views with one
engine code), ``message(p, scene)`` for one plan; ``paraplan.plan`` makes them Rules (illegal, no
scene) and places them in its table by name.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from paraplan.engines.lookup import engine_codes, engine_offers
from paraplan.engines.spec import EngineSpec, Refusal, Switch
from paraplan.engines.specs import SPECS, SWITCHES
from paraplan.modes import CpMode, Optimizer, Recompute, is_fp8


class EngineRule(NamedTuple):
    """A legality rule about the plan's engine (the fields of ``paraplan.plan.Rule`` it sets)."""
    name: str
    reason: str
    axes: tuple
    bad: Callable[[Any, Any], Any]
    message: Callable[[Any, Any], str]
    field: str
    accepted: str | None = None


def _spec(p) -> EngineSpec:
    """The spec of one plan given as scalars."""
    return SPECS[p.engine_code]


def _either(labels: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]


def _offering(switch: str, named_only: bool = False) -> str:
    """The engines implementing ``switch``: named engines in code order, generic last (or left out)."""
    named = [s.label for s in SPECS if s.offers(switch) and s.codebase is not None]
    generic = [s.label for s in SPECS if s.offers(switch) and s.codebase is None and not named_only]
    return _either(named + generic)


def _table(offered: Callable[[EngineSpec, Any], bool], choices) -> np.ndarray:
    """offered[engine code, choice code]."""
    return np.array([[offered(s, c) for c in choices] for s in SPECS])


# --- choices from a shared set ------------------------------------------------------------------------
_ZERO = _table(lambda s, z: z in s.zero_stages, range(4))
_RECOMPUTE = _table(lambda s, r: r.label in s.recompute, Recompute)
_CP_MODE_REFUSED = _table(lambda s, m: bool(s.cp_modes) and m.label not in s.cp_modes, CpMode)
_OPTIMIZER = _table(lambda s, o: o.label in s.optimizers, Optimizer)


def _fp8_refused(P):
    """Per plan: an fp8 dtype the plan's engine has no recipe for."""
    codes = engine_codes(P)
    if not is_fp8(P.dtype):
        return np.zeros(np.shape(codes), dtype=bool)
    return ~np.array([P.dtype in s.fp8_recipes for s in SPECS])[codes]


CHOICE_RULES = (
    EngineRule("engine-zero-stages", "the engine has no such ZeRO stage", ("engine_code", "zero"),
               lambda P, s: ~_ZERO[engine_codes(P), np.asarray(P.zero)],
               lambda p, s: f"--engine {_spec(p).label} has no ZeRO-{p.zero}: " + _spec(p).zero_note,
               field="zero"),
    EngineRule("engine-cp-mode", "the engine has no such context-parallel mode", ("engine_code", "cp", "cp_mode_code"),
               lambda P, s: (P.cp > 1) & _CP_MODE_REFUSED[engine_codes(P), np.asarray(P.cp_mode_code)],
               lambda p, s: _spec(p).cp_mode_note, field="cp_mode"),
    EngineRule("engine-optimizer", "compressed optimizers are DeepSpeed's", ("engine_code", "optimizer_code"),
               lambda P, s: ~_OPTIMIZER[engine_codes(P), np.asarray(P.optimizer_code)],
               lambda p, s: (f"{Optimizer(p.optimizer_code).label} is DeepSpeed's; --engine {_spec(p).label} runs "
                             f"{', '.join(_spec(p).optimizers)}"),
               field="optimizer",
               accepted=", ".join(o.label for o in Optimizer if all(o.label in s.optimizers for s in SPECS))),
    EngineRule("engine-fp8-recipe", "the engine has no such fp8 recipe", ("engine_code", "dtype"),
               lambda P, s: _fp8_refused(P),
               lambda p, s: (f"--engine {_spec(p).label} has no {p.dtype} recipe; it offers "
                             f"{', '.join(_spec(p).fp8_recipes) or 'no fp8 training of its own'}"),
               field="dtype"),
    EngineRule("engine-recompute", "the engine has no such recomputation policy", ("engine_code", "recompute_code"),
               lambda P, s: ~_RECOMPUTE[engine_codes(P), np.asarray(P.recompute_code)],
               lambda p, s: _spec(p).recompute_note.format(engine=_spec(p).label, offered=", ".join(_spec(p).recompute)),
               field="recompute"),
)


# --- switches ------------------------------------------------------------------------------------------
def switch_rule(sw: Switch) -> EngineRule:
    """The rule refusing ``sw`` on an engine without it (or, with ``sw.requires``, where that fails)."""
    if sw.requires is None:
        def bad(P, s):
            return sw.used(P) & ~engine_offers(P, sw.field)

        def message(p, s):
            return sw.refusal.format(engine=_spec(p).label)
    else:
        def bad(P, s):
            return sw.used(P) & ~(engine_offers(P, sw.field) & sw.requires(P))

        def message(p, s):
            if _spec(p).offers(sw.field):
                return sw.requirement.format(dtype=p.dtype)
            return sw.refusal.format(engine=_spec(p).label)
    accepted = sw.accepted.format(engines=_offering(sw.field), named=_offering(sw.field, named_only=True))
    return EngineRule(sw.rule, sw.reason, ("engine_code", sw.axis, *sw.requires_axes), bad, message, sw.field, accepted)


# --- an engine's own refusals -----------------------------------------------------------------------
def refusal_rule(spec: EngineSpec, refusal: Refusal) -> EngineRule:
    """``refusal`` on the plans that run on ``spec``'s engine."""
    code = spec.code

    def bad(P, s):
        return (engine_codes(P) == code) & refusal.bad(P)
    return EngineRule(refusal.rule, refusal.reason, ("engine_code", *refusal.axes), bad,
                      lambda p, s: refusal.message(p), refusal.field, refusal.accepted)


ENGINE_RULES: dict[str, EngineRule] = {r.name: r for r in (
    *CHOICE_RULES, *(switch_rule(sw) for sw in SWITCHES),
    *(refusal_rule(spec, ref) for spec in SPECS for ref in spec.refusals))}

if len(ENGINE_RULES) != len(CHOICE_RULES) + len(SWITCHES) + sum(len(s.refusals) for s in SPECS):
    raise AssertionError("two engine rules share a name")
