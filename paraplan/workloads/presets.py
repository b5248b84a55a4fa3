"""Model presets and readers: our YAML/JSON model files and Hugging Face ``config.json``."""
from __future__ import annotations

import functools
from dataclasses import replace
import re
from pathlib import Path
from typing import Any, Mapping


from paraplan.constants import load_data_yaml
from paraplan.errors import ConfigError, unknown_name
from paraplan.io import FieldReader, read_json, read_yaml, shown
from paraplan.workloads.names import model_preset_for_name
from paraplan.workloads.transformer import ACTIVATIONS, MOE_DISPATCH, MambaSpec, MLASpec, MoESpec, TransformerModel

MODELS_FILE = Path(__file__).parent / "catalog" / "models.yaml"
MODEL_FILE_KEYS = ("name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "activation",
                   "tied_embeddings", "norm", "bias", "learned_positions", "max_positions", "moe",
                   "rotary", "dropout", "head_dim",
                   "sliding_window", "sliding_window_every", "mla", "mtp_layers", "qk_norm", "attention_chunk",
                   "global_attention_every", "qkv_bias")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
MOE_KEYS = ("experts", "top_k", "expert_ffn_hidden", "shared_experts", "every", "first_dense", "capacity_factor",
            "dispatch", "router_groups", "router_group_top_k", "latent_size")


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
    keys = MODEL_FILE_KEYS + HYBRID_FILE_KEYS
    unknown = sorted(set(data) - set(keys) - {"source"})
    if unknown:
        raise ConfigError(unknown[0], "unknown key", accepted=", ".join(keys), source=source)
    f = FieldReader(data, source)
    activation = f.string("activation", "gelu")
    if activation not in ACTIVATIONS:
        raise ConfigError("activation", f"unknown activation {activation!r}", accepted=", ".join(ACTIVATIONS),
                          source=source)
    hidden = f.integer("hidden")
    moe = moe_from_mapping(f.mapping("moe"), source) if f.has("moe") else None
    mla = mla_from_mapping(f.mapping("mla"), source) if f.has("mla") else None
    mamba = mamba_from_mapping(f.mapping("mamba"), source) if f.has("mamba") else None
    pattern, mtp = _unified_pattern(f)
    return TransformerModel(
        moe=moe, mla=mla, mamba=mamba, layer_pattern=pattern, mtp_pattern=mtp.get("mtp_pattern", ""),
        mtp_repeated=_bool(f, "mtp_repeated", False),
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
        mtp_layers=mtp.get("mtp_layers", f.integer("mtp_layers", 0, positive=False)), qk_norm=_bool(f, "qk_norm", False),
        attention_chunk=f.integer("attention_chunk", 0, positive=False),
        global_attention_every=f.integer("global_attention_every", 0, positive=False),
        qkv_bias=_bool(f, "qkv_bias", False))


def _unified_pattern(f: FieldReader) -> tuple[str, dict]:
    """A model file's ``layer_pattern`` and its multi-token-prediction fields: ``mtp_pattern`` and
    ``mtp_layers`` as written, or Megatron-LM's unified syntax "MAIN/MTP/MTP" (one "/"-separated copy of the
    depth's layers per depth, all alike; NVIDIA/Megatron-LM @ 00caa53 megatron/core/ssm/
    mamba_hybrid_layer_allocation.py ``parse_hybrid_pattern``)."""
    pattern = f.string("layer_pattern", "")
    written = {"mtp_pattern": f.string("mtp_pattern")} if f.has("mtp_pattern") else {}
    if "/" not in pattern:
        return pattern, written
    main, *depths = pattern.split("/")
    if written or f.has("mtp_layers"):
        raise ConfigError("layer_pattern", "gives the multi-token-prediction depths after '/'; mtp_pattern and "
                          "mtp_layers then go", source=f.source)
    if not depths[0] or any(d != depths[0] for d in depths):
        raise ConfigError("layer_pattern", f"the depths after '/' must be alike and non-empty, got {depths!r}",
                          accepted="MAIN/MTP/MTP... (Megatron-LM's unified hybrid pattern)", source=f.source)
    return main, {"mtp_pattern": depths[0], "mtp_layers": len(depths)}


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
                   router_group_top_k=f.integer("router_group_top_k") if f.has("router_group_top_k") else None,
                   latent_size=f.integer("latent_size", 0, positive=False))


#: model-file keys of a hybrid Mamba-2 / attention model (beside MODEL_FILE_KEYS) and of its ``mamba:`` block
HYBRID_FILE_KEYS = ("layer_pattern", "mamba", "mtp_pattern", "mtp_repeated")
MAMBA_KEYS = ("heads", "head_dim", "state", "groups", "conv_kernel", "chunk")
# model types with RMSNorm though their MLP is not gated (Nemotron-H: squared-ReLU MLPs, RMSNorm everywhere,
# transformers' modeling_nemotron_h.py NemotronHRMSNorm)
_HF_RMSNORM_MODEL_TYPES = {"nemotron_h"}


def mamba_from_mapping(f: FieldReader, source: str) -> MambaSpec:
    """The ``mamba:`` block of a model file (the Mamba-2 mixer of a hybrid ``layer_pattern``'s M layers)."""
    unknown = sorted(set(f.data) - set(MAMBA_KEYS))
    if unknown:
        raise ConfigError(f"mamba.{unknown[0]}", "unknown key", accepted=", ".join(MAMBA_KEYS), source=source)
    return MambaSpec(heads=f.integer("heads"), head_dim=f.integer("head_dim"), state=f.integer("state"),
                     groups=f.integer("groups"), conv_kernel=f.integer("conv_kernel", 4), chunk=f.integer("chunk", 128))


#: transformers' NemotronHConfig ``layers_block_type`` / ``mtp_layers_block_type`` names -> pattern characters
_HF_BLOCK_TYPES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _hf_pattern(data: Mapping[str, Any], pattern_key: str, list_key: str) -> str | None:
    """A hybrid pattern as a config writes it: the string under ``pattern_key`` or, in newer NemotronHConfig
    files, the list of kinds under ``list_key`` (["mamba", "moe", ..., "attention"]); None without either."""
    pattern = data.get(pattern_key)
    if pattern is not None or not data.get(list_key):
        return pattern
    kinds = data[list_key]
    if not isinstance(kinds, list) or any(k not in _HF_BLOCK_TYPES for k in kinds):
        bad = next((k for k in kinds if k not in _HF_BLOCK_TYPES), kinds) if isinstance(kinds, list) else kinds
        raise ConfigError(list_key, f"unknown layer kind {shown(bad)}", accepted=", ".join(_HF_BLOCK_TYPES))
    return "".join(_HF_BLOCK_TYPES[k] for k in kinds)


def _hf_hybrid(f: FieldReader) -> dict:
    """The hybrid layer pattern of a Hugging Face config (Nemotron-H, ``model_type`` nemotron_h:
    ``hybrid_override_pattern``, one character per layer, M Mamba-2, * attention, - MLP, E MoE (Nemotron 3:
    the MoE keys ``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
    ``moe_shared_expert_intermediate_size`` read by :func:`_hf_moe`); the Mamba-2
    mixer from ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``,
    ``chunk_size``, as transformers' NemotronHConfig names them (configuration_nemotron_h.py; vLLM's copy
    also reads ``mamba_n_groups``, ``mamba_d_conv``, ``mamba_chunk_size``); heads default to
    expand · hidden / head_dim as Megatron-Core derives them). Newer NemotronHConfig files list the kinds
    instead (``layers_block_type``: "mamba", "attention", "mlp", "moe"; :func:`_hf_pattern`). Empty without a
    pattern."""
    pattern = _hf_pattern(f.data, "hybrid_override_pattern", "layers_block_type")
    if pattern is None:
        return {}
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("hybrid_override_pattern", f"expected a non-empty string, got {pattern!r}", source=f.source)
    out: dict = {"layer_pattern": pattern}
    if "M" not in pattern:
        return out

    def key(*names, default=None):
        name = next((n for n in names if f.data.get(n) is not None), None)
        if name is None:
            if default is None:
                raise ConfigError(" / ".join(names), "missing required field (one of these keys) of a Mamba layer",
                                  source=f.source)
            return default
        return f.integer(name)
    head_dim = key("mamba_head_dim")
    hidden = f.integer(_hf_key(f.data, "hidden"))
    heads = key("mamba_num_heads", default=(key("mamba_expand", "expand", default=2) * hidden) // head_dim)
    try:
        out["mamba"] = MambaSpec(heads=heads, head_dim=head_dim, state=key("ssm_state_size", "mamba_d_state"),
                                 groups=key("n_groups", "mamba_n_groups"), conv_kernel=key("conv_kernel", "mamba_d_conv", default=4),
                                 chunk=key("chunk_size", "mamba_chunk_size", default=128))
    except ConfigError as e:
        hf = {"mamba.groups": "n_groups", "mamba.heads": "mamba_num_heads"}.get(e.field, e.field)
        raise ConfigError(hf, e.problem, accepted=e.accepted, source=f.source) from None
    return out


def with_hf_hybrid(model: TransformerModel, data: Mapping[str, Any], source: str) -> TransformerModel:
    """A model read from a Hugging Face config with the config's hybrid layer pattern and Mamba-2 mixer
    (:func:`_hf_hybrid`) and, for Nemotron-H, its RMSNorms; the model itself where the config has no pattern.
    Errors name the file's keys (``num_hidden_layers`` for a pattern of another length)."""
    f = FieldReader(data, source)
    hybrid = _hf_hybrid(f)
    if not hybrid:
        return model
    if model.mtp_layers:
        # Nemotron 3 Super's checkpoint: num_nextn_predict_layers 1 of mtp_hybrid_override_pattern "*E" (Megatron-LM:
        # the pattern's "/"-separated suffix, megatron/core/ssm/mamba_hybrid_layer_allocation.py MTP_SEPARATOR)
        mtp = _hf_pattern(data, "mtp_hybrid_override_pattern", "mtp_layers_block_type")
        if not isinstance(mtp, str) or not mtp:
            raise ConfigError("mtp_hybrid_override_pattern", f"a hybrid model's {model.mtp_layers} multi-token-prediction "
                              f"depth(s) (num_nextn_predict_layers) need the layers of a depth, got {shown(mtp)}",
                              accepted='a pattern such as "*E" (Nemotron 3 Super)', source=source)
        hybrid["mtp_pattern"] = mtp
    norm = "rmsnorm" if data.get("model_type") in _HF_RMSNORM_MODEL_TYPES else model.norm
    try:
        return replace(model, norm=norm, **hybrid)
    except ConfigError as e:
        if e.source == source:
            raise
        field = {"layer_pattern": "hybrid_override_pattern", "mamba": "hybrid_override_pattern",
                 "moe": "n_routed_experts", "mtp_pattern": "mtp_hybrid_override_pattern"}.get(e.field, e.field)
        raise ConfigError(field, e.problem.replace("layers is", "num_hidden_layers is"), accepted=e.accepted,
                          source=source) from None


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
           "activation": ("hidden_act", "activation_function", "hidden_activation", "mlp_hidden_act"),
           "tied_embeddings": ("tie_word_embeddings",),
           "bias": ("attention_bias",),
           "head_dim": ("head_dim", "attention_head_dim")}
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
# model types whose HF config ties the LM head to the embedding unless it says otherwise (transformers'
# config classes: GPT2Config ... and GemmaConfig, Gemma2Config, Gemma3TextConfig default tie_word_embeddings=True;
# the Gemma configs on the hub leave the key out)
_HF_TIED_BY_DEFAULT = {"gpt2", "gpt_neo", "opt", "bloom", "gptj", "gemma", "gemma2", "gemma3", "gemma3_text"}
# model types whose attention has q, k and v biases and no output bias, with no config key saying so
# (transformers' Qwen2Attention: q_proj, k_proj, v_proj bias=True, o_proj bias=False)
_HF_QKV_BIAS_MODEL_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
# model types that alternate sliding-window and global layers without a layer_types key: every other layer
# (Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)), or all but each k-th (Gemma 3's
# sliding_window_pattern, default 6: Gemma3TextConfig)
_HF_WINDOW_EVERY_OTHER = {"gemma2"}
_HF_WINDOW_PATTERN_DEFAULT = {"gemma3": 6, "gemma3_text": 6}
# model types with two more RMSNorms per layer, after attention and after the MLP (Gemma2DecoderLayer's
# post_attention_layernorm and post_feedforward_layernorm beside the pre-norms)
_HF_SANDWICH_NORM = {"gemma2", "gemma3", "gemma3_text"}
# model types whose defaults this reader knows (a missing key takes their config class's default)
_HF_KNOWN_MODEL_TYPES = (_HF_GATED_MODEL_TYPES | _HF_QK_NORM_MODEL_TYPES | _HF_TIED_BY_DEFAULT
                         | _HF_QKV_BIAS_MODEL_TYPES | {"qwen3_moe", "gpt_oss", "llama4_text", "kimi_k2"})


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
    # LatentMoE (Nemotron 3 Super: moe_latent_size 1024; null or absent: none)
    latent = f.integer("moe_latent_size", 0, positive=False) if f.data.get("moe_latent_size") is not None else 0
    try:
        return MoESpec(experts=experts, top_k=top_k, expert_ffn_hidden=f.integer(width_key),
                       shared_experts=f.integer("n_shared_experts", 0, positive=False),
                       every=f.integer(every_key, 1), first_dense=f.integer("first_k_dense_replace", 0, positive=False),
                       router_groups=groups, router_group_top_k=picked, latent_size=latent)
    except ConfigError as e:
        hf_key = {"moe.router_groups": "n_group", "moe.router_group_top_k": "topk_group",
                  "moe.latent_size": "moe_latent_size"}.get(e.field)
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


def _window_share(window: int, windowed: int, layers: int, notes: list, where: str) -> dict:
    """The model fields of a sliding window on ``windowed`` of ``layers`` layers: 1 in k layers
    (``sliding_window_every``) or all but 1 in k (``global_attention_every``); a share neither states
    exactly is priced at the nearest one and said in ``notes``."""
    if windowed <= 0:
        return {}
    if windowed >= layers:
        return {"sliding_window": window}
    if 2 * windowed <= layers:
        k = max(1, round(layers / windowed))
        fields, share = {"sliding_window": window, "sliding_window_every": k}, 1 / k
    else:
        k = max(2, round(layers / (layers - windowed)))
        fields, share = {"sliding_window": window, "global_attention_every": k}, 1 - 1 / k
    if abs(share * layers - windowed) > 1e-9:
        notes.append(f"sliding window on {windowed} of {layers} layers ({where}) priced as on {share * layers:.1f}")
    return fields


def _hf_sliding_window(f: FieldReader, model_type: str, layers: int, notes: list) -> dict:
    """Sliding-window attention of an HF config: ``sliding_window`` keys on the layers ``layer_types``
    marks "sliding_attention" (GPT-OSS and Gemma 2 alternate: every 2nd), else on all but every
    ``sliding_window_pattern``-th layer (Gemma 3: 6), else as the model type does without either key
    (Gemma 2: every other layer; Gemma 3: all but every 6th), else with ``use_sliding_window`` and
    ``max_window_layers`` (Qwen2: the layers from max_window_layers on), else on every layer (Mistral
    7B v0.1). ``use_sliding_window: false`` turns it off (Qwen2/3 carry a window they do not use)."""
    if not f.has("sliding_window") or f.data.get("use_sliding_window") is False:
        return {}
    window = f.integer("sliding_window")
    types = f.data.get("layer_types")
    if isinstance(types, list) and types:
        other = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
        if other:
            notes.append(f"layer_types {', '.join(other)} priced as full attention")
        return _window_share(window, sum(1 for t in types if t == "sliding_attention"), len(types), notes,
                             "layer_types")
    pattern = f.data.get("sliding_window_pattern", _HF_WINDOW_PATTERN_DEFAULT.get(model_type))
    if pattern is not None:
        k = f.integer("sliding_window_pattern") if f.has("sliding_window_pattern") else pattern
        return {"sliding_window": window} if k == 1 else {"sliding_window": window, "global_attention_every": k}
    if model_type in _HF_WINDOW_EVERY_OTHER:
        return {"sliding_window": window, "sliding_window_every": 2}
    if f.data.get("use_sliding_window") is True and f.has("max_window_layers"):
        first = min(layers, f.integer("max_window_layers", positive=False))
        return _window_share(window, layers - first, layers, notes, "max_window_layers")
    return {"sliding_window": window}


def _hf_moe_extras(f: FieldReader, moe: MoESpec | None, layers: int, notes: list) -> MoESpec | None:
    """What else an MoE config says: a shared expert of its own width (Qwen2-MoE's
    ``shared_expert_intermediate_size``: counted as that many experts of the routed width, the same
    parameters and FLOPs; its sigmoid gate not counted) and dense layers (``mlp_only_layers``: a prefix
    0..k-1 is ``first_dense`` k; any other set is priced as MoE layers, said in ``notes``)."""
    if moe is None:
        return None
    from dataclasses import replace
    width = f.integer("shared_expert_intermediate_size", 0, positive=False)
    if f.has("moe_shared_expert_intermediate_size"):
        # Nemotron-H / Nemotron 3 (transformers' NemotronHConfig): n_shared_experts shared experts of
        # moe_shared_expert_intermediate_size each, in place of the routed width n_shared_experts counts
        each = f.integer("moe_shared_expert_intermediate_size", 0, positive=False)
        width = each * f.integer("n_shared_experts", 1, positive=False)
        moe = replace(moe, shared_experts=0)
    if width:
        shared = max(1, round(width / moe.expert_ffn_hidden))
        if shared * moe.expert_ffn_hidden != width:
            notes.append(f"shared expert of width {width} priced as {shared} of the routed width "
                         f"{moe.expert_ffn_hidden}")
        moe = replace(moe, shared_experts=moe.shared_experts + shared)
    dense = f.data.get("mlp_only_layers")
    if isinstance(dense, list) and dense:
        if all(isinstance(i, int) and not isinstance(i, bool) for i in dense) and sorted(dense) == list(
                range(len(dense))) and moe.every == 1 and len(dense) < layers:
            return replace(moe, first_dense=len(dense))
        notes.append(f"dense layers mlp_only_layers {shown(dense, 60)} priced as MoE layers")
    return moe


def _hf_notes(data: Mapping[str, Any], model_type: str, act: str, gated: bool, family: str) -> list[str]:
    """What a config holds that the model does not price, one line each (:attr:`TransformerModel.approximated`)."""
    notes = []
    for key, what, where in (
            ("attn_logit_softcapping", "attention logit softcapping", "a tanh over every attention score: "
             "inside the fused kernel (FlashAttention >= 2.6 softcap), elementwise passes over the scores in eager "
             "attention"),
            ("final_logit_softcapping", "final logit softcapping", "a tanh over the b·s·vocab logits")):
        v = data.get(key)
        if v not in (None, 0, 0.0, False):
            notes.append(f"{what} ({key} {shown(v)}) not priced: {where}")
    if gated and family == "gelu":
        notes.append(f"gated GELU MLP ({act}) priced as SwiGLU: the same three GEMMs, another elementwise activation")
    if model_type in _HF_SANDWICH_NORM:
        notes.append("the post-attention and post-MLP RMSNorms not counted: 2·hidden parameters and two "
                     "memory-bound norms per layer")
    if data.get("mlp_bias") is True and data.get("attention_bias") is not True:
        notes.append("MLP biases (mlp_bias) not counted")
    if model_type not in _HF_KNOWN_MODEL_TYPES and data.get("tie_word_embeddings") is None:
        notes.append(f"tie_word_embeddings not stated for model_type {shown(model_type)}: "
                     f"{'tied' if model_type in _HF_TIED_BY_DEFAULT else 'untied'} LM head assumed")
    return notes


def _hf_activation(f: FieldReader) -> str:
    """The activation family of the config's ``hidden_act`` / ``activation_function`` (default gelu)."""
    key = _hf_key(f.data, "activation")
    act = f.string(key, "gelu")
    family = next((fam for fam, names in HF_ACTIVATIONS.items() if act in names), None)
    if family is None:
        raise ConfigError(key, f"unknown activation {act!r}",
                          accepted=", ".join(n for names in HF_ACTIVATIONS.values() for n in names), source=f.source)
    return family


def _text_config(data: Mapping[str, Any], notes: list) -> Mapping[str, Any]:
    """A multimodal config's ``text_config`` (Llama 4, Gemma 3, Qwen2-VL) when the top level has no layers
    of its own: the text model is read, and its vision encoder is said not to be counted."""
    inner = data.get("text_config")
    if not isinstance(inner, dict) or any(data.get(k) is not None for k in HF_KEYS["layers"]):
        return data
    notes.append("the text model only (text_config): the vision encoder and projector are not counted")
    return {**{k: v for k, v in data.items() if k not in ("text_config", "vision_config")}, **inner}


def model_from_hf_config(data: Mapping[str, Any], source: str) -> TransformerModel:
    """Read a Hugging Face ``config.json``: Llama-style keys (num_hidden_layers, hidden_size,
    num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, hidden_act,
    tie_word_embeddings, max_position_embeddings) or their GPT-2 style aliases (n_layer, n_embd, n_head,
    n_inner, activation_function, n_positions): :data:`HF_KEYS`. Errors name the file's own key.

    What the model type implies without a key is read as its transformers config and modelling classes
    do: Qwen2's q/k/v biases, Gemma's tied head and alternating sliding-window layers, Qwen3's QK-norm.
    What the file holds that the model does not price (logit softcapping, Gemma's extra norms, a GeGLU
    priced as SwiGLU, ...) is kept in ``approximated`` and said with every estimate."""
    notes: list[str] = []
    data = _text_config(data, notes)
    f = FieldReader(data, source)
    model_type = f.string("model_type", "")
    family = _hf_activation(f)
    gated = model_type in _HF_GATED_MODEL_TYPES or family == "swiglu"
    name = data.get("_name_or_path") or model_type or Path(source).parent.name or "hf-model"
    keys = {field: _hf_key(data, field) for field in HF_KEYS}
    act = str(data.get(keys["activation"], ""))
    try:
        layers = _hf_int(f, "layers")
        bias = _bool(f, "attention_bias", not gated)
        model = TransformerModel(
            name=str(name)[:200], layers=layers, hidden=_hf_int(f, "hidden"), heads=_hf_int(f, "heads"),
            vocab=_hf_int(f, "vocab"), kv_heads=_hf_int(f, "kv_heads", None), ffn_hidden=_hf_int(f, "ffn_hidden", None),
            activation="swiglu" if gated else family,
            tied_embeddings=_bool(f, "tie_word_embeddings", model_type in _HF_TIED_BY_DEFAULT),
            norm="rmsnorm" if gated else "layernorm", bias=bias,
            qkv_bias=not bias and _bool(f, "qkv_bias", model_type in _HF_QKV_BIAS_MODEL_TYPES),
            learned_positions=model_type in ("gpt2", "opt", "gpt_neo") or "n_positions" in data,
            max_positions=_hf_int(f, "max_positions", 0, positive=False),
            moe=_hf_moe_extras(f, _hf_moe(f), layers, notes),
            rotary="rope_theta" in data or "rotary_dim" in data or "rope_scaling" in data or "rope_parameters" in data,
            dropout=_hf_dropout(data), **{"head_dim": _hf_int(f, "head_dim", None), **_hf_mla(f)},
            mtp_layers=f.integer("num_nextn_predict_layers", 0, positive=False),
            qk_norm=model_type in _HF_QK_NORM_MODEL_TYPES, **_hf_sliding_window(f, model_type, layers, notes),
            **_hf_chunked_attention(f))
    except ConfigError as e:
        if e.source == source:
            raise
        # the model's own checks name its fields (hidden, kv_heads, moe.top_k): say the file's keys
        field = keys.get(e.field, e.field)
        problem = e.problem
        for ours, theirs in keys.items():
            problem = re.sub(rf"\b{ours}\b", theirs, problem)
        raise ConfigError(field, problem, accepted=e.accepted, source=source) from None
    from dataclasses import replace
    return replace(model, approximated=tuple(notes + _hf_notes(data, model_type, act, gated, family)))


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
            return with_hf_hybrid(model_from_hf_config(data, str(path)), data, str(path))
        return model_from_mapping(data, str(path))
    spelled = model_preset_for_name(spec, table)
    if spelled is not None:         # "Llama 3.1 70B", "meta-llama/Llama-3.1-70B": the estimate names the preset
        return load_model(spelled)
    raise unknown_name("model", spec, table)
