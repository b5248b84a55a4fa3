"""What a published run becomes: a case (model, job, cluster, plan, measurement, assumptions), and its score."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import pandas as pd

from paraplan.costmodels.estimate import MEMORY_PRESSURE, estimate
from paraplan.engines import spec_of
from paraplan.hardware.names import system_for_gpu
from paraplan.errors import ConfigError
from paraplan.plan import Plan, check_plan, is_fp8
from paraplan.workloads.transformer import TrainingJob, TransformerModel


@dataclass(frozen=True)
class PublishedRun:
    """A row of a published-run file and the run it describes (its measurement in the subclasses)."""
    row: int
    source: str
    label: str
    model: TransformerModel
    job: TrainingJob
    cluster: object
    plan: Plan


@dataclass(frozen=True)
class CalibrationCase(PublishedRun):
    measured_step_time_s: float
    assumed: tuple[str, ...]


@dataclass(frozen=True)
class MemoryCase(PublishedRun):
    """A row that gives a run's peak memory per GPU (bytes)."""
    measured_bytes: float
    assumed: tuple[str, ...]


def system_of_row_gpu(gpu, exact: Mapping[str, str], assumed: list) -> str | None:
    """The system preset of a row's GPU: the file's own table first (``exact``, its sidecar's gpus),
    else hardware.names.system_for_gpu (its assumption, if any, appended to ``assumed``); None when
    there is none (``assumed`` then ends with the reason, which the caller reports)."""
    if gpu in exact:
        return exact[gpu]
    found = system_for_gpu(str(gpu))
    if isinstance(found, str):
        assumed.append(found)
        return None
    if found.assumption:
        assumed.append(found.assumption)
    return found.preset


#: recomputation modes, lightest first: what a run that does not state its recomputation is tried with
RECOMPUTE_LIGHTEST_FIRST = ("none", "selective", "full")


def say_unstated_vpp(job, plan: Plan, vpp_stated: bool, assumed: list) -> None:
    """Where a pipelined row leaves vpp blank (``vpp_stated`` False), say in ``assumed`` what it is read as,
    with its bubble: 1F1B, whose bubble is (pp - 1)/m of a stage's compute (m micro-batches a step), where the
    engine could also have interleaved (its export names the interleaved schedule, or the generic engine,
    which names none)."""
    if vpp_stated or plan.pp <= 1 or plan.vpp != 1:
        return
    mapping = spec_of(plan).export
    if mapping is not None and "interleaved" not in mapping.schedules:
        return
    m = job.global_batch / (plan.dp * plan.micro_batch)
    assumed.append(f"pipeline schedule 1F1B: vpp not stated, read as 1; its bubble is (pp - 1)/m = {plan.pp - 1}/"
                   f"{m:g} = {100 * (plan.pp - 1) / m:.0f} % of a stage's compute (interleaving v chunks a rank cuts "
                   "it v-fold: fill in vpp if the run interleaved)")


def lightest_fitting(model, job, cluster, plan: Plan, steps, validate: bool = True) -> tuple[Plan, list[str], bool]:
    """The building block of :func:`lightest_fitting_recompute` and :func:`lightest_fitting_settings`:
    ``plan`` as it is when its estimate fits; else the ``steps`` ((plan field, value), lightest first)
    applied one at a time and kept, until the estimate fits. A step that leaves the plan as it is is
    skipped, and with ``validate`` one that the plan's rules or check_plan refuse. Returns (the plan, the steps applied as
    "field = value", whether its estimate fits): the last plan tried when none fits."""
    if estimate(model, job, cluster, plan).feasible:
        return plan, [], True
    tried = []
    for field, value in steps:
        if getattr(plan, field) == value:
            continue
        if validate:
            try:
                candidate = check_plan(replace(plan, **{field: value}), model, job, cluster)
            except ConfigError:
                continue
        else:
            candidate = replace(plan, **{field: value})
        plan = candidate
        tried.append(f"{field} = {value}")
        if estimate(model, job, cluster, plan).feasible:
            return plan, tried, True
    return plan, tried, False


def lightest_fitting_recompute(model, job, cluster, plan: Plan, assumed: list) -> Plan:
    """A row that does not state its recomputation ran, so it fitted: the lightest of none, selective
    and full (:data:`RECOMPUTE_LIGHTEST_FIRST`) whose estimate fits the GPU's memory (full when none
    does), said in ``assumed``."""
    lightest, *heavier = RECOMPUTE_LIGHTEST_FIRST
    plan, _, fits = lightest_fitting(model, job, cluster, replace(plan, recompute=lightest),
                                     [("recompute", m) for m in heavier], validate=False)
    if fits:
        assumed.append(f"recompute = {plan.recompute}: not stated; the lightest recomputation whose estimate fits")
        return plan
    assumed.append("recompute = full: not stated, and no recomputation fits the estimate's memory")
    return replace(plan, recompute="full")


#: memory switches a source may leave unstated, lightest first: each cuts what a GPU holds and none slows the
#: step in the estimate (Megatron-LM's --grad-reduce-in-bf16: main_grad 2 bytes instead of 4; --fp8-param-gather:
#: no 16-bit copy beside the fp8 weight); before them the optimizer states sharded (ZeRO-1, Megatron's
#: distributed optimizer, which NeMo and Megatron-Bridge recipes use), after them recomputation, which costs time
UNSTATED_MEMORY_SWITCHES = ("grad_reduce_bf16", "fp8_param_gather")
#: last, after recomputation: Megatron-Core's precision-aware optimizer, first with fp32 moments (the master
#: weight as its remainder below bf16 weights: Megatron-Bridge's performance scripts for bf16 runs), then with
#: bf16 moments (its DeepSeek-V3 recipe): optimizer states of 10 and 6 bytes a parameter instead of 12. Last
#: although it costs no time: it needs Transformer Engine 1.13 (early 2025), so a run of unknown date is read
#: with it only where nothing older fits
UNSTATED_OPTIMIZER_STEPS = (("precision_aware_optimizer", True), ("optimizer_state_dtype", "bf16"))


def lightest_fitting_settings(model, job, cluster, plan: Plan, stated, assumed: list) -> Plan:
    """A run whose source does not state its memory settings ran, so it fitted: ``plan`` as it is when its
    estimate fits; else, one at a time and keeping each (:func:`lightest_fitting`), the engine's memory
    switches the source leaves unstated (:data:`UNSTATED_MEMORY_SWITCHES`, where the engine offers them and
    the dtype allows), then the recomputation modes heavier than none (:data:`RECOMPUTE_LIGHTEST_FIRST`)
    the engine has where ``recompute`` is unstated, then Megatron-Core's precision-aware optimizer
    (:data:`UNSTATED_OPTIMIZER_STEPS`, where the engine offers it and its rules allow), until the estimate
    fits. ``stated``: the plan fields the source (or the user) names, left as they are. Each change is said in ``assumed``; a plan that fits
    with none of them comes back as the most memory-frugal one tried, said so."""
    spec = spec_of(plan)
    steps = [("zero", 1)] if "zero" not in stated and plan.zero == 0 and 1 in spec.zero_stages else []
    steps += [(k, True) for k in UNSTATED_MEMORY_SWITCHES
             if k not in stated and spec.offers(k) and (k != "fp8_param_gather" or is_fp8(plan.dtype))]
    if "recompute" not in stated:
        steps += [("recompute", m) for m in RECOMPUTE_LIGHTEST_FIRST[1:] if m in spec.recompute]
    if "precision_aware_optimizer" not in stated and spec.offers("precision_aware_optimizer"):
        steps += list(UNSTATED_OPTIMIZER_STEPS)
    plan, tried, fits = lightest_fitting(model, job, cluster, plan, steps)
    if fits and tried:
        assumed.append(f"{', '.join(tried)}: not stated by the source, and the run fitted: the lightest settings "
                       "the engine offers until the estimate fits")
    elif tried:
        assumed.append(f"{', '.join(tried)}: not stated by the source; the estimate does not fit even so")
    return plan


def score(cases, estimate_fn) -> pd.DataFrame:
    """Predicted vs measured step time per case; ``error`` = predicted/measured − 1; the predicted
    memory headroom and whether the estimate flags memory pressure (memory.allocator_pressure_assumption)."""
    rows = []
    for c in cases:
        e = estimate_fn(c.model, c.job, c.cluster, c.plan)
        rows.append({"row": c.row, "source": c.source, "case": c.label, "measured_s": c.measured_step_time_s,
                     "predicted_s": e.step_time_s, "error": e.step_time_s / c.measured_step_time_s - 1,
                     "feasible": e.feasible,
                     "headroom_GiB": e.headroom_bytes / 2**30,
                     "memory_pressure": any(a.startswith(MEMORY_PRESSURE) for a in e.assumptions)})
    return pd.DataFrame(rows)


def mape_by_source(df: pd.DataFrame) -> pd.DataFrame:
    g = df.assign(abs_err=df.error.abs()).groupby("source")
    out = pd.DataFrame({"rows": g.size(), "mape_%": 100 * g.abs_err.mean(), "bias_%": 100 * g.error.mean(),
                        "worst_%": 100 * g.abs_err.max()})
    out.loc["OVERALL"] = [len(df), 100 * df.error.abs().mean(), 100 * df.error.mean(), 100 * df.error.abs().max()]
    return out
