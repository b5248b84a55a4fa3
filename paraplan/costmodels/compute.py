"""Time of one transformer layer (and of the LM head) for one micro-batch on one GPU.

Every function takes the model, the job, a plan (or a batch of plans whose fields are numpy
arrays) and the efficiency curves, and returns seconds (scalars or arrays).

:func:`layer_times` assembles a layer from the parts priced here and in the sibling modules:
:mod:`~paraplan.costmodels.kernels` (element sizes, tokens per rank, the linear layers' GEMMs),
:mod:`~paraplan.costmodels.attention` (the attention core), :mod:`~paraplan.costmodels.fp8` (fp8 casts and
rescales), :mod:`~paraplan.costmodels.moe` (an MoE layer's experts, dispatch and all-to-alls),
:mod:`~paraplan.costmodels.tpcomm` and :mod:`~paraplan.costmodels.cpcomm` (tensor- and context-parallel
communication); the pipeline's transfers are :mod:`~paraplan.costmodels.p2p`'s.

Per layer, with T = b·s/cp tokens on the rank, t = tp:
  GEMMs: backward = dgrad + wgrad = 2 × forward (Narayanan et al. 2021 §3: backward is twice the forward).
  Memory-bound kernels (forward, bytes per token): two LayerNorms 4h each, two bias-dropout-
  residual adds 7h each, the MLP activation 4f (GELU) or 6f (SwiGLU), and for unfused attention
  the q, k, v and context transposes 4(h + h_kv)·2, and a QK-norm model's RMSNorms of its
  queries and keys 4(q + k) (:func:`qk_norm_bytes_and_kernels`); replicated across tp unless sequence
  parallel, f-wide and attention parts split by tp. Backward streams twice the bytes.
  With ``dtype = fp32`` (the CPU validation runs) every activation, weight and message byte count
  doubles (:func:`~paraplan.costmodels.kernels.element_bytes`); the memory-bound byte counts are the
  16-bit ones × 2.
Recomputation (Korthikanti et al. 2022): selective re-runs the attention core forward, full
re-runs the whole layer forward (and its tensor-parallel all-reduces); torchtitan's op-level SAC
re-runs every other matmul and, under sequence parallelism, the two all-gathers of the layer's block
inputs (:func:`~paraplan.costmodels.tpcomm.op_sac_regather_time`); each recomputed region (the whole
layer under full and op-level SAC, the attention core under selective) also pays the curves' ``recompute_overhead_time``
for its forward kernels, op-level SAC its ``op_sac_overhead_time`` (its dispatch mode's Python per op)
(0 on the analytical GPU curves; measured on a profiled CPU, where checkpointing's bookkeeping costs
several times an op's own time). Forward kernels counted as the terms above charge them: a layer runs 4
projection GEMMs, its attention core (unfused 4: QKᵀ, PV and two memory-bound kernels; fused 1)
and 8 memory-bound kernels (12 in an MoE layer).
A step's model and hardware FLOPs (MFU, HFU) are :func:`step_flops`'s, by FLOP_CONVENTION.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.attention import attention_core_times, ring_attention_merge_times, softmax_bytes_per_score
from paraplan.costmodels.comm import ALL_GATHER
from paraplan.costmodels.cpcomm import cp_exposed_time, ring_exchange_times, ring_hidden_on_network
from paraplan.costmodels.fp8 import (FP8_CAST_BYTES_PER_ELEMENT, fp8_backward_gemm_factor, fp8_cast_times,
                                    fp8_rowwise_rescale_time)
from paraplan.costmodels.mamba import (GATED_NORM_BYTES_PER_CHANNEL, mamba_cp_alltoall_time, mamba_gemm_forward_times,
                                       ssd_scan_times)
from paraplan.costmodels.kernels import (BYTES, _dtype, attention_gemm_forward_times, element_bytes, linear_gemm_time,
                                         micro_batches, mlp_gemm_forward_time, mlp_gemm_forward_times,
                                         separate_input_projections, tokens_per_rank)
from paraplan.costmodels.moe import (MOE_HOST_SECONDS_PER_LAYER, dispatch_bytes_per_token, ep_alltoall_time,
                                     ep_exposed_time, expert_token_factor, moe_einsum_dispatch_times,
                                     moe_expert_bias_times, moe_host_floor_applies, moe_mlp_forward_time,
                                     moe_tp_routed_and_shared_copies, routed_experts_forward_times,
                                     routed_experts_wgrad_accumulation_time)
from paraplan.costmodels.tpcomm import (TP_OVERLAP_CONTENTION, op_sac_regather_time, sp_backward_regather_raw_time,
                                        sp_backward_regather_time, tp_allreduce_time, tp_collective_time,
                                        tp_wrapper_host_time,
                                        tp_data_parallel_window_times, tp_gathered_bytes, tp_shares_data_parallel_links,
                                        tp_layer_exposed_by_pass, vocab_parallel_loss_allreduce_time)
from paraplan.engines import engine_flag
from paraplan.plan import Recompute, is_fp8, recomputes_attention_core, recomputes_module


#: bytes of an activation gradient element (16-bit, also under fp8: the GEMMs write bf16)
GRADIENT_BYTES = 2


def separate_input_gradient_sum_time(model, job, plan, curves):
    """Backward seconds per layer and micro-batch of summing the input gradients of projections that
    read one tensor as separate modules (:func:`separate_input_projections`: torchtitan's wq, wk, wv
    and w1, w3), as a compiled torchtitan block runs it. Each module's input-gradient GEMM writes its
    own T x h partial gradient and autograd adds the k of them up. Under tensor parallelism the sum is
    materialized before the reduce-scatter: one fused kernel reading k and writing one, (k + 1)·T·h
    16-bit elements. Without it, inductor fuses the sum into the norm's backward, which then reads k
    gradients instead of one: (k - 1)·T·h more. At the streaming rate; the MLP's share counts on dense
    layers only (an MoE layer's input feeds its router and experts instead); 0 where the engine fuses
    the projections (Megatron-LM's linear_qkv and linear_fc1)."""
    attn_sep, mlp_sep = separate_input_projections(model, plan)
    T = tokens_per_rank(job, plan)
    dense = 1.0 - model.moe_layers / model.layers
    materialized = np.asarray(plan.tp) > 1

    def passes(k):
        return np.where(k > 1, np.where(materialized, k + 1, k - 1), 0)
    kernels = np.where(materialized, (attn_sep > 1) + dense * (mlp_sep > 1), 0)
    elements = (passes(attn_sep) + dense * passes(mlp_sep)) * T * model.hidden
    return curves.streaming_time(elements * GRADIENT_BYTES, kernels=kernels)     # 0 bytes, 0 kernels where fused


TORCHTITAN_COMPILED_BLOCKS = ("torchtitan: every transformer block compiled (torch.compile; the export sets "
                              "training.compile), its wq, wk, wv and w1, w3 separate linears priced as separate "
                              "GEMMs, each no faster than moving its operands once (thin key / value projections "
                              "under tp are memory-bound), and their input gradients summed in the backward "
                              "(compute.separate_input_gradient_sum_time)")


def compiled_blocks_assumption(plan, **_) -> tuple[str, ...]:
    """Said for an engine that compiles every block (``Behaviour.compiled_blocks``: torchtitan), whose
    separate projections :func:`separate_input_gradient_sum_time` prices."""
    return (TORCHTITAN_COMPILED_BLOCKS,) if engine_flag(plan, "compiled_blocks") else ()


def mla_up_projection_forward_time(model, job, plan, curves):
    """Forward time of latent attention's up-projections (the column-parallel GEMMs that read a
    latent: q_lora -> Q, kv_lora -> K | V) and the rotary embedding applied after them; 0 for
    multi-head attention. What Megatron-Core's ``mla_up_proj`` recompute module runs again."""
    if not model.mla:
        return 0.0
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    up = sum(linear_gemm_time(curves, T, out / t, inp, plan) for out, inp, _ in model.mla_up_projection_gemms)
    eager = rope_runs_eager(plan)
    return up + curves.memory_time(T * rope_bytes_per_token(model, eager) / t * element_bytes(plan) / BYTES,
                                   kernels=np.where(eager, EAGER_ROPE_KERNELS, FUSED_ROPE_KERNELS))


def recompute_modules_time(model, job, plan, curves):
    """Per-layer, per-micro-batch seconds that Megatron-Core's fine-grained recomputation
    (``plan.recompute_modules``) adds in backward, averaged over dense and MoE layers like
    :func:`layer_times` (the attention core, ``core_attn``, is priced there):

    * layernorm: both norms' forward again (read and write 2h bytes each per token, ÷ t under SP);
    * mla_up_proj: the up-projection GEMMs and the rotary embedding (:func:`mla_up_projection_forward_time`);
    * moe_act: the routed experts' activation function over their token copies (its HBM traffic);
    * mlp: a dense MLP's forward (GEMMs and activation);
    * moe: an MoE layer's forward (router, experts, activation, permutation, the experts' eager output biases; the all-to-alls it runs
      again are counted with the expert-parallel communication); it covers moe_act and shared_experts;
    * shared_experts: the shared experts' forward.
    The fp8 casts of recomputed linear inputs are not counted again."""
    mods = np.asarray(getattr(plan, "recompute_modules_mask", 0))
    if not np.any(mods):
        return 0.0
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    wide = element_bytes(plan) / BYTES
    h = model.hidden
    per_width = 6 if model.activation == "swiglu" else 4
    share = model.moe_layers / model.layers if model.moe is not None else 0.0
    norms = curves.memory_time(T * 2 * 4 * h / np.where(sp, t, 1.0) * wide, kernels=2)
    up = mla_up_projection_forward_time(model, job, plan, curves)
    dense = (1 - share) * (mlp_gemm_forward_time(model, job, plan, curves)
                           + curves.memory_time(T * per_width * model.ffn_hidden / t * wide, kernels=1))
    moe = act = shared = 0.0
    if model.moe is not None:
        moe, act, shared = (share * x for x in moe_module_recompute_times(model, job, plan, curves))
    in_moe = np.where(recomputes_module(plan, "moe"), moe,
                      np.where(recomputes_module(plan, "moe_act"), act, 0.0) + np.where(recomputes_module(plan, "shared_experts"), shared, 0.0))
    return (np.where(recomputes_module(plan, "layernorm"), norms, 0.0) + np.where(recomputes_module(plan, "mla_up_proj"), up, 0.0)
            + np.where(recomputes_module(plan, "mlp"), dense, 0.0) + in_moe)


def moe_module_recompute_times(model, job, plan, curves) -> tuple:
    """(moe, moe_act, shared_experts): the seconds one MoE layer's forward pieces take when Megatron-Core's
    recompute module of that name runs them again in backward (:func:`recompute_modules_time`): the whole
    MoE MLP (router, experts, their activation and the permutation's bytes, the eager expert biases), the
    routed experts' activation over their token copies, the shared experts' forward."""
    e = model.moe
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    wide = element_bytes(plan) / BYTES
    per_width = 6 if model.activation == "swiglu" else 4
    routed = e.top_k * expert_token_factor(model, job, plan)
    moe = (moe_mlp_forward_time(model, job, plan, curves)
           + curves.memory_time(T * mlp_activation_bytes_per_token(model, job, True, plan) / t * wide, kernels=4)
           + moe_expert_bias_times(model, job, plan, curves)[0])
    act = curves.memory_time(T * per_width * e.expert_ffn_hidden * routed / t * wide, kernels=1)
    shared = 0.0
    if e.shared_experts:
        width = e.shared_experts * e.expert_ffn_hidden
        shared = (mlp_gemm_forward_time(model, job, plan, curves, width=width)
                  + curves.memory_time(T * per_width * width / t * wide, kernels=1))
    return moe, act, shared


def recompute_modules_flops_per_token(model, plan):
    """Model FLOPs per token (all layers) of the GEMMs fine-grained recomputation runs again: dense
    MLPs (mlp), MoE layers' router, LatentMoE projections and routed + shared experts (moe; shared_experts alone), latent
    attention's up-projections (mla_up_proj); 2 FLOPs per multiply-add. Norms and activations are
    memory-bound and count none. A hybrid pattern: its E layers' moe and shared_experts only (the
    modules :func:`hybrid_kind_times` prices)."""
    mods = np.asarray(getattr(plan, "recompute_modules_mask", 0))
    if not np.any(mods):
        return 0.0
    hybrid = bool(getattr(model, "layer_pattern", ""))   # a hybrid's E layers only (hybrid_kind_times)
    h, g = model.hidden, model.mlp_matrices
    L = model.layers
    moe_layers = model.moe_layers if model.moe is not None else 0
    dense = 0.0 if hybrid else 2 * g * h * model.ffn_hidden * (L - moe_layers)
    up = 2 * L * sum(out * inp for out, inp, _ in model.mla_up_projection_gemms)
    moe = shared = 0.0
    if model.moe is not None:
        e = model.moe
        shared = 2 * g * h * e.expert_ffn_hidden * e.shared_experts * moe_layers
        moe = 2 * model.moe_weights_per_token * moe_layers    # router, latent projections, routed and shared
    return (np.where(recomputes_module(plan, "mlp"), dense, 0.0) + np.where(recomputes_module(plan, "mla_up_proj"), up, 0.0)
            + np.where(recomputes_module(plan, "moe"), moe, np.where(recomputes_module(plan, "shared_experts"), shared, 0.0)))


def mlp_activation_bytes_per_token(model, job, moe: bool, plan) -> float:
    """Bytes the MLP's activation function streams per token (GELU 4f, SwiGLU 6f); an MoE layer's
    routed experts see top_k x factor tokens, its shared experts all, and the token permutation to and
    from the experts streams :func:`dispatch_bytes_per_token`."""
    per_width = 6 if model.activation == "swiglu" else 4
    if not moe:
        return per_width * model.ffn_hidden
    e = model.moe
    routed = e.top_k * expert_token_factor(model, job, plan)
    return per_width * e.expert_ffn_hidden * (routed + e.shared_experts) + dispatch_bytes_per_token(model, job, plan)


# Eager RMSNorm, per norm and token (16-bit input, fp32 math; bytes read + written): upcast 2h + 4h,
# pow 4h + 4h, mean 4h, rsqrt-mul 4h + 4h, downcast 4h + 2h, weight-mul 2h + 2h = 40h, against 4h for
# one fused kernel (read x, write y): 36h more per norm, and 5 kernels instead of 1; two norms per layer.
FUSED_NORM_BYTES_PER_ELEMENT = 4
UNFUSED_NORM_EXTRA_BYTES_PER_ELEMENT = 36
UNFUSED_NORM_EXTRA_KERNELS_EACH = 4
UNFUSED_NORM_EXTRA_BYTES_PER_HIDDEN = 2 * UNFUSED_NORM_EXTRA_BYTES_PER_ELEMENT
UNFUSED_NORM_EXTRA_KERNELS = 2 * UNFUSED_NORM_EXTRA_KERNELS_EACH
# Eager SwiGLU: silu reads gate, writes silu(gate) (2f + 2f); mul reads it and up, writes the product
# (4f + 2f): 10f against 6f for one fused kernel (read gate | up, write the product), one kernel more.
UNFUSED_SWIGLU_EXTRA_BYTES_PER_FFN = 4


# Rotary embeddings on q and k, per element (16-bit), forward. Fused (Megatron apply_rope_fusion,
# Transformer Engine, flash-attn's rotary kernel): read and write once, 4 bytes. Eager (the
# ``q * cos + rotate_half(q) * sin`` of GPT-NeoX/Llama reference code): mul 4, rotate_half's neg and
# cat 2 + 4, mul 4, add 6 = 20 bytes in 5 kernels, for q and for k.
FUSED_ROPE_BYTES_PER_ELEMENT = 4
EAGER_ROPE_BYTES_PER_ELEMENT = 20
FUSED_ROPE_KERNELS = 1
EAGER_ROPE_KERNELS = 10


def rope_bytes_per_token(model, unfused):
    """Bytes the rotary embedding streams per token forward over the q and k heads of all ranks
    (divided by tp by the caller): (h + h_kv) x bytes per element (latent attention: its rotary
    parts, ``model.rope_hidden``), fused or eager; 0 without RoPE."""
    if not model.rotary:
        return 0.0
    per = np.where(unfused, EAGER_ROPE_BYTES_PER_ELEMENT, FUSED_ROPE_BYTES_PER_ELEMENT)
    return per * model.rope_hidden


def rope_runs_eager(plan, eager_rest=False):
    """Whether the rotary embedding runs as eager PyTorch: the plan turns its fusion off
    (``rope_fusion`` False, Megatron-LM --no-rope-fusion, Megatron-Core's own default) or the engine runs
    its other elementwise ops eager (``eager_rest``)."""
    return np.asarray(eager_rest, dtype=bool) | ~np.asarray(getattr(plan, "rope_fusion", True), dtype=bool)


# Latent attention's RMSNorms of its query and key/value latents: a fused norm's 16-bit read and write per
# element, on every tp rank (the down-projections that make the latents are duplicated, not split).
MLA_LATENT_NORM_BYTES_PER_ELEMENT = FUSED_NORM_BYTES_PER_ELEMENT


def qk_norm_bytes_and_kernels(model, unfused):
    """(bytes per token over all ranks, kernels) of a QK-norm model's RMSNorms of its queries and keys
    (``model.qk_norm``: Qwen3's q_norm / k_norm over each head, before the rotary embedding), forward:
    the fused kernel reads and writes each of the q_hidden + kv_hidden elements once (4 bytes, 16-bit),
    one kernel for the queries and one for the keys; eager, each norm streams the bytes and kernels an
    eager RMSNorm adds per element (UNFUSED_NORM_EXTRA_*). Split over tp with the heads (the caller
    divides); (0, 0) without QK-norm."""
    if not getattr(model, "qk_norm", False):
        return 0.0, 0
    width = model.q_hidden + model.kv_hidden
    per = FUSED_NORM_BYTES_PER_ELEMENT + np.where(unfused, UNFUSED_NORM_EXTRA_BYTES_PER_ELEMENT, 0.0)
    return per * width, 2 * (1 + np.where(unfused, UNFUSED_NORM_EXTRA_KERNELS_EACH, 0))


def qk_norm_assumption(model, **_) -> tuple[str, ...]:
    """What a QK-norm model (Qwen3) adds, said with its estimate: the per-head query and key RMSNorms
    (:func:`qk_norm_bytes_and_kernels`; their saved input: memory.qk_norm_saved_bytes_per_token)."""
    if not getattr(model, "qk_norm", False):
        return ()
    return (f"QK-norm: an RMSNorm over each of the {model.heads} query and {model.kv_heads} key heads after the "
            "projection; its input (q and k before the norm) kept for backward unless the layer is recomputed, "
            "its bytes streamed with the layer's other norms",)


def model_read_assumption(model, **_) -> tuple[str, ...]:
    """What the model's file holds that its estimate does not price (a Hugging Face config's logit
    softcapping, extra norms, ...: :attr:`paraplan.workloads.transformer.TransformerModel.approximated`),
    one line each, so a model read from a config is never approximated silently."""
    return tuple(f"approximated from the model's config: {note}" for note in getattr(model, "approximated", ()))


def elementwise_forward_time(model, job, plan, curves, moe: bool = False):
    """Forward time of a layer's memory-bound kernels (norms, activations, residual adds)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    h, hkv = model.hidden, model.kv_hidden
    act = mlp_activation_bytes_per_token(model, job, moe, plan)
    replicated = 22 * h
    unfused = ~np.asarray(getattr(plan, "fused_elementwise", True), dtype=bool)
    replicated = replicated + np.where(unfused, UNFUSED_NORM_EXTRA_BYTES_PER_HIDDEN * h, 0.0)
    # Scaling (Aleph Alpha) fuses at most the norm: its SwiGLU and rotary embedding are eager PyTorch
    # (scaling/core/nn/mlp.py, rotary.py: q * cos + rotate_half(q) * sin): Behaviour.eager_elementwise
    eager_rest = unfused | engine_flag(plan, "eager_elementwise")
    eager_swiglu = eager_rest & (model.activation == "swiglu")
    act = act + np.where(eager_swiglu, UNFUSED_SWIGLU_EXTRA_BYTES_PER_FFN * model.ffn_hidden, 0.0)
    unfused_extra = np.where(np.asarray(plan.flash_attention, dtype=bool), 0.0, 8 * (model.q_hidden + hkv))
    eager_rope = rope_runs_eager(plan, eager_rest)
    rope = rope_bytes_per_token(model, eager_rope)
    latent_norms = MLA_LATENT_NORM_BYTES_PER_ELEMENT * (model.mla.q_lora_rank + model.mla.kv_lora_rank) if model.mla else 0.0
    qk_norms, qk_norm_kernels = qk_norm_bytes_and_kernels(model, unfused)
    per_token = replicated / np.where(sp, t, 1.0) + latent_norms + (act + unfused_extra + rope + qk_norms) / t
    kernels = (8 + (4 if moe else 0) + np.where(unfused, UNFUSED_NORM_EXTRA_KERNELS, 0) + eager_swiglu
               + (np.where(eager_rope, EAGER_ROPE_KERNELS, FUSED_ROPE_KERNELS) if model.rotary else 0)
               + qk_norm_kernels)
    return curves.memory_time(T * per_token * element_bytes(plan) / BYTES, kernels=kernels)


def op_sac_recomputed_matmul_share(model) -> float:
    """Share of a layer's forward matmul FLOPs that torchtitan's op-level SAC recomputes: the
    matmuls whose outputs it does not save (wk, wo, w3 of wq, wk, wv, wo, w1, w3, w2; wk, wo, fc2 for
    a GELU MLP), by their weight sizes (see memory.op_sac_saved_bytes_per_token)."""
    q, hkv, f = model.q_hidden, model.kv_hidden, model.ffn_hidden
    mlp_mats = 3 if model.activation == "swiglu" else 2
    return (hkv + q + f) / (2 * q + 2 * hkv + mlp_mats * f)


#: forward bytes per token of one hybrid layer's pre-norm (read and write 2h) and residual add (read 2 x 2h,
#: write 2h), the halves of a transformer layer's 22h less the dropout masks (Nemotron-H trains without)
HYBRID_NORM_ADD_BYTES_PER_HIDDEN = 10
HYBRID_NORM_ADD_KERNELS = 2


def hybrid_kind_times(model, job, plan, curves, cluster) -> dict:
    """Per-micro-batch times on one GPU of one layer of each kind of a hybrid pattern
    (``model.layer_pattern``): {"mamba" | "attention" | "mlp" | "moe": the terms of :func:`layer_times`}.

    Each layer is a pre-norm, its mixer or MLP and a residual add (Megatron-Core MambaLayer,
    TransformerLayer with only self-attention or only an MLP: megatron/core/ssm/mamba_block.py), so each
    runs one all-reduce equivalent per pass under tensor parallelism:

    * mamba: in_proj and out_proj GEMMs (:func:`~paraplan.costmodels.mamba.mamba_gemm_forward_times`),
      the convolution and SSD scan (:func:`~paraplan.costmodels.mamba.ssd_scan_times`), the gated norm;
    * attention: the projections and the attention core as a transformer layer prices them, the rotary
      embedding where the model has one; the only layers with a term quadratic in the sequence;
    * mlp: the two projections and the activation;
    * moe: the router, routed and shared experts, token permutation and expert-parallel all-to-alls
      (:func:`hybrid_moe_parts`, the transformer MoE layer's functions).

    Backward: GEMMs twice (dgrad + wgrad), memory-bound kernels twice the bytes. Full recomputation runs
    each layer's forward again; selective recomputes the attention core of the attention layers;
    the E layers' moe, moe_act and shared_experts modules re-run their parts (:func:`hybrid_moe_parts`);
    Megatron's other recompute modules and op-level SAC are not modelled for hybrids (op-level SAC is
    priced as full). Context parallelism: the attention layers as a transformer's (ring or Ulysses), the
    Mamba layers by Megatron-Core's MambaContextParallel all-to-alls
    (:func:`~paraplan.costmodels.mamba.mamba_cp_alltoall_time`, exposed), the MLP layers none."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    wide = element_bytes(plan) / BYTES
    h = model.hidden
    backward_gemms = 2 * fp8_backward_gemm_factor(curves, plan.dtype)
    norm_add = curves.memory_time(T * HYBRID_NORM_ADD_BYTES_PER_HIDDEN * h / np.where(sp, t, 1.0) * wide,
                                  kernels=HYBRID_NORM_ADD_KERNELS)
    ar = tp_allreduce_time(model, job, plan, cluster)
    rc = np.asarray(plan.recompute_code)
    full = (rc == Recompute.FULL) | (rc == Recompute.OP_SAC)
    passes = np.where(full, 3, 2)
    regather_applies = engine_flag(plan, "sp_regather") & sp & (np.asarray(plan.tp) > 1)
    gather = tp_collective_time(ALL_GATHER, tp_gathered_bytes(model, job, plan), plan, cluster)
    shares = tp_shares_data_parallel_links(plan, cluster)

    def kind(name, gemm, first_gemm, core_f, core_b, elem, kernels, core_kernels=0, cp=0.0, cp_hidden=(0.0, 0.0),
             extra=(0.0, 0.0), tp_ar=None, ep=None, modules=0.0, ep_replay=0.0):
        cast_f, cast_b = hybrid_fp8_cast_times(model, job, plan, curves, name)
        fwd = gemm + core_f + elem + cast_f + extra[0]
        bwd = backward_gemms * gemm + core_b + 2 * elem + cast_b + extra[1]
        regather = np.where(regather_applies, np.maximum(0.0, gather - first_gemm)
                            + TP_OVERLAP_CONTENTION * np.minimum(gather, first_gemm), 0.0)
        tp_in = (ar if tp_ar is None else tp_ar) * passes
        regather_raw = np.where(regather_applies, gather, 0.0)
        exposed, raw = tp_layer_exposed_by_pass(tp_in, gemm, full, plan, regather, regather_raw)
        tp = exposed[0] + exposed[1]
        tp_dp_f, tp_dp_b = tp_data_parallel_window_times(exposed, raw, shares)
        selective = np.where((rc == Recompute.SELECTIVE) & recomputes_attention_core(plan), core_f, 0.0)
        replay = np.where(rc > 0, curves.recompute_overhead_time(np.where(full, kernels, core_kernels)), 0.0)
        recompute = np.where(full, fwd, selective + modules) + replay
        zero = 0.0 * fwd
        host = zero
        if ep is not None:      # an MoE layer's all-to-alls; full recomputation (or the moe module) runs the forward's two again
            ep = np.where(full, 6 * ep, 4 * ep + ep_replay)
            gpu = fwd * np.where(full, 2, 1) + bwd + ep + tp + cp
            host = np.where(moe_host_floor_applies(model, plan), np.maximum(0.0, MOE_HOST_SECONDS_PER_LAYER - gpu), 0.0)
        return {"forward": fwd, "backward": bwd, "recompute": recompute, "tp_comm": tp, "cp_comm": zero + cp,
                "ep_comm": zero if ep is None else ep, "moe_host": host, "tp_allreduce": ar,
                "cp_hidden_forward": zero + cp_hidden[0], "cp_hidden_backward": zero + cp_hidden[1],
                "tp_dp_window_forward": zero + tp_dp_f, "tp_dp_window_backward": zero + tp_dp_b}

    out = {}
    if model.kind_count("mamba"):
        d_inner = model.mamba.d_inner
        in_proj, out_proj = mamba_gemm_forward_times(model, job, plan, curves)
        scan_f, scan_b = ssd_scan_times(model, job, plan, curves)
        gated = curves.memory_time(T * GATED_NORM_BYTES_PER_CHANNEL * d_inner / t * wide, kernels=1)
        a2a = mamba_cp_alltoall_time(model, job, plan, cluster)
        out["mamba"] = kind("mamba", in_proj + out_proj, in_proj, scan_f, scan_b, norm_add + gated,
                            2 + 1 + HYBRID_NORM_ADD_KERNELS + 6, cp=np.where(full, 3, 2) * a2a)
    if model.kind_count("attention"):
        attn_times = attention_gemm_forward_times(model, job, plan, curves)
        core_f, core_b = attention_core_times(model, job, plan, curves)
        merge_f, merge_b = ring_attention_merge_times(model, job, plan, curves)
        core_f, core_b = core_f + merge_f, core_b + merge_b
        exchange = ring_exchange_times(model, job, plan, cluster)
        cp = cp_exposed_time(model, job, plan, cluster, core_f, core_b, exchange)
        cp_hidden = ring_hidden_on_network(model, job, plan, cluster, core_f, core_b, exchange)
        eager_rope = rope_runs_eager(plan, engine_flag(plan, "eager_elementwise"))
        rope = curves.memory_time(T * rope_bytes_per_token(model, eager_rope) / t * wide,
                                  kernels=np.where(eager_rope, EAGER_ROPE_KERNELS, FUSED_ROPE_KERNELS)) if model.rotary else 0.0
        qk_bytes, qk_kernels = qk_norm_bytes_and_kernels(model, ~np.asarray(getattr(plan, "fused_elementwise", True), dtype=bool))
        qk = curves.memory_time(T * qk_bytes / t * wide, kernels=qk_kernels) if model.qk_norm else 0.0
        core_kernels = np.where(np.asarray(plan.flash_attention, dtype=bool), 1.0, 2.0 + softmax_bytes_per_score(model, plan)[1][0])
        out["attention"] = kind("attention", sum(attn_times), attn_times[0], core_f, core_b, norm_add + rope + qk,
                                2 + core_kernels + HYBRID_NORM_ADD_KERNELS, core_kernels, cp, cp_hidden)
    if model.kind_count("mlp"):
        fc1, fc2 = mlp_gemm_forward_times(model, job, plan, curves)
        per_width = 6 if model.activation == "swiglu" else 4
        act = curves.memory_time(T * per_width * model.ffn_hidden / t * wide, kernels=1)
        out["mlp"] = kind("mlp", fc1 + fc2, fc1, 0.0, 0.0, norm_add + act, 2 + 1 + HYBRID_NORM_ADD_KERNELS)
    if model.kind_count("moe"):
        out["moe"] = kind("moe", **hybrid_moe_parts(model, job, plan, curves, cluster, norm_add))
    return out


def hybrid_moe_parts(model, job, plan, curves, cluster, norm_add) -> dict:
    """The arguments of one hybrid E layer (pre-norm, router, routed and shared experts, residual add:
    Megatron-Core's TransformerLayer with only an MoE MLP, megatron/core/ssm/mamba_block.py), priced with
    the transformer MoE layer's own functions (:mod:`~paraplan.costmodels.moe`): the router GEMM, the
    routed experts' grouped GEMMs at the busiest rank's tokens (top_k x :func:`~paraplan.costmodels.moe.routed_time_factor`, split
    over ep and etp) and the shared experts (:func:`moe_mlp_forward_time`), the routed experts' wgrad
    accumulation, the experts' activation and the token permutation's bytes
    (:func:`mlp_activation_bytes_per_token`), Megatron-Core's eager expert biases where the model has
    biases, the tensor-parallel gathers of routed copies and the shared experts' all-reduce
    (:func:`moe_tp_routed_and_shared_copies`), and the dispatch and combine all-to-alls over ep
    (:func:`ep_alltoall_time`; exposed: MambaModel runs no combined 1F1B, plan.py refuses
    ep_comm_overlap for hybrids); the host-bound floor of a dropless layer as a transformer's. Megatron-Core's
    recompute modules moe, moe_act and shared_experts re-run their parts in backward
    (:func:`moe_module_recompute_times`; moe its dispatch and combine too). The arguments of
    :func:`hybrid_kind_times`'s ``kind``."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    wide = element_bytes(plan) / BYTES
    routed = routed_experts_forward_times(model, job, plan, curves)
    gemm = moe_mlp_forward_time(model, job, plan, curves, routed)
    elem = norm_add + curves.memory_time(T * mlp_activation_bytes_per_token(model, job, True, plan) / t * wide, kernels=4)
    einsum_f, einsum_b = moe_einsum_dispatch_times(model, job, plan, curves)
    bias_f, bias_b = moe_expert_bias_times(model, job, plan, curves)
    extra = (einsum_f + bias_f, einsum_b + bias_b + routed_experts_wgrad_accumulation_time(model, job, plan, curves, routed))
    routed_copies, shared = moe_tp_routed_and_shared_copies(model, plan)
    ar = np.where(routed_copies > 0, tp_allreduce_time(model, job, plan, cluster, np.maximum(routed_copies, 1e-9),
                                                       fp8_gathers=False), 0.0)
    if shared:
        ar = ar + tp_allreduce_time(model, job, plan, cluster, shared)
    kernels = 1 + 2 + 4 + HYBRID_NORM_ADD_KERNELS       # router, the experts' two grouped GEMMs, permute / act
    a2a = ep_alltoall_time(model, job, plan, cluster)
    modules = ep_replay = 0.0
    if np.any(np.asarray(getattr(plan, "recompute_modules_mask", 0))):
        moe, act, shared_time = moe_module_recompute_times(model, job, plan, curves)
        whole = recomputes_module(plan, "moe")
        modules = np.where(whole, moe, np.where(recomputes_module(plan, "moe_act"), act, 0.0)
                           + np.where(recomputes_module(plan, "shared_experts"), shared_time, 0.0))
        ep_replay = np.where(whole, 2 * a2a, 0.0)
    return {"gemm": gemm, "first_gemm": routed[0], "core_f": 0.0, "core_b": 0.0, "elem": elem, "kernels": kernels,
            "extra": extra, "tp_ar": ar, "ep": a2a, "modules": modules, "ep_replay": ep_replay}


def hybrid_fp8_cast_times(model, job, plan, curves, kind: str):
    """(forward, backward) seconds of one hybrid layer's fp8 casts (0 outside fp8), as
    :func:`~paraplan.costmodels.fp8.fp8_cast_elements` counts a transformer layer's, for the kind's two
    linears: forward the inputs (the block input T·h, the second linear's T x its input / tp) and the
    layer's weights (/ tp, / m where the engine caches the fp8 copy over the step's micro-batches);
    backward the output gradients (T x the first linear's output / tp, T·h)."""
    if not is_fp8(plan.dtype):
        return 0.0, 0.0
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    h = model.hidden
    if kind == "mamba":
        first_out, second_in = model.mamba.in_proj_width, model.mamba.d_inner
    elif kind == "attention":
        first_out, second_in = model.q_hidden + 2 * model.kv_hidden, model.attn_out_hidden
    elif kind == "moe":     # the experts a token meets (routed copies and shared), their local weights
        width = model.moe.expert_ffn_hidden * (model.moe.top_k + model.moe.shared_experts)
        first_out, second_in = (model.mlp_matrices - 1) * width, width
    else:
        first_out, second_in = (model.mlp_matrices - 1) * model.ffn_hidden, model.ffn_hidden
    m = micro_batches(job, plan)
    params = model.kind_params(kind)
    if kind == "moe":
        routed = model.routed_expert_params_per_moe_layer
        params = params - routed + routed * t / (np.asarray(plan.ep, dtype=float) * np.asarray(plan.etp, dtype=float))
    weights = params / t / np.where(engine_flag(plan, "caches_fp8_weights"), np.maximum(m, 1.0), 1.0)
    per = FP8_CAST_BYTES_PER_ELEMENT[plan.dtype]
    cast = getattr(curves, "fp8_cast_time", curves.streaming_time)
    return (cast(per * (T * (h + second_in / t) + weights), kernels=4),
            cast(per * T * (first_out / t + h), kernels=2))


def hybrid_layer_times(model, job, plan, curves, cluster) -> dict:
    """:func:`layer_times` of a hybrid pattern: each term averaged over its layers
    (:func:`hybrid_kind_times`, weighted by each kind's share of the layers)."""
    kinds = hybrid_kind_times(model, job, plan, curves, cluster)
    terms = next(iter(kinds.values())).keys()
    return {term: sum(model.kind_share(k) * times[term] for k, times in kinds.items()) for term in terms}


def hybrid_layer_breakdown(model, job, plan, curves, cluster) -> dict:
    """What each kind of a hybrid pattern costs one GPU per micro-batch, for the estimate's report:
    {kind: {"layers", "forward_ms", "backward_ms" (one layer), "all_layers_ms" (every layer of the kind,
    forward + backward + recompute + exposed tp/cp/ep communication and an MoE layer's host wait, as if on
    one stage), "share" (of the
    sum over kinds)}}; {} for a model without a layer pattern. One plan (scalars)."""
    if not getattr(model, "layer_pattern", ""):
        return {}
    kinds = hybrid_kind_times(model, job, plan, curves, cluster)
    per = {k: float(np.asarray(v["forward"] + v["backward"] + v["recompute"] + v["tp_comm"] + v["cp_comm"]
                               + v["ep_comm"] + v["moe_host"]))
           for k, v in kinds.items()}
    total = sum(model.kind_count(k) * x for k, x in per.items()) or 1.0
    return {k: {"layers": model.kind_count(k), "forward_ms": 1e3 * float(np.asarray(v["forward"])),
                "backward_ms": 1e3 * float(np.asarray(v["backward"])),
                "all_layers_ms": 1e3 * model.kind_count(k) * per[k], "share": model.kind_count(k) * per[k] / total}
            for k, v in kinds.items()}


def layer_times(model, job, plan, curves, cluster) -> dict:
    """Per-layer, per-micro-batch times on one GPU, by term (seconds), averaged over the model's
    dense and MoE layers (weights: their counts), or over a hybrid pattern's kinds
    (:func:`hybrid_layer_times`)."""
    if getattr(model, "layer_pattern", ""):
        return hybrid_layer_times(model, job, plan, curves, cluster)
    attn_times = attention_gemm_forward_times(model, job, plan, curves)
    attn_gemm = sum(attn_times)
    attn_f, attn_b = attention_core_times(model, job, plan, curves)
    merge_f, merge_b = ring_attention_merge_times(model, job, plan, curves)
    attn_f, attn_b = attn_f + merge_f, attn_b + merge_b

    backward_gemms = 2 * fp8_backward_gemm_factor(curves, plan.dtype)

    def fwd_bwd(mlp_gemm, elem):
        """A layer's forward and backward: backward runs every GEMM twice (at the per-tensor rate
        under the row-wise recipe) and streams twice the bytes."""
        gemm = attn_gemm + mlp_gemm
        return gemm + attn_f + elem, backward_gemms * gemm + attn_b + 2 * elem

    fc1_gemm, fc2_gemm = mlp_gemm_forward_times(model, job, plan, curves)
    mlp_gemm = fc1_gemm + fc2_gemm
    elem = elementwise_forward_time(model, job, plan, curves)
    fwd, bwd = fwd_bwd(mlp_gemm, elem)
    sac_replay = op_sac_recomputed_matmul_share(model) * (attn_gemm + mlp_gemm) + elem
    share_moe = model.moe_layers / model.layers
    moe_f = moe_b = 0.0
    tp_window_mlp = mlp_gemm      # the GEMMs an MLP's TP collectives hide under (tp_exposed_time)
    wgrad_extra = 0.0
    if share_moe:
        routed = routed_experts_forward_times(model, job, plan, curves)
        moe_gemm = moe_mlp_forward_time(model, job, plan, curves, routed)
        # an MoE layer's are its own (router, routed and shared experts), not a dense MLP's it does not run:
        # memory-bound at few tokens per expert, they shrink less than a dense MLP's on a faster GPU
        tp_window_mlp = (1 - share_moe) * mlp_gemm + share_moe * moe_gemm
        moe_f, moe_b = fwd_bwd(moe_gemm,
                               elementwise_forward_time(model, job, plan, curves, moe=True))
        wgrad_extra = routed_experts_wgrad_accumulation_time(model, job, plan, curves, routed)
        moe_b = moe_b + wgrad_extra
        einsum_f, einsum_b = moe_einsum_dispatch_times(model, job, plan, curves)
        bias_f, bias_b = moe_expert_bias_times(model, job, plan, curves)
        moe_f, moe_b = moe_f + einsum_f + bias_f, moe_b + einsum_b + bias_b
        fwd = (1 - share_moe) * fwd + share_moe * moe_f
        bwd = (1 - share_moe) * bwd + share_moe * moe_b
    cast_f, cast_b = fp8_cast_times(model, job, plan, curves)   # dense-layer counts (routed experts: assumed alike)
    cast_b = cast_b + fp8_rowwise_rescale_time(model, job, plan, curves)
    fwd, bwd = fwd + cast_f, bwd + cast_b + separate_input_gradient_sum_time(model, job, plan, curves)
    ar = tp_allreduce_time(model, job, plan, cluster)
    # all-reduce equivalents of a layer per pass: the attention's, and the dense MLP's or the MoE layer's
    mlp_ar = ar
    if share_moe:
        routed, shared = moe_tp_routed_and_shared_copies(model, plan)
        moe_ar = np.where(routed > 0, tp_allreduce_time(model, job, plan, cluster, np.maximum(routed, 1e-9),
                                                        fp8_gathers=False), 0.0)
        if shared:
            moe_ar = moe_ar + tp_allreduce_time(model, job, plan, cluster, shared)
        mlp_ar = (1 - share_moe) * ar + share_moe * moe_ar
    rc = np.asarray(plan.recompute_code)
    full = rc == Recompute.FULL
    softmax_kernels = softmax_bytes_per_score(model, plan)[1][0]
    core_kernels = np.where(np.asarray(plan.flash_attention, dtype=bool), 1.0, 2.0 + softmax_kernels)
    layer_kernels = 4 + core_kernels + 8 + 4 * share_moe
    forwards = np.where(full, 2, 1)          # forward passes per micro-batch: the recomputed one too
    passes = np.where(full, 3, 2)            # forward, backward, and the recomputed forward
    # full recomputation and op-level SAC checkpoint the whole layer, selective the attention core;
    # op-SAC's region pays its dispatch mode's measured cost instead of plain checkpointing's
    sac = rc == Recompute.OP_SAC
    replay = np.where(sac, curves.op_sac_overhead_time(layer_kernels),
                      curves.recompute_overhead_time(np.where(full, layer_kernels, core_kernels)))
    selective = np.where(recomputes_attention_core(plan), attn_f, 0.0) \
        + recompute_modules_time(model, job, plan, curves)
    recompute = np.where(full, fwd, np.where(rc == Recompute.SELECTIVE, selective,
                                             np.where(rc == Recompute.OP_SAC, sac_replay, 0.0))) \
        + np.where(rc > 0, replay, 0.0)
    tp_in = (ar + mlp_ar) * passes
    sac_regather = op_sac_regather_time(model, job, plan, cluster)     # exposed whole
    regather_raw = sp_backward_regather_raw_time(model, job, plan, cluster)
    (tp_f, tp_b), (raw_f, raw_b) = tp_layer_exposed_by_pass(
        tp_in, attn_gemm + tp_window_mlp, full, plan,
        sp_backward_regather_time(model, job, plan, cluster, curves, attn_times, fc1_gemm), regather_raw,
        share_moe * wgrad_extra)
    tp_comm = tp_f + tp_b + sac_regather \
        + tp_wrapper_host_time(plan, passes, getattr(curves, "tp_call_overhead_s", 0.0))
    tp_dp_f, tp_dp_b = tp_data_parallel_window_times((tp_f, tp_b + sac_regather), (raw_f, raw_b + sac_regather),
                                                     tp_shares_data_parallel_links(plan, cluster))
    exchange = ring_exchange_times(model, job, plan, cluster)
    cp_comm = cp_exposed_time(model, job, plan, cluster, attn_f, attn_b, exchange)
    cp_hidden_f, cp_hidden_b = ring_hidden_on_network(model, job, plan, cluster, attn_f, attn_b, exchange)
    a2a = ep_alltoall_time(model, job, plan, cluster)
    # full recomputation runs the forward's two all-to-alls again (and excludes the overlap)
    moe_a2a = np.where(full, 6 * a2a, ep_exposed_time(a2a, attn_gemm + attn_f, 2 * attn_gemm + attn_b, moe_f, moe_b, job, plan))
    # the moe recompute module runs the layer's dispatch and combine again in backward
    moe_a2a = moe_a2a + np.where((rc == Recompute.SELECTIVE) & recomputes_module(plan, "moe"), 2 * a2a, 0.0)
    ep_comm = share_moe * moe_a2a
    # a host-bound MoE layer waits for the host beyond its GPU time (MOE_HOST_SECONDS_PER_LAYER)
    moe_gpu = moe_f * forwards + moe_b + cast_f * forwards + cast_b + moe_a2a + tp_comm + cp_comm
    host_wait = np.where(moe_host_floor_applies(model, plan),
                         share_moe * np.maximum(0.0, MOE_HOST_SECONDS_PER_LAYER - moe_gpu), 0.0)
    return {"forward": fwd, "backward": bwd, "recompute": recompute, "tp_comm": tp_comm, "cp_comm": cp_comm,
            "ep_comm": ep_comm, "moe_host": host_wait, "tp_allreduce": ar,
            "cp_hidden_forward": cp_hidden_f, "cp_hidden_backward": cp_hidden_b,
            "tp_dp_window_forward": tp_dp_f, "tp_dp_window_backward": tp_dp_b}


# Aleph Alpha's Scaling gathers the logits over tp and runs torch cross-entropy on ``logits.float()`` on
# every rank (transformer/model/layers/lm_head.py parallel_output=False; losses/cross_entropy.py): bytes
# streamed per logit of the full vocabulary, forward: the gathered 16-bit logits written (2), the fp32
# upcast (read 2, write 4), log-softmax's max and sum passes and its output (read 4 x 3, write 4), the
# loss gather (negligible); backward: nll's gradient (write 4), log-softmax's backward (read 4 + 4,
# write 4), the upcast's backward (read 4, write 2): 46 bytes, in 8 kernels.
SCALING_LOSS_TRAFFIC_BYTES_PER_LOGIT = 2 + (2 + 4) + (12 + 4) + 4 + 12 + 6
SCALING_LOSS_KERNELS = 8


def head_times(model, job, plan, curves, cluster) -> dict:
    """LM head (logits GEMM, cross-entropy) on the last stage and the embedding on the first,
    forward + backward for one micro-batch. Vocabulary-parallel over tp (Megatron); Scaling gathers
    the logits over tp and every rank runs the cross-entropy on the whole vocabulary
    (SCALING_LOSS_TRAFFIC_BYTES_PER_LOGIT), after an all-gather of T x V 16-bit logits. Each
    multi-token-prediction depth (``model.mtp_layers``; its block is counted as a layer of the last
    stage) runs the shared head and its own loss once more, and its 2h -> h projection (split over tp)."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    dt = _dtype(plan)
    V, h = model.vocab, model.hidden
    logits = curves.gemm_time(T, V / t, h, dt)
    scaling = ~engine_flag(plan, "vocab_parallel_loss")      # the logits gathered over tp (Scaling)
    cross_entropy = np.where(scaling,
                             curves.memory_time(T * V * SCALING_LOSS_TRAFFIC_BYTES_PER_LOGIT, kernels=SCALING_LOSS_KERNELS),
                             curves.memory_time(T * V / t * 4 * 3, kernels=4))      # fp32 logits, ~3 passes
    mtp = model.mtp_layers
    projection = 3 * curves.gemm_time(T, h / t, 2 * h, dt) if mtp else 0.0
    head = (1 + mtp) * (3 * logits + cross_entropy) + mtp * projection
    embedding = curves.memory_time(T * h * element_bytes(plan) * 3, kernels=2)
    ar = tp_allreduce_time(model, job, plan, cluster, fp8_gathers=False)     # the LM head runs in 16 bit
    gather = tp_collective_time(ALL_GATHER, T * V * element_bytes(plan), plan, cluster)
    loss_comm = np.where(scaling, gather, vocab_parallel_loss_allreduce_time(job, plan, cluster))
    return {"head": head, "embedding": embedding,
            "tp_comm": 2 * ar + (1 + mtp) * loss_comm}   # + embedding fwd, head grad


FLOP_CONVENTION = ("model FLOPs = 3 x forward FLOPs (2 per multiply-add) of all weight GEMMs, attention "
                   "scores QK^T and PV counted in full (causal mask not halved) and the logits; recomputation "
                   "excluded (PaLM App. B, Korthikanti et al. 2022). HFU adds the recomputed forward FLOPs. "
                   "MFU and HFU are against the dense peak of the plan's compute dtype, bf16 for fp8 and fp4 "
                   "plans (as NeMo, Megatron-Bridge and torchtitan report them): an fp4 plan can pass 100 %.")


def step_flops(model, job, plan):
    """(model FLOPs, hardware FLOPs) per step by FLOP_CONVENTION: the model's FLOPs per token x the
    step's tokens, and those plus what recomputation runs again: the whole forward (full), the
    attention core where it is recomputed and Megatron-Core's recompute modules (selective), or the
    matmuls op-level SAC does not save (:func:`op_sac_recomputed_matmul_share`) of the weight GEMMs."""
    tokens = job.tokens_per_step
    flops_model = model.model_flops_per_token(job.seq_len) * tokens
    attn_fwd = model.layers * model.attention_flops_per_token_per_layer(job.seq_len) * tokens
    full_fwd = model.layers * (model.matmul_flops_per_token_per_layer()
                               + model.attention_flops_per_token_per_layer(job.seq_len)
                               + model.scan_flops_per_token_per_layer()) * tokens
    rc = np.asarray(plan.recompute_code)
    if getattr(model, "layer_pattern", ""):          # op-level SAC priced as full for hybrids (hybrid_kind_times)
        rc = np.where(rc == Recompute.OP_SAC, int(Recompute.FULL), rc)
    flops_hw = flops_model + np.where(rc == Recompute.FULL, full_fwd,
                                      np.where(rc == Recompute.SELECTIVE,
                                               np.where(recomputes_attention_core(plan), attn_fwd, 0.0)
                                               + recompute_modules_flops_per_token(model, plan) * tokens,
                                               np.where(rc == Recompute.OP_SAC,
                                                        op_sac_recomputed_matmul_share(model) * (full_fwd - attn_fwd),
                                                        0.0)))
    return flops_model, flops_hw
