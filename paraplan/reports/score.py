"""Measured runs against paraplan's predictions: ``paraplan score RUNS.csv``.

A runs file has the columns of the published-run files paraplan ships (paraplan/calibration/data/
published_runs_calibration*.csv, described in docs/reference/README.md: model, GPU, GPU count, every
parallel degree, batch, precision, the measured metric and its value); architecture columns may be left
blank for a model paraplan has a preset of. Each row is read by the reader of its hardware generation
(paraplan.calibration: A100 and V100 rows as the A100 file's, the others as the H100/Blackwell file's,
each with its file's recipe sidecar), estimated, and compared:

  throughput error = predicted / measured throughput - 1 = measured step / predicted step - 1
  (> 0: paraplan is optimistic), and whether the measured step lies in the estimate's 90 % interval.

Rows that cannot be read are listed with the reason, never dropped silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from paraplan.calibration import (a100_recipes, case_from_h100_row, case_from_row, cases_of_table, h100_recipes,
                                  read_runs_file, source_name, system_of_row_gpu)
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.intervals import GENERATION
from paraplan.hardware.catalog import load_part

#: generations whose rows read as the A100 file's (GPT-style columns, Megatron-LM / DeepSpeed-era defaults)
A100_FILE_GENERATIONS = ("A100", "V100")


@dataclass(frozen=True)
class Scored:
    """The scored rows (one per readable row) and the skipped ones as (row, source, reason)."""
    rows: pd.DataFrame
    skipped: tuple[tuple[int, str, str], ...]


def generation_of_gpu(gpu) -> str | None:
    """The hardware generation a row's GPU name runs on (intervals.GENERATION), None if it has no preset."""
    system = system_of_row_gpu(gpu, {**a100_recipes().gpu_systems, **h100_recipes().gpu_systems}, [])
    return None if system is None else GENERATION.get(load_part("systems", system).accelerator.name)


def read_case(i: int, row: pd.Series):
    """A row as a calibration case (or the reason it is skipped), by the loader of its generation."""
    if generation_of_gpu(row["gpu"]) in A100_FILE_GENERATIONS:
        return case_from_row(i, row)
    return case_from_h100_row(i, row)


def score_runs(path: Path | str) -> Scored:
    """Every row of a runs file read, estimated and compared (see the module docstring). Raises
    ConfigError when the file cannot be read or lacks a required column."""
    cases, skipped = cases_of_table(read_runs_file(path), read_case, source_name)
    return score_cases(cases, skipped)


def score_cases(cases, skipped=()) -> Scored:
    """Calibration cases (a runs file's, or the runs read from training logs:
    :func:`paraplan.planner.runlogs.case_of`) estimated and compared (the module docstring)."""
    rows = []
    for case in cases:
        e = estimate(case.model, case.job, case.cluster, case.plan)
        measured, predicted = case.measured_step_time_s, e.step_time_s
        low, high = (e.prediction_interval.get("step_time_s") or (math.nan, math.nan))
        rows.append({"row": case.row, "source": case.source, "case": case.label,
                     "generation": GENERATION.get(case.cluster.accelerator.name, case.cluster.accelerator.name),
                     "measured_step_s": measured, "predicted_step_s": predicted,
                     "throughput_error_%": 100 * (measured / predicted - 1),
                     "interval_low_s": low, "interval_high_s": high,
                     "in_interval": bool(low <= measured <= high) if not math.isnan(low) else None,
                     "predicted_mfu_%": 100 * e.mfu, "fits": bool(e.feasible),
                     "not_fit_reason": None if e.feasible else e.infeasible_reason,
                     "assumptions": list(case.assumed)})
    return Scored(pd.DataFrame(rows), tuple(skipped))


def summary(rows: pd.DataFrame, by: str) -> pd.DataFrame:
    """Rows, throughput MAPE, bias, worst error and interval coverage per ``by`` value, and overall."""
    if rows.empty:
        return pd.DataFrame(columns=["rows", "mape_%", "bias_%", "worst_%", "in_interval_%"])

    def stats(d: pd.DataFrame) -> dict:
        err = d["throughput_error_%"]
        judged = d["in_interval"].dropna()
        return {"rows": len(d), "mape_%": err.abs().mean(), "bias_%": err.mean(), "worst_%": err.abs().max(),
                "in_interval_%": 100 * judged.astype(bool).mean() if len(judged) else math.nan}

    out = pd.DataFrame({key: stats(d) for key, d in rows.groupby(by)}).T
    out.loc["OVERALL"] = stats(rows)
    out.index.name = by
    return out.astype({"rows": int})
