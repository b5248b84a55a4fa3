"""FSDP under pipeline parallelism (issue 64, regime 4: very large jobs, deep pipelines over FSDP).

torchtitan's apply_fsdp keeps the parameters unsharded after forward when pipelining is on
(``reshard_after_forward = not pp_enabled``: "For PP, do not reshard after forward to avoid per-microbatch
all-gathers", pytorch/torchtitan torchtitan/models/llama3/parallelize.py), and torch.distributed.pipelining's
stage runs every backward but the last with ``set_reshard_after_backward(False)`` and
``set_requires_gradient_sync(False)``, then FSDP's post-backward once (pytorch/pytorch
torch/distributed/pipelining/stage.py, ``backward_maybe_with_nosync``). So a step carries one all-gather and
one reduce-scatter of the stage's parameters whatever the number of micro-batches, and holds the unsharded
16-bit parameters and the fp32 accumulated gradients (FSDPParam.to_accumulated_grad_if_needed upcasts to
reduce_dtype) through the step.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels.comm import ALL_GATHER, REDUCE_SCATTER, collective_time
from paraplan.costmodels.dataparallel import dp_traffic, fsdp_syncs_once_per_step
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL = load_model("llama3-70b")
CLUSTER = load_cluster("dgx-h100", 512)
PLAN = Plan(tp=8, pp=4, dp=16, sp=True, zero=3, engine="torchtitan", micro_batch=1, recompute="full")


def test_fsdp_pipelines_at_zero2_3_sync_once_but_megatron_fsdp_every_micro_batch():
    """torchtitan and the generic engine (the published FSDP-under-pipeline runs) sync once per step;
    Megatron-FSDP reduce-scatters sharded gradients every micro-batch (MegatronFSDP.no_sync: "For grads shard
    mode there will actually always be gradient sync happening"); without a pipeline nothing changes."""
    plans = [PLAN, replace(PLAN, zero=2), replace(PLAN, pp=1, dp=64), replace(PLAN, engine="generic"),
             replace(PLAN, engine="megatron"), replace(PLAN, engine="generic", zero=1)]
    got = [bool(np.ravel(fsdp_syncs_once_per_step(PlanBatch.from_plans([p])))[0]) for p in plans]
    assert got == [True, True, False, True, False, False]
    lines = estimate(MODEL, TrainingJob(8192, 128), CLUSTER, PLAN).assumptions
    assert any(a.startswith("ZeRO-3 under pipeline parallelism (4 stages)") for a in lines)
    flat = estimate(MODEL, TrainingJob(8192, 128), CLUSTER, replace(PLAN, pp=1, dp=64)).assumptions
    assert not any("under pipeline parallelism" in a for a in flat)


def test_generic_zero3_under_pp_holds_zero1_states():
    """The papers' accounting under a pipeline: ZeRO-2/3 keep the 16-bit parameters and gradients whole through
    the step, (e + e)Ψ + KΨ/N, ZeRO-1's states, and move ZeRO-1's traffic."""
    job = TrainingJob(8192, 128)
    z3 = estimate(MODEL, job, CLUSTER, replace(PLAN, engine="generic"))
    z1 = estimate(MODEL, job, CLUSTER, replace(PLAN, engine="generic", zero=1))
    for key in ("parameters", "gradients", "optimizer_states"):
        assert z3.memory_bytes_per_gpu[key] == pytest.approx(z1.memory_bytes_per_gpu[key])
    assert z3.time_breakdown_s["dp_comm"] == pytest.approx(z1.time_breakdown_s["dp_comm"], rel=0.02)


def test_traffic_is_one_gather_and_one_reduce_scatter_per_step():
    """The stage's 16-bit parameters gathered once (under the first forward) and its fp32 gradients
    reduce-scattered once (under the last backward); nothing per micro-batch."""
    params = 70e9 / 32
    t = dp_traffic(params, PLAN, CLUSTER, units=21)
    n, k = 16, 1                       # dp 16 at stride tp 8: one rank per node
    intra, inter = CLUSTER.links("dp")
    assert float(t["last_backward"]) == pytest.approx(float(collective_time(REDUCE_SCATTER, 4 * params, n, k, intra, inter)))
    assert float(t["first_forward"]) == pytest.approx(float(collective_time(ALL_GATHER, 2 * params, n, k, intra, inter)))
    assert float(t["each_micro"]) == 0.0 and float(t["each_backward"]) == 0.0
    flat = dp_traffic(params, replace(PLAN, pp=1, dp=64), CLUSTER, units=21)
    assert float(flat["each_micro"]) > 0.0          # without pipelining ZeRO-3 still gathers every micro-batch


def test_dp_time_does_not_grow_with_micro_batches_under_pp():
    """Doubling the global batch doubles the micro-batches: under pp the ZeRO-3 collectives stay one per step
    (dp_comm flat), without pp they double (each micro-batch regathers and reduces)."""
    def dp(plan, gbs):
        return estimate(MODEL, TrainingJob(8192, gbs), CLUSTER, plan).time_breakdown_s["dp_comm"]
    assert dp(PLAN, 256) == pytest.approx(dp(PLAN, 128), rel=0.05)
    flat = replace(PLAN, pp=1, dp=64)
    assert dp(flat, 256) > 1.6 * dp(flat, 128)


def test_memory_holds_unsharded_parameters_and_fp32_gradients_under_pp():
    """ZeRO-3 under pp holds what ZeRO-2 holds (the 16-bit parameters, 2 bytes each) plus the accumulated
    fp32 gradients (4 bytes per parameter of the stage's GPU share)."""
    job = TrainingJob(8192, 128)
    z3 = estimate(MODEL, job, CLUSTER, PLAN).memory_bytes_per_gpu
    z2 = estimate(MODEL, job, CLUSTER, replace(PLAN, zero=2)).memory_bytes_per_gpu
    assert z3["parameters"] == pytest.approx(z2["parameters"])
    assert z3["gradients"] == pytest.approx(z2["gradients"])
    half_optim = z3["optimizer_states"] / 2                 # 4Ψ/N: the fp32 shards of parameters and gradients
    assert z3["gradients"] - half_optim == pytest.approx(2 * (z3["parameters"] - half_optim), rel=1e-6)
    flat = estimate(MODEL, job, CLUSTER, replace(PLAN, pp=1, dp=64)).memory_bytes_per_gpu
    assert flat["gradients"] == pytest.approx(flat["optimizer_states"] / 2, rel=1e-6)   # sharded only


def test_llama3_405b_deep_pipeline_dp_comm_is_small_at_16k_gpus():
    """Llama 3 405B, tp 8, pp 16, dp 128 on 16,384 H100 (Llama 3 paper, Table 4's layout) under FSDP: the
    once-per-step reduce-scatter and all-gather of 405e9/128 parameters per GPU, not 16 micro-batches of
    them: under half a second of exposed data-parallel time, where per-micro-batch ZeRO-3 priced ~6 s."""
    model = load_model("llama3-405b")
    cluster = load_cluster("dgx-h100", 16384)
    plan = Plan(tp=8, pp=16, dp=128, sp=True, zero=3, engine="torchtitan", micro_batch=1, recompute="full")
    e = estimate(model, TrainingJob(8192, 2048), cluster, plan)
    assert e.time_breakdown_s["dp_comm"] < 0.5
