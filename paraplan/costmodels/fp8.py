"""fp8 training's own costs in one layer for one micro-batch on one GPU: the quantization kernels
(:func:`fp8_cast_times`), the row-wise recipe's backward GEMMs and rescale kernels
(:func:`fp8_backward_gemm_factor`, :func:`fp8_rowwise_rescale_time`), and where the sequence-parallel
all-gathers carry fp8 (:func:`tp_gathers_fp8`). The fp8 GEMMs themselves are priced by
:func:`paraplan.costmodels.kernels.linear_gemm_time`.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.kernels import (attention_gemm_elements_per_token, fp8_recipe_gemm_efficiency, micro_batches,
                                         separate_input_projections, tokens_per_rank)
from paraplan.engines import engine_flag, engine_where
from paraplan.plan import is_fp4, is_fp8, quantized_bytes


# Bytes moved per element quantized to fp8, by recipe (read 16-bit = 2, write fp8 = 1):
#   fp8 (current per-tensor): amax pass 2, cast 2 + 1, transposed fp8 copy for the backward's
#     TN-only fp8 GEMMs 1                                                                    = 6
#   fp8-delayed: scale from the amax history, amax taken in the fused cast-transpose pass    = 4
#   fp8-rowwise / fp8-blockwise: row(block)-wise and column(block)-wise quantizations, each
#     reading the 16-bit tensor (scales computed in the pass)                                = 6
#   mxfp8: both block directions written in one pass (Blackwell)                             = 4
# (Transformer Engine's cast/cast-transpose kernels, torchao float8; no measured figure is published
# for them, so these are byte counts, priced at the curves' memory-bound rate.)
#   nvfp4: a per-tensor amax pass for the fp32 global scale 2, the row-wise 1x16 cast 2 + 0.5625, and
#     the column-wise cast for the wgrad GEMM behind its 16-point random Hadamard transform, which
#     re-reads the 16-bit tensor 2 + 0.5625 (Transformer Engine NVFP4BlockScaling: RHT "only for
#     wgrad GEMM"; docs features/low_precision_training/nvfp4)                               = 7.125
#   mxfp4: both block directions written in one pass, as mxfp8, at 0.53125 bytes each     = 3.0625
FP8_CAST_BYTES_PER_ELEMENT = {"fp8": 6, "fp8-delayed": 4, "fp8-rowwise": 6, "fp8-blockwise": 6, "mxfp8": 4,
                              "nvfp4": 2 + 2 * (2 + 0.5 + 1 / 16), "mxfp4": 2 + 2 * (0.5 + 1 / 32)}
FP8_CAST_KERNELS_FORWARD = 8     # 4 GEMM inputs + 4 weights, one launch each (amax and cast fused)
FP8_CAST_KERNELS_BACKWARD = 4    # 4 output gradients


def fp8_cast_elements(model, job, plan):
    """(forward, backward) elements one layer quantizes to fp8 per micro-batch on one GPU.

    Forward: the inputs of the four linear GEMMs (QKV and MLP-up read the full T x h input on every
    tp rank, the output projection T x h/tp, MLP-down T x f/tp) and the layer's weights (/tp).
    Weights: Transformer Engine (Megatron-LM, generic) quantizes them on the first micro-batch of a
    step and reuses the copy (``is_first_microbatch``), so a micro-batch pays 1/m of them — counted
    here per micro-batch as weights / m with m the micro-batches per step; torchtitan (torchao
    float8) recasts them in every forward. Backward: the output gradients of the four GEMMs, the
    dgrad GEMMs' fp8 operands (T x (h + 2h_kv)/tp, T x h, T x g·f/tp, T x h)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    h, f, g = model.hidden, model.ffn_hidden, model.mlp_matrices - 1
    m = micro_batches(job, plan)
    cached = engine_flag(plan, "caches_fp8_weights")
    weights = model.params_per_layer / t / np.where(cached, np.maximum(m, 1.0), 1.0)
    attn_in, attn_grad = attention_gemm_elements_per_token(model, t)
    # where the sequence-parallel gathers carry fp8 (tp_gathers_fp8: torchtitan's float8 tensor parallelism,
    # Transformer Engine) the two gathered tensors of each pass are cast on their sequence shard, before the
    # all-gather: T·h/tp instead of T·h, twice
    on_shard = np.where(tp_gathers_fp8(plan), 2 * h * (1 - 1 / t), 0.0)
    fwd = T * (attn_in + h + f / t - on_shard) + weights
    bwd = T * (attn_grad + g * f / t + h - on_shard)
    return fwd, bwd


# Bytes of an fp8 element against the 16-bit tensors a collective otherwise carries (torchtitan's fp8
# all-gathers: tensor-parallel activations here, FSDP weights in dataparallel.fp8_all_gather_factor).
FP8_GATHER_BYTES_RATIO = 0.5


def tp_gathers_fp8(plan):
    """True where a layer's sequence-parallel all-gathers carry fp8, the gathered tensors cast on
    their sequence shard first: the inputs of the attention and MLP blocks forward, the output
    gradients of the row-parallel projections backward (and their re-gather for the weight
    gradients). The reduce-scatters stay 16-bit. Where:

    - torchtitan with the float8 converter's per-tensor ("tensorwise") recipe: torchao's
      Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput (torchtitan
      parallelize.py: ``enable_float8_tensorwise_tp = enable_float8_linear and not
      float8_is_rowwise``; "for rowwise recipes, we use regular TP and all-gather happens in high
      precision").
    - Megatron-LM and the generic engine (Transformer Engine) in fp8 or fp8-delayed: TE's
      LayerNormLinear quantizes the norm's output on the shard (inside the norm kernel where the
      recipe allows) and calls ``gather_along_first_dim(ln_out, tp_group, quantizer=...)``, and its
      backward ``grad_output_preprocess`` gathers the quantized output gradient the same way ("FP8
      with all-gather: unfused bgrad, fused cast + transpose"; NVIDIA/TransformerEngine
      transformer_engine/pytorch/module/layernorm_linear.py, base.py), the userbuffers overlap path
      alike. NVFP4 too: its sequence-parallel input and gradient are quantized after an amax reduction and
      gathered in NVFP4 (Transformer Engine docs, features/low_precision_training/nvfp4, "Distributed
      training"; 0.5625 bytes per element, tpcomm.tp_gathered_bytes). MXFP8 and block-scaled fp8 formats
      are left at 16 bit here (not read).

    Only the layers' linear inputs: the LM head runs in 16 bit, and an MoE dispatcher gathers its
    routed tokens before any quantization (:func:`tp_allreduce_time`'s ``fp8_gathers``). The fp8 dtypes
    each engine gathers so are its ``Behaviour.fp8_tp_gather_dtypes`` (Transformer Engine: fp8 and
    fp8-delayed, its Float8Quantizer / Float8CurrentScalingQuantizer; MXFP8 and block-scaled gathers are
    not modelled: 16 bit)."""
    gathers = engine_where(plan, lambda spec: plan.dtype in spec.behaviour.fp8_tp_gather_dtypes)
    return gathers & np.asarray(plan.sp, dtype=bool) & (np.asarray(plan.tp) > 1)


def fp8_cast_times(model, job, plan, curves):
    """(forward, backward) seconds of one layer's fp8 quantization kernels (0 outside fp8):
    elements x FP8_CAST_BYTES_PER_ELEMENT of the recipe, streamed at the curves' ``fp8_cast_time`` (plain
    read-scale-write kernels whose bytes are counted exactly, unlike the fused norm/activation byte
    counts that ``memory_time``'s calibrated efficiency stands for)."""
    if not is_fp8(plan.dtype):
        return 0.0, 0.0
    per = FP8_CAST_BYTES_PER_ELEMENT[plan.dtype]
    fwd, bwd = fp8_cast_elements(model, job, plan)
    cast = getattr(curves, "fp8_cast_time", curves.streaming_time)
    return (cast(per * fwd, kernels=FP8_CAST_KERNELS_FORWARD), cast(per * bwd, kernels=FP8_CAST_KERNELS_BACKWARD))


# torchao's float8 linear (torchtitan's converter; paraplan's fp8-rowwise is its "rowwise" recipe) runs the
# two backward GEMMs without fast accumulation (Float8LinearConfig: gemm_config_grad_input and
# gemm_config_grad_weight default to use_fast_accum=False). With row-wise scales on both operands its
# addmm_float8_unwrapped then calls the per-tensor cuBLAS kernel with unit scales and multiplies the output
# by the row and column scales afterwards ("the rowwise CUTLASS-based kernel is so slow without fast-accum
# that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling manually afterwards");
# pytorch/ao#2184: under torch.compile that is "at least one extra triton kernel *per GEMM*" for the
# rescaling. So the backward GEMMs run at the per-tensor rate and each of their 16-bit outputs is read and
# written once more.
ROWWISE_RESCALE_BYTES_PER_ELEMENT = 2 + 2


def fp8_backward_gemm_factor(curves, dtype: str) -> float:
    """Backward GEMM time over twice the forward's: the row-wise recipe's forward runs the row-scaled
    GEMM (``fp8_recipe_gemm_efficiency``), its backward the per-tensor one (see
    ROWWISE_RESCALE_BYTES_PER_ELEMENT), so the forward's slowdown is undone; 1 for every other format."""
    return fp8_recipe_gemm_efficiency(curves, dtype) if dtype == "fp8-rowwise" else 1.0


def fp8_rowwise_rescale_time(model, job, plan, curves):
    """Backward seconds of one layer's row-wise rescale kernels (0 outside fp8-rowwise): every linear's
    input-gradient GEMM output (T x its input width on this tp rank; one per separate projection,
    :func:`separate_input_projections`) and weight-gradient output (the layer's weights / tp), each read
    and written once more at 16 bits, one kernel per backward GEMM, at the streaming rate."""
    if plan.dtype != "fp8-rowwise":
        return 0.0
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    h, f = model.hidden, model.ffn_hidden
    attn_sep, mlp_sep = separate_input_projections(model, plan)
    attn_in, _ = attention_gemm_elements_per_token(model, t)    # counts the layer input h once
    dgrad = T * (attn_in + (attn_sep - 1) * h + mlp_sep * h + f / t)
    wgrad = model.params_per_layer / t
    linears = len(model.attention_gemms) + (attn_sep - 1) + mlp_sep + 1
    return curves.streaming_time(ROWWISE_RESCALE_BYTES_PER_ELEMENT * (dgrad + wgrad), kernels=2 * linears)


FP8_ASSUMPTIONS = (
    "fp8: the linear layers' GEMMs (QKV, output projection, MLP, experts) run in fp8 at the fp8 peak x its MAMF "
    "plateau x the recipe's GEMM efficiency; attention, embeddings, LM head, norms and the optimizer stay in bf16/fp32",
    "fp8: every micro-batch quantizes the four GEMM inputs, the layer's weights and, backward, the output gradients "
    "(bytes per element by recipe: fp8.FP8_CAST_BYTES_PER_ELEMENT)",
    "fp8: Megatron/generic (Transformer Engine) save the linear layers' inputs as their 1-byte fp8 casts (the "
    "output projection's besides FlashAttention's 16-bit output); torchtitan (torchao) saves them in 16 bit; "
    "Megatron/generic keep an fp8 copy and transpose of the stage's weights (2 bytes/param), torchtitan casts on "
    "the fly (the gathered layer's copy only)",
)
FP8_ROWWISE_BACKWARD = ("fp8-rowwise (torchao): the forward GEMMs run row-scaled; the two backward GEMMs run the "
                        "per-tensor cuBLAS kernel without fast accumulation and a separate kernel rescales each output "
                        "(read and written once more at 16 bits; torchtitan's wq, wk, wv and w1, w3 each write their own "
                        "input gradient): fp8.fp8_rowwise_rescale_time")
FP8_TP_GATHER = ("fp8: sequence parallelism casts the attention and MLP inputs (and, backward, the row-parallel "
                 "output gradients) on their sequence shard and all-gathers them in fp8 (torchtitan's float8 tensorwise "
                 "TP; Transformer Engine's LayerNormLinear and grad-output gathers); the reduce-scatters, the LM head's "
                 "and an MoE dispatcher's gathers stay 16-bit (fp8.tp_gathers_fp8)")


FP4_ASSUMPTIONS = (
    "fp4 ({dtype}): the linear layers' fprop, dgrad and wgrad GEMMs run in 4-bit E2M1 at the part's dense fp4 peak "
    "x its fp8 MAMF plateau (no fp4 MAMF is published), block scales consumed by the tensor cores; "
    "16 % of the linear GEMM work stays in bf16 (the NVFP4 recipe's high-precision layers, arXiv:2509.25149; "
    "kernels.FP4_BF16_LINEAR_SHARE), blended over all stages; attention, embeddings, LM head, norms and the "
    "optimizer stay in bf16/fp32",
    "fp4 ({dtype}): every micro-batch quantizes the GEMM inputs, weights and output gradients at {cast:g} bytes per "
    "element ({detail}); quantized copies and saved inputs at {qb:g} bytes per element (4-bit values and their block "
    "scales); {gathers}",
)
FP4_CAST_DETAIL = {"nvfp4": "amax pass for the fp32 tensor scale, row-wise 1x16 cast, column-wise cast behind the "
                            "wgrad GEMM's random Hadamard transform", "mxfp4": "one pass writing both block directions"}


def fp8_assumptions(plan, **_) -> tuple[str, ...]:
    """What an fp8 plan's GEMMs, casts and saved tensors rest on (FP8_ASSUMPTIONS; an fp4 plan's:
    FP4_ASSUMPTIONS), the row-wise recipe's backward (:func:`fp8_rowwise_rescale_time`) and fp8
    sequence-parallel gathers (:func:`tp_gathers_fp8`)."""
    if is_fp4(plan.dtype):
        gathers = ("sequence-parallel all-gathers carry the quantized inputs and output gradients (Transformer Engine's "
                   "NVFP4 gathers after an amax reduction; fp8.tp_gathers_fp8)" if bool(np.all(tp_gathers_fp8(plan)))
                   else "sequence-parallel all-gathers in 16 bit")
        return tuple(a.format(dtype=plan.dtype, cast=FP8_CAST_BYTES_PER_ELEMENT[plan.dtype], qb=quantized_bytes(plan.dtype),
                              detail=FP4_CAST_DETAIL[plan.dtype], gathers=gathers) for a in FP4_ASSUMPTIONS)
    rowwise = (FP8_ROWWISE_BACKWARD,) if plan.dtype == "fp8-rowwise" else ()
    fp8_tp = (FP8_TP_GATHER,) if bool(np.all(tp_gathers_fp8(plan))) else ()
    return (FP8_ASSUMPTIONS if is_fp8(plan.dtype) else ()) + rowwise + fp8_tp
