"""Time of one transformer layer (and of the LM head) for one micro-batch on one GPU.

Every function takes the model, the job, a plan (or a batch of plans whose fields are numpy
arrays) and the efficiency curves, and returns seconds (scalars or arrays).

Per layer, with T = b·s/cp tokens on the rank, t = tp:
  GEMMs (forward): QKV (T × h → (h + 2h_kv)/t), output (T × h/t → h), MLP up (T × h → (g·f)/t
  with g = 2 for SwiGLU's gate and up, else 1), MLP down (T × f/t → h). Backward = dgrad + wgrad
  = 2 × forward (Narayanan et al. 2021 §3: backward is twice the forward).
  Attention core: fused (FlashAttention) at 4·b·(s/cp)·s·h/t FLOPs, halved by the causal mask,
  backward 2.5 × forward (FlashAttention-2 recomputes QKᵀ and runs 5 GEMMs against 2); unfused:
  batched GEMMs QKᵀ and PV plus scale-mask-softmax and dropout over the b·(a/t)·s_l·s scores
  (≈ 9 bytes per score element forward, 11 backward, in 16-bit with a 1-byte mask).
  Memory-bound kernels (forward, bytes per token): two LayerNorms 4h each, two bias-dropout-
  residual adds 7h each, the MLP activation 4f (GELU) or 6f (SwiGLU), and for unfused attention
  the q, k, v and context transposes 4(h + h_kv)·2; replicated across tp unless sequence
  parallel, f-wide and attention parts split by tp. Backward streams twice the bytes.
  With ``dtype = fp32`` (the CPU validation runs) every activation, weight and message byte count
  doubles (:func:`element_bytes`); the memory-bound byte counts are the 16-bit ones × 2.
Recomputation (Korthikanti et al. 2022): selective re-runs the attention core forward, full
re-runs the whole layer forward (and its tensor-parallel all-reduces).
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.comm import ALL_REDUCE, SEND_RECV, collective_time, ranks_per_node, ring_time

BYTES = 2  # 16-bit activations and weights (bf16 / fp16)


def element_bytes(plan):
    """Bytes per activation / weight element: 2 for bf16 and fp16, 4 for fp32 (``plan.dtype``)."""
    return 4 if plan.dtype == "fp32" else BYTES
RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = 1, 2


def tokens_per_rank(job, plan):
    return plan.micro_batch * job.seq_len / np.asarray(plan.cp, dtype=float)


def gemm_forward_time(model, job, plan, curves):
    """Forward time of one layer's weight GEMMs for one micro-batch."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    h, hkv, f, g = model.hidden, model.kv_hidden, model.ffn_hidden, model.mlp_matrices - 1
    dt = plan.dtype if isinstance(plan.dtype, str) else "bf16"
    return (curves.gemm_time(T, (h + 2 * hkv) / t, h, dt)
            + curves.gemm_time(T, h, h / t, dt)
            + curves.gemm_time(T, g * f / t, h, dt)
            + curves.gemm_time(T, h, f / t, dt))


def attention_core_times(model, job, plan, curves):
    """(forward, backward) time of the attention core (QKᵀ, softmax, PV) for one micro-batch."""
    b, s = plan.micro_batch, job.seq_len
    s_l = tokens_per_rank(job, plan) / b
    t = np.asarray(plan.tp, dtype=float)
    dt = plan.dtype if isinstance(plan.dtype, str) else "bf16"
    # fused: causal mask halves the executed work
    flops_fwd = 4.0 * b * s_l * s * model.hidden / t / 2
    fused_f = curves.flash_attention_time(flops_fwd, dt)
    fused_b = curves.flash_attention_time(2.5 * flops_fwd, dt)
    # unfused: batched GEMMs over all heads of the rank, full (masked) score matrix
    heads_rank = b * model.heads / t
    d = model.head_dim
    qk = curves.gemm_time(s_l * heads_rank, s, d, dt)
    pv = curves.gemm_time(s_l * heads_rank, d, s, dt)
    scores = heads_rank * s_l * s
    wide = element_bytes(plan) / BYTES
    unfused_f = qk + pv + curves.memory_time(9 * wide * scores, kernels=2)
    unfused_b = 2 * (qk + pv) + curves.memory_time(11 * wide * scores, kernels=2)
    flash = np.asarray(plan.flash_attention, dtype=bool)
    return np.where(flash, fused_f, unfused_f), np.where(flash, fused_b, unfused_b)


def elementwise_forward_time(model, job, plan, curves):
    """Forward time of a layer's memory-bound kernels (norms, activations, residual adds)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    h, hkv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    act = (6 if model.activation == "swiglu" else 4) * f
    replicated = 22 * h
    unfused_extra = np.where(np.asarray(plan.flash_attention, dtype=bool), 0.0, 8 * (h + hkv))
    per_token = replicated / np.where(sp, t, 1.0) + (act + unfused_extra) / t
    return curves.memory_time(T * per_token * element_bytes(plan) / BYTES, kernels=8)


def tp_allreduce_time(model, job, plan, cluster):
    """One tensor-parallel all-reduce (or reduce-scatter + all-gather with SP) of T·h activations."""
    T = tokens_per_rank(job, plan)
    k = ranks_per_node(plan.tp, 1, cluster.gpus_per_node)
    return collective_time(ALL_REDUCE, T * model.hidden * element_bytes(plan), plan.tp, k,
                           cluster.system.intra_node, cluster.inter_node)


def cp_exposed_time(model, job, plan, cluster, attn_fwd, attn_bwd):
    """Ring attention (context parallel): K/V chunks pass around the cp ring, overlapped with the
    attention core; only the excess is exposed. Forward moves K and V (cp−1) times; backward moves
    K, V and their gradients. Megatron-LM docs/user-guide/features/context_parallel.md."""
    c = np.asarray(plan.cp, dtype=float)
    T = tokens_per_rank(job, plan)
    chunk = 2 * T * model.kv_hidden / np.asarray(plan.tp, dtype=float) * element_bytes(plan)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    across_nodes = k < c
    step = np.where(across_nodes, ring_time(SEND_RECV, chunk, 2, cluster.inter_node),
                    ring_time(SEND_RECV, chunk, 2, cluster.system.intra_node))
    fwd = (c - 1) * step
    bwd = 2 * (c - 1) * step
    exposed = np.maximum(0.0, fwd - attn_fwd) + np.maximum(0.0, bwd - attn_bwd)
    return np.where(c > 1, exposed, 0.0)


def layer_times(model, job, plan, curves, cluster) -> dict:
    """Per-layer, per-micro-batch times on one GPU, by term (seconds)."""
    gemm_f = gemm_forward_time(model, job, plan, curves)
    attn_f, attn_b = attention_core_times(model, job, plan, curves)
    elem_f = elementwise_forward_time(model, job, plan, curves)
    ar = tp_allreduce_time(model, job, plan, cluster)
    fwd = gemm_f + attn_f + elem_f
    bwd = 2 * gemm_f + attn_b + 2 * elem_f
    rc = np.asarray(plan.recompute_code)
    recompute = np.where(rc == RECOMPUTE_FULL, fwd, np.where(rc == RECOMPUTE_SELECTIVE, attn_f, 0.0))
    tp_comm = ar * np.where(rc == RECOMPUTE_FULL, 6, 4)
    cp_comm = cp_exposed_time(model, job, plan, cluster, attn_f, attn_b)
    return {"forward": fwd, "backward": bwd, "recompute": recompute, "tp_comm": tp_comm, "cp_comm": cp_comm,
            "tp_allreduce": ar}


def head_times(model, job, plan, curves, cluster) -> dict:
    """LM head (logits GEMM, cross-entropy) on the last stage and the embedding on the first,
    forward + backward for one micro-batch. Vocabulary-parallel over tp (Megatron)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    dt = plan.dtype if isinstance(plan.dtype, str) else "bf16"
    V, h = model.vocab, model.hidden
    logits = curves.gemm_time(T, V / t, h, dt)
    cross_entropy = curves.memory_time(T * V / t * 4 * 3, kernels=4)      # fp32 logits, ~3 passes
    head = 3 * logits + cross_entropy
    embedding = curves.memory_time(T * h * element_bytes(plan) * 3, kernels=2)
    ar = tp_allreduce_time(model, job, plan, cluster)
    return {"head": head, "embedding": embedding, "tp_comm": 2 * ar}   # embedding fwd + head grad all-reduce


def p2p_time(model, job, plan, cluster):
    """One pipeline send/recv of a micro-batch's boundary activation b·(s/cp)·h, split over tp
    (Megatron's scatter-gather optimisation). Intra-node only when the whole pipeline fits in a node."""
    T = tokens_per_rank(job, plan)
    size = T * model.hidden * element_bytes(plan) / np.asarray(plan.tp, dtype=float)
    span = np.asarray(plan.tp) * plan.cp * plan.dp * plan.pp
    inside = span <= cluster.gpus_per_node
    return np.where(inside, ring_time(SEND_RECV, size, 2, cluster.system.intra_node),
                    ring_time(SEND_RECV, size, 2, cluster.inter_node))
