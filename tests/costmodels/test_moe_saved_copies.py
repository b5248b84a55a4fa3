"""What an MoE layer keeps of its routed token copies (memory.routed_copy_saved_bytes).

Megatron-Core weights each copy by its router score inside the experts' activation and unpermutes
without probabilities, so it keeps the experts' FC1 input only (an fp8 cast under Transformer
Engine); an engine that weights the experts' outputs in autograd keeps those too."""
from __future__ import annotations

import dataclasses

import pytest

from paraplan.calibration import load_h100_cases
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import activation_bytes_per_layer, routed_copy_saved_bytes, te_fp8_linears
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

QWEN = load_model("qwen3-30b-a3b")
JOB = TrainingJob(seq_len=4096, global_batch=512)
MEGATRON = Plan(tp=1, dp=8, ep=8, micro_batch=1, zero=1, engine="megatron")


def copy_bytes(plan):
    return float(routed_copy_saved_bytes(QWEN, plan, te_fp8_linears(plan)))


def test_megatron_keeps_the_experts_input_only_and_in_fp8_a_one_byte_cast():
    h = QWEN.hidden
    assert copy_bytes(MEGATRON) == 2 * h
    assert copy_bytes(dataclasses.replace(MEGATRON, dtype="fp8")) == 1 * h
    # an engine weighting the outputs in autograd keeps them as well (16 bits; torchtitan casts no copy to fp8)
    assert copy_bytes(dataclasses.replace(MEGATRON, engine="generic")) == 4 * h
    assert copy_bytes(dataclasses.replace(MEGATRON, engine="torchtitan", zero=3)) == 4 * h
    assert copy_bytes(dataclasses.replace(MEGATRON, engine="torchtitan", zero=3, dtype="fp8")) == 4 * h


def test_expert_tensor_parallel_gathers_the_inputs_etp_times():
    plan = dataclasses.replace(MEGATRON, tp=2, sp=True, dp=4, ep=1, etp=2)
    assert copy_bytes(plan) == 2 * 2 * QWEN.hidden
    assert copy_bytes(dataclasses.replace(plan, engine="generic")) == (2 * 2 + 2) * QWEN.hidden


def test_a_layer_keeps_k_copies_fewer_of_the_hidden_width_on_megatron():
    """Per layer and micro-batch the difference is exactly the k output copies (2h bytes each) of
    the layer's tokens: nothing else of the count depends on how the combine weights them."""
    generic = dataclasses.replace(MEGATRON, engine="generic")
    T = JOB.seq_len * MEGATRON.micro_batch
    assert float(activation_bytes_per_layer(QWEN, JOB, generic) - activation_bytes_per_layer(QWEN, JOB, MEGATRON)) \
        == pytest.approx(QWEN.moe.top_k * 2 * QWEN.hidden * T)


@pytest.mark.parametrize("row_model, gpu", [("Qwen3_235B_a22B", "DGX-B200"), ("Qwen3_235B_a22B", "DGX-H100"),
                                            ("Qwen3_235B_a22B", "DGX-GB300"), ("DeepSeekV3 (dropless)", "DGX-H100")])
def test_published_megatron_moe_runs_fit(row_model, gpu):
    """Megatron-Bridge's Qwen3 recipes switch recomputation off (set_qwen3_common_configs:
    recompute_granularity None), its DeepSeek-V3 H100 recipe recomputes mla_up_proj and mlp; those runs
    ran, so their estimates must fit the GPU (each was 6-28 % over while the experts' outputs were
    counted)."""
    cases, _ = load_h100_cases()
    picked = [c for c in cases if c.label.startswith(row_model + " " + gpu)]
    assert picked, (row_model, gpu)
    for c in picked:
        e = estimate(c.model, c.job, c.cluster, c.plan)
        assert e.feasible, (c.label, e.infeasible_reason)
