"""Thin linear GEMMs: a linear layer's GEMM is priced no faster than moving its operands and output once
through HBM (a per-op roofline), and torchtitan's separate wq / wk / wv and w1 / w3 modules are priced
as the separate GEMMs they run, where Megatron-LM and the generic engine fuse them."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import (_linear_dtype, attention_gemm_forward_times, linear_gemm_time,
                                         mlp_gemm_forward_times)
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = load_cluster("dgx-h100", 64)
CURVES = curves_for(CLUSTER)
MODEL, JOB = load_model("llama3-70b"), TrainingJob(8192, 256)
TITAN = Plan(tp=8, pp=1, dp=8, sp=True, micro_batch=2, zero=3, engine="torchtitan", recompute="full")
MEGATRON = replace(TITAN, engine="megatron", zero=1)


def _f(x):
    return float(np.asarray(x))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_thin_projection_is_priced_at_its_memory_traffic(dtype):
    """A 128-wide key projection (Llama 3 70B's 8 KV heads over tp 8) reads T x 8192 inputs to write
    T x 128 outputs: its arithmetic intensity (~120 FLOP per byte in bf16) sits below the H100's ridge,
    so the streaming time of its bytes sets the price, above the tensor-core time."""
    plan = replace(MEGATRON, dtype=dtype)
    T, h, n = 16384, MODEL.hidden, 128
    width = 1 if dtype == "fp8" else 2
    traffic = _f(CURVES.streaming_time((T * h + h * n) * width + T * n * 2, kernels=0))
    compute = _f(CURVES.gemm_time(T, n, h, _linear_dtype(plan)))
    assert traffic > compute
    assert _f(linear_gemm_time(CURVES, T, n, h, plan)) == pytest.approx(CURVES.kernel_overhead_s + traffic, rel=1e-9)


def test_a_square_gemm_stays_compute_bound():
    T, h = 16384, MODEL.hidden
    assert _f(linear_gemm_time(CURVES, T, h, h, MEGATRON)) == pytest.approx(_f(CURVES.gemm_time(T, h, h, "bf16")))


def test_torchtitan_runs_wq_wk_wv_and_w1_w3_apart():
    t = TITAN.tp
    T = JOB.seq_len * TITAN.micro_batch
    qkv_titan, out_titan = attention_gemm_forward_times(MODEL, JOB, TITAN, CURVES)
    qkv_fused, out_fused = attention_gemm_forward_times(MODEL, JOB, MEGATRON, CURVES)
    apart = (linear_gemm_time(CURVES, T, MODEL.q_hidden / t, MODEL.hidden, TITAN)
             + 2 * linear_gemm_time(CURVES, T, MODEL.kv_hidden / t, MODEL.hidden, TITAN))
    assert _f(qkv_titan) == pytest.approx(_f(apart), rel=1e-12)
    assert _f(qkv_titan) > 1.02 * _f(qkv_fused)         # the thin wk, wv read the input once each
    assert _f(out_titan) == pytest.approx(_f(out_fused))
    fc1_titan, fc2_titan = mlp_gemm_forward_times(MODEL, JOB, TITAN, CURVES)
    fc1_fused, fc2_fused = mlp_gemm_forward_times(MODEL, JOB, MEGATRON, CURVES)
    assert _f(fc1_titan) == pytest.approx(2 * _f(linear_gemm_time(CURVES, T, MODEL.ffn_hidden / t, MODEL.hidden, TITAN)))
    assert _f(fc1_titan) >= _f(fc1_fused)
    assert _f(fc2_titan) == pytest.approx(_f(fc2_fused))


def test_a_gelu_mlp_has_one_first_projection_on_every_engine():
    gpt = load_model("gpt3-175b")
    titan, fused = (mlp_gemm_forward_times(gpt, JOB, p, CURVES)[0] for p in (TITAN, MEGATRON))
    assert _f(titan) == pytest.approx(_f(fused))


def test_vectorized_plans_price_each_engine_its_own_way():
    """the planner's arrays: each plan of a mixed batch priced as when it comes alone."""
    batch = PlanBatch.from_plans([TITAN, MEGATRON])
    qkv, _ = attention_gemm_forward_times(MODEL, JOB, batch, CURVES)
    fc1, _ = mlp_gemm_forward_times(MODEL, JOB, batch, CURVES)
    for i, plan in enumerate((TITAN, MEGATRON)):
        alone_qkv = attention_gemm_forward_times(MODEL, JOB, plan, CURVES)[0]
        alone_fc1 = mlp_gemm_forward_times(MODEL, JOB, plan, CURVES)[0]
        assert np.asarray(qkv)[i] == pytest.approx(_f(alone_qkv), rel=1e-12)
        assert np.asarray(fc1)[i] == pytest.approx(_f(alone_fc1), rel=1e-12)
    assert np.isfinite(estimate(MODEL, JOB, CLUSTER, TITAN).step_time_s)


def test_separate_input_gradients_are_summed_in_the_backward(monkeypatch):
    """torchtitan sums the three attention and two MLP input gradients: under tp one fused kernel per
    tensor reading k gradients and writing the sum ((3 + 1) + (2 + 1) passes of T x h 16-bit elements);
    at tp 1 inductor folds the sum into the norm's backward (2 + 1 extra reads); nothing where fused."""
    T = JOB.seq_len * TITAN.micro_batch
    tp8 = _f(C.separate_input_gradient_sum_time(MODEL, JOB, TITAN, CURVES))
    assert tp8 == pytest.approx(_f(CURVES.streaming_time(7 * T * MODEL.hidden * 2, kernels=2)), rel=1e-12)
    tp1 = replace(TITAN, tp=1, sp=False, dp=64)
    assert _f(C.separate_input_gradient_sum_time(MODEL, JOB, tp1, CURVES)) == pytest.approx(
        _f(CURVES.streaming_time(3 * T * MODEL.hidden * 2, kernels=0)), rel=1e-12)
    assert _f(C.separate_input_gradient_sum_time(MODEL, JOB, MEGATRON, CURVES)) == 0.0

    with_sum = _f(C.layer_times(MODEL, JOB, TITAN, CURVES, CLUSTER)["backward"])
    monkeypatch.setattr(C, "separate_input_gradient_sum_time", lambda *a: 0.0)
    assert with_sum - _f(C.layer_times(MODEL, JOB, TITAN, CURVES, CLUSTER)["backward"]) == pytest.approx(tp8, rel=1e-9)


def test_the_torchtitan_export_compiles():
    """the estimate prices compiled torchtitan blocks, so the exported job config asks for torch.compile,
    with async TP or without."""
    import tomllib
    from paraplan.planner import export as ex
    from paraplan.planfile import PLAN_SCHEMA
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8,
                                               "seq_len": 8192, "global_batch": 128},
           "plan": {"tp": 2, "dp": 4, "sp": True, "zero": 3, "engine": "torchtitan", "recompute": "full"}, "estimate": {}}
    from tests.planner.test_export import module_literals
    compiled = {"enable": True, "components": ["model", "loss"]}
    assert tomllib.loads(ex.to_torchtitan(doc, "toml"))["compile"] == compiled              # torchtitan 0.2.2
    assert module_literals(ex.to_torchtitan(doc))["SETTINGS"]["compile"] == compiled        # torchtitan 0.3.0
    doc["plan"]["tp_comm_overlap"] = True               # async TP: [parallelism] in 0.2.2, compile in 0.3.0
    toml = tomllib.loads(ex.to_torchtitan(doc, "toml"))
    assert toml["compile"] == compiled and toml["parallelism"]["enable_async_tensor_parallel"] is True
    assert module_literals(ex.to_torchtitan(doc))["SETTINGS"]["compile"] == {**compiled, "enable_async_tensor_parallel": True}
