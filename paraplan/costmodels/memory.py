"""Memory per GPU (and per node under offload), in bytes.

Model states (Rajbhandari et al. 2019, ZeRO, arXiv:1910.02054 §5): mixed-precision Adam keeps
2Ψ of 16-bit parameters, 2Ψ of 16-bit gradients and KΨ = 12Ψ of fp32 master weights, momentum
and variance. Sharded over N_d = dp·cp ranks:
  stage 0: (2 + 2 + K)Ψ    stage 1: (2 + 2)Ψ + KΨ/N_d    stage 2: 2Ψ + (2 + K)Ψ/N_d
  stage 3: (2 + 2 + K)Ψ/N_d
Ψ is the stage's parameters per GPU after tensor and pipeline splits.

Activations per layer per micro-batch (Korthikanti et al. 2022, arXiv:2205.05198, Table 2):
  s·b·h·(34 + 5as/h) without parallelism, s·b·h·(10 + 24/t + 5as/(ht)) with tp t,
  s·b·h·(34/t + 5as/(ht)) with sequence parallel, selective recompute drops the 5as/h term,
  full recompute keeps 2sbh (÷t with SP). Generalized here for GQA (K and V are h_kv wide),
  SwiGLU (6f instead of 4f bytes per token for the MLP) and fused attention (the s² score term
  becomes fp32 softmax statistics, 4·a·s bytes per sample). ``dtype = fp32`` (CPU validation):
  weights and gradients 4Ψ each, K = 8 (Adam momentum and variance, no master copy) and the
  activation bytes above doubled (an approximation: masks and statistics are not 16-bit).
In-flight micro-batches on the first stage: 1F1B and ZB-H1 min(m, p); interleaved
p·(1 + (p−1)/(p·v)) (NVIDIA/Megatron-LM theoretical_memory_usage.py); GPipe m.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.compute import BYTES, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, element_bytes, tokens_per_rank

OPTIMIZER_BYTES_PER_PARAM = 12   # fp32 master weights, momentum, variance (K in the ZeRO paper)
FP32_OPTIMIZER_BYTES_PER_PARAM = 8   # plain fp32 Adam: momentum and variance, no master copy


def optimizer_bytes_per_param(plan):
    """K: 12 with 16-bit training (fp32 master weights, momentum, variance), 8 in plain fp32."""
    return FP32_OPTIMIZER_BYTES_PER_PARAM if plan.dtype == "fp32" else OPTIMIZER_BYTES_PER_PARAM
SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_GPIPE, SCHEDULE_ZB_H1 = 0, 1, 2, 3
OFFLOAD_NONE, OFFLOAD_CPU, OFFLOAD_NVME = 0, 1, 2


def stage_params(model, plan):
    """(first-stage, last-stage) parameters per GPU: layers / pp, split by tp; the embedding sits on
    the first stage, the LM head (a copy of a tied embedding when pp > 1) on the last."""
    t = np.asarray(plan.tp, dtype=float)
    p = np.asarray(plan.pp, dtype=float)
    layers = model.layers / p * model.params_per_layer / t
    emb = model.embedding_params / t
    head = model.lm_head_params / t
    tied_copy = np.where(model.tied_embeddings & (p > 1), model.vocab * model.hidden / t, 0.0)
    first = np.where(p > 1, layers + emb, layers + emb + head)
    last = np.where(p > 1, layers + head + tied_copy, first)
    return first, last


def model_state_bytes(params, plan) -> dict:
    """Parameters, gradients and optimizer states on one GPU for Ψ = ``params`` (ZeRO table above);
    offload moves optimizer states and fp32 gradients off the GPU, parameter offload moves the
    16-bit parameters too."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp
    z = np.asarray(plan.zero)
    off = np.asarray(plan.offload_code) != OFFLOAD_NONE
    off_params = np.asarray(plan.offload_params, dtype=bool)
    eb, k = element_bytes(plan), optimizer_bytes_per_param(plan)
    weights = np.where(z >= 3, eb * params / n, eb * params)
    grads = np.where(z >= 2, eb * params / n, eb * params)
    optim = np.where(z >= 1, k * params / n, k * params)
    return {"parameters": np.where(off_params, 0.0, weights),
            "gradients": np.where(off, 0.0, grads),
            "optimizer_states": np.where(off, 0.0, optim)}


def activation_bytes_per_layer(model, job, plan, recompute_code=None):
    """Bytes one layer keeps for backward for one micro-batch (generalized Korthikanti Table 2)."""
    rc = np.asarray(plan.recompute_code if recompute_code is None else recompute_code)
    b = plan.micro_batch
    T = tokens_per_rank(job, plan)                 # b · s / cp
    s = job.seq_len
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    h, hkv, f, a = model.hidden, model.kv_hidden, model.ffn_hidden, model.heads
    unsharded = 10 * h * T / np.where(sp, t, 1.0)                 # norms, block inputs, dropout masks
    mlp = (6 if model.activation == "swiglu" else 4) * f
    sharded = (4 * h + 4 * hkv + mlp) * T / t                      # Q, K, V, out-proj input, MLP
    s_l = T / b
    scores = np.where(np.asarray(plan.flash_attention, dtype=bool), 4.0 * a * s_l * b,   # fp32 stats
                      5.0 * a * s_l * s * b) / t
    wide = element_bytes(plan) / BYTES         # fp32 activations: twice the 16-bit bytes
    none = wide * (unsharded + sharded + scores)
    selective = wide * (unsharded + sharded)
    full = element_bytes(plan) * h * T / np.where(sp, t, 1.0)
    return np.where(rc == RECOMPUTE_FULL, full, np.where(rc == RECOMPUTE_SELECTIVE, selective, none))


def micro_batches(job, plan):
    return job.global_batch / (np.asarray(plan.dp, dtype=float) * plan.micro_batch)


def in_flight_micro_batches(job, plan):
    """Micro-batches whose activations the first stage holds at its peak."""
    m = micro_batches(job, plan)
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    one_f_one_b = np.minimum(m, p)
    interleaved = p * (1 + (p - 1) / (p * v))
    return np.where(p == 1, 1.0, np.where(sc == SCHEDULE_GPIPE, m,
                                          np.where(sc == SCHEDULE_INTERLEAVED, interleaved, one_f_one_b)))


def activation_bytes(model, job, plan) -> dict:
    """Peak activation bytes on the first and on the last stage."""
    p = np.asarray(plan.pp, dtype=float)
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    per_layer = activation_bytes_per_layer(model, job, plan)
    layers = model.layers / p
    # full recompute rematerializes one layer at a time during backward
    working = np.where(np.asarray(plan.recompute_code) == RECOMPUTE_FULL,
                       activation_bytes_per_layer(model, job, plan, recompute_code=0), 0.0)
    embedding_out = (element_bytes(plan) + 1) * T * model.hidden / np.where(sp, t, 1.0)  # output + dropout mask
    logits = 4.0 * T * model.vocab / t + element_bytes(plan) * T * model.hidden  # fp32 logits for the loss
    inflight = in_flight_micro_batches(job, plan)
    first = layers * per_layer * inflight + embedding_out * inflight + working
    last = layers * per_layer + logits + working
    first = np.where(p == 1, first + logits, first)
    return {"first": first, "last": np.where(p == 1, first, last)}


def buffer_bytes(model, plan, runtime_reserved_bytes):
    """Runtime reserve (CUDA context, NCCL and cuBLAS workspaces) plus ZeRO-3's gathered layers
    (the current and the prefetched one) and parameter-offload staging."""
    t = np.asarray(plan.tp, dtype=float)
    gathered = 2 * element_bytes(plan) * model.params_per_layer / t
    z3 = np.asarray(plan.zero) >= 3
    return runtime_reserved_bytes + np.where(z3, gathered, 0.0)


def offloaded_bytes_per_gpu(params, plan) -> dict:
    """Host-memory and NVMe bytes each GPU's shard uses under offload (ZeRO-Offload keeps fp32
    master weights, momentum, variance and fp32 gradients on the host: 16Ψ/N_d; with NVMe the 12Ψ/N_d
    optimizer states go to the drives; offloaded parameters add 2Ψ/N_d)."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp
    shard = params / n
    oc = np.asarray(plan.offload_code)
    off_params = np.asarray(plan.offload_params, dtype=bool)
    optim = OPTIMIZER_BYTES_PER_PARAM * shard
    grads32 = 4 * shard
    p16 = np.where(off_params, BYTES * shard, 0.0)
    host = np.where(oc == OFFLOAD_CPU, optim + grads32 + p16, np.where(oc == OFFLOAD_NVME, grads32, 0.0))
    nvme = np.where(oc == OFFLOAD_NVME, optim + p16, 0.0)
    return {"host": host, "nvme": nvme}
