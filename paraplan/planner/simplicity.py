"""Ties go to the simpler layout: among plans whose step times the estimator cannot tell apart, rank the
plainer, more common one first.

Two plans are a tie when the slower is less than ``TIE_SHARE`` (1.5 %, ``planner_tie_share`` in
``paraplan/data/fitted_constants.yaml``: the best step-time-ratio error the estimator reaches on the
Hagemann et al. 2023 sweep's one-axis pairs) slower than the fastest plan of the search. Among the plans
tied with the fastest, the ranking orders by

1. **complexity**, the sum of :data:`CHOICE_COSTS` over the plan's choices (0: the plain setting every
   engine runs by default; more: what takes extra setup, extra code paths or extra memory traffic to run,
   and fails in more ways),
2. then fewer virtual stages (vpp) and a smaller context-parallel group (cp),
3. then step time (and memory: the search's order).

The number of pipeline stages is not a key: inside the tie the estimator's own order is the better guess.
On the Hagemann et al. 2023 sweep (arXiv:2311.05610; 2k sheets, Scaling, A100) 208 pairs of measured runs
of one setup differ in pp alone (same recomputation) and are predicted within the tie share of each other:
the one with fewer stages ran faster in 24 % of them (median measured ratio 0.945), the one predicted
faster in 57 % (54-59 % on every sheet); preferring fewer stages put the planner's pick among each sheet's
layouts at 0.80 and 0.85 of the best measured run on the two 30B sheets (benchmarks/sweep_memory_picks.py).

Plans outside the tie keep the order of their step times. Written over numpy arrays, so one function
orders a PlanBatch's millions of candidates and a handful of estimated plans alike.
"""
from __future__ import annotations

import numpy as np

from paraplan.constants import fitted
from paraplan.engines import SPECS, engine_codes
from paraplan.modes import CpMode, Mode, Offload, Optimizer, Recompute, Schedule

#: A step-time gap below which two layouts rank as a tie (the estimator's resolution; fitted_constants.yaml)
TIE_SHARE = fitted("planner_tie_share")

#: What a mode's choice adds to a plan's complexity (0: the plain, common setting).
#: schedule: 1F1B is every engine's pipeline schedule; interleaving needs virtual stages and more p2p
#: (Megatron-LM's own); GPipe holds every micro-batch; zero-bubble H1 splits the backward pass, which few
#: codebases run (Qi et al. 2024; Megatron-LM and torchtitan have it behind options); ZBV too, with two
#: V-placed chunks per rank (torchtitan's ZBVZeroBubble); DualPipeV adds overlapped forward-backward
#: chunks (torchtitan), DualPipe two parameter copies and DeepSeek's own runtime.
#: recompute: none is the plain setting; any policy re-runs part of the forward pass.
#: offload: host-memory and PCIe traffic and host RAM per node to provision; NVMe more so.
#: optimizer: the compressed DeepSpeed optimizers change the optimizer's numerics.
CHOICE_COSTS: dict[type[Mode], dict[str, int]] = {
    Schedule: {"1f1b": 0, "interleaved": 1, "gpipe": 1, "zb-h1": 2, "zbv": 2, "dualpipev": 3, "dualpipe": 3},
    Recompute: {"none": 0, "selective": 1, "full": 1, "op-sac": 1},
    Offload: {"none": 0, "cpu": 2, "nvme": 3},
    Optimizer: {"adam": 0, "onebit-adam": 2, "zero-one-adam": 2, "onebit-lamb": 2},
}
#: ZeRO 0 and 1 (replicated or distributed optimizer: each engine's plain data parallelism) cost 0; ZeRO-2/3
#: (sharded gradients / parameters: FSDP-style gathers per layer) 1.
ZERO_COSTS = (0, 0, 1, 1)
#: A context-parallel mode other than the engine's default (the first of its ``EngineSpec.cp_modes``:
#: Megatron-LM's --cp-comm-type p2p, ring) costs 1, only where cp > 1.
CP_MODE_COST = 1
#: Each engine switch turned on, each hand-placed stage split and each module-level recomputation list costs 1.
SWITCH_FIELDS = ("offload_params", "delayed_update", "tp_comm_overlap", "ep_comm_overlap", "moe_flex_dispatch",
                 "fp8_param_gather", "grad_reduce_bf16", "precision_aware_optimizer")
COUNT_FIELDS = ("offload_activation_layers", "first_stage_layers", "last_stage_layers", "recompute_modules_mask")

_FIELD_OF = {Schedule: "schedule_code", Recompute: "recompute_code", Offload: "offload_code",
             Optimizer: "optimizer_code"}
#: cost per code of each mode, in code order
_COST_BY_CODE = {mode: np.array([costs[m.label] for m in mode]) for mode, costs in CHOICE_COSTS.items()}
#: each engine's default context-parallel mode code, by engine code
_DEFAULT_CP_MODE = np.array([int(CpMode.parse(s.cp_modes[0])) if s.cp_modes else int(CpMode.RING) for s in SPECS])


def complexity(plan) -> np.ndarray:
    """The complexity of a Plan or of every plan of a PlanBatch (the attribute names a PlanBatch has):
    the sum of the costs above."""
    total = np.zeros(np.shape(np.asarray(plan.tp)), dtype=int)
    for mode, column in _FIELD_OF.items():
        total = total + _COST_BY_CODE[mode][np.asarray(getattr(plan, column), dtype=int)]
    total = total + np.asarray(ZERO_COSTS)[np.asarray(plan.zero, dtype=int)]
    default_cp = _DEFAULT_CP_MODE[engine_codes(plan)]
    total = total + CP_MODE_COST * ((np.asarray(plan.cp) > 1) & (np.asarray(plan.cp_mode_code) != default_cp))
    for name in SWITCH_FIELDS:
        total = total + np.asarray(getattr(plan, name, False), dtype=bool)
    for name in COUNT_FIELDS:
        total = total + (np.asarray(getattr(plan, name, 0)) > 0)
    return total


def simplicity_order(plan) -> tuple[np.ndarray, ...]:
    """The keys ties are ordered by, most significant first: complexity, vpp, cp."""
    return complexity(plan), np.asarray(plan.vpp), np.asarray(plan.cp)


def tie_limit(fastest_step_s: float) -> float:
    """The slowest step time still a tie with ``fastest_step_s``: (t - fastest) / t < TIE_SHARE."""
    return fastest_step_s / (1.0 - TIE_SHARE)


def ties_first_simplest(ranked: np.ndarray, step: np.ndarray, batch) -> np.ndarray:
    """``ranked`` (candidate indices of ``batch``, fastest first) with the candidates tied with the fastest
    reordered simplest first (then by their position in ``ranked``); the rest as they were."""
    if len(ranked) == 0:
        return ranked
    tied = step[ranked] < tie_limit(step[ranked[0]])
    n = int(np.argmin(tied)) if not tied.all() else len(ranked)   # ranked is by step: the ties are a prefix
    head = ranked[:n]
    view = batch.take(head)
    keys = simplicity_order(view)
    order = np.lexsort((np.arange(n),) + tuple(reversed(keys)))
    return np.concatenate([head[order], ranked[n:]])


def prefer_simpler(estimates: list) -> list:
    """Estimates sorted by step time, with those tied with the fastest put simplest first."""
    if not estimates:
        return estimates
    limit = tie_limit(estimates[0].step_time_s)
    tied = [e for e in estimates if e.step_time_s < limit]
    rest = [e for e in estimates if e.step_time_s >= limit]
    tied.sort(key=lambda e: tuple(int(k) for k in simplicity_order(e.plan)) + (e.step_time_s,))
    return tied + rest


def _choice_text(plan) -> list[str]:
    """The plan's choices that cost something, as 'zb-h1 2' items."""
    out = []
    for mode, column in _FIELD_OF.items():
        cost = int(_COST_BY_CODE[mode][int(getattr(plan, column))])
        if cost:
            out.append(f"{getattr(plan, column.removesuffix('_code'))} {cost}")
    if ZERO_COSTS[plan.zero]:
        out.append(f"ZeRO-{plan.zero} {ZERO_COSTS[plan.zero]}")
    if plan.cp > 1 and int(plan.cp_mode_code) != int(_DEFAULT_CP_MODE[int(plan.engine_code)]):
        out.append(f"{plan.cp_mode} {CP_MODE_COST}")
    out += [f"{name} 1" for name in SWITCH_FIELDS if getattr(plan, name, False)]
    out += [f"{name.removesuffix('_mask')} 1" for name in COUNT_FIELDS if getattr(plan, name, 0)]
    return out


def describe_complexity(plan) -> str:
    """'complexity 3 (zb-h1 2, selective 1)' or 'complexity 0'."""
    parts = _choice_text(plan)
    return f"complexity {int(complexity(plan))}" + (f" ({', '.join(parts)})" if parts else "")
