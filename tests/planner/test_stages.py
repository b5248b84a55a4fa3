"""Uneven stages and per-stage recomputation of a plan: the exact methods the planner uses, and the ILPs
(pulp/CBC) they reproduce."""


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


@pytest.mark.parametrize("case", [
    ("llama3-8b", "dgx-h100", 16, TrainingJob(8192, 64), Plan(tp=2, pp=4, dp=2), 1.0),
    ("ds-moe-1.3b-128", "dgx-a100-80g", 64, TrainingJob(2048, 256), Plan(pp=4, dp=16, ep=8), 1.0),
    ("llama3-70b", "dgx-h100", 64, TrainingJob(8192, 256), Plan(tp=8, pp=8, micro_batch=1, zero=1), 0.6),
])
def test_exact_methods_give_the_ilps_layout(case):
    """The default (dynamic programme, fewest recomputed layers that fit) and the two CBC ILPs give the same
    layout: boundaries, slowest stage and per-stage recomputation (the README's plan prints it)."""
    name, system, gpus, job, plan, fraction = case
    model, cluster = load_model(name), load_cluster(system, gpus)
    exact = stage_layout(model, job, cluster, plan, max_memory_fraction=fraction)
    # CBC given time to prove its optimum even on a loaded machine (5 s, the default, ran out under load 8)
    ilp = stage_layout(model, job, cluster, plan, max_memory_fraction=fraction, ilp=True, time_limit_s=300)
    assert exact.partition_status == ilp.partition_status == "Optimal"
    assert exact.boundaries == ilp.boundaries and exact.bottleneck_s == ilp.bottleneck_s
    assert exact.recompute_layers == ilp.recompute_layers and exact.recompute_status == ilp.recompute_status
    assert exact == ilp


@pytest.mark.slow
def test_exact_partition_where_cbc_runs_out_of_time():
    """GPT 1T on 3072 A100 (the planner's best plan, pp 16 of 130 items): CBC, warm-started from the DP,
    spends its whole 5 s without proving the split; the DP's is the same, proven, in milliseconds."""
    model, cluster = load_model("gpt-1t"), load_cluster("dgx-a100-80g", 3072)
    plan = Plan(tp=8, pp=16, vpp=8, schedule="interleaved", micro_batch=1, zero=1)
    job = TrainingJob(2048, 3072)
    exact = stage_layout(model, job, cluster, plan)
    ilp = stage_layout(model, job, cluster, plan, ilp=True)
    assert exact.partition_status == "Optimal" and exact.boundaries == ilp.boundaries
    assert exact.bottleneck_s <= ilp.bottleneck_s


def test_stage_layout_of_a_plan_with_a_switch_that_refuses_full_recomputation():
    """The stage split prices each layer's most frugal memory as under full recomputation; a plan with the
    EP all-to-all overlap (which refuses full recomputation) raised ConfigError there, so `paraplan plan`
    stopped after its search (DeepSeek-V3 on 2048 H100, --fix ep_comm_overlap=true, best plan dualpipev pp 8)."""
    model, job, cluster = load_model("qwen3-30b-a3b"), TrainingJob(4096, 512), load_cluster("dgx-h100", 64)
    plan = Plan(engine="generic", tp=1, pp=4, dp=16, ep=8, schedule="interleaved", vpp=2, zero=1,
                recompute="selective", ep_comm_overlap=True, micro_batch=1)
    frugal = layer_costs(model, job, cluster, plan, recompute="full")
    plain = layer_costs(model, job, cluster, plan)
    assert all(f.activation_bytes <= p.activation_bytes for f, p in zip(frugal, plain))
    assert stage_layout(model, job, cluster, plan) is not None
