"""QK-norm (Qwen3's q_norm / k_norm): an RMSNorm over each query and key head after the projection.
Its input is kept for backward and it streams its bytes like the layer's other norms; the harness runs
it on real torch (test_validation_memory, test_validation_parallel: qwen_tp2, qwen_tp2_sp)."""
from dataclasses import replace

import pytest

from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import activation_bytes_per_layer
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model, model_from_hf_config
from paraplan.workloads.transformer import TrainingJob

QWEN3_8B_HF = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
               "hidden_act": "silu", "rope_theta": 1000000, "tie_word_embeddings": False}


def test_qwen3_presets_and_configs_carry_qk_norm_and_llama_does_not():
    for name in ("qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b"):
        assert load_model(name).qk_norm, name
    assert not load_model("llama3-8b").qk_norm
    hf = model_from_hf_config(QWEN3_8B_HF, "config.json")
    assert hf.qk_norm and not model_from_hf_config(dict(QWEN3_8B_HF, model_type="llama"), "config.json").qk_norm
    # the norms' weights: head_dim each for the queries and the keys, per layer
    assert hf.norm_params_per_layer - replace(hf, qk_norm=False).norm_params_per_layer == 2 * 128


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (4, False)])
def test_the_norms_keep_their_input_per_tp_rank_and_selective_recompute_keeps_it(tp, sp):
    """No recomputation and selective: 2·(q + k) bytes per token over tp (16-bit) more, plus the fp32
    reciprocal RMS per head; full recomputation keeps only the layer input, as without QK-norm."""
    m = load_model("qwen3-8b")
    job = TrainingJob(4096, 64)
    T = 4096
    for recompute in ("none", "selective", "full"):
        plan = Plan(tp=tp, sp=sp, micro_batch=1, recompute=recompute)
        extra = activation_bytes_per_layer(m, job, plan) - activation_bytes_per_layer(replace(m, qk_norm=False), job, plan)
        expected = 0 if recompute == "full" else (2 * (4096 + 1024) + 4 * (32 + 8)) * T / tp
        assert float(extra) == pytest.approx(expected), recompute


def test_qk_norm_costs_time_and_memory_on_qwen3():
    """The estimate of a Qwen3 layout with its QK-norm against the same model without: slower (the norms'
    bytes forward and backward) and heavier (their inputs), by amounts of the norm's size."""
    m = load_model("qwen3-8b")
    job, cluster = TrainingJob(4096, 64), load_cluster("dgx-h100", 8)
    plan = Plan(tp=2, dp=4, sp=True, micro_batch=1, zero=1)
    with_qk, without = estimate(m, job, cluster, plan), estimate(replace(m, qk_norm=False), job, cluster, plan)
    compute = with_qk.time_breakdown_s["compute"] / without.time_breakdown_s["compute"]
    activations = with_qk.memory_bytes_per_gpu["activations"] / without.memory_bytes_per_gpu["activations"]
    assert 1.005 < compute < 1.05 and 1.03 < activations < 1.12, (compute, activations)


def test_the_estimate_says_it_priced_the_qk_norm():
    cluster, job, plan = load_cluster("dgx-h100", 8), TrainingJob(4096, 64), Plan(tp=2, dp=4, sp=True, micro_batch=1)
    said = [a for a in estimate(load_model("qwen3-8b"), job, cluster, plan).assumptions if a.startswith("QK-norm")]
    assert len(said) == 1 and "32 query and 8 key heads" in said[0]
    assert not any(a.startswith("QK-norm") for a in estimate(load_model("llama3-8b"), job, cluster, plan).assumptions)
