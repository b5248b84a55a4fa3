"""FSDP2's copies around its collectives (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):
the copy-out after each all-gather runs on the compute stream and is never hidden; the chunk-cat that
builds each reduce-scatter's fp32 input runs on the reduce-scatter stream ahead of it (issue 64,
regime 2: small dense models under FSDP, where a micro-batch's compute is short against the copies)."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels.dataparallel import fsdp2_copy_times
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = load_cluster("dgx-h100", 8)
CURVES = curves_for(CLUSTER)
PARAMS, UNITS = 8.0e9, 33


def _copies(**kw):
    out, cat = fsdp2_copy_times(PARAMS, PlanBatch.from_plans([Plan(**{"dp": 8, **kw})]), CURVES, UNITS)
    return float(np.ravel(out)[0]), float(np.ravel(cat)[0])


def test_zero3_copies_out_both_gathers_and_chunk_cats_fp32_gradients():
    out, cat = _copies(engine="torchtitan", zero=3)
    assert out == pytest.approx(float(CURVES.streaming_time(2 * 2 * 2 * PARAMS, kernels=2 * UNITS)))
    assert cat == pytest.approx(float(CURVES.streaming_time((2 + 4) * PARAMS, kernels=UNITS)))
    out2, cat2 = _copies(engine="torchtitan", zero=2)      # no reshard after forward: one gather
    assert out2 == pytest.approx(float(CURVES.streaming_time(2 * 2 * PARAMS, kernels=UNITS)))
    assert cat2 == pytest.approx(cat)


@pytest.mark.parametrize("kw", [dict(engine="torchtitan", zero=0), dict(engine="torchtitan", zero=3, dp=1),
                                dict(engine="megatron", zero=3), dict(engine="deepspeed", zero=3),
                                dict(engine="generic", zero=3)])
def test_only_fsdp2_sharding_copies(kw):
    """FSDP1, Megatron-FSDP and DeepSpeed gather into storage their parameters view; replication (ZeRO-0) and a single
    rank shard nothing per layer (torchtitan offers ZeRO 0, 2, 3)."""
    assert _copies(**kw) == (0.0, 0.0)


def test_the_copy_out_is_exposed_and_weighs_most_at_short_micro_batches():
    """Llama 3 8B, FSDP2 on 8 H100s, micro-batch 1: the step grows by at least the copy-out of every
    micro-batch (it waits on the all-gather on the compute stream), and by a larger share at 2k tokens
    than at 8k, where the micro-batch's compute is 4x longer."""
    model = load_model("llama3-8b")
    plan = Plan(dp=8, zero=3, engine="torchtitan", micro_batch=1, recompute="full")
    shares = []
    for seq in (2048, 8192):
        job = TrainingJob(seq, 16)
        tt = estimate(model, job, CLUSTER, plan)
        m = 2                                               # 16 sequences over 8 ranks at micro-batch 1
        copy_out = _copies(engine="torchtitan", zero=3)[0] * tt.details["layers_per_stage"][0] / 32
        assert tt.time_breakdown_s["dp_comm"] >= m * copy_out * 0.99
        shares.append(m * copy_out / tt.step_time_s)
    assert shares[0] > 2.5 * shares[1] and shares[0] > 0.05
