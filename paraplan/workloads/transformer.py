"""Dense decoder-only transformers and the training job around them.

Parameter count (per layer, biases and norms included; GQA-aware):
  attention  h·(h + 2·h_kv) + h·h   (Q, K, V, output projections), + (h + 2·h_kv) + h biases if any;
             latent attention (DeepSeek-V2/V3): h·r_q + r_q·a·(d + d_r) + h·(r_kv + d_r)
             + r_kv·a·(d + d_v) + a·d_v·h (MLASpec; r_q = 0: h·a·(d + d_r) for the queries)
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
MOE_DISPATCH = ("permute", "einsum")


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-Experts MLPs: ``experts`` routed experts of width ``expert_ffn_hidden``, each token
    sent to ``top_k`` of them, plus ``shared_experts`` every token uses. An MoE layer replaces the MLP
    of every ``every``-th layer after ``first_dense`` dense layers (DeepSpeed-MoE uses every other
    layer; DeepSeek-V3 keeps its first three dense). ``capacity_factor`` pads each expert's tokens to
    capacity_factor x the balanced share; None means dropless.

    ``dispatch`` is how routed tokens reach their experts on each GPU:

    - ``"permute"`` (default): tokens are gathered/scattered by index (Megatron-Core, MegaBlocks,
      Tutel); memory-bound, priced with the other elementwise kernels.
    - ``"einsum"``: the GShard formulation that DeepSpeed-MoE's ``MOELayer`` runs (deepspeed/moe/
      sharded_moe.py, 2021-2023): the gate builds an S x E x C combine-weight tensor (S tokens on the
      GPU, E experts, C capacity per expert), dispatch is ``einsum("sec,sm->ecm")`` and combine
      ``einsum("sec,ecm->sm")``: two dense GEMMs of 2·S·(E·C)·h FLOPs each with E·C = S·top_k·factor,
      i.e. work quadratic in the tokens per micro-batch (see
      :func:`paraplan.costmodels.moe.moe_einsum_dispatch_times`).

    ``router_groups`` / ``router_group_top_k``: group-limited routing (Megatron-Core's
    ``moe_router_num_groups`` / ``moe_router_group_topk``; Hugging Face's ``n_group`` / ``topk_group``).
    The experts are split into ``router_groups`` equal groups of consecutive experts, a token first
    picks ``router_group_top_k`` groups and then its ``top_k`` experts among theirs. DeepSeek-V3: 8
    groups, 4 picked, which over 8 nodes of an expert-parallel group of 64 bounds a token to 4 nodes
    (DeepSeek-AI 2024, arXiv:2412.19437 sec. 2.1.2, node-limited routing). None: no limit.
    """
    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    every: int = 1
    first_dense: int = 0
    capacity_factor: float | None = None
    dispatch: str = "permute"
    router_groups: int | None = None
    router_group_top_k: int | None = None
    latent_size: int = 0

    def __post_init__(self):
        for key in ("experts", "top_k", "expert_ffn_hidden", "every"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"moe.{key}", f"must be a positive integer, got {v!r}")
        for key in ("shared_experts", "first_dense", "latent_size"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"moe.{key}", f"must be a non-negative integer, got {v!r}")
        if self.top_k > self.experts:
            raise ConfigError("moe.top_k", f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        if self.capacity_factor is not None and self.capacity_factor < 1:
            raise ConfigError("moe.capacity_factor", f"must be >= 1 (or absent for dropless), got {self.capacity_factor}")
        if self.dispatch not in MOE_DISPATCH:
            raise ConfigError("moe.dispatch", f"unknown dispatch {self.dispatch!r}", accepted=", ".join(MOE_DISPATCH))
        self._check_router_groups()

    def _check_router_groups(self):
        groups, picked = self.router_groups, self.router_group_top_k
        if groups is None and picked is None:
            return
        for key, v in (("router_groups", groups), ("router_group_top_k", picked)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"moe.{key}", f"must be a positive integer (both router_groups and "
                                  f"router_group_top_k, or neither), got {v!r}")
        if self.experts % groups:
            raise ConfigError("moe.router_groups", f"{groups} groups do not split {self.experts} experts evenly",
                              accepted=f"a divisor of experts ({self.experts})")
        if picked > groups:
            raise ConfigError("moe.router_group_top_k", f"picks {picked} of {groups} groups",
                              accepted=f"1..{groups} (router_groups)")
        if picked * (self.experts // groups) < self.top_k:
            raise ConfigError("moe.router_group_top_k", f"{picked} groups of {self.experts // groups} experts "
                              f"hold fewer than top_k ({self.top_k}) experts",
                              accepted=f"at least {-(-self.top_k // (self.experts // groups))}")

    @property
    def group_limited(self) -> bool:
        """Whether routing is group-limited: fewer groups picked than there are."""
        return self.router_groups is not None and self.router_group_top_k < self.router_groups


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv:2405.04434 §2.1; Megatron-Core
    MLASelfAttention): queries pass through a rank-``q_lora_rank`` latent (0: projected directly, as in
    DeepSeek-V2-Lite), keys and values through a shared rank-``kv_lora_rank`` latent that one up-projection
    expands to every head's non-rotary key part (the model's ``head_dim``) and value
    (``v_head_dim``); a ``qk_rope_head_dim`` rotary part, per head for queries and shared by all heads
    for keys, rides beside it. So a head's score runs over head_dim + qk_rope_head_dim channels and its
    value over v_head_dim. DeepSeek-V3: q_lora 1536, kv_lora 512, nope 128, rope 64, v 128."""
    kv_lora_rank: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def __post_init__(self):
        for key in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "q_lora_rank" else 1):
                raise ConfigError(f"mla.{key}", f"must be a {'non-negative' if key == 'q_lora_rank' else 'positive'} "
                                  f"integer, got {v!r}")


#: layer kinds of a hybrid layer pattern (Megatron-LM ``--hybrid-override-pattern``, Hugging Face
#: ``hybrid_override_pattern``; megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols): one
#: character per layer, each layer a pre-norm, its mixer or MLP and a residual add; E is an MoE layer
#: (Symbols.MOE, NVIDIA/Megatron-LM @ 00caa53: a TransformerLayer with only an MoE MLP, the model's
#: ``moe:`` block; Nemotron 3 Nano's "MEMEM*EMEMEM*...")
LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-2 (SSD) mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060; Megatron-Core
    ``MambaMixer``, NVIDIA/Megatron-LM @ 00bebb4 megatron/core/ssm/mamba_mixer.py): ``heads`` heads of
    ``head_dim`` channels (d_inner = heads · head_dim), ``groups`` groups of B and C of ``state``
    channels each (the SSM state N), a causal depthwise convolution of ``conv_kernel`` taps over x, B and
    C, and the chunked scan in chunks of ``chunk`` tokens (Megatron's ``chunk_size``, 128).

    Parameters (mamba_mixer.py ``__init__``; no projection biases, a convolution bias):
      in_proj   h x (2·d_inner + 2·G·N + H)   (z, x, B, C, dt; column parallel)
      conv1d    (d_inner + 2·G·N) x (k + 1)    (weight and bias)
      A_log, D, dt_bias   3·H
      norm      d_inner                        (the gated RMSNorm)
      out_proj  d_inner x h                    (row parallel)
    """
    heads: int
    head_dim: int
    state: int
    groups: int
    conv_kernel: int = 4
    chunk: int = 128

    def __post_init__(self):
        for key in ("heads", "head_dim", "state", "groups", "conv_kernel", "chunk"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"mamba.{key}", f"must be a positive integer, got {v!r}")
        if self.heads % self.groups:
            raise ConfigError("mamba.groups", f"{self.groups} groups do not split {self.heads} heads evenly",
                              accepted=f"a divisor of mamba.heads ({self.heads})")

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def bc_width(self) -> int:
        """Channels of B and C together: 2·G·N."""
        return 2 * self.groups * self.state

    @property
    def in_proj_width(self) -> int:
        """Output width of in_proj: z, x, B, C and dt, 2·d_inner + 2·G·N + H."""
        return 2 * self.d_inner + self.bc_width + self.heads

    @property
    def conv_width(self) -> int:
        """Channels the causal convolution runs over: x, B and C, d_inner + 2·G·N."""
        return self.d_inner + self.bc_width

    def gemms(self, hidden: int) -> tuple[tuple[int, int, str], ...]:
        """The mixer's weight GEMMs as (output width, input width, tp split): in_proj column parallel,
        out_proj row parallel (Megatron-Core shards heads, groups and d_inner over tp)."""
        return ((self.in_proj_width, hidden, "column"), (hidden, self.d_inner, "row"))

    def params(self, hidden: int) -> int:
        """Parameters of the mixer (the layer's pre-norm not included)."""
        return (sum(o * i for o, i, _ in self.gemms(hidden)) + self.conv_width * (self.conv_kernel + 1)
                + 3 * self.heads + self.d_inner)

    def scan_flops_per_token(self) -> float:
        """Forward FLOPs per token of the SSD chunked scan (Dao & Gu 2024 sec. 6, the SSD algorithm's
        four steps, chunk length Q, head dim P, state N, H heads in G groups; 2 FLOPs per multiply-add):
        intra-chunk C·Bᵀ per group 2·Q·N and its masked product with X per head 2·Q·P (the diagonal
        blocks, computed whole as the kernels do), the chunk states Bᵀ·X 2·N·P per head, and the
        states' contribution to the output C·state 2·N·P per head; the inter-chunk recurrence
        (H·N·P per chunk) and the convolution (2·k per channel) are negligible beside them and not
        counted. Linear in the sequence length: no attention-like quadratic term."""
        Q, P, N = self.chunk, self.head_dim, self.state
        return 2.0 * self.groups * Q * N + self.heads * (2.0 * Q * P + 4.0 * N * P)


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
    moe: MoESpec | None = None
    #: rotary position embeddings applied to q and k in every layer (Llama, Mixtral, DeepSeek); False
    #: for learned absolute positions (GPT) and ALiBi (BLOOM, MPT)
    rotary: bool = False
    #: dropout after attention and after the MLP in training (GPT-2/3, Megatron GPT: a 1-byte mask per
    #: element kept for backward); False for models trained without it (Llama, Mixtral, DeepSeek,
    #: BLOOM): torch's dropout at p = 0 returns its input and keeps no mask
    dropout: bool = True
    #: width of one attention head; default hidden / heads. Models whose heads are not hidden / heads
    #: wide (Qwen3: hidden 2048, 32 heads of 128; GPT-OSS: 2880, 64 of 64) set it, and then the
    #: queries (and the attention output) are heads · head_dim wide, not hidden (``q_hidden``)
    head_dim: int | None = None
    #: keys each query sees in the sliding-window attention layers (0: every layer attends to the whole
    #: causal prefix); ``sliding_window_every`` = k: every k-th layer is windowed (1: all; GPT-OSS and
    #: Gemma 2 alternate windowed and full layers: 2); or, with ``global_attention_every`` = k, every layer
    #: but each k-th is windowed (Gemma 3: 5 local layers to 1 global, 6)
    sliding_window: int = 0
    sliding_window_every: int = 1
    #: chunked local attention (Llama 4's ``attention_chunk_size``): a query attends causally to the keys
    #: of its own chunk of ``attention_chunk`` tokens only; every ``global_attention_every``-th layer
    #: attends to the whole causal prefix instead (Llama 4: its no-RoPE layers, one in 4; 0: no layer).
    #: ``global_attention_every`` does the same for a sliding window
    attention_chunk: int = 0
    global_attention_every: int = 0
    #: multi-head latent attention in place of the Q/K/V projections (DeepSeek-V2/V3); ``head_dim`` is
    #: then the non-rotary query/key width per head (qk_nope_head_dim)
    mla: MLASpec | None = None
    #: multi-token prediction depth D (DeepSeek-V3, arXiv:2412.19437 sec. 2.2; Hugging Face
    #: ``num_nextn_predict_layers``; Megatron-LM ``--mtp-num-layers``): each depth adds, after the main
    #: model, two RMSNorms (the last hidden state and the next token's embedding), a 2h -> h projection,
    #: one transformer block like the model's last (MoE in an MoE model), and the shared LM head with its
    #: own cross-entropy; the embedding and the head are shared with the main model (no parameters)
    mtp_layers: int = 0
    #: hybrid layer pattern, one character per layer (:data:`LAYER_KINDS`: M a Mamba-2 mixer, * a
    #: self-attention layer, - an MLP layer, E an MoE layer of the ``moe`` block; Megatron-LM ``--hybrid-override-pattern``, Hugging Face
    #: ``hybrid_override_pattern``); "" for a transformer whose every layer is attention + MLP
    layer_pattern: str = ""
    #: the hybrid layers of one multi-token-prediction depth (with ``mtp_layers`` depths after the main
    #: stack): Megatron-LM's "/"-separated suffix of ``--hybrid-override-pattern`` ("MAIN/*E/*E": two depths
    #: of an attention and an MoE layer; NVIDIA/Megatron-LM @ 00caa53 megatron/core/ssm/
    #: mamba_hybrid_layer_allocation.py ``parse_hybrid_pattern``), Hugging Face ``mtp_hybrid_override_pattern``
    #: with ``num_nextn_predict_layers`` (Nemotron 3 Super: "*E", 1). Each depth adds the 2h -> h projection
    #: and its two RMSNorms, these layers and the shared head's logits and loss, as a transformer's depth
    mtp_pattern: str = ""
    #: the depths run one depth's layers again (Megatron-LM ``--mtp-use-repeated-layer``, Nemotron 3 Super's
    #: training: ``--mtp-num-layers 2`` over the checkpoint's one depth): the parameters of one depth, the
    #: compute and activations of all ``mtp_layers``
    mtp_repeated: bool = False
    #: the Mamba-2 mixer of the pattern's M layers
    mamba: MambaSpec | None = None
    #: an RMSNorm over each query and key head after the QKV projection, before the rotary embedding
    #: (Qwen3's q_norm / k_norm, Megatron-Core ``qk_layernorm``; Gemma 3 and OLMo 2 likewise): one more
    #: memory-bound norm over the layer's (q + k) widths per token, whose input backward keeps
    qk_norm: bool = False
    #: biases on the query, key and value projections only, in a model otherwise without biases
    #: (``bias`` False): Qwen2's Qwen2Attention (q, k, v with bias, o without; Megatron-Core
    #: ``add_qkv_bias``); adds (q + 2·kv) parameters per layer
    qkv_bias: bool = False
    #: what the file the model was read from holds that this model does not price (Hugging Face configs:
    #: logit softcapping, extra norms, ...), one line each; every estimate of the model says them
    approximated: tuple[str, ...] = ()

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
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ConfigError("hidden", f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) "
                                  "unless head_dim is given", source=self.name)
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        elif isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim <= 0:
            raise ConfigError("head_dim", f"must be a positive integer, got {self.head_dim!r}", source=self.name)
        if self.mla is not None and self.kv_heads != self.heads:
            raise ConfigError("kv_heads", f"latent attention expands keys and values to every head: kv_heads "
                              f"({self.kv_heads}) must equal heads ({self.heads})", source=self.name)
        if self.heads % self.kv_heads:
            raise ConfigError("kv_heads", f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})",
                              source=self.name)
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or self.mtp_layers < 0:
            raise ConfigError("mtp_layers", f"must be a non-negative integer, got {self.mtp_layers!r}", source=self.name)
        for key in ("attention_chunk", "global_attention_every"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(key, f"must be a non-negative integer, got {v!r}", source=self.name)
        if self.attention_chunk and self.sliding_window:
            raise ConfigError("attention_chunk", "a model has a sliding window or chunked attention, not both",
                              accepted="attention_chunk: 0, or sliding_window: 0", source=self.name)
        for key in ("sliding_window", "sliding_window_every"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "sliding_window" else 1):
                raise ConfigError(key, f"must be a {'non-negative' if key == 'sliding_window' else 'positive'} "
                                  f"integer, got {v!r}", source=self.name)
        if self.sliding_window and self.sliding_window_every > 1 and self.global_attention_every:
            raise ConfigError("global_attention_every", "a sliding window is on 1 in sliding_window_every layers "
                              "or on all but 1 in global_attention_every layers, not both",
                              accepted="sliding_window_every: 1, or global_attention_every: 0", source=self.name)
        if self.activation not in ACTIVATIONS:
            raise ConfigError("activation", f"unknown activation {self.activation!r}",
                              accepted=", ".join(ACTIVATIONS), source=self.name)
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError("norm", f"unknown norm {self.norm!r}", accepted="layernorm, rmsnorm", source=self.name)
        self._check_pattern()

    def _check_pattern(self):
        p = self.layer_pattern
        if not isinstance(p, str):
            raise ConfigError("layer_pattern", f"expected a string, got {p!r}", source=self.name)
        if not p:
            if self.mamba is not None:
                raise ConfigError("mamba", "a Mamba mixer needs a layer_pattern with M layers", source=self.name)
            self._check_mtp_pattern()
            return
        bad = sorted(set(p) - set(LAYER_KINDS))
        if bad:
            raise ConfigError("layer_pattern", f"unknown layer kind {bad[0]!r} in {p[:60]!r}",
                              accepted="M (Mamba-2), * (attention), - (MLP), E (MoE)", source=self.name)
        if len(p) != self.layers:
            raise ConfigError("layer_pattern", f"{len(p)} layers in the pattern, layers is {self.layers}",
                              accepted=f"a pattern of {self.layers} characters", source=self.name)
        if "M" in p and self.mamba is None:
            raise ConfigError("mamba", "the layer_pattern has Mamba layers (M) but the model gives no mamba block",
                              source=self.name)
        if "E" in p and self.moe is None:
            raise ConfigError("moe", "the layer_pattern has MoE layers (E) but the model gives no moe block",
                              accepted="a moe: block (experts, top_k, expert_ffn_hidden, shared_experts)", source=self.name)
        if self.moe is not None and "E" not in p:
            raise ConfigError("moe", "a hybrid model's moe block prices its E layers; the layer_pattern has none",
                              accepted="E layers in the layer_pattern, or no moe block", source=self.name)
        if self.moe is not None and (self.moe.every != 1 or self.moe.first_dense):
            raise ConfigError("moe.every", "a hybrid layer_pattern places its MoE layers (E) itself",
                              accepted="every: 1 and first_dense: 0 (the defaults)", source=self.name)
        if self.mla:
            raise ConfigError("mla", "not modelled together with a hybrid layer_pattern", source=self.name)
        self._check_mtp_pattern()

    def _check_mtp_pattern(self):
        q = self.mtp_pattern
        if not isinstance(q, str):
            raise ConfigError("mtp_pattern", f"expected a string, got {q!r}", source=self.name)
        if not self.layer_pattern:
            if q:
                raise ConfigError("mtp_pattern", "the hybrid layers of a multi-token-prediction depth need a "
                                  "hybrid layer_pattern", source=self.name)
            return
        if self.mtp_repeated and not self.mtp_layers:
            raise ConfigError("mtp_repeated", "repeats a multi-token-prediction depth, but mtp_layers is 0",
                              source=self.name)
        if bool(q) != bool(self.mtp_layers):
            raise ConfigError("mtp_pattern" if q else "mtp_layers", "a hybrid model's multi-token prediction needs "
                              "both its depth count (mtp_layers) and the layers of one depth (mtp_pattern)",
                              accepted="mtp_layers >= 1 with mtp_pattern (\"*E\"), or neither", source=self.name)
        bad = sorted(set(q) - set(LAYER_KINDS))
        if bad:
            raise ConfigError("mtp_pattern", f"unknown layer kind {bad[0]!r} in {q[:60]!r}",
                              accepted="M (Mamba-2), * (attention), - (MLP), E (MoE)", source=self.name)
        for symbol, block, value in (("M", "mamba", self.mamba), ("E", "moe", self.moe)):
            if symbol in q and value is None:
                raise ConfigError("mtp_pattern", f"has {symbol} layers but the model gives no {block} block",
                                  source=self.name)

    # --- hybrid layer patterns --------------------------------------------------------------------
    @property
    def is_hybrid(self) -> bool:
        """Whether the layers follow a hybrid pattern (:attr:`layer_pattern`)."""
        return bool(self.layer_pattern)

    def kind_count(self, kind: str) -> int:
        """Layers of one kind ("mamba", "attention", "mlp", "moe"); a transformer's every layer is both an
        attention and an MLP layer (its MoE layers: :attr:`moe_layers`)."""
        if not self.layer_pattern:
            return self.layers if kind in ("attention", "mlp") else 0
        symbol = next(k for k, v in LAYER_KINDS.items() if v == kind)
        return self.layer_pattern.count(symbol)

    def kind_share(self, kind: str) -> float:
        """Layers of one kind over all layers (1 for attention and MLP in a transformer)."""
        return self.kind_count(kind) / self.layers

    @property
    def single_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def kind_params(self, kind: str) -> int:
        """Parameters of one layer of a hybrid pattern's kind: its pre-norm and its mixer or MLP."""
        if kind == "mamba":
            return self.mamba.params(self.hidden) + self.single_norm_params
        if kind == "attention":
            return self.attention_params_per_layer + self.single_norm_params + (2 * self.head_dim if self.qk_norm else 0)
        if kind == "moe":
            return (self.router_params + self.latent_projection_params + self.routed_expert_params_per_moe_layer
                    + self.moe.shared_experts * self.expert_mlp_params + self.single_norm_params)
        return self.mlp_params_per_layer + self.single_norm_params

    def kind_active_params(self, kind: str) -> int:
        """Parameters of one layer of a kind that a token passes through: an MoE layer's pre-norm, router,
        top-k routed and shared experts; every parameter of the other kinds."""
        if kind != "moe":
            return self.kind_params(kind)
        return (self.router_params + self.latent_projection_params + self.moe.top_k * self.routed_expert_mlp_params
                + self.moe.shared_experts * self.expert_mlp_params + self.single_norm_params)

    def kind_matmul_flops_per_token(self, kind: str) -> float:
        """Forward weight-GEMM FLOPs per token of one layer of a kind (2 per multiply-add)."""
        if kind == "mamba":
            return 2.0 * sum(o * i for o, i, _ in self.mamba.gemms(self.hidden))
        if kind == "attention":
            return 2.0 * self.attention_weights_per_layer
        if kind == "moe":       # the router, the latent projections, top-k routed and shared experts
            return 2.0 * self.moe_weights_per_token
        return 2.0 * self.mlp_matrices * self.hidden * self.ffn_hidden

    def scan_flops_per_token_per_layer(self) -> float:
        """Forward SSD-scan FLOPs per token averaged over the layers (:meth:`MambaSpec.scan_flops_per_token`
        on the Mamba layers' share; 0 without them)."""
        if self.mamba is None:
            return 0.0
        return self.kind_share("mamba") * self.mamba.scan_flops_per_token()

    # --- shapes -----------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        """Channels one head's score runs over: head_dim (+ the rotary part under latent attention)."""
        return self.head_dim + (self.mla.qk_rope_head_dim if self.mla else 0)

    @property
    def v_head_dim(self) -> int:
        """Width of one head's value and output: head_dim (latent attention: its own v_head_dim)."""
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def q_hidden(self) -> int:
        """Width of Q: heads · qk_head_dim (= hidden unless ``head_dim`` is set otherwise, or latent
        attention widens it)."""
        return self.heads * self.qk_head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of K: kv_heads · qk_head_dim (latent attention: every head's expanded key)."""
        return self.kv_heads * self.qk_head_dim

    @property
    def v_hidden(self) -> int:
        """Width of V: kv_heads · v_head_dim (= kv_hidden without latent attention)."""
        return self.kv_heads * self.v_head_dim

    @property
    def attn_out_hidden(self) -> int:
        """Width of the attention output, the output projection's input: heads · v_head_dim (= q_hidden
        without latent attention)."""
        return self.heads * self.v_head_dim

    @property
    def rope_hidden(self) -> int:
        """Channels the rotary embedding turns per token: all of Q and K, or under latent attention
        the rotary parts only (heads · rope for queries, one shared rope for keys)."""
        if self.mla:
            return (self.heads + 1) * self.mla.qk_rope_head_dim
        return self.q_hidden + self.kv_hidden

    @property
    def attention_gemms(self) -> tuple[tuple[int, int, str], ...]:
        """The attention's weight GEMMs as (output width, input width, tensor-parallel split): "column"
        splits the output over tp, "row" the input, "duplicated" runs whole on every tp rank.
        Multi-head: the fused QKV projection and the output projection. Latent attention
        (Megatron-Core MLASelfAttention: the down-projections duplicated, the up-projections column
        parallel): Q down h -> q_lora and up q_lora -> heads·qk_head_dim (or h -> Q directly), KV down
        h -> kv_lora + rope, KV up kv_lora -> heads·(head_dim + v_head_dim), output heads·v_head_dim -> h."""
        h = self.hidden
        if not self.mla:
            return ((self.q_hidden + 2 * self.kv_hidden, h, "column"), (h, self.q_hidden, "row"))
        m = self.mla
        q = (((m.q_lora_rank, h, "duplicated"), (self.q_hidden, m.q_lora_rank, "column")) if m.q_lora_rank
             else ((self.q_hidden, h, "column"),))
        return q + ((m.kv_lora_rank + m.qk_rope_head_dim, h, "duplicated"),
                    (self.heads * (self.head_dim + m.v_head_dim), m.kv_lora_rank, "column"),
                    (h, self.attn_out_hidden, "row"))

    @property
    def mla_up_projection_gemms(self) -> tuple[tuple[int, int, str], ...]:
        """Latent attention's up-projections among :attr:`attention_gemms`: the column-parallel GEMMs
        that read a latent (q_lora -> Q, kv_lora -> K | V); none for multi-head attention."""
        if not self.mla:
            return ()
        return tuple(g for g in self.attention_gemms if g[2] == "column" and g[1] != self.hidden)

    @property
    def mla_latent_width(self) -> int:
        """Per-token width of latent attention's compressed query and key/value (with its rotary key)
        on every tp rank; 0 without latent attention."""
        return (self.mla.q_lora_rank + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) if self.mla else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn_hidden: 3 for SwiGLU (gate, up, down), else 2."""
        return 3 if self.activation == "swiglu" else 2

    # --- parameters -------------------------------------------------------------------------------
    @property
    def attention_weights_per_layer(self) -> int:
        """Weight elements of the attention's GEMMs (:attr:`attention_gemms`): for multi-head attention
        the QKV projection h x (q + 2·h_kv) and the output projection q x h (q = heads · head_dim),
        without biases."""
        return sum(out * inp for out, inp, _ in self.attention_gemms)

    @property
    def attention_params_per_layer(self) -> int:
        """:attr:`attention_weights_per_layer` plus the projections' biases where the model has them
        (latent attention: the RMSNorms of its two latents instead)."""
        if self.mla:
            return self.attention_weights_per_layer + self.mla.q_lora_rank + self.mla.kv_lora_rank
        q, hkv = self.q_hidden, self.kv_hidden
        if self.bias:
            return self.attention_weights_per_layer + (q + 2 * hkv) + self.hidden
        return self.attention_weights_per_layer + ((q + 2 * hkv) if self.qkv_bias else 0)

    @property
    def mlp_params_per_layer(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        weights = self.mlp_matrices * h * f
        biases = (f * (self.mlp_matrices - 1) + h) if self.bias else 0
        return weights + biases

    @property
    def norm_params_per_layer(self) -> int:
        per_norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        # QK-norm: one weight per channel of a head, shared by every query (key) head (Qwen3)
        return 2 * per_norm + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params_per_layer(self) -> int:
        """Parameters of a dense layer (of a hybrid pattern: its largest layer, what a sharded layer
        gathers at most)."""
        if self.layer_pattern:
            return max(self.kind_params(LAYER_KINDS[c]) for c in set(self.layer_pattern))
        return self.attention_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer

    # --- mixture of experts -------------------------------------------------------------------------
    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model; a hybrid pattern's E layers)."""
        if self.moe is None:
            return 0
        if self.layer_pattern:
            return self.layer_pattern.count("E")
        return max(0, self.layers - self.moe.first_dense) // self.moe.every

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def expert_mlp_params(self) -> int:
        """One shared expert's MLP weights (and biases), h wide (of a model without LatentMoE also one
        routed expert's: :attr:`routed_expert_mlp_params`)."""
        return self._expert_params(self.hidden)

    def _expert_params(self, width: int) -> int:
        f = self.moe.expert_ffn_hidden
        return self.mlp_matrices * width * f + ((f * (self.mlp_matrices - 1) + width) if self.bias else 0)

    @property
    def moe_width(self) -> int:
        """Width of the routed experts' input and output and of the tokens the dispatcher permutes and the
        all-to-alls move: the LatentMoE latent ℓ (``moe.latent_size``), else the hidden size."""
        return (self.moe.latent_size or self.hidden) if self.moe else self.hidden

    @property
    def routed_expert_mlp_params(self) -> int:
        """One routed expert's MLP weights (and biases), :attr:`moe_width` wide."""
        return self._expert_params(self.moe_width)

    @property
    def latent_projection_params(self) -> int:
        """LatentMoE's two projections per MoE layer, h x ℓ down and ℓ x h up (and their biases); 0 without
        a latent (Megatron-Core moe_layer.py fc1_latent_proj / fc2_latent_proj)."""
        if not self.moe or not self.moe.latent_size:
            return 0
        h, ell = self.hidden, self.moe.latent_size
        return 2 * h * ell + ((h + ell) if self.bias else 0)

    @property
    def moe_weights_per_token(self) -> int:
        """Weights one token meets in an MoE layer's MLP (half its forward GEMM FLOPs): the router h·E, the
        latent projections 2·h·ℓ, top_k routed experts of g·ℓ·f_e (ℓ = :attr:`moe_width`) and the shared
        experts' g·h·f_e each."""
        e = self.moe
        g = self.mlp_matrices
        return (self.hidden * e.experts + (2 * self.hidden * e.latent_size if e.latent_size else 0)
                + e.top_k * g * self.moe_width * e.expert_ffn_hidden + e.shared_experts * g * self.hidden * e.expert_ffn_hidden)

    @property
    def router_params(self) -> int:
        return self.hidden * self.moe.experts if self.moe else 0

    @property
    def routed_expert_params_per_moe_layer(self) -> int:
        return self.moe.experts * self.routed_expert_mlp_params if self.moe else 0

    @property
    def params_per_moe_layer(self) -> int:
        """Attention, norms, router, routed and shared experts of one MoE layer."""
        if not self.moe:
            return 0
        return (self.attention_params_per_layer + self.norm_params_per_layer + self.router_params
                + self.latent_projection_params + self.routed_expert_params_per_moe_layer
                + self.moe.shared_experts * self.expert_mlp_params)

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
    def mtp_projection_params(self) -> int:
        """One multi-token-prediction depth's own parameters beside its block: the 2h -> h projection
        and its two RMSNorms."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden

    @property
    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction module: per depth its block (an MoE layer in an MoE
        model; a hybrid's :attr:`mtp_pattern` layers) and :attr:`mtp_projection_params`; 0 without one."""
        if self.mtp_pattern:
            block = sum(self.kind_params(LAYER_KINDS[c]) for c in self.mtp_pattern)
        else:
            block = self.params_per_moe_layer if self.moe else self.params_per_layer
        return self.mtp_param_depths * (block + self.mtp_projection_params)

    @property
    def mtp_param_depths(self) -> int:
        """Multi-token-prediction depths that hold parameters of their own: 1 of repeated depths
        (:attr:`mtp_repeated`), else every depth."""
        return min(self.mtp_layers, 1) if self.mtp_repeated else self.mtp_layers

    @property
    def mtp_block_layers(self) -> int:
        """Layers of one multi-token-prediction depth, each counted as a layer of the last stage: a hybrid's
        :attr:`mtp_pattern` layers, else one transformer block."""
        return len(self.mtp_pattern) if self.mtp_pattern else 1

    @property
    def mtp_moe_layers(self) -> int:
        """MoE layers of the multi-token-prediction module whose routed experts are held (over ep): per depth
        with parameters of its own (:attr:`mtp_param_depths`) the E layers of a hybrid's :attr:`mtp_pattern`,
        else its block (an MoE model's)."""
        per_depth = self.mtp_pattern.count("E") if self.mtp_pattern else (1 if self.moe else 0)
        return self.mtp_param_depths * per_depth

    @property
    def num_params(self) -> int:
        if self.layer_pattern:
            return (sum(self.kind_params(LAYER_KINDS[c]) for c in self.layer_pattern)
                    + self.embedding_params + self.lm_head_params + self.mtp_params)
        return (self.dense_layers * self.params_per_layer + self.moe_layers * self.params_per_moe_layer
                + self.embedding_params + self.lm_head_params + self.mtp_params)

    @property
    def _moe_active_per_layer(self) -> int:
        return (self.attention_params_per_layer + self.norm_params_per_layer + self.router_params
                + self.latent_projection_params + self.moe.top_k * self.routed_expert_mlp_params
                + self.moe.shared_experts * self.expert_mlp_params)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (top-k and shared experts only), the
        multi-token-prediction depths' included."""
        if not self.moe:
            return self.num_params
        if self.layer_pattern:
            mtp = self.mtp_param_depths * (sum(self.kind_active_params(LAYER_KINDS[c]) for c in self.mtp_pattern)
                                           + self.mtp_projection_params)
            return (sum(self.kind_active_params(LAYER_KINDS[c]) for c in self.layer_pattern)
                    + self.embedding_params + self.lm_head_params + mtp)
        return (self.dense_layers * self.params_per_layer + self.moe_layers * self._moe_active_per_layer
                + self.embedding_params + self.lm_head_params
                + self.mtp_layers * (self._moe_active_per_layer + self.mtp_projection_params))

    # --- FLOPs ------------------------------------------------------------------------------------
    def matmul_flops_per_token_per_layer(self) -> float:
        """Forward FLOPs per token of a layer's weight GEMMs, 2 · (weights a token meets), averaged
        over dense and MoE layers (an MoE layer counts its router, top-k and shared experts) or over a
        hybrid pattern's kinds."""
        if self.layer_pattern:
            return sum(self.kind_share(k) * self.kind_matmul_flops_per_token(k) for k in LAYER_KINDS.values()
                       if self.kind_count(k))
        if not self.moe:
            return self._block_matmul_flops_per_token(moe=False)
        return (self.dense_layers * self._block_matmul_flops_per_token(moe=False)
                + self.moe_layers * self._block_matmul_flops_per_token(moe=True)) / self.layers

    def _block_matmul_flops_per_token(self, moe: bool) -> float:
        """Forward weight-GEMM FLOPs per token of one dense or one MoE block."""
        h, f = self.hidden, self.ffn_hidden
        attention = self.attention_weights_per_layer
        if not moe:
            return 2 * (attention + self.mlp_matrices * h * f)
        return 2 * (attention + self.moe_weights_per_token)

    def mtp_flops_per_token(self, seq_len: int, causal_halved: bool = False) -> float:
        """Forward FLOPs per token of the multi-token-prediction module: per depth the 2h -> h
        projection (2·2h·h), its block's GEMMs and attention (a full-attention layer; a hybrid depth: its
        :attr:`mtp_pattern` layers' GEMMs, attention scores and SSD scans) and the shared head's logits; 0
        without one."""
        if not self.mtp_layers:
            return 0.0
        attention = self._attention_flops_per_token(seq_len / 2 if causal_halved else seq_len)
        if self.mtp_pattern:    # a hybrid depth: its layers' GEMMs, attention layers' scores, Mamba layers' scans
            q = self.mtp_pattern
            block = sum(self.kind_matmul_flops_per_token(LAYER_KINDS[c]) for c in q)
            attention = q.count("*") * attention
            block += q.count("M") * self.mamba.scan_flops_per_token() if "M" in q else 0.0
        else:
            block = self._block_matmul_flops_per_token(moe=self.moe is not None)
        return self.mtp_layers * (4 * self.hidden * self.hidden + block + attention + self.logit_flops_per_token())

    @property
    def windowed_layer_share(self) -> float:
        """Share of the layers whose attention is a sliding window (0 without one): 1 in
        ``sliding_window_every``, or all but 1 in ``global_attention_every``."""
        if not self.sliding_window:
            return 0.0
        if self.global_attention_every:
            return 1.0 - 1.0 / self.global_attention_every
        return 1.0 / self.sliding_window_every

    @property
    def chunked_layer_share(self) -> float:
        """Share of the layers whose attention stays inside its chunk (0 without chunked attention)."""
        if not self.attention_chunk:
            return 0.0
        return 1.0 - (1.0 / self.global_attention_every if self.global_attention_every else 0.0)

    def attention_keys_per_query(self, seq_len: int, causal_halved: bool = False) -> float:
        """Keys a query meets, averaged over the layers: s in full layers, min(window, s) in windowed
        ones and, in chunked ones, its chunk's (the s tokens cut into q = ⌊s/c⌋ chunks of c and one of
        r = s − q·c: (q·c² + r²)/s); counted causally, s/2 in full layers, w - w²/(2s) in windowed ones
        (w ≤ s: the first w queries meet 1..w keys, the others w) and half the chunked count."""
        share, w = self.windowed_layer_share, min(self.sliding_window, seq_len)
        chunked = self.chunked_layer_share
        c = min(self.attention_chunk, seq_len) if self.attention_chunk else seq_len
        q, r = divmod(seq_len, c)
        in_chunk = (q * c * c + r * r) / seq_len
        if causal_halved:
            return (1 - share - chunked) * (seq_len / 2) + share * (w - w * w / (2 * seq_len)) + chunked * in_chunk / 2
        return (1 - share - chunked) * seq_len + share * w + chunked * in_chunk

    def attention_flops_per_token_per_layer(self, seq_len: int, causal_halved: bool = False) -> float:
        """Forward FLOPs per token of QKᵀ and PV: 2 · keys · heads · (qk_head_dim + v_head_dim)
        (= 4·s·h for the usual head width and full attention; keys halved if causal masking is counted;
        windowed layers see min(window, s) keys: ``attention_keys_per_query``). Averaged over the
        layers: a hybrid pattern's attention layers only (its Mamba and MLP layers have no such term)."""
        keys = self.attention_keys_per_query(seq_len, causal_halved)
        return self.kind_share("attention") * self._attention_flops_per_token(keys)

    def _attention_flops_per_token(self, keys) -> float:
        """Forward QKᵀ and PV FLOPs per token that attends to ``keys`` keys."""
        return 2 * keys * (self.q_hidden + self.attn_out_hidden)

    def logit_flops_per_token(self) -> int:
        return 2 * self.hidden * self.vocab

    def model_flops_per_token(self, seq_len: int, causal_halved: bool = False) -> float:
        """Training FLOPs per token without recomputation: 3 × forward (fwd + 2 × bwd).

        For the GPT layout (MHA, 4h GELU MLP) this equals 72·L·h²·(1 + s/(6h) + V/(12·L·h)) per
        token·(1/1) (Korthikanti et al. 2022, model FLOPs; Narayanan et al. 2021 Eq. 3 with k = 3).
        """
        fwd = self.layers * (self.matmul_flops_per_token_per_layer()
                             + self.attention_flops_per_token_per_layer(seq_len, causal_halved)
                             + self.scan_flops_per_token_per_layer())
        return 3 * (fwd + self.logit_flops_per_token() + self.mtp_flops_per_token(seq_len, causal_halved))

    def describe(self) -> str:
        kv = f", kv_heads {self.kv_heads}" if self.kv_heads != self.heads else ""
        if self.layer_pattern:
            m = self.mamba
            kv += (f", hybrid {self.kind_count('mamba')} Mamba-2 / {self.kind_count('attention')} attention / "
                   f"{self.kind_count('mlp')} MLP" + (f" / {self.kind_count('moe')} MoE" if self.moe else "") + " layers"
                   + (f" (Mamba-2 {m.heads} heads x {m.head_dim}, state {m.state}, {m.groups} groups)" if m else ""))
        if self.mla:
            m = self.mla
            kv += (f", latent attention (q_lora {m.q_lora_rank}, kv_lora {m.kv_lora_rank}, head dims "
                   f"{self.head_dim}+{m.qk_rope_head_dim} / v {m.v_head_dim})")
        elif self.q_hidden != self.hidden:
            kv += f", head_dim {self.head_dim}"
        if self.sliding_window:
            every = "" if self.sliding_window_every == 1 else f" on 1 in {self.sliding_window_every} layers"
            if self.global_attention_every:
                every = f", global on 1 in {self.global_attention_every} layers"
            kv += f", sliding window {self.sliding_window}{every}"
        if self.attention_chunk:
            every = f", global on 1 in {self.global_attention_every} layers" if self.global_attention_every else ""
            kv += f", chunked attention {self.attention_chunk}{every}"
        if self.qk_norm:
            kv += ", QK-norm"
        if self.qkv_bias and not self.bias:
            kv += ", QKV bias"
        moe = ""
        if self.moe:
            e = self.moe
            moe = (f", MoE {e.experts}x{e.expert_ffn_hidden} top-{e.top_k}"
                   f"{f' +{e.shared_experts} shared' if e.shared_experts else ''}"
                   f"{f' within {e.router_group_top_k} of {e.router_groups} groups' if e.group_limited else ''}"
                   f"{f' at latent {e.latent_size}' if e.latent_size else ''}"
                   f" in {self.moe_layers} layers, "
                   f"{self.active_params / 1e9:.2f}B active")
        return (f"{self.name}: {self.num_params / 1e9:.2f}B params, {self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads{kv}, ffn {self.ffn_hidden} ({self.activation}), vocab {self.vocab}"
                f"{', tied' if self.tied_embeddings else ''}{moe}"
                f"{f', multi-token prediction depth {self.mtp_layers}' if self.mtp_layers else ''}"
                f"{f' of {self.mtp_pattern!r}' if self.mtp_pattern else ''}"
                f"{' (one depth repeated)' if self.mtp_repeated else ''}")


def params_text(total: int, active: int | None = None) -> str:
    """'8.03B parameters', '46.7B parameters, 12.9B active': a model's size as a header prints it (three
    significant digits, what a model card rounds to)."""
    def b(n: float) -> str:
        return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
    return f"{b(total)} parameters" + (f", {b(active)} active" if active and active != total else "")


#: the largest sequence length or global batch a job may have: past a C int they are typos, and
#: numpy's C longs overflow on them in the planner's divisibility checks
MAX_JOB_COUNT = 2**31 - 1


@dataclass(frozen=True)
class TrainingJob:
    """What one optimizer step processes: sequence length and global batch (in sequences).
    ``moe_imbalance`` is the busiest expert-parallel rank's routed tokens over the mean (1.0 = balanced,
    e.g. a router forced to balance); None (the default): a trained router's, which the MoE cost model
    prices (paraplan.costmodels.moe.routed_time_factor)."""
    seq_len: int
    global_batch: int
    moe_imbalance: float | None = None

    def __post_init__(self):
        for key in ("seq_len", "global_batch"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(key.replace("_", "-"), f"must be a positive integer, got {v!r}")
            if v > MAX_JOB_COUNT:       # the planner's batch checks run in numpy's C longs (OverflowError)
                raise ConfigError(key.replace("_", "-"), f"must be at most {MAX_JOB_COUNT:,}, got {v:.3g}")
        if self.moe_imbalance is not None and (isinstance(self.moe_imbalance, bool)
                                               or not isinstance(self.moe_imbalance, (int, float))
                                               or not self.moe_imbalance >= 1):
            raise ConfigError("moe-imbalance", f"must be >= 1.0 (1.0 = perfectly balanced experts), "
                              f"got {self.moe_imbalance!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
