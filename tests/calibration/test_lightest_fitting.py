"""The two readers of unstated memory settings share one building block (calibration.cases.lightest_fitting):
lightest_fitting_recompute (rows of the A100 file that state no recomputation) and lightest_fitting_settings
(performance-recipe rows and training logs without a configuration) each keep their plans and their words."""
from dataclasses import replace

import pytest

from paraplan.calibration.cases import lightest_fitting, lightest_fitting_recompute, lightest_fitting_settings
from paraplan.costmodels.estimate import estimate
from paraplan.plan import Plan
from paraplan.scenario import load_scenario

SC = load_scenario("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=64)
LIGHTEST = "the lightest recomputation whose estimate fits"


def _plan(**kw):
    kw = {"tp": 1, "pp": 1, "micro_batch": 1, "zero": 1, "engine": "megatron", "dtype": "bf16", **kw}
    return Plan(dp=8 // kw["tp"], **kw)


def _recompute(plan):
    said = []
    out = lightest_fitting_recompute(SC.model, SC.job(plan), SC.cluster, plan, said)
    return out, said


@pytest.mark.parametrize("plan, mode, words", [
    # tp 4: fits without recomputation, whatever the row's plan carried in
    (_plan(tp=4, sp=True, recompute="full"), "none", f"recompute = none: not stated; {LIGHTEST}"),
    # tp 1, micro-batch 1: 104.8 GiB without, 68.8 with full recomputation (selective saves nothing here)
    (_plan(), "full", f"recompute = full: not stated; {LIGHTEST}"),
    # micro-batch 4: 100.1 GiB even with full recomputation
    (_plan(micro_batch=4), "full", "recompute = full: not stated, and no recomputation fits the estimate's memory"),
])
def test_lightest_fitting_recompute(plan, mode, words):
    out, said = _recompute(plan)
    assert out.recompute == mode and said == [words]
    assert replace(out, recompute=plan.recompute) == plan       # nothing else moves


def _settings(plan, stated):
    said = []
    out = lightest_fitting_settings(SC.model, SC.job(plan), SC.cluster, plan, stated, said)
    return out, said


def test_lightest_fitting_settings_leaves_a_fitting_plan_alone():
    plan = _plan(tp=4, sp=True)
    out, said = _settings(plan, set())
    assert out is plan and said == []


def test_lightest_fitting_settings_keeps_each_switch_until_it_fits():
    """fp8, tp 2 at ZeRO-0 (97.6 GiB): ZeRO-1 alone fits (64.0 GiB); with ZeRO stated, bf16 gradients (90.2)
    and full recomputation are kept in turn (74.7 GiB with both)."""
    plan = _plan(tp=2, sp=True, zero=0, dtype="fp8")
    out, said = _settings(plan, set())
    assert (out.zero, out.grad_reduce_bf16, out.recompute) == (1, False, "none")
    assert said == ["zero = 1: not stated by the source, and the run fitted: the lightest settings the engine "
                    "offers until the estimate fits"]
    out, said = _settings(plan, {"zero"})
    assert (out.zero, out.grad_reduce_bf16, out.recompute) == (0, True, "full")
    assert said[0].startswith("grad_reduce_bf16 = True, ") and "recompute = full: not stated by the source, " \
        "and the run fitted" in said[0]


def test_lightest_fitting_settings_says_when_nothing_fits():
    plan = _plan(micro_batch=8)
    out, said = _settings(plan, {"zero", "recompute"})
    assert out.grad_reduce_bf16 and not estimate(SC.model, SC.job(out), SC.cluster, out).feasible
    # then Megatron-Core's precision-aware optimizer, with fp32 and then bf16 moments (UNSTATED_OPTIMIZER_STEPS)
    assert out.precision_aware_optimizer and out.optimizer_state_dtype == "bf16"
    assert said == ["grad_reduce_bf16 = True, precision_aware_optimizer = True, optimizer_state_dtype = bf16: not "
                    "stated by the source; the estimate does not fit even so"]


def test_the_building_block_skips_steps_that_change_nothing_and_steps_check_plan_refuses():
    plan = _plan(micro_batch=8)
    out, tried, fits = lightest_fitting(SC.model, SC.job(plan), SC.cluster, plan,
                                        [("zero", 1), ("sp", True), ("recompute", "full")])
    # zero is 1 already; sequence parallelism at tp 1 is refused by check_plan
    assert tried == ["recompute = full"] and not fits and out.recompute == "full"
