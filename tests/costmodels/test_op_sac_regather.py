"""torchtitan's op-level SAC saves reduce-scatter outputs but not all-gather outputs, so under tensor
+ sequence parallelism its backward gathers the attention and MLP inputs again: two more all-gathers
per layer, exposed (async TP overlaps the forward only)."""
from dataclasses import replace

import pytest

from paraplan.costmodels.comm import ALL_GATHER
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.tpcomm import op_sac_regather_time, tp_collective_time
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = load_cluster("grand-teton-h100", 64)
MODEL, JOB = load_model("llama3-8b"), TrainingJob(8192, 96)
PLAN = Plan(tp=8, dp=8, sp=True, micro_batch=12, zero=3, engine="torchtitan", recompute="op-sac")



def test_regather_is_two_all_gathers_of_the_layer_input():
    T = 12 * 8192
    one = tp_collective_time(ALL_GATHER, T * MODEL.hidden * 2, PLAN, CLUSTER)
    assert float(op_sac_regather_time(MODEL, JOB, PLAN, CLUSTER)) == pytest.approx(2 * float(one), rel=1e-12)
    # fp8 tensorwise under torchtitan gathers fp8: half the bytes
    fp8 = replace(PLAN, dtype="fp8")
    half = tp_collective_time(ALL_GATHER, T * MODEL.hidden * 1, fp8, CLUSTER)
    assert float(op_sac_regather_time(MODEL, JOB, fp8, CLUSTER)) == pytest.approx(2 * float(half), rel=1e-12)


@pytest.mark.parametrize("change", [dict(recompute="none"), dict(recompute="full"), dict(sp=False, engine="generic"),
                                    dict(tp=1, dp=64, sp=False, engine="generic")])
def test_no_regather_elsewhere(change):
    assert float(op_sac_regather_time(MODEL, JOB, replace(PLAN, **change), CLUSTER)) == 0.0


def test_step_pays_it_in_exposed_tp_comm_even_with_async_tp():
    """The regathers land in tp_comm and stay there with async TP (its overlap covers the forward)."""
    regather = float(op_sac_regather_time(MODEL, JOB, PLAN, CLUSTER)) * MODEL.layers
    for overlap in (False, True):
        plan = replace(PLAN, tp_comm_overlap=overlap)
        sac = estimate(MODEL, JOB, CLUSTER, plan).time_breakdown_s["tp_comm"]
        # none keeps the gathered inputs: the same forward/backward collectives, no regather
        none = estimate(MODEL, JOB, CLUSTER, replace(plan, recompute="none")).time_breakdown_s["tp_comm"]
        assert sac - none == pytest.approx(regather, rel=1e-6)
