"""Multi-head latent attention (DeepSeek-V2/V3) as the model's attention."""
import dataclasses

import pytest

from paraplan.costmodels.attention import attention_core_times
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import attention_gemm_elements_per_token
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.workloads.presets import model_from_hf_config, model_from_mapping, load_model
from paraplan.workloads.transformer import MLASpec, TrainingJob

DSV3 = load_model("deepseek-v3")

# deepseek-ai/DeepSeek-V3 config.json, the fields that shape the model
DSV3_HF = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
           "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
           "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 129280, "hidden_act": "silu", "tie_word_embeddings": False,
           "rope_theta": 10000, "attention_bias": False, "max_position_embeddings": 163840}


def test_deepseek_v3_has_its_published_size():
    """DeepSeek-AI 2024 (arXiv:2412.19437): 671B parameters, 37B activated per token (the main model,
    without the multi-token-prediction module)."""
    assert DSV3.num_params / 1e9 == pytest.approx(671.0, abs=0.5)
    assert DSV3.active_params / 1e9 == pytest.approx(37.5, abs=0.5)


def test_latent_attention_weights_and_widths():
    h, H = 7168, 128
    weights = h * 1536 + 1536 * H * 192 + h * (512 + 64) + 512 * H * (128 + 128) + H * 128 * h
    assert DSV3.attention_weights_per_layer == weights
    assert (DSV3.q_hidden, DSV3.kv_hidden, DSV3.v_hidden, DSV3.attn_out_hidden) == (H * 192, H * 192, H * 128, H * 128)
    # scores over 192 channels per head, values over 128: 2 · keys · heads · (192 + 128) per token
    assert DSV3.attention_flops_per_token_per_layer(4096) == 2 * 4096 * H * (192 + 128)
    no_q_latent = dataclasses.replace(DSV3, mla=dataclasses.replace(DSV3.mla, q_lora_rank=0))
    assert no_q_latent.attention_weights_per_layer == weights - (h * 1536 + 1536 * H * 192) + h * H * 192


def test_multi_head_models_keep_their_widths():
    llama = load_model("llama3-70b")
    assert (llama.v_hidden, llama.attn_out_hidden, llama.rope_hidden) == (
        llama.kv_hidden, llama.q_hidden, llama.q_hidden + llama.kv_hidden)
    assert llama.attention_flops_per_token_per_layer(8192) == 4 * 8192 * llama.q_hidden


def test_hf_config_and_model_file_read_it():
    m = model_from_hf_config(DSV3_HF, "config.json")
    assert m.mla == DSV3.mla and m.head_dim == 128 and m.num_params == DSV3.num_params
    v2_lite = model_from_hf_config({**DSV3_HF, "q_lora_rank": None}, "config.json")
    assert v2_lite.mla.q_lora_rank == 0
    spec = {"name": "tiny-mla", "layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "head_dim": 32,
            "mla": {"kv_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 32}}
    assert model_from_mapping(spec, "m.yaml").mla == MLASpec(kv_lora_rank=64, qk_rope_head_dim=16, v_head_dim=32)
    with pytest.raises(ConfigError) as err:
        model_from_mapping({**spec, "mla": {**spec["mla"], "kv_rank": 8}}, "m.yaml")
    assert err.value.field == "mla.kv_rank" and "kv_lora_rank" in str(err.value)
    with pytest.raises(ConfigError) as err:
        model_from_mapping({**spec, "kv_heads": 2}, "m.yaml")
    assert err.value.field == "kv_heads"
    with pytest.raises(ConfigError) as err:
        model_from_mapping({**spec, "mla": {**spec["mla"], "v_head_dim": 0}}, "m.yaml")
    assert err.value.field == "mla.v_head_dim"


def test_the_attention_core_costs_what_its_head_widths_say():
    """Against the multi-head stand-in paraplan used before (head_dim 56 = 7168/128 for both products)
    the latent-attention core runs (192 + 128) / (2 · 56) = 2.86x the FLOPs, and its projections run
    the down-projections whole on every tp rank."""
    mha = dataclasses.replace(DSV3, mla=None, head_dim=56)
    cluster = load_cluster("dgx-h100", 1024)
    curves = curves_for(cluster)
    job = TrainingJob(seq_len=4096, global_batch=8192)
    plan = Plan(tp=2, pp=8, dp=64, sp=True, ep=64, zero=1, engine="megatron", vpp=4, schedule="interleaved")
    f_mla, b_mla = attention_core_times(DSV3, job, plan, curves)
    f_mha, b_mha = attention_core_times(mha, job, plan, curves)
    assert 2.0 < float(f_mla / f_mha) < 3.0 and 2.0 < float(b_mla / b_mha) < 3.0
    ins, outs = attention_gemm_elements_per_token(DSV3, 2)
    assert ins == 7168 + 1536 + 512 + 128 * 128 / 2
    assert outs == 1536 + 128 * 192 / 2 + 576 + 128 * 256 / 2 + 7168
    e = estimate(DSV3, job, cluster, plan)
    assert e.time_breakdown_s["compute"] > estimate(mha, job, cluster, plan).time_breakdown_s["compute"]


def test_megatron_export_names_the_latent_attention():
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "deepseek-v3", "cluster": "dgx-h100", "gpus": 1024,
                                               "seq_len": 4096, "global_batch": 8192},
           "plan": {"tp": 2, "pp": 16, "dp": 32, "sp": True, "ep": 32, "zero": 1, "engine": "megatron",
                    "recompute": "full", "dtype": "fp8"}, "estimate": {}}
    script = ex.to_megatron(doc)
    for flag in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512", "--qk-head-dim 128",
                 "--qk-pos-emb-head-dim 64", "--v-head-dim 128"):
        assert flag in script
    assert "--kv-channels" not in script


def test_torchtitan_export_names_its_deepseek_v3_flavor():
    import dataclasses
    from paraplan.planner import export as ex
    from paraplan.planfile import PLAN_SCHEMA
    from paraplan.plan import Plan
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "deepseek-v3", "cluster": "dgx-b200", "gpus": 1024,
                                               "seq_len": 4096, "global_batch": 8192},
           "plan": dataclasses.asdict(Plan(pp=16, ep=64, zero=3, engine="torchtitan", recompute="full")), "estimate": {}}
    out = ex.export(doc, "torchtitan")                  # torchtitan 0.3.0: its registry function and flavor
    assert "MODEL = 'deepseek_v3'" in out.text and "FLAVOR = '671B'" in out.text
    assert "from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_671b" in out.text
    assert not any("has no flavor" in n for n in out.notes)
    toml = ex.export(doc, "torchtitan", torchtitan_format="toml").text          # torchtitan 0.2.2
    assert 'name = "deepseek_v3"' in toml and 'flavor = "671B"' in toml
