"""Dense decoder-only transformers and the training job around them.

Parameter count (per layer, biases and norms included; GQA-aware):
  attention  h·(h + 2·h_kv) + h·h   (Q, K, V, output projections), + (h + 2·h_kv) + h biases if any
  MLP        gelu:   2·h·f          swiglu: 3·h·f   (gate, up, down)
  norms      2·h (RMSNorm) or 4·h (LayerNorm with bias)
Embedding V·h (+ an untied LM head V·h), learned positions s_max·h when the model has them.
Sources: Narayanan et al. 2021 (arXiv:2104.04473) Eq. 2 gives 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))
for the GPT layout; Megatron-LM ``num_floating_point_operations`` (NVIDIA/Megatron-LM @ d98e8a6,
megatron/training/training.py) for the GQA and SwiGLU sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from paraplan.errors import ConfigError

ACTIVATIONS = ("gelu", "swiglu", "relu")


@dataclass(frozen=True)
class TransformerModel:
    """Shape of a decoder-only transformer. ``ffn_hidden`` is the MLP's inner width."""
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    activation: str = "gelu"
    tied_embeddings: bool = False
    norm: str = "layernorm"          # layernorm | rmsnorm
    bias: bool = True
    learned_positions: bool = False
    max_positions: int = 0

    def __post_init__(self):
        for key in ("layers", "hidden", "heads", "vocab"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(key, f"must be a positive integer, got {v!r}", source=self.name)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        for key in ("kv_heads", "ffn_hidden"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(key, f"must be a positive integer, got {v!r}", source=self.name)
        if self.hidden % self.heads:
            raise ConfigError("hidden", f"hidden ({self.hidden}) must be divisible by heads ({self.heads})",
                              source=self.name)
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})",
                              source=self.name)
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"unknown activation {self.activation!r}",
                              accepted=", ".join(ACTIVATIONS), source=self.name)
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError("norm", f"unknown norm {self.norm!r}", accepted="layernorm, rmsnorm", source=self.name)

    # --- shapes -----------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads · head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn_hidden: 3 for SwiGLU (gate, up, down), else 2."""
        return 3 if self.activation == "swiglu" else 2

    # --- parameters -------------------------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        h, hkv = self.hidden, self.kv_hidden
        weights = h * (h + 2 * hkv) + h * h
        return weights + ((h + 2 * hkv) + h if self.bias else 0)

    @property
    def mlp_params_per_layer(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        weights = self.mlp_matrices * h * f
        biases = (f * (self.mlp_matrices - 1) + h) if self.bias else 0
        return weights + biases

    @property
    def norm_params_per_layer(self) -> int:
        per_norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        return 2 * per_norm

    @property
    def params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding (+ learned positions)."""
        return self.vocab * self.hidden + (self.max_positions * self.hidden if self.learned_positions else 0)

    @property
    def lm_head_params(self) -> int:
        """Output projection (0 when tied to the input embedding) + final norm."""
        final_norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + final_norm

    @property
    def num_params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.lm_head_params

    # --- FLOPs ------------------------------------------------------------------------------------
    def matmul_flops_per_token_per_layer(self) -> int:
        """Forward FLOPs per token of one layer's weight GEMMs: 2 · (weights in GEMMs)."""
        h, hkv, f = self.hidden, self.kv_hidden, self.ffn_hidden
        return 2 * (h * (h + 2 * hkv) + h * h + self.mlp_matrices * h * f)

    def attention_flops_per_token_per_layer(self, seq_len: int, causal_halved: bool = False) -> float:
        """Forward FLOPs per token of QKᵀ and PV: 2 · 2 · s · h (halved if causal masking is counted)."""
        flops = 4 * seq_len * self.hidden
        return flops / 2 if causal_halved else flops

    def logit_flops_per_token(self) -> int:
        return 2 * self.hidden * self.vocab

    def model_flops_per_token(self, seq_len: int, causal_halved: bool = False) -> float:
        """Training FLOPs per token without recomputation: 3 × forward (fwd + 2 × bwd).

        For the GPT layout (MHA, 4h GELU MLP) this equals 72·L·h²·(1 + s/(6h) + V/(12·L·h)) per
        token·(1/1) (Korthikanti et al. 2022, model FLOPs; Narayanan et al. 2021 Eq. 3 with k = 3).
        """
        fwd = self.layers * (self.matmul_flops_per_token_per_layer()
                             + self.attention_flops_per_token_per_layer(seq_len, causal_halved))
        return 3 * (fwd + self.logit_flops_per_token())

    def describe(self) -> str:
        kv = f", kv_heads {self.kv_heads}" if self.kv_heads != self.heads else ""
        return (f"{self.name}: {self.num_params / 1e9:.2f}B params, {self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads{kv}, ffn {self.ffn_hidden} ({self.activation}), vocab {self.vocab}"
                f"{', tied' if self.tied_embeddings else ''}")


@dataclass(frozen=True)
class TrainingJob:
    """What one optimizer step processes: sequence length and global batch (in sequences)."""
    seq_len: int
    global_batch: int

    def __post_init__(self):
        for key in ("seq_len", "global_batch"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(key.replace("_", "-"), f"must be a positive integer, got {v!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
