"""DeepSpeed's PipelineEngine moves activations between stages as its source does: every send and
receive a blocking instruction of its own (deepspeed/runtime/pipe/p2p.py refuses async_op and calls
dist.send / dist.recv), the transfer partitioned over the tp group (pipe_partitioned and
grad_partitioned, on by default) and all-gathered back by the receiver before it computes."""
import pytest

from paraplan.costmodels.comm import ALL_GATHER, SEND_RECV, ring_time
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.p2p import p2p_receive_gather_time, p2p_time
from paraplan.costmodels.pipeline import p2p_messages_on_critical_path, pipeline_crossings_on_critical_path
from paraplan.costmodels.tpcomm import tp_collective_time
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def test_deepspeed_transfers_are_partitioned_blocking_and_gathered():
    model, job = load_model("gpt3-175b"), TrainingJob(2048, 1536)
    cluster = load_cluster("dgx-a100-80g", 1024)
    _, inter = cluster.links("pp")
    whole = 1 * 2048 * model.hidden * 2                       # micro-batch 1, bf16
    deepspeed, generic = Plan(tp=8, pp=16, dp=8, engine="deepspeed"), Plan(tp=8, pp=16, dp=8, engine="generic")
    plans = PlanBatch.from_plans([deepspeed, generic, Plan(tp=1, pp=16, dp=64, engine="deepspeed")])
    sends = p2p_time(model, job, plans, cluster)
    assert float(sends[0]) == float(sends[1]) == pytest.approx(float(ring_time(SEND_RECV, whole / 8, 2, inter)))
    crossings = pipeline_crossings_on_critical_path(plans, 96)
    assert list(crossings) == [2 * (96 + 15)] * 3
    assert list(p2p_messages_on_critical_path(plans, 96)) == [4 * 111, 2 * 111, 4 * 111]
    gather = p2p_receive_gather_time(model, job, plans, cluster)
    assert float(gather[0]) == pytest.approx(float(tp_collective_time(ALL_GATHER, whole, deepspeed, cluster)))
    assert float(gather[0]) > 0 and float(gather[1]) == 0.0 and float(gather[2]) == 0.0   # generic; tp 1


def test_deepspeed_pipeline_step_pays_its_transfers():
    """The estimate's pipeline term: transfers × send time + crossings × gather time, more than
    twice the generic engine's one paired, scattered transfer per crossing on the same layout."""
    model, job = load_model("gpt3-175b"), TrainingJob(2048, 1536)
    cluster = load_cluster("dgx-a100-80g", 1024)
    ds = Plan(tp=8, pp=16, dp=8, micro_batch=1, zero=1, engine="deepspeed")
    mg = Plan(tp=8, pp=16, dp=8, micro_batch=1, zero=1, engine="generic")
    e_ds, e_mg = estimate(model, job, cluster, ds), estimate(model, job, cluster, mg)
    m = e_ds.details["micro_batches_per_step"]
    expected = (float(p2p_messages_on_critical_path(ds, m)) * float(p2p_time(model, job, ds, cluster))
                + float(pipeline_crossings_on_critical_path(ds, m)) * float(p2p_receive_gather_time(model, job, ds, cluster)))
    assert e_ds.time_breakdown_s["pp_comm"] == pytest.approx(expected)
    assert e_ds.time_breakdown_s["pp_comm"] > 2 * e_mg.time_breakdown_s["pp_comm"]


def test_megatron_core_sends_the_whole_activation_without_sequence_parallelism():
    """Megatron-Core has no scatter-gather: schedules.get_tensor_shapes divides the sequence by tp only
    under sequence parallelism, so without it every tp rank sends the whole b·s·h activation (the
    generic engine keeps Megatron-LM 2021's scatter over tp, the code of the published 2021 runs)."""
    model, job = load_model("gpt3-175b"), TrainingJob(2048, 1536)
    cluster = load_cluster("dgx-a100-80g", 1024)
    _, inter = cluster.links("pp")
    whole = 1 * 2048 * model.hidden * 2
    plans = PlanBatch.from_plans([Plan(tp=8, pp=16, dp=8, engine="megatron"),
                                  Plan(tp=8, pp=16, dp=8, sp=True, engine="megatron"),
                                  Plan(tp=8, pp=16, dp=8, engine="generic")])
    sends = p2p_time(model, job, plans, cluster)
    assert float(sends[0]) == pytest.approx(float(ring_time(SEND_RECV, whole, 2, inter)))
    assert float(sends[1]) == float(sends[2]) == pytest.approx(float(ring_time(SEND_RECV, whole / 8, 2, inter)))


def test_bf16_optimizer_accumulates_every_micro_batch_into_fp32():
    """DeepSpeed's BF16_Optimizer (bf16 with a pipeline, or ZeRO-0) adds each micro-batch's 16-bit
    gradients into fp32 ones after its backward (PipelineEngine._exec_backward_pass calls
    update_hp_grads): m x 18 bytes per stage parameter in 2 kernels per tensor, the first micro-batch
    too, whatever --no-grad-accumulation-fusion says. Not under fp16, not for ZeRO-1 without a
    pipeline, not for other engines."""
    from dataclasses import replace
    from paraplan.costmodels.efficiency import curves_for
    from paraplan.costmodels.accumulation import (DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM,
                                                  DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR)
    from paraplan.costmodels.offload import stage_param_tensors
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", 384)
    job = TrainingJob(2048, 1536)
    ds = Plan(tp=8, pp=12, dp=4, micro_batch=1, zero=1, recompute="full", engine="deepspeed")
    e1 = estimate(model, job, cluster, ds)
    m = 1536 // 4
    grads = e1.details["model_params"] / 8 / 12           # 96 layers split evenly, tp 8: embeddings aside
    per = curves_for(cluster).streaming_time(DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM * grads,
                                             kernels=DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR
                                             * stage_param_tensors(model, ds))
    acc1 = e1.time_breakdown_s["grad_accumulation"]
    assert acc1 == pytest.approx(m * float(per), rel=0.05)         # the largest stage holds the embedding
    e4 = estimate(model, job, cluster, replace(ds, micro_batch=4))
    assert e4.time_breakdown_s["grad_accumulation"] == pytest.approx(acc1 / 4)
    assert estimate(model, job, cluster, replace(ds, grad_accumulation_fusion=False)).time_breakdown_s[
        "grad_accumulation"] == pytest.approx(acc1)
    for other in (replace(ds, dtype="fp16"), replace(ds, engine="generic"), replace(ds, pp=1, dp=48, micro_batch=2)):
        assert estimate(model, job, cluster, other).time_breakdown_s["grad_accumulation"] == 0.0
    assert estimate(model, job, cluster, replace(ds, pp=1, dp=48, micro_batch=2, zero=0)).time_breakdown_s["grad_accumulation"] > 0


def test_deepspeed_export_asks_for_the_accumulation_the_estimate_prices():
    """Where the estimate prices BF16_Optimizer (bf16 with a pipeline, or ZeRO-0), the DeepSpeed config
    says fp32 gradient accumulation (data_types.grad_accum_dtype), which is what makes DeepSpeed pick that
    optimizer under ZeRO-1; a bf16 ZeRO-1 plan without a pipeline, and fp16, get no such key."""
    import json
    from paraplan.planfile import PLAN_SCHEMA
    from paraplan.planner import export as ex

    def config(**plan):
        d = {"schema": PLAN_SCHEMA, "scenario": {"model": "gpt-1.7b", "cluster": "dgx-a100-80g", "gpus": 8,
                                                "seq_len": 2048, "global_batch": 64},
             "plan": {"engine": "deepspeed", **plan}, "estimate": {}}
        out = ex.export(d, "deepspeed")
        return json.loads(out.text), out.notes

    cfg, notes = config(pp=2, dp=4, zero=1, micro_batch=2)
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and any("BF16_Optimizer" in n for n in notes)
    assert config(dp=8, zero=0)[0]["data_types"] == {"grad_accum_dtype": "fp32"}
    assert "data_types" not in config(dp=8, zero=1)[0]
    assert "data_types" not in config(pp=2, dp=4, zero=1, micro_batch=2, dtype="fp16")[0]
