"""benchmarks/planner_optimism.py: the scenario list covers issue 64's named scales, and a row without a
comparable calibration run says so instead of inventing one."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from paraplan.hardware.catalog import load_cluster
from paraplan.workloads.presets import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import planner_optimism as po  # noqa: E402


def test_scenarios_cover_the_named_scales_and_load():
    assert len(po.SCENARIOS) >= 12
    keys = {(name, cl, gpus, seq) for _, name, cl, gpus, seq, _, _ in po.SCENARIOS}
    assert set(po.NAMED) <= keys
    assert len({label for label, *_ in po.SCENARIOS}) == len(po.SCENARIOS)
    for _, name, cl, gpus, _, _, _ in po.SCENARIOS:   # every preset and cluster size is one a user can type
        load_model(name)
        load_cluster(cl, gpus)


def test_row_without_a_comparable_run_and_without_a_plan():
    model, _, best = po.top_plan("llama3-8b", "dgx-h100", 64, 131072, 64, {})
    row = po.scenario_row("128k", model, {}, best, None)
    assert row["published run"] == po.NO_RUN
    assert row["best_published_%"] is None and row["gap_points"] is None and row["why (points)"] == "-"
    assert 0 < row["mfu_%"] < 100 and row["90%_interval"] != "-"
    assert row["extrapolating"] != "-"          # 128k lies outside the calibration rows' sequences
    none = po.scenario_row("none", model, {"dtype": "fp8"}, None, None)
    assert none["top plan"] == "none fits" and none["mfu_%"] is None and none["90%_interval"] == "-"


def test_comparable_filters_generation_format_and_scale():
    model = load_model("llama3-70b")
    pub = pd.DataFrame([
        {"generation": "H100-class", "fp8": False, "moe": False, "params": 70e9, "gpus": 64, "replicable": False},
        {"generation": "A100", "fp8": False, "moe": False, "params": 70e9, "gpus": 64, "replicable": False},
        {"generation": "H100-class", "fp8": True, "moe": False, "params": 70e9, "gpus": 64, "replicable": False},
        {"generation": "H100-class", "fp8": False, "moe": False, "params": 70e9, "gpus": 256, "replicable": False},
        {"generation": "H100-class", "fp8": False, "moe": False, "params": 8e9, "gpus": 64, "replicable": False},
        {"generation": "H100-class", "fp8": False, "moe": False, "params": 70e9, "gpus": 8, "replicable": True}])
    assert list(po.comparable(pub, model, 64, "bf16", "H100-class").index) == [0, 5]
    assert po.comparable(pub, model, 64, "bf16", "MI300X").empty
