"""Property tests of the cost model (hypothesis)."""

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, check_plan
from paraplan.workloads.transformer import TrainingJob, TransformerModel

pow2 = st.sampled_from([1, 2, 4, 8])


@st.composite
def models(draw):
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    return TransformerModel(name="m", layers=draw(st.sampled_from([8, 16, 24, 32])), hidden=hidden, heads=heads,
                            kv_heads=kv, vocab=draw(st.sampled_from([32000, 51200])),
                            activation=draw(st.sampled_from(["gelu", "swiglu"])),
                            ffn_hidden=hidden * draw(st.sampled_from([2, 3, 4])))


@settings(max_examples=60, deadline=None)
@given(params=st.floats(1e8, 1e12), dp=st.sampled_from([1, 2, 8, 64, 512]), cp=pow2,
       offload=st.sampled_from(["none", "cpu", "nvme"]))
def test_more_zero_sharding_never_raises_model_state_memory(params, dp, cp, offload):
    stages = [0, 1, 2, 3] if offload == "none" else [1, 2, 3]
    totals = [sum(float(v) for v in M.model_state_bytes(params, Plan(dp=dp, cp=cp, zero=z, offload=offload)).values())
              for z in stages]
    assert all(b <= a + 1e-6 for a, b in zip(totals, totals[1:]))


@settings(max_examples=60, deadline=None)
@given(model=models(), t=pow2, sp=st.booleans(), b=st.sampled_from([1, 2, 4]), s=st.sampled_from([512, 2048, 8192]),
       flash=st.booleans())
def test_full_recompute_never_uses_more_activation_memory(model, t, sp, b, s, flash):
    assume(model.heads % t == 0 and (t > 1 or not sp))
    job = TrainingJob(seq_len=s, global_batch=64)
    act = {mode: float(M.activation_bytes_per_layer(model, job, Plan(tp=t, sp=sp, micro_batch=b, recompute=mode,
                                                                     flash_attention=flash)))
           for mode in ("none", "selective", "full")}
    assert act["full"] <= act["selective"] <= act["none"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), t=pow2, p=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 2, 3]),
       scale=st.floats(0.05, 0.95), tier=st.sampled_from(["intra_node", "inter_node"]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_step_time_never_drops_when_a_link_gets_slower(model, t, p, zero, scale, tier, recompute):
    assume(model.heads % t == 0 and model.layers % p == 0)
    cluster = load_cluster("dgx-h100", 32)
    job = TrainingJob(seq_len=2048, global_batch=128)
    plan = Plan(tp=t, pp=p, zero=zero, recompute=recompute)
    try:
        fast = estimate(model, job, cluster, plan)
    except ConfigError:
        return
    link = getattr(cluster.system, tier)
    slow_cluster = cluster.with_system(**{tier: link.scaled(scale)})
    slow = estimate(model, job, slow_cluster, plan)
    assert slow.step_time_s >= fast.step_time_s * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(t=st.integers(1, 16), p=st.integers(1, 16), d=st.integers(0, 64), c=st.integers(1, 4),
       gpus=st.sampled_from([8, 16, 64, 96, 128]), b=st.integers(1, 8))
def test_accepted_plans_multiply_to_the_gpu_count(t, p, d, c, gpus, b):
    model = TransformerModel(name="m", layers=48, hidden=4096, heads=32, vocab=32000)
    cluster = load_cluster("dgx-a100-80g", gpus)
    job = TrainingJob(seq_len=4096, global_batch=512)
    try:
        plan = check_plan(Plan(tp=t, pp=p, dp=d, cp=c, micro_batch=b), model, job, cluster)
    except ConfigError as e:
        assert "plan" in str(e) or "gpus" in str(e)
        return
    assert plan.tp * plan.pp * plan.dp * plan.cp == gpus
