"""Which fused-attention kernel a plan's engine runs where it leaves it to `auto`, and the shape that kernel
sees under context parallelism (issue 64, regime 1: long sequences)."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels.attention import (attention_core_times, attention_kernel_shape, engine_attention_kernel,
                                           measured_attention_efficiency)
from paraplan.costmodels.efficiency import curves_for
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import AttentionKernel, Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

H100 = load_cluster("dgx-h100", 64)
CURVES = curves_for(H100)
MODEL = load_model("llama3-8b")


def _one(**kw):
    return PlanBatch.from_plans([Plan(**kw)])


@pytest.mark.parametrize("engine, kernel", [("deepspeed", AttentionKernel.FLASH2), ("megatron", AttentionKernel.CUDNN),
                                            ("torchtitan", AttentionKernel.CUDNN), ("generic", AttentionKernel.AUTO)])
def test_auto_is_the_kernel_the_engine_runs_on_hopper(engine, kernel):
    """DeepSpeed's long-sequence path runs FlashAttention-2 (Megatron-DeepSpeed --use-flash-attn-v2),
    Megatron-LM and torchtitan cuDNN; an engine that does not say keeps the calibrated `auto`."""
    plan = _one(dp=64, zero=3 if engine != "megatron" else 1, engine=engine)
    got = int(np.ravel(engine_attention_kernel(plan, CURVES.attention_table))[0])
    assert got == int(kernel)


def test_deepspeed_auto_prices_flash2_not_the_unknown_kernel_estimate():
    """At 32k tokens FlashAttention-2 runs at about a third of the H100's peak (measured table), below the
    0.40 `auto` assumes for an unknown kernel: DeepSpeed's attention is slower than generic's."""
    job = TrainingJob(32768, 64)
    ds, gen = _one(dp=64, zero=3, engine="deepspeed"), _one(dp=64, zero=3, engine="generic")
    eff = float(np.ravel(measured_attention_efficiency(MODEL, ds, CURVES, 32768.0, 32.0))[0])
    assert 0.28 < eff < 0.36
    f_ds, b_ds = attention_core_times(MODEL, job, ds, CURVES)
    f_gen, b_gen = attention_core_times(MODEL, job, gen, CURVES)
    assert float(np.ravel(f_ds + b_ds)[0]) > 1.1 * float(np.ravel(f_gen + b_gen)[0])


def test_ulysses_kernel_sees_the_whole_sequence_over_fewer_heads():
    job = TrainingJob(8192, 8)
    ring = _one(dp=8, cp=8, engine="megatron", zero=1)
    ulysses = _one(dp=8, cp=8, cp_mode="ulysses", engine="deepspeed", zero=3)
    q, h = (float(np.ravel(v)[0]) for v in attention_kernel_shape(MODEL, job, ring))
    assert (q, h) == (1024.0, 32.0)
    q, h = (float(np.ravel(v)[0]) for v in attention_kernel_shape(MODEL, job, ulysses))
    assert (q, h) == (8192.0, 4.0)
    # priced at the 8k rate over 4 heads, not the 1k rate over 32: faster than the kernel the ring's 1k chunk gets
    at_8k = float(np.ravel(measured_attention_efficiency(MODEL, ulysses, CURVES, 8192.0, 4.0))[0])
    at_1k = float(np.ravel(measured_attention_efficiency(MODEL, ulysses, CURVES, 1024.0, 32.0))[0])
    assert at_8k > 1.5 * at_1k
    f, b = attention_core_times(MODEL, job, ulysses, CURVES)
    flops = 2.0 * 8192 / 8 * 8192 * (MODEL.q_hidden + MODEL.attn_out_hidden) / 2 * 3.5   # fwd + 2.5 x fwd
    assert float(np.ravel(f + b)[0]) == pytest.approx(flops / (CURVES.tensor_peak("bf16") * at_8k), rel=0.02)
