"""Attention heads whose width is not hidden / heads (``head_dim``): Qwen3, GPT-OSS-style shapes.

The queries and the attention output are heads · head_dim wide; K and V kv_heads · head_dim. The
parameter, FLOP and activation counts follow, and the presets reproduce the published totals."""
import json
from dataclasses import replace

import pandas as pd
import pytest

from paraplan.calibration import H100_CSV
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel


def test_qwen3_presets_reproduce_published_parameter_counts():
    # Qwen3 model cards: 30.5B total / 3.3B active; 235B total / 22B active
    small, large = load_model("qwen3-30b-a3b"), load_model("qwen3-235b-a22b")
    assert small.q_hidden == 4096 != small.hidden and small.kv_hidden == 512
    assert small.num_params / 1e9 == pytest.approx(30.5, abs=0.1)
    assert small.active_params / 1e9 == pytest.approx(3.3, abs=0.1)
    assert large.num_params / 1e9 == pytest.approx(235, abs=0.5)
    assert large.active_params / 1e9 == pytest.approx(22, abs=0.3)


def test_default_head_dim_changes_nothing():
    a = TransformerModel(name="a", layers=2, hidden=1024, heads=16, vocab=1000)
    b = TransformerModel(name="b", layers=2, hidden=1024, heads=16, vocab=1000, head_dim=64)
    assert a.head_dim == 64 and a.q_hidden == a.hidden
    assert a.num_params == b.num_params
    assert a.model_flops_per_token(2048) == b.model_flops_per_token(2048)


def test_wider_heads_count_their_projections_and_attention():
    narrow = TransformerModel(name="n", layers=1, hidden=2048, heads=32, vocab=1000, bias=False)
    wide = TransformerModel(name="w", layers=1, hidden=2048, heads=32, vocab=1000, bias=False, head_dim=128)
    # Q and the output projection double (2·h·h -> 2·h·2h); K and V double too (kv_heads = heads)
    assert wide.attention_params_per_layer - narrow.attention_params_per_layer == 4 * 2048 * 2048
    assert wide.attention_flops_per_token_per_layer(4096) == 2 * narrow.attention_flops_per_token_per_layer(4096)


@pytest.mark.parametrize("model, tflops_per_gpu, tokens_per_gpu, seq, causal", [
    ("nemotron3-8b", 643, 12507, 4096, False),      # NeMo 24.07 performance summary rows
    ("nemotron3-22b", 562, 4312, 4096, False),
    ("gpt3-5b", 765, 23406, 2048, False),
    ("gpt3-20b", 750, 5851, 2048, False),
    ("qwen3-30b-a3b", 666, 28934, 4096, True),      # Megatron-Bridge: causal attention counted once
    ("qwen3-235b-a22b", 907, 6131, 4096, True),
    ("deepseek-v3", 961, 3848, 4096, True),         # latent attention: 250.4 vs 249.7 GFLOP per token
])
def test_presets_match_the_recipes_model_flops(model, tflops_per_gpu, tokens_per_gpu, seq, causal):
    """The published model TFLOP/s over tokens/s is the recipe's FLOPs per token: the preset's
    shape gives the same count within 1.5 % (the files' own figures, paraplan/calibration/data/)."""
    published = tflops_per_gpu * 1e12 / tokens_per_gpu
    ours = load_model(model).model_flops_per_token(seq, causal_halved=causal)
    assert ours == pytest.approx(published, rel=0.015)


def test_calibration_file_rows_for_the_new_presets_are_scored():
    from paraplan.calibration import load_h100_cases
    cases, skipped = load_h100_cases()
    labels = " ".join(c.label for c in cases)
    for name in ("Qwen3_30B_a3B", "Nemotron-8B", "Nemotron-340B", "GPT3-5B"):
        assert name in labels
    assert len(pd.read_csv(H100_CSV)) == len(cases) + len(skipped)


def test_head_dim_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError) as e:
        TransformerModel(name="x", layers=1, hidden=2000, heads=64, vocab=10)
    assert e.value.field == "hidden" and "head_dim" in str(e.value)
    with pytest.raises(ConfigError) as e:
        TransformerModel(name="x", layers=1, hidden=2880, heads=64, vocab=10, head_dim=0)
    assert e.value.field == "head_dim"
    ok = TransformerModel(name="x", layers=1, hidden=2880, heads=64, vocab=10, head_dim=64)
    assert ok.q_hidden == 4096


def test_hf_config_and_model_file_carry_head_dim(tmp_path):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000, "hidden_act": "silu", "rope_theta": 1e6}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).q_hidden == 4096
    cfg["head_dim"] = None                       # some configs write null: the default width
    path.write_text(json.dumps(cfg))
    assert load_model(str(path)).head_dim == 64
    own = tmp_path / "m.yaml"
    own.write_text("name: m\nlayers: 2\nhidden: 2880\nheads: 64\nkv_heads: 8\nhead_dim: 64\nvocab: 1000\n")
    assert load_model(str(own)).q_hidden == 4096


def test_qwen3_estimate_and_megatron_export():
    model = load_model("qwen3-30b-a3b")
    e = estimate(model, TrainingJob(4096, 64), load_cluster("dgx-b200", 8), Plan(dp=8, ep=8, zero=1, micro_batch=1))
    assert e.feasible and e.step_time_s > 0
    # the attention core is priced at heads · head_dim: double the hidden-wide count
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "qwen3-30b-a3b", "cluster": "dgx-h100", "gpus": 8,
                                              "seq_len": 4096, "global_batch": 64},
           "plan": {"dp": 8, "ep": 8, "zero": 3, "recompute": "full"}, "estimate": {}}    # 73 of 80 GiB
    text = ex.to_megatron(doc)
    assert "--kv-channels 128" in text and "--num-query-groups 4" in text
    llama = dict(doc, scenario=dict(doc["scenario"], model="llama3-8b"), plan={"dp": 8, "zero": 1, "recompute": "full"})
    assert "--kv-channels" not in ex.to_megatron(llama)


def test_sliding_window_layers_see_only_their_window():
    oss = load_model("gpt-oss-120b")
    assert oss.num_params / 1e9 == pytest.approx(116.8, abs=0.1)          # model card: 116.8B
    assert oss.windowed_layer_share == 0.5
    full = replace(oss, sliding_window=0)
    s = 8192
    # half the layers see 128 keys instead of s: the attention FLOPs drop by (s - 128) / (2 s)
    assert oss.attention_flops_per_token_per_layer(s) == pytest.approx(
        full.attention_flops_per_token_per_layer(s) * (1 - (s - 128) / (2 * s)))
    job, cluster = TrainingJob(s, 64), load_cluster("dgx-b200", 8)
    plan = Plan(dp=8, ep=8, zero=1)
    from paraplan.costmodels.attention import attention_core_times
    from paraplan.costmodels.efficiency import curves_for
    curves = curves_for(cluster)
    windowed = attention_core_times(oss, job, plan, curves)[0]
    whole = attention_core_times(full, job, plan, curves)[0]
    assert windowed < 0.6 * whole
    with pytest.raises(ConfigError) as e:
        replace(oss, sliding_window_every=0)
    assert e.value.field == "sliding_window_every"


def test_hf_sliding_window_follows_layer_types_and_use_flag(tmp_path):
    base = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 4, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 1000,
            "hidden_act": "silu", "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base))
    m = load_model(str(path))
    assert (m.sliding_window, m.sliding_window_every) == (128, 2)
    path.write_text(json.dumps(dict(base, layer_types=None)))            # Mistral-style: every layer
    assert load_model(str(path)).sliding_window_every == 1
    path.write_text(json.dumps(dict(base, layer_types=None, use_sliding_window=False)))   # Qwen-style
    assert load_model(str(path)).sliding_window == 0


@pytest.mark.parametrize("name, total_b, active_b", [
    ("qwen3-8b", 8.2, None), ("qwen3-14b", 14.8, None), ("qwen3-32b", 32.8, None),   # Qwen3 model cards
    ("mixtral-8x22b", 141, 39), ("gpt-oss-20b", 20.9, None), ("nemotron4-340b", 341, None)])
def test_more_presets_match_their_published_sizes(name, total_b, active_b):
    m = load_model(name)
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    if active_b:
        assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.01)


@pytest.mark.parametrize("name, total_b, active_b", [
    ("kimi-k2", 1040, 32.6),             # Kimi Team 2025, arXiv:2507.20534: 1.04T total, 32.6B active
    ("llama4-scout", 109, 17), ("llama4-maverick", 400, 17)])   # Meta's model cards (with the vision encoder)
def test_kimi_and_llama4_presets_match_their_published_sizes(name, total_b, active_b):
    """Within 2 %: the published totals are rounded and Llama 4's include its vision encoder (the
    presets are the text model)."""
    m = load_model(name)
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.02)
