"""Time of one transformer layer (and of the LM head) for one micro-batch on one GPU.

Every function takes the model, the job, a plan (or a batch of plans whose fields are numpy
arrays) and the efficiency curves, and returns seconds (scalars or arrays).

Per layer, with T = b·s/cp tokens on the rank, t = tp:
  GEMMs (forward): QKV (T × h → (h + 2h_kv)/t), output (T × h/t → h), MLP up (T × h → (g·f)/t
  with g = 2 for SwiGLU's gate and up, else 1), MLP down (T × f/t → h). Backward = dgrad + wgrad
  = 2 × forward (Narayanan et al. 2021 §3: backward is twice the forward).
  Attention core: fused (FlashAttention) at 4·b·(s/cp)·s·h/t FLOPs, halved by the causal mask,
  backward 2.5 × forward (FlashAttention-2 recomputes QKᵀ and runs 5 GEMMs against 2); unfused:
  batched GEMMs QKᵀ and PV plus scale-mask-softmax (fused or eager) and, for models trained with
  it, dropout over the b·(a/t)·s_l·s scores (:func:`softmax_bytes_per_score`). Ring context
  parallelism adds its per-step merge kernels (:func:`ring_attention_merge_times`) to the core.
  Memory-bound kernels (forward, bytes per token): two LayerNorms 4h each, two bias-dropout-
  residual adds 7h each, the MLP activation 4f (GELU) or 6f (SwiGLU), and for unfused attention
  the q, k, v and context transposes 4(h + h_kv)·2, and a QK-norm model's RMSNorms of its
  queries and keys 4(q + k) (:func:`qk_norm_bytes_and_kernels`); replicated across tp unless sequence
  parallel, f-wide and attention parts split by tp. Backward streams twice the bytes.
  With ``dtype = fp32`` (the CPU validation runs) every activation, weight and message byte count
  doubles (:func:`element_bytes`); the memory-bound byte counts are the 16-bit ones × 2.
Recomputation (Korthikanti et al. 2022): selective re-runs the attention core forward, full
re-runs the whole layer forward (and its tensor-parallel all-reduces); torchtitan's op-level SAC
re-runs every other matmul and, under sequence parallelism, the two all-gathers of the layer's block
inputs (:func:`op_sac_regather_time`); each recomputed region (the whole layer under full and
op-level SAC, the attention core under selective) also pays the curves' ``recompute_overhead_time``
for its forward kernels, op-level SAC its ``op_sac_overhead_time`` (its dispatch mode's Python per op)
(0 on the analytical GPU curves; measured on a profiled CPU, where checkpointing's bookkeeping costs
several times an op's own time). Forward kernels counted as the terms above charge them: a layer runs 4
projection GEMMs, its attention core (unfused 4: QKᵀ, PV and two memory-bound kernels; fused 1)
and 8 memory-bound kernels (12 in an MoE layer).
"""
from __future__ import annotations

import math

import numpy as np

from paraplan.costmodels.attention import attention_core_times, ring_attention_merge_times, softmax_bytes_per_score
from paraplan.costmodels.comm import ALL_GATHER, ALL_TO_ALL, SEND_RECV, collective_time, ranks_per_node, ring_time
from paraplan.costmodels.fp8 import fp8_backward_gemm_factor, fp8_cast_times, fp8_rowwise_rescale_time
from paraplan.costmodels.kernels import (BYTES, GEMM_OPERAND_BYTES, _dtype, _linear_dtype, attention_gemm_forward_times,
                                         device_is_host, element_bytes, linear_gemm_time, megatron_grad_bytes,
                                         micro_batches, mlp_gemm_forward_time, mlp_gemm_forward_times,
                                         routed_experts_gemm_time, separate_input_projections, tokens_per_rank)
from paraplan.costmodels.tpcomm import (TP_OVERLAP_CONTENTION, op_sac_regather_time, sp_backward_regather_time,
                                        tp_allreduce_time, tp_collective_time, tp_exposed_time,
                                        vocab_parallel_loss_allreduce_time)
from paraplan.plan import CpMode, Engine, Recompute, expert_group_strides, recomputes_attention_core, recomputes_module


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
        e = model.moe
        routed = e.top_k * expert_token_factor(model, job)
        moe = share * (moe_mlp_forward_time(model, job, plan, curves)
                       + curves.memory_time(T * mlp_activation_bytes_per_token(model, job, True, plan) / t * wide, kernels=4)
                       + moe_expert_bias_times(model, job, plan, curves)[0])
        act = share * curves.memory_time(T * per_width * e.expert_ffn_hidden * routed / t * wide, kernels=1)
        if e.shared_experts:
            width = e.shared_experts * e.expert_ffn_hidden
            shared = share * (mlp_gemm_forward_time(model, job, plan, curves, width=width)
                              + curves.memory_time(T * per_width * width / t * wide, kernels=1))
    in_moe = np.where(recomputes_module(plan, "moe"), moe,
                      np.where(recomputes_module(plan, "moe_act"), act, 0.0) + np.where(recomputes_module(plan, "shared_experts"), shared, 0.0))
    return (np.where(recomputes_module(plan, "layernorm"), norms, 0.0) + np.where(recomputes_module(plan, "mla_up_proj"), up, 0.0)
            + np.where(recomputes_module(plan, "mlp"), dense, 0.0) + in_moe)


def recompute_modules_flops_per_token(model, plan):
    """Model FLOPs per token (all layers) of the GEMMs fine-grained recomputation runs again: dense
    MLPs (mlp), MoE layers' router and routed + shared experts (moe; shared_experts alone), latent
    attention's up-projections (mla_up_proj); 2 FLOPs per multiply-add. Norms and activations are
    memory-bound and count none."""
    mods = np.asarray(getattr(plan, "recompute_modules_mask", 0))
    if not np.any(mods):
        return 0.0
    h, g = model.hidden, model.mlp_matrices
    L = model.layers
    moe_layers = model.moe_layers if model.moe is not None else 0
    dense = 2 * g * h * model.ffn_hidden * (L - moe_layers)
    up = 2 * L * sum(out * inp for out, inp, _ in model.mla_up_projection_gemms)
    moe = shared = 0.0
    if model.moe is not None:
        e = model.moe
        shared = 2 * g * h * e.expert_ffn_hidden * e.shared_experts * moe_layers
        moe = 2 * g * h * e.expert_ffn_hidden * e.top_k * moe_layers + shared + 2 * h * e.experts * moe_layers
    return (np.where(recomputes_module(plan, "mlp"), dense, 0.0) + np.where(recomputes_module(plan, "mla_up_proj"), up, 0.0)
            + np.where(recomputes_module(plan, "moe"), moe, np.where(recomputes_module(plan, "shared_experts"), shared, 0.0)))


def expert_token_factor(model, job) -> float:
    """Tokens the busiest expert processes over the balanced share: the capacity factor when tokens
    are padded to capacity, else the routed imbalance (dropless: the busiest expert sets the pace)."""
    cf = model.moe.capacity_factor
    return cf if cf else job.moe_imbalance


def routed_expert_gemms(model, job, plan):
    """The routed experts' two GEMMs on one GPU, as :func:`moe_mlp_forward_time` prices them:
    (m tokens per expert, experts held, grouped, [(n, k) of the up (gate) and down projections])."""
    e = model.moe
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    ep = np.asarray(plan.ep, dtype=float)
    etp = np.asarray(plan.etp, dtype=float)
    h, g, fe = model.hidden, model.mlp_matrices - 1, e.expert_ffn_hidden
    m = T * e.top_k * expert_token_factor(model, job) * ep / e.experts * etp / t
    return m, e.experts / ep, e.dispatch == "permute", [(g * fe / etp, h), (h, fe / etp)]


def routed_experts_forward_times(model, job, plan, curves) -> tuple:
    """Forward seconds of each of the routed experts' two GEMMs on one GPU (the shapes of
    :func:`routed_expert_gemms`, priced by :func:`routed_experts_gemm_time`)."""
    m, local, grouped, shapes = routed_expert_gemms(model, job, plan)
    return tuple(routed_experts_gemm_time(curves, m, n, k, local, plan, grouped) for n, k in shapes)


def moe_mlp_forward_time(model, job, plan, curves, routed=None):
    """Forward time of an MoE layer's MLP on one GPU: router, routed experts and shared experts.

    ep ranks share E experts (E/ep each), each split over etp ranks; the tp/etp ranks of an expert
    shard split its tokens. Per expert GEMM: m = T·k·f·ep/E·etp/tp tokens (f: expert_token_factor),
    n = width/etp; E/ep of them per GPU, one grouped GEMM under token permutation
    (:func:`routed_experts_gemm_time`) — the per-GPU work, 2·g·h·width·T·k·f/tp, does not depend
    on ep or etp (DeepSpeed-TED, Singh et al. 2023, §3). ``routed``: the routed GEMMs' times where
    the caller has them (:func:`routed_experts_forward_times`)."""
    e = model.moe
    routed = routed_experts_forward_times(model, job, plan, curves) if routed is None else routed
    shared = mlp_gemm_forward_time(model, job, plan, curves, width=e.shared_experts * e.expert_ffn_hidden) \
        if e.shared_experts else 0.0
    router = curves.gemm_time(tokens_per_rank(job, plan), e.experts, model.hidden, _dtype(plan))
    return sum(routed) + shared + router


def routed_experts_wgrad_accumulation_time(model, job, plan, curves, routed=None):
    """Backward seconds the routed experts' weight-gradient GEMMs take beyond the forward-shaped
    price the backward gives every GEMM (backward = dgrad + wgrad = 2 x forward).

    Under fused gradient accumulation (``plan.grad_accumulation_fusion``; Megatron-LM
    --gradient-accumulation-fusion: the wgrad GEMM runs with beta = 1 on the parameter's main_grad,
    Transformer Engine's fuse_wgrad_accumulation, for the experts GroupedLinear's grouped wgrad GEMM
    with accumulate=True into their main gradients) each expert's wgrad GEMM (k x m)·(m x n) reads
    its two m-row operands and reads and writes the k x n main gradient, g = :func:`megatron_grad_bytes`
    per element each way (fp32: 4; bf16 with --grad-reduce-in-bf16: 2), where the forward moves the
    weight once in the GEMM's format. With few tokens per expert (m well below the weights' k, n)
    those bytes bind: up to 2g/w = 4x the forward's in bf16 with an fp32 main_grad. Per GEMM, with
    t_f its forward time (:func:`routed_experts_gemm_time`) and t0 the launch cost (once grouped,
    else per expert):

        extra = max(0, c·t0 + streaming(E_local·((mk + mn)·w + 2g·nk)) - t_f)

    the per-op roofline (llm-analysis / calculon, shared/reference/hardware_costmodels.md sec.
    3.1-3.2) applied to the GEMM the backward runs; it equals max(t_f, roofline) - t_f where the
    accumulating wgrad moves at least the forward's bytes. 0 without the fusion (a 16-bit wgrad
    output moves the forward's bytes; the separate accumulation is estimate.grad_accumulation_time)
    and where the GEMM is compute-bound (a dense layer's m is every token of the micro-batch, so
    dense GEMMs are left as they are). ``routed`` as for :func:`moe_mlp_forward_time`."""
    m, local, grouped, shapes = routed_expert_gemms(model, job, plan)
    routed = routed_experts_forward_times(model, job, plan, curves) if routed is None else routed
    w = GEMM_OPERAND_BYTES.get(_linear_dtype(plan), 2.0)
    accumulate = 2.0 * megatron_grad_bytes(plan)          # main_grad read and written
    launches = np.where(grouped, 1.0, local) * curves.kernel_overhead_s
    extra = 0.0
    for (n, k), forward in zip(shapes, routed):
        wgrad_bytes = local * ((m * k + m * n) * w + n * k * accumulate)
        extra = extra + np.maximum(0.0, launches + curves.streaming_time(wgrad_bytes, kernels=0) - forward)
    return np.where(np.asarray(plan.grad_accumulation_fusion, dtype=bool), extra, 0.0)


def einsum_dispatch_slots(model, job, plan):
    """S and E·C of DeepSpeed-MoE's einsum dispatch on one GPU: S = b·s/cp tokens (the gate runs on
    every tp rank's full copy of the micro-batch), E·C = S·top_k·factor capacity slots
    (C = ceil(k·S/E·capacity_factor) in ``top1gating``/``top2gating``; dropless: the busiest
    expert's count, here S/E·k·moe_imbalance)."""
    S = tokens_per_rank(job, plan)
    return S, S * model.moe.top_k * expert_token_factor(model, job)


def moe_einsum_dispatch_times(model, job, plan, curves):
    """(forward, backward) seconds of GShard-style einsum dispatch and combine in one MoE layer.

    DeepSpeed-MoE ``MOELayer.forward`` (deepspeed/moe/sharded_moe.py, the implementation DeepSpeed-
    MoE and DeepSpeed-TED ran; Lepikhin et al. 2020, GShard §2.2 for the formulation):
    ``dispatched = einsum("sec,sm->ecm", dispatch_mask, x)`` and
    ``out = einsum("sec,ecm->sm", combine_weights, expert_out)``; DeepSpeed evaluates both as one
    dense GEMM each, (E·C × S)·(S × h) and (S × E·C)·(E·C × h), 2·S·E·C·h FLOPs apiece with
    E·C = S·k·factor (:func:`einsum_dispatch_slots`), so the cost grows with the square of the
    tokens per micro-batch and does not shrink with tp. Backward: the gradient of x through the
    dispatch GEMM, and of expert_out and of the combine weights through the combine GEMM (3 GEMMs;
    the boolean dispatch mask takes none). Memory traffic: the S x E x C combine weights are built in
    fp32 (the gate runs in fp32), cast to a boolean mask and to two 16-bit GEMM operands: about
    4 + 1 + 2 + 2 bytes written and as many read per slot forward (18 bytes), twice that backward.
    Returns 0 for ``dispatch = "permute"`` (its copies are priced in
    :func:`dispatch_bytes_per_token`)."""
    if model.moe is None or model.moe.dispatch != "einsum":
        return 0.0, 0.0
    S, slots = einsum_dispatch_slots(model, job, plan)
    h, dt = model.hidden, _dtype(plan)
    dispatch = curves.gemm_time(slots, h, S, dt)        # (E·C x S) @ (S x h)
    combine = curves.gemm_time(S, h, slots, dt)         # (S x E·C) @ (E·C x h)
    grad_weights = curves.gemm_time(S, slots, h, dt)    # d(combine weights) = d(out) @ expert_outᵀ
    wide = element_bytes(plan) / BYTES
    stream = curves.memory_time(18 * wide * S * slots, kernels=4)
    return dispatch + combine + stream, dispatch + combine + grad_weights + 2 * stream


# The routed experts' output biases under Megatron-Core (models with linear biases, GPT-OSS): TEGroupedMLP
# builds its fc2 with ``skip_bias_add=True`` and adds each expert's bias, scaled by the copy's router
# probability, after the grouped GEMM in eager PyTorch (megatron/core/transformer/moe/experts.py,
# ``TEGroupedMLP._apply_bias``: ``torch.cat([t + b * p for t, b, p in zip(torch.split(out, tokens_per_expert),
# biases, torch.split(probs, tokens_per_expert))])``), a loop over the local experts. Bytes per routed copy,
# 16-bit values h wide (the 16-bit router probabilities of a 16-bit router are 2 bytes per copy, not
# counted), forward: ``b * p`` written (2h), the add reads t and b·p and writes (6h), torch.cat reads and
# writes (4h): 12h, in 2 kernels per local expert and the cat. Backward (autograd): the multiply's two
# gradients, grad·p for the bias and grad·b for the probability, each written and read back by its
# reduction (2 x 6h), and the split's backward concatenating the slices' gradients (4h): 16h, in 4 kernels
# per local expert and the cat. Nothing more is kept for backward (the multiply keeps b and p).
EXPERT_BIAS_BYTES_PER_COPY_FORWARD = 2 + (2 + 2 + 2) + (2 + 2)
EXPERT_BIAS_BYTES_PER_COPY_BACKWARD = 2 * (2 + 2 + 2) + (2 + 2)
# TEGroupedMLP refuses bias_dropout_fusion with linear biases (an assertion in its constructor), so the
# attention output's bias is added apart from the residual: x + bias (read 2h, write 2h) and the residual
# add (read 4h, write 2h), 10h against the fused bias-dropout-add's 7h, one kernel more; backward the bias
# gradient's reduction reads the output gradient once more (2h).
UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD = 10 - 7
UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_BACKWARD = 2


def megatron_expert_biases(model, plan):
    """Whether the plan's MoE layers add the routed experts' output biases in Megatron-Core's eager loop
    (:data:`EXPERT_BIAS_BYTES_PER_COPY_FORWARD`): Megatron-LM engine, a model with linear biases, token
    permutation (TEGroupedMLP)."""
    engine = np.asarray(getattr(plan, "engine_code", 0)) == Engine.MEGATRON
    if model.moe is None or not model.bias or model.moe.dispatch != "permute":
        return np.zeros(np.shape(engine), dtype=bool)
    return engine


def moe_expert_bias_times(model, job, plan, curves):
    """(forward, backward) seconds an MoE layer spends adding its biases outside the GEMMs under
    Megatron-Core (:func:`megatron_expert_biases`; 0 otherwise): the routed experts' output biases over
    the GPU's m·E/ep routed copies (:func:`routed_expert_gemms`), 12h bytes each forward and 16h backward
    (:data:`EXPERT_BIAS_BYTES_PER_COPY_FORWARD`, ``_BACKWARD``), and the attention output's bias added
    apart from the residual over the rank's T tokens (÷ tp under sequence parallelism), 3h forward and 2h
    backward (:data:`UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD`), at the curves' streaming rate."""
    applies = megatron_expert_biases(model, plan)
    if not np.any(applies):
        return 0.0, 0.0
    m, local, _, _ = routed_expert_gemms(model, job, plan)
    copies = m * local
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    tokens = T / np.where(np.asarray(plan.sp, dtype=bool), t, 1.0)
    h, wide = model.hidden, element_bytes(plan) / BYTES
    # plain multiplies, adds and copies whose bytes are counted exactly: the streaming rate
    forward = curves.streaming_time(wide * h * (copies * EXPERT_BIAS_BYTES_PER_COPY_FORWARD
                                                + tokens * UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD),
                                    kernels=2 * local + 1 + 1)
    backward = curves.streaming_time(wide * h * (copies * EXPERT_BIAS_BYTES_PER_COPY_BACKWARD
                                                 + tokens * UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_BACKWARD),
                                     kernels=4 * local + 1 + 1)
    return np.where(applies, forward, 0.0), np.where(applies, backward, 0.0)


# Token permutation around the experts under ``dispatch = "permute"``, bytes in a forward pass (16-bit
# values, h wide). Megatron-Core's all-to-all dispatcher (MoEAlltoAllTokenDispatcher in
# megatron/core/transformer/moe/token_dispatcher.py, helpers in moe_utils.py) runs: ``permute`` (the fused
# kernel reads each token once, 2h, and writes its k copies in expert order, 2h each), the dispatch
# all-to-all, ``sort_chunks_by_idxs`` when a GPU holds several experts and ep > 1 (regroup the received
# copies by local expert: read and write, 4h per copy), the grouped GEMM, the inverse regrouping (4h per
# copy), the combine all-to-all and ``unpermute`` (read each copy, 2h, and sum it into its token, written
# once, 2h; the router probabilities were applied inside the experts' activation, TEGroupedMLP's
# weighted_bias_swiglu_impl). torchtitan's expert-parallel MoE makes the same passes
# (its token reorder before the all-to-all, ``_permute`` / ``_unpermute`` around the grouped mm after it,
# the score-weighted ``scatter_add``).
DISPATCH_BYTES_PER_COPY = 2 + 2                  # permute's write, unpermute's read
DISPATCH_SORT_CHUNKS_BYTES_PER_COPY = 2 * (2 + 2)
DISPATCH_BYTES_PER_TOKEN = 2 + 2                 # permute's read, unpermute's write


def sorts_received_chunks(model, plan):
    """Whether the dispatcher regroups the tokens an all-to-all delivered by local expert: ep > 1
    and more than one expert per GPU (Megatron-Core's ``num_local_experts > 1``)."""
    ep = np.asarray(getattr(plan, "ep", 1), dtype=float)
    return (ep > 1) & (model.moe.experts / ep > 1)


def dispatch_bytes_per_token(model, job, plan) -> float:
    """Bytes the token permutation streams per token in an MoE layer's forward (see the
    ``DISPATCH_*`` counts): (4 + 8·[regroup])·h per routed copy (k·f copies per token) + 4h per
    token. Under DeepEP / HybridEP (``plan.moe_flex_dispatch``) the kernels read the tokens and write
    one copy per destination GPU themselves; Megatron-Core's flex dispatcher then permutes those
    arrivals into expert order and unpermutes them before the combine: 4h per routed copy + 4h per
    arrival (:func:`expected_destinations` GPUs per token). GShard-style einsum dispatch
    (DeepSpeed-MoE) has none here: its dense dispatch and combine are priced in
    :func:`moe_einsum_dispatch_times`."""
    e = model.moe
    if e.dispatch != "permute":
        return 0.0
    copies = e.top_k * expert_token_factor(model, job)
    sort = np.where(sorts_received_chunks(model, plan), DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, 0)
    alltoall = (DISPATCH_BYTES_PER_COPY + sort) * copies + DISPATCH_BYTES_PER_TOKEN
    flex = np.asarray(getattr(plan, "moe_flex_dispatch", False), dtype=bool)
    if np.any(flex):
        ep = np.asarray(plan.ep, dtype=float)
        arrivals = expert_holders_per_token(e, e.experts / ep) * expert_token_factor(model, job)
        alltoall = np.where(flex, DISPATCH_BYTES_PER_COPY * copies + DISPATCH_BYTES_PER_TOKEN * arrivals, alltoall)
    return alltoall * model.hidden


def mlp_activation_bytes_per_token(model, job, moe: bool, plan) -> float:
    """Bytes the MLP's activation function streams per token (GELU 4f, SwiGLU 6f); an MoE layer's
    routed experts see top_k x factor tokens, its shared experts all, and the token permutation to and
    from the experts streams :func:`dispatch_bytes_per_token`."""
    per_width = 6 if model.activation == "swiglu" else 4
    if not moe:
        return per_width * model.ffn_hidden
    e = model.moe
    routed = e.top_k * expert_token_factor(model, job)
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
    # (scaling/core/nn/mlp.py, rotary.py: q * cos + rotate_half(q) * sin)
    eager_rest = unfused | (np.asarray(getattr(plan, "engine_code", 0)) == Engine.SCALING)
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


def ep_alltoall_time(model, job, plan, cluster):
    """One expert-parallel all-to-all (dispatch or combine): each GPU sends its T·k·f/tp routed
    token copies of h values across the ep group, which is carved from data parallelism (stride
    tp·cp in the rank order). DeepSpeed-MoE (Rajbhandari et al. 2022) §5; shared/reference §2.10.
    Under ``plan.moe_flex_dispatch`` the DeepEP / HybridEP kernels' traffic instead
    (:func:`flex_dispatch_time`)."""
    if model.moe is None:
        return 0.0
    T = tokens_per_rank(job, plan)
    size = T * model.moe.top_k * expert_token_factor(model, job) * model.hidden * element_bytes(plan) / np.asarray(plan.tp, float)
    k = ranks_per_node(plan.ep, expert_group_strides(plan)[0], cluster.gpus_per_node)
    intra, inter = cluster.links("ep")
    alltoall = collective_time(ALL_TO_ALL, size, plan.ep, k, intra, inter)
    flex = np.asarray(getattr(plan, "moe_flex_dispatch", False), dtype=bool)
    if not np.any(flex):
        return alltoall
    return np.where(flex, flex_dispatch_time(model, job, plan, cluster), alltoall)


def _missed_by_picks(pool, held, picks: int):
    """C(pool − held, k) / C(pool, k) = Π_i (pool − held − i) / (pool − i): the chance that k distinct
    uniform picks from ``pool`` experts all miss a given ``held`` of them."""
    held = np.asarray(held, dtype=float)
    missed = np.ones_like(held)
    for i in range(picks):
        missed = missed * np.maximum(pool - held - i, 0.0) / (pool - i)
    return missed


def expected_destinations(experts: int, top_k: int, held, groups: int | None = None,
                          group_top_k: int | None = None):
    """Expected number of distinct holders (GPUs or nodes) a token's top-k experts sit on, when each of
    the ``experts / held`` holders keeps ``held`` consecutive experts and routing is uniform.

    Unlimited routing: a holder is missed by all k choices with probability C(E − held, k) / C(E, k).
    Group-limited routing (``groups`` groups of g = E/G consecutive experts, ``group_top_k`` = G_k of
    them picked uniformly, the k experts uniform among their G_k·g): a holder inside one group is hit
    with probability G_k/G · (1 − C(G_k·g − held, k) / C(G_k·g, k)); a holder of m whole groups is
    missed with probability Σ_j P(j of its groups picked) · C(G_k·g − j·g, k) / C(G_k·g, k), P(j)
    hypergeometric, C(m, j)·C(G − m, G_k − j) / C(G, G_k). A holder that neither sits inside one group
    nor holds whole groups is priced as unlimited routing (more destinations, the dearer bound)."""
    held = np.asarray(held, dtype=float)
    unlimited = experts / held * (1.0 - _missed_by_picks(experts, held, top_k))
    if groups is None or group_top_k is None or group_top_k >= groups:
        return unlimited
    size = experts / groups
    pool = group_top_k * size
    inside = group_top_k / groups * (1.0 - _missed_by_picks(pool, np.minimum(held, size), top_k))
    missed_with_m = np.array([sum(math.comb(m, j) * math.comb(groups - m, group_top_k - j)
                                  / math.comb(groups, group_top_k) * float(_missed_by_picks(pool, j * size, top_k))
                                  for j in range(0, min(m, group_top_k) + 1)) for m in range(groups + 1)])
    m = np.clip(np.rint(held / size), 0, groups).astype(int)
    spanning = 1.0 - missed_with_m[m]
    aligned_inside = (held <= size) & (np.mod(size, held) == 0)
    aligned_spanning = (held >= size) & (np.mod(held, size) == 0)
    return np.where(aligned_inside, experts / held * inside,
                    np.where(aligned_spanning, experts / held * spanning, unlimited))


def expert_holders_per_token(moe, held):
    """Expected distinct holders of ``held`` consecutive experts each (GPUs: E/ep; nodes: E·k_l/ep) that
    one token's routed experts sit on, under the model's routing (group-limited where its router is):
    :func:`expected_destinations`."""
    return expected_destinations(moe.experts, moe.top_k, held, moe.router_groups, moe.router_group_top_k)


def flex_dispatch_time(model, job, plan, cluster):
    """One DeepEP / HybridEP dispatch (or combine) of Megatron-Core's flex token dispatcher: a token
    goes once to every remote node that holds one of its experts (RDMA, to the GPU of the same local
    index there, which forwards it over NVLink to the node's other destination GPUs) and once to every
    destination GPU of its own node, instead of once per routed copy (DeepEP's normal kernels,
    github.com/deepseek-ai/DeepEP README). Expected distinct destinations under uniform routing,
    group-limited where the model's router is (DeepSeek-V3's node-limited routing: 4 of 8 groups, so
    over 8 nodes at most 4 a token): :func:`expected_destinations` with E/ep experts per GPU and
    E·k_l/ep per node (k_l ep ranks per node). Priced with the
    all-to-all's links and per-peer latencies (:func:`paraplan.costmodels.comm.collective_time`)."""
    e = model.moe
    T = tokens_per_rank(job, plan)
    ep = np.asarray(plan.ep, dtype=float)
    one_copy = T * expert_token_factor(model, job) * model.hidden * element_bytes(plan) / np.asarray(plan.tp, float)
    k_l = np.minimum(ranks_per_node(plan.ep, expert_group_strides(plan)[0], cluster.gpus_per_node), ep)
    nodes = ep / k_l
    gpus_hit = expert_holders_per_token(e, e.experts / ep)
    nodes_hit = expert_holders_per_token(e, e.experts * k_l / ep)
    remote_nodes = nodes_hit * (nodes - 1) / nodes
    own_node_gpus = gpus_hit * (k_l - 1) / ep
    forwarded = np.maximum(gpus_hit * (ep - k_l) / ep - remote_nodes, 0.0)
    intra, inter = cluster.links("ep")
    a_in, b_in = intra.alpha_beta(ALL_TO_ALL)
    a_out, b_out = inter.alpha_beta(ALL_TO_ALL)
    t = ((k_l - 1) * a_in + one_copy * (own_node_gpus + forwarded) / b_in
         + (nodes - 1) * a_out + one_copy * remote_nodes / b_out)
    return np.where(ep > 1, t, 0.0)


def ulysses_alltoall_time(model, job, plan, cluster):
    """DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): per layer forward, an all-to-all of
    Q, K, V ((h + 2h_kv) wide) before attention and one of the context (h wide) after it, over the
    cp group; each GPU holds s/cp tokens, so its bytes are b·(s/cp)·(2h + 2h_kv)·e/tp and the per-link
    volume stays constant when s and cp grow together."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    intra, inter = cluster.links("cp")
    qkv = collective_time(ALL_TO_ALL, T * (model.q_hidden + model.kv_hidden + model.v_hidden) * element_bytes(plan) / t,
                          plan.cp, k, intra, inter)
    out = collective_time(ALL_TO_ALL, T * model.attn_out_hidden * element_bytes(plan) / t, plan.cp, k, intra, inter)
    return qkv + out


def moe_tp_collective_copies(model, plan):
    """Rows, in units of the layer's T tokens, that an MoE layer's MLP moves through tensor-parallel
    collectives per pass (all-gather forward, reduce-scatter back: one all-reduce equivalent each
    way, as a dense MLP's T rows). Megatron-Core's token dispatchers (moe/token_dispatcher.py) gather
    only over the expert-tensor-parallel group: with etp > 1 each rank all-gathers the routed copies
    of its etp peers (k·cf per token of its sequence shard, cf the capacity factor where tokens are
    padded) and reduce-scatters the experts' partial outputs back, k·cf·etp/tp rows of T; with etp 1
    the experts run whole on the rank's own tokens and, under sequence parallelism, the routed part
    moves nothing over tp. Without sequence parallelism (DeepSpeed-MoE under Megatron-DeepSpeed's
    tensor parallelism) every tp rank holds all T tokens: each keeps its 1/tp share for the experts
    (``drop_tokens``) and all-gathers the outputs after them (``gather_tokens``), whose backward is the
    reverse: one all-gather of T a pass, half an all-reduce equivalent. Shared experts run as a dense
    MLP over the tp group (one more T). Priced on the tp group (exact at etp = tp, the search's only
    expert tensor parallelism)."""
    routed, shared = moe_tp_routed_and_shared_copies(model, plan)
    return routed + shared


def moe_tp_routed_and_shared_copies(model, plan):
    """:func:`moe_tp_collective_copies` in its two parts, (routed, shared): the dispatcher's gathers of
    routed token copies (16-bit: gathered before any fp8 cast) and the shared experts' dense-MLP
    collectives (fp8 gathers where :func:`tp_gathers_fp8`)."""
    e = model.moe
    t = np.asarray(plan.tp, dtype=float)
    etp = np.asarray(getattr(plan, "etp", 1), dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    routed = np.where(etp > 1, e.top_k * (e.capacity_factor or 1.0) * etp / t, np.where(sp, 0.0, 0.5))
    return routed, (1.0 if e.shared_experts else 0.0)


def ring_attention_step_time(model, job, plan, cluster):
    """One ring-attention step: a K and V chunk of s/cp tokens to the next cp rank."""
    T = tokens_per_rank(job, plan)
    chunk = T * (model.kv_hidden + model.v_hidden) / np.asarray(plan.tp, dtype=float) * element_bytes(plan)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    intra, inter = cluster.links("cp")
    return np.where(k < np.asarray(plan.cp), ring_time(SEND_RECV, chunk, 2, inter), ring_time(SEND_RECV, chunk, 2, intra))


def cp_exposed_time(model, job, plan, cluster, attn_fwd, attn_bwd, exchange=None):
    """Context parallelism per layer and micro-batch, exposed part.

    Ring attention (Liu et al. 2023; Megatron-LM context_parallel.md): K/V chunks pass around the
    cp ring, overlapped with the attention core; only the excess is exposed. Forward moves K and V
    (cp−1) times; backward moves K, V and their gradients. Ulysses: its all-to-alls sit on the
    critical path (forward 2, backward 2). ``exchange``: :func:`ring_exchange_times` when the caller
    has it already."""
    ulysses = 2 * ulysses_alltoall_time(model, job, plan, cluster)
    if exchange is None:
        exchange = ring_exchange_times(model, job, plan, cluster)
    if not ring_exchange_hides(cluster):
        attn_fwd = attn_bwd = 0.0
    ring = _ring_exposed(exchange, attn_fwd, attn_bwd, plan)
    c = np.asarray(plan.cp, dtype=float)
    return np.where(c > 1, np.where(np.asarray(plan.cp_mode_code) == CpMode.ULYSSES, ulysses, ring), 0.0)


def ring_exchange_hides(cluster) -> bool:
    """Whether ring attention's K/V exchange can run under the attention core. On GPUs it can (NCCL's
    or the copy engines' transfers beside the kernels). On a profiled CPU it cannot: gloo moves the
    bytes on the cores that compute, the send in the calling thread and the receive in gloo's own
    threads (measured in ``paraplan validate --cp 2`` on the default model: c10d::send held 6.4 ms of
    the rank's CPU per step besides 3.7 ms of waits), as its data-parallel collectives hide nothing
    there either (:mod:`paraplan.validation.predict`)."""
    return not device_is_host(cluster)


def ring_exchange_times(model, job, plan, cluster):
    """(step, forward, backward) seconds of ring attention's K/V exchange per layer and micro-batch:
    one step (:func:`ring_attention_step_time`), the forward's (cp−1) steps moving K and V, and the
    backward's 2(cp−1) moving K, V and their gradients. What :func:`_ring_exposed` and
    :func:`ring_hidden_on_network` share."""
    c = np.asarray(plan.cp, dtype=float)
    step = ring_attention_step_time(model, job, plan, cluster)
    return step, (c - 1) * step, 2 * (c - 1) * step


def _ring_exposed(exchange, attn_fwd, attn_bwd, plan):
    """Forward: the K/V chunks beyond the excess over the attention core. Backward likewise, plus
    the last step's dK/dV chunk, which goes back to its owner after the last attention kernel with
    nothing left to hide under (Transformer Engine's AttnFuncWithCPAndKVP2P.backward waits for it).
    ``exchange`` is :func:`ring_exchange_times`."""
    step, fwd, bwd = exchange
    exposed = np.maximum(0.0, fwd - attn_fwd) + np.maximum(0.0, bwd - attn_bwd) + step
    return np.where(np.asarray(plan.cp) > 1, exposed, 0.0)


def ring_hidden_on_network(model, job, plan, cluster, attn_fwd, attn_bwd, exchange=None):
    """(forward, backward) seconds per layer and micro-batch during which ring attention's K/V
    exchange, hidden under the attention core, holds the inter-node links: min(exchange, attention
    core) in each pass where the cp ring spans nodes (0 for Ulysses, cp = 1 or a ring inside a node).
    The data-parallel collectives that run over the same links cannot also hide in that time
    (:func:`paraplan.costmodels.estimate.step_terms`). ``exchange``: :func:`ring_exchange_times`
    when the caller has it already."""
    c = np.asarray(plan.cp, dtype=float)
    _, fwd_x, bwd_x = ring_exchange_times(model, job, plan, cluster) if exchange is None else exchange
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    crosses = (c > 1) & (np.asarray(plan.cp_mode_code) != CpMode.ULYSSES) & (k < c)
    fwd = np.where(crosses, np.minimum(fwd_x, attn_fwd), 0.0)
    bwd = np.where(crosses, np.minimum(bwd_x, attn_bwd), 0.0)
    return fwd, bwd


def op_sac_recomputed_matmul_share(model) -> float:
    """Share of a layer's forward matmul FLOPs that torchtitan's op-level SAC recomputes: the
    matmuls whose outputs it does not save (wk, wo, w3 of wq, wk, wv, wo, w1, w3, w2; wk, wo, fc2 for
    a GELU MLP), by their weight sizes (see memory.op_sac_saved_bytes_per_token)."""
    q, hkv, f = model.q_hidden, model.kv_hidden, model.ffn_hidden
    mlp_mats = 3 if model.activation == "swiglu" else 2
    return (hkv + q + f) / (2 * q + 2 * hkv + mlp_mats * f)


# Megatron-Core's dropless token dispatch copies the per-expert token counts to the host (the all-to-all
# splits and the grouped GEMM's per-expert sizes) and waits for them inside every MoE layer
# (megatron/core/transformer/moe/token_dispatcher.py: cuda_dtoh_point / cuda_sync_point; "no_sync" only
# with moe_pad_expert_input_to_capacity). The host therefore cannot queue work ahead across the layer,
# and an MoE layer costs at least the host's own time to issue it, forward and backward. Its value is
# read from the one calibration row whose GPU time is far below it: Qwen3-30B-A3B, 8 B200, micro-batch 1
# (Megatron-Bridge table, shared/reference/published_runs_calibration_h100.csv): 28.19 s over 64
# micro-batches x 48 MoE layers = 9.2 ms per layer and micro-batch against 2.7 ms of priced GPU time.
# The same model on 16 H100 (ep 16, micro-batch 1, HybridEP dispatch as its recipe names) ran 9.7 ms
# per layer and micro-batch; priced with this floor it comes out at 9.4 ms (its GPU time alone is
# below the floor), with the all-to-all dispatcher its GPU time would be 12.5 ms. A host cost, so one
# figure for every GPU generation. Token-drop-and-pad (capacity factor set) has no sync and no floor.
MOE_HOST_SECONDS_PER_LAYER = 9.0e-3


def moe_host_floor_applies(model, plan):
    """Whether the plan's MoE layers are host-bound at the MOE_HOST_SECONDS_PER_LAYER floor: Megatron-LM
    engine, dropless (no capacity factor), permute dispatch."""
    if model.moe is None or model.moe.capacity_factor is not None or model.moe.dispatch != "permute":
        return np.zeros(np.shape(np.asarray(getattr(plan, "engine_code", 0))), dtype=bool)
    return np.asarray(getattr(plan, "engine_code", 0)) == Engine.MEGATRON


# The same share for an expert-parallel all-to-all running beside the other micro-batch's kernels under
# combined 1F1B (NCCL's all-to-all kernels, or DeepEP's, take SMs and HBM bandwidth the same way).
EP_OVERLAP_CONTENTION = TP_OVERLAP_CONTENTION


def ep_unpaired_share(job, plan):
    """Share of a stage's micro-batch passes that combined 1F1B cannot pair with a pass of the other
    direction: the warm-up forwards and cool-down backwards. Without pipelining one of m; in the
    interleaved schedule the first stage's warm-up, 2(p - 1) + (v - 1)·p model chunks, of m·v
    (Megatron-Core get_pp_rank_microbatches / combined_1f1b_schedule_for_no_pipelining)."""
    m = np.maximum(micro_batches(job, plan), 1.0)
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    warmup = np.where(p == 1, 1.0, 2 * (p - 1) + (v - 1) * p)
    return np.minimum(1.0, warmup / (m * np.where(p == 1, 1.0, v)))


def ep_exposed_time(a2a, attention_forward, attention_backward, moe_forward, moe_backward, job, plan):
    """Exposed expert-parallel all-to-all of one MoE layer and micro-batch (forward: dispatch and
    combine; backward: their gradients; each ``a2a`` seconds). ``moe_forward`` / ``moe_backward``:
    the whole MoE layer's compute; ``attention_forward`` / ``attention_backward``: its attention part
    (projections and core), the rest being the router, experts and elementwise kernels.

    Without overlap all four. With ``plan.ep_comm_overlap`` (Megatron-Core combined 1F1B,
    --overlap-moe-expert-parallel-comm; docs "Combined 1F1B: Expert-Parallel All-to-All Overlap") the
    forward of micro-batch i+1 and the backward of micro-batch i run layer by layer side by side, each
    all-to-all beside the other pass's block that does not wait on it: the backward's combine gradient
    beside the forward's attention, the forward's dispatch beside the backward's experts, the
    backward's dispatch gradient beside the forward's experts, the forward's combine beside the
    backward's attention. A paired pass exposes sum(max(0, a2a - window)) over those four windows plus
    the contention share of what they hide; the unpaired warm-up and cool-down passes
    (:func:`ep_unpaired_share`) expose all four. Memory is unchanged: while micro-batch i+1 saves layer
    l, micro-batch i has freed the layers above l, so a pair holds one micro-batch's activations."""
    plain = 4 * a2a
    overlap = np.asarray(getattr(plan, "ep_comm_overlap", False), dtype=bool)
    if not np.any(overlap):
        return plain
    windows = (attention_forward, moe_backward - attention_backward, moe_forward - attention_forward,
               attention_backward)
    hidden = sum(np.minimum(a2a, w) for w in windows)
    paired = sum(np.maximum(0.0, a2a - w) for w in windows) + EP_OVERLAP_CONTENTION * hidden
    u = ep_unpaired_share(job, plan)
    return np.where(overlap, u * plain + (1 - u) * paired, plain)


def layer_times(model, job, plan, curves, cluster) -> dict:
    """Per-layer, per-micro-batch times on one GPU, by term (seconds), averaged over the model's
    dense and MoE layers (weights: their counts)."""
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
    if share_moe:
        routed = routed_experts_forward_times(model, job, plan, curves)
        moe_f, moe_b = fwd_bwd(moe_mlp_forward_time(model, job, plan, curves, routed),
                               elementwise_forward_time(model, job, plan, curves, moe=True))
        moe_b = moe_b + routed_experts_wgrad_accumulation_time(model, job, plan, curves, routed)
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
    tp_comm = tp_exposed_time((ar + mlp_ar) * passes, attn_gemm + mlp_gemm, full, plan) \
        + op_sac_regather_time(model, job, plan, cluster) \
        + sp_backward_regather_time(model, job, plan, cluster, curves, attn_times, fc1_gemm)
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
            "cp_hidden_forward": cp_hidden_f, "cp_hidden_backward": cp_hidden_b}


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
    scaling = np.asarray(getattr(plan, "engine_code", Engine.GENERIC)) == Engine.SCALING
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


def stage_output_bytes(model, job, plan):
    """Bytes of the boundary activation b·(s/cp)·h one tp rank of a stage returns (a sequence shard,
    ÷ tp, under sequence parallelism)."""
    T = tokens_per_rank(job, plan)
    return T * model.hidden * element_bytes(plan) / np.where(np.asarray(plan.sp, dtype=bool), np.asarray(plan.tp, dtype=float), 1.0)


def p2p_time(model, job, plan, cluster):
    """One pipeline send/recv of a micro-batch's boundary activation, per tp rank (intra-node only
    when the whole pipeline fits in a node):

    * generic: the replicated output split over tp (Megatron-LM 2021's scatter-gather optimisation, the
      code of the published 2021 runs); under sequence parallelism the output is a sequence shard already;
    * Megatron-LM today (Megatron-Core) sends each stage's output as it is: schedules.get_tensor_shapes
      divides the sequence by tp only under sequence parallelism and p2p_communication has no
      scatter-gather (megatron/core/pipeline_parallel at NVIDIA/Megatron-LM 00c2c0a), so without sequence
      parallelism every tp rank sends the whole replicated activation;
    * Scaling likewise (PipeCommunicator.send_data, src/scaling/core/nn/parallel_module/communicator.py
      at 01b9d21);
    * DeepSpeed's PipelineEngine partitions what it sends over the tp group (``pipe_partitioned`` and
      ``grad_partitioned``, on by default with tp > 1: deepspeed/runtime/pipe/engine.py at 03f6f75,
      PartitionedTensor) and the receiver gathers it back (:func:`p2p_receive_gather_time`)."""
    out = stage_output_bytes(model, job, plan)
    t = np.asarray(plan.tp, dtype=float)
    engine = np.asarray(getattr(plan, "engine_code", Engine.GENERIC))
    sp = np.asarray(plan.sp, dtype=bool)
    as_it_is = (engine == Engine.SCALING) | (engine == Engine.MEGATRON)
    size = np.where(as_it_is, out, np.where(engine == Engine.DEEPSPEED, out / t, np.where(sp, out, out / t)))
    span = np.asarray(plan.tp) * plan.cp * plan.dp * plan.pp
    inside = span <= cluster.gpus_per_node
    intra, inter = cluster.links("pp")
    return np.where(inside, ring_time(SEND_RECV, size, 2, intra), ring_time(SEND_RECV, size, 2, inter))


def p2p_receive_gather_time(model, job, plan, cluster):
    """Seconds per crossing a receiving stage spends putting a partitioned transfer back together:
    DeepSpeed's PipelineEngine all-gathers the received activation (forward) or gradient (backward)
    over the tp group (``PartitionedTensor.full()``, deepspeed/runtime/pipe/engine.py at 03f6f75)
    before it can compute; 0 on the other engines and at tp = 1. (Megatron-LM's 2021 scatter-gather
    did the same; it is not priced, as before.)"""
    engine = np.asarray(getattr(plan, "engine_code", Engine.GENERIC))
    gathers = (engine == Engine.DEEPSPEED) & (np.asarray(plan.tp) > 1)
    if not np.any(gathers):
        return 0.0
    return np.where(gathers, tp_collective_time(ALL_GATHER, stage_output_bytes(model, job, plan), plan, cluster), 0.0)
