"""The routed experts' output biases under Megatron-Core (moe.moe_expert_bias_times).

TEGroupedMLP adds each expert's fc2 bias, scaled by the copy's router probability, after the grouped
GEMM in an eager loop over the local experts, and refuses the fused bias-dropout-add, so a model with
linear biases (GPT-OSS) streams 12h bytes per routed copy forward and 16h backward, plus 3h / 2h per
token for the attention output's bias added apart from the residual."""
from __future__ import annotations

import dataclasses

import pytest

from paraplan.costmodels import compute as C
from paraplan.calibration import load_h100_cases
from paraplan.costmodels.efficiency import curves_for, with_reference_block
from paraplan.costmodels.estimate import estimate_legal, with_stage_concurrency
from paraplan.costmodels.kernels import micro_batches
from paraplan.costmodels.moe import (EXPERT_BIAS_BYTES_PER_COPY_BACKWARD, EXPERT_BIAS_BYTES_PER_COPY_FORWARD,
                                     moe_expert_bias_times)
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

OSS = load_model("gpt-oss-120b")
JOB = TrainingJob(seq_len=4096, global_batch=512, moe_imbalance=1.0)   # balanced: exact byte counts
MEGATRON = Plan(tp=1, pp=4, dp=16, ep=8, micro_batch=4, zero=1, engine="megatron")
CLUSTER = load_cluster("dgx-h100", 64)
CURVES = with_reference_block(curves_for(CLUSTER), CLUSTER)


def bias_times(model, plan):
    f, b = moe_expert_bias_times(model, JOB, plan, CURVES)
    return float(f), float(b)


def test_bytes_per_copy_and_per_token_as_the_eager_ops_stream_them():
    """Forward 12h per copy (b·p written, the add's two reads and a write, the cat's read and write),
    backward 16h; the separate attention bias add 3h more than the fused kernel's 7h forward, 2h back."""
    assert EXPERT_BIAS_BYTES_PER_COPY_FORWARD == 12
    assert EXPERT_BIAS_BYTES_PER_COPY_BACKWARD == 16
    T = JOB.seq_len * MEGATRON.micro_batch
    copies = T * OSS.moe.top_k                       # tp 1, etp 1: the GPU's routed copies
    local = OSS.moe.experts / MEGATRON.ep
    h = OSS.hidden
    want_f = CURVES.streaming_time(h * (12 * copies + 3 * T), kernels=2 * local + 2)
    want_b = CURVES.streaming_time(h * (16 * copies + 2 * T), kernels=4 * local + 2)
    assert bias_times(OSS, MEGATRON) == (pytest.approx(float(want_f)), pytest.approx(float(want_b)))


def test_only_megatron_with_biased_experts_pays_it():
    assert bias_times(dataclasses.replace(OSS, bias=False), MEGATRON) == (0.0, 0.0)
    assert bias_times(load_model("qwen3-30b-a3b"), MEGATRON) == (0.0, 0.0)
    assert bias_times(OSS, dataclasses.replace(MEGATRON, engine="generic")) == (0.0, 0.0)
    f, b = bias_times(OSS, MEGATRON)
    assert f > 0 and b > f


def test_the_layer_pays_exactly_the_bias_term():
    """Biases change no GEMM time: the MoE layer's forward and backward differ by the term alone."""
    m = micro_batches(JOB, MEGATRON)
    curves = with_stage_concurrency(CURVES, MEGATRON, m)
    with_bias = C.layer_times(OSS, JOB, MEGATRON, curves, CLUSTER)
    without = C.layer_times(dataclasses.replace(OSS, bias=False), JOB, MEGATRON, curves, CLUSTER)
    f, b = (float(x) for x in moe_expert_bias_times(OSS, JOB, MEGATRON, curves))
    assert float(with_bias["forward"] - without["forward"]) == pytest.approx(f)
    assert float(with_bias["backward"] - without["backward"]) == pytest.approx(b)


def test_the_moe_recompute_module_replays_the_forward_bias_adds():
    plan = dataclasses.replace(MEGATRON, recompute="selective", recompute_modules="moe")
    unbiased = dataclasses.replace(OSS, bias=False)
    extra = float(C.recompute_modules_time(OSS, JOB, plan, CURVES) - C.recompute_modules_time(unbiased, JOB, plan, CURVES))
    assert extra == pytest.approx(bias_times(OSS, plan)[0])


def test_published_gpt_oss_runs_predict_slower_by_the_term():
    """The five Megatron-Bridge GPT-OSS 120B runs: every step gets slower, by 4-6 % where the MoE layers
    set the pace (4-8k tokens per micro-batch), by 2 % on the B200 run, which spends over half its step
    in the expert all-to-all across its eight nodes (EP 64, as its recipe sets it)."""
    cases, _ = load_h100_cases()
    oss = [c for c in cases if "GPT OSS" in c.label]
    assert len(oss) == 5
    ratios = []
    for c in oss:
        with_bias = estimate_legal(c.model, c.job, c.cluster, c.plan).step_time_s
        without = estimate_legal(dataclasses.replace(c.model, bias=False), c.job, c.cluster, c.plan).step_time_s
        ratios.append(with_bias / without)
    assert min(ratios) > 1.015 and sorted(ratios)[1] > 1.04 and max(ratios) < 1.08, ratios
