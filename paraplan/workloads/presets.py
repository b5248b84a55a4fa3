"""Model presets and readers: our YAML/JSON model files and Hugging Face ``config.json``."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Mapping


from paraplan.constants import load_data_yaml
from paraplan.errors import ConfigError, unknown_name
from paraplan.io import FieldReader, read_json, read_yaml, shown
from paraplan.workloads.names import model_preset_for_name
from paraplan.workloads.transformer import ACTIVATIONS, MOE_DISPATCH, MLASpec, MoESpec, TransformerModel

MODELS_FILE = Path(__file__).parent / "catalog" / "models.yaml"
MODEL_FILE_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "activation",
                   "tied_embeddings", "norm", "bias", "learned_positions", "max_positions", "moe",
                   "rotary", "dropout", "head_dim",
                   "sliding_window", "sliding_window_every", "mla", "mtp_layers", "qk_norm", "attention_chunk",
                   "global_attention_every")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "every", "first_dense", "capacity_factor",
            "dispatch", "router_groups", "router_group_top_k")


@functools.lru_cache(maxsize=1)
def _preset_table() -> dict[str, dict]:
    data = load_data_yaml(MODELS_FILE.read_text())
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
    mla = mla_from_mapping(f.mapping("mla"), source) if f.has("mla") else None
    return TransformerModel(
        moe=moe, mla=mla,
        name=f.string("name", Path(source).stem), layers=f.integer("layers"), hidden=hidden,
        heads=f.integer("heads"), vocab=f.integer("vocab"),
        kv_heads=f.integer("kv_heads") if f.has("kv_heads") else None,
        ffn_hidden=f.integer("ffn_hidden") if f.has("ffn_hidden") else None,
        activation=activation, tied_embeddings=_bool(f, "tied_embeddings", False),
        norm=f.string("norm", "layernorm"), bias=_bool(f, "bias", True),
        learned_positions=_bool(f, "learned_positions", False),
        max_positions=f.integer("max_positions", 0, positive=False), rotary=_bool(f, "rotary", False),
        dropout=_bool(f, "dropout", True), head_dim=f.integer("head_dim") if f.has("head_dim") else None,
        sliding_window=f.integer("sliding_window", 0, positive=False),
        sliding_window_every=f.integer("sliding_window_every", 1),
        mtp_layers=f.integer("mtp_layers", 0, positive=False), qk_norm=_bool(f, "qk_norm", False),
        attention_chunk=f.integer("attention_chunk", 0, positive=False),
        global_attention_every=f.integer("global_attention_every", 0, positive=False))


#: Hugging Face config keys of the residual (hidden) dropout probability, by model family
HF_DROPOUT_KEYS = ("resid_pdrop", "hidden_dropout", "hidden_dropout_prob", "dropout")


def _hf_dropout(data: dict) -> bool:
    """Whether a Hugging Face config trains with residual dropout (any of HF_DROPOUT_KEYS above 0;
    Llama-family configs name none, or only ``attention_dropout``)."""
    for key in HF_DROPOUT_KEYS:
        try:
            if float(data.get(key) or 0) > 0:
                return True
        except (TypeError, ValueError):
            continue
    return False


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
                   dispatch=_moe_dispatch(f, source),
                   router_groups=f.integer("router_groups") if f.has("router_groups") else None,
                   router_group_top_k=f.integer("router_group_top_k") if f.has("router_group_top_k") else None)


def mla_from_mapping(f: FieldReader, source: str) -> MLASpec:
    """The ``mla:`` block of a model file (multi-head latent attention; ``head_dim`` of the model is
    then the non-rotary query/key width per head)."""
    unknown = sorted(set(f.data) - set(MLA_KEYS))
    if unknown:
        raise ConfigError(f"mla.{unknown[0]}", "unknown key", accepted=", ".join(MLA_KEYS), source=source)
    return MLASpec(kv_lora_rank=f.integer("kv_lora_rank"), qk_rope_head_dim=f.integer("qk_rope_head_dim"),
                   v_head_dim=f.integer("v_head_dim"), q_lora_rank=f.integer("q_lora_rank", 0, positive=False))


def _hf_mla(f: FieldReader) -> dict:
    """Latent attention of a Hugging Face config (DeepSeek-V2/V3: kv_lora_rank, q_lora_rank (null: no
    query latent), qk_nope_head_dim, qk_rope_head_dim, v_head_dim): the ``mla`` and ``head_dim`` fields."""
    if f.data.get("kv_lora_rank") is None:
        return {}
    q_lora = f.data.get("q_lora_rank")
    return {"mla": MLASpec(kv_lora_rank=f.integer("kv_lora_rank"), qk_rope_head_dim=f.integer("qk_rope_head_dim"),
                           v_head_dim=f.integer("v_head_dim"),
                           q_lora_rank=0 if q_lora is None else f.integer("q_lora_rank", positive=False)),
            "head_dim": f.integer("qk_nope_head_dim")}


def _moe_dispatch(f: FieldReader, source: str) -> str:
    """``moe.dispatch``: permute (default) or einsum (DeepSpeed-MoE's GShard-style dispatch)."""
    value = f.string("dispatch", "permute")
    if value not in MOE_DISPATCH:
        raise ConfigError("moe.dispatch", f"unknown dispatch {value!r}", accepted=", ".join(MOE_DISPATCH),
                          source=source)
    return value


# Hugging Face configs name one field several ways (``attribute_map`` of GPT-2, GPT-J, OPT, T5-style
# configs): each of our fields and the file keys that give it, in order of preference.
HF_KEYS = {"hidden": ("hidden_size", "n_embd", "d_model"),
           "layers": ("num_hidden_layers", "n_layer", "num_layers"),
           "heads": ("num_attention_heads", "n_head", "num_heads"),
           "kv_heads": ("num_key_value_heads",),
           "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
           "vocab": ("vocab_size",),
           "max_positions": ("max_position_embeddings", "n_positions", "n_ctx"),
           "activation": ("hidden_act", "activation_function", "hidden_activation"),
           "tied_embeddings": ("tie_word_embeddings",),
           "bias": ("attention_bias",),
           "head_dim": ("head_dim",)}
HF_MARKERS = tuple(k for keys in HF_KEYS.values() for k in keys if k not in ("vocab_size", "head_dim")) + (
    "model_type", "architectures")
# Hugging Face activation names (transformers ``ACT2FN``) by the family the cost model prices.
HF_ACTIVATIONS = {"gelu": ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate", "gelu_10",
                           "quick_gelu", "gelu_python", "mish", "tanh", "sigmoid", "linear"),
                  "relu": ("relu", "relu2", "relu6", "leaky_relu"),
                  "swiglu": ("silu", "swish", "swiglu")}
# Hugging Face activation names: gated (GLU) families use three MLP matrices.
_HF_GATED_MODEL_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2",
                         "deepseek_v2", "deepseek_v3", "olmo", "olmo2", "phi3", "granite", "cohere"}
# model types whose attention RMS-normalizes its queries and keys after the projection (the modeling
# files' q_norm / k_norm: Qwen3Attention, Qwen3MoeAttention, Gemma3Attention, Olmo2Attention); their
# configs carry no key for it
_HF_QK_NORM_MODEL_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2"}
# model types whose HF config ties the LM head to the embedding unless it says otherwise
_HF_TIED_BY_DEFAULT = {"gpt2", "gpt_neo", "opt", "bloom", "gptj"}


def _hf_key(data: Mapping[str, Any], field: str) -> str:
    """The file's key that gives ``field`` (the first alias present), else its usual name."""
    return next((k for k in HF_KEYS[field] if data.get(k) is not None), HF_KEYS[field][0])


def _hf_int(f: FieldReader, field: str, default: Any = ..., *, positive: bool = True) -> Any:
    key = _hf_key(f.data, field)
    if not f.has(key):
        if default is not ...:
            return default
        raise ConfigError(" / ".join(HF_KEYS[field]), "missing required field (one of these keys)", source=f.source)
    return f.integer(key, positive=positive)


def _hf_moe(f: FieldReader) -> MoESpec | None:
    """MoE fields of Hugging Face configs (Mixtral: num_local_experts; DeepSeek/Qwen: n_routed_experts
    or num_experts, moe_intermediate_size, n_shared_experts, first_k_dense_replace, moe_layer_freq)."""
    key = next((k for k in ("num_local_experts", "n_routed_experts", "num_experts") if f.has(k)), None)
    if key is None or f.data[key] == 0:
        return None
    experts = f.integer(key)
    width_key = "moe_intermediate_size" if f.has("moe_intermediate_size") else "intermediate_size"
    if not f.has(width_key):
        raise ConfigError("moe_intermediate_size", "an MoE config needs the expert width", source=f.source)
    every_key = "moe_layer_freq" if f.has("moe_layer_freq") else "decoder_sparse_step"
    top_k = f.integer("num_experts_per_tok", 1)
    if top_k > experts:
        raise ConfigError("num_experts_per_tok", f"{top_k} is more than {key} ({experts})", source=f.source)
    groups, picked = _hf_router_groups(f)
    try:
        return MoESpec(experts=experts, top_k=top_k, expert_ffn_hidden=f.integer(width_key),
                       shared_experts=f.integer("n_shared_experts", 0, positive=False),
                       every=f.integer(every_key, 1), first_dense=f.integer("first_k_dense_replace", 0, positive=False),
                       router_groups=groups, router_group_top_k=picked)
    except ConfigError as e:
        hf_key = {"moe.router_groups": "n_group", "moe.router_group_top_k": "topk_group"}.get(e.field)
        if hf_key is None:
            raise
        raise ConfigError(hf_key, e.problem, accepted=e.accepted, source=f.source) from None


def _hf_router_groups(f: FieldReader) -> tuple[int | None, int | None]:
    """Group-limited routing of a DeepSeek-style config: ``n_group`` groups, ``topk_group`` picked
    (DeepSeek-V3: 8 and 4; Kimi K2 writes 1 and 1, no limit). Absent, null or one group: no limit."""
    if f.data.get("n_group") in (None, 1) and f.data.get("topk_group") in (None, 1):
        return None, None
    if f.data.get("n_group") is None or f.data.get("topk_group") is None:
        raise ConfigError("n_group / topk_group", "group-limited routing needs both keys", source=f.source)
    return f.integer("n_group"), f.integer("topk_group")


def _hf_chunked_attention(f: FieldReader) -> dict:
    """Chunked local attention of an HF config (Llama 4's text config): ``attention_chunk_size`` tokens per
    chunk on its RoPE layers; the others, ``no_rope_layers``' zeros (or every ``no_rope_layer_interval``-th
    layer, transformers' Llama4TextConfig default 4), attend globally."""
    chunk = f.data.get("attention_chunk_size")
    if not chunk:
        return {}
    flags = f.data.get("no_rope_layers")
    if isinstance(flags, list) and flags:
        nope = sum(1 for x in flags if not x)
        every = max(1, round(len(flags) / nope)) if nope else 0
    else:
        every = f.integer("no_rope_layer_interval", 4, positive=False)
    return {"attention_chunk": f.integer("attention_chunk_size"), "global_attention_every": every}


def _hf_sliding_window(f: FieldReader) -> dict:
    """Sliding-window attention of an HF config: ``sliding_window`` keys, on the layers ``layer_types``
    marks "sliding_attention" (GPT-OSS alternates: every 2nd), else on every layer unless
    ``use_sliding_window`` is false (Qwen2/3 carry a window they do not use)."""
    if not f.has("sliding_window") or f.data.get("use_sliding_window") is False:
        return {}
    window = f.integer("sliding_window")
    types = f.data.get("layer_types")
    if isinstance(types, list) and types:
        windowed = sum(1 for t in types if t == "sliding_attention")
        if not windowed:
            return {}
        return {"sliding_window": window, "sliding_window_every": max(1, round(len(types) / windowed))}
    return {"sliding_window": window}


def _hf_activation(f: FieldReader) -> str:
    """The activation family of the config's ``hidden_act`` / ``activation_function`` (default gelu)."""
    key = _hf_key(f.data, "activation")
    act = f.string(key, "gelu")
    family = next((fam for fam, names in HF_ACTIVATIONS.items() if act in names), None)
    if family is None:
        raise ConfigError(key, f"unknown activation {act!r}",
                          accepted=", ".join(n for names in HF_ACTIVATIONS.values() for n in names), source=f.source)
    return family


def model_from_hf_config(data: Mapping[str, Any], source: str) -> TransformerModel:
    """Read a Hugging Face ``config.json``: Llama-style keys (num_hidden_layers, hidden_size,
    num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, hidden_act,
    tie_word_embeddings, max_position_embeddings) or their GPT-2 style aliases (n_layer, n_embd, n_head,
    n_inner, activation_function, n_positions): :data:`HF_KEYS`. Errors name the file's own key."""
    f = FieldReader(data, source)
    model_type = f.string("model_type", "")
    family = _hf_activation(f)
    gated = model_type in _HF_GATED_MODEL_TYPES or family == "swiglu"
    name = data.get("_name_or_path") or model_type or Path(source).parent.name or "hf-model"
    keys = {field: _hf_key(data, field) for field in HF_KEYS}
    try:
        return TransformerModel(
            name=str(name)[:200], layers=_hf_int(f, "layers"), hidden=_hf_int(f, "hidden"), heads=_hf_int(f, "heads"),
            vocab=_hf_int(f, "vocab"), kv_heads=_hf_int(f, "kv_heads", None), ffn_hidden=_hf_int(f, "ffn_hidden", None),
            activation="swiglu" if gated else family,
            tied_embeddings=_bool(f, "tie_word_embeddings", model_type in _HF_TIED_BY_DEFAULT),
            norm="rmsnorm" if gated else "layernorm", bias=_bool(f, "attention_bias", not gated),
            learned_positions=model_type in ("gpt2", "opt", "gpt_neo") or "n_positions" in data,
            max_positions=_hf_int(f, "max_positions", 0, positive=False), moe=_hf_moe(f),
            rotary="rope_theta" in data or "rotary_dim" in data or "rope_scaling" in data,
            dropout=_hf_dropout(data), **{"head_dim": _hf_int(f, "head_dim", None), **_hf_mla(f)},
            mtp_layers=f.integer("num_nextn_predict_layers", 0, positive=False),
            qk_norm=model_type in _HF_QK_NORM_MODEL_TYPES, **_hf_sliding_window(f), **_hf_chunked_attention(f))
    except ConfigError as e:
        if e.source == source:
            raise
        # the model's own checks name its fields (hidden, kv_heads, moe.top_k): say the file's keys
        field = keys.get(e.field, e.field)
        problem = e.problem
        for ours, theirs in keys.items():
            problem = re.sub(rf"\b{ours}\b", theirs, problem)
        raise ConfigError(field, problem, accepted=e.accepted, source=source) from None


def _is_file(path: Path) -> bool:
    """Path.is_file that says False for names the OS cannot even look up (too long, NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_model(spec: str) -> TransformerModel:
    """A preset name, a model YAML/JSON file, or a Hugging Face config.json."""
    table = _preset_table()
    if spec in table:
        return model_from_mapping({**{k: v for k, v in table[spec].items()}, "name": spec}, f"preset {spec}")
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") or _is_file(path):
        if not _is_file(path):
            raise ConfigError("model", f"no such file: {shown(spec, 120)}")
        if path.suffix == ".json":
            data = read_json(path, "model")
            if not isinstance(data, dict):
                raise ConfigError("model", "expected a JSON object at the top level", source=str(path))
        else:
            data = read_yaml(path, "model")
        if any(k in data for k in HF_MARKERS):
            return model_from_hf_config(data, str(path))
        return model_from_mapping(data, str(path))
    spelled = model_preset_for_name(spec, table)
    if spelled is not None:         # "Llama 3.1 70B", "meta-llama/Llama-3.1-70B": the estimate names the preset
        return load_model(spelled)
    raise unknown_name("model", spec, table)
