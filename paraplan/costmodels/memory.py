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
Kernels the plan chooses change what is kept (constants below, each with its derivation): eager
(unfused) norms keep an fp32 copy of every norm input; unfused attention materializes the score
matrix in its backward. The PyTorch caching allocator reserves more than the tensors it holds:
:func:`allocator_bytes`, calibrated on the fit/OOM outcomes of Hagemann et al. 2023.
In-flight micro-batches on the first stage: 1F1B and ZB-H1 min(m, p); interleaved
p·(1 + (p−1)/(p·v)) (NVIDIA/Megatron-LM theoretical_memory_usage.py); GPipe m.
Uneven stages (``paraplan.plan.stage_layers``): each stage's parameters and activations come from
its own layer count; a middle stage with more layers than the first is evaluated too, with the
in-flight micro-batches of stage 1 (min(m, p − 1) under 1F1B), a bound for every middle stage.
:func:`peak_stage_memory` puts a GPU's memory together on the stage that holds the most.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels.kernels import BYTES, device_is_host, element_bytes, micro_batches, tokens_per_rank
from paraplan.costmodels.mamba import mamba_saved_bytes_per_token
from paraplan.costmodels.moe import einsum_dispatch_slots, expert_token_factor
from paraplan.costmodels.p2p import stage_output_bytes
from paraplan.costmodels.pipeline import FIRST, LAST, MIDDLE, V_SCHEDULES, is_schedule, parameter_copies
from paraplan.engines import BufferArgs, StateArgs, engine_flag, engine_offers, engine_select, spec_of
from paraplan.engines import DEEPSPEED_ALLGATHER_BUCKET, DEEPSPEED_REDUCE_BUCKET, SCALING_LOSS_BYTES_PER_LOGIT  # noqa: F401
from paraplan.modes import OPTIMIZER_STATE_BYTES, OptimizerStateDtype
from paraplan.plan import (Offload, Recompute, Schedule, expert_data_parallel, is_fp8, quantized_bytes,
                           recomputes_attention_core,
                           recomputes_module, model_stage_layers, stage_layers)

#: the memory terms of an estimate; with "total", their sum
MEMORY_TERMS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "allocator")
OPTIMIZER_BYTES_PER_PARAM = 12   # fp32 master weights, momentum, variance (K in the ZeRO paper)
FP32_OPTIMIZER_BYTES_PER_PARAM = 8   # plain fp32 Adam: momentum and variance, no master copy
#: bytes of one Adam moment element by OptimizerStateDtype code (the precision-aware optimizer's moments)
MOMENT_BYTES_BY_CODE = np.array([float(OPTIMIZER_STATE_BYTES[m.label]) for m in OptimizerStateDtype])
STATES_16BIT = ("16-bit weights, gradients and activations; Adam with fp32 master weights, momentum, variance "
                "(16 bytes/param before ZeRO)")
#: what replaces STATES_16BIT for plans that train in fp32 (the CPU validation harness)
FP32_STATES = ("fp32 weights, gradients and activations; Adam keeps fp32 momentum and variance, no master copy "
               "(16 bytes/param before ZeRO: 4 + 4 + 8)")


def states_assumption(plan, **_) -> tuple[str, ...]:
    """The model states the plan keeps (:func:`model_state_bytes`): 16-bit, or fp32 for fp32 training; under
    the precision-aware optimizer, what its optimizer holds (:func:`optimizer_bytes_per_param`)."""
    if bool(np.any(getattr(plan, "precision_aware_optimizer", False))) and plan.dtype != "fp32":
        k = float(np.max(optimizer_bytes_per_param(plan)))
        master = "the fp32 master weight as its 16-bit remainder below the bf16 weight (2 bytes)" \
            if bool(np.any(param_remainders(plan))) else "fp32 master weights (4 bytes)"
        return ("16-bit weights, gradients and activations; Megatron-Core's precision-aware optimizer (Transformer "
                f"Engine's FusedAdam) keeps {master} and {plan.optimizer_state_dtype} moments: {k:g} bytes/param "
                "of optimizer states before ZeRO",)
    return (FP32_STATES if plan.dtype == "fp32" else STATES_16BIT,)
# Eager RMSNorm keeps 4 bytes per element more than a fused kernel (its input and rstd), per norm, in
# either precision. In 16-bit training (e.g. Hugging Face LlamaRMSNorm: x.float(); x.pow(2).mean(-1);
# x * rsqrt(var + eps); weight * x.to(bf16)) that is the fp32 upcast of its input, read by pow and mul,
# besides the 16-bit normalized output the weight multiply keeps (the 2 bytes a fused kernel keeps as
# its input). In fp32 there is no upcast, and the weight multiply keeps the fp32 normalized output
# besides the input (PyTorch's nn.RMSNorm on a CPU, the validation harness: 2.4 h fp32 elements per
# token and layer measured, the final norm included). Two norms per layer, and the final norm on the
# last stage. LayerNorm is one native kernel eager or not (F.layer_norm): the term applies to RMSNorm only.
EAGER_RMSNORM_SAVED_BYTES_PER_ELEMENT = 4.0
# Eager SwiGLU (silu(gate) * up, then the down projection) keeps silu(gate) for the mul's backward
# besides the fc1 output (gate | up) and the product a fused kernel keeps too: 2f bytes per token.
UNFUSED_SWIGLU_SAVED_BYTES_PER_FFN = 2
# Non-flash attention keeps per element of the b·(a/t)·(s/cp)·s score matrix the 16-bit softmax output,
# the 1-byte dropout mask and the 16-bit dropout output that the probabilities-times-values GEMM reads:
# the 5as/h term of Korthikanti et al. 2022, Table 2 (sec. 4.1: "softmax output 2as²b, dropout mask as²b,
# dropout output 2as²b"). Without attention dropout the softmax output is that GEMM's input itself and
# only its 2 bytes are kept (torch's softmax saves its output; its input, the scores, is not saved).
UNFUSED_SCORE_BYTES = 5.0
UNFUSED_SCORE_BYTES_NO_DROPOUT = 2.0
# Non-flash attention's backward (Megatron's fused scale-mask-softmax: the probabilities' gradient in,
# the scores' gradient out, 16-bit) holds two score-sized tensors besides the saved probabilities
# while one layer runs backward: bytes per element of the rank's b·(a/t)·(s/cp)·s score matrix.
UNFUSED_ATTENTION_TRANSIENT_BYTES = 4.0
# Transformer Engine under fp8 (megatron and generic engines): each Linear saves for its weight-gradient
# GEMM the fp8 cast of its input (transformer_engine/pytorch/module/linear.py, layernorm_linear.py:
# the quantized input, 1 byte per element, its row-wise copy discarded) instead of the 16-bit tensor.
# Per layer: the two norm outputs (QKV and FC1 inputs) drop from 2 to 1 byte per element, FC2's
# input (the activation's output) likewise; the output projection keeps an fp8 copy besides the
# attention kernel's 16-bit output, which FlashAttention saves for its own backward (+1 byte).
# torchtitan's torchao Float8Linear saves the high-precision input: no change there.
TE_FP8_BYTES_PER_ELEMENT = 1.0
# Aleph Alpha's Scaling (engine ``scaling``; github.com/Aleph-Alpha/scaling at 01b9d21, the 2024 release
# of the codebase Hagemann et al. 2023 ran their layout sweep with), from src/scaling/:
# * core/nn/mlp.py ParallelSwiGLUMLP computes silu(dense_in(x)) * siglu_weight(x) in eager PyTorch
#   whatever the norm kernel: silu keeps its input, the mul keeps silu's output and the gate, dense_out
#   its input: UNFUSED_SWIGLU_SAVED_BYTES_PER_FFN more per token than a fused SwiGLU. (Its eager
#   RMSNorm, core/nn/norm/rms_norm.py, keeps only the 16-bit normalized output besides x, 2h bytes per
#   norm; the sweep's "flash_attention2" runs without the RMS kernel OOM as the fp32-upcast form
#   EAGER_RMSNORM_SAVED_BYTES_PER_ELEMENT predicts, so that generic form is kept for the sweep's 2023 code.)
# * core/nn/norm/rms_norm.py under sequence parallelism all-gathers the norm output
#   (gather_from_sequence_parallel_region) and the column-parallel linears after it (QKV; dense_in and
#   siglu_weight share their input) save the gathered tensor: 2 x 2h bytes per token on every tp rank,
#   where Megatron-LM saves the sequence shard and gathers it again in backward.
SCALING_SP_GATHERED_SAVED_BYTES_PER_HIDDEN = 2 * 2
# * core/nn/attention/attention.py flash_attention: flash_attn_varlen_func saves its output for backward,
#   and the output is rearranged "(b sq) np hn -> (b np) sq hn" (a permuted copy) before the dense
#   projection, which saves that copy: 2h bytes per token (sharded by tp) besides the projection input
#   already counted (Megatron-LM's projection input is a view of the kernel's output).
SCALING_FLASH_OUTPUT_SAVED_BYTES_PER_HIDDEN = 2
# * transformer/model/layers/lm_head.py and losses/cross_entropy.py: the logits gathered over tp and an fp32
#   loss, SCALING_LOSS_BYTES_PER_LOGIT per logit (its derivation with the scaling spec, paraplan/engines/specs.py).
# * core/optimizer/parameter_group.py keeps the 16-bit parameters in one flat buffer
#   (flatten_dense_tensors_aligned) and the fp32 ZeRO-1 partition (and so Adam's moments) as single
#   tensors, allocated once; its 16-bit gradients are autograd's per-parameter tensors, allocated in
#   every step's first backward and freed by zero_grad(set_to_none=True), in the same sizes and order
#   each step, so the caching allocator hands back the same blocks: like the other engines only the
#   activations and buffers fragment (allocator_bytes), but Scaling's eager code (SwiGLU, norm
#   upcasts, permuted attention copies) leaves more odd-sized temporaries between them. The fraction
#   is calibrated on the sweep's fit/OOM outcomes (benchmarks/memory_fit.py): the smallest value that
#   reaches the lowest false-fit rate with false OOMs at most 5 % (0.34: 9.7 % / 0.8 %, 0.37: 7.7 % /
#   1.9 %, 0.40: 6.6 % / 3.0 %, 0.46: 6.6 % / 4.2 %, 0.60: 5.8 % / 6.8 %, without the backward working
#   set below; with it at 1.2: 0.34: 6.2 % / 2.7 %, 0.37: 5.4 % / 3.4 %, 0.40: 4.2 % / 4.2 %, 0.44:
#   4.2 % / 4.9 %).
SCALING_ALLOCATOR_FRAGMENTATION = fitted("scaling_allocator_fragmentation")
# The PyTorch caching allocator on a CUDA device reserves more than the tensors it holds (blocks
# rounded up and split, cached blocks of other sizes): reserved = (1 + FRAGMENTATION) x allocated
# + RESERVE. Calibrated on the fit/OOM outcomes of Hagemann et al. 2023's sweep (522 runs,
# arXiv:2311.05610; benchmarks/memory_fit.py) under the constraint that every complete published
# run of paraplan/calibration/data/published_runs_calibration.csv fits (fitted_constants.yaml).
ALLOCATOR_FRAGMENTATION = fitted("allocator_fragmentation")
ALLOCATOR_RESERVE_BYTES = fitted("allocator_reserve")
# Megatron-LM (Megatron-Core, as NeMo and Megatron-Bridge run it) allocates its model states and
# Megatron-FSDP's gather buffers once and frees activations of the same shapes layer after layer: its runs
# bound the share from above. The largest value (in steps of 0.01) with which every Megatron-Core run
# of the H100/Blackwell reference file that ran is judged to fit (Llama 3 70B on 64 GB200,
# Megatron-FSDP with 40 layers' activations offloaded, allows 0.045; fitted_constants.yaml).
MEGATRON_ALLOCATOR_FRAGMENTATION = fitted("megatron_allocator_fragmentation")
#: the engines' fractions by the fitted_constants.yaml entry their ``Behaviour.allocator_fragmentation`` names
FRAGMENTATION_BY_ENTRY = {"allocator_fragmentation": ALLOCATOR_FRAGMENTATION,
                          "scaling_allocator_fragmentation": SCALING_ALLOCATOR_FRAGMENTATION,
                          "megatron_allocator_fragmentation": MEGATRON_ALLOCATOR_FRAGMENTATION}


def runs_precision_aware(plan):
    """Plans that run Megatron-Core's precision-aware optimizer: the field on, on an engine that offers it."""
    return np.asarray(getattr(plan, "precision_aware_optimizer", False), dtype=bool) \
        & engine_offers(plan, "precision_aware_optimizer")


def plain_adam_bytes_per_param(plan):
    """K without the precision-aware optimizer: 12 with 16-bit training (fp32 master weights, momentum,
    variance), 8 in plain fp32."""
    return FP32_OPTIMIZER_BYTES_PER_PARAM if plan.dtype == "fp32" else OPTIMIZER_BYTES_PER_PARAM


def param_remainders(plan):
    """Plans whose precision-aware optimizer keeps the fp32 master weight as the 16 bits below the bf16
    weight (2 bytes, not 4): Megatron-Core's store_param_remainders (OptimizerConfig default True) reaches
    Transformer Engine's FusedAdam only when FusedAdam holds the master weights
    (use_precision_aware_optimizer_no_fp8_or_ds_fp8: no fp8 recipe, or the delayed one), and FusedAdam
    applies it only to bf16 parameters (transformer_engine/pytorch/optimizers/fused_adam.py: "Works only
    when param type is BF16 and master weight type is FP32"): bf16 training, or fp8-delayed without fp8
    parameters (an fp8 parameter has lost the low bits). Other fp8 recipes: Megatron-Core keeps fp32 main
    parameters (megatron/core/optimizer/distrib_optimizer.py), 4 bytes; fp16 and the fp4 recipes too."""
    bf16_weights = (plan.dtype == "bf16") | ((plan.dtype == "fp8-delayed")
                                             & ~np.asarray(getattr(plan, "fp8_param_gather", False), dtype=bool))
    return runs_precision_aware(plan) & bf16_weights


def optimizer_bytes_per_param(plan):
    """K: 12 with 16-bit training (fp32 master weights, momentum, variance), 8 in plain fp32. Under
    Megatron-Core's precision-aware optimizer (``plan.precision_aware_optimizer``; Transformer Engine's
    FusedAdam: megatron/core/optimizer/__init__.py passes master_weight_dtype, exp_avg_dtype and
    exp_avg_sq_dtype) K = master + 2·moment: master 2 with the bf16 weights' remainders
    (:func:`param_remainders`), else 4 (fp32); each moment OPTIMIZER_STATE_BYTES[optimizer_state_dtype]
    (fp32 4, bf16 / fp16 2, fp8 1; --exp-avg-dtype / --exp-avg-sq-dtype). E.g. bf16 with bf16 moments:
    2 + 2 + 2 = 6; bf16 with fp32 moments (Megatron-Bridge's bf16 performance runs): 2 + 4 + 4 = 10;
    fp8 tensorwise with bf16 moments: 4 + 2 + 2 = 8."""
    base = plain_adam_bytes_per_param(plan)
    aware = runs_precision_aware(plan)
    if not np.any(aware):
        return base
    moment = MOMENT_BYTES_BY_CODE[np.asarray(plan.optimizer_state_dtype_code)]
    master = np.where(param_remainders(plan), 2.0, 4.0)
    return np.where(aware, master + 2 * moment, float(base))


def _share(total, layers: int, stage):
    """``total`` spread over ``layers`` layers, the part of ``stage`` layers, written total / (L / n)
    so that an even split gives exactly total / pp; 0 for a stage with no layers."""
    n = np.asarray(stage, dtype=float)
    return np.where(n > 0, total / (layers / np.maximum(n, 1.0)), 0.0)


def expert_params_per_gpu(model, plan):
    """Routed-expert parameters on one GPU: the largest stage's share of the MoE layers (their
    average density over the layers) with E experts each, split over ep·etp."""
    if model.moe is None:
        return 0.0
    sl, with_mtp = stage_layers(model.layers, plan), model_stage_layers(model, plan)
    first, middle, last = (_share(model.moe_layers, model.layers, n) for n in (sl.first, sl.middle, sl.last))
    # the multi-token-prediction blocks (MoE blocks in an MoE model; a hybrid depth's E layers) where
    # model_stage_layers puts them
    mtp_moe = model.mtp_moe_layers / max(model.mtp_layers * model.mtp_block_layers, 1)
    moe_layers = np.maximum(np.maximum(first + (with_mtp.first - sl.first) * mtp_moe, middle),
                            last + (with_mtp.last - sl.last) * mtp_moe)
    # DualPipe's second parameter copy (pipeline.parameter_copies) holds its experts too
    return (moe_layers * model.routed_expert_params_per_moe_layer / (np.asarray(plan.ep, dtype=float) * plan.etp)
            * parameter_copies(plan))


def stage_params(model, plan):
    """(first-stage, middle-stage, last-stage) non-expert parameters per GPU: each stage's layers
    (``paraplan.plan.stage_layers``; the largest middle stage, 0 without one) split by tp; the
    embedding sits on the first stage, the LM head (a copy of a tied embedding when pp > 1) on the
    last. Routed experts are counted apart (:func:`expert_params_per_gpu`); LatentMoE's projections are whole on
    every tp rank. The multi-token-prediction
    module's own parameters (``model.mtp_params`` less its routed experts) sit with the head. Under
    DualPipe every stage holds two copies (:func:`paraplan.costmodels.pipeline.parameter_copies`)."""
    t = np.asarray(plan.tp, dtype=float)
    p = np.asarray(plan.pp, dtype=float)
    sl = stage_layers(model.layers, plan)
    routed = model.routed_expert_params_per_moe_layer
    non_expert = model.num_params - model.mtp_params - model.embedding_params - model.lm_head_params \
        - model.moe_layers * routed
    # LatentMoE's projections are duplicated on every tp rank (TELinear parallel_mode="duplicated"), not split
    duplicated = model.moe_layers * model.latent_projection_params * (1 - 1 / t)
    emb = model.embedding_params / t
    head = (model.lm_head_params + model.mtp_params - model.mtp_moe_layers * routed) / t
    tied_copy = np.where(model.tied_embeddings & (p > 1), model.vocab * model.hidden / t, 0.0)

    def layers_share(n):
        return (_share(non_expert, model.layers, n) / t + _share(duplicated, model.layers, n)) if model.moe \
            else _share(non_expert, model.layers, n) / t
    first_layers = layers_share(sl.first)
    first = np.where(p > 1, first_layers + emb, first_layers + emb + head)
    last = np.where(p > 1, layers_share(sl.last) + head + tied_copy, first)
    middle = layers_share(sl.middle)
    # DualPipe: every rank holds its stage of both directions' pipelines, two copies of the parameters
    # (pipeline.parameter_copies); the copies' own gradient exchange is not modelled
    copies = parameter_copies(plan)
    return first * copies, middle * copies, last * copies


def bf16_optimizer_layout(plan):
    """Layouts that DeepSpeed trains with its BF16_Optimizer (fp32 gradient accumulation): bf16 with a
    pipeline (ZeRO <= 1 there) or with ZeRO-0. DeepSpeedEngine._do_optimizer_sanity_check picks it for
    bf16 without ZeRO (gradients accumulate in fp32 by default there) and for bf16 ZeRO-1 when
    ``data_types.grad_accum_dtype`` is fp32, which the DeepSpeed export writes for such plans; the 2022
    PipelineEngine that trained BLOOM called its ``update_hp_grads`` for every bf16 pipeline."""
    return (plan.dtype == "bf16") & ((np.asarray(plan.pp) > 1) | (np.asarray(plan.zero) == 0))


def deepspeed_bf16_optimizer(plan):
    """Plans whose optimizer is DeepSpeed's BF16_Optimizer: an engine with one (deepspeed,
    ``Behaviour.bf16_optimizer``) on a :func:`bf16_optimizer_layout`."""
    return engine_flag(plan, "bf16_optimizer") & bf16_optimizer_layout(plan)


def model_state_bytes(params, plan, shard_degree=None) -> dict:
    """Parameters, gradients and optimizer states on one GPU for Ψ = ``params``, sharded over
    ``shard_degree`` ranks N (default dp·cp; routed experts: dp·cp/ep), as the plan's engine holds
    them: its spec's ``model_states`` (``paraplan.engines.specs``: the ZeRO paper's table above for
    generic and scaling, Megatron-LM's main_grad buffer and Megatron-FSDP, DeepSpeed's fp32 gradient
    partition, FSDP2's fp32 shards; each with its source), evaluated for every engine a batch holds
    (:func:`paraplan.engines.engine_select`). Parameter offload (ZeRO-Infinity) takes the parameters
    off the GPU, optimizer offload the optimizer states. In fp32 training (CPU validation) weights and
    gradients are 4 bytes and K = 8 (no master copy)."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp if shard_degree is None else shard_degree
    off = np.asarray(plan.offload_code) != Offload.NONE
    off_params = np.asarray(plan.offload_params, dtype=bool)
    args = StateArgs(params, n, np.asarray(plan.zero), off, element_bytes(plan), optimizer_bytes_per_param(plan), plan)
    weights, grads, optim = engine_select(plan, lambda spec: spec.model_states(args))
    return {"parameters": np.where(off_params, 0.0, weights),
            "gradients": np.asarray(grads),
            "optimizer_states": np.where(off, 0.0, optim)}


def unfused_score_bytes(model, plan):
    """Bytes per score element non-flash attention keeps for backward: UNFUSED_SCORE_BYTES with attention
    dropout, UNFUSED_SCORE_BYTES_NO_DROPOUT without (``model.dropout``), except under Scaling, whose eager
    attention keeps Korthikanti's 5 bytes either way: its OOM outcomes in the Hagemann et al. 2023 sweep
    (arXiv:2311.05610, non-flash runs of LLaMA 13B on 64 GPUs) say so (with 2
    bytes benchmarks/memory_fit.py's false fits rise from 4.2 % to 6.2 % of 522 runs)."""
    keeps_all = getattr(model, "dropout", True) | engine_flag(plan, "keeps_dropout_score_bytes")
    return np.where(keeps_all, UNFUSED_SCORE_BYTES, UNFUSED_SCORE_BYTES_NO_DROPOUT)


def score_elements(model, job, plan):
    """Elements of one layer's attention score matrix on a rank for one micro-batch:
    b·(a/t)·(s/cp)·s = T·a·s / t, T = b·s/cp the rank's tokens (Korthikanti et al. 2022, Table 2's
    5as²b/t term counts these at 5 bytes each). What unfused attention materializes; FlashAttention
    never holds it."""
    return tokens_per_rank(job, plan) * model.heads * job.seq_len / np.asarray(plan.tp, dtype=float)


def eager_rmsnorm_saved_bytes(plan):
    """Bytes per element an RMSNorm keeps beyond a fused kernel's: EAGER_RMSNORM_SAVED_BYTES_PER_ELEMENT
    where the plan runs the elementwise ops eager (``fused_elementwise`` False), else 0."""
    eager = ~np.asarray(getattr(plan, "fused_elementwise", True), dtype=bool)
    return np.where(eager, EAGER_RMSNORM_SAVED_BYTES_PER_ELEMENT, 0.0)


def eager_norm_saved_bytes(model, plan):
    """Bytes per hidden element one of the model's norms keeps beyond a fused kernel's:
    :func:`eager_rmsnorm_saved_bytes` for an RMSNorm model, else 0 (LayerNorm is one native kernel)."""
    return np.where(getattr(model, "norm", "rmsnorm") == "rmsnorm", eager_rmsnorm_saved_bytes(plan), 0.0)


def grouped_kv_expansion_bytes_per_token(model) -> float:
    """16-bit bytes per token an unfused attention core keeps beyond K and V under grouped-query
    attention: its batched matmuls take K and V repeated to every query head (Megatron-Core's
    DotProductAttention repeat_interleaves them; a broadcast matmul materializes the same) and keep
    those for backward, 2·((q − k) + (out − v)) in widths (0 under multi-head attention).
    FlashAttention reads the grouped K/V natively. Part of the attention core: selective
    recomputation of the core drops it with the scores."""
    return 2.0 * ((model.q_hidden - model.kv_hidden) + (model.attn_out_hidden - model.v_hidden))


def qk_norm_saved_bytes_per_token(model, plan):
    """16-bit bytes per token (over all tp ranks) a QK-norm model's query and key RMSNorms keep for
    backward (``model.qk_norm``; Megatron-Core's q_layernorm / k_layernorm, Qwen3's q_norm / k_norm):
    their input, the projection's q and k before the norm, 2·(q + k) (the normalized, rotated q and k
    the attention core keeps are counted with it already), and an eager RMSNorm's extra
    (:func:`eager_rmsnorm_saved_bytes`, its normalized output; a QK-norm is an RMSNorm whatever the model's
    other norms are). Kept under selective recomputation (the norms sit outside the attention core); 0
    without QK-norm."""
    if not getattr(model, "qk_norm", False):
        return 0.0
    width = model.q_hidden + model.kv_hidden
    return (2.0 + eager_rmsnorm_saved_bytes(plan) / (element_bytes(plan) / BYTES)) * width


def qk_norm_rstd_bytes_per_token(model):
    """Bytes per token (over all tp ranks) of the fp32 reciprocal RMS a QK-norm model's norms keep per
    query and key head (Transformer Engine's rsigma; an eager norm's rsqrt), whatever the precision:
    4·(heads + kv_heads); 0 without QK-norm."""
    return 4.0 * (model.heads + model.kv_heads) if getattr(model, "qk_norm", False) else 0.0


def te_fp8_linears(plan):
    """Whether the plan's linear layers keep their inputs as Transformer Engine's fp8 casts (an fp8
    dtype on Megatron-LM or the generic engine: ``Behaviour.saves_fp8_linear_inputs``)."""
    return is_fp8(plan.dtype) & engine_flag(plan, "saves_fp8_linear_inputs")


def fp8_norm_outputs(model) -> float:
    """Norm outputs per layer (averaged over dense and MoE layers) that a linear layer keeps as its
    fp8 input under Transformer Engine: the QKV projection's, and the FC1's of a dense layer. An MoE
    layer's pre-MLP norm output feeds the router, a 16-bit (or fp32) GEMM outside fp8 that keeps it
    in 16 bits (megatron/core/transformer/moe/router.py, router_gating_linear)."""
    share = model.moe_layers / model.layers if model.moe is not None else 0.0
    return 2.0 - share


def routed_copy_saved_bytes(model, plan, te_fp8):
    """Bytes an MoE layer keeps per routed token copy across the hidden width (16-bit units).

    * The experts' FC1 input: 2h, or h where Transformer Engine keeps its fp8 cast (its grouped GEMM
      saves the quantized input for the weight gradient); etp times under expert tensor parallelism,
      whose dispatchers all-gather the etp group's copies (Megatron-Core).
    * The experts' output, 2h, on every engine but Megatron-LM: a combine that weights each copy by
      its router score in autograd (torchtitan's MoE, a plain implementation) keeps a copy for the
      scores' gradient. Megatron-Core weights the copies inside the experts' activation instead
      (moe/experts.py: TEGroupedMLP's weighted_bias_swiglu_impl over permuted_probs, whose backward
      needs only FC1's output, already counted) and unpermutes without probabilities
      (moe/token_dispatcher.py, combine_postprocess), so it keeps none.

    LatentMoE: the copies are ℓ wide (``model.moe_width``; the projection runs before the dispatch)."""
    h = model.moe_width
    etp = np.asarray(getattr(plan, "etp", 1), dtype=float)
    input_bytes = np.where(te_fp8, quantized_bytes(plan.dtype), BYTES)
    output_bytes = np.where(engine_flag(plan, "router_weights_in_activation"), 0.0, BYTES)
    return (input_bytes * etp + output_bytes) * h


def hybrid_kind_activation_bytes(model, job, plan, recompute_code=None) -> dict:
    """Bytes one layer of each kind of a hybrid pattern keeps for backward for one micro-batch:
    {"mamba" | "attention" | "mlp" | "moe": bytes}. Every layer keeps its pre-norm's input and its first
    projection's input (2h + 2h per token, a sequence shard under sequence parallelism, and a 1-byte
    dropout mask h where the model trains with dropout); then

    * mamba: :func:`~paraplan.costmodels.mamba.mamba_saved_bytes_per_token` (in_proj's output, the scan's
      output, the gated norm's and out_proj's inputs, split over tp);
    * attention: Q, K, V and the output projection's input (2q + 2k + 2v + 2o per token over tp) and the
      softmax statistics (flash: 4 bytes per head and token) or the score matrices (unfused), and a
      QK-norm model's norm inputs, as a transformer layer keeps them;
    * mlp: the activation's input and output, (4 or 6)·f per token over tp;
    * moe: :func:`hybrid_moe_saved_bytes_per_token` (the experts' activations, the permuted copies, the
      router logits).

    Full recomputation keeps the layer's input (h per token, 16-bit); selective drops the attention core's
    scores where it recomputes them, and the E layers' moe, moe_act and shared_experts modules what they
    re-run (Megatron's other recompute modules are not modelled for hybrids; op-level SAC is priced as full)."""
    rc = np.asarray(plan.recompute_code if recompute_code is None else recompute_code)
    b = plan.micro_batch
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    wide = element_bytes(plan) / BYTES
    h = model.hidden
    shard = np.where(sp, t, 1.0)
    block = ((5 if getattr(model, "dropout", True) else 4) * h * T / shard) * wide
    full = element_bytes(plan) * h * T / shard
    refull = (rc == Recompute.FULL) | (rc == Recompute.OP_SAC)
    out = {}
    if model.kind_count("mamba"):
        sharded, _ = mamba_saved_bytes_per_token(model)
        out["mamba"] = np.where(refull, full, block + wide * sharded * T / t)
    if model.kind_count("attention"):
        q, hkv, v, o = model.q_hidden, model.kv_hidden, model.v_hidden, model.attn_out_hidden
        sharded = wide * (2 * q + 2 * hkv + 2 * v + 2 * o + qk_norm_saved_bytes_per_token(model, plan)) * T / t
        flash = np.asarray(plan.flash_attention, dtype=bool)
        scores = np.where(flash, 4.0 * model.heads * (T / b) * b / t,
                          wide * (unfused_score_bytes(model, plan) * score_elements(model, job, plan)
                                  + grouped_kv_expansion_bytes_per_token(model) * T / t))
        rstd = qk_norm_rstd_bytes_per_token(model) * T / t
        drop_scores = (rc == Recompute.SELECTIVE) & recomputes_attention_core(plan)
        out["attention"] = np.where(refull, full, block + sharded + rstd + np.where(drop_scores, 0.0, scores))
    if model.kind_count("mlp"):
        per_width = 6 if model.activation == "swiglu" else 4
        out["mlp"] = np.where(refull, full, block + wide * per_width * model.ffn_hidden * T / t)
    if model.kind_count("moe"):
        out["moe"] = np.where(refull, full, block + wide * hybrid_moe_saved_bytes_per_token(model, job, plan) * T / t)
    return out


def latent_saved_bytes_per_token(model) -> int:
    """16-bit bytes per token LatentMoE's projections keep beyond what the layer keeps anyway: fc2_latent_proj's
    input, the combined ℓ-wide output (2ℓ); fc1_latent_proj's input is the h-wide token the router and the
    shared experts read, counted with the block. 0 without a latent."""
    return 2 * model.moe.latent_size if model.moe is not None else 0


def hybrid_moe_saved_bytes_per_token(model, job, plan):
    """16-bit bytes per token (over tp) a hybrid E layer keeps beyond its block input, as a transformer MoE
    layer's MLP keeps them (:func:`activation_bytes_per_layer`): the experts' activation inputs and outputs,
    (4 or 6)·f_e per routed copy (top_k x expert_token_factor) and per shared expert, the permuted token
    copies the engine keeps (:func:`routed_copy_saved_bytes`) and the fp32 router logits (4E); less what the
    recompute modules moe, moe_act and shared_experts re-run instead of keeping."""
    e = model.moe
    per_width = 6 if model.activation == "swiglu" else 4
    routed = e.top_k * expert_token_factor(model, job)
    kept = (per_width * e.expert_ffn_hidden * (routed + e.shared_experts)
            + routed * routed_copy_saved_bytes(model, plan, te_fp8_linears(plan)) + 4 * e.experts
            + latent_saved_bytes_per_token(model))
    if not np.any(np.asarray(getattr(plan, "recompute_modules_mask", 0))):
        return kept
    # Megatron-Core's recompute modules (as recompute_modules_saved_bytes): moe keeps none of it, moe_act
    # drops the routed experts' activation output (FC2's input, 2·f_e per copy), shared_experts the shared
    # experts' FC1 outputs and activations
    has = partial(recomputes_module, plan)
    dropped = (np.where(has("moe_act"), 2 * e.expert_ffn_hidden * routed, 0.0)
               + np.where(has("shared_experts"), per_width * e.expert_ffn_hidden * e.shared_experts, 0.0))
    return np.where(has("moe"), 0.0, kept - dropped)


def activation_bytes_per_layer(model, job, plan, recompute_code=None):
    """Bytes one layer keeps for backward for one micro-batch (generalized Korthikanti Table 2),
    averaged over dense and MoE layers, or over a hybrid pattern's kinds (:func:`hybrid_kind_activation_bytes`). An MoE layer keeps, instead of the dense MLP's (4 or 6)·f
    bytes per token, the experts' (4 or 6)·f_e per routed token copy (top_k x expert_token_factor)
    and per shared expert, the permuted token copies the engine keeps (:func:`routed_copy_saved_bytes`)
    and fp32 router logits (4E)."""
    if getattr(model, "layer_pattern", ""):
        kinds = hybrid_kind_activation_bytes(model, job, plan, recompute_code)
        return sum(model.kind_share(k) * v for k, v in kinds.items())
    rc = np.asarray(plan.recompute_code if recompute_code is None else recompute_code)
    b = plan.micro_batch
    T = tokens_per_rank(job, plan)                 # b · s / cp
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    h, hkv, f, a = model.hidden, model.kv_hidden, model.ffn_hidden, model.heads
    # norm inputs (2 x 2h), QKV and FC1 inputs (2 x 2h), the two 1-byte dropout masks (2h, none
    # for a model trained without dropout)
    unsharded = (10 if getattr(model, "dropout", True) else 8) * h * T / np.where(sp, t, 1.0)
    unfused = ~np.asarray(getattr(plan, "fused_elementwise", True), dtype=bool)
    # (16-bit units: activation-wide terms are scaled by element_bytes / BYTES below)
    unsharded = unsharded + 2 * eager_norm_saved_bytes(model, plan) / (element_bytes(plan) / BYTES) * h * T / np.where(sp, t, 1.0)
    # Scaling keeps the all-gathered linear inputs under sequence parallelism (shard 1/t counted above)
    gathered_inputs = engine_flag(plan, "saves_gathered_sp_inputs")
    unsharded = unsharded + np.where(gathered_inputs & sp, SCALING_SP_GATHERED_SAVED_BYTES_PER_HIDDEN * h * T * (1 - 1 / t), 0.0)
    eager_swiglu = (unfused | engine_flag(plan, "eager_elementwise")) & (model.activation == "swiglu")
    te_fp8 = te_fp8_linears(plan)        # Transformer Engine keeps the linear layers' inputs as fp8 casts
    per_width = 6 if model.activation == "swiglu" else 4
    mlp = per_width * f
    fc2_inputs = f                       # elements per token entering the MLP's down projection(s)
    if model.moe is not None:
        e = model.moe
        routed = e.top_k * expert_token_factor(model, job)
        moe_mlp = per_width * e.expert_ffn_hidden * (routed + e.shared_experts) \
            + routed * routed_copy_saved_bytes(model, plan, te_fp8) + 4 * e.experts + latent_saved_bytes_per_token(model)
        share = model.moe_layers / model.layers
        mlp = (1 - share) * mlp + share * moe_mlp
        fc2_inputs = (1 - share) * f + share * e.expert_ffn_hidden * (routed + e.shared_experts)
    # (per element entering the down projections: an MoE layer's experts' widths per routed copy)
    mlp = mlp + np.where(eager_swiglu, UNFUSED_SWIGLU_SAVED_BYTES_PER_FFN * fc2_inputs, 0.0)
    q, v, out = model.q_hidden, model.v_hidden, model.attn_out_hidden
    sharded = (2 * q + 2 * hkv + 2 * v + 2 * out + mlp) * T / t    # Q, K, V, out-proj input, MLP
    sharded = sharded + qk_norm_saved_bytes_per_token(model, plan) * T / t
    # latent attention: the up-projections' inputs, its latents, on every tp rank
    unsharded = unsharded + 2 * model.mla_latent_width * T
    # Transformer Engine in fp8 saves its linear layers' inputs as the fp8 casts it fed the GEMMs:
    # BYTES - TE_FP8_BYTES_PER_ELEMENT less per element of the norm outputs a linear layer takes
    # (fp8_norm_outputs) and of FC2's input, an fp8 copy more of the out-projection's input
    fp8_saving = BYTES - quantized_bytes(plan.dtype)    # TE_FP8_BYTES_PER_ELEMENT under fp8, less under fp4
    unsharded = unsharded - np.where(te_fp8, fp8_saving * fp8_norm_outputs(model) * h * T / np.where(sp, t, 1.0), 0.0)
    sharded = sharded + np.where(te_fp8, (quantized_bytes(plan.dtype) * out - fp8_saving * fc2_inputs) * T / t, 0.0)
    # Scaling: FlashAttention's own saved output besides the projection's input (a permuted copy)
    sharded = sharded + np.where(engine_flag(plan, "saves_permuted_flash_output") & np.asarray(plan.flash_attention, dtype=bool),
                                 SCALING_FLASH_OUTPUT_SAVED_BYTES_PER_HIDDEN * out * T / t, 0.0)
    if model.moe is not None and model.moe.dispatch == "einsum":
        # the 16-bit dispatch mask and combine weights (S x E·C each) saved for the einsum GEMMs'
        # backward, on every tp rank (moe.moe_einsum_dispatch_times)
        S, slots = einsum_dispatch_slots(model, job, plan)
        unsharded = unsharded + model.moe_layers / model.layers * 4 * S * slots
    s_l = T / b
    flash = np.asarray(plan.flash_attention, dtype=bool)
    scores = np.where(flash, 4.0 * a * s_l * b / t,   # fp32 stats
                      unfused_score_bytes(model, plan) * score_elements(model, job, plan)
                      + grouped_kv_expansion_bytes_per_token(model) * T / t)
    wide = element_bytes(plan) / BYTES         # fp32 activations: twice the 16-bit bytes
    rstd = qk_norm_rstd_bytes_per_token(model) * T / t        # fp32 whatever the precision
    none = wide * (unsharded + sharded + scores) + rstd
    selective = wide * (unsharded + sharded + np.where(recomputes_attention_core(plan), 0.0, scores)
                        - recompute_modules_saved_bytes(model, job, plan, te_fp8, eager_swiglu)) + rstd
    full = element_bytes(plan) * h * T / np.where(sp, t, 1.0)
    op_sac = wide * op_sac_saved_bytes_per_token(model, plan) * T + np.where(
        np.asarray(plan.flash_attention, dtype=bool), wide * scores, 0.0)
    return np.where(rc == Recompute.FULL, full, np.where(rc == Recompute.SELECTIVE, selective,
                                                         np.where(rc == Recompute.OP_SAC, op_sac, none)))


def recompute_modules_saved_bytes(model, job, plan, te_fp8, eager_swiglu):
    """16-bit bytes per layer and micro-batch that Megatron-Core's fine-grained recomputation
    (``plan.recompute_modules``) does not keep, against what :func:`activation_bytes_per_layer` counts
    for selective recomputation (averaged over dense and MoE layers like it):

    * layernorm: the two norm outputs (the QKV / down-projection input and the FC1 / router input),
      2·2h per token (÷ t under sequence parallelism; 1 byte each where Transformer Engine keeps fp8 casts,
      but for the router's input: :func:`fp8_norm_outputs`);
    * mla_up_proj: the up-projections' outputs after RoPE, i.e. the attention core's Q, K, V
      (2·(q + k + v) per token ÷ t); the latents they come from stay;
    * moe_act: the routed experts' activation output (FC2's input), f_e per routed token copy;
    * mlp: everything inside a dense MLP but its input: (4 or 6)·f per token (and eager SwiGLU's extra);
    * moe: everything inside an MoE layer but its input: the experts' FC1 outputs and activations, the
      permuted token copies (:func:`routed_copy_saved_bytes`), the fp32 router logits (covers moe_act
      and shared_experts);
    * shared_experts: the shared experts' FC1 outputs and activations.
    core_attn is the difference between ``none`` and ``selective`` already (the attention scores or
    their softmax statistics). Source: megatron/core/transformer/transformer_config.py
    (recompute_modules), transformer_layer.py and moe/experts.py (CheckpointWithoutOutput)."""
    if not np.any(np.asarray(getattr(plan, "recompute_modules_mask", 0))):
        return 0.0
    has = partial(recomputes_module, plan)
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp_div = np.where(np.asarray(plan.sp, dtype=bool), t, 1.0)
    h, f = model.hidden, model.ffn_hidden
    fp8_saving = np.where(te_fp8, BYTES - quantized_bytes(plan.dtype), 0.0)
    linear_input = BYTES - fp8_saving                    # bytes per element of a saved linear-layer input
    per_width = 6 if model.activation == "swiglu" else 4
    share = model.moe_layers / model.layers if model.moe is not None else 0.0
    norms = (2 * BYTES - fp8_saving * fp8_norm_outputs(model)) * h * T / sp_div
    up_proj = (2 * model.q_hidden + 2 * model.kv_hidden + 2 * model.v_hidden) * T / t if model.mla else 0.0
    dense_mlp = (1 - share) * (per_width * f - fp8_saving * f
                               + np.where(eager_swiglu, UNFUSED_SWIGLU_SAVED_BYTES_PER_FFN * f, 0.0)) * T / t
    moe_all = moe_act = shared = 0.0
    if model.moe is not None:
        e = model.moe
        routed = e.top_k * expert_token_factor(model, job)
        fe = e.expert_ffn_hidden
        moe_all = share * ((per_width * fe - fp8_saving * fe) * (routed + e.shared_experts)
                           + routed * routed_copy_saved_bytes(model, plan, te_fp8) + 4 * e.experts
                           + latent_saved_bytes_per_token(model)) * T / t
        moe_act = share * linear_input * fe * routed * T / t
        shared = share * (per_width * fe - fp8_saving * fe) * e.shared_experts * T / t
    in_moe = np.where(has("moe"), moe_all, np.where(has("moe_act"), moe_act, 0.0) + np.where(has("shared_experts"), shared, 0.0))
    return (np.where(has("layernorm"), norms, 0.0) + np.where(has("mla_up_proj"), up_proj, 0.0)
            + np.where(has("mlp"), dense_mlp, 0.0) + in_moe)


def op_sac_saved_bytes_per_token(model, plan):
    """16-bit bytes per token one layer keeps under torchtitan's op-level SAC
    (``torchtitan/models/llama3/infra/parallelize.py``, ``_save_list`` and the "save every other mm"
    policy): the layer input, the attention output, and the outputs of the 1st, 3rd, 5th and 7th
    matmuls (wq, wv, w1, w2 for Llama; wq, wv, fc1 for a GELU MLP); everything else (norms, the other
    matmuls, the activation function) is recomputed. Sharded over tp except the layer input (and the
    partial-sum w2 output) without sequence parallelism. For Llama 3 8B this is 0.43 of what
    ``none`` keeps, as measured on torchtitan (issue 14)."""
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    h, hkv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    w2_out = 2 * h if model.activation == "swiglu" else 0
    unsharded = (2 * h + w2_out) / np.where(sp, t, 1.0)
    q = model.q_hidden
    sharded = (2 * q + 2 * hkv + 2 * q + 2 * f) / t
    return unsharded + sharded


def attention_transient_bytes(model, job, plan):
    """Bytes unfused attention's backward holds for one layer at a time:
    UNFUSED_ATTENTION_TRANSIENT_BYTES per element of the rank's b·(a/t)·(s/cp)·s score matrix; 0 with
    FlashAttention (it recomputes the scores block by block)."""
    flash = np.asarray(plan.flash_attention, dtype=bool)
    return np.where(flash, 0.0, UNFUSED_ATTENTION_TRANSIENT_BYTES * score_elements(model, job, plan))


def allocator_bytes(memory, plan, on_cuda, runtime_reserved=0.0):
    """What the caching allocator reserves beyond the allocated tensor bytes (0 off CUDA: a CPU rank
    allocates with malloc): ALLOCATOR_RESERVE_BYTES + the engine's fraction (:func:`allocator_fragmentation`)
    x the bytes that churn.
    ``memory`` holds the terms parameters, gradients, optimizer_states, activations, buffers. The
    named engines keep model states in flat buffers allocated once (Megatron-LM's contiguous
    param/grad buffers, DeepSpeed's flattened groups and partitions, FSDP2's sharded parameters), so
    only activations and buffers fragment; the generic engine (per-tensor eager code) fragments
    everything. Scaling (whose per-step gradients come back in the same blocks every step) fragments
    its activations and buffers by SCALING_ALLOCATOR_FRAGMENTATION (calibrated on Hagemann et al.
    2023's sweep, which ran on it). With expandable segments (``plan.expandable_segments``) nothing
    fragments: PyTorch's allocator then maps 2 MiB pages into one growing virtual segment, and before it
    would fail an allocation it unmaps the free blocks' pages and maps them where the request lands
    (c10/cuda/CUDACachingAllocator.cpp, ExpandableSegment; release_cached_blocks on a failed
    allocation); the constant ALLOCATOR_RESERVE_BYTES stays.

    An engine whose communication buffers are allocated once and reused (``Behaviour.persistent_comm_buffers``)
    holds them (``memory["buffers"]`` beyond ``runtime_reserved``) outside the churn: Megatron-FSDP's double
    buffers (--fsdp-double-buffer: FixedPoolAllocator in
    megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py, "a fixed pool of
    pre-allocated buffers, reusing them to reduce the overhead and fragmentation caused by frequent
    allocation and deallocation of temporary buffers"). The others' count: DeepSpeed's buckets included,
    whose measured reserved peaks (the BLOOM prototypes' peak-memory rows, Megatron-DeepSpeed at ZeRO-1)
    are under-predicted more without them (MAPE 7.0 -> 7.9 %)."""
    buffers = np.asarray(memory["buffers"])
    churn = np.asarray(memory["activations"]) + np.where(engine_flag(plan, "persistent_comm_buffers"),
                                                         np.minimum(buffers, runtime_reserved), buffers)
    every = churn + sum(np.asarray(memory[k]) for k in ("parameters", "gradients", "optimizer_states"))
    frag = np.where(engine_flag(plan, "flat_state_buffers"), churn, every)
    fraction = allocator_fragmentation(plan)
    fraction = np.where(np.asarray(getattr(plan, "expandable_segments", False), dtype=bool), 0.0, fraction)
    return np.where(on_cuda, ALLOCATOR_RESERVE_BYTES + fraction * frag, 0.0)


def allocator_fragmentation(plan):
    """Share of the churning bytes the caching allocator strands, by the plan's engine
    (``Behaviour.allocator_fragmentation`` names the fitted entry): ALLOCATOR_FRAGMENTATION (generic,
    DeepSpeed, torchtitan), SCALING_ALLOCATOR_FRAGMENTATION, MEGATRON_ALLOCATOR_FRAGMENTATION."""
    return engine_select(plan, lambda spec: (FRAGMENTATION_BY_ENTRY[spec.behaviour.allocator_fragmentation],))[0]


#: Transformer Engine's fused cross-entropy (transformer_engine/pytorch/cross_entropy.py, its Triton kernel
#: triton/cross_entropy.py: an online softmax over the 16-bit logits whose gradient is stored in the input
#: tensor) holds only the 16-bit logits
TE_CROSS_ENTROPY_BYTES_PER_LOGIT = 2.0


def loss_bytes_per_logit(plan):
    """Peak bytes per logit element (tokens x vocabulary / tp) while the loss runs, by the plan's engine
    (``Behaviour.loss_bytes_per_logit``; per plan of a batch): generic one fp32 copy (the accounting the
    published runs were checked with); megatron its fused vocab-parallel cross-entropy (2 + 4), or
    TE_CROSS_ENTROPY_BYTES_PER_LOGIT with Transformer Engine's (``plan.te_cross_entropy``, where the
    engine offers it); deepspeed and torchtitan plain PyTorch cross-entropy on fp32-upcast logits
    (2 + 4 + 4); scaling SCALING_LOSS_BYTES_PER_LOGIT over logits gathered over tp. The derivations are
    with the specs."""
    te = np.asarray(getattr(plan, "te_cross_entropy", False), dtype=bool) & engine_offers(plan, "te_cross_entropy")
    return np.where(te, TE_CROSS_ENTROPY_BYTES_PER_LOGIT, engine_flag(plan, "loss_bytes_per_logit"))


def loss_logits_per_token(model, plan):
    """Logits one GPU holds per token while the loss runs: V / tp for a vocabulary-parallel loss, V
    where the engine gathers the logits over tp (``Behaviour.vocab_parallel_loss``)."""
    t = np.asarray(plan.tp, dtype=float)
    return model.vocab / np.where(engine_flag(plan, "vocab_parallel_loss"), t, 1.0)


def v_and_dual_in_flight(job, plan):
    """Micro-batches (in whole stages' worth of layers) every rank holds at its peak under ZBV, DualPipe
    and DualPipeV, whose peaks are the same on every rank (NaN for the other schedules):

    * ZBV: min(m, p), 1F1B's first stage on every rank (Qi et al. 2024 sec. 6, "the same peak memory
      as 1F1B", balanced over the ranks; torch.distributed.pipelining's ScheduleZBVZeroBubble tables at
      PyTorch 2.13 peak at 2p half-stage chunk forwards on every rank, e.g. 16 at p = 8, m = 32);
    * DualPipe: min(m, p + 1) (DeepSeek-V3 technical report Table 2, "Activation PP+1");
    * DualPipeV: min(m, p + 1/2), 2p + 1 half-stage chunks (ScheduleDualPipeV's tables: 17 at p = 8,
      m = 32 or 64; DualPipe's p + 1 over 2p half-size chunks)."""
    m = micro_batches(job, plan)
    p = np.asarray(plan.pp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    return np.where(sc == Schedule.ZBV, np.minimum(m, p),
                    np.where(sc == Schedule.DUALPIPE, np.minimum(m, p + 1),
                             np.where(sc == Schedule.DUALPIPE_V, np.minimum(m, p + 0.5), np.nan)))


def _with_v_and_dual(job, plan, counts):
    """``counts`` with :func:`v_and_dual_in_flight` where the plan runs ZBV, DualPipe or DualPipeV (pp > 1)."""
    new = is_schedule(plan, Schedule.ZBV, Schedule.DUALPIPE, Schedule.DUALPIPE_V) & (np.asarray(plan.pp) > 1)
    if not np.any(new):
        return counts
    return np.where(new, v_and_dual_in_flight(job, plan), counts)


def in_flight_micro_batches_middle(job, plan):
    """Micro-batches a middle stage holds at its peak, bounded by stage 1's: min(m, p − 1) under
    1F1B and ZB-H1, m under GPipe (the interleaved schedule keeps stages even, so its middle
    stages never exceed the first: the first stage's count); ZBV, DualPipe and DualPipeV:
    :func:`v_and_dual_in_flight`."""
    m = micro_batches(job, plan)
    p = np.asarray(plan.pp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    counts = np.where(sc == Schedule.GPIPE, m, np.where(sc == Schedule.INTERLEAVED, in_flight_micro_batches(job, plan),
                                                        np.minimum(m, np.maximum(p - 1, 1.0))))
    return _with_v_and_dual(job, plan, counts)


def in_flight_micro_batches_last(job, plan):
    """Micro-batches (in whole stages' worth of layers) whose activations the last stage holds at
    its peak: 1 under 1F1B and ZB-H1 (each forward meets its backward at once), m under GPipe, and
    ((v − 1)·p + 1)/v under the interleaved schedule: the last rank's warm-up runs (v − 1)·p chunk
    forwards before its first backward (Megatron-LM's interleaved schedule; num_warmup_microbatches
    = (p − rank − 1)·2 + (v − 1)·p), each chunk 1/v of the stage's layers."""
    m = micro_batches(job, plan)
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    interleaved = np.minimum(((v - 1) * p + 1) / v, m)
    counts = np.where(p == 1, 1.0, np.where(sc == Schedule.GPIPE, m, np.where(sc == Schedule.INTERLEAVED, interleaved, 1.0)))
    return _with_v_and_dual(job, plan, counts)


def in_flight_micro_batches(job, plan):
    """Micro-batches (in whole stages' worth of layers) whose activations the first stage holds at its
    peak: min(m, p) under 1F1B and ZB-H1, m under GPipe, and p·(1 + (p − 1)/(p·v)) under the
    interleaved schedule (Korthikanti et al. 2022 sec. 4.2.3; Megatron-LM's first rank runs
    (p − 1)·2 + (v − 1)·p warm-up chunk forwards and one more before its first backward, the same
    count), but never more than the m micro-batches there are: with m = p the warm-up runs every chunk
    of every micro-batch (validate's tp 2 pp 2 vpp 8 plan at m = 2 held 16 layers' worth, not 17)."""
    m = micro_batches(job, plan)
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    sc = np.asarray(plan.schedule_code)
    one_f_one_b = np.minimum(m, p)
    interleaved = np.minimum(p * (1 + (p - 1) / (p * v)), m)
    counts = np.where(p == 1, 1.0, np.where(sc == Schedule.GPIPE, m,
                                            np.where(sc == Schedule.INTERLEAVED, interleaved, one_f_one_b)))
    return _with_v_and_dual(job, plan, counts)


def held_stage_output_bytes(model, job, plan) -> dict:
    """Bytes of stage outputs the pipeline runtime holds at a stage's peak, on the first, a middle and
    the last stage: one hidden state per in-flight micro-batch, element_bytes·T·h (a sequence shard,
    /tp, under sequence parallelism), once per model chunk under the interleaved schedule, on every
    stage but the last (whose output is the loss), for engines whose runtime keeps them
    (``Behaviour.holds_stage_outputs``: DeepSpeed's PipelineEngine in pipe_buffers['outputs'] (a 1/tp slice
    only under partition_activations; not modelled), torch.distributed.pipelining (torchtitan) in its
    stage's fwd_cache, Scaling in its PIPELINE_STAGE_OUTPUT buffer until the gradient arrives; Megatron-LM
    frees the data once sent and keeps only the autograd node, deallocate_output_tensor; the generic engine
    keeps the papers' accounting, which counts none); 0 at pp 1. Under interleaving the last stage holds the outputs
    of its non-final chunks: (v − 1)·p of them in flight (the warm-up forwards of Megatron's
    interleaved schedule on the last rank)."""
    p = np.asarray(plan.pp, dtype=float)
    v = np.where(np.asarray(plan.schedule_code) == Schedule.INTERLEAVED, np.asarray(plan.vpp, dtype=float), 1.0)
    # ZBV and DualPipeV: the in-flight count is in stages' worth, each of two half-stage chunks that each
    # keep an output (torch.distributed.pipelining's fwd_cache per stage); their last rank holds the
    # outputs of its first chunk like any other (its second chunk is not the loss)
    v_shape = is_schedule(plan, *V_SCHEDULES) & (np.asarray(plan.pp) > 1)
    v = np.where(v_shape, 2.0, v)
    hidden = stage_output_bytes(model, job, plan)
    holds = (p > 1) & engine_flag(plan, "holds_stage_outputs")
    first = np.where(holds, hidden * v * in_flight_micro_batches(job, plan), 0.0)
    middle = np.where(holds, hidden * v * in_flight_micro_batches_middle(job, plan), 0.0)
    last = np.where(holds, np.where(v_shape, hidden * v * in_flight_micro_batches_last(job, plan),
                                    hidden * np.maximum(v - 1.0, 0.0) * p), 0.0)
    return {"first": first, "middle": middle, "last": last}


def rematerialized_layer_bytes(model, job, plan, per_layer, layer_none):
    """Bytes one layer's recomputation brings back while that layer runs backward, one layer and one
    micro-batch at a time, beside everything the stage keeps: what the layer dropped,
    ``layer_none − per_layer``, under every recomputation policy (full: all but its input; selective
    with its modules; torchtitan's op-level SAC), less an unfused attention's dropped score matrix,
    which :func:`attention_transient_bytes` holds already; 0 without recomputation. (Counting the
    dropped part only under full recomputation let op-SAC plans hold less than full recomputation;
    counting full's whole layer let full hold its input twice, and more than op-SAC on a one-layer
    stage.)"""
    rc = np.asarray(plan.recompute_code)
    flash = np.asarray(plan.flash_attention, dtype=bool)
    wide = element_bytes(plan) / BYTES
    scores_dropped = (rc == Recompute.OP_SAC) | ((rc == Recompute.SELECTIVE) & recomputes_attention_core(plan))
    unfused_scores = np.where(~flash & scores_dropped,
                              wide * unfused_score_bytes(model, plan) * score_elements(model, job, plan), 0.0)
    dropped = np.maximum(0.0, layer_none - per_layer - unfused_scores)
    return np.where(rc == Recompute.NONE, 0.0, dropped)


def backward_working_bytes(model, job, plan, per_layer=None):
    """Bytes alive beside everything a stage keeps while one layer runs backward, one micro-batch:
    every recomputation policy rematerializes what a layer dropped, one layer at a time
    (:func:`rematerialized_layer_bytes`); unfused attention's backward holds the layer's score matrix
    and its gradients (:func:`attention_transient_bytes`); the engine's gradient temporaries
    (:func:`backward_layer_transient`). ``per_layer``: :func:`activation_bytes_per_layer` when the
    caller has it already."""
    if per_layer is None:
        per_layer = activation_bytes_per_layer(model, job, plan)
    layer_none = activation_bytes_per_layer(model, job, plan, recompute_code=Recompute.NONE)
    return rematerialized_layer_bytes(model, job, plan, per_layer, layer_none) \
        + attention_transient_bytes(model, job, plan) + backward_layer_transient(plan) * layer_none


def activation_bytes(model, job, plan) -> dict:
    """Peak activation bytes on the first, the largest middle (0 without one) and the last stage,
    each from its own layer count (``paraplan.plan.stage_layers``): the layers' saved tensors per
    in-flight micro-batch, the embedding's dropout mask, the stage outputs the pipeline runtime holds
    (:func:`held_stage_output_bytes`), the loss's inputs on the last stage, and the backward working
    set (:func:`backward_working_bytes`)."""
    p = np.asarray(plan.pp, dtype=float)
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    per_layer = activation_bytes_per_layer(model, job, plan)
    sl = model_stage_layers(model, plan)          # multi-token-prediction blocks on the last stage
    working = backward_working_bytes(model, job, plan, per_layer)
    hidden_shard = T * model.hidden / np.where(sp, t, 1.0)
    # the embedding's dropout mask, where the model trains with dropout: its output is the first
    # layer's input, which per_layer counts already (counting it here too held it twice per in-flight
    # micro-batch: validate's pp 2 stage 0 with full recomputation measured 1.06 MB against 1.57)
    embedding_out = float(getattr(model, "dropout", True)) * hidden_shard
    # the loss's logits, the final norm's input and the output layer's input (the norm's output;
    # Korthikanti et al. 2022 section 4.3: 4sbh/t besides the 4sbv/t of the loss; what an eager RMSNorm
    # keeps besides), each a sequence shard under sequence parallelism; once more per
    # multi-token-prediction depth
    logits = (1 + model.mtp_layers) * (loss_bytes_per_logit(plan) * T * loss_logits_per_token(model, plan)
                                       + (2 * element_bytes(plan) + eager_norm_saved_bytes(model, plan)) * hidden_shard)
    inflight = in_flight_micro_batches(job, plan)
    # activation offload (pp = 1 only): the offloaded layers' activations live in host memory, one
    # layer's in transit (offloaded while the next computes, prefetched one layer ahead in backward)
    gpu_layers = sl.first - activation_offload_gpu_relief(plan)
    held = held_stage_output_bytes(model, job, plan)
    first = gpu_layers * per_layer * inflight + embedding_out * inflight + held["first"] + working
    last_inflight = in_flight_micro_batches_last(job, plan)
    # GPipe runs every forward, the loss's included, before the first backward: m micro-batches' logits
    gpipe = np.asarray(plan.schedule_code) == Schedule.GPIPE
    last = sl.last * per_layer * last_inflight + logits * np.where(gpipe, last_inflight, 1.0) + held["last"] + working
    middle = np.where(sl.middle > 0, sl.middle * per_layer * in_flight_micro_batches_middle(job, plan)
                      + held["middle"] + working, 0.0)
    first = np.where(p == 1, first + logits, first)
    return {"first": first, "middle": middle, "last": np.where(p == 1, first, last)}


# While one layer runs backward its gradient temporaries are alive beside everything the stage keeps,
# and, under full recomputation, beside the layer's rematerialized activations: a working set of
# SCALING_BACKWARD_LAYER_TRANSIENT x that layer's no-recompute activations on top of the stage's peak, on
# every stage and whatever the recomputation. Scaling's eager backward (fp32 norm upcasts, eager
# SwiGLU, permuted attention copies) makes these many and odd-sized; its value is calibrated on the
# sweep's fit/OOM outcomes (benchmarks/memory_fit.py) with SCALING_ALLOCATOR_FRAGMENTATION held at
# 0.40, by the same rule (the smallest value reaching the lowest false-fit rate with false OOMs at
# most 5 %): 0.0: 6.6 % false fits / 3.0 % false OOMs, 0.6: 6.2 / 3.4, 1.0: 5.0 / 4.2, 1.2: 4.2 / 4.2,
# 1.6: 4.2 / 4.2. At 1.2, six OOM runs that were predicted to fit are judged OOM (all six under full
# recomputation: the working set is most of what such a stage holds besides model states) and three
# runs that ran are judged over, by 0.6-1.4 GiB of 80. The named engines' fused backward has no
# fit/OOM data here: 0, as before.
SCALING_BACKWARD_LAYER_TRANSIENT = fitted("scaling_backward_layer_transient")


def backward_layer_transient(plan):
    """The backward working set in layers' worth of no-recompute activations: SCALING_BACKWARD_LAYER_TRANSIENT
    for an engine whose eager code leaves such temporaries (``Behaviour.eager_temporaries``: scaling), 0
    for the others."""
    return np.where(engine_flag(plan, "eager_temporaries"), SCALING_BACKWARD_LAYER_TRANSIENT, 0.0)


def activation_offload_gpu_relief(plan):
    """Layers' worth of activations that activation offload takes off the GPU: N - 1 for N > 0
    offloaded layers (one layer is in transit at any moment), 0 without."""
    n = np.asarray(getattr(plan, "offload_activation_layers", 0), dtype=float)
    return np.maximum(n - 1.0, 0.0)


def offloaded_activation_bytes(model, job, plan):
    """Bytes of one micro-batch's activations that activation offload moves to the host (and back):
    N layers' saved tensors (:func:`activation_bytes_per_layer`; not evaluated when no plan offloads,
    the planner's usual batch)."""
    n = np.asarray(getattr(plan, "offload_activation_layers", 0), dtype=float)
    if not n.any():
        return n * 0.0
    return n * activation_bytes_per_layer(model, job, plan)


def gathered_layer_params(model, plan):
    """Parameters of the largest layer a GPU holds whole while ZeRO-3 / FSDP has it gathered (its
    gradients unsharded likewise): a dense layer's over tp, or an MoE layer's attention, norms, router
    and shared experts over tp plus its local routed experts, E/ep of them, each over etp (the expert
    shard's gather runs over the expert-data-parallel group and brings back all of them)."""
    t = np.asarray(plan.tp, dtype=float)
    e = model.moe
    hybrid = e is not None and bool(getattr(model, "layer_pattern", ""))
    if hybrid:      # a hybrid's largest Mamba, attention or MLP layer, and its E layers without attention
        dense = max((model.kind_params(k) for k in ("mamba", "attention", "mlp") if model.kind_count(k)), default=0) / t
    else:
        dense = model.params_per_layer / t
    if e is None:
        return dense
    shared = ((model.kind_params("moe") - model.routed_expert_params_per_moe_layer) / t if hybrid else
              (model.attention_params_per_layer + model.norm_params_per_layer + model.router_params
               + model.latent_projection_params + e.shared_experts * model.expert_mlp_params) / t)
    local = e.experts / np.asarray(plan.ep, dtype=float) * model.routed_expert_mlp_params / np.asarray(plan.etp, dtype=float)
    moe = shared + local
    return np.maximum(dense, moe) if model.dense_layers else moe


RUNTIME_RESERVED_BYTES = fitted("runtime_reserved")
RUNTIME_RESERVE_ASSUMPTION = ("1 GiB-class runtime reserve (CUDA context, NCCL, cuBLAS workspaces) of 1.5 GiB per GPU "
                              "(none on a profiled CPU device)")


def on_cuda(cluster) -> bool:
    """Whether the device runs the CUDA runtime and caching allocator (not a profiled CPU)."""
    return not device_is_host(cluster)


def runtime_reserved_bytes(cluster) -> float:
    """The per-GPU runtime reserve: none for a profiled CPU device (no CUDA context or NCCL)."""
    return RUNTIME_RESERVED_BYTES if on_cuda(cluster) else 0.0


def runtime_reserve_assumption(**_) -> tuple[str, ...]:
    """The runtime reserve :func:`buffer_bytes` counts (RUNTIME_RESERVED_BYTES)."""
    return (RUNTIME_RESERVE_ASSUMPTION,)


def buffer_bytes(model, plan, runtime_reserved_bytes):
    """Runtime reserve (CUDA context, NCCL and cuBLAS workspaces) and the engine's communication
    buffers, its spec's ``buffers`` (``paraplan.engines.specs``, each with its source): gathered
    parameters (ZeRO-3's current and prefetched layer; FSDP2's from ZeRO-2 with one layer's gradients
    and their fp32 copy), Megatron-FSDP's double buffers, DeepSpeed's buckets (and ZeRO-Offload's under
    any engine that offloads), for the largest layer a GPU gathers (:func:`gathered_layer_params`: an
    MoE layer with its local experts). Megatron-LM up to ZeRO-1 reduces and gathers in place in its
    contiguous buffers (counted as model states)."""
    args = BufferArgs(gathered_layer_params(model, plan), np.asarray(plan.zero),
                      np.asarray(plan.offload_code) != Offload.NONE, element_bytes(plan), plan)
    gathered, grads, buckets = engine_select(plan, lambda spec: spec.buffers(args))
    return runtime_reserved_bytes + gathered + grads + buckets


FP8_WEIGHT_COPY_BYTES = 2   # an fp8 copy of a weight and its transpose (Hopper's fp8 GEMMs are TN only)
# (times paraplan.modes.quantized_bytes: 1 under fp8; under NVFP4 the row- and column-wise 4-bit copies
# with their E4M3 block scales, 2 x 0.5625 = 1.125 bytes per parameter; Transformer Engine's NVFP4 weights
# keep both usages, quantized once per step in 16x16 blocks)


def megatron_fp8_params(plan):
    """Per plan: whether Megatron-LM's parameters are the fp8 tensors themselves (``plan.fp8_param_gather``,
    --fp8-param-gather, on an engine that has it, under an fp8 dtype)."""
    on = np.asarray(getattr(plan, "fp8_param_gather", False), dtype=bool)
    return on & engine_offers(plan, "fp8_param_gather") & is_fp8(plan.dtype)


def fp8_weight_copy_bytes(model, stage_params, plan):
    """fp8 copies of the weights that live through a step under an fp8 dtype (0 otherwise):

    * Megatron-LM / generic (Transformer Engine): each linear layer keeps its weight quantized once
      per step (``is_first_microbatch``) with its transpose, 2 bytes per parameter of the stage
      (``stage_params``, per GPU); under ZeRO-3 only the gathered layers (current and prefetched,
      :func:`gathered_layer_params`);
    * torchtitan (torchao float8): weights are cast on the fly in each forward and backward, so only
      the layer in flight has a copy (2 bytes per parameter of one layer).
    * Megatron-LM with fp8 parameters (``plan.fp8_param_gather``, --fp8-param-gather): none. The
      parameter is the fp8 tensor (Transformer Engine's fp8_model_init: a Float8Tensor's data and its
      cached transpose, or an MXFP8 tensor's row- and column-wise data, 1 + 1 bytes) in place of the
      16-bit weight :func:`model_state_bytes` counts at 2 bytes, so nothing is added to it.
    Source: Transformer Engine ``Linear`` (fp8 weight workspace cached across micro-batches),
    torchao ``Float8Linear`` (casts per call); Megatron-Core ``fp8_param_gather`` (TransformerConfig,
    the distributed optimizer's fp8 parameter all-gather)."""
    if not is_fp8(plan.dtype):
        return np.zeros_like(np.asarray(stage_params, dtype=float))
    layer = gathered_layer_params(model, plan)
    z3 = np.asarray(plan.zero) >= 3
    kept = np.where(z3, 2 * layer, np.asarray(stage_params, dtype=float))
    return np.where(megatron_fp8_params(plan), 0.0,
                    FP8_WEIGHT_COPY_BYTES * quantized_bytes(plan.dtype)
                    * np.where(engine_flag(plan, "caches_fp8_weights"), kept, layer))


NVME_STAGING_PARAMS = 1e9   # DeepSpeed ZeRO-Infinity sub_group_size default (elements staged on the host)


def offloaded_bytes_per_gpu(shard, plan) -> dict:
    """Host-memory and NVMe bytes of one GPU's shard of ``shard`` parameters under offload.

    ZeRO-Offload (cpu) keeps fp32 master weights, momentum, variance and fp32 gradients on the host:
    16 bytes per shard parameter, + 2 for offloaded 16-bit parameters. ZeRO-Infinity (nvme) keeps all
    of them on the drives and stages one sub-group at a time through pinned host buffers
    (sub_group_size, default 1e9 elements, 16 bytes each)."""
    oc = np.asarray(plan.offload_code)
    off_params = np.asarray(plan.offload_params, dtype=bool)
    states = (OPTIMIZER_BYTES_PER_PARAM + 4) * shard + np.where(off_params, BYTES * shard, 0.0)
    staging = 16 * np.minimum(shard, NVME_STAGING_PARAMS)
    host = np.where(oc == Offload.CPU, states, np.where(oc == Offload.NVME, staging, 0.0))
    nvme = np.where(oc == Offload.NVME, states, 0.0)
    return {"host": host, "nvme": nvme}


def peak_stage_memory(model, job, plan, cluster, sl, stage_params_, experts):
    """(memory by MEMORY_TERMS and "total", peak stage) of the pipeline stage that holds the most, in
    bytes per GPU: of the first, the largest middle (only when it has layers) and the last, each with
    its own parameters ``stage_params_`` (:func:`stage_params`) and its activations
    (:func:`activation_bytes`), the routed ``experts`` (:func:`expert_params_per_gpu`, sharded over the
    expert-data-parallel group) and, under fp8, the fp8 weight copies (:func:`fp8_weight_copy_bytes`);
    the first unless another holds strictly more. Then the buffers (:func:`buffer_bytes`, with the
    runtime reserve) and what the caching allocator reserves besides (:func:`allocator_bytes`)."""
    first_params, middle_params, last_params = stage_params_
    acts = activation_bytes(model, job, plan)
    expert_states = model_state_bytes(experts, plan, shard_degree=expert_data_parallel(plan))

    def states_of(params_):
        """A stage's model states with its experts' and, under fp8, its fp8 weight copies."""
        states = {k: v + expert_states[k] for k, v in model_state_bytes(params_, plan).items()}
        states["parameters"] = states["parameters"] + fp8_weight_copy_bytes(model, params_ + experts, plan)
        return states
    stage_states = {name: states_of(params_)
                    for name, params_ in (("first", first_params), ("middle", middle_params), ("last", last_params))}
    totals = {name: sum(states.values()) + acts[name] for name, states in stage_states.items()}
    # the peak stage: first unless another holds strictly more (a middle stage only when it has layers)
    peak = np.where(totals["last"] > totals["first"], LAST, FIRST)
    peak_total = np.where(peak == LAST, totals["last"], totals["first"])
    peak = np.where((sl.middle > 0) & (totals["middle"] > peak_total), MIDDLE, peak)
    buffers = buffer_bytes(model, plan, runtime_reserved_bytes(cluster))

    def at_peak(values: dict):
        return np.where(peak == LAST, values["last"], np.where(peak == MIDDLE, values["middle"], values["first"]))
    memory = {k: at_peak({name: stage_states[name][k] for name in stage_states}) for k in stage_states["first"]}
    memory["activations"] = at_peak(acts)
    memory["buffers"] = buffers
    memory["allocator"] = allocator_bytes(memory, plan, on_cuda(cluster), runtime_reserved_bytes(cluster))
    memory["total"] = sum(memory[k] for k in MEMORY_TERMS)
    return memory, peak


def offloaded_bytes(job, plan, shard, activations_offloaded) -> dict:
    """Host-memory and NVMe bytes per GPU under offload: the optimizer shard's
    (:func:`offloaded_bytes_per_gpu`) and, on the host, the offloaded activations of every micro-batch
    in flight (:func:`offloaded_activation_bytes`, :func:`in_flight_micro_batches`)."""
    off = offloaded_bytes_per_gpu(shard, plan)
    off["host"] = off["host"] + activations_offloaded * in_flight_micro_batches(job, plan)
    return off


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
    gathers and reduces in persistent buffers (:func:`buffer_bytes`) and does not. The engine's
    ``Behaviour.churns_allocator_from_zero``."""
    start = spec_of(plan).behaviour.churns_allocator_from_zero
    return start is not None and int(plan.zero) >= start


def churns_allocator_where(plan) -> np.ndarray:
    """:func:`churns_allocator` for every plan of a PlanBatch (or one plan), as a boolean array."""
    start = engine_select(plan, lambda spec: (np.inf if spec.behaviour.churns_allocator_from_zero is None
                                              else float(spec.behaviour.churns_allocator_from_zero),))[0]
    return np.asarray(plan.zero) >= start


def planner_memory_limit(plan, cluster, max_memory_fraction: float):
    """Bytes per GPU a planned layout may use: ``max_memory_fraction`` of the GPU's memory, and for a plan
    that churns the allocator (:func:`churns_allocator_where`: ZeRO-3 / FSDP) at most the memory less
    ALLOCATOR_PRESSURE_HEADROOM_BYTES, where published FSDP runs ran 8-37 % slower than estimated (the
    cudaMalloc retries :func:`allocator_pressure_assumption` names). Per plan of a batch."""
    cap = cluster.accelerator.memory_bytes
    return np.where(churns_allocator_where(plan), np.minimum(cap * max_memory_fraction,
                                                             cap - ALLOCATOR_PRESSURE_HEADROOM_BYTES),
                    cap * max_memory_fraction)


def allocator_pressure_assumption(gpu_total, cluster, plan, **_) -> tuple[str, ...]:
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
