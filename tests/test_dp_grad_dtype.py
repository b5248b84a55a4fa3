"""The data-parallel gradient reduction moves the engine's gradient dtype: Megatron-LM its fp32 (or bf16)
main_grad buffer, torchtitan fp32 (FSDP2 reduce_dtype, torchtitan's default), the others 16 bits."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels.comm import ALL_GATHER, REDUCE_SCATTER, collective_time
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
