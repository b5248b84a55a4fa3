"""What engines keep between forward and backward and for the optimizer: Megatron-LM's gradient
buffer in bf16 (--grad-reduce-in-bf16), dropout masks only for models trained with dropout, and
Transformer Engine's fp8 copies of the linear layers' inputs."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.planner import export as ex
from paraplan.workloads.presets import load_model, model_from_hf_config
from paraplan.workloads.transformer import TrainingJob
from tests.planner.test_export import doc, parse_megatron

LLAMA70B = load_model("llama3-70b")
JOB = TrainingJob(8192, 128)


def _mem(plan, model=LLAMA70B, gpus=64, cluster="dgx-h100"):
    return estimate(model, JOB, load_cluster(cluster, gpus), plan)


# --- Megatron-LM's gradient buffer -----------------------------------------------------------------
def test_bf16_gradient_buffer_halves_megatrons_gradients_and_their_reduction():
    base = Plan(tp=4, pp=8, dp=2, sp=True, zero=1, engine="megatron")
    fp32 = _mem(base)
    bf16 = _mem(Plan(tp=4, pp=8, dp=2, sp=True, zero=1, engine="megatron", grad_reduce_bf16=True))
    assert fp32.memory_bytes_per_gpu["gradients"] == pytest.approx(2 * bf16.memory_bytes_per_gpu["gradients"])
    assert fp32.memory_bytes_per_gpu["parameters"] == bf16.memory_bytes_per_gpu["parameters"]
    # the reduce-scatter moves the buffer: fp32 traffic is twice the bf16 traffic (all-gather alike)
    assert fp32.details["dp_comm_total_s"] > bf16.details["dp_comm_total_s"]


def test_bf16_gradient_buffer_is_megatrons_option_only():
    with pytest.raises(ConfigError) as e:
        Plan(engine="torchtitan", zero=3, grad_reduce_bf16=True)
    assert e.value.field == "grad_reduce_bf16" and "megatron" in str(e.value)


def test_cli_and_export_carry_the_bf16_gradient_buffer(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--engine", "megatron",
                 "--zero", "1", "--grad-reduce-bf16"]) == 0
    capsys.readouterr()
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--engine", "deepspeed",
                 "--grad-reduce-bf16"]) != 0
    err = capsys.readouterr().err
    assert "--grad-reduce-bf16" in err and "--engine megatron" in err and "Traceback" not in err
    _, flags = parse_megatron(ex.to_megatron(doc("llama3-8b", "dgx-h100", 8, 4096, 64, zero=1, engine="megatron", recompute="full",
                                                 grad_reduce_bf16=True)))
    assert flags["--grad-reduce-in-bf16"] is True
    _, flags = parse_megatron(ex.to_megatron(doc("llama3-8b", "dgx-h100", 8, 4096, 64, zero=1, engine="megatron", recompute="full")))
    assert "--grad-reduce-in-bf16" not in flags


# --- dropout masks ---------------------------------------------------------------------------------
def test_models_trained_without_dropout_keep_no_masks():
    job = TrainingJob(2048, 8)
    plan = PlanBatch.from_plans([Plan(tp=2, sp=False)])
    llama = load_model("llama2-13b")
    assert not llama.dropout and load_model("gpt3-175b").dropout
    from dataclasses import replace
    with_masks = replace(llama, dropout=True)
    diff = float(M.activation_bytes_per_layer(with_masks, job, plan)[0] - M.activation_bytes_per_layer(llama, job, plan)[0])
    assert diff == pytest.approx(2 * llama.hidden * job.seq_len)      # two 1-byte masks per element, not split by tp


def test_hf_configs_say_whether_they_train_with_dropout():
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 128,
            "resid_pdrop": 0.1}
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "vocab_size": 100, "intermediate_size": 128, "rope_theta": 10000.0, "attention_dropout": 0.0}
    for cfg, want in ((gpt2, True), (llama, False), ({**gpt2, "resid_pdrop": 0.0}, False)):
        assert model_from_hf_config(cfg, "config.json").dropout is want


# --- Transformer Engine's fp8 saved inputs ---------------------------------------------------------
@pytest.mark.parametrize("sp", [False, True])
def test_transformer_engine_saves_fp8_linear_inputs(sp):
    m = LLAMA70B
    T, h, f, t = JOB.seq_len, m.hidden, m.ffn_hidden, 4
    acts = {}
    engines = ("megatron", "torchtitan") if sp else ("megatron", "generic")   # torchtitan's TP always shards
    for dtype in ("bf16", "fp8"):
        for engine in engines:
            p = PlanBatch.from_plans([Plan(tp=t, sp=sp, dtype=dtype, engine=engine, zero=3 if engine == "torchtitan" else 1)])
            acts[dtype, engine] = float(M.activation_bytes_per_layer(m, JOB, p)[0])
    norm_outputs = 2 * h * T / (t if sp else 1)      # QKV and FC1 inputs: 2 -> 1 byte per element
    out_proj_copy = h * T / t                         # fp8 copy beside FlashAttention's 16-bit output
    fc2_input = f * T / t                             # 2 -> 1 byte per element
    assert acts["bf16", "megatron"] - acts["fp8", "megatron"] == pytest.approx(norm_outputs - out_proj_copy + fc2_input)
    other = engines[1]
    if other == "torchtitan":
        assert acts["fp8", other] == acts["bf16", other]           # torchao saves 16-bit inputs
    else:                                                          # generic: Transformer Engine too
        assert acts["bf16", other] - acts["fp8", other] == pytest.approx(norm_outputs - out_proj_copy + fc2_input)


def test_fp8_saved_inputs_and_bf16_gradients_let_the_published_h100_layouts_fit():
    """Megatron-Bridge's Llama 3 70B fp8 layout on 64 H100 (tp4 pp8 vpp5, no recomputation, bf16
    gradient reduction as its performance recipe sets) ran; with 16-bit saved inputs and an fp32
    gradient buffer it was judged 94.6 GiB; now 73 (78 before Megatron-Core's own allocator share)."""
    plan = Plan(tp=4, pp=8, dp=2, vpp=5, schedule="interleaved", sp=True, zero=1, dtype="fp8", engine="megatron",
                tp_comm_overlap=True, grad_reduce_bf16=True)
    e = estimate(LLAMA70B, TrainingJob(8192, 128), load_cluster("dgx-h100", 64), plan)
    assert e.feasible, e.infeasible_reason
    assert np.isclose(e.memory_bytes_per_gpu["total"] / 2**30, 73, atol=3)


# --- activation offload (Megatron-LM --cpu-offloading) ----------------------------------------------
def test_activation_offload_moves_layers_to_the_host_and_charges_the_copies():
    from paraplan.costmodels.offload import activation_offload_time
    model, job = load_model("llama3-8b"), TrainingJob(8192, 64)
    cluster = load_cluster("dgx-h100", 8)
    base = Plan(dp=8, zero=1, engine="megatron", micro_batch=2)
    off = Plan(dp=8, zero=1, engine="megatron", micro_batch=2, offload_activation_layers=8)
    e0, e1 = estimate(model, job, cluster, base), estimate(model, job, cluster, off)
    per_layer = float(M.activation_bytes_per_layer(model, job, PlanBatch.from_plans([base]))[0])
    # 8 layers leave the GPU, one of them is in transit at any time
    assert e0.memory_bytes_per_gpu["activations"] - e1.memory_bytes_per_gpu["activations"] == pytest.approx(7 * per_layer)
    assert e1.host_memory_bytes_per_node - e0.host_memory_bytes_per_node == pytest.approx(8 * 8 * per_layer)
    # each micro-batch's 8 layers go down in forward and up in backward, hidden under each pass
    x = 8 * per_layer / cluster.system.pcie_bandwidth_bytes_per_s
    assert float(activation_offload_time(8 * per_layer, cluster, 4, 0.0, 0.0)) == pytest.approx(4 * 2 * x)
    assert float(activation_offload_time(8 * per_layer, cluster, 4, x, x)) == 0.0
    assert e1.time_breakdown_s["offload"] >= e0.time_breakdown_s["offload"]
    _, flags = parse_megatron(ex.to_megatron(doc("llama3-8b", "dgx-h100", 8, 4096, 64, dp=8, zero=1, engine="megatron",
                                                 offload_activation_layers=16)))
    assert flags["--cpu-offloading"] is True and flags["--cpu-offloading-num-layers"] == "16"


@pytest.mark.parametrize("plan,needle", [
    (dict(pp=2, offload_activation_layers=4, engine="megatron", zero=1), "pipeline parallelism"),
    (dict(offload_activation_layers=4, recompute="full", engine="megatron", zero=1), "recomputation"),
    (dict(offload_activation_layers=4, engine="torchtitan", zero=3, tp=1), "torchtitan has none"),
])
def test_activation_offload_refuses_what_megatron_refuses(plan, needle):
    with pytest.raises(ConfigError) as e:
        Plan(**plan)
    assert e.value.field == "offload_activation_layers" and needle in str(e.value)


def test_activation_offload_needs_fewer_layers_than_the_model(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--engine", "megatron",
                 "--zero", "1", "--offload-activation-layers", "32"]) != 0
    err = capsys.readouterr().err
    assert "offload" in err and "layers(32)" in err and "Traceback" not in err
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--engine", "megatron",
                 "--zero", "1", "--offload-activation-layers", "-1"]) != 0
    err = capsys.readouterr().err
    assert "--offload-activation-layers" in err and "0 (none)" in err and "Traceback" not in err


def test_grace_superchips_move_host_traffic_over_nvlink_c2c_not_the_nic_slot():
    """On GB200 / GB300 NVL72 the GPU reaches host memory over NVLink-C2C (NVIDIA: 900 GB/s shared by a
    superchip's two GPUs, read as bidirectional: 225 GB/s per GPU and direction, 175 sustained), while the
    compute NICs keep their PCIe Gen5 slot; a DGX's host link is its PCIe. Offload and activation offload
    are priced on the host link, the topology's GPU-NIC edge on PCIe."""
    from paraplan.costmodels.offload import activation_offload_time
    from paraplan.hardware.topology import build_topology
    gb200, dgx = load_cluster("gb200-nvl72", 8), load_cluster("dgx-h100", 8)
    assert gb200.system.host_link_bytes_per_s == pytest.approx(175e9)
    assert gb200.system.pcie_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert load_cluster("gb300-nvl72", 8).system.host_link_bytes_per_s == pytest.approx(175e9)
    assert dgx.system.host_link_bytes_per_s == dgx.system.pcie_bandwidth_bytes_per_s
    nbytes = 10e9
    assert float(activation_offload_time(nbytes, gb200, 1, 0.0, 0.0)) == pytest.approx(2 * nbytes / 175e9)
    assert float(activation_offload_time(nbytes, dgx, 1, 0.0, 0.0)) == pytest.approx(2 * nbytes / 50e9)
    g = build_topology(gb200)
    assert g.edges[("gpu", 0), ("nic", 0, 0)]["bandwidth_bytes_per_s"] == pytest.approx(50e9)
    # ZeRO-Offload's parameter upload on the same plan: 3.5x faster over C2C
    model, job = load_model("llama3-8b"), TrainingJob(4096, 64)
    plan = Plan(dp=8, zero=2, offload="cpu", engine="deepspeed", grad_accumulation_fusion=False)
    slow = estimate(model, job, dgx.with_system(accelerator=gb200.accelerator), plan).time_breakdown_s["offload"]
    fast = estimate(model, job, gb200, plan).time_breakdown_s["offload"]
    assert fast < slow / 3


def test_an_offloading_estimate_names_the_host_link_it_priced():
    model, job = load_model("llama3-8b"), TrainingJob(4096, 64)
    offload = Plan(dp=8, zero=2, offload="cpu", engine="deepspeed", grad_accumulation_fusion=False)
    lines = lambda cluster, plan: [a for a in estimate(model, job, cluster, plan).assumptions if "host link" in a]
    (c2c,) = lines(load_cluster("gb200-nvl72", 8), offload)
    assert "NVLink-C2C at 175 GB/s" in c2c
    (pcie,) = lines(load_cluster("dgx-h100", 8), offload)
    assert "PCIe Gen5 at 50 GB/s" in pcie
    assert lines(load_cluster("gb200-nvl72", 8), Plan(dp=8, zero=1)) == []
