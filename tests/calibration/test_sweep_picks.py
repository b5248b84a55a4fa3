"""Issue 64 on the Hagemann et al. 2023 2k sheets (arXiv:2311.05610; read from PARAPLAN_SWEEP_CSV, not shipped):
false fits and false OOMs at most 5 % of the OOM runs / of the runs that ran, by the estimate's verdict and by
the planner's, and the planner's pick among each setup's measured layouts (ranked as ``paraplan plan`` ranks:
step time, ties to the simpler layout, its memory limit) within 5 % of the setup's best measured run, for
--rank-by median and p10 (benchmarks/sweep_memory_picks.py prints the tables)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from paraplan.calibration.sweep import SWEEP_SKIP_REASON, sweep_available

SWEEP = sweep_available()

pytestmark = pytest.mark.skipif(SWEEP is None, reason=SWEEP_SKIP_REASON)


@pytest.fixture(scope="module")
def judged():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import sweep_memory_picks
    runs = sweep_memory_picks.judge_runs(pd.read_csv(SWEEP))
    return sweep_memory_picks, runs, sweep_memory_picks.frame(runs)


@pytest.mark.parametrize("verdict", ["fits_estimate", "fits_planner"])
def test_false_fits_and_false_ooms_at_most_five_percent(judged, verdict):
    bench, _, df = judged
    total = bench.fit_table(df, verdict).set_index("setup").loc["ALL"]
    assert total.runs == 522 and total.oom == 259 and total.ran == 263
    assert total["false_fit_%"] <= 5.0 and total["false_oom_%"] <= 5.0


def test_the_planners_pick_is_within_five_percent_of_the_best_measured_run_in_every_setup(judged):
    bench, runs, _ = judged
    picks = bench.picks(runs)
    assert len(picks) == 5                        # one setup per sheet: model x GPUs x sequence x global batch
    for rank_by in ("median", "p10"):
        assert (picks[f"{rank_by}/best"] >= bench.WITHIN).all(), picks[["setup", f"{rank_by}_pick", f"{rank_by}/best"]]
    assert not picks.median_pick.str.contains("OOM").any()


def test_a_five_percent_margin_would_put_the_best_runs_out_of_reach(judged):
    """The sweep's fastest runs are memory-tight: at the old default share (0.95) the pick misses the best
    measured run by more than 5 % on the 13B sheets, and false OOMs pass 5 %."""
    bench, runs, _ = judged
    picks = bench.picks(runs, fraction=0.95)
    assert (picks["median/best"] < bench.WITHIN).sum() >= 2
    total = bench.fit_table(bench.frame(runs, fraction=0.95), "fits_planner").set_index("setup").loc["ALL"]
    assert total["false_oom_%"] > 5.0
