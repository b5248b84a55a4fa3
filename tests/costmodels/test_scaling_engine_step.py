"""Aleph Alpha's Scaling (engine ``scaling``) as its source runs a step: its pipeline split over layer
specs, its fp32 gradient all-reduce after the backward, and its gradient passes in optimizer.step()
(github.com/Aleph-Alpha/scaling at 01b9d21: core/nn/parallel_module/pipeline_partitioning.py,
core/optimizer/optimizer.py, allreduce.py, parameter_group.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import memory as M
from paraplan.costmodels.comm import ALL_GATHER, ALL_REDUCE, collective_time
from paraplan.costmodels.dataparallel import dp_exposed_time, dp_group
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.dataparallel import DP_OVERLAP_ASSUMPTION, SCALING_DP_ASSUMPTION
from paraplan.costmodels.estimate import assumptions_for, estimate
from paraplan.costmodels.offload import SCALING_STEP_BYTES_PER_PARAM, scaling_step_passes_time
from paraplan.costmodels.offload import stage_param_tensors
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch, stage_layer_counts, stage_layers
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


@pytest.mark.parametrize("layers,pp,counts", [
    (40, 2, [21, 19]),                        # 43 specs: 22 + 21; the embedding and the norm + head take 1 and 2
    (40, 4, [10, 11, 11, 8]),                 # 11, 11, 11, 10
    (80, 8, [10, 11, 11, 10, 10, 10, 10, 8]),  # 83 specs: 11 x 3, 10 x 5
    (60, 4, [15, 16, 16, 13]),
    (4, 4, [1, 2, 1, 0]),                     # 7 specs: the last stage holds the LM head alone
])
def test_scaling_splits_its_layer_specs_uniformly(layers, pp, counts):
    plan = Plan(pp=pp, dp=1, engine="scaling")
    assert stage_layer_counts(layers, plan) == counts
    sl = stage_layers(layers, plan)
    middle = max(counts[1:-1]) if pp > 2 else 0
    assert (float(sl.first), float(sl.middle), float(sl.last), float(sl.largest)) == (
        counts[0], middle, counts[-1], max(counts))


def test_scaling_split_is_vectorized_and_leaves_other_engines_and_explicit_splits_alone():
    plans = [Plan(pp=2, engine="scaling"), Plan(pp=2, engine="megatron"), Plan(pp=1, engine="scaling"),
             Plan(pp=2, engine="scaling", first_stage_layers=18, last_stage_layers=22)]
    sl = stage_layers(40, PlanBatch.from_plans(plans))
    assert list(sl.first) == [21, 20, 40, 18] and list(sl.last) == [19, 20, 40, 22]
    assert stage_layer_counts(40, plans[1]) == [20, 20]
    assert stage_layer_counts(40, plans[3]) == [18, 22]


def test_scaling_reduces_fp32_gradients_with_an_all_reduce_that_nothing_hides():
    """Scaling all-reduces every gradient in fp32 after the backward, then all-gathers the 16-bit
    parameters (ZeRO-1), both exposed, whatever overlap_grad_reduce says; the same plan on the generic
    engine reduce-scatters 16-bit gradients under the backward."""
    cluster = load_cluster("dgx-a100-80g", 256)
    params = 8e9
    scaling = PlanBatch.from_plans([Plan(tp=2, dp=128, zero=1, engine="scaling")])
    n, k = dp_group(scaling, cluster)
    intra, inter = cluster.links("dp")
    expected = (collective_time(ALL_REDUCE, 4 * params, n, k, intra, inter)
                + collective_time(ALL_GATHER, 2 * params, n, k, intra, inter))
    exposed, total = dp_exposed_time(params, scaling, cluster, 16, 1.0, 2.0)
    assert float(exposed[0]) == pytest.approx(float(np.ravel(expected)[0]))
    assert float(total[0]) == pytest.approx(float(exposed[0]))
    no_overlap = PlanBatch.from_plans([Plan(tp=2, dp=128, zero=1, engine="scaling", overlap_grad_reduce=False)])
    assert float(dp_exposed_time(params, no_overlap, cluster, 16, 1.0, 2.0)[0][0]) == pytest.approx(float(exposed[0]))
    generic = PlanBatch.from_plans([Plan(tp=2, dp=128, zero=1, engine="generic")])
    assert float(dp_exposed_time(params, generic, cluster, 16, 1.0, 2.0)[0][0]) < 0.2 * float(exposed[0])


def test_only_scaling_plans_say_their_reduction_is_scalings():
    """The estimate states the data-parallel reduction the plan's engine runs: Scaling's exposed fp32
    all-reduce for engine scaling (overlap flag or not), the bucketed overlap for the others."""
    for overlap in (True, False):
        said = assumptions_for(Plan(engine="scaling", overlap_grad_reduce=overlap))
        assert SCALING_DP_ASSUMPTION in said and DP_OVERLAP_ASSUMPTION not in said
    for engine in ("generic", "megatron", "torchtitan", "deepspeed"):
        said = assumptions_for(Plan(engine=engine))
        assert DP_OVERLAP_ASSUMPTION in said and not any("Scaling" in a for a in said)


def test_scaling_step_pays_its_gradient_passes_and_the_estimate_shows_them():
    model = load_model("llama1-13b")
    job = TrainingJob(2048, 2048)
    cluster = load_cluster("dgx-a100-80g", 64)
    curves = curves_for(cluster)
    plan = Plan(dp=64, zero=1, engine="scaling", grad_accumulation_fusion=False)
    batch = PlanBatch.from_plans([plan])
    params = max(float(np.ravel(x)[0]) for x in M.stage_params(model, batch))   # pp 1: the whole model
    t = float(np.ravel(scaling_step_passes_time(model, batch, curves, params))[0])
    tensors = float(np.ravel(stage_param_tensors(model, batch))[0])
    assert t == pytest.approx(float(np.ravel(curves.streaming_time(SCALING_STEP_BYTES_PER_PARAM * params,
                                                                   kernels=3 * tensors))[0]))
    assert float(np.ravel(scaling_step_passes_time(model, PlanBatch.from_plans([replace(plan, engine="generic")]),
                                                   curves, params))[0]) == 0.0
    on_scaling = estimate(model, job, cluster, plan).time_breakdown_s
    on_generic = estimate(model, job, cluster, replace(plan, engine="generic")).time_breakdown_s
    assert on_scaling["optimizer"] - on_generic["optimizer"] == pytest.approx(t, rel=1e-6)
    assert on_scaling["dp_comm"] > 5 * on_generic["dp_comm"]


def test_scaling_pipeline_sends_whole_activations_and_waits_for_each_transfer():
    """Scaling's PipeCommunicator sends a stage's output as it is (without sequence parallelism every tp
    rank sends the whole replicated b·s·h activation; Megatron scatters it over tp), and its pipeline runs
    every send and receive as its own blocking instruction (twice the transfers on a stage's timeline)."""
    from paraplan.costmodels.comm import SEND_RECV, ring_time
    from paraplan.costmodels.p2p import p2p_time
    from paraplan.costmodels.pipeline import p2p_messages_on_critical_path
    model, job = load_model("llama1-65b"), TrainingJob(2048, 2048)
    cluster = load_cluster("dgx-a100-80g", 128)
    _, inter = cluster.links("pp")
    whole = 2048 * model.hidden * 2
    plans = PlanBatch.from_plans([Plan(tp=8, pp=8, dp=2, engine="scaling"), Plan(tp=8, pp=8, dp=2, engine="generic"),
                                  Plan(tp=8, pp=8, dp=2, sp=True, engine="scaling"),
                                  Plan(tp=8, pp=8, dp=2, sp=True, engine="generic")])
    t = p2p_time(model, job, plans, cluster)
    assert float(t[0]) == pytest.approx(float(ring_time(SEND_RECV, whole, 2, inter)))
    assert float(t[1]) == pytest.approx(float(ring_time(SEND_RECV, whole / 8, 2, inter)))
    assert float(t[2]) == float(t[3]) == float(t[1])         # a sequence shard under sp, either way
    messages = p2p_messages_on_critical_path(plans, 1024)
    assert list(messages) == [4 * 1031, 2 * 1031, 4 * 1031, 2 * 1031]
