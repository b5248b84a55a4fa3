import json

import pytest

from paraplan.errors import ConfigError
from paraplan.workloads.presets import load_model, model_names

PUBLISHED_BILLIONS = {  # parameter counts as published by each model's authors
    "gpt-1.7b": 1.7, "gpt-3.6b": 3.6, "gpt-7.5b": 7.5, "gpt-18b": 18.4, "gpt-39b": 39.1, "gpt-76b": 76.1,
    "gpt-145b": 145.6, "gpt-310b": 310.1, "gpt-530b": 529.6, "gpt-1t": 1008.0, "gpt3-175b": 175.0,
    "bloom-176b": 176.2, "mt-nlg-530b": 530.0, "llama2-7b": 6.74, "llama2-13b": 13.0, "llama2-70b": 69.0,
    "llama3-8b": 8.03, "llama3-70b": 70.6, "llama3-405b": 405.8}


def test_every_required_preset_exists():
    assert set(PUBLISHED_BILLIONS) <= set(model_names())


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_BILLIONS.items()))
def test_preset_parameter_counts_match_published(name, billions):
    assert load_model(name).num_params / 1e9 == pytest.approx(billions, rel=0.03)


def test_model_file_defaults(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: tiny\nlayers: 4\nhidden: 256\nheads: 4\nvocab: 1000\n")
    m = load_model(str(f))
    assert (m.kv_heads, m.ffn_hidden, m.activation, m.tied_embeddings) == (4, 1024, "gelu", False)


def test_hugging_face_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu",
           "tie_word_embeddings": False}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    m = load_model(str(f))
    assert m.activation == "swiglu" and m.kv_heads == 8
    assert m.num_params == load_model("llama3-8b").num_params


@pytest.mark.parametrize("body,field", [("layers: -3\nhidden: 64\nheads: 4\nvocab: 10\n", "layers"),
                                        ("hidden: 64\nheads: 4\nvocab: 10\n", "layers"),
                                        ("layers: 2\nhidden: 65\nheads: 4\nvocab: 10\n", "hidden"),
                                        ("layers: 2\nhidden: 64\nheads: 4\nvocab: 10\nactivation: tanh\n", "activation"),
                                        ("layers: 2\nhidden: 64\nheads: 4\nvocab: 10\ncolour: red\n", "colour"),
                                        ("layers: [2\n", "model"),
                                        ("layers: 2\nhidden: 64\nheads: 4\nvocab: 10\n"
                                         "moe: {experts: 4, expert_ffn_hidden: 64, dispatch: gather}\n", "moe.dispatch")])
def test_bad_model_files_name_the_field(tmp_path, body, field):
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert str(e.value).startswith(field)


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ConfigError) as e:
        load_model("llama3-7b")
    assert "did you mean" in str(e.value) and "llama3-8b" in str(e.value)


def test_moe_dispatch_defaults_to_permute_and_reads_einsum(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: m\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 10\n"
                 "moe: {experts: 4, expert_ffn_hidden: 64, dispatch: einsum}\n")
    assert load_model(str(f)).moe.dispatch == "einsum"
    assert load_model("mixtral-8x7b").moe.dispatch == "permute"
    assert load_model("ted-6.7b-16e").moe.dispatch == "einsum"     # DeepSpeed-MoE's MOELayer
