"""Ring context parallelism's own costs (attention.ring_attention_merge_times, cpcomm._ring_exposed):
the per-step merge kernels of Transformer Engine's AttnFuncWithCPAndKVP2P and the last backward dK/dV
step, which nothing hides. Without them cp was free wherever its K/V traffic hid under attention, and
layouts that differ only by cp (tokens per rank held by a larger micro-batch) tied exactly."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels.attention import RING_MERGE_KERNELS_PER_STEP, ring_attention_merge_times
from paraplan.costmodels.cpcomm import cp_exposed_time, ring_attention_step_time
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL = load_model("llama3-70b")
JOB = TrainingJob(8192, 512)
CLUSTER = load_cluster("gb200-nvl72", 256)
CURVES = analytical_curves(CLUSTER.system.accelerator)


def _plan(cp, mb, mode="ring"):
    return Plan(tp=2, pp=4, dp=32 // cp, cp=cp, sp=True, micro_batch=mb, zero=1, schedule="interleaved",
                vpp=2, cp_mode=mode, engine="megatron", dtype="fp8")


def test_merge_kernels_follow_the_formula_and_vanish_without_ring():
    p = _plan(4, 2)
    T = 2 * 8192 / 4
    passes = (3 * 4 + 1) / 4
    fwd, bwd = ring_attention_merge_times(MODEL, JOB, p, CURVES)
    want_f = CURVES.memory_time(3 * 2 * passes * T * MODEL.q_hidden / 2,
                                kernels=RING_MERGE_KERNELS_PER_STEP * 4)
    want_b = CURVES.memory_time(3 * 2 * passes * T * (MODEL.q_hidden + 2 * MODEL.kv_hidden) / 2,
                                kernels=RING_MERGE_KERNELS_PER_STEP * 4)
    assert float(fwd) == pytest.approx(float(want_f)) and float(bwd) == pytest.approx(float(want_b))
    assert float(bwd) > float(fwd) > 0
    for plan in (_plan(1, 1), _plan(4, 2, "ulysses")):
        assert ring_attention_merge_times(MODEL, JOB, plan, CURVES) == (0.0, 0.0)
    # fp32 training (the CPU validation runs) streams 4-byte elements: twice the bytes
    fp32 = Plan(**{**p.__dict__, "dtype": "fp32"})
    f32, _ = ring_attention_merge_times(MODEL, JOB, fp32, CURVES)
    overhead = CURVES.kernel_overhead_s * RING_MERGE_KERNELS_PER_STEP * 4
    assert float(f32) - overhead == pytest.approx(2 * (float(fwd) - overhead))


def test_last_backward_dkv_step_is_exposed_even_when_the_ring_hides():
    p = _plan(2, 1)
    step = float(ring_attention_step_time(MODEL, JOB, p, CLUSTER))
    huge = np.array(1e3)          # attention long enough to hide every step
    assert float(cp_exposed_time(MODEL, JOB, p, CLUSTER, huge, huge)) == pytest.approx(step)
    assert float(cp_exposed_time(MODEL, JOB, _plan(1, 1), CLUSTER, huge, huge)) == 0.0


def test_layouts_that_differ_only_by_cp_no_longer_tie():
    """Same tokens per rank (micro-batch x s/cp), same memory: a wider ring now costs more step time."""
    steps = [estimate(MODEL, JOB, CLUSTER, _plan(cp, cp // 2)).step_time_s for cp in (2, 4, 8)]
    assert steps[0] < steps[1] < steps[2]
    # the cost is small against the step (merge kernels and one exposed chunk per layer): under 5 %
    assert steps[2] / steps[0] < 1.05
