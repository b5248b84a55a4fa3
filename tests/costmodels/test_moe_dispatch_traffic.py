"""The token permutation around the experts (Megatron-Core's all-to-all dispatcher, torchtitan's EP
MoE) streams every routed copy through HBM several times; moe.dispatch_bytes_per_token prices
it, and it weighs most where experts are narrow (fine-grained MoE)."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import moe
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import tokens_per_rank
from paraplan.costmodels.moe import (dispatch_bytes_per_token, ep_alltoall_time, expected_destinations,
                                     moe_mlp_forward_time)
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

JOB = TrainingJob(4096, 512, moe_imbalance=1.0)   # balanced: the byte counts below are per balanced share


def test_bytes_per_token_follow_the_dispatchers_passes():
    qwen = load_model("qwen3-30b-a3b")          # 128 experts, top-8, h 2048
    h, k = qwen.hidden, qwen.moe.top_k
    one_per_gpu = Plan(dp=128, ep=128)           # one local expert: no regrouping after the all-to-all
    several = Plan(dp=8, ep=8)                   # 16 local experts: regroup and back
    assert dispatch_bytes_per_token(qwen, JOB, one_per_gpu) == pytest.approx((4 * k + 4) * h)
    assert dispatch_bytes_per_token(qwen, JOB, several) == pytest.approx((12 * k + 4) * h)
    assert dispatch_bytes_per_token(qwen, JOB, Plan(dp=8, ep=1)) == pytest.approx((4 * k + 4) * h)
    # a capacity factor pads every expert: the copies grow with it
    padded = replace(qwen, moe=replace(qwen.moe, capacity_factor=1.5))
    assert dispatch_bytes_per_token(padded, JOB, several) == pytest.approx((12 * k * 1.5 + 4) * h)
    # GShard einsum dispatch prices its own dense dispatch; no permutation bytes
    einsum = replace(qwen, moe=replace(qwen.moe, dispatch="einsum"))
    assert dispatch_bytes_per_token(einsum, JOB, several) == 0.0


def test_vectorized_plans_regroup_only_where_a_gpu_holds_several_experts():
    from paraplan.plan import PlanBatch
    qwen = load_model("qwen3-30b-a3b")
    batch = PlanBatch.from_plans([Plan(dp=128, ep=128), Plan(dp=8, ep=8), Plan(dp=8, ep=1)])
    got = np.asarray(dispatch_bytes_per_token(qwen, JOB, batch))
    h, k = qwen.hidden, qwen.moe.top_k
    assert got == pytest.approx(np.array([4 * k + 4, 12 * k + 4, 4 * k + 4]) * h)


def test_narrow_experts_spend_a_larger_share_of_the_layer_on_permutation():
    """Per routed copy the permutation costs ~12h bytes whatever the expert width, while the expert
    GEMMs scale with h x expert width: Qwen3-30B-A3B (expert ffn 768) pays a larger share of its MoE
    layer for it than Mixtral 8x7B (expert ffn 14336)."""
    cluster = load_cluster("dgx-h100", 8)

    def share(name):
        model = load_model(name)
        plan = Plan(dp=8, ep=8, micro_batch=1, dtype="bf16", engine="megatron")
        curves = _curves(cluster)
        T = tokens_per_rank(JOB, plan)
        perm = curves.memory_time(T * dispatch_bytes_per_token(model, JOB, plan), kernels=0)
        gemm = moe_mlp_forward_time(model, JOB, plan, curves)
        return float(perm / gemm)

    assert share("qwen3-30b-a3b") > 3 * share("mixtral-8x7b")


def _curves(cluster):
    from paraplan.costmodels.efficiency import curves_for
    from paraplan.costmodels.estimate import with_reference_block
    return with_reference_block(curves_for(cluster), cluster)


def test_the_estimate_says_what_the_permutation_streams():
    qwen = load_model("qwen3-30b-a3b")
    e = estimate(qwen, JOB, load_cluster("dgx-b200", 8), Plan(dp=8, ep=8, micro_batch=1, engine="megatron"))
    line = next(a for a in e.assumptions if "token permutation" in a)
    assert f"{12 * qwen.moe.top_k + 4} x hidden bytes" in line and "regroup" in line
    dense = estimate(load_model("llama3-8b"), JOB, load_cluster("dgx-b200", 8), Plan(dp=8))
    assert not any("token permutation" in a for a in dense.assumptions)


def test_the_permutation_slows_the_moe_step():
    """The same plan with the permutation bytes taken out is faster, by more for narrow experts."""
    qwen = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-b200", 8)
    plan = Plan(dp=8, ep=8, micro_batch=4, engine="megatron", dtype="bf16")
    with_traffic = estimate(qwen, JOB, cluster, plan).time_breakdown_s["compute"]
    saved = moe.DISPATCH_BYTES_PER_COPY, moe.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, moe.DISPATCH_BYTES_PER_TOKEN
    try:
        moe.DISPATCH_BYTES_PER_COPY = moe.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY = moe.DISPATCH_BYTES_PER_TOKEN = 0
        without = estimate(qwen, JOB, cluster, plan).time_breakdown_s["compute"]
    finally:
        moe.DISPATCH_BYTES_PER_COPY, moe.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, moe.DISPATCH_BYTES_PER_TOKEN = saved
    assert with_traffic > 1.05 * without


# --- DeepEP / HybridEP (Megatron-Core's flex token dispatcher): plan.moe_flex_dispatch ---------------

def test_expected_destinations_match_counting_every_choice_of_k_experts():
    """Uniform top-k routing, E experts kept ``held`` per holder: the mean over all C(E, k) choices of
    the distinct holders hit."""
    from itertools import combinations
    for experts, k, held in ((8, 2, 1), (12, 3, 2), (16, 4, 4), (12, 3, 12)):
        choices = list(combinations(range(experts), k))
        brute = sum(len({x // held for x in c}) for c in choices) / len(choices)
        assert expected_destinations(experts, k, held) == pytest.approx(brute)


def test_flex_dispatch_sends_each_token_once_per_node_and_gpu_not_per_copy():
    """DeepSeek-V3 (256 experts, top-8, 4 of 8 routing groups) at ep 64 over 8 DGX H100 nodes: a
    token's 8 copies land on 7.4 GPUs and 3.6 nodes on average (5.3 nodes without the group limit,
    tests/costmodels/test_router_groups.py); the inter-node bytes fall from 8 x 56/64 = 7 copies to 3.6 x 7/8 =
    3.2, so the dispatch takes markedly less time. Inside one NVLink domain (64 GPUs of a GB200
    NVL72) only the per-GPU dedup is left: 7.4 of 8."""
    dsv3 = load_model("deepseek-v3")
    job = TrainingJob(4096, 8192)
    plan = Plan(tp=2, sp=True, pp=8, dp=64, ep=64, engine="megatron", dtype="bf16")
    h100 = load_cluster("dgx-h100", 1024)
    alltoall = float(ep_alltoall_time(dsv3, job, plan, h100))
    flex = float(ep_alltoall_time(dsv3, job, replace(plan, moe_flex_dispatch=True), h100))
    assert flex < 0.8 * alltoall
    nvl = load_cluster("gb200-nvl72", 64)
    one_domain = Plan(dp=64, ep=64, engine="megatron", dtype="bf16")
    a, f = (float(ep_alltoall_time(dsv3, job, replace(one_domain, moe_flex_dispatch=x), nvl)) for x in (False, True))
    assert 0.9 * a < f < a


def test_flex_dispatch_permutes_the_arrivals_without_the_regrouping():
    qwen = load_model("qwen3-30b-a3b")
    plan = Plan(dp=8, ep=8, engine="megatron")
    h, k = qwen.hidden, qwen.moe.top_k
    arrivals = expected_destinations(qwen.moe.experts, k, qwen.moe.experts / 8)
    got = dispatch_bytes_per_token(qwen, JOB, replace(plan, moe_flex_dispatch=True))
    assert got == pytest.approx((4 * k + 4 * arrivals) * h)
    assert got < dispatch_bytes_per_token(qwen, JOB, plan)


@pytest.mark.parametrize("kw, words", [
    (dict(ep=1, dp=16), "with ep(1) there are none"),
    (dict(engine="torchtitan", tp=2, sp=True, dp=8, zero=2), "no flex token dispatcher"),
    (dict(engine="deepspeed"), "no flex token dispatcher"),
])
def test_plans_that_cannot_run_flex_dispatch_are_refused_by_name(kw, words):
    from paraplan.errors import ConfigError
    with pytest.raises(ConfigError) as err:
        Plan(**{"dp": 16, "ep": 8, "engine": "megatron", "moe_flex_dispatch": True, **kw})
    assert err.value.field == "moe_flex_dispatch" and words in str(err.value)


def test_a_model_without_permuting_experts_cannot_take_flex_dispatch():
    from paraplan.errors import ConfigError
    from paraplan.plan import check_plan
    ted = load_model("ted-6.7b-16e")
    with pytest.raises(ConfigError) as err:
        check_plan(Plan(dp=16, ep=8, engine="megatron", moe_flex_dispatch=True), ted, JOB, load_cluster("dgx-h100", 16))
    assert err.value.field == "moe_flex_dispatch" and "einsum" in str(err.value)


def test_search_leaves_it_off_unless_fixed_then_on_wherever_it_runs():
    from paraplan.planner.space import SpaceOptions, compose
    qwen = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", 16)
    plain, _, _ = compose(qwen, JOB, cluster, SpaceOptions(fixed={"engine": "megatron"}))
    batch, _, _ = compose(qwen, JOB, cluster, SpaceOptions(fixed={"engine": "megatron", "moe_flex_dispatch": True}))
    assert len(batch) == len(plain) and not plain.moe_flex_dispatch.any()
    assert np.array_equal(batch.moe_flex_dispatch, batch.ep > 1) and batch.moe_flex_dispatch.sum() > 100


def test_exports_map_it_or_say_they_cannot():
    import dataclasses
    from paraplan.planner import export as ex
    from paraplan.planfile import PLAN_SCHEMA
    plan = Plan(dp=16, ep=8, micro_batch=1, zero=1, engine="megatron", moe_flex_dispatch=True)
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "qwen3-30b-a3b", "cluster": "dgx-h200", "gpus": 16,
                                               "seq_len": 4096, "global_batch": 512},
           "plan": dataclasses.asdict(plan), "estimate": {}}
    text = ex.to_megatron(doc)
    assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
    doc["plan"].update(engine="generic")
    for target in ("torchtitan", "deepspeed"):      # no flex dispatcher: the nearest plan, all-to-all, re-estimated
        out = ex.export(doc, target)
        assert not out.plan.moe_flex_dispatch and "all-to-all dispatch" in out.notes[0], target
    doc["plan"]["moe_flex_dispatch"] = False
    assert "flex" not in ex.to_megatron(doc)


def test_the_estimate_says_it_prices_flex_dispatch():
    qwen = load_model("qwen3-30b-a3b")
    e = estimate(qwen, JOB, load_cluster("dgx-h100", 16), Plan(dp=16, ep=16, engine="megatron", moe_flex_dispatch=True))
    line = next(a for a in e.assumptions if "DeepEP" in a)
    assert "of the 16 expert-parallel GPUs" in line and "not priced" in line
    assert not any("regroup" in a for a in e.assumptions)
