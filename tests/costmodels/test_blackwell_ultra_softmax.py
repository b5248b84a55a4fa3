"""Blackwell Ultra (GB300) runs the softmax's exponentials at twice Blackwell's rate (curves.yaml
``attention_exp_speedup``): its fused attention is faster than a GB200's, by more at small head dims,
its GEMMs are not; and Megatron-Bridge's GB300-over-GB200 pairs say the direction is right."""
import sys
from pathlib import Path

import pytest

from paraplan.costmodels.attention import attention_core_times
from paraplan.calibration import load_h100_cases, score
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

GB300 = load_cluster("gb300-nvl72", 8)
GB200 = load_cluster("gb200-nvl72", 8)


def test_only_blackwell_ultra_runs_faster_exponentials():
    for name in ("dgx-b200", "gb200-nvl72", "dgx-h100", "dgx-a100-80g"):
        assert analytical_curves(load_cluster(name, 8).accelerator).softmax_exp_time_factor(128) == 1.0
    ultra = analytical_curves(GB300.accelerator)
    f64, f128, f256 = (ultra.softmax_exp_time_factor(d) for d in (64, 128, 256))
    # the exponentials' share falls as the head dim (tensor work per score) grows; halving them can at
    # most halve the kernel
    assert 0.5 < f64 < f128 < f256 < 1.0
    assert f128 == pytest.approx(1 - 0.364 + 0.364 / 2, rel=1e-9)


def test_gb300_attention_faster_same_levels():
    model, job = load_model("llama3-8b"), TrainingJob(8192, 16)
    plan = Plan(dp=8, micro_batch=2, dtype="fp8")
    ultra, base = analytical_curves(GB300.accelerator), analytical_curves(GB200.accelerator)
    fwd_u, bwd_u = attention_core_times(model, job, plan, ultra)
    fwd_b, bwd_b = attention_core_times(model, job, plan, base)
    factor = ultra.softmax_exp_time_factor(128)
    assert float(fwd_u) == pytest.approx(factor * float(fwd_b), rel=1e-9)
    assert float(bwd_u) == pytest.approx(factor * float(bwd_b), rel=1e-9)
    # GEMMs at the same level (the GB300's 160 SMs fill waves differently, nothing more)
    assert ultra.gemm_sustained_fraction == base.gemm_sustained_fraction
    assert ultra.flash_attention_efficiency == base.flash_attention_efficiency
    e_u, e_b = estimate(model, job, GB300, plan), estimate(model, job, GB200, plan)
    assert e_u.step_time_s < e_b.step_time_s
    assert ultra.describe()["attention_exp_speedup"] == 2.0 and "attention_exp_speedup" not in base.describe()


def _gb300_over_gb200_errors(cases):
    df = score(cases, estimate)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from accuracy import part_pairs
    pairs = part_pairs(cases, df)
    return pairs[pairs.part == "gb300 over gb200"]


def test_megatron_bridge_gb300_pairs_closer_than_equal_parts():
    """The published GB300 runs are 5-22 % faster than the GB200 runs of the same layout; pricing the
    exponentials predicts part of it (the rest: GB300's higher power limit, not priced). Against equal
    predictions for both parts, every pair's error shrinks and none overshoots."""
    cases = [c for c in load_h100_cases()[0] if c.cluster.accelerator.name in ("gb200", "gb300")]
    pairs = _gb300_over_gb200_errors(cases)
    assert len(pairs) >= 3
    assert (pairs.measured_speedup > 1.0).all()
    assert (pairs.predicted_speedup > 1.0).all()
    assert (pairs.predicted_speedup <= pairs.measured_speedup).all()
    # equal parts would have predicted a speed-up of 1: the error is now smaller for every pair
    assert (pairs["error_%"].abs() < 100 * (1 - 1 / pairs.measured_speedup)).all()


def test_estimate_says_so_on_gb300_only():
    model, job = load_model("llama3-8b"), TrainingJob(8192, 16)
    plan = Plan(dp=8, micro_batch=2, dtype="fp8")
    said = [a for a in estimate(model, job, GB300, plan).assumptions if "exponentials" in a]
    assert len(said) == 1 and "1.22x faster" in said[0]
    assert not [a for a in estimate(model, job, GB200, plan).assumptions if "exponentials" in a]
