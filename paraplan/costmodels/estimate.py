"""``estimate(model, job, cluster, plan) -> Estimate``: the one function everything calls.

Puts the cost models together for one plan:
  step = compute + recompute + grad_accumulation + tp_comm + cp_comm + ep_comm + moe_host + pp_bubble + pp_comm
         + dp_comm + optimizer + offload
with compute, recompute, tp and cp charged per micro-batch on the slowest stage (the last with
the LM head, or with uneven stages a middle one holding more layers: ``paraplan.plan.stage_layers``),
the bubble from the schedule (pipeline.py) over the largest stage, exposed data-parallel/ZeRO traffic (dataparallel.py),
the optimizer step and offload transfers (offload.py). Memory per GPU is the largest of the first,
the largest middle and the last pipeline stage (memory.py). Every term and the assumptions travel with the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Union

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels import compute as C
from paraplan.costmodels import memory as M
from paraplan.costmodels.attention import (FLASH1_TIME_FACTOR, attention_head_dim, chunked_attention_efficiency,
                                           measured_attention_efficiency, softmax_exp_factor,
                                           windowed_attention_efficiency)
from paraplan.costmodels.dataparallel import (OVERLAP_CONTENTION, add_traffic, compressed_phase_factor, deepspeed_exposed,
                                              dp_exposed, dp_traffic, expert_tp_replica_allreduce_time)
from paraplan.costmodels.efficiency import curves_for, with_reference_block
from paraplan.costmodels.fp8 import tp_gathers_fp8
from paraplan.costmodels.intervals import describe_interval
from paraplan.costmodels.kernels import (device_is_host, element_bytes, megatron_grad_bytes, micro_batches,
                                         tokens_per_rank)
from paraplan.costmodels.moe import (EP_OVERLAP_CONTENTION, EXPERT_BIAS_BYTES_PER_COPY_BACKWARD,
                                     EXPERT_BIAS_BYTES_PER_COPY_FORWARD, MOE_HOST_SECONDS_PER_LAYER,
                                     dispatch_bytes_per_token, ep_unpaired_share, expert_holders_per_token,
                                     megatron_expert_biases, moe_expert_bias_times, moe_host_floor_applies,
                                     routed_expert_gemms, routed_experts_wgrad_accumulation_time, sorts_received_chunks)
from paraplan.costmodels.offload import activation_offload_time, optimizer_and_offload, param_tensors, stage_param_tensors
from paraplan.costmodels.p2p import p2p_receive_gather_time, p2p_time
from paraplan.costmodels.pipeline import (bubble_factor, bubble_fraction, effective_compute_slowdown, overlapped_p2p_crossings,
                                         p2p_messages_on_critical_path, pipeline_crossings_on_critical_path)
from paraplan.costmodels.tpcomm import TP_OVERLAP_CONTENTION
from paraplan.engines import engine_flag, spec_of
from paraplan.plan import (Plan, Recompute, StageLayers, check_plan, compute_dtype, expert_data_parallel, gemm_dtype,
                           is_fp8, model_stage_layers, recomputes_attention_core, stage_layer_counts)

SCHEMA = "paraplan.estimate/1"
TIME_TERMS = ("compute", "recompute", "grad_accumulation", "tp_comm", "cp_comm", "ep_comm", "moe_host", "pp_comm",
              "pp_bubble", "dp_comm", "optimizer", "offload")
MEMORY_TERMS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "allocator")
RUNTIME_RESERVED_BYTES = fitted("runtime_reserved")


def on_cuda(cluster) -> bool:
    """Whether the device runs the CUDA runtime and caching allocator (not a profiled CPU)."""
    return not device_is_host(cluster)


def runtime_reserved_bytes(cluster) -> float:
    """The per-GPU runtime reserve: none for a profiled CPU device (no CUDA context or NCCL)."""
    return RUNTIME_RESERVED_BYTES if on_cuda(cluster) else 0.0


FLOP_CONVENTION = ("model FLOPs = 3 x forward FLOPs (2 per multiply-add) of all weight GEMMs, attention "
                   "scores QK^T and PV counted in full (causal mask not halved) and the logits; recomputation "
                   "excluded (PaLM App. B, Korthikanti et al. 2022). HFU adds the recomputed forward FLOPs. "
                   "MFU and HFU are against the dense peak of the plan's dtype (bf16 for fp8 plans, as NeMo, "
                   "Megatron-Bridge and torchtitan report them).")
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
FP8_TP_GATHER = ("fp8: sequence parallelism casts the attention and MLP inputs (and, backward, the row-parallel "
                 "output gradients) on their sequence shard and all-gathers them in fp8 (torchtitan's float8 tensorwise "
                 "TP; Transformer Engine's LayerNormLinear and grad-output gathers); the reduce-scatters, the LM head's "
                 "and an MoE dispatcher's gathers stay 16-bit (fp8.tp_gathers_fp8)")
FP8_ROWWISE_BACKWARD = ("fp8-rowwise (torchao): the forward GEMMs run row-scaled; the two backward GEMMs run the "
                        "per-tensor cuBLAS kernel without fast accumulation and a separate kernel rescales each output "
                        "(read and written once more at 16 bits; torchtitan's wq, wk, wv and w1, w3 each write their own "
                        "input gradient): fp8.fp8_rowwise_rescale_time")
STATES_16BIT = ("16-bit weights, gradients and activations; Adam with fp32 master weights, momentum, variance "
                "(16 bytes/param before ZeRO)")
TP_EXPOSED_ASSUMPTION = "tensor-parallel collectives are exposed (no TP comm overlap); backward = 2 x forward GEMM time"
DP_OVERLAP_ASSUMPTION = ("data-parallel gradient reduction is bucketed and overlaps the last micro-batch's backward; "
                         "ZeRO-3 gathers are prefetched under each micro-batch's compute; dense and expert collectives "
                         "share those windows, which include the time the GPU idles at a dropless MoE layer's sync and "
                         "exclude the time an inter-node ring-attention exchange holds the links")
ASSUMPTIONS = (
    STATES_16BIT,
    "ranks ordered tp, cp, dp, pp (tp innermost): groups fill a node before spanning nodes",
    TP_EXPOSED_ASSUMPTION,
    DP_OVERLAP_ASSUMPTION,
    "1 GiB-class runtime reserve (CUDA context, NCCL, cuBLAS workspaces) of 1.5 GiB per GPU (none on a profiled "
    "CPU device)",
    "fused attention: causal mask halves the executed attention work; unfused: full score matrix plus the softmax's "
    "traffic (fused kernel, or eager ops with --no-fused-softmax) and dropout's for models trained with it",
)


#: the first assumption for plans that train in fp32 (the CPU validation harness)
FP32_STATES = ("fp32 weights, gradients and activations; Adam keeps fp32 momentum and variance, no master copy "
               "(16 bytes/param before ZeRO: 4 + 4 + 8)")


# What replaces TP_EXPOSED_ASSUMPTION for a plan that overlaps its TP collectives, and DP_OVERLAP_ASSUMPTION
# for one that does not overlap its data-parallel reduction
TP_OVERLAP_ASSUMPTION = ("tensor-parallel collectives overlap the GEMMs next to them (Megatron --tp-comm-overlap: "
                         "forward and backward; torchtitan async TP: the forward's only), the hidden part slowing "
                         f"those GEMMs by {TP_OVERLAP_CONTENTION} of its time; backward = 2 x forward GEMM time")
DP_NO_OVERLAP_ASSUMPTION = ("data-parallel gradient reduction runs after the backward and ZeRO-3's gathers are "
                            "not prefetched: nothing hidden (overlap_grad_reduce off)")
SCALING_DP_ASSUMPTION = ("data-parallel reduction as Scaling runs it (engine scaling): an fp32 all-reduce of every "
                         "gradient, then with ZeRO-1 the parameter all-gather, both inside the optimizer step after the "
                         "backward, exposed")


TORCHTITAN_COMPILED_BLOCKS = ("torchtitan: every transformer block compiled (torch.compile; the export sets "
                              "training.compile), its wq, wk, wv and w1, w3 separate linears priced as separate "
                              "GEMMs, each no faster than moving its operands once (thin key / value projections "
                              "under tp are memory-bound), and their input gradients summed in the backward "
                              "(compute.separate_input_gradient_sum_time)")


def assumptions_for(plan) -> tuple[str, ...]:
    """The assumptions printed with one plan's estimate: the defaults, the fp32 states in place of
    the 16-bit ones for fp32 training, the plan's own TP / DP overlap where it departs from the
    defaults, and the fp8 recipe's under fp8."""
    swap = {STATES_16BIT: FP32_STATES if plan.dtype == "fp32" else STATES_16BIT,
            TP_EXPOSED_ASSUMPTION: TP_OVERLAP_ASSUMPTION if getattr(plan, "tp_comm_overlap", False)
            else TP_EXPOSED_ASSUMPTION,
            DP_OVERLAP_ASSUMPTION: SCALING_DP_ASSUMPTION if engine_flag(plan, "reduces_in_optimizer_step")
            else DP_NO_OVERLAP_ASSUMPTION if not plan.overlap_grad_reduce else DP_OVERLAP_ASSUMPTION}
    base = tuple(swap.get(a, a) for a in ASSUMPTIONS)
    fp8_tp = (FP8_TP_GATHER,) if bool(np.all(tp_gathers_fp8(plan))) else ()
    rowwise = (FP8_ROWWISE_BACKWARD,) if plan.dtype == "fp8-rowwise" else ()
    titan = (TORCHTITAN_COMPILED_BLOCKS,) if engine_flag(plan, "compiled_blocks") else ()
    return base + titan + (FP8_ASSUMPTIONS if is_fp8(plan.dtype) else ()) + rowwise + fp8_tp


def pipeline_p2p_time(model, job, plan, cluster, m, t_micro_fwd, t_micro_bwd):
    """Seconds per step of pipeline transfers on the critical path (``pp_comm``): every transfer
    (:func:`p2p_messages_on_critical_path`) at :func:`p2p.p2p_time` P, and DeepSpeed's receive-side
    gathers, except the steady-state crossings Megatron-Core's interleaved schedule overlaps
    (:func:`overlapped_p2p_crossings`, 2·m·v). There each iteration runs one model chunk's forward and
    one's backward, W = (t_micro_fwd + t_micro_bwd) / v (``t_micro_bwd`` with recomputation and, from
    the caller, a host-bound MoE layer's wait for the host, when the links are free, as for the
    data-parallel windows), while its two transfers (an activation to the next stage, a gradient to the
    previous one, on different links) run beside it: the iteration takes max(W, P) and each transfer's
    hidden part slows the compute by OVERLAP_CONTENTION of its duration (as a data-parallel
    collective's does), so m·v · (max(0, P − W) + 2·OVERLAP_CONTENTION·min(P, W)) shows."""
    p2p = p2p_time(model, job, plan, cluster)
    iterations = overlapped_p2p_crossings(plan, m) / 2
    window = (t_micro_fwd + t_micro_bwd) / np.asarray(plan.vpp, dtype=float)
    overlapped = iterations * (np.maximum(0.0, p2p - window) + 2 * OVERLAP_CONTENTION * np.minimum(p2p, window))
    return ((p2p_messages_on_critical_path(plan, m) - 2 * iterations) * p2p + overlapped
            + pipeline_crossings_on_critical_path(plan, m) * p2p_receive_gather_time(model, job, plan, cluster))


def pipeline_transfer_assumption(plan) -> tuple[str, ...]:
    """How a pipelined plan's stage-to-stage transfers are priced, said with its estimate."""
    if plan.pp <= 1:
        return ()
    if float(overlapped_p2p_crossings(plan, 1)) > 0:
        return ("pipeline transfers: the interleaved schedule's steady-state sends and receives overlap the next "
                "model chunks' compute (Megatron-Core overlap_p2p_comm, on with virtual stages); fill and drain "
                "transfers are exposed",)
    return ("pipeline transfers: every send and receive between stages is on the critical path (no overlap with "
            "compute in this engine and schedule)",)


def qk_norm_assumption(model) -> tuple[str, ...]:
    """What a QK-norm model (Qwen3) adds, said with its estimate: the per-head query and key RMSNorms."""
    if not getattr(model, "qk_norm", False):
        return ()
    return (f"QK-norm: an RMSNorm over each of the {model.heads} query and {model.kv_heads} key heads after the "
            "projection; its input (q and k before the norm) kept for backward unless the layer is recomputed, "
            "its bytes streamed with the layer's other norms",)


def attention_kernel_assumption(model, job, plan, curves) -> tuple[str, ...]:
    """What a plan that names its attention kernel is priced at: the measured efficiency at its
    sequence length and heads per GPU, or, where the generation has no measured table, the
    calibrated one (said, so the choice is not silently ignored)."""
    if not plan.flash_attention:
        return ()
    b = plan.micro_batch
    query_len, heads = tokens_per_rank(job, plan) / b, b * model.heads / plan.tp
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


def softmax_exp_assumption(model, plan, curves) -> tuple[str, ...]:
    """Said where a part runs the softmax's exponentials faster than its generation (Blackwell Ultra):
    by how much its fused attention is priced faster than its generation's."""
    f = softmax_exp_factor(model, curves)
    if f == 1.0 or not plan.flash_attention:
        return ()
    return (f"attention: this part runs the softmax's exponentials {curves.attention_exp_speedup:g}x as fast as its "
            f"generation (Blackwell Ultra's SFU): fused attention priced {1 / f:.2f}x faster than on a B200/GB200 "
            f"at head dim {attention_head_dim(model):g} (curves.yaml attention_exp_speedup)",)


def gemm_level_assumption(plan, curves) -> tuple[str, ...]:
    """The GEMM rate the estimate charges and where it comes from (analytical curves only; a measured
    profile's tables speak for themselves): the part's MAMF plateau of the plan's GEMM dtype, times the
    share of it a training step sustains (curves.yaml, calibrated per generation on published runs),
    less wave quantization."""
    if getattr(curves, "kind", "") != "analytical":
        return ()
    acc = curves.accelerator
    dtype = gemm_dtype(plan.dtype)
    basis = str(curves.sources.get("gemm_sustained_fraction", "")).split(":")[0] or "curves.yaml"
    if curves.gemm_level_borrowed:
        basis += "; assumed for this part, which has no calibration of its own"
    caveat = f"; {curves.caveat}" if curves.caveat else ""
    factor = acc.power_limited_clock_factor()
    power = (f", and GEMMs and fused attention at {factor:.3f} of the rated clock (a {acc.power_limit_w:g} W power "
             f"limit against the {acc.rated_power_w:g} W the plateau was measured at: (limit / rated)^(1/3), an "
             f"estimate from dynamic power ~ V^2 f)" if factor != 1.0 else "")
    return (f"GEMMs: {acc.plateau(dtype):.3f} of the {dtype} peak at best shape (MAMF) x "
            f"{curves.gemm_sustained_fraction:g} sustained in a training step ({basis}), less wave quantization "
            f"of {curves.gemm_wave_units} over {acc.streaming_multiprocessors} SMs{power}{caveat}",)


def moe_host_assumption(model, plan) -> tuple[str, ...]:
    """Said when the plan's MoE layers carry the host-bound floor (moe.MOE_HOST_SECONDS_PER_LAYER)."""
    if not bool(np.any(moe_host_floor_applies(model, plan))):
        return ()
    return (f"MoE: Megatron-Core's dropless dispatch waits for per-expert token counts on the host in every MoE "
            f"layer, so a layer takes at least {1e3 * MOE_HOST_SECONDS_PER_LAYER:.1f} ms per micro-batch "
            f"(forward + backward, host-bound; read from one calibration row); a capacity factor (token drop "
            f"and pad) removes the wait",)


def expert_wgrad_assumption(model, job, plan, curves) -> tuple[str, ...]:
    """Said when the routed experts' fused gradient accumulation binds their weight-gradient GEMMs
    (moe.routed_experts_wgrad_accumulation_time > 0)."""
    if model.moe is None:
        return ()
    extra = float(np.max(routed_experts_wgrad_accumulation_time(model, job, plan, curves)))
    if extra <= 0:
        return ()
    m = float(np.max(routed_expert_gemms(model, job, plan)[0]))
    g = float(np.max(megatron_grad_bytes(plan)))
    return (f"MoE: the routed experts' weight-gradient GEMMs accumulate into {'fp32' if g >= 4 else 'bf16'} main "
            f"gradients (gradient-accumulation fusion), {g:.0f} bytes read and {g:.0f} written per weight; with "
            f"{m:.0f} tokens per expert they are bound by those bytes: +{1e3 * extra:.2f} ms per MoE layer and "
            f"micro-batch over a forward-shaped wgrad (a larger micro-batch or more expert parallelism gives each "
            f"expert more tokens)",)


def moe_dispatch_assumption(model, job, plan) -> tuple[str, ...]:
    """Said for an MoE model whose tokens are permuted to the experts (moe.dispatch_bytes_per_token,
    moe.flex_dispatch_time)."""
    if model.moe is None or model.moe.dispatch != "permute":
        return ()
    per_token = float(np.max(dispatch_bytes_per_token(model, job, plan)))
    if getattr(plan, "moe_flex_dispatch", False):
        e = model.moe
        gpus = float(np.max(expert_holders_per_token(e, e.experts / max(plan.ep, 1))))
        routing = (f"uniform routing within {e.router_group_top_k} of {e.router_groups} expert groups, the model's "
                   f"group-limited router" if e.group_limited else "uniform routing")
        return (f"MoE: DeepEP / HybridEP dispatch (flex): a token crosses once to each node and GPU holding one of "
                f"its experts ({gpus:.1f} of the {plan.ep} expert-parallel GPUs on average, {routing}) instead "
                f"of once per routed copy ({e.top_k} a token); the arrivals are permuted into expert order and "
                f"back, {per_token / model.hidden:.0f} x hidden bytes per token and layer forward, twice that "
                f"backward; the SMs and buffers the kernels hold are not priced",)
    sort = bool(np.any(sorts_received_chunks(model, plan)))
    flex_ok = plan.ep > 1 and spec_of(plan).offers("moe_flex_dispatch")
    return (f"MoE: the token permutation streams {per_token / model.hidden:.0f} x hidden bytes per token and "
            f"layer forward, twice that backward (Megatron-Core's all-to-all dispatcher: permute, "
            f"{'regroup by local expert and back, ' if sort else ''}unpermute, the router weights applied in the experts' activation; "
            f"torchtitan's passes alike){'; --moe-flex-dispatch prices DeepEP / HybridEP instead' if flex_ok else ''}",)


def expert_bias_assumption(model, job, plan, curves) -> tuple[str, ...]:
    """Said where Megatron-Core adds a biased model's expert biases outside the GEMMs
    (moe.moe_expert_bias_times)."""
    if not bool(np.any(megatron_expert_biases(model, plan))):
        return ()
    f, b = (1e3 * float(np.max(x)) for x in moe_expert_bias_times(model, job, plan, curves))
    return (f"MoE with linear biases on Megatron-Core: TEGroupedMLP adds each expert's output bias, scaled by the "
            f"router probability, in an eager loop after the grouped GEMM ({EXPERT_BIAS_BYTES_PER_COPY_FORWARD} x "
            f"hidden bytes per routed copy forward, {EXPERT_BIAS_BYTES_PER_COPY_BACKWARD} backward) and refuses the "
            f"fused bias-dropout-add: {f:.2f} ms forward and {b:.2f} ms backward per MoE layer and micro-batch",)


def ep_overlap_assumption(job, plan) -> tuple[str, ...]:
    """Said when the plan overlaps its expert-parallel all-to-alls (moe.ep_exposed_time)."""
    if not getattr(plan, "ep_comm_overlap", False):
        return ()
    u = float(ep_unpaired_share(job, plan))
    return (f"MoE: combined 1F1B pairs each micro-batch's forward with another's backward, layer by layer; a "
            f"paired pass hides its dispatch/combine all-to-alls under the other direction's compute (the hidden "
            f"part still costs {100 * EP_OVERLAP_CONTENTION:.0f} % of its duration), and the {100 * u:.1f} % of "
            f"passes left unpaired (warm-up and cool-down) expose theirs",)


def megatron_fsdp_assumption(plan) -> tuple[str, ...]:
    """What a Megatron-LM plan at ZeRO-2/3 runs: Megatron-FSDP (memory.model_state_bytes, buffer_bytes), the
    sharding strategy its spec's export maps the stage to."""
    export = spec_of(plan).export
    strategy = export.fsdp_strategy.get(plan.zero) if export is not None else None
    if strategy is None:
        return ()
    return (f"ZeRO-{plan.zero} on Megatron-LM is Megatron-FSDP (--use-megatron-fsdp, --data-parallel-sharding-strategy "
            f"{strategy}): main_grad{' and 16-bit parameters' if plan.zero == 3 else ''} sharded over dp x cp, "
            "gathered and reduced per layer in persistent double buffers (--fsdp-double-buffer: two layers' "
            "gradients" + (" and parameters" if plan.zero == 3 else "") + ", counted in buffers)",)


def host_link_assumption(plan, cluster) -> tuple[str, ...]:
    """The link an offloading plan's transfers take (offload.py prices them on System.host_link_bytes_per_s)."""
    if plan.offload == "none" and not plan.offload_activation_layers:
        return ()
    s = cluster.system
    return (f"offload transfers take each GPU's host link, {s.host_link_name} at {s.host_link_bytes_per_s / 1e9:.0f} GB/s per "
            "direction (sustained), hidden under the passes where the timeline allows",)


def deepspeed_dp_assumption(plan) -> tuple[str, ...]:
    """What a DeepSpeed plan's data-parallel collectives rest on (dataparallel.dp_traffic: what DeepSpeed's
    source runs outside the backward)."""
    if not engine_flag(plan, "dp_collectives_outside_backward") or plan.dp * plan.cp <= 1:
        return ()
    grad_exposed, gather_exposed = deepspeed_exposed(plan)
    parts = []
    if bool(grad_exposed):
        parts.append("the gradient reduction runs after the backward, exposed ("
                     + ("PipelineEngine's ReduceGrads" if plan.pp > 1 else "allreduce_gradients at ZeRO-0") + ")")
    if bool(gather_exposed):
        parts.append("the ZeRO optimizer all-gathers the updated 16-bit parameters inside step(), exposed")
    if bool(M.deepspeed_bf16_optimizer(plan)):
        parts.append("its BF16_Optimizer all-reduces fp32 gradients (4 bytes per parameter)")
    return ("DeepSpeed: " + "; ".join(parts),) if parts else ()


# A plan that gathers and frees parameters layer by layer (ZeRO-3 / FSDP) churns the caching allocator;
# within this much of the GPU's memory it runs out of cached blocks, frees its cache and retries
# (cudaMalloc retries: pytorch/pytorch issue 65078; Composer raises gradient accumulation when it sees
# them, mosaicml/composer PR 1632; torchtitan logs them every step). The llm-foundry FSDP runs of the A100
# calibration file predicted within 2 GiB of capacity ran 8-37 % slower than estimated, those 2.7-6.3 GiB
# from it within -3..+5 % (README, "Memory pressure"); the cost is not priced, the plan is flagged.
ALLOCATOR_PRESSURE_HEADROOM_BYTES = fitted("allocator_pressure_headroom")
#: how the assumption line of :func:`allocator_pressure_assumption` begins (what callers look for)
MEMORY_PRESSURE = "memory pressure"


def churns_allocator(plan) -> bool:
    """Whether the plan's engine allocates and frees gathered parameters every layer: ZeRO-3 outside
    Megatron-LM (FSDP, DeepSpeed stage 3), and torchtitan's FSDP2 from ZeRO-2 (it frees the unsharded
    gradients after each layer's reduce-scatter). Megatron-FSDP, as exported (--fsdp-double-buffer),
    gathers and reduces in persistent buffers (memory.buffer_bytes) and does not. The engine's
    ``Behaviour.churns_allocator_from_zero``."""
    start = spec_of(plan).behaviour.churns_allocator_from_zero
    return start is not None and int(plan.zero) >= start


def allocator_pressure_assumption(gpu_total, cluster, plan) -> tuple[str, ...]:
    """Said when a plan that churns the allocator (:func:`churns_allocator`) peaks within
    ALLOCATOR_PRESSURE_HEADROOM_BYTES of the GPU's memory (the peak includes the allocator's reserve)."""
    cap = cluster.accelerator.memory_bytes
    free = cap - gpu_total
    if not churns_allocator(plan) or free > ALLOCATOR_PRESSURE_HEADROOM_BYTES or free < 0:
        return ()
    return (f"{MEMORY_PRESSURE}: the peak ({gpu_total / 2**30:.1f} GiB) leaves {free / 2**30:.1f} GiB of "
            f"{cap / 2**30:.0f}; a ZeRO-3 / FSDP plan this close to the limit makes the caching allocator free "
            f"its cache and retry (cudaMalloc retries), not priced: published FSDP runs this close ran 8-37 % "
            f"slower than estimated; a smaller micro-batch or more recomputation leaves room",)


def nvlink_domain_assumption(cluster) -> tuple[str, ...]:
    """The assumption a cluster cut into NVLink domains smaller than its system's node rests on
    (:func:`paraplan.hardware.model.nvlink_domain_gpus`: equal domains of whole hosts, each inside one
    node, as Slurm's topology/block ``--segment`` allocates), with the host resources each domain
    then holds; nothing for a cluster inside one node or of whole nodes."""
    if not cluster.partitioned:
        return ()
    s, g = cluster.system, cluster.gpus_per_node
    hosts = g // s.gpus_per_host
    return (f"{cluster.num_gpus} GPUs on {s.name} modelled as {cluster.num_nodes} NVLink domains of {g} GPUs "
            f"({hosts} hosts of {s.gpus_per_host} each; {cluster.num_gpus} is not a multiple of {s.gpus_per_node}): "
            f"placed as equal segments of whole hosts, each inside one {s.gpus_per_node}-GPU node, collectives "
            f"between segments on the network, each domain with {hosts}/{s.hosts_per_node} of a node's NICs, CPUs, "
            f"host memory and NVMe",)


@dataclass(frozen=True)
class Estimate:
    """Predicted step time, throughput and memory of one plan, with breakdowns and assumptions."""
    model: str
    cluster: str
    num_gpus: int
    seq_len: int
    global_batch: int
    plan: Plan
    feasible: bool
    infeasible_reason: str | None
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    time_breakdown_s: Mapping[str, float]
    memory_bytes_per_gpu: Mapping[str, float]
    host_memory_bytes_per_node: float
    nvme_bytes_per_node: float
    details: Mapping[str, Any] = field(default_factory=dict)
    efficiency_curves: Mapping[str, Any] = field(default_factory=dict)
    flop_convention: str = FLOP_CONVENTION
    assumptions: tuple[str, ...] = ASSUMPTIONS
    #: 90 % prediction interval from the calibration residuals of the hardware generation
    #: (:mod:`paraplan.costmodels.intervals`); ``basis`` says where it comes from, or that there is none
    prediction_interval: Mapping[str, Any] = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> float:
        """GPU memory left beside the predicted peak (negative: over capacity)."""
        return self.details["gpu_memory_bytes"] - self.memory_bytes_per_gpu["total"]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "model": self.model, "cluster": self.cluster, "num_gpus": self.num_gpus,
            "seq_len": self.seq_len, "global_batch": self.global_batch, "plan": self.plan.to_dict(),
            "feasible": self.feasible, "infeasible_reason": self.infeasible_reason,
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu, "flop_convention": self.flop_convention,
            "time_breakdown_s": dict(self.time_breakdown_s), "memory_bytes_per_gpu": dict(self.memory_bytes_per_gpu),
            "host_memory_bytes_per_node": self.host_memory_bytes_per_node,
            "nvme_bytes_per_node": self.nvme_bytes_per_node, "details": dict(self.details),
            "efficiency_curves": dict(self.efficiency_curves), "assumptions": list(self.assumptions),
            "prediction_interval": dict(self.prediction_interval),
        }


Number = Union[float, np.ndarray]


@dataclass(frozen=True)
class StepTerms:
    """Every term of one plan's step, or of a batch of plans' (then each number is a numpy array
    with one entry per plan). Seconds per step, bytes per GPU, FLOPs per step."""
    time: Mapping[str, Number]          # TIME_TERMS -> seconds; they add up to ``step``
    step: Number
    memory: Mapping[str, Number]        # MEMORY_TERMS and "total" -> bytes on the peak stage's GPU
    host_per_gpu: Number                # bytes offloaded to host memory, per GPU
    nvme_per_gpu: Number                # bytes offloaded to NVMe, per GPU
    micro_batches: Number
    flops_model: Number                 # MFU's FLOPs (no recomputation)
    flops_hardware: Number              # HFU's FLOPs (with recomputation)
    dp_comm_total: Number               # data-parallel communication before overlap
    last_stage_is_peak: Number          # the last pipeline stage holds the most memory
    peak_stage: Number                  # FIRST, MIDDLE or LAST: the stage that holds the most memory
    slowest_stage: Number               # FIRST, MIDDLE or LAST: the stage that sets the pace per micro-batch
    stage_layers: StageLayers           # layers per stage (first, largest middle, last, largest)
    bubble_fraction: Number
    warmup_share: Number                # compressed optimizers: share of steps in the uncompressed warm-up
    step_warmup: Number
    step_compressed: Number
    dp_comm_warmup: Number
    dp_comm_compressed: Number


FIRST, MIDDLE, LAST = 0, 1, 2       # pipeline stages as StepTerms names them
STAGE_NAMES = ("first", "middle", "last")


def layers_time(n, lt):
    """Seconds per micro-batch of ``n`` layers: forward, backward, recomputation, their collectives and
    the MoE host wait (every per-layer term of :func:`paraplan.costmodels.compute.layer_times` the
    step pays; the one sum the stage pace, the bubble and the planner's per-layer costs share)."""
    return (n * (lt["forward"] + lt["backward"]) + n * lt["recompute"] + n * lt["tp_comm"] + n * lt["cp_comm"]
            + n * lt["ep_comm"] + n * lt["moe_host"])


def slowest_stage(sl: StageLayers, p, lt, ht):
    """The stage that sets the pipeline's pace per micro-batch (pipeline.py: the slowest stage
    is paid m times): the last (its layers plus the LM head and loss, ties go to it), else the
    largest middle stage, else the first (its layers plus the embedding)."""
    last = layers_time(sl.last, lt) + ht["head"] + ht["tp_comm"]
    middle = layers_time(sl.middle, lt)
    first = layers_time(sl.first, lt) + np.where(np.asarray(p) > 1, ht["embedding"], 0.0)
    return np.where((last >= middle) & (last >= first), LAST, np.where(middle >= first, MIDDLE, FIRST))


def step_terms(model, job, cluster, plan, curves) -> StepTerms:
    """All time and memory terms for a plan or for a batch of plans (numpy arrays in the fields)."""
    p = np.asarray(plan.pp, dtype=float)
    m = micro_batches(job, plan)
    curves = with_stage_concurrency(with_reference_block(curves, cluster), plan, m)
    lt = C.layer_times(model, job, plan, curves, cluster)
    ht = C.head_times(model, job, plan, curves, cluster)
    sl = model_stage_layers(model, plan)          # multi-token-prediction blocks on the last stage
    slow = slowest_stage(sl, p, lt, ht)
    layers = np.where(slow == LAST, sl.last, np.where(slow == MIDDLE, sl.middle, sl.first))
    compute_mid = layers * (lt["forward"] + lt["backward"])
    recompute_mid = layers * lt["recompute"]
    tp_mid = layers * lt["tp_comm"]
    cp_mid = layers * lt["cp_comm"]
    ep_mid = layers * lt["ep_comm"]
    host_mid = layers * lt["moe_host"]
    t_mid = layers_time(layers, lt)
    # the slowest stage's extra work: LM head and loss on the last (and the embedding with pp = 1),
    # the embedding on the first
    head_compute = np.where(slow == LAST, ht["head"] + np.where(p == 1, ht["embedding"], 0.0),
                            np.where(slow == FIRST, ht["embedding"], 0.0))
    head_tp = np.where(slow == LAST, ht["tp_comm"], 0.0)
    t_micro_fwd = layers * lt["forward"]
    t_micro_bwd = layers * lt["backward"] + recompute_mid
    # the bubble: (p - 1) idle slots of the largest stage's layers
    t_bubble = layers_time(sl.largest, lt)

    first_params, middle_params, last_params = M.stage_params(model, plan)
    params = np.maximum(np.maximum(first_params, last_params), middle_params)
    experts = M.expert_params_per_gpu(model, plan)
    n_dp = np.asarray(plan.dp, dtype=float) * plan.cp
    n_edp = expert_data_parallel(plan)
    warm, factor = compressed_phase_factor(plan)
    units = layers + 1                          # ZeRO-3's wrapped units: each layer and the root
    compressed = bool(np.any(factor != 1))      # else the compressed phase is the warm-up phase

    def traffic(volume_factor):
        """The stage's dense and (MoE) expert collectives: they hide under the same windows."""
        t = dp_traffic(params, plan, cluster, volume_factor=volume_factor, units=units)
        if model.moe is not None:
            t = add_traffic(t, dp_traffic(experts, plan, cluster, experts=True, volume_factor=volume_factor,
                                          units=units))
        return t
    # the data-parallel collectives hide under a micro-batch's passes, less the time an inter-node
    # ring-attention exchange already holds the links (cpcomm.ring_hidden_on_network); a host-bound MoE
    # layer's wait (the GPU idles, the links are free) counts in the backward's window, where the
    # per-micro-batch reductions run. Split between the passes by their compute shares, as before, a
    # faster GPU (its memory-bound kernels no faster) moved wait into the forward and shrank the window a
    # ZeRO-2 reduce-scatter hides under by more than the step shortened (benchmarks/monotonicity.py:
    # Mixtral 8x7B on Megatron-FSDP, peak FLOP rate x2); all in the backward, it cannot. The forward's
    # window, which the once-per-step parameter all-gather of ZeRO-1/2 uses, goes without it.
    dp_fwd = t_micro_fwd - layers * lt["cp_hidden_forward"]
    dp_bwd = t_micro_bwd + host_mid - layers * lt["cp_hidden_backward"]
    dp_warm, dp_total = dp_exposed(traffic(1.0), plan, m, dp_fwd, dp_bwd)
    dp_comp = dp_exposed(traffic(factor), plan, m, dp_fwd, dp_bwd)[0] if compressed else dp_warm
    # FSDP2's own cost per wrapped unit (each layer of the stage and the root) and micro-batch, where the
    # device's profile measured it (a CPU under gloo: hooks, DTensor bookkeeping, buffer copies)
    fsdp_unit = float(getattr(curves, "fsdp_unit_overhead_s", 0.0) or 0.0)
    if fsdp_unit:
        fsdp_own = np.where(np.asarray(plan.zero) == 3, m * (layers + 1) * fsdp_unit, 0.0)
        dp_warm, dp_comp, dp_total = dp_warm + fsdp_own, dp_comp + fsdp_own, dp_total + fsdp_own
    dp_avg = warm * dp_warm + (1 - warm) * dp_comp

    z1 = np.asarray(plan.zero) >= 1
    shard = np.where(z1, params / n_dp, params) + np.where(z1, experts / n_edp, experts)
    compute_step = m * (t_mid + head_compute + head_tp)
    # a micro-batch's wall time on the slowest stage: its layers with their exposed collectives, the
    # head, and the ZeRO-3 gathers and reductions it exposes micro-batch by micro-batch;
    # ZeRO-Infinity's parameter fetch hides under all of it (offload.offload_transfer_times)
    dp_per_micro = np.where(np.asarray(plan.zero) == 3, dp_avg / np.maximum(np.asarray(m, dtype=float), 1.0), 0.0)
    micro_wall = t_mid + head_compute + head_tp + dp_per_micro
    optimizer, offload = optimizer_and_offload(shard, plan, cluster, curves, m, t_micro_fwd, t_micro_bwd,
                                               compute_step, tensors=param_tensors(model, plan),
                                               t_micro_wall=micro_wall)
    acts_offloaded = M.offloaded_activation_bytes(model, job, plan)
    offload = offload + activation_offload_time(acts_offloaded, cluster, m, t_micro_fwd, t_micro_bwd)
    time = {
        "compute": m * (compute_mid + head_compute),
        "recompute": m * recompute_mid,
        "grad_accumulation": grad_accumulation_time(model, plan, curves, m, params, n_dp),
        "tp_comm": m * (tp_mid + head_tp) + expert_tp_replica_allreduce_time(experts, plan, cluster),
        "cp_comm": m * cp_mid,
        "ep_comm": m * ep_mid,
        "moe_host": m * host_mid,
        "pp_comm": pipeline_p2p_time(model, job, plan, cluster, m, t_micro_fwd, t_micro_bwd + host_mid),
        "pp_bubble": (p - 1) * t_bubble * bubble_factor(plan),
        "dp_comm": dp_avg,
        "optimizer": optimizer + scaling_step_passes_time(model, plan, curves, params),
        "offload": offload,
    }
    step = sum(time.values())

    acts = M.activation_bytes(model, job, plan)
    expert_states = M.model_state_bytes(experts, plan, shard_degree=n_edp)

    def states_of(params_):
        """A stage's model states with its experts' and, under fp8, its fp8 weight copies."""
        states = {k: v + expert_states[k] for k, v in M.model_state_bytes(params_, plan).items()}
        states["parameters"] = states["parameters"] + M.fp8_weight_copy_bytes(model, params_ + experts, plan)
        return states
    stage_states = {name: states_of(params_)
                    for name, params_ in (("first", first_params), ("middle", middle_params), ("last", last_params))}
    totals = {name: sum(states.values()) + acts[name] for name, states in stage_states.items()}
    # the peak stage: first unless another holds strictly more (a middle stage only when it has layers)
    peak = np.where(totals["last"] > totals["first"], LAST, FIRST)
    peak_total = np.where(peak == LAST, totals["last"], totals["first"])
    peak = np.where((sl.middle > 0) & (totals["middle"] > peak_total), MIDDLE, peak)
    last_is_peak = peak == LAST
    buffers = M.buffer_bytes(model, plan, runtime_reserved_bytes(cluster))

    def at_peak(values: dict):
        return np.where(peak == LAST, values["last"], np.where(peak == MIDDLE, values["middle"], values["first"]))
    memory = {k: at_peak({name: stage_states[name][k] for name in stage_states}) for k in stage_states["first"]}
    memory["activations"] = at_peak(acts)
    memory["buffers"] = buffers
    memory["allocator"] = M.allocator_bytes(memory, plan, on_cuda(cluster))
    memory["total"] = sum(memory[k] for k in MEMORY_TERMS)
    off = M.offloaded_bytes_per_gpu(shard, plan)
    off["host"] = off["host"] + acts_offloaded * M.in_flight_micro_batches(job, plan)

    tokens = job.tokens_per_step
    flops_model = model.model_flops_per_token(job.seq_len) * tokens
    attn_fwd = model.layers * model.attention_flops_per_token_per_layer(job.seq_len) * tokens
    full_fwd = model.layers * (model.matmul_flops_per_token_per_layer()
                               + model.attention_flops_per_token_per_layer(job.seq_len)) * tokens
    rc = np.asarray(plan.recompute_code)
    flops_hw = flops_model + np.where(rc == Recompute.FULL, full_fwd,
                                      np.where(rc == Recompute.SELECTIVE,
                                               np.where(recomputes_attention_core(plan), attn_fwd, 0.0)
                                               + C.recompute_modules_flops_per_token(model, plan) * tokens,
                                               np.where(rc == Recompute.OP_SAC,
                                                        C.op_sac_recomputed_matmul_share(model) * (full_fwd - attn_fwd),
                                                        0.0)))
    return StepTerms(time=time, step=step, memory=memory, host_per_gpu=off["host"], nvme_per_gpu=off["nvme"],
                     micro_batches=m, flops_model=flops_model, flops_hardware=flops_hw,
                     dp_comm_total=dp_total, last_stage_is_peak=last_is_peak, peak_stage=peak,
                     slowest_stage=slow, stage_layers=sl,
                     bubble_fraction=bubble_fraction(plan, m), warmup_share=warm,
                     step_warmup=step - dp_avg + dp_warm, step_compressed=step - dp_avg + dp_comp,
                     dp_comm_warmup=dp_warm, dp_comm_compressed=dp_comp)


def with_stage_concurrency(curves, plan, m):
    """``curves`` with their measured compute slowdown of ranks sharing one machine (a profiled CPU:
    ``compute_slowdown`` > 1) scaled to the share of time the other ranks compute alongside
    (:func:`paraplan.costmodels.pipeline.effective_compute_slowdown`: pipeline stages compute alone
    in the fill and drain); unchanged without a slowdown or without pipelining."""
    slowdown = getattr(curves, "compute_slowdown", 1.0)
    if not slowdown > 1.0 or not np.any(np.asarray(plan.pp) > 1):
        return curves
    return replace(curves, compute_slowdown=effective_compute_slowdown(slowdown, plan, m))


# DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, the optimizer of bf16 runs with
# ZeRO <= 1; Megatron-DeepSpeed trained BLOOM on it) keeps fp32 gradients and, after every
# micro-batch's backward (PipelineEngine._exec_backward_pass: clear_lp_grads() before,
# update_hp_grads() after), adds each 16-bit gradient into them per parameter tensor as
# ``hp.grad.add_(lp.grad.to(fp32))``: the cast reads 2 and writes 4 bytes, the add reads 4 + 4 and
# writes 4, two kernels per tensor.
DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM = (2 + 4) + (4 + 4 + 4)
DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR = 2


def grad_accumulation_time(model, plan, curves, m, params, n_dp):
    """Unfused gradient accumulation (``plan.grad_accumulation_fusion`` False): every micro-batch
    after the first adds its gradients into the accumulated ones, one elementwise kernel per
    parameter tensor reading two and writing one gradient:
    (m − 1) · streaming_time(3 · G · bytes, kernels = tensors), G the gradients a rank accumulates
    (its stage's parameters; under ZeRO-3 its 1/(dp·cp) shard, FSDP reduce-scattering every
    micro-batch). Fused (Megatron-LM's wgrad GEMM with beta = 1): 0. Measured on the CPU
    validation model (1.06 M fp32 parameters in 53 tensors): 1.0 ms per extra micro-batch.
    DeepSpeed's BF16_Optimizer (:func:`paraplan.costmodels.memory.deepspeed_bf16_optimizer`) accumulates into fp32 after every
    micro-batch, the first too, whatever the flag:
    m · streaming_time(18 · G, kernels = 2 · tensors) (DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM)."""
    fused = np.asarray(plan.grad_accumulation_fusion, dtype=bool)
    z3 = np.asarray(plan.zero) == 3
    grads = np.where(z3, params / n_dp, params)
    tensors = stage_param_tensors(model, plan)
    t = curves.streaming_time(3.0 * grads * element_bytes(plan), kernels=tensors)
    unfused = np.where(fused, 0.0, np.maximum(np.asarray(m, dtype=float) - 1.0, 0.0) * t)
    ds_bf16 = M.deepspeed_bf16_optimizer(plan)
    if not np.any(ds_bf16):
        return unfused
    t_ds = curves.streaming_time(DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM * grads,
                                 kernels=DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR * tensors)
    return np.where(ds_bf16, np.asarray(m, dtype=float) * t_ds, unfused)


# Scaling's optimizer.step() passes over every 16-bit gradient of the stage before its fp32 all-reduce
# and after it (core/optimizer/optimizer.py, allreduce.py, parameter_group.py at 01b9d21), bytes per
# parameter: loss-scale mul_ (2 + 2) and the global-norm read (2) per tensor; per bucket the flatten copy
# (2 + 2), the division by dp (2 + 2), the cast to fp32 (2 + 4), the copy back to 16 bit (4 + 2) and the
# copy into the gradient tensors (2 + 2).
SCALING_STEP_BYTES_PER_PARAM = (2 + 2) + 2 + (2 + 2) + (2 + 2) + (2 + 4) + (4 + 2) + (2 + 2)
SCALING_STEP_KERNELS_PER_TENSOR = 3          # mul_, norm and the unflattened copy back, per tensor


def scaling_step_passes_time(model, plan, curves, params):
    """Seconds of Scaling's gradient passes in ``optimizer.step()`` (engine scaling; 0 otherwise):
    streaming_time(SCALING_STEP_BYTES_PER_PARAM · Ψ_stage, kernels = 3 per parameter tensor), every
    step whatever the micro-batch count (the all-reduce they wrap is in
    :func:`paraplan.costmodels.dataparallel.dp_exposed_time`)."""
    scaling = engine_flag(plan, "reduces_in_optimizer_step")
    if not np.any(scaling):                     # priced only where a plan runs on Scaling
        return 0.0
    t = curves.streaming_time(SCALING_STEP_BYTES_PER_PARAM * params,
                              kernels=SCALING_STEP_KERNELS_PER_TENSOR * stage_param_tensors(model, plan))
    return np.where(scaling, t, 0.0)


def _f(x) -> float:
    return float(np.asarray(x))


def estimate(model, job, cluster, plan: Plan, *, curves=None, max_memory_fraction: float = 1.0) -> Estimate:
    """Predict one plan. Raises ConfigError for a plan that does not match the model, job or cluster;
    a plan that does not fit in memory comes back with ``feasible=False`` and the reason."""
    return estimate_legal(model, job, cluster, check_plan(plan, model, job, cluster), curves=curves,
                          max_memory_fraction=max_memory_fraction)


def estimate_legal(model, job, cluster, plan: Plan, *, curves=None, max_memory_fraction: float = 1.0) -> Estimate:
    """:func:`estimate` of a plan already known to pass :data:`paraplan.plan.RULES` for this model, job
    and cluster, with dp filled: the planner's candidates, which its space admitted through the same
    rules as masks, skip the per-plan check (a third of an exact re-score)."""
    curves = with_reference_block(curves or curves_for(cluster), cluster)
    terms = step_terms(model, job, cluster, plan, curves)
    n = cluster.num_gpus
    step = _f(terms.step)
    tokens_per_s = job.tokens_per_step / step
    peak = cluster.accelerator.peak(compute_dtype(plan.dtype))
    memory = {k: _f(v) for k, v in terms.memory.items()}
    g = cluster.gpus_per_node
    host = _f(terms.host_per_gpu) * g
    nvme = _f(terms.nvme_per_gpu) * g
    reason = infeasibility(memory["total"], host, nvme, cluster, max_memory_fraction)
    domains = nvlink_domain_assumption(cluster)
    return Estimate(
        model=model.name, cluster=cluster.name, num_gpus=n, seq_len=job.seq_len, global_batch=job.global_batch,
        plan=plan, feasible=reason is None, infeasible_reason=reason, step_time_s=step,
        tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / n,
        model_tflops_per_gpu=_f(terms.flops_model) / step / n / 1e12,
        mfu=_f(terms.flops_model) / step / n / peak, hfu=_f(terms.flops_hardware) / step / n / peak,
        time_breakdown_s={k: _f(v) for k, v in terms.time.items()}, memory_bytes_per_gpu=memory,
        host_memory_bytes_per_node=host, nvme_bytes_per_node=nvme,
        details={"micro_batches_per_step": _f(terms.micro_batches),
                 "bubble_fraction": _f(terms.bubble_fraction),
                 "dp_comm_total_s": _f(terms.dp_comm_total),
                 "peak_memory_stage": STAGE_NAMES[int(terms.peak_stage)],
                 "layers_per_stage": stage_layer_counts(model.layers, plan),
                 **({"mtp_blocks_on_last_stage": model.mtp_layers} if model.mtp_layers else {}),
                 "gpu_memory_bytes": cluster.accelerator.memory_bytes,
                 "model_params": model.num_params, "active_params": model.active_params,
                 **({"optimizer_warmup_share": _f(terms.warmup_share),
                     "step_time_warmup_s": _f(terms.step_warmup),
                     "step_time_compressed_s": _f(terms.step_compressed),
                     "dp_comm_warmup_s": _f(terms.dp_comm_warmup),
                     "dp_comm_compressed_s": _f(terms.dp_comm_compressed)} if plan.optimizer != "adam" else {}),
                 # a cluster cut into NVLink domains: the text report shows the assumption with the numbers
                 **({"nvlink_domains": {"count": cluster.num_nodes, "gpus_each": cluster.gpus_per_node,
                                        "assumption": domains[0]}} if domains else {})},
        efficiency_curves=curves.describe(),
        assumptions=(assumptions_for(plan) + gemm_level_assumption(plan, curves)
                     + attention_kernel_assumption(model, job, plan, curves) + qk_norm_assumption(model)
                     + pipeline_transfer_assumption(plan)
                     + softmax_exp_assumption(model, plan, curves)
                     + moe_dispatch_assumption(model, job, plan) + moe_host_assumption(model, plan)
                     + expert_wgrad_assumption(model, job, plan, curves)
                     + expert_bias_assumption(model, job, plan, curves)
                     + ep_overlap_assumption(job, plan) + domains
                     + megatron_fsdp_assumption(plan) + host_link_assumption(plan, cluster)
                     + deepspeed_dp_assumption(plan) + allocator_pressure_assumption(memory["total"], cluster, plan)),
        prediction_interval=describe_interval(cluster.accelerator.name, tokens_per_s, step,
                                              _f(terms.flops_model) / step / n / peak, moe=model.moe is not None))


def infeasibility(gpu_total, host_per_node, nvme_per_node, cluster, max_memory_fraction=1.0) -> str | None:
    """Why a plan does not fit (GPU memory, host memory, NVMe), with the overflow in GiB; None if it fits."""
    gib = 2**30
    reasons = []
    cap = cluster.accelerator.memory_bytes * max_memory_fraction
    if gpu_total > cap:
        reasons.append(f"GPU memory: needs {gpu_total / gib:.1f} GiB per GPU, {cap / gib:.1f} GiB available "
                       f"(over by {(gpu_total - cap) / gib:.1f} GiB)")
    host_cap = cluster.node_system.host_memory_bytes
    if host_per_node > host_cap:
        reasons.append(f"host memory: needs {host_per_node / gib:.0f} GiB per node, {host_cap / gib:.0f} GiB "
                       f"available (over by {(host_per_node - host_cap) / gib:.0f} GiB)")
    nvme_cap = cluster.node_system.nvme_capacity_bytes
    if nvme_per_node > nvme_cap:
        reasons.append(f"NVMe: needs {nvme_per_node / 1e12:.2f} TB per node, {nvme_cap / 1e12:.2f} TB available")
    return "; ".join(reasons) if reasons else None
