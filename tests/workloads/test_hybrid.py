"""Hybrid Mamba-2 / attention models (Nemotron-H): the layer pattern, the Mamba-2 mixer's parameters
and FLOPs, the presets' published sizes and the Hugging Face config reader."""
from pathlib import Path

import pytest

from paraplan.errors import ConfigError
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import MambaSpec

DATA = Path(__file__).parent / "data" / "written"


def test_mamba2_mixer_parameters_by_hand():
    """Nemotron-H-8B's mixer (Megatron-LM mamba_mixer.py): in_proj 4096 x (2·8192 + 2·8·128 + 128) =
    4096 x 18560, conv (8192 + 2048) x (4 + 1), A_log / D / dt_bias 3 x 128, gated norm 8192, out_proj
    8192 x 4096."""
    m = MambaSpec(heads=128, head_dim=64, state=128, groups=8)
    assert (m.d_inner, m.in_proj_width, m.conv_width) == (8192, 18560, 10240)
    assert m.params(4096) == 4096 * 18560 + 10240 * 5 + 3 * 128 + 8192 + 8192 * 4096 == 109_635_968


# The presets' totals: nemotron-h-8b's equals, to the parameter, a tensor-by-tensor count of the released
# Nemotron-H-8B-Base-8K checkpoint (8,100,852,736); both round to the model cards' "8B" and "56B"
# (huggingface.co/nvidia/Nemotron-H-56B-Base-8K: "This model has 56B model parameters").
GOLDEN = {"nemotron-h-8b": (8_100_852_736, 8.0, 0.013), "nemotron-h-56b": (56_324_350_464, 56.0, 0.006),
          "nemotron-h-47b": (46_791_554_816, 47.0, 0.005)}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_nemotron_h_presets_have_their_published_size(name):
    exact, nominal, rel = GOLDEN[name]
    m = load_model(name)
    assert m.num_params == exact
    assert m.num_params / 1e9 == pytest.approx(nominal, rel=rel)
    assert round(m.num_params / 1e9) == nominal


def test_nemotron_h_56b_layer_counts_match_the_model_card():
    m = load_model("nemotron-h-56b")
    assert (m.kind_count("mamba"), m.kind_count("attention"), m.kind_count("mlp")) == (54, 10, 54)


def test_hybrid_flops_have_no_quadratic_term_outside_the_attention_layers():
    """Per token, forward: the attention score FLOPs count on the 4 attention layers of 52 only, and the
    Mamba layers add their GEMMs and a scan linear in the sequence (Dao & Gu 2024 sec. 6)."""
    m = load_model("nemotron-h-8b")
    s = 8192
    per_attention_layer = 2 * s * (m.q_hidden + m.attn_out_hidden)
    assert m.layers * m.attention_flops_per_token_per_layer(s) == pytest.approx(4 * per_attention_layer)
    scan = m.mamba.scan_flops_per_token()
    assert scan == 2 * 8 * 128 * 128 + 128 * (2 * 128 * 64 + 4 * 128 * 64)
    gemms = 24 * 2 * (4096 * 18560 + 8192 * 4096) + 4 * 2 * m.attention_weights_per_layer + 24 * 2 * 2 * 4096 * 21504
    fwd = gemms + 4 * per_attention_layer + 24 * scan + 2 * 4096 * 131072
    assert m.model_flops_per_token(s) == pytest.approx(3 * fwd)
    # doubling the sequence adds only the attention layers' term
    assert m.model_flops_per_token(2 * s) - m.model_flops_per_token(s) == pytest.approx(3 * 4 * per_attention_layer)


def test_hugging_face_config_reads_the_hybrid_pattern():
    m = load_model(str(DATA / "nemotron_h_8b_config.json"))
    preset = load_model("nemotron-h-8b")
    assert m.layer_pattern == preset.layer_pattern and m.mamba == preset.mamba
    assert (m.norm, m.activation, m.bias, m.dropout, m.tied_embeddings) == ("rmsnorm", "relu", False, False, False)
    assert m.num_params == preset.num_params


@pytest.mark.parametrize("body,field", [
    ("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M*-'\n", "mamba"),
    ("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'MX-'\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n",
     "layer_pattern"),
    ("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'ME-'\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n",
     "moe"),
    ("layers: 4\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M*-'\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n",
     "layer_pattern"),
    ("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M*-'\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 3}\n",
     "mamba.groups"),
    ("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M*-'\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 1, d: 2}\n",
     "mamba.d"),
])
def test_bad_hybrid_model_files_name_the_field(tmp_path, body, field):
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert str(e.value).startswith(field)


def test_hybrid_model_file_round_trip(tmp_path):
    f = tmp_path / "h.yaml"
    f.write_text("layers: 3\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M*-'\nnorm: rmsnorm\nbias: false\n"
                 "mamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n")
    m = load_model(str(f))
    mixer = 64 * (2 * 128 + 32 + 4) + (128 + 32) * 5 + 12 + 128 + 128 * 64
    assert m.kind_params("mamba") == mixer + 64
    assert m.num_params == mixer + 64 + (4 * 64 * 64 + 64) + (2 * 64 * 256 + 64) + 2 * 10 * 64 + 64


@pytest.mark.parametrize("name,preset", [("nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
                                         ("Nemotron-H 56B", "nemotron-h-56b"),
                                         ("Nemotron-H-47B-Base-8K", "nemotron-h-47b"),
                                         ("Llama-3.1-70B", "llama3-70b"), ("Qwen3-8B", "qwen3-8b")])
def test_published_names_of_nemotron_h_read_as_the_presets(name, preset):
    """Model cards write the context length after the name ("-8K"): it does not change the model."""
    assert load_model(name).name == preset


def test_hugging_face_pattern_of_the_wrong_length_names_the_file_key(tmp_path):
    import json
    cfg = json.loads((DATA / "nemotron_h_8b_config.json").read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "num_hidden_layers": 50}))
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert e.value.field == "hybrid_override_pattern" and "num_hidden_layers is 50" in str(e.value)
