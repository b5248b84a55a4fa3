"""Shared primitives of the per-layer cost model (:mod:`paraplan.costmodels.compute` and its siblings).

Sizes: bytes per activation / weight element (:func:`element_bytes`: with ``dtype = fp32``, the CPU
validation runs, every activation, weight and message byte count doubles), per gradient-buffer element,
tokens (T = b·s/cp) and micro-batches per rank. GEMMs: the formats (fp8 for the linear layers under fp8,
bf16 for the rest), the price of a linear layer's GEMM and of the routed experts' grouped GEMM, and the
linear layers of one layer, with t = tp (forward): QKV (T × h → (h + 2h_kv)/t), output (T × h/t → h),
MLP up (T × h → (g·f)/t with g = 2 for SwiGLU's gate and up, else 1), MLP down (T × f/t → h).
And whether the cluster's device is a profiled CPU (:func:`device_is_host`).
"""
from __future__ import annotations

from typing import Union

import numpy as np

from paraplan.engines import engine_flag, main_grad_bytes
from paraplan.plan import compute_dtype, gemm_dtype, is_fp4, is_fp8

#: a cost of one plan, or of a batch of plans (one entry per plan)
Number = Union[float, np.ndarray]

BYTES = 2  # 16-bit activations and weights (bf16 / fp16)
#: bytes per element of a GEMM operand, by the GEMM's format (16-bit formats: 2; fp4: NVFP4's 0.5 + an
#: E4M3 scale per 16 elements, paraplan.modes.QUANTIZED_BYTES, the wider of the two fp4 formats)
GEMM_OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5 + 1 / 16, "fp32": 4.0, "tf32": 4.0}

#: Share of the linear layers' GEMM work an fp4 recipe keeps in bf16. NVIDIA's NVFP4 pretraining
#: recipe keeps "selective high-precision layers" -- about 16 % of the linear layers, mostly the
#: final blocks, in BF16 (Pretraining Large Language Models with NVFP4, arXiv:2509.25149, sec. 4,
#: 12B hybrid Mamba-Transformer); Megatron-LM sets it with --first-last-layers-bf16
#: --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16 (NVIDIA/Megatron-LM @ 307dcf3 :
#: megatron/training/arguments.py). Priced as a blend over the whole model (every stage alike), not
#: per pipeline stage. mxfp4 takes the same share (no MXFP4 training recipe says otherwise). A recipe's
#: choice, taken from the paper
FP4_BF16_LINEAR_SHARE = 0.16


def element_bytes(plan):
    """Bytes per activation / weight element: 2 for bf16 and fp16, 4 for fp32 (``plan.dtype``)."""
    return 4 if plan.dtype == "fp32" else BYTES


def megatron_grad_bytes(plan):
    """Bytes per parameter of Megatron-LM's gradient buffer (main_grad), which its data-parallel
    reduce-scatter / all-reduce also moves: 4 (fp32, its default with bf16 or fp16 training:
    accumulate_allreduce_grads_in_fp32), 2 with --grad-reduce-in-bf16 (``grad_reduce_bf16``), and the
    element size in fp32 training (``paraplan.engines.main_grad_bytes``, the megatron spec's)."""
    return main_grad_bytes(plan, element_bytes(plan))


def tokens_per_rank(job, plan):
    return plan.micro_batch * job.seq_len / np.asarray(plan.cp, dtype=float)


def micro_batches(job, plan):
    """Micro-batches per step on one data-parallel rank: global batch / (dp x micro-batch)."""
    return job.global_batch / (np.asarray(plan.dp, dtype=float) * plan.micro_batch)


def _dtype(plan) -> str:
    """The format of the non-linear-layer GEMMs (attention core, LM head, router): bf16 under fp8."""
    return compute_dtype(plan.dtype if isinstance(plan.dtype, str) else "bf16")


def _linear_dtype(plan) -> str:
    """The format of the linear layers' GEMMs (QKV, output projection, MLP, experts): fp8 under fp8."""
    return gemm_dtype(plan.dtype if isinstance(plan.dtype, str) else "bf16")


def linear_gemm_time(curves, m, n, k, plan, count=1):
    """A linear layer's GEMM: in the plan's GEMM format, slowed under fp8 by the recipe's scaling
    work inside the GEMM (``fp8_recipe_gemm_efficiency`` of the curves: per-row / per-block scales
    are applied in the GEMM's main loop or epilogue; per-tensor scales cost nothing there)."""
    t = _linear_gemm_time_in(curves, m, n, k, _linear_dtype(plan), count)
    if is_fp8(plan.dtype):
        t = t / fp8_recipe_gemm_efficiency(curves, plan.dtype)
    if is_fp4(plan.dtype):
        t = fp4_blend(t, _linear_gemm_time_in(curves, m, n, k, "bf16", count))
    return t


def _linear_gemm_time_in(curves, m, n, k, dtype, count):
    t = curves.gemm_time(m, n, k, dtype, count=count)
    if hasattr(curves, "gemm_memory_time"):     # analytical curves: the roofline's memory side
        t = np.maximum(t, count * (curves.kernel_overhead_s + curves.gemm_memory_time(m, n, k, dtype)))
    return t


def fp4_blend(t_fp4, t_bf16):
    """A linear GEMM's time under an fp4 recipe: (1 - s)·t_fp4 + s·t_bf16 with s the share of linear
    layers the recipe keeps in bf16 (:data:`FP4_BF16_LINEAR_SHARE`)."""
    return (1 - FP4_BF16_LINEAR_SHARE) * t_fp4 + FP4_BF16_LINEAR_SHARE * t_bf16


def routed_experts_gemm_time(curves, m, n, k, groups, plan, grouped: bool):
    """The routed experts' GEMMs of one GPU: ``groups`` experts of m tokens each, as one grouped GEMM
    where the engine runs one (``grouped``: token permutation, Megatron-Core / torchtitan) and the
    curves can price it, else one GEMM per expert (DeepSpeed-MoE's loop); fp8 as
    :func:`linear_gemm_time`."""
    if not grouped or not hasattr(curves, "grouped_gemm_time"):
        return linear_gemm_time(curves, m, n, k, plan, count=groups)
    t = curves.grouped_gemm_time(m, n, k, groups, _linear_dtype(plan))
    if is_fp8(plan.dtype):
        t = t / fp8_recipe_gemm_efficiency(curves, plan.dtype)
    if is_fp4(plan.dtype):
        t = fp4_blend(t, curves.grouped_gemm_time(m, n, k, groups, "bf16"))
    return t


def fp8_recipe_gemm_efficiency(curves, dtype: str) -> float:
    """Share of the per-tensor-scaled fp8 GEMM rate a recipe's GEMMs reach (1 where the curves say nothing)."""
    return float(getattr(curves, "fp8_recipe_gemm_efficiency", {}).get(dtype, 1.0))


def _tp_share(split_here: bool, t):
    """Share of a GEMM dimension one tp rank holds: 1/tp where tp splits that dimension, else all of it."""
    return 1.0 / t if split_here else 1.0


def attention_gemm_elements_per_token(model, t):
    """(input, output) elements per token of the attention's GEMMs on one tp rank
    (``model.attention_gemms``): the layer's normed input counted once however many projections read
    it; multi-head attention: h + q/tp in, (q + 2·h_kv)/tp + h out."""
    t = np.asarray(t, dtype=float)
    inputs, outputs, reads_layer_input = 0.0, 0.0, False
    for out, inp, split in model.attention_gemms:
        if inp == model.hidden and split != "row":
            reads_layer_input = True
        else:
            inputs = inputs + inp * _tp_share(split == "row", t)
        outputs = outputs + out * _tp_share(split == "column", t)
    return inputs + (model.hidden if reads_layer_input else 0.0), outputs


def separate_input_projections(model, plan):
    """(attention, MLP) linears that read the layer's normed input as separate modules: torchtitan's
    Llama keeps wq, wk, wv and w1, w3 as separate ``nn.Linear`` (torchtitan/models/llama3/model.py), so
    each of their backward GEMMs writes its own input gradient; Megatron-LM and the generic engine fuse
    them (linear_qkv, linear_fc1): 1 each. Latent attention's projections are listed one by one already
    (1); multi-head attention's fused QKV is the GEMM of ``model.attention_gemms`` that reads the layer
    input, so the 3 replaces it. The engine's ``Behaviour.separate_input_linears``."""
    titan = engine_flag(plan, "separate_input_linears")
    return (np.where(titan & (not model.mla), 3, 1), np.where(titan, model.mlp_matrices - 1, 1))


def attention_gemm_forward_times(model, job, plan, curves) -> list:
    """Forward time of each of the attention's projections for one micro-batch, in the order of
    ``model.attention_gemms`` (QKV and output, or latent attention's down-, up- and output
    projections), each GEMM T x (its output on this tp rank) x (its input on this tp rank)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    times = [linear_gemm_time(curves, T, out * _tp_share(split == "column", t), inp * _tp_share(split == "row", t), plan)
             for out, inp, split in model.attention_gemms]
    attn_sep, _ = separate_input_projections(model, plan)   # 1 for latent attention, whose GEMMs are listed apart
    if np.any(attn_sep > 1):    # the fused QKV comes first: separate wq, wk, wv where the engine keeps them apart
        apart = (linear_gemm_time(curves, T, model.q_hidden / t, model.hidden, plan)
                 + 2 * linear_gemm_time(curves, T, model.kv_hidden / t, model.hidden, plan))
        times[0] = np.where(attn_sep > 1, apart, times[0])
    return times


def attention_gemm_forward_time(model, job, plan, curves):
    """Forward time of the attention's projections for one micro-batch (:func:`attention_gemm_forward_times`)."""
    return sum(attention_gemm_forward_times(model, job, plan, curves))


def mlp_gemm_forward_times(model, job, plan, curves, width=None) -> tuple:
    """Forward times (first projection, second projection) of a tensor-parallel MLP of inner width
    ``width`` (default the dense ffn) for one micro-batch."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    f = model.ffn_hidden if width is None else width
    h, g = model.hidden, model.mlp_matrices - 1
    _, mlp_sep = separate_input_projections(model, plan)     # torchtitan's w1, w3 apart; 1 where fused
    first = mlp_sep * linear_gemm_time(curves, T, g * f / mlp_sep / t, h, plan)
    return first, linear_gemm_time(curves, T, h, f / t, plan)


def mlp_gemm_forward_time(model, job, plan, curves, width=None):
    """Forward time of a tensor-parallel MLP of inner width ``width`` (default the dense ffn)."""
    return sum(mlp_gemm_forward_times(model, job, plan, curves, width))


def device_is_host(cluster) -> bool:
    """Whether the cluster's device is a profiled CPU (``paraplan profile``): its "host memory" is its
    own, and its communication runs on the cores that compute; no CUDA runtime or allocator."""
    measured = cluster.accelerator.measured
    return measured is not None and measured.device == "cpu"
