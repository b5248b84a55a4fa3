"""The attention core (QKᵀ, softmax, PV) of one layer for one micro-batch on one GPU.

With T = b·s/cp tokens on the rank, t = tp: fused (FlashAttention) at 4·b·(s/cp)·s·h/t FLOPs, halved by
the causal mask, backward 2.5 × forward (FlashAttention-2 recomputes QKᵀ and runs 5 GEMMs against 2);
unfused: batched GEMMs QKᵀ and PV plus scale-mask-softmax (fused or eager) and, for models trained with
it, dropout over the b·(a/t)·s_l·s scores (:func:`softmax_bytes_per_score`). A named fused kernel runs at
its measured efficiency (:func:`measured_attention_efficiency`; sliding-window and chunked layers as the
causal attentions they amount to). Ring context parallelism adds its per-step merge kernels
(:func:`ring_attention_merge_times`) to the core.
"""
from __future__ import annotations

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels.kernels import BYTES, _dtype, element_bytes, tokens_per_rank
from paraplan.engines import engine_flag, spec_of
from paraplan.plan import AttentionKernel, CpMode


def attention_occupancy(query_len, batch_heads, sms, tile_rows=128):
    """Share of its SMs' time a causal fused-attention kernel keeps busy: each (sequence, head) has
    n = ceil(query_len / tile_rows) query tiles, tile i visiting i + 1 key tiles, so the work is
    W = batch_heads · n(n + 1)/2 tile pairs over S SMs and the longest tile takes n; the kernel ends
    after max(n, W/S + n/4) (the last wave's causal imbalance). W/S over that. Few heads per GPU
    (tensor parallelism, long sequences at batch 1) leave SMs idle: on the H100 at 4k tokens, 4 / 8 /
    16 heads ran at 0.46 / 0.70 / 0.86 of the 64-head rate; this gives 0.52 / 0.82 / 0.93."""
    n = np.ceil(np.asarray(query_len, dtype=float) / tile_rows)
    work = np.asarray(batch_heads, dtype=float) * n * (n + 1) / 2 / sms
    return work / np.maximum(n, work + n / 4)


def engine_attention_kernel(plan, table):
    """The kernel code a plan's attention runs: the one it names, or, left to ``auto``, the one its
    engine picks where that is fixed. Megatron-LM runs Transformer Engine's DotProductAttention, whose
    backend selection gives its cuDNN FusedAttention preference over FlashAttention on Hopper and newer
    when both support the call ("Disabling FlashAttention to give FusedAttention preference on Hopper+
    for performance reasons": transformer_engine/pytorch/attention/dot_product_attention/utils.py,
    get_attention_backend, NVIDIA/TransformerEngine @ 002a3e5), so a Megatron plan on a generation
    whose measured table has ``cudnn`` runs that. torchtitan wraps torch SDPA in
    ``sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH], set_priority=True)``
    (torchtitan/models/attention.py, ScaledDotProductAttentionWrapper @ 0012170), so it runs cuDNN too.
    Other engines stay ``auto`` (torch SDPA's own backend order has changed between releases: cuDNN
    last from torch 2.5.1, pytorch/pytorch#138522, first on sm90/sm100 once the bundled cuDNN passed
    9.15). The engine's ``Behaviour.picks_cudnn_attention``."""
    kernel = np.asarray(getattr(plan, "attention_kernel_code", AttentionKernel.AUTO))
    auto = kernel == AttentionKernel.AUTO
    if "flash2" in table["kernels"]:            # DeepSpeed: FlashAttention-2 (DEEPSPEED_FLASH2_NOTE)
        kernel = np.where(auto & runs_flash2_attention(plan), int(AttentionKernel.FLASH2), kernel)
    if "cudnn" not in table["kernels"]:
        return kernel
    picks_cudnn = engine_flag(plan, "picks_cudnn_attention")
    return np.where(auto & picks_cudnn, int(AttentionKernel.CUDNN), kernel)


# DeepSpeed does not pick the attention kernel; the model code it trains does, and its long-sequence
# path runs FlashAttention-2: Megatron-DeepSpeed's --use-flash-attn-v2 (megatron/model/transformer.py,
# FlashSelfAttention over the flash-attn 2.x package's flash_attn_varlen_func), which its
# DeepSpeed-Ulysses example scripts set (examples_deepspeed/sequence_parallel/, microsoft/Megatron-DeepSpeed);
# Hugging Face models under DeepSpeed run attn_implementation="flash_attention_2" or torch SDPA, whose
# flash backend is FlashAttention-2 and which ranked cuDNN last from torch 2.5.1 (pytorch/pytorch#138522).
# On Hopper FlashAttention-2 reaches about a third of the bf16 peak at 16k-64k tokens (Dao 2023,
# arXiv:2307.08691, H100 figure: ~335 TFLOP/s forward + backward; the measured flash2 table), not the
# 0.40 that `auto` assumes for an unknown kernel, nor cuDNN's 0.55-0.57.
DEEPSPEED_FLASH2_NOTE = ("DeepSpeed runs FlashAttention-2 (Megatron-DeepSpeed --use-flash-attn-v2, as its "
                         "Ulysses examples set; torch SDPA's flash backend)")


def runs_flash2_attention(plan):
    """Per plan: whether its engine's ``auto`` attention is FlashAttention-2 (DeepSpeed: the note above)."""
    return engine_flag(plan, "auto_attention_is_flash2")


# FlashAttention 1.x (the flash-attn package before 2.0) runs the work FlashAttention-2 runs this many
# times slower (Dao 2023, arXiv:2307.08691, sec. 4.1: fitted_constants.yaml), on every generation: where
# the generation has a measured table the flash2 curve is the base, elsewhere its calibrated
# fused-attention efficiency (the kernels of the runs it was calibrated on: FlashAttention-2 or unnamed).
FLASH1_TIME_FACTOR = fitted("flash1_time_factor")


def flash1_factor(plan):
    """Fused-attention time over FlashAttention-2's: FLASH1_TIME_FACTOR where the plan names flash1, else 1."""
    kernel = np.asarray(getattr(plan, "attention_kernel_code", AttentionKernel.AUTO))
    return np.where(kernel == int(AttentionKernel.FLASH1), FLASH1_TIME_FACTOR, 1.0)


def measured_attention_efficiency(model, plan, curves, query_len, batch_heads):
    """Fused attention efficiency (share of the bf16 peak) of the kernel a plan runs
    (:func:`engine_attention_kernel`), from the generation's measured table (attention_kernels.yaml):
    interpolated in log2(sequence), scaled for head dims below 128 and by :func:`attention_occupancy`;
    NaN where the kernel is left to ``auto``; for flash1 its base, FlashAttention-2's (its time is
    FLASH1_TIME_FACTOR times that one's: :func:`flash1_factor`). None when the curves carry no table
    (that generation was not measured)."""
    table = getattr(curves, "attention_table", None)
    if not table:
        return None
    kernel = engine_attention_kernel(plan, table)
    kernel = np.where(kernel == int(AttentionKernel.FLASH1), int(AttentionKernel.FLASH2), kernel)   # its base
    seqs = np.log2(np.asarray(table["seq"], dtype=float))
    occupancy = attention_occupancy(query_len, batch_heads, curves.accelerator.streaming_multiprocessors,
                                    table.get("tile_rows", 128))
    head_share = float(np.clip((model.qk_head_dim - 64) / 64, 0.0, 1.0))
    eff = np.full(np.broadcast(kernel, occupancy).shape, np.nan)
    for label, curve in table["kernels"].items():
        factor = table.get("head_dim_64_factor", {}).get(label, 1.0)
        rate = np.interp(np.log2(np.asarray(query_len, dtype=float)), seqs, np.asarray(curve, dtype=float))
        rate = rate * (factor + (1 - factor) * head_share) * occupancy
        eff = np.where(kernel == int(AttentionKernel.parse(label)), rate, eff)
    calibrated = getattr(curves, "factor", None)       # a calibrated cluster's attention factor on the time
    return eff / calibrated("attention") if calibrated else eff


# Bytes per element of the score matrix that unfused attention's softmax streams (16-bit scores and
# probabilities; ×2 in fp32), forward and backward, and its kernels:
#   fused (Megatron-LM's FusedScaleMaskSoftmax, scaled_upper_triang_masked_softmax: scale, causal mask
#     and softmax in one kernel): forward reads the scores and writes the probabilities, 2 + 2;
#     backward reads the probabilities and their gradient and writes the scores' gradient, 2 + 2 + 2
#   eager (Scaling's MaskedSoftmaxTorch, src/scaling/core/nn/masked_softmax/masked_softmax.py at 01b9d21,
#     softmax_in_fp32 off by default): the scores are a view of the baddbmm output, so they are cloned
#     (2 + 2), masked in place with a broadcast boolean mask (2 + 1 + 2) and soft-maxed (2 + 2): 13;
#     backward: softmax's (2 + 2 + 2) and the mask fill's, which zeroes the masked gradient (2 + 1 + 2): 11
#   dropout on the probabilities (models trained with it: GPT-2/3, Megatron's GPT), a separate kernel
#     each way: forward writes the 1-byte mask, reads and writes the probabilities (1 + 2 + 2); backward
#     reads the gradient and the mask and writes the gradient (2 + 1 + 2). torch's dropout at p = 0
#     returns its input (no kernel), so dropout-free models (Llama) pay none.
# The fused path with dropout is 9 forward, 11 backward: the count used for every unfused plan before
# the eager softmax and dropout-free models had their own.
FUSED_SOFTMAX_BYTES = (4.0, 6.0)
EAGER_SOFTMAX_BYTES = (13.0, 11.0)
FUSED_SOFTMAX_KERNELS = (1, 1)
EAGER_SOFTMAX_KERNELS = (3, 2)
PROBS_DROPOUT_BYTES = (5.0, 5.0)


def softmax_bytes_per_score(model, plan):
    """((forward bytes, backward bytes), (forward kernels, backward kernels)) per 16-bit score element
    of unfused attention's softmax and, if the model trains with dropout, the dropout on its
    probabilities: fused or eager by ``plan.fused_softmax`` (see FUSED_SOFTMAX_BYTES)."""
    fused = np.asarray(getattr(plan, "fused_softmax", True), dtype=bool)
    dropout = 1.0 if getattr(model, "dropout", True) else 0.0
    nbytes = tuple(np.where(fused, f, e) + dropout * d
                   for f, e, d in zip(FUSED_SOFTMAX_BYTES, EAGER_SOFTMAX_BYTES, PROBS_DROPOUT_BYTES))
    kernels = tuple(np.where(fused, f, e) + dropout
                    for f, e in zip(FUSED_SOFTMAX_KERNELS, EAGER_SOFTMAX_KERNELS))
    return nbytes, kernels


def attention_head_dim(model) -> float:
    """The head dim a score's tensor work scales with: the mean of the query-key and value head dims
    (QK^T runs d_qk, PV d_v FLOPs per score and multiply)."""
    return (model.qk_head_dim + model.v_head_dim) / 2


def softmax_exp_factor(model, curves) -> float:
    """Fused attention time on the curves' part over its generation's, from the part's faster softmax
    exponentials (the curves' ``softmax_exp_time_factor`` at :func:`attention_head_dim`); 1 for curves
    without one (a measured profile) or a part that runs its generation's."""
    factor = getattr(curves, "softmax_exp_time_factor", None)
    return 1.0 if factor is None else factor(attention_head_dim(model))


def windowed_attention_equivalent(window, query_len, tile_rows=128):
    """(L, copies, share) for a sliding-window layer over ``query_len`` queries: a fused kernel runs it
    like ``copies`` causal attentions of L tokens per head, which take ``share`` of the time the causal
    attention over all queries takes at L's efficiency.

    The kernel tiles queries and keys by ``tile_rows`` (n = ceil(s / tile_rows) query tiles); under a
    window of w keys query tile i visits min(i, p) key tiles, p = ceil(w / tile_rows) + 1 (at most n),
    P_w = p(p + 1)/2 + (n - p)·p tile pairs in all, where causal attention over n tiles visits
    n(n + 1)/2. A causal sequence of m = min(2p - 1, n) tiles visits as many key tiles per query tile on
    average as the window's do: the windowed layer is P_w / (m(m + 1)/2) such sequences of L = m·tile_rows
    tokens, FLOPs share (copies·L²) / s² of the whole causal problem. A window as long as the sequence
    gives (s, 1, 1); a 128-key window at 4k tokens (63 tile pairs) is 10.5 causal attentions of 384
    tokens (run at the measured table's efficiency for those, not at the 4k one)."""
    s = np.asarray(query_len, dtype=float)
    n = np.ceil(s / tile_rows)
    p = np.minimum(np.ceil(np.asarray(window, dtype=float) / tile_rows) + 1, n)
    pairs = p * (p + 1) / 2 + (n - p) * p
    m = np.minimum(2 * p - 1, n)
    copies = pairs / (m * (m + 1) / 2)
    length = np.minimum(m * tile_rows, s)
    return length, copies, copies * length ** 2 / s ** 2


def windowed_attention_efficiency(model, plan, curves, query_len, batch_heads):
    """(L, share, efficiency) of a model's sliding-window layers on the measured table: the equivalent
    causal length and the time share of :func:`windowed_attention_equivalent`, and the kernel's measured
    efficiency for its copies of causal attention over L tokens (the table starts at 1k tokens: shorter
    equivalents, as a 128-key window's 384, take its 1k figure, an upper bound)."""
    tile = curves.attention_table.get("tile_rows", 128)
    length, copies, share = windowed_attention_equivalent(model.sliding_window, query_len, tile)
    eff = measured_attention_efficiency(model, plan, curves, length, batch_heads * copies)
    return length, share, eff


def chunked_attention_efficiency(model, plan, curves, query_len, batch_heads):
    """(L, share, efficiency) of a model's chunked-attention layers on the measured table: each chunk is
    a causal attention of L = min(chunk, queries) tokens, query_len / L of them per head (a varlen kernel's
    or a block-diagonal mask's work), which take L / query_len of the causal attention over all queries,
    at the kernel's measured efficiency for L tokens and that many more heads."""
    s = np.asarray(query_len, dtype=float)
    length = np.minimum(float(model.attention_chunk), s)
    copies = s / length
    eff = measured_attention_efficiency(model, plan, curves, length, batch_heads * copies)
    return length, length / s, eff


def attention_kernel_shape(model, job, plan):
    """(queries per sequence, sequences x heads) one fused-attention kernel sees on a rank, what its
    measured efficiency is read at: ring context parallelism (and cp = 1) runs each rank's s/cp queries
    over the b·h/tp heads of its tensor-parallel shard; DeepSpeed-Ulysses' all-to-all hands each rank
    the whole sequence of h/(tp·cp) heads (Jacobs et al. 2023, arXiv:2309.14509, sec. 3.1), so its
    kernel runs all s queries over b·h/(tp·cp) heads. The FLOPs are the same; the efficiency is not:
    at 8k tokens and cp 8 Ulysses' kernel runs at the 8k rate, not the 1k one."""
    b = plan.micro_batch
    t = np.asarray(plan.tp, dtype=float)
    c = np.asarray(plan.cp, dtype=float)
    ulysses = (c > 1) & (np.asarray(plan.cp_mode_code) == CpMode.ULYSSES)
    s_l = tokens_per_rank(job, plan) / b
    query_len = np.where(ulysses, float(job.seq_len), s_l)
    heads = np.where(ulysses, b * model.heads / (t * c), b * model.heads / t)
    return query_len, heads


def attention_core_times(model, job, plan, curves):
    """(forward, backward) time of the attention core (QKᵀ, softmax, PV) for one micro-batch.
    Fused: at the generation's calibrated efficiency, or, where the plan names a kernel, its
    measured efficiency at this sequence length and these heads per GPU; on a part whose softmax
    exponentials run faster than its generation's (Blackwell Ultra), scaled by the curves'
    ``softmax_exp_time_factor`` at the mean of the query-key and value head dims."""
    b, s = plan.micro_batch, job.seq_len
    s_l = tokens_per_rank(job, plan) / b
    t = np.asarray(plan.tp, dtype=float)
    dt = _dtype(plan)
    # fused: causal mask halves the executed work
    window = model.attention_keys_per_query(s, causal_halved=True) / (s / 2)   # 1 without a window or chunks
    flops_fwd = 2.0 * b * s_l * s * (model.q_hidden + model.attn_out_hidden) / t / 2 * window
    fused_f = curves.flash_attention_time(flops_fwd, dt)
    fused_b = curves.flash_attention_time(2.5 * flops_fwd, dt)
    q_len, heads_gpu = attention_kernel_shape(model, job, plan)
    eff = measured_attention_efficiency(model, plan, curves, q_len, heads_gpu)
    if eff is not None:
        named = ~np.isnan(eff)
        # full layers at the whole query length's efficiency; windowed ones as the causal attentions of
        # equal key tiles per query tile they amount to (windowed_attention_equivalent)
        peak = curves.tensor_peak(dt)    # the part's power-limited clock included
        full_flops = flops_fwd / window
        share, chunked = model.windowed_layer_share, model.chunked_layer_share
        seconds_per_flop = (1 - share - chunked) / (peak * np.where(named, eff, 1.0))
        if share:   # time_share is of the causal attention over the kernel's q_len queries: q_len/s of full_flops
            _, time_share, eff_w = windowed_attention_efficiency(model, plan, curves, q_len, heads_gpu)
            seconds_per_flop = seconds_per_flop + share * time_share * (q_len / s) / (peak * np.where(named, eff_w, 1.0))
        if chunked:  # likewise: chunks of causal attention (chunked_attention_efficiency)
            _, time_share, eff_c = chunked_attention_efficiency(model, plan, curves, q_len, heads_gpu)
            seconds_per_flop = seconds_per_flop + chunked * time_share * (q_len / s) / (peak * np.where(named, eff_c, 1.0))
        named_f = curves.kernel_overhead_s + full_flops * seconds_per_flop
        fused_f = np.where(named, named_f, fused_f)
        fused_b = np.where(named, curves.kernel_overhead_s + 2.5 * (named_f - curves.kernel_overhead_s), fused_b)
    f = softmax_exp_factor(model, curves)   # a part whose softmax exponentials outrun its generation's
    f = f * flash1_factor(plan)             # FlashAttention 1.x: half FlashAttention-2's rate
    fused_f, fused_b = fused_f * f, fused_b * f
    # unfused: batched GEMMs over all heads of the rank, full (masked) score matrix
    heads_rank = b * model.heads / t
    qk = curves.gemm_time(s_l * heads_rank, s, model.qk_head_dim, dt)
    pv = curves.gemm_time(s_l * heads_rank, model.v_head_dim, s, dt)
    scores = heads_rank * s_l * s
    wide = element_bytes(plan) / BYTES
    (bytes_f, bytes_b), (kernels_f, kernels_b) = softmax_bytes_per_score(model, plan)
    unfused_f = qk + pv + curves.memory_time(bytes_f * wide * scores, kernels=kernels_f)
    unfused_b = 2 * (qk + pv) + curves.memory_time(bytes_b * wide * scores, kernels=kernels_b)
    flash = np.asarray(plan.flash_attention, dtype=bool)
    return np.where(flash, fused_f, unfused_f), np.where(flash, fused_b, unfused_b)


# Ring attention merges each step's partial result into the running one with memory-bound kernels
# (Transformer Engine, transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
# AttnFuncWithCPAndKVP2P): forward, per step, flash_attn_fwd_out_correction reads the step's output
# and the running output and writes it back (3 accesses per element of b·(s/cp)·h_q/tp, 2 bytes each in
# 16-bit training) after a softmax-statistics correction; backward, per step, dq.add_(dq_) over the
# queries and dkv.add_(dkv_) over the K and V chunk (3 accesses per element each). With the causal load
# balancing (each rank holds chunks i and 2cp-1-i) the steps beyond a rank's own position touch only half
# of its queries, so a rank streams on average (3·cp + 1)/4 full-size passes.
RING_MERGE_ACCESSES_PER_ELEMENT = 3
RING_MERGE_KERNELS_PER_STEP = 2


def ring_attention_merge_times(model, job, plan, curves):
    """(forward, backward) seconds of ring attention's per-step merge kernels for one layer and
    micro-batch: forward 3e·T·h_q/tp, backward 3e·T·(h_q + 2·h_kv)/tp bytes per pass, (3·cp+1)/4 passes
    (RING_MERGE_ACCESSES_PER_ELEMENT = 3, e = :func:`element_bytes`; T = b·s/cp tokens on the rank);
    0 without ring context parallelism (cp = 1 or Ulysses, whose all-to-alls hand each rank whole heads)."""
    c = np.asarray(plan.cp, dtype=float)
    t = np.asarray(plan.tp, dtype=float)
    T = tokens_per_rank(job, plan)
    passes = (3 * c + 1) / 4
    per_element = RING_MERGE_ACCESSES_PER_ELEMENT * element_bytes(plan)
    kernels = RING_MERGE_KERNELS_PER_STEP * c
    fwd = curves.memory_time(per_element * passes * T * model.attn_out_hidden / t, kernels=kernels)
    bwd = curves.memory_time(per_element * passes * T * (model.q_hidden + model.kv_hidden + model.v_hidden) / t,
                             kernels=kernels)
    ring = (c > 1) & (np.asarray(plan.cp_mode_code) != CpMode.ULYSSES)
    return np.where(ring, fwd, 0.0), np.where(ring, bwd, 0.0)


FUSED_ATTENTION_ASSUMPTION = ("fused attention: causal mask halves the executed attention work; unfused: full score "
                              "matrix plus the softmax's traffic (fused kernel, or eager ops with --no-fused-softmax) and "
                              "dropout's for models trained with it")


def fused_attention_assumption(**_) -> tuple[str, ...]:
    """How :func:`attention_core_times` prices the core, fused or not."""
    return (FUSED_ATTENTION_ASSUMPTION,)


def attention_kernel_assumption(model, job, plan, curves, **_) -> tuple[str, ...]:
    """What a plan that names its attention kernel is priced at: the measured efficiency at its
    sequence length and heads per GPU, or, where the generation has no measured table, the
    calibrated one (said, so the choice is not silently ignored)."""
    if not plan.flash_attention:
        return ()
    b = plan.micro_batch
    query_len, heads = (float(v) for v in attention_kernel_shape(model, job, plan))
    eff = measured_attention_efficiency(model, plan, curves, query_len, heads)
    windowed = ""
    if model.windowed_layer_share and eff is not None and not np.isnan(float(eff)):
        length, _, eff_w = windowed_attention_efficiency(model, plan, curves, query_len, heads)
        windowed = (f"; its {model.sliding_window}-key sliding-window layers run as causal attention over "
                    f"{float(length):.0f} tokens (the same key tiles per query tile) at {float(eff_w):.3f}")
    if model.chunked_layer_share and eff is not None and not np.isnan(float(eff)):
        length, _, eff_c = chunked_attention_efficiency(model, plan, curves, query_len, heads)
        windowed += (f"; its chunked-attention layers run as causal attentions over {float(length):.0f}-token "
                     f"chunks at {float(eff_c):.3f}")
    if plan.attention_kernel == "auto":
        if eff is None or np.isnan(float(eff)):
            return ()
        if bool(runs_flash2_attention(plan)):
            return (f"attention: auto: {DEEPSPEED_FLASH2_NOTE}: flash2 at {float(eff):.3f} of peak, measured by "
                    f"sequence length (attention_kernels.yaml) at {job.seq_len} tokens and "
                    f"{b * model.heads // plan.tp} heads per GPU{windowed}",)
        who = spec_of(plan).behaviour.cudnn_attention_note    # an engine that picks cuDNN: it measured
        return (f"attention: auto on {who}: cudnn at {float(eff):.3f} of peak, measured by sequence length "
                f"(attention_kernels.yaml) at {job.seq_len} tokens and {b * model.heads // plan.tp} heads per GPU"
                f"{windowed}",)
    if plan.attention_kernel == "flash1":
        base = ("its calibrated fused-attention efficiency "
                f"({getattr(curves, 'flash_attention_efficiency', 'profiled')})" if eff is None else
                f"FlashAttention-2's measured {float(eff):.3f} of peak at {job.seq_len} tokens{windowed}")
        return (f"attention: flash1 (FlashAttention 1.x) at 1/{FLASH1_TIME_FACTOR:g} of {base}: FlashAttention-2 "
                "runs the same work about 2x faster (Dao 2023, arXiv:2307.08691, sec. 4.1)",)
    if eff is None:
        return (f"attention: no measured {plan.attention_kernel} table for this accelerator; priced at its "
                f"calibrated fused-attention efficiency ({getattr(curves, 'flash_attention_efficiency', 'profiled')})",)
    return (f"attention: {plan.attention_kernel} at {float(eff):.3f} of peak, measured by sequence length "
            f"(attention_kernels.yaml) at {job.seq_len} tokens and {b * model.heads // plan.tp} heads per GPU"
            f"{windowed}",)


def softmax_exp_assumption(model, plan, curves, **_) -> tuple[str, ...]:
    """Said where a part runs the softmax's exponentials faster than its generation (Blackwell Ultra):
    by how much its fused attention is priced faster than its generation's."""
    f = softmax_exp_factor(model, curves)
    if f == 1.0 or not plan.flash_attention:
        return ()
    return (f"attention: this part runs the softmax's exponentials {curves.attention_exp_speedup:g}x as fast as its "
            f"generation (Blackwell Ultra's SFU): fused attention priced {1 / f:.2f}x faster than on a B200/GB200 "
            f"at head dim {attention_head_dim(model):g} (curves.yaml attention_exp_speedup)",)
