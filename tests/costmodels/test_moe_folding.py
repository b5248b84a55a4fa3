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
    cluster = load_cluster("dgx-h100", 64)
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


def test_carved_experts_sum_their_gradients_over_their_tp_replicas():
    """Where ep is carved from dp, an expert shard sits on tp/etp ranks of each tp group, which ran
    different tokens (their sequence shards): their gradients are all-reduced over those ranks once a
    step, as tp communication (the harness measured 102 ms of tp traffic against 26 ms predicted on
    tp 2 sp with 8 whole experts before it was priced). Megatron-Core folds those replicas into its
    expert-data-parallel group, and etp = tp leaves none."""
    from paraplan.costmodels.dataparallel import expert_tp_replica_allreduce_time
    model, job, cluster = load_model("mixtral-8x7b"), TrainingJob(4096, 256), load_cluster("dgx-h100", 64)

    def checked(**kw):
        return check_plan(Plan(**{**dict(tp=2, dp=32, ep=8, zero=1, sp=True), **kw}), model, job, cluster)

    def extra(plan):
        return float(expert_tp_replica_allreduce_time(1e9, plan, cluster))
    generic, torchtitan = checked(engine="generic"), checked(engine="torchtitan", zero=3)
    assert extra(generic) > 0 and extra(torchtitan) > 0
    assert extra(checked(engine="generic", etp=2)) == 0.0
    assert extra(checked(engine="megatron")) == 0.0
    assert float(expert_tp_replica_allreduce_time(0.0, generic, cluster)) == 0.0
    # twice the parameters, about twice the seconds; in the estimate, as tp communication
    assert float(expert_tp_replica_allreduce_time(2e9, generic, cluster)) == pytest.approx(2 * extra(generic), rel=0.05)
    # the same layout on Megatron-Core (folded: no such term) differs in its tp time by exactly that
    from paraplan.costmodels.memory import expert_params_per_gpu
    carved = estimate(model, job, cluster, generic).time_breakdown_s["tp_comm"]
    folded = estimate(model, job, cluster, checked(engine="megatron")).time_breakdown_s["tp_comm"]
    term = float(expert_tp_replica_allreduce_time(expert_params_per_gpu(model, generic), generic, cluster))
    assert term > 0.01 and carved - folded == pytest.approx(term, rel=1e-9)


@pytest.mark.parametrize("kw, copies", [(dict(etp=2, sp=True), 2.0),      # Mixtral top-2: k·etp/tp
                                        (dict(sp=True), 0.0),             # whole experts, own shard
                                        (dict(sp=False), 0.5)])           # drop_tokens / gather_tokens
def test_an_moe_layers_tp_traffic_follows_its_expert_tensor_parallelism(kw, copies):
    """The rows an MoE layer moves over tp per pass, in units of T: the routed copies all-gathered and
    reduce-scattered over the etp group (Megatron-Core), nothing where whole experts run on each rank's
    sequence shard, one all-gather of T where every tp rank holds all tokens (DeepSpeed-MoE)."""
    from paraplan.costmodels.moe import moe_tp_collective_copies
    model, job, cluster = load_model("mixtral-8x7b"), TrainingJob(4096, 256), load_cluster("dgx-h100", 64)
    plan = check_plan(Plan(**{**dict(tp=2, dp=32, ep=8, zero=1, engine="generic"), **kw}), model, job, cluster)
    assert float(moe_tp_collective_copies(model, plan)) == copies
