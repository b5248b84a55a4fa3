"""The accuracy figures of issue 15 that hold, kept from sliding back: on the seed paper's sweep the
predicted MFU, in the sheets' own FLOP convention, within 10 % MAPE with Spearman >= 0.9; the 90 %
prediction interval covering >= 85 % of the calibration rows when each source is left out of its fit.
(The per-generation throughput bias targets do not hold yet; benchmarks/accuracy.py prints them.)"""
from __future__ import annotations

import sys
from pathlib import Path

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
