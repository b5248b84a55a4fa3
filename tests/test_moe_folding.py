"""Megatron-Core's MoE parallel folding: the expert layers regroup the tp·cp·dp ranks as etp × ep × edp,
so ep may exceed dp (Qwen3-235B on 256 H100: tp 2, dp 16, ep 32); other engines carve ep from dp."""
import numpy as np
import pytest

from paraplan.costmodels.dataparallel import dp_group
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, check_plan, expert_data_parallel, expert_group_strides
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL = load_model("qwen3-235b-a22b")
JOB = TrainingJob(4096, 2048)
CLUSTER = load_cluster("dgx-h100", 256)


def _plan(engine, **kw):
    args = dict(tp=2, pp=8, dp=16, sp=True, ep=32, vpp=4, schedule="interleaved", zero=1, engine=engine)
    args.update(kw)
    return Plan(**args)


def test_megatron_folds_ep_over_tp_and_dp_other_engines_refuse():
    plan = check_plan(_plan("megatron"), MODEL, JOB, CLUSTER)
    assert float(expert_data_parallel(plan)) == 1.0            # 2 * 16 / (32 * 1)
    assert tuple(int(x) for x in expert_group_strides(plan)) == (1, 32)
    with pytest.raises(ConfigError) as e:
        check_plan(_plan("generic", zero=1), MODEL, JOB, CLUSTER)
    assert "dp(16) % ep(32)" in str(e.value) and "folding" in str(e.value)
    with pytest.raises(ConfigError) as e:                      # 2 * 16 = 32 is not a multiple of 64
        check_plan(_plan("megatron", ep=64, dp=16), load_model("deepseek-v3"), JOB, load_cluster("dgx-h100", 256))
    assert "ep(64)" in str(e.value)


def test_folding_keeps_the_carved_layout_where_ep_fits_in_dp():
    """etp = tp, cp = 1, ep | dp: folding and carving give the same groups, so the same estimate."""
    model, job, cluster = load_model("mixtral-8x7b"), TrainingJob(4096, 256), load_cluster("dgx-h100", 64)
    kw = dict(tp=2, dp=32, ep=8, etp=2, zero=1, sp=True)
    folded, carved = Plan(engine="megatron", **kw), Plan(engine="generic", **kw)
    assert float(expert_data_parallel(folded)) == float(expert_data_parallel(carved)) == 4.0
    assert dp_group(folded, cluster, experts=True) == dp_group(carved, cluster, experts=True)


def test_folded_expert_states_are_sharded_over_their_own_replicas():
    e = estimate(MODEL, JOB, CLUSTER, _plan("megatron"))
    # 235B: 8 pp stages, experts over ep 32 (one replica each, edp 1): ~0.9B expert params per GPU;
    # 12 bytes of fp32 optimizer state each (edp 1: nothing to shard over) ~ 10 GiB, not doubled
    assert e.memory_bytes_per_gpu["optimizer_states"] / 2**30 < 16
    assert np.isfinite(e.step_time_s) and e.time_breakdown_s["ep_comm"] > 0
