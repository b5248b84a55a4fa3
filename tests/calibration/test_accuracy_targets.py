"""The accuracy figures of issue 15 that hold, kept from sliding back: on the seed paper's sweep the
predicted MFU, in the sheets' own FLOP convention, within 10 % MAPE with Spearman >= 0.9; the 90 %
prediction interval covering >= 85 % of the calibration rows when each source is left out of its fit.
(The per-generation throughput bias targets do not hold yet; benchmarks/accuracy.py prints them.)"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from paraplan.calibration import DEFAULT_CSV, H100_CSV
from paraplan.calibration.sweep import SWEEP_SKIP_REASON, sweep_available

SWEEP = sweep_available()

pytestmark = pytest.mark.skipif(SWEEP is None, reason=SWEEP_SKIP_REASON)


@pytest.fixture(scope="module")
def scored():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import accuracy
    df, sweep, _, _, _ = accuracy.scored_frames(DEFAULT_CSV, H100_CSV, SWEEP)
    return accuracy, df, sweep


def test_sweep_mfu_within_ten_percent_and_ranked(scored):
    accuracy, _, sweep = scored
    assert len(sweep) >= 250                                    # the sweep's runs that fit, all scored
    predicted = accuracy.sweep_mfu_in_sheet_convention(sweep)
    error = predicted / sweep.measured_mfu - 1
    assert error.abs().mean() <= 0.10
    assert accuracy.spearman(predicted, sweep.measured_mfu) >= 0.9
    # the convention matters: the sheets count more FLOPs per step than paraplan's MFU does
    assert (sweep.measured_mfu > sweep.predicted_mfu * sweep.predicted_s / sweep.measured_s).all()


def test_leave_one_source_out_interval_covers_85_percent(scored):
    accuracy, df, _ = scored
    assert df.source.nunique() >= 8 and len(df) >= 400
    _, covered = accuracy.loso_coverage(df)
    assert covered >= 85.0


@pytest.mark.slow
def test_leave_one_source_out_refits_and_stays_within_the_issue_targets(scored):
    """Issue 64: each source predicted with the GEMM levels refitted without it: overall LOSO MAPE <= 12 %,
    every source <= 20 %, and LOSO no better than in-sample overall (a refit that ignored the held-out
    source could not beat the fit that saw it); the widened interval covers >= 88 % of rows held out."""
    accuracy, df, _ = scored
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import loso
    from paraplan.costmodels.intervals import features_of
    lines: list[str] = []
    loso_s = loso.loso_predictions(df, report=lines.append)
    assert any("AT THE GRID EDGE" not in line and "gemm_sustained_fraction" in line for line in lines)
    t = loso.mape_table(df, loso_s).set_index("rows of")
    assert t.loc["OVERALL", "LOSO MAPE %"] <= 12.0
    per_source = t.loc[sorted(df.source.unique()), "LOSO MAPE %"]
    assert (per_source <= 20.0).all(), per_source
    assert t.loc["OVERALL", "LOSO MAPE %"] >= t.loc["OVERALL", "in-sample MAPE %"] - 0.05
    df = df.assign(evidence=[features_of(*x, source=s) for x, s in zip(df.inputs, df.source)])
    log = np.log(loso_s / df.measured_s.to_numpy())
    table = loso.loso_interval_table(df, log, 0.15)
    assert table.covered.mean() >= 0.88 and table.half_width.median() <= 0.25
