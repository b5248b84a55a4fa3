"""The routed experts' weight-gradient GEMMs under fused gradient accumulation: each reads and writes the
expert's main gradient (fp32, or bf16 with --grad-reduce-in-bf16; Megatron-LM --gradient-accumulation-fusion, Transformer Engine's
fuse_wgrad_accumulation), so with few tokens per expert the backward is bound by those bytes rather than
priced as a second forward."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import routed_experts_gemm_time
from paraplan.costmodels.moe import moe_mlp_forward_time, routed_experts_wgrad_accumulation_time
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = load_cluster("dgx-b200", 16)
CURVES = curves_for(CLUSTER)
MODEL, JOB = load_model("qwen3-30b-a3b"), TrainingJob(4096, 512)
# ep 1: all 128 experts on every rank, 4096 x 8 / 128 = 256 tokens each per micro-batch
EP1 = Plan(tp=1, pp=2, dp=8, micro_batch=1, zero=1, ep=1)
EP16 = Plan(tp=1, pp=1, dp=16, micro_batch=1, zero=1, ep=16)


def _f(x):
    return float(np.asarray(x))


def _by_hand(plan, dtype_bytes=2.0, main_grad_bytes=4.0):
    """The extra from the shapes, written out: two grouped GEMMs (gate+up 2048 -> 2 x 768, down
    768 -> 2048) over E/ep experts of m tokens, the wgrad reading its two m-row operands and reading
    and writing the main gradient (fp32 unless --grad-reduce-in-bf16)."""
    m = JOB.seq_len * plan.micro_batch * 8 * plan.ep / 128
    local = 128 / plan.ep
    h, f = MODEL.hidden, MODEL.moe.expert_ffn_hidden
    extra = 0.0
    for n, k in ((2 * f, h), (h, f)):
        forward = _f(routed_experts_gemm_time(CURVES, m, n, k, local, plan, True))
        traffic = _f(CURVES.streaming_time(local * ((m * k + m * n) * dtype_bytes + n * k * 2 * main_grad_bytes),
                                           kernels=0))
        extra += max(0.0, CURVES.kernel_overhead_s + traffic - forward)
    return extra


def test_few_tokens_per_expert_make_the_wgrad_memory_bound():
    extra = _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, EP1, CURVES))
    assert extra == pytest.approx(_by_hand(EP1), rel=1e-12)
    forward = _f(moe_mlp_forward_time(MODEL, JOB, EP1, CURVES))
    # 256 tokens against 2048 x 1536 weights: the fp32 accumulation costs more than the forward itself
    assert extra > forward


def test_many_tokens_per_expert_leave_the_backward_as_it_was():
    """At ep 16 each of the 8 local experts gets 4096 tokens: the wgrad stays compute-bound."""
    assert _by_hand(EP16) == 0.0
    assert _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, EP16, CURVES)) == 0.0


def test_fp8_inputs_are_one_byte():
    plan = replace(EP1, dtype="fp8")
    assert _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, plan, CURVES)) == \
        pytest.approx(_by_hand(plan, dtype_bytes=1.0), rel=1e-12)


def test_a_bf16_main_grad_moves_half_the_accumulation_bytes():
    """--grad-reduce-in-bf16 (Megatron-Bridge's performance recipes: grad_reduce_in_fp32=False) keeps
    main_grad in bf16: 2 bytes read and 2 written per weight."""
    plan = replace(EP1, engine="megatron", grad_reduce_bf16=True)
    got = _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, plan, CURVES))
    assert got == pytest.approx(_by_hand(plan, main_grad_bytes=2.0), rel=1e-12)
    assert 0 < got < _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, replace(plan, grad_reduce_bf16=False), CURVES))
    said = [a for a in estimate(MODEL, JOB, CLUSTER, plan).assumptions if "bf16 main gradients" in a]
    assert len(said) == 1


def test_without_fused_accumulation_nothing_is_added():
    """A 16-bit wgrad output moves the forward's bytes; the unfused accumulation is priced apart
    (accumulation.grad_accumulation_time)."""
    plan = replace(EP1, grad_accumulation_fusion=False)
    assert _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, plan, CURVES)) == 0.0


def test_dense_models_are_untouched(monkeypatch):
    """A dense layer's backward does not take the term: made huge, it leaves the layer's times as they were."""
    dense, plan = load_model("llama3-8b"), Plan(tp=1, pp=1, dp=16)
    before = C.layer_times(dense, JOB, plan, CURVES, CLUSTER)
    monkeypatch.setattr(C, "routed_experts_wgrad_accumulation_time", lambda *a, **k: 1e3)
    after = C.layer_times(dense, JOB, plan, CURVES, CLUSTER)
    assert _f(after["backward"]) == _f(before["backward"]) and _f(after["forward"]) == _f(before["forward"])


def test_the_layer_backward_carries_it(monkeypatch):
    with_it = C.layer_times(MODEL, JOB, EP1, CURVES, CLUSTER)
    extra = _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, EP1, CURVES))
    monkeypatch.setattr(C, "routed_experts_wgrad_accumulation_time", lambda *a, **k: 0.0)
    without = C.layer_times(MODEL, JOB, EP1, CURVES, CLUSTER)
    share = MODEL.moe_layers / MODEL.layers
    assert _f(with_it["backward"]) - _f(without["backward"]) == pytest.approx(share * extra, rel=1e-9)
    assert _f(with_it["forward"]) == _f(without["forward"])


def test_a_mixed_batch_prices_each_plan_as_alone():
    plans = [EP1, EP16, replace(EP1, grad_accumulation_fusion=False), replace(EP1, micro_batch=4)]   # one dtype a batch
    batch = routed_experts_wgrad_accumulation_time(MODEL, JOB, PlanBatch.from_plans(plans), CURVES)
    for i, plan in enumerate(plans):
        assert np.asarray(batch)[i] == pytest.approx(_f(routed_experts_wgrad_accumulation_time(MODEL, JOB, plan, CURVES)),
                                                     rel=1e-12, abs=0.0)


def test_the_step_of_an_ep1_plan_grows():
    """On a whole step of the ep 1 plan (24 MoE layers a stage, 64 micro-batches) it is no rounding error."""
    e = estimate(MODEL, JOB, CLUSTER, EP1)
    assert e.feasible
    extra = _f(routed_experts_wgrad_accumulation_time(MODEL, JOB, EP1, CURVES))
    m = e.details["micro_batches_per_step"]
    assert extra * m * MODEL.layers / EP1.pp > 0.05 * e.step_time_s


def test_the_estimate_says_so_where_it_binds():
    said = [a for a in estimate(MODEL, JOB, CLUSTER, EP1).assumptions if "fp32 main gradients" in a]
    assert len(said) == 1 and "256 tokens per expert" in said[0]
    assert not [a for a in estimate(MODEL, JOB, CLUSTER, EP16).assumptions if "fp32 main gradients" in a]
