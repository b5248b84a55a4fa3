"""The data-parallel gradient reduction moves the engine's gradient dtype: Megatron-LM its fp32 (or bf16)
main_grad buffer, torchtitan fp32 (FSDP2 reduce_dtype, torchtitan's default), DeepSpeed's BF16_Optimizer
fp32, the others 16 bits; and DeepSpeed hides what its source hides, no more."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time
from paraplan.costmodels.dataparallel import dp_grad_bytes, dp_group, dp_traffic
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch


def _batch(**kw):
    return PlanBatch.from_plans([Plan(dp=16, **kw)])


@pytest.mark.parametrize("kw, expected", [
    (dict(engine="generic", zero=3), 2.0),
    (dict(engine="deepspeed", zero=3), 2.0),
    (dict(engine="megatron", zero=1), 4.0),
    (dict(engine="megatron", zero=1, grad_reduce_bf16=True), 2.0),
    (dict(engine="torchtitan", zero=3), 4.0),
    (dict(engine="torchtitan", zero=0), 4.0),
    (dict(engine="deepspeed", zero=1, pp=2), 4.0),           # BF16_Optimizer (bf16 with a pipeline)
    (dict(engine="deepspeed", zero=0), 4.0),                 # BF16_Optimizer (bf16 at ZeRO-0)
    (dict(engine="deepspeed", zero=1), 2.0),                 # the ZeRO optimizer
    (dict(engine="deepspeed", zero=1, pp=2, dtype="fp16"), 2.0),
])
def test_gradient_bytes_per_parameter_by_engine(kw, expected):
    assert float(dp_grad_bytes(_batch(**kw))[0]) == expected


def test_torchtitan_reduce_scatters_fp32_gradients_and_gathers_bf16_parameters():
    cluster = load_cluster("dgx-h100", 16)
    params, units = 1e9, 33
    tt = _batch(engine="torchtitan", zero=3)
    n, k = dp_group(tt, cluster)
    intra, inter = cluster.links("dp")
    expected = units * (2 * collective_time(ALL_GATHER, 2 * params / units, n, k, intra, inter)
                        + collective_time(REDUCE_SCATTER, 4 * params / units, n, k, intra, inter))
    got = dp_traffic(params, tt, cluster, units=units)["each_micro"]
    assert float(got[0]) == pytest.approx(float(np.asarray(expected).ravel()[0]))
    generic = dp_traffic(params, _batch(engine="generic", zero=3), cluster, units=units)["each_micro"]
    assert float(got[0]) > 1.2 * float(generic[0])          # 2 AG + fp32 RS against 2 AG + bf16 RS


def _collectives(plan, cluster):
    n, k = dp_group(plan, cluster)
    intra, inter = cluster.links("dp")
    return lambda kind, size: float(np.ravel(collective_time(kind, size, n, k, intra, inter))[0])


@pytest.mark.parametrize("kw, exposed_of, hidden_reduction", [
    # BF16_Optimizer under a pipeline: fp32 all-reduce after the last backward, then the 16-bit all-gather
    (dict(pp=2, zero=1), lambda c, P: c(ALL_REDUCE, 4 * P) + c(ALL_GATHER, 2 * P), None),
    # fp16 pipeline, ZeRO-1: the ZeRO optimizer's reduce-scatter and all-gather, both after the backward
    (dict(pp=2, zero=1, dtype="fp16"), lambda c, P: c(REDUCE_SCATTER, 2 * P) + c(ALL_GATHER, 2 * P), None),
    # ZeRO-0, bf16: BF16_Optimizer's fp32 all-reduce after loss.backward()
    (dict(zero=0), lambda c, P: c(ALL_REDUCE, 4 * P), None),
    # ZeRO-1 without a pipeline: the reduction hides in backward hooks (overlap_comm), the all-gather does not
    (dict(zero=1), lambda c, P: c(ALL_GATHER, 2 * P), lambda c, P: c(REDUCE_SCATTER, 2 * P)),
])
def test_deepspeed_exposes_what_its_source_runs_outside_the_backward(kw, exposed_of, hidden_reduction):
    cluster = load_cluster("dgx-a100-80g", 64)
    params = 2e9
    plan = PlanBatch.from_plans([Plan(dp=64 // kw.get("pp", 1), engine="deepspeed", **kw)])
    c = _collectives(plan, cluster)
    t = {k: float(np.ravel(v)[0]) for k, v in dp_traffic(params, plan, cluster).items()}
    assert t["exposed"] == pytest.approx(exposed_of(c, params))
    assert t["first_forward"] == 0.0
    assert t["last_backward"] == (pytest.approx(hidden_reduction(c, params)) if hidden_reduction else 0.0)
