"""Uneven stages and per-stage recomputation of a plan, through the ILPs (pulp/CBC)."""


import pytest

from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner.stages import layer_costs, stage_layout
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def test_layer_costs_put_the_embedding_first_and_the_heavy_head_last():
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 16)
    costs = layer_costs(model, TrainingJob(8192, 64), cluster, Plan(tp=2, pp=4, dp=2))
    assert costs[0].name == "embedding" and costs[-1].name == "lm_head" and len(costs) == model.layers + 2
    body = costs[1:-1]
    assert costs[-1].time_s > 0.5 * body[0].time_s        # 128k vocabulary: the head weighs like a layer or more


def test_balanced_stages_beat_the_uniform_split_when_the_head_is_heavy():
    """With a 128k-vocabulary head on the last stage, moving a layer off it shortens the slowest stage."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 16)
    layout = stage_layout(model, TrainingJob(8192, 64), cluster, Plan(tp=2, pp=4, dp=2))
    counts = [b - a for a, b in zip(layout.boundaries, list(layout.boundaries[1:]) + [model.layers + 2])]
    assert counts[-1] < max(counts)
    assert layout.bottleneck_s < layout.uniform_bottleneck_s
    assert layout.pipeline_time_balanced_s < layout.pipeline_time_uniform_s


def test_moe_layers_weigh_more_in_the_partition():
    """Every-other-layer MoE: per-layer costs alternate, and the balanced split stays within one item of even."""
    model, cluster = load_model("ds-moe-1.3b-128"), load_cluster("dgx-a100-80g", 64)
    plan = Plan(pp=4, dp=16, ep=8)
    costs = layer_costs(model, TrainingJob(2048, 256), cluster, plan)
    body = costs[1:-1]
    assert body[1].name.startswith("moe") and body[0].name.startswith("dense")
    assert body[1].weight_bytes > body[0].weight_bytes and body[1].time_s > body[0].time_s
    layout = stage_layout(model, TrainingJob(2048, 256), cluster, plan)
    assert layout.bottleneck_s <= layout.uniform_bottleneck_s + 1e-12


@pytest.mark.slow
def test_per_stage_recompute_only_where_memory_binds():
    """Under 1F1B stage 0 holds pp micro-batches, the last one: the recompute ILP recomputes more layers on
    early stages than late ones, and none where everything fits (Megatron's --recompute-num-layers)."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", 64)
    job = TrainingJob(8192, 256)
    plan = Plan(tp=8, pp=8, micro_batch=1, zero=1)
    tight = stage_layout(model, job, cluster, plan, max_memory_fraction=0.6)
    r = tight.recompute_layers
    assert r is not None and sum(r) > 0
    assert all(a >= b for a, b in zip(r, r[1:])), r              # early stages hold more micro-batches
    assert r[-1] == 0                                             # the last stage holds one
    tighter = stage_layout(model, job, cluster, plan, max_memory_fraction=0.5).recompute_layers
    assert sum(tighter) > sum(r)
