"""Sequence parallelism's backward re-gather (Korthikanti et al. 2022 sec. 4.2.2; Megatron-LM's
LinearWithGradAccumulationAndAsyncCommunication): a column-parallel linear keeps only its input's
sequence shard and all-gathers it again in its backward, launched before the input-gradient GEMM and
waited on before the weight-gradient one, so it hides under the first."""
import numpy as np
import pytest

from paraplan.costmodels.comm import ALL_GATHER
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import (attention_gemm_forward_times, linear_gemm_time, mlp_gemm_forward_times,
                                         tokens_per_rank)
from paraplan.costmodels.tpcomm import (TP_OVERLAP_CONTENTION, sp_backward_regather_time, tp_collective_time,
                                        tp_gathered_bytes)
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, check_plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL, JOB, CLUSTER = load_model("llama3-70b"), TrainingJob(8192, 64), load_cluster("dgx-h100", 64)


def _regather(plan, curves):
    """The re-gather's exposed seconds, given the layer's projection times as layer_times prices them."""
    return float(sp_backward_regather_time(MODEL, JOB, plan, CLUSTER, curves,
                                           attention_gemm_forward_times(MODEL, JOB, plan, curves),
                                           mlp_gemm_forward_times(MODEL, JOB, plan, curves)[0]))


def _plan(**kw):
    return check_plan(Plan(**{**dict(tp=8, pp=2, dp=4, sp=True, micro_batch=1, zero=1), **kw}), MODEL, JOB, CLUSTER)


def test_megatron_regathers_the_attention_and_mlp_inputs_hidden_under_their_dgrad_gemms():
    plan = _plan(engine="megatron")
    curves = curves_for(CLUSTER)
    gather = float(tp_collective_time(ALL_GATHER, tp_gathered_bytes(MODEL, JOB, plan), plan, CLUSTER))
    T, h, t = tokens_per_rank(JOB, plan), MODEL.hidden, 8
    qkv = float(linear_gemm_time(curves, T, (MODEL.q_hidden + 2 * MODEL.kv_hidden) / t, h, plan))
    fc1 = float(linear_gemm_time(curves, T, 2 * MODEL.ffn_hidden / t, h, plan))

    def hidden(window):
        return max(0.0, gather - window) + TP_OVERLAP_CONTENTION * min(gather, window)
    got = _regather(plan, curves)
    assert got == pytest.approx(hidden(qkv) + hidden(fc1), rel=1e-9)
    assert 0 < got < 2 * gather          # partly hidden: less than the two gathers themselves


@pytest.mark.parametrize("kw", [dict(engine="torchtitan", zero=3, pp=1, dp=8), dict(engine="scaling"),
                                dict(engine="megatron", sp=False), dict(engine="megatron", tp=1, dp=32, sp=False),
                                dict(engine="torchtitan", zero=3, pp=1, dp=8, recompute="op-sac")])
def test_no_regather_where_the_gathered_input_is_kept_or_there_is_none(kw):
    """torchtitan and Scaling keep the gathered input (op-level SAC's re-gathers are priced apart);
    without sequence or tensor parallelism nothing is gathered."""
    plan = _plan(**kw)
    assert _regather(plan, curves_for(CLUSTER)) == 0.0


def test_the_regather_is_tensor_parallel_time_of_the_step():
    """Per layer and micro-batch in tp_comm: the same plan on the generic engine (which follows the paper)
    and on torchtitan-like keeping differ in tp time by layers x micro-batches x the re-gather."""
    plan = _plan(engine="megatron")
    curves = curves_for(CLUSTER)
    per_layer = _regather(plan, curves)
    e = estimate(MODEL, JOB, CLUSTER, plan)
    m = JOB.global_batch // (plan.dp * plan.micro_batch)
    assert e.time_breakdown_s["tp_comm"] >= m * MODEL.layers / plan.pp * per_layer * (1 - 1e-9)
    assert np.isfinite(e.step_time_s)
