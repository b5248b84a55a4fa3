"""The token permutation around the experts (Megatron-Core's all-to-all dispatcher, torchtitan's EP
MoE) streams every routed copy through HBM several times; compute.dispatch_bytes_per_token prices
it, and it weighs most where experts are narrow (fine-grained MoE)."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

JOB = TrainingJob(4096, 512)


def test_bytes_per_token_follow_the_dispatchers_passes():
    qwen = load_model("qwen3-30b-a3b")          # 128 experts, top-8, h 2048
    h, k = qwen.hidden, qwen.moe.top_k
    one_per_gpu = Plan(dp=128, ep=128)           # one local expert: no regrouping after the all-to-all
    several = Plan(dp=8, ep=8)                   # 16 local experts: regroup and back
    assert C.dispatch_bytes_per_token(qwen, JOB, one_per_gpu) == pytest.approx((4 * k + 4) * h)
    assert C.dispatch_bytes_per_token(qwen, JOB, several) == pytest.approx((12 * k + 4) * h)
    assert C.dispatch_bytes_per_token(qwen, JOB, Plan(dp=8, ep=1)) == pytest.approx((4 * k + 4) * h)
    # a capacity factor pads every expert: the copies grow with it
    padded = replace(qwen, moe=replace(qwen.moe, capacity_factor=1.5))
    assert C.dispatch_bytes_per_token(padded, JOB, several) == pytest.approx((12 * k * 1.5 + 4) * h)
    # GShard einsum dispatch prices its own dense dispatch; no permutation bytes
    einsum = replace(qwen, moe=replace(qwen.moe, dispatch="einsum"))
    assert C.dispatch_bytes_per_token(einsum, JOB, several) == 0.0


def test_vectorized_plans_regroup_only_where_a_gpu_holds_several_experts():
    from paraplan.plan import PlanBatch
    qwen = load_model("qwen3-30b-a3b")
    batch = PlanBatch.from_plans([Plan(dp=128, ep=128), Plan(dp=8, ep=8), Plan(dp=8, ep=1)])
    got = np.asarray(C.dispatch_bytes_per_token(qwen, JOB, batch))
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
        T = C.tokens_per_rank(JOB, plan)
        perm = curves.memory_time(T * C.dispatch_bytes_per_token(model, JOB, plan), kernels=0)
        gemm = C.moe_mlp_forward_time(model, JOB, plan, curves)
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
    saved = C.DISPATCH_BYTES_PER_COPY, C.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, C.DISPATCH_BYTES_PER_TOKEN
    try:
        C.DISPATCH_BYTES_PER_COPY = C.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY = C.DISPATCH_BYTES_PER_TOKEN = 0
        without = estimate(qwen, JOB, cluster, plan).time_breakdown_s["compute"]
    finally:
        C.DISPATCH_BYTES_PER_COPY, C.DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, C.DISPATCH_BYTES_PER_TOKEN = saved
    assert with_traffic > 1.05 * without
