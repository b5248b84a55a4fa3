"""What a published run becomes: a case (model, job, cluster, plan, measurement, assumptions), and its score."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import pandas as pd

from paraplan.costmodels.estimate import MEMORY_PRESSURE, estimate
from paraplan.hardware.names import system_for_gpu
from paraplan.plan import Plan
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


def lightest_fitting_recompute(model, job, cluster, plan: Plan, assumed: list) -> Plan:
    """A row that does not state its recomputation ran, so it fitted: the lightest of none, selective
    and full whose estimate fits the GPU's memory (full when none does), said in ``assumed``."""
    for mode in ("none", "selective", "full"):
        candidate = replace(plan, recompute=mode)
        if estimate(model, job, cluster, candidate).feasible:
            assumed.append(f"recompute = {mode}: not stated; the lightest recomputation whose estimate fits")
            return candidate
    assumed.append("recompute = full: not stated, and no recomputation fits the estimate's memory")
    return replace(plan, recompute="full")


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
