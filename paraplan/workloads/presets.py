"""Model presets and readers: our YAML/JSON model files and Hugging Face ``config.json``."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping

import yaml

from paraplan.errors import ConfigError, unknown_name
from paraplan.io import FieldReader, read_json, read_yaml
from paraplan.workloads.transformer import ACTIVATIONS, MOE_DISPATCH, MoESpec, TransformerModel

MODELS_FILE = Path(__file__).parent / "catalog" / "models.yaml"
MODEL_FILE_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "activation",
                   "tied_embeddings", "norm", "bias", "learned_positions", "max_positions", "moe",
                   "rotary")
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "every", "first_dense", "capacity_factor",
            "dispatch")


@functools.lru_cache(maxsize=1)
def _preset_table() -> dict[str, dict]:
    data = yaml.safe_load(MODELS_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def model_names() -> list[str]:
    return sorted(_preset_table(), key=lambda n: (n.split("-")[0], model_from_mapping(
        {**_preset_table()[n], "name": n}, "preset").num_params))


def preset_source(name: str) -> str:
    return _preset_table()[name].get("source", "")


def _bool(f: FieldReader, key: str, default: bool) -> bool:
    v = f.raw(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f._name(key), f"expected true or false, got {v!r}", source=f.source)
    return v


def model_from_mapping(data: Mapping[str, Any], source: str) -> TransformerModel:
    """Build a model from our file format (keys in ``MODEL_FILE_KEYS``; defaults: kv_heads = heads,
    ffn_hidden = 4·hidden, activation gelu, untied)."""
    unknown = sorted(set(data) - set(MODEL_FILE_KEYS) - {"source"})
    if unknown:
        raise ConfigError(unknown[0], "unknown key", accepted=", ".join(MODEL_FILE_KEYS), source=source)
    f = FieldReader(data, source)
    activation = f.string("activation", "gelu")
    if activation not in ACTIVATIONS:
        raise ConfigError("activation", f"unknown activation {activation!r}", accepted=", ".join(ACTIVATIONS),
                          source=source)
    hidden = f.integer("hidden")
    moe = moe_from_mapping(f.mapping("moe"), source) if f.has("moe") else None
    return TransformerModel(
        moe=moe,
        name=f.string("name", Path(source).stem), layers=f.integer("layers"), hidden=hidden,
        heads=f.integer("heads"), vocab=f.integer("vocab"),
        kv_heads=f.integer("kv_heads") if f.has("kv_heads") else None,
        ffn_hidden=f.integer("ffn_hidden") if f.has("ffn_hidden") else None,
        activation=activation, tied_embeddings=_bool(f, "tied_embeddings", False),
        norm=f.string("norm", "layernorm"), bias=_bool(f, "bias", True),
        learned_positions=_bool(f, "learned_positions", False),
        max_positions=f.integer("max_positions", 0, positive=False), rotary=_bool(f, "rotary", False))


def moe_from_mapping(f: FieldReader, source: str) -> MoESpec:
    """The ``moe:`` block of a model file."""
    unknown = sorted(set(f.data) - set(MOE_KEYS))
    if unknown:
        raise ConfigError(f"moe.{unknown[0]}", "unknown key", accepted=", ".join(MOE_KEYS), source=source)
    cf = f.number("capacity_factor", None) if f.has("capacity_factor") else None
    return MoESpec(experts=f.integer("experts"), top_k=f.integer("top_k", 1),
                   expert_ffn_hidden=f.integer("expert_ffn_hidden"),
                   shared_experts=f.integer("shared_experts", 0, positive=False), every=f.integer("every", 1),
                   first_dense=f.integer("first_dense", 0, positive=False), capacity_factor=cf,
                   dispatch=_moe_dispatch(f, source))


def _moe_dispatch(f: FieldReader, source: str) -> str:
    """``moe.dispatch``: permute (default) or einsum (DeepSpeed-MoE's GShard-style dispatch)."""
    value = f.string("dispatch", "permute")
    if value not in MOE_DISPATCH:
        raise ConfigError("moe.dispatch", f"unknown dispatch {value!r}", accepted=", ".join(MOE_DISPATCH),
                          source=source)
    return value


def _hf_moe(data: Mapping[str, Any], source: str) -> MoESpec | None:
    """MoE fields of Hugging Face configs (Mixtral: num_local_experts; DeepSeek/Qwen: n_routed_experts
    or num_experts, moe_intermediate_size, n_shared_experts, first_k_dense_replace, moe_layer_freq)."""
    experts = data.get("num_local_experts") or data.get("n_routed_experts") or data.get("num_experts")
    if not experts:
        return None
    width = data.get("moe_intermediate_size") or data.get("intermediate_size")
    if not width:
        raise ConfigError("moe_intermediate_size", "an MoE config needs the expert width", source=source)
    return MoESpec(experts=int(experts), top_k=int(data.get("num_experts_per_tok") or 1),
                   expert_ffn_hidden=int(width), shared_experts=int(data.get("n_shared_experts") or 0),
                   every=int(data.get("moe_layer_freq") or data.get("decoder_sparse_step") or 1),
                   first_dense=int(data.get("first_k_dense_replace") or 0))


# Hugging Face activation names: gated (GLU) families use three MLP matrices.
_HF_GATED_MODEL_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2",
                         "deepseek_v2", "deepseek_v3", "olmo", "olmo2", "phi3", "granite", "cohere"}


def model_from_hf_config(data: Mapping[str, Any], source: str) -> TransformerModel:
    """Read a Hugging Face ``config.json`` (num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size, vocab_size, hidden_act, tie_word_embeddings)."""
    f = FieldReader(data, source)
    act = str(data.get("hidden_act") or data.get("hidden_activation") or "gelu")
    gated = data.get("model_type") in _HF_GATED_MODEL_TYPES or act in ("silu", "swish", "swiglu")
    llama_like = gated
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    return TransformerModel(
        name=str(data.get("_name_or_path") or data.get("model_type") or Path(source).parent.name or "hf-model"),
        layers=f.integer("num_hidden_layers"), hidden=hidden, heads=heads, vocab=f.integer("vocab_size"),
        kv_heads=f.integer("num_key_value_heads") if f.has("num_key_value_heads") else None,
        ffn_hidden=f.integer("intermediate_size") if f.has("intermediate_size") else None,
        activation="swiglu" if gated else ("relu" if act == "relu" else "gelu"),
        tied_embeddings=_bool(f, "tie_word_embeddings", False),
        norm="rmsnorm" if llama_like else "layernorm",
        bias=bool(data.get("attention_bias", not llama_like)),
        learned_positions=data.get("model_type") in ("gpt2", "opt", "gpt_neo"),
        max_positions=int(data.get("max_position_embeddings") or data.get("n_positions") or 0),
        moe=_hf_moe(data, source), rotary="rope_theta" in data or "rotary_dim" in data or "rope_scaling" in data)


def load_model(spec: str) -> TransformerModel:
    """A preset name, a model YAML/JSON file, or a Hugging Face config.json."""
    table = _preset_table()
    if spec in table:
        return model_from_mapping({**{k: v for k, v in table[spec].items()}, "name": spec}, f"preset {spec}")
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") or path.is_file():
        if not path.is_file():
            raise ConfigError("model", f"no such file: {spec}")
        if path.suffix == ".json":
            data = read_json(path, "model")
            if not isinstance(data, dict):
                raise ConfigError("model", "expected a JSON object at the top level", source=str(path))
        else:
            data = read_yaml(path, "model")
        if "num_hidden_layers" in data or "hidden_size" in data:
            return model_from_hf_config(data, str(path))
        return model_from_mapping(data, str(path))
    raise unknown_name("model", spec, table)
