"""Transformer Engine (Megatron-LM, the generic engine) runs its sequence-parallel all-gathers on the
quantized tensor in fp8 and fp8-delayed: LayerNormLinear gathers the norm's fp8 output, the backward
gathers the fp8 output gradient (``gather_along_first_dim(..., quantizer=...)``). The reduce-scatters,
the LM head's collectives and an MoE dispatcher's routed-token gathers stay 16-bit."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels.comm import ALL_GATHER, REDUCE_SCATTER
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.fp8 import fp8_cast_elements, tp_gathers_fp8
from paraplan.costmodels.moe import moe_tp_collective_copies, moe_tp_routed_and_shared_copies
from paraplan.costmodels.tpcomm import tp_allreduce_time, tp_collective_time
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = load_cluster("dgx-h100", 64)
MODEL, JOB = load_model("llama3-70b"), TrainingJob(8192, 128)
PLAN = Plan(tp=4, pp=4, dp=4, sp=True, vpp=5, schedule="interleaved", micro_batch=1, zero=1,
            engine="megatron", dtype="fp8")


def _ar(plan, **kw):
    return float(np.asarray(tp_allreduce_time(MODEL, JOB, plan, CLUSTER, **kw)))


@pytest.mark.parametrize("dtype", ["fp8", "fp8-delayed"])
@pytest.mark.parametrize("engine", ["megatron", "generic"])
def test_te_gathers_carry_fp8_and_reduce_scatters_16_bit(engine, dtype):
    plan = replace(PLAN, engine=engine, dtype=dtype)
    assert bool(tp_gathers_fp8(plan))
    T = JOB.seq_len * plan.micro_batch
    rs = float(tp_collective_time(REDUCE_SCATTER, T * MODEL.hidden * 2, plan, CLUSTER))
    ag = float(tp_collective_time(ALL_GATHER, T * MODEL.hidden * 1, plan, CLUSTER))
    assert _ar(plan) == pytest.approx(rs + ag, rel=1e-12)
    assert _ar(replace(plan, dtype="bf16")) > _ar(plan)


@pytest.mark.parametrize("change", [dict(dtype="mxfp8"), dict(dtype="fp8-blockwise"), dict(dtype="bf16"),
                                    dict(sp=False),
                                    dict(dtype="fp8-rowwise", engine="torchtitan", vpp=1, schedule="1f1b", zero=3)])
def test_gathers_stay_16_bit_elsewhere(change):
    assert not bool(tp_gathers_fp8(replace(PLAN, **change)))


def test_gathered_tensors_are_cast_on_their_shard():
    """the two gathered tensors of each pass are quantized before the gather: T·h·(1 - 1/tp) fewer
    elements each, forward and backward, than where the cast follows a 16-bit gather (mxfp8 here)."""
    f8, b8 = fp8_cast_elements(MODEL, JOB, PLAN)
    fmx, bmx = fp8_cast_elements(MODEL, JOB, replace(PLAN, dtype="mxfp8"))
    T = JOB.seq_len
    assert fmx - f8 == pytest.approx(2 * T * MODEL.hidden * 3 / 4)
    assert bmx - b8 == pytest.approx(2 * T * MODEL.hidden * 3 / 4)


def test_lm_head_and_routed_tokens_gather_16_bit():
    curves = curves_for(CLUSTER)
    head = C.head_times(MODEL, JOB, PLAN, curves, CLUSTER)["tp_comm"]
    head_16 = C.head_times(MODEL, JOB, replace(PLAN, dtype="fp8-blockwise"), curves, CLUSTER)["tp_comm"]
    assert float(head) == pytest.approx(float(head_16), rel=1e-12)
    assert _ar(PLAN, fp8_gathers=False) == pytest.approx(_ar(replace(PLAN, dtype="bf16")), rel=1e-12)
    # an MoE layer with etp > 1: the routed copies' gathers stay 16-bit, the shared experts' carry fp8
    moe = load_model("deepseek-v3")
    plan = Plan(tp=2, etp=2, ep=8, pp=4, dp=8, sp=True, micro_batch=1, zero=1, engine="megatron", dtype="fp8")
    routed, shared = moe_tp_routed_and_shared_copies(moe, plan)
    assert routed > 0 and shared == 1.0
    assert float(moe_tp_collective_copies(moe, plan)) == pytest.approx(float(routed) + shared)
    job = TrainingJob(4096, 512)
    routed_ar = float(tp_allreduce_time(moe, job, plan, CLUSTER, routed, fp8_gathers=False))
    assert routed_ar == pytest.approx(float(tp_allreduce_time(moe, job, replace(plan, dtype="bf16"), CLUSTER, routed)))


def test_estimate_says_so_and_gets_faster():
    e8 = estimate(MODEL, JOB, CLUSTER, PLAN)
    assert any("Transformer Engine's LayerNormLinear" in a for a in e8.assumptions)
    e16 = estimate(MODEL, JOB, CLUSTER, replace(PLAN, dtype="fp8-blockwise"))    # 16-bit gathers
    assert not any("LayerNormLinear" in a for a in e16.assumptions)
    assert e8.time_breakdown_s["tp_comm"] < e16.time_breakdown_s["tp_comm"]
