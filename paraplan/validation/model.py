"""A small GPT-style decoder for the validation harness, tensor/sequence/pipeline-parallel aware.

Token + learned position embedding, ``L`` pre-LN blocks (causal self-attention, GELU MLP),
final LayerNorm and an untied LM head. Every full weight is initialised from the config seed
and the parameter's name, so each rank of a parallel run slices exactly the tensor a
single-process run holds. The vocabulary is split over tp as in Megatron-LM (Shoeybi et al.
2019, sec. 3): each tp rank holds V/t rows of the token embedding (lookups outside its rows
are zero, then all-reduced) and of the LM head (column-parallel: logits of its V/t ids), and
the loss is the vocabulary-parallel cross-entropy; positions stay replicated. Tied embeddings
are not used so pipeline stages need no shared-weight sync.

The tensor-parallel layout is Megatron-LM's (Shoeybi et al. 2019, sec. 3): the fused QKV
projection (one GEMM, rows ordered by head) and the first MLP linear are column-parallel (heads
split across tp), the attention output and second MLP linear row-parallel. As in Megatron-LM and
nanoGPT, QKV is one GEMM and the causal mask is built once, not per forward: the estimator
models that layout, and separate q/k/v GEMMs and a per-call mask cost the eager CPU step ~25 %
of its forward at micro-batch 1. With sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2) the
activations between blocks are split along the sequence and the tp all-reduce becomes an
all-gather before, and a reduce-scatter after, each parallel region. With context parallelism
(:mod:`paraplan.validation.apply_cp`) a rank holds two of ``2·cp`` sequence chunks, its positions
index the learned position embedding and attention is ring attention over the cp group.
With ``experts`` > 0 every block's MLP is a dropless mixture of experts
(:mod:`paraplan.validation.apply_ep`), its experts split over the ep group. The Llama family's
choices replace GPT's where the config asks: SwiGLU (``activation``), RMSNorm (``norm``), linear
layers without biases (``bias``), grouped-query attention (``kv_heads``) and rotary positions
(``rotary``, which drops the learned position embedding).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from paraplan.validation import comm
from paraplan.validation.apply_cp import ring_attention
from paraplan.validation.apply_ep import EpContext, mlp_activation, moe_mlp
from paraplan.validation.config import GPTConfig  # noqa: F401  (the harness model, torch-free; re-exported)
from paraplan.validation.memory import SavedActivationCounter

@dataclass
class ParallelContext:
    """Where this rank sits: tp group and sequence parallelism (None groups = single process)."""

    tp_group: object = None
    tp_size: int = 1
    tp_rank: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    stats: dict = field(default_factory=dict)
    #: context parallelism (:class:`paraplan.validation.apply_cp.CpContext`), None without it
    cp: object = None
    #: expert parallelism (:class:`paraplan.validation.apply_ep.EpContext`)
    ep: EpContext = field(default_factory=EpContext)
    #: expert tensor parallelism (etp = tp): every routed expert split over the tp group, which
    #: all-gathers its ranks' routed copies and reduce-scatters the experts' partial outputs
    #: (apply_ep.moe_mlp); else (etp 1) the experts are whole on every tp rank and run on its
    #: sequence shard
    expert_tp: bool = False

    @property
    def cp_size(self) -> int:
        return 1 if self.cp is None else self.cp.size


def param_specs(cfg: GPTConfig, expert_tp: bool = False) -> list[tuple[str, tuple[int, ...], int | None, str]]:
    """(name, full shape, tp-split dim or None, init kind) for every parameter of the model. The routed
    experts are whole on every tp rank unless ``expert_tp`` (expert tensor parallelism etp = tp): then
    each expert's first projection is split by output rows and its second by input columns over the
    tp group, as the dense MLP's are."""
    h, f, V, S = cfg.hidden, cfg.ffn, cfg.vocab_size, cfg.seq_len
    d, g = cfg.hidden // cfg.heads, cfg.gated
    qkv_rows = (cfg.heads + 2 * cfg.n_kv) * d
    specs = [("tok_emb", (V, h), 0, "normal")] + ([] if cfg.rotary else [("pos_emb", (S, h), None, "normal")])

    def norm(name):
        return [(name + ".weight", (h,), None, "ones")] + \
            ([(name + ".bias", (h,), None, "zeros")] if cfg.norm == "layernorm" else [])

    def linear(name, shape, dim, kind):   # its bias split as its output rows, replicated if row-parallel
        bias = [(name + ".bias", shape[:1], 0 if dim == 0 else None, "zeros")] if cfg.bias else []
        return [(name + ".weight", shape, dim, kind)] + bias

    for i in range(cfg.layers):
        p = f"blocks.{i}."
        # fused QKV as Megatron-LM lays it out: rows ordered (kv group, [its queries, key, value],
        # head_dim), so a contiguous tp slice of rows holds whole groups with their q, k and v (one
        # query per group without grouped-query attention: (head, q/k/v, head_dim))
        specs += norm(p + "ln1") + linear(p + "attn.qkv", (qkv_rows, h), 0, "normal")
        if cfg.qk_norm:   # replicated on every tp rank, which each normalize their own heads with it
            specs += [(p + "attn.q_norm.weight", (d,), None, "ones"), (p + "attn.k_norm.weight", (d,), None, "ones")]
        specs += linear(p + "attn.o", (h, h), 1, "proj") + norm(p + "ln2")
        if cfg.experts:   # the router, then every expert's own weights (split over ep by expert)
            specs.append((p + "moe.router.weight", (cfg.experts, h), None, "normal"))
            fe = cfg.expert_width
            rows, cols = (0, 1) if expert_tp else (None, None)
            for j in range(cfg.experts):
                q = f"{p}moe.experts.{j}."
                specs += linear(q + "fc1", (g * fe, h), rows, "normal") + linear(q + "fc2", (h, fe), cols, "proj")
        else:   # SwiGLU's first projection: rows ordered (ffn unit, gate/up), so tp slices hold pairs
            specs += linear(p + "mlp.fc1", (g * f, h), 0, "normal") + linear(p + "mlp.fc2", (h, f), 1, "proj")
    specs += norm("ln_f") + [("head.weight", (V, h), 0, "normal")]
    return specs


def is_expert_param(name: str) -> bool:
    """Whether a parameter belongs to a routed expert (split over ep, averaged over expert data parallelism)."""
    return ".moe.experts." in name


def expert_index(name: str) -> int:
    """The expert a parameter ``blocks.i.moe.experts.j.…`` belongs to (j)."""
    return int(name.split(".moe.experts.", 1)[1].split(".", 1)[0])


def local_experts(cfg: GPTConfig, ep_rank: int, ep_size: int) -> range:
    """The experts ep rank ``ep_rank`` holds: a contiguous run of E/ep."""
    n = cfg.experts // ep_size
    return range(ep_rank * n, (ep_rank + 1) * n)


def full_init(cfg: GPTConfig, name: str, shape, kind: str) -> torch.Tensor:
    """The unsharded initial value of one parameter: depends only on (seed, name)."""
    if kind == "ones":
        return torch.ones(shape)
    if kind == "zeros":
        # small non-zero biases so their gradients and sharding are exercised too
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + zlib.crc32(name.encode()))
        return 0.01 * torch.randn(shape, generator=g)
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + zlib.crc32(name.encode()))
    std = 0.02 / math.sqrt(2 * cfg.layers) if kind == "proj" else 0.02
    return std * torch.randn(shape, generator=g)


def shard(t: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    """This tp rank's contiguous slice of ``t`` along ``dim`` (the whole tensor if dim is None)."""
    if dim is None or size == 1:
        return t.clone()
    return t.chunk(size, dim=dim)[rank].clone()


def synthetic_batch(cfg: GPTConfig, global_batch: int, step: int,
                    data_seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token batch for ``step``: (inputs, targets), each [global_batch, seq_len]."""
    g = torch.Generator().manual_seed(data_seed * 7919 + step)
    tokens = torch.randint(0, cfg.vocab_size, (global_batch, cfg.seq_len + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class _SaveInput(torch.autograd.Function):
    """Identity that saves its input, so activation accounting sees a checkpointed block's input.
    Applied through :func:`_mark_checkpoint_input` only while activations are being counted."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _mark_checkpoint_input(x):
    """``_SaveInput.apply(x)`` while a SavedActivationCounter is active, else ``x`` unchanged:
    the mark is instrumentation (a Python autograd Function, tens of us forward and backward on a
    CPU), and a timed step carries none."""
    return _SaveInput.apply(x) if SavedActivationCounter.active else x


_aten = torch.ops.aten
#: the matmuls op-level SAC counts (a linear with bias dispatches addmm, without mm)
SAC_MATMULS = (_aten.mm.default, _aten.addmm.default)
#: the fused attention kernels whose outputs it keeps (torchtitan's _save_list)
SAC_ATTENTION = tuple(getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention") if hasattr(_aten, name))


def _sac_output_bytes(op, args) -> int:
    """Bytes of what a kept op returns: an [m, n] matmul, or a fused attention's output [.., s, d_v]
    and its fp32 log-sum-exp [.., s]."""
    if op in SAC_MATMULS:
        a, b = args[-2], args[-1]
        return a.shape[0] * b.shape[1] * a.element_size()
    q, v = args[0], args[2]
    rows = q.numel() // q.shape[-1]
    return rows * v.shape[-1] * q.element_size() + rows * 4


def op_sac_context(kept: list | None = None):
    """The (forward, recompute) contexts of torchtitan's op-level selective activation checkpointing
    for one block (``torchtitan/models/llama3/infra/parallelize.py``: ``_save_list`` and "save every
    other mm"): the outputs of the 1st, 3rd, 5th... matmul and of the fused attention kernel are kept,
    everything else (norms, rotary, the other matmuls, the activation, gathers) is recomputed in the
    backward. While a SavedActivationCounter is active the bytes kept are counted in it and appended
    to ``kept`` (the checkpoint's cache holds them, out of the saved-tensor hooks' sight; the block
    stops counting them when its backward is done, :meth:`Block.forward`)."""
    counts = [0]

    def policy(ctx, op, *args, **kwargs):
        keep = op in SAC_ATTENTION
        if op in SAC_MATMULS:
            counts[0] += 1
            keep = counts[0] % 2 == 1
        counter = SavedActivationCounter.current
        if keep and counter is not None and kept is not None:
            nbytes = _sac_output_bytes(op, args)
            counter.hold(nbytes)
            kept.append(nbytes)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def make_norm(cfg: GPTConfig) -> nn.Module:
    """The model's norm over ``hidden`` (its parameters are set from the specs afterwards)."""
    return nn.RMSNorm(cfg.hidden, eps=1e-5) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.hidden)


def _plus_bias(y, linear):
    """``y`` plus a row-parallel linear's bias, added after the tp reduction (none without biases)."""
    bias = getattr(linear, "bias", None)
    return y if bias is None else y + bias


#: rotary cos/sin tables by (positions, head dim, dtype, device), shared by every block of a process
_ROTARY_TABLES: dict = {}


class Block(nn.Module):
    """One pre-LN transformer block holding this tp rank's shard of every weight."""

    def __init__(self, cfg: GPTConfig, index: int, ctx: ParallelContext):
        super().__init__()
        self.cfg, self.ctx, self.index = cfg, ctx, index
        self.local_heads = cfg.heads // ctx.tp_size
        self.local_kv = cfg.n_kv // ctx.tp_size
        self.head_dim = cfg.hidden // cfg.heads
        self.ln1 = make_norm(cfg)
        self.ln2 = make_norm(cfg)
        self.attn = nn.Module()
        self._causal_masks = {}
        for n in ("qkv", "o"):
            self.attn.add_module(n, nn.Module())
        if cfg.qk_norm:
            for n in ("q_norm", "k_norm"):
                self.attn.add_module(n, nn.RMSNorm(self.head_dim, eps=1e-6))
        self.local_experts = local_experts(cfg, ctx.ep.rank, ctx.ep.size) if cfg.experts else range(0)
        if cfg.experts:
            self.moe = nn.Module()
            self.moe.add_module("router", nn.Module())
            self.moe.add_module("experts", nn.Module())
            for j in self.local_experts:
                expert = nn.Module()
                for n in ("fc1", "fc2"):
                    expert.add_module(n, nn.Module())
                self.moe.experts.add_module(str(j), expert)
        else:
            self.mlp = nn.Module()
            for n in ("fc1", "fc2"):
                self.mlp.add_module(n, nn.Module())
        prefix = f"blocks.{index}."
        for name, shape, dim, kind in param_specs(cfg, ctx.expert_tp):
            if not name.startswith(prefix):
                continue
            if is_expert_param(name) and expert_index(name) not in self.local_experts:
                continue   # another ep rank's expert
            value = shard(full_init(cfg, name, shape, kind), dim, ctx.tp_rank, ctx.tp_size)
            owner_path, leaf = name[len(prefix):].rsplit(".", 1)
            param = nn.Parameter(value)
            # replicated params that see only a sequence shard need a tp all-reduce of grads, and so do
            # the QK-norm weights, which each tp rank applies to its own heads only (Megatron-LM's
            # _allreduce_layernorm_grads sums q_layernorm / k_layernorm grads over tp the same way)
            qk = ".q_norm." in name or ".k_norm." in name
            param.sp_partial = dim is None and (ctx.sequence_parallel or (qk and ctx.tp_size > 1))
            setattr(self.get_submodule(owner_path), leaf, param)

    def _enter_parallel(self, x):
        ctx = self.ctx
        if ctx.sequence_parallel:
            return comm.gather_seq_reduce_scatter_grad(x, ctx.tp_group)
        return comm.copy_to_tp(x, ctx.tp_group)

    def _exit_parallel(self, y):
        ctx = self.ctx
        if ctx.sequence_parallel:
            return comm.reduce_scatter_seq(y, ctx.tp_group)
        return comm.reduce_from_tp(y, ctx.tp_group)

    def _core_attention(self, q, k, v):
        """Causal attention of q [b, heads, s, d] over k, v [b, kv heads, s, d]: query head i reads
        key/value head i // (heads / kv heads) (grouped-query attention). The math form groups the
        queries [b, kv, rep, s, d] against k, v [b, kv, 1, s, d] by broadcasting, so backward keeps
        the kv heads, not a copy per query head."""
        if self.ctx.cp_size > 1:
            return ring_attention(q, k, v, self.ctx.cp, fused=self.cfg.attention == "sdpa")
        grouped = k.shape[1] != q.shape[1]
        if self.cfg.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        b, heads, s, d = q.shape
        if grouped:
            q, k, v = q.view(b, k.shape[1], heads // k.shape[1], s, d), k.unsqueeze(2), v.unsqueeze(2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        o = torch.softmax(scores.masked_fill(self._causal_mask(s, q.device), float("-inf")), dim=-1) @ v
        return o.reshape(b, heads, s, d) if grouped else o

    def _rotate(self, x, positions):
        """Rotary positions (Su et al. 2021; Llama's and Megatron-LM's non-interleaved form) on x
        [b, heads, s, d]: x·cos + rotate_half(x)·sin, the angle of channel pair i at position p
        p / 10000^(2i/d); cos and sin kept per positions, one table for every block (as Megatron-LM
        keeps one rotary embedding per model), so backward keeps one copy, not one per layer."""
        d = x.shape[-1]
        key = (positions.numel(), int(positions[0]), int(positions[-1]), d, x.dtype, str(x.device))
        if key not in _ROTARY_TABLES:
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            ang = positions.to(torch.float32)[:, None] * inv[None, :]
            ang = torch.cat([ang, ang], dim=-1).to(x.device)
            _ROTARY_TABLES[key] = (ang.cos().to(x.dtype), ang.sin().to(x.dtype))
        cos, sin = _ROTARY_TABLES[key]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _causal_mask(self, s: int, device) -> torch.Tensor:
        """The s×s upper-triangle mask, built once per (s, device) and kept (as nanoGPT and
        Megatron-LM keep theirs), not rebuilt in every forward."""
        key = (s, str(device))
        if key not in self._causal_masks:
            self._causal_masks[key] = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
        return self._causal_masks[key]

    def _column_parallel_input(self, x):
        """The normed block input for the column-parallel linears: gathered over the sequence here
        (:meth:`_enter_parallel`) unless :meth:`_column_linear` gathers it itself, keeping the shard."""
        return x if self._gathers_in_linear() else self._enter_parallel(x)

    def _gathers_in_linear(self) -> bool:
        """Under sequence parallelism the fused column-parallel linears gather their input themselves
        and keep only the shard for backward (:func:`comm.sequence_gathered_linear`, Megatron-LM's
        way); op-level SAC's split projections share one gathered input."""
        return self.ctx.sequence_parallel and self.ctx.recompute != "op-sac"

    def _column_linear(self, x, weight, bias):
        if self._gathers_in_linear():
            return comm.sequence_gathered_linear(x, weight, self.ctx.tp_group, bias)
        return F.linear(x, weight, bias)

    def _attention(self, x):
        a = self.attn
        x = self._column_parallel_input(self.ln1(x))
        if self.ctx.recompute == "op-sac":
            b, s, _ = x.shape
            q, k, v = self._separate_projections(x, b, s)
        else:
            q, k, v = self._fused_projection(x)
        b, s = q.shape[0], q.shape[2]
        if self.cfg.qk_norm:   # each head normalized over its channels, before the rotary positions
            q, k = a.q_norm(q), a.k_norm(k)
        if self.cfg.rotary:   # the tokens' global positions (this rank's under context parallelism)
            positions = self.ctx.cp.local_positions if self.ctx.cp_size > 1 else torch.arange(s)
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        if self.ctx.recompute == "selective":
            o = checkpoint(self._core_attention, _mark_checkpoint_input(q), _mark_checkpoint_input(k),
                           _mark_checkpoint_input(v), use_reentrant=False)
        else:
            o = self._core_attention(q, k, v)
        o = o.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        return _plus_bias(self._exit_parallel(F.linear(o, a.o.weight)), a.o)

    def _fused_projection(self, x):
        """q, k, v [b, heads (kv heads), s, head_dim] from one matmul of the fused QKV weight, each in
        storage of its own (Megatron-LM's reshapes of its split QKV copy them too): as views of the
        fused output, any one kept for backward would keep all of it alive, the queries' and keys'
        parts too once rotary positions or a grouped-query reshape have replaced those by copies."""
        a = self.attn
        qkv = self._column_linear(x, a.qkv.weight, getattr(a.qkv, "bias", None))
        b, s = qkv.shape[0], qkv.shape[1]
        if self.local_kv == self.local_heads:
            qkv = qkv.view(b, s, self.local_heads, 3, self.head_dim)
            q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)    # each [b, local heads, s, head_dim]
        else:   # rows (kv group, [its rep queries, key, value], head_dim)
            rep = self.local_heads // self.local_kv
            qkv = qkv.view(b, s, self.local_kv, rep + 2, self.head_dim)
            q = qkv[:, :, :, :rep].reshape(b, s, self.local_heads, self.head_dim).transpose(1, 2)
            k, v = qkv[:, :, :, rep].transpose(1, 2), qkv[:, :, :, rep + 1].transpose(1, 2)
        return tuple(t.contiguous() for t in (q, k, v))

    def _separate_projections(self, x, b, s):
        """q, k, v as three matmuls on their rows of the fused weight (and bias), in torchtitan's order
        wq, wk, wv (op-level SAC keeps every other matmul's output, so what it keeps depends on how the
        projections are split); the values of :meth:`_fused_projection`. The fused rows are (kv group,
        [its queries, key, value], head_dim), a group of one query under multi-head attention."""
        a, d = self.attn, self.head_dim
        rep = self.local_heads // self.local_kv
        w = a.qkv.weight.view(self.local_kv, rep + 2, d, -1)
        bias = getattr(a.qkv, "bias", None)
        bias = None if bias is None else bias.view(self.local_kv, rep + 2, d)
        out = []
        for rows, heads in ((slice(0, rep), self.local_heads), (rep, self.local_kv), (rep + 1, self.local_kv)):
            y = F.linear(x, w[:, rows].reshape(-1, w.shape[-1]), None if bias is None else bias[:, rows].reshape(-1))
            out.append(y.view(b, s, heads, d).transpose(1, 2))
        return tuple(out)

    def _expert_weights(self) -> list[tuple]:
        """(W1, b1, W2, b2) of this rank's experts (shards under expert tensor parallelism, where each
        rank's second projection yields a partial sum that the reduce-scatter adds up: its bias joins on
        tp rank 0 only, zero elsewhere, so every rank's copy still gets a gradient to sum)."""
        out = []
        for e in (self.moe.experts.get_submodule(str(j)) for j in self.local_experts):
            b2 = getattr(e.fc2, "bias", None)
            if b2 is not None and self.ctx.expert_tp and self.ctx.tp_rank:
                b2 = b2 * 0
            out.append((e.fc1.weight, getattr(e.fc1, "bias", None), e.fc2.weight, b2))
        return out

    def _moe(self, x):
        """The MoE MLP on this rank's sequence shard (under tp, sequence parallelism): each rank routes
        its own tokens, to whole experts (etp 1: their gradients, like the router's, summed over tp by
        sync_sequence_parallel_grads) or, under expert tensor parallelism, to expert shards that run
        the routed copies of the whole tp group (:func:`moe_mlp`'s ``expert_tp``)."""
        ctx = self.ctx
        return moe_mlp(self.ln2(x), self.moe.router.weight, self._expert_weights(), self.cfg.top_k, ctx.ep, ctx.stats,
                       activation=self.cfg.activation, expert_tp=(ctx.tp_group, ctx.tp_rank) if ctx.expert_tp else None)

    def _mlp(self, x):
        if self.cfg.experts:
            return self._moe(x)
        m = self.mlp
        x = self._column_parallel_input(self.ln2(x))
        bias = getattr(m.fc1, "bias", None)
        if self.cfg.activation == "swiglu" and self.ctx.recompute == "op-sac":
            # w1 (gate) and w3 (up) as two matmuls, torchtitan's order: rows (unit, gate/up)
            w = m.fc1.weight.view(-1, 2, m.fc1.weight.shape[1])
            gate, up = (F.linear(x, w[:, j], None if bias is None else bias.view(-1, 2)[:, j]) for j in (0, 1))
            y = F.silu(gate) * up
        else:
            y = mlp_activation(self._column_linear(x, m.fc1.weight, bias), self.cfg.activation)
        return _plus_bias(self._exit_parallel(F.linear(y, m.fc2.weight)), m.fc2)

    def _body(self, x):
        x = x + self._attention(x)
        return x + self._mlp(x)

    def forward(self, x):
        if self.ctx.recompute == "full":
            return checkpoint(self._body, _mark_checkpoint_input(x), use_reentrant=False)
        if self.ctx.recompute == "op-sac":
            kept = []
            out = checkpoint(self._body, _mark_checkpoint_input(x), use_reentrant=False,
                             context_fn=lambda: op_sac_context(kept))
            if kept:   # counted: release them once the block's backward has consumed the cache
                counter, nbytes = SavedActivationCounter.current, sum(kept)
                (x if x.requires_grad else out).register_hook(lambda g: counter.drop(nbytes))
            return out
        return self._body(x)


class Stage(nn.Module):
    """A contiguous run of blocks; the first stage owns the embeddings, the last the LM head.

    ``forward`` takes token ids on the first stage (else hidden states) and returns hidden
    states, or on the last stage the mean cross-entropy loss against ``targets``.
    """

    def __init__(self, cfg: GPTConfig, ctx: ParallelContext, layer_ids: list[int],
                 first: bool, last: bool):
        super().__init__()
        self.cfg, self.ctx, self.first, self.last = cfg, ctx, first, last
        self.layer_ids = list(layer_ids)
        specs = {n: (s, d, k) for n, s, d, k in param_specs(cfg)}
        def make(name):
            s, d, k = specs[name]
            p = nn.Parameter(shard(full_init(cfg, name, s, k), d, ctx.tp_rank, ctx.tp_size))
            p.sp_partial = d is None and ctx.sequence_parallel and name.startswith("ln_f")
            return p
        if first:
            self.tok_emb = make("tok_emb")
            if not cfg.rotary:
                self.pos_emb = make("pos_emb")
        self.blocks = nn.ModuleDict({str(i): Block(cfg, i, ctx) for i in layer_ids})
        if last:
            self.ln_f = make_norm(cfg)
            self.ln_f.weight = make("ln_f.weight")
            if cfg.norm == "layernorm":
                self.ln_f.bias = make("ln_f.bias")
            self.head = nn.Module()
            self.head.weight = make("head.weight")

    def forward(self, x, targets=None):
        ctx = self.ctx
        if self.first:
            s = x.shape[1]
            if ctx.tp_size > 1:
                x = comm.vocab_parallel_embedding(x, self.tok_emb, ctx.tp_rank * self.tok_emb.shape[0],
                                                  ctx.tp_group)
            else:
                x = F.embedding(x, self.tok_emb)
            if self.cfg.rotary:
                pass   # positions enter as rotations of q and k in every block
            elif ctx.cp_size > 1:   # this rank's tokens sit at their global positions
                x = x + self.pos_emb.index_select(0, ctx.cp.local_positions.to(x.device))
            else:
                x = x + self.pos_emb[:s]
            if ctx.sequence_parallel:
                x = comm.split_seq(x, ctx.tp_group)
        for i in self.layer_ids:
            x = self.blocks[str(i)](x)
        if not self.last:
            return x
        x = self.ln_f(x)
        if ctx.sequence_parallel:   # the head is vocabulary-parallel: its input grads are partial
            logits = comm.sequence_gathered_linear(x, self.head.weight, ctx.tp_group)
        else:
            logits = F.linear(comm.copy_to_tp(x, ctx.tp_group), self.head.weight)
        logits = logits.reshape(-1, logits.shape[-1]).float()
        if ctx.tp_size > 1:
            start = ctx.tp_rank * self.head.weight.shape[0]
            return comm.vocab_parallel_cross_entropy(logits, targets.reshape(-1), start, ctx.tp_group).mean()
        return F.cross_entropy(logits, targets.reshape(-1))


def build_full_model(cfg: GPTConfig, recompute: str = "none") -> Stage:
    """The single-process reference model (all layers, no parallelism)."""
    return Stage(cfg, ParallelContext(recompute=recompute), list(range(cfg.layers)), True, True)
