"""The engines, one :class:`EngineSpec` each, and the switches they implement or refuse.

Read one spec to know what an engine holds (its model-state and buffer functions), what it offers
and refuses (ZeRO stages, recomputation, context-parallel modes, fp8 recipes, optimizers, switches,
its own refusals), how its runtime behaves (:class:`Behaviour`, what the cost models read), its
defaults and how a plan is exported for it. Every fact cites the engine's source or documentation.

Adding an engine switch (a plan field some engines run): declare it in :data:`SWITCHES` (its rule's
name, reason, message and accepted text), name it in the ``switches`` of the engines that run it (and
their ``export.switch_options``), and add the field to ``paraplan.plan.Plan``; the rule is generated
(``paraplan.engines.rules``) and placed in ``paraplan.plan.RULES`` by name.
"""
from __future__ import annotations

import numpy as np

from paraplan.engines.spec import (FP32_BYTES, HALF_BYTES, Behaviour, BufferArgs, Engine, EngineBuffers, EngineSpec,
                                   ExportMapping, ModelStates, Refusal, StateArgs, Switch)
from paraplan.modes import FP8_DTYPES, Offload, Schedule, is_fp8

# --- switches: plan fields some engines implement ---------------------------------------------------
#: every engine switch, in no particular order (the rules sit in ``paraplan.plan.RULES`` by name)
SWITCHES: tuple[Switch, ...] = (
    Switch("offload", "offload_code", lambda P: P.offload_code != Offload.NONE,
           "engine-offload", "offload is DeepSpeed's (ZeRO-Offload/Infinity)",
           "--engine {engine} does not offload optimizer states; CPU/NVMe offload is DeepSpeed's (ZeRO-Offload, "
           "ZeRO-Infinity)",
           # the generic engine (the papers' accounting) is left out of the hint, as it always was
           "--offload none, or --engine {named}"),
    Switch("offload_activation_layers", "offload_activation_layers", lambda P: np.asarray(P.offload_activation_layers) > 0,
           "activation-offload-engine", "activation offload is Megatron-LM's (Transformer Engine)",
           "offloading activations to the CPU is Megatron-LM's (--cpu-offloading, Transformer Engine); "
           "engine {engine} has none", "--engine {engines}, or 0"),
    Switch("grad_reduce_bf16", "grad_reduce_bf16", lambda P: np.asarray(P.grad_reduce_bf16, bool),
           "grad-reduce-bf16-megatron", "bf16 gradient reduction is Megatron-LM's option",
           "a bf16 gradient buffer is Megatron-LM's option (main_grad, --grad-reduce-in-bf16); "
           "engine {engine} keeps its own gradient dtype", "--engine {engines}, or no --grad-reduce-bf16"),
    Switch("fp8_param_gather", "fp8_param_gather", lambda P: np.asarray(P.fp8_param_gather, bool),
           "fp8-param-gather-megatron-fp8", "fp8 parameters are Megatron-LM's option under an fp8 dtype",
           "fp8 parameters are Megatron-LM's option (--fp8-param-gather, Transformer Engine's "
           "fp8_model_init); engine {engine} keeps 16-bit parameters",
           "--engine {engines} with an fp8 --dtype, or no --fp8-param-gather",
           requires=lambda P: is_fp8(P.dtype), requires_axes=("dtype",),
           requirement="fp8 parameters (--fp8-param-gather) need an fp8 dtype (fp8, fp8-delayed, fp8-blockwise, "
                       "mxfp8; or nvfp4: --fp4-param-gather); this plan trains in {dtype}"),
    Switch("te_cross_entropy", "te_cross_entropy", lambda P: np.asarray(P.te_cross_entropy, bool),
           "te-cross-entropy-megatron", "Transformer Engine's fused cross-entropy is Megatron-LM's option",
           "Transformer Engine's fused cross-entropy is Megatron-LM's option (--cross-entropy-loss-fusion "
           "--cross-entropy-fusion-impl te); engine {engine} runs its own loss",
           "--engine {engines}, or no --te-cross-entropy"),
    # NVIDIA/Megatron-LM megatron/core/optimizer/optimizer_config.py (OptimizerConfig.use_precision_aware_optimizer,
    # store_param_remainders) and megatron/core/optimizer/__init__.py (Transformer Engine's FusedAdam with
    # master_weight_dtype, exp_avg_dtype, exp_avg_sq_dtype); DeepSpeed 0.19.8 and torchtitan 0.3.0 keep Adam's
    # states in fp32 (no such option in their optimizer configs)
    Switch("precision_aware_optimizer", "precision_aware_optimizer",
           lambda P: np.asarray(P.precision_aware_optimizer, bool),
           "precision-aware-optimizer-megatron", "the precision-aware optimizer is Megatron-Core's option",
           "the precision-aware optimizer is Megatron-Core's option (--use-precision-aware-optimizer, Transformer "
           "Engine's FusedAdam); engine {engine} keeps fp32 master weights and moments",
           "--engine {engines} with a 16-bit or fp8 --dtype, or no --precision-aware-optimizer",
           requires=lambda P: np.asarray(P.dtype) != "fp32", requires_axes=("dtype",),
           requirement="the precision-aware optimizer runs Transformer Engine's FusedAdam over 16-bit (or fp8) "
                       "parameters; this plan trains in {dtype}"),
    Switch("tp_comm_overlap", "tp_comm_overlap", lambda P: np.asarray(P.tp_comm_overlap, bool),
           "engine-tp-comm-overlap", "the engine has no TP communication overlap",
           "--engine {engine} does not overlap tensor-parallel communication "
           "(Megatron-LM --tp-comm-overlap and torchtitan async TP do)", "--engine {engines}"),
    Switch("ep_comm_overlap", "ep_comm_overlap", lambda P: np.asarray(P.ep_comm_overlap, bool),
           "engine-ep-comm-overlap", "the engine has no expert-parallel communication overlap",
           "--engine {engine} does not overlap expert-parallel all-to-alls "
           "(Megatron-LM --overlap-moe-expert-parallel-comm and torchtitan's DualPipeV do)", "--engine {engines}"),
    Switch("moe_flex_dispatch", "moe_flex_dispatch", lambda P: np.asarray(P.moe_flex_dispatch, bool),
           "engine-moe-flex-dispatch", "the engine has no DeepEP / HybridEP dispatch",
           "--engine {engine} has no flex token dispatcher (Megatron-LM --moe-token-dispatcher-type flex does)",
           "--engine {engines}"),
    Switch("recompute_modules", "recompute_modules_mask", lambda P: np.asarray(P.recompute_modules_mask) != 0,
           "engine-recompute-modules", "the engine has no module-level recomputation",
           "--engine {engine} has no --recompute-modules (Megatron-Core's fine-grained recomputation)",
           "--engine {engines}"),
)


# --- the ZeRO paper's accounting, which the engines start from ----------------------------------------
def zero_paper_states(a: StateArgs) -> ModelStates:
    """Rajbhandari et al. 2019 (ZeRO, arXiv:1910.02054 §5): 16-bit weights and gradients (e bytes each,
    4 in fp32 training) and K bytes of optimizer states (12: fp32 master weights, momentum, variance; 8
    in fp32 training) per parameter, sharded over N from stage 1 (K), 2 (+ gradients), 3 (+ weights):
    (e + e + K)Ψ, (e + e)Ψ + KΨ/N, eΨ + (e + K)Ψ/N, (e + e + K)Ψ/N. Under optimizer offload ZeRO-2/3
    stream each reduced gradient bucket to the host; ZeRO-1 accumulates whole 16-bit gradients on the
    GPU across micro-batches before its single reduction, so they stay."""
    params, n, z, eb, k = a.params, a.shard, a.zero, a.element_bytes, a.optimizer_bytes
    weights = np.where(z >= 3, eb * params / n, eb * params)
    grads = np.where(z >= 2, eb * params / n, eb * params)
    optim = np.where(z >= 1, k * params / n, k * params)
    grads = np.where(a.offload & (z >= 2), 0.0, grads)
    return ModelStates(weights, grads, optim)


# DeepSpeed ZeRO communication buckets (elements), its documented defaults (docs/_pages/config-json.md:
# reduce_bucket_size 5e8, allgather_bucket_size 5e8); ZeRO-Offload double-buffers the reduce bucket
# while it copies gradients to the host.
DEEPSPEED_REDUCE_BUCKET = 5e8
DEEPSPEED_ALLGATHER_BUCKET = 5e8
ZERO_BUCKET_BYTES = HALF_BYTES * (2 * DEEPSPEED_REDUCE_BUCKET + DEEPSPEED_ALLGATHER_BUCKET)


def zero_paper_buffers(b: BufferArgs) -> EngineBuffers:
    """ZeRO-3's gathered layers, the current and the prefetched one (2 x 16-bit layer parameters), and
    under optimizer offload ZeRO-Offload's buckets (the reduce bucket double-buffered, the all-gather
    bucket: ZERO_BUCKET_BYTES)."""
    gathered = np.where(b.zero >= 3, 2 * b.element_bytes * b.layer, 0.0)
    return EngineBuffers(gathered, 0.0, np.where(b.offload, ZERO_BUCKET_BYTES, 0.0))


# --- generic: the papers' accounting ------------------------------------------------------------------
def generic_states(a: StateArgs) -> ModelStates:
    """The ZeRO paper's states (:func:`zero_paper_states`), except ZeRO-2/3 under pipeline parallelism,
    which keep the 16-bit parameters and gradients unsharded through the step (the stage's parameters
    gathered once, its gradients accumulated whole and reduce-scattered once after the last micro-batch:
    ``Behaviour.fsdp_syncs_once_under_pp``, as FSDP runs under a pipeline, the note at GENERIC's
    behaviour): (e + e)Ψ + KΨ/N, ZeRO-1's states."""
    zp = zero_paper_states(a)
    under_pp = (np.asarray(a.plan.pp) > 1) & (a.zero >= 2)
    whole = a.element_bytes * a.params
    return ModelStates(np.where(under_pp, whole, zp.parameters),
                       np.where(under_pp & ~(a.offload & (a.zero >= 2)), whole, zp.gradients), zp.optimizer_states)


GENERIC = EngineSpec(
    engine=Engine.GENERIC, title="generic", codebase=None,
    model_states=generic_states, buffers=zero_paper_buffers,
    zero_stages=(0, 1, 2, 3), zero_note="",
    recompute=("none", "selective", "full", "op-sac"), recompute_note="",
    cp_modes=("ring", "ulysses"), cp_mode_note="",
    fp8_recipes=tuple(sorted(FP8_DTYPES)),
    optimizers=("adam", "onebit-adam", "zero-one-adam", "onebit-lamb"),
    switches=frozenset({"offload", "offload_activation_layers", "tp_comm_overlap", "ep_comm_overlap",
                        "moe_flex_dispatch", "recompute_modules"}),
    refusals=(),
    grad_accumulation_fusion=True,
    behaviour=Behaviour(
        # pipeline: Megatron-LM 2021's code (the SC21 runs): batched send/recv pairs, no overlap, the
        # output scattered over tp (its scatter-gather optimisation), nothing held after sending
        blocking_p2p=False, overlapped_p2p=False, p2p_sends_whole_output=False, p2p_partitions_over_tp=False,
        holds_stage_outputs=False, splits_layer_specs=False,
        # sequence parallelism as Korthikanti et al. 2022 sec. 4.2.2 write it
        sp_regather=True, saves_gathered_sp_inputs=False, async_tp_forward_only=False,
        # one fp32 copy of the logits: the accounting the published runs were checked with
        loss_bytes_per_logit=4.0, vocab_parallel_loss=True,
        # per-tensor eager code: everything fragments the caching allocator
        flat_state_buffers=False, eager_temporaries=False, eager_elementwise=False, keeps_dropout_score_bytes=False,
        saves_permuted_flash_output=False, picks_cudnn_attention=False, cudnn_attention_note="",
        compiled_blocks=False, separate_input_linears=False,
        # fp8 as Transformer Engine runs it (the megatron engine's fp8 facts)
        caches_fp8_weights=True, saves_fp8_linear_inputs=True, fp8_tp_gather_dtypes=("fp8", "fp8-delayed", "nvfp4"),
        fp8_fsdp_gather_dtypes=(),
        router_weights_in_activation=False, eager_expert_biases=False, dropless_host_sync=False,
        folds_expert_parallelism=False,
        main_grad_buffer=False, fp32_grad_reduction=False, bf16_optimizer=False,
        dp_collectives_outside_backward=False, reduces_in_optimizer_step=False,
        hybrid_layers="any", churns_allocator_from_zero=3,
        # ZeRO-2/3 under a pipeline as the runs that train so publish it: PyTorch FSDP under
        # torch.distributed.pipelining (torchtitan's facts, at TORCHTITAN) and Llama 3's FSDP ("for model shards
        # we do not reshard after forward computation", Llama 3 paper, arXiv:2407.21783 sec. 3.3.2); DeepSpeed
        # refuses ZeRO-2/3 with its pipeline and Megatron-FSDP reduce-scatters sharded gradients every
        # micro-batch (its no_sync: "For grads shard mode there will actually always be gradient sync
        # happening", MegatronFSDP.no_sync in Megatron-LM's megatron_fsdp.py): --engine megatron
        fsdp_syncs_once_under_pp=True),
)


# --- Megatron-LM (NVIDIA/Megatron-LM, Megatron-Core) --------------------------------------------------
def main_grad_bytes(plan, element_bytes):
    """Bytes per parameter of Megatron-LM's gradient buffer (main_grad), which its data-parallel
    reduce-scatter / all-reduce also moves: 4 (fp32, its default with bf16 or fp16 training:
    accumulate_allreduce_grads_in_fp32), 2 with --grad-reduce-in-bf16 (``grad_reduce_bf16``), and the
    element size in fp32 training."""
    bf16 = np.asarray(getattr(plan, "grad_reduce_bf16", False), dtype=bool)
    return np.where(bf16, 2.0, np.maximum(4.0, element_bytes))


def megatron_states(a: StateArgs) -> ModelStates:
    """megatron/training/theoretical_memory_usage.py: 16-bit weights, the main_grad buffer
    (:func:`main_grad_bytes` g: fp32, or bf16 with --grad-reduce-in-bf16) and K, or K/N with the
    distributed optimizer (ZeRO-1): 2 + 4 + 12 = 18 bytes/param, or 6 + 12/N (16, or 4 + 12/N with a bf16
    buffer). ZeRO-2/3 are Megatron-FSDP (``--use-megatron-fsdp``, megatron/core/distributed/fsdp;
    Megatron-Bridge's "Megatron FSDP" page): ``optim_grads`` shards the main_grad buffer too, 2 + g/N +
    12/N; ``optim_grads_params`` the 16-bit parameters as well, (2 + g + 12)/N."""
    zp = zero_paper_states(a)
    grads = main_grad_bytes(a.plan, a.element_bytes) * a.params / np.where(a.zero >= 2, a.shard, 1.0)
    return ModelStates(zp.parameters, grads, zp.optimizer_states)


def megatron_buffers(b: BufferArgs) -> EngineBuffers:
    """Up to ZeRO-1 Megatron-LM reduces and gathers in place in its contiguous buffers (model states).
    Megatron-FSDP (ZeRO-2/3), run with ``--fsdp-double-buffer`` as the export writes it (Megatron-LM's
    Megatron-FSDP user guide: "persistently allocated double buffers for temporarily-defined memory
    needed in MegatronFSDP communications"): two layers' unsharded gradients in the main_grad dtype for
    the reduce-scatter and, at ZeRO-3, two layers' gathered 16-bit parameters. The per-layer double
    buffer is paraplan's reading of that sentence (one wrapped unit per transformer layer, as its GPT
    models are wrapped), not a measured figure."""
    zp = zero_paper_buffers(b)
    grads = np.where(b.zero >= 2, 2 * main_grad_bytes(b.plan, b.element_bytes) * b.layer, 0.0)
    return EngineBuffers(zp.gathered, grads, zp.buckets)


#: Megatron-FSDP's --data-parallel-sharding-strategy for the ZeRO stage a Megatron-LM plan names (ZeRO-2/3)
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}

MEGATRON = EngineSpec(
    engine=Engine.MEGATRON, title="Megatron-LM", codebase="github.com/NVIDIA/Megatron-LM",
    model_states=megatron_states, buffers=megatron_buffers,
    zero_stages=(0, 1, 2, 3), zero_note="",
    # --recompute-granularity selective | full; op-level SAC is torchtitan's
    recompute=("none", "selective", "full"), recompute_note="op-level SAC is torchtitan's; --engine {engine} offers {offered}",
    cp_modes=("ring", "ulysses"), cp_mode_note="",
    # --fp8-recipe {tensorwise, delayed, blockwise, mxfp8} (Transformer Engine); no row-wise recipe;
    # --fp4-format e2m1 --fp4-recipe nvfp4 (choices ['nvfp4'] only: no mxfp4; NVIDIA/Megatron-LM @ 307dcf3 :
    # megatron/training/arguments.py, _add_transformer_engine_args)
    fp8_recipes=("fp8", "fp8-delayed", "fp8-blockwise", "mxfp8", "nvfp4"),
    optimizers=("adam",),
    switches=frozenset({"offload_activation_layers", "grad_reduce_bf16", "fp8_param_gather", "te_cross_entropy",
                        "precision_aware_optimizer", "tp_comm_overlap",
                        "ep_comm_overlap", "moe_flex_dispatch", "recompute_modules"}),
    refusals=(
        # megatron/core/pipeline_parallel/schedules.py get_forward_backward_func: no pipelining, 1F1B
        # (forward_backward_pipelining_without_interleaving) or interleaved 1F1B; no V placement, no
        # bidirectional DualPipe (those live in forks: sail-sg/zero-bubble-pipeline-parallelism's
        # zerobubble/scheduler/zbv.py, Ascend MindSpeed's --schedules-method dualpipev)
        # (the planner proposes only what runs: GPipe and zero-bubble H1 would run as 1F1B)
        Refusal("megatron-pipeline-schedule", "Megatron-LM runs 1F1B and interleaved 1F1B only",
                ("pp", "schedule_code"),
                lambda P: (P.pp > 1) & np.isin(np.asarray(P.schedule_code),
                                               [int(Schedule.GPIPE), int(Schedule.ZB_H1), int(Schedule.ZBV),
                                                int(Schedule.DUALPIPE), int(Schedule.DUALPIPE_V)]),
                lambda p: (f"Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B "
                           f"(megatron/core/pipeline_parallel/schedules.py), not {Schedule(p.schedule_code).label}; "
                           "zero-bubble, ZBV and DualPipe schedules exist only in forks (sail-sg zero-bubble, "
                           "MindSpeed)"),
                field="schedule", accepted="1f1b, interleaved"),
    ),
    # gradient_accumulation_fusion writes into main_grad with beta = 1 (its default)
    grad_accumulation_fusion=True,
    behaviour=Behaviour(
        # schedules.get_tensor_shapes / p2p_communication (megatron/core/pipeline_parallel at 00c2c0a): the
        # stage output is sent as it is (no scatter-gather), each send/recv pair batched; the interleaved
        # schedule overlaps its steady-state transfers (overlap_p2p_comm, on with virtual stages); the data
        # is freed once sent (deallocate_output_tensor, deallocate_pipeline_outputs=True)
        blocking_p2p=False, overlapped_p2p=True, p2p_sends_whole_output=True, p2p_partitions_over_tp=False,
        holds_stage_outputs=False, splits_layer_specs=False,
        # LinearWithGradAccumulationAndAsyncCommunication re-gathers the sequence shard in backward
        sp_regather=True, saves_gathered_sp_inputs=False, async_tp_forward_only=False,
        # the fused vocab-parallel cross-entropy keeps the 16-bit logits and an fp32 softmax it overwrites
        # with the gradient in place (2 + 4)
        loss_bytes_per_logit=6.0, vocab_parallel_loss=True,
        # contiguous param/grad buffers
        flat_state_buffers=True, eager_temporaries=False, eager_elementwise=False, keeps_dropout_score_bytes=False,
        saves_permuted_flash_output=False,
        # Transformer Engine's DotProductAttention prefers cuDNN FusedAttention on Hopper and newer
        # (transformer_engine/pytorch/attention/dot_product_attention/utils.py, get_attention_backend, @ 002a3e5)
        picks_cudnn_attention=True,
        cudnn_attention_note="Megatron-LM runs Transformer Engine's cuDNN fused attention (its preference on "
                             "Hopper and newer)",
        compiled_blocks=False, separate_input_linears=False,   # linear_qkv, linear_fc1 fused
        # Transformer Engine: the fp8 weight cached per step (is_first_microbatch), the linears' inputs
        # saved as fp8 casts (module/linear.py, layernorm_linear.py), fp8 sequence-parallel gathers for
        # the per-tensor recipes (gather_along_first_dim with a quantizer), and NVFP4 gathers: the input and
        # gradient of sequence parallelism quantized after an amax reduction, so all ranks share the fp32
        # tensor scale (Transformer Engine docs, features/low_precision_training/nvfp4, "Distributed training")
        caches_fp8_weights=True, saves_fp8_linear_inputs=True, fp8_tp_gather_dtypes=("fp8", "fp8-delayed", "nvfp4"),
        fp8_fsdp_gather_dtypes=(),
        # MoE (megatron/core/transformer/moe): TEGroupedMLP weights the copies inside its activation
        # (weighted_bias_swiglu_impl) and adds expert biases in an eager loop; the dropless dispatcher syncs
        # token counts to the host; MoE parallel folding (Liu et al. 2025, arXiv:2504.14960; parallel_state.py)
        router_weights_in_activation=True, eager_expert_biases=True, dropless_host_sync=True,
        folds_expert_parallelism=True,
        main_grad_buffer=True, fp32_grad_reduction=False, bf16_optimizer=False,
        dp_collectives_outside_backward=False, reduces_in_optimizer_step=False,
        # Megatron-FSDP gathers and reduces in persistent double buffers (--fsdp-double-buffer: FixedPoolAllocator,
        # megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py, a fixed pool of buffers
        # allocated once "to reduce the overhead and fragmentation caused by frequent allocation and
        # deallocation of temporary buffers"); up to ZeRO-1 it reduces in place in its contiguous buffers
        hybrid_layers="even", churns_allocator_from_zero=None, persistent_comm_buffers=True,
        # same-shaped activations layer after layer, model states and FSDP buffers allocated once: the
        # caching allocator strands less than under the other engines (fitted_constants.yaml)
        allocator_fragmentation="megatron_allocator_fragmentation"),
    export=ExportMapping(
        format="bash", notes_in_text=True,
        # the flags as megatron-core 0.16.1's config classes (TransformerConfig, DistributedDataParallelConfig,
        # OptimizerConfig) read them; the newest release pip installs on Python 3.11 (0.17 and later need 3.12)
        target="Megatron-LM core_v0.16.1 (megatron-core 0.16.1)",
        # stock Megatron-LM runs 1F1B and its interleaved form (megatron/core/pipeline_parallel/schedules.py)
        schedules={"1f1b": "1F1B", "interleaved": "interleaved 1F1B"},
        # Transformer Engine's fused (cuDNN) and flash backends (--attention-backend fused | flash)
        attention_kernels=("auto", "cudnn", "flash2"),
        # pretrain_gpt.py flags (megatron/training/arguments.py), in the order the script writes them:
        # combined 1F1B (needs torch >= 2.6; megatron/core/transformer/transformer_config.py); DeepEP
        # (HybridEP: --moe-flex-dispatcher-backend hybridep, priced alike)
        switch_options=(("tp_comm_overlap", (("--tp-comm-overlap",),)),
                        ("ep_comm_overlap", (("--overlap-moe-expert-parallel-comm",),)),
                        ("moe_flex_dispatch", (("--moe-token-dispatcher-type", "flex"),
                                               ("--moe-flex-dispatcher-backend", "deepep"))),
                        ("grad_reduce_bf16", (("--grad-reduce-in-bf16",),)),
                        ("te_cross_entropy", (("--cross-entropy-loss-fusion",),
                                              ("--cross-entropy-fusion-impl", "te"))),
                        # the moments' dtype (--exp-avg-dtype, --exp-avg-sq-dtype) is written by the builder
                        ("precision_aware_optimizer", (("--use-precision-aware-optimizer",),))),
        fp8_recipes={"fp8": "tensorwise", "fp8-delayed": "delayed", "fp8-blockwise": "blockwise", "mxfp8": "mxfp8",
                     "nvfp4": "nvfp4"},
        fsdp_strategy=MEGATRON_FSDP_STRATEGY),
)


# --- DeepSpeed (deepspeedai/DeepSpeed) ----------------------------------------------------------------
def deepspeed_states(a: StateArgs) -> ModelStates:
    """deepspeed/runtime/zero/stage_1_and_2.py, stage3.py (the estimators
    ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``): the ZeRO
    paper's weights and K, and besides the 16-bit gradients the fp32 gradient partition the optimizer
    step materializes (4Ψ/N). Stage 0-1: 2Ψ + 2Ψ + 16Ψ/N (stage 0: N = 1); stage 2 partitions the
    16-bit gradients too (2Ψ + 18Ψ/N, under the estimator's 4Ψ + 16Ψ/N bound); stage 3: 18Ψ/N (16-bit
    parameter partition, fp32 gradient partition, K). Under offload the fp32 partition is on the host:
    the 16-bit gradients stay at ZeRO-1, none at ZeRO-2/3."""
    zp = zero_paper_states(a)
    params, n, z, eb = a.params, a.shard, a.zero, a.element_bytes
    n_ds = np.where(z >= 1, n, 1.0)
    grads = np.where(z >= 3, FP32_BYTES * params / n, np.where(z >= 2, eb * params / n, eb * params)
                     + FP32_BYTES * params / n_ds)
    grads = np.where(a.offload, np.where(z >= 2, 0.0, eb * params), grads)
    return ModelStates(zp.parameters, grads, zp.optimizer_states)


def deepspeed_buffers(b: BufferArgs) -> EngineBuffers:
    """ZeRO-3's gathered layers; the gradient reduce buckets (double-buffered) and the all-gather bucket
    at ZeRO 1-2 and under offload, one reduce bucket at ZeRO-3 (DEEPSPEED_REDUCE_BUCKET,
    DEEPSPEED_ALLGATHER_BUCKET: its documented defaults)."""
    zp = zero_paper_buffers(b)
    z = b.zero
    buckets = np.where(b.offload | ((z >= 1) & (z <= 2)), ZERO_BUCKET_BYTES,
                       np.where(z >= 3, HALF_BYTES * DEEPSPEED_REDUCE_BUCKET, 0.0))
    return EngineBuffers(zp.gathered, 0.0, buckets)


DEEPSPEED = EngineSpec(
    engine=Engine.DEEPSPEED, title="DeepSpeed", codebase="github.com/deepspeedai/DeepSpeed",
    model_states=deepspeed_states, buffers=deepspeed_buffers,
    zero_stages=(0, 1, 2, 3), zero_note="",
    recompute=("none", "selective", "full"), recompute_note="op-level SAC is torchtitan's; --engine {engine} offers {offered}",
    # Megatron-DeepSpeed's sequence parallelism is Ulysses (--ds-sequence-parallel-size)
    cp_modes=("ulysses",), cp_mode_note="DeepSpeed's sequence parallelism is Ulysses (--cp-mode ulysses)",
    # no fp8 recipe of its own (it runs Transformer Engine modules a user wires in)
    fp8_recipes=(),
    # 1-bit Adam, 0/1 Adam, 1-bit LAMB (deepspeed/runtime/fp16/onebit)
    optimizers=("adam", "onebit-adam", "zero-one-adam", "onebit-lamb"),
    switches=frozenset({"offload"}),   # ZeRO-Offload / ZeRO-Infinity
    refusals=(
        # deepspeed/runtime/pipe/engine.py: PipelineEngine asserts ZeRO stage < 2 and runs its TrainSchedule
        Refusal("deepspeed-pipeline-zero", "DeepSpeed's pipeline engine takes ZeRO-0/1 only", ("pp", "zero"),
                lambda P: (P.pp > 1) & (P.zero >= 2),
                lambda p: f"DeepSpeed's PipelineEngine runs with ZeRO-0 or 1 only, not ZeRO-{p.zero} with pp({p.pp})",
                field="zero", accepted="0, 1"),
        Refusal("deepspeed-pipeline-schedule", "DeepSpeed's pipeline engine runs 1F1B only", ("pp", "schedule_code"),
                lambda P: (P.pp > 1) & (P.schedule_code != Schedule.ONE_F_ONE_B),
                lambda p: f"DeepSpeed's PipelineEngine runs 1F1B (TrainSchedule) only, not {Schedule(p.schedule_code).label}",
                field="schedule", accepted="1f1b"),
    ),
    grad_accumulation_fusion=False,   # micro-batch gradients added with separate kernels
    behaviour=Behaviour(
        # PipelineEngine (deepspeed/runtime/pipe/engine.py at 03f6f75): SendActivation / RecvActivation /
        # SendGrad / RecvGrad instructions through pipe/p2p.py's blocking dist.send / dist.recv; the output
        # partitioned over tp (pipe_partitioned, grad_partitioned) and gathered by the receiver
        # (PartitionedTensor.full()); the outputs kept in pipe_buffers['outputs'] until backward
        blocking_p2p=True, overlapped_p2p=False, p2p_sends_whole_output=False, p2p_partitions_over_tp=True,
        holds_stage_outputs=True, splits_layer_specs=False,
        sp_regather=True,   # Megatron-DeepSpeed's copy of Megatron's sequence parallelism
        saves_gathered_sp_inputs=False, async_tp_forward_only=False,
        # Hugging Face models: plain PyTorch cross-entropy on logits upcast to fp32: the 16-bit logits, the
        # fp32 copy and the fp32 log-softmax it saves for backward (2 + 4 + 4)
        loss_bytes_per_logit=10.0, vocab_parallel_loss=True,
        flat_state_buffers=True,   # flattened groups and partitions
        eager_temporaries=False, eager_elementwise=False, keeps_dropout_score_bytes=False,
        saves_permuted_flash_output=False, picks_cudnn_attention=False, cudnn_attention_note="",
        compiled_blocks=False, separate_input_linears=False,
        caches_fp8_weights=True, saves_fp8_linear_inputs=False, fp8_tp_gather_dtypes=(), fp8_fsdp_gather_dtypes=(),
        router_weights_in_activation=False, eager_expert_biases=False, dropless_host_sync=False,
        folds_expert_parallelism=False,   # DeepSpeed-MoE's expert groups: dp ranks at stride tp·cp
        main_grad_buffer=False, fp32_grad_reduction=False,
        # BF16_Optimizer (DeepSpeedEngine._do_optimizer_sanity_check): fp32 gradient accumulation, reduced
        # in fp32 (get_grads_for_reduction)
        bf16_optimizer=True,
        # PipelineEngine._exec_reduce_grads, allreduce_gradients at ZeRO-0 and the ZeRO-1/2 optimizer's
        # all_gather_dp_groups in step() run outside the backward
        dp_collectives_outside_backward=True, reduces_in_optimizer_step=False,
        auto_attention_is_flash2=True, churns_allocator_from_zero=3),
    export=ExportMapping(format="json", notes_in_text=False, target="DeepSpeed 0.19.8",
                         # PipelineEngine's TrainSchedule (deepspeed/runtime/pipe/schedule.py)
                         schedules={"1f1b": "TrainSchedule"},
                         # its PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py); NVMe
                         # offload of the optimizer needs ZeRO-3 (deepspeed/runtime/zero/offload_config.py)
                         pipeline_max_zero=1, nvme_offload_min_zero=3,
                         # DeepSpeed 0.19.8 deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS: adagrad, adam, adamw,
                         # lamb, muadam, muadamw, musgd, lion, muon; the 1-bit optimizers (onebitadam,
                         # zerooneadam, onebitlamb, deepspeed/runtime/fp16/onebit) no longer ship: a plan with
                         # one is exported as the nearest plan, Adam. The spec keeps them for the releases and
                         # papers that ran them.
                         optimizers=("adam",),
                         # deepspeed/runtime/zero/offload_config.py DeepSpeedZeroOffloadOptimizerConfig: device,
                         # nvme_path, buffer_count, pin_memory, pipeline_read/write, fast_init, ratio,
                         # super_offload, cpuadam_cores_perc; no delayed parameter update
                         delayed_update=False),
)


# --- torchtitan (pytorch/torchtitan: FSDP2, DTensor TP/SP, torch.distributed.pipelining) ---------------
ADAM_MOMENTS_BYTES = 8   # Adam's fp32 momentum and variance; FSDP2's sharded fp32 parameters are the master copy


def torchtitan_states(a: StateArgs) -> ModelStates:
    """PyTorch FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan's
    default): the sharded parameters are the fp32 master copy, gradients are fp32 shards, Adam keeps
    momentum and variance: 16Ψ/N at ZeRO-3 (reshard after forward); ZeRO-2 (no reshard after forward)
    keeps the unsharded 16-bit parameters from forward to backward (+2Ψ); ZeRO-0 (replicate) 16Ψ.
    Under pipeline parallelism (``Behaviour.fsdp_syncs_once_under_pp``) ZeRO-3 keeps the unsharded 16-bit
    parameters across the micro-batches as ZeRO-2 does (+2Ψ), and both keep the stage's unsharded
    gradients, accumulated in reduce_dtype (fp32) while gradient sync is off (FSDPParam
    ``to_accumulated_grad_if_needed``, torch/distributed/fsdp/_fully_shard/_fsdp_param.py), until the
    one reduce-scatter after the last micro-batch (+4Ψ)."""
    params, n, z, eb = a.params, a.shard, a.zero, a.element_bytes
    n_tt = np.where(z >= 2, n, 1.0)
    under_pp = (np.asarray(a.plan.pp) > 1) & (z >= 2)
    weights = FP32_BYTES * params / n_tt + np.where((z == 2) | under_pp, eb * params, 0.0)
    grads = FP32_BYTES * params / n_tt + np.where(under_pp, FP32_BYTES * params, 0.0)
    return ModelStates(weights, grads, ADAM_MOMENTS_BYTES * params / n_tt)


def torchtitan_buffers(b: BufferArgs) -> EngineBuffers:
    """FSDP2 from ZeRO-2: the gathered layers (current and prefetched, 2 x 16-bit) and one layer's
    unsharded 16-bit gradients with their fp32 copy for the reduce-scatter (``reduce_dtype=fp32``); no
    buckets (optimizer offload is refused)."""
    zp = zero_paper_buffers(b)
    eb, layer = b.element_bytes, b.layer
    gathered = np.where(b.zero >= 2, 2 * eb * layer + (eb + 4) * layer, 0.0)
    return EngineBuffers(gathered, 0.0, zp.buckets)


TORCHTITAN = EngineSpec(
    engine=Engine.TORCHTITAN, title="torchtitan", codebase="github.com/pytorch/torchtitan",
    model_states=torchtitan_states, buffers=torchtitan_buffers,
    # fully_shard: reshard_after_forward True (ZeRO-3) or False (ZeRO-2), replicate (ZeRO-0); no ZeRO-1
    zero_stages=(0, 2, 3),
    zero_note="torchtitan shards with FSDP2: ZeRO-3 (reshard after forward), ZeRO-2 (no reshard after forward) "
              "or 0 (replicate)",
    # activation_checkpoint.mode none | full | selective with selective_ac_option "op" (op-level SAC)
    recompute=("none", "full", "op-sac"),
    recompute_note="torchtitan's selective checkpointing is op-level: --recompute op-sac (or none, full)",
    cp_modes=("ring",), cp_mode_note="torchtitan's context parallelism is ring attention (--cp-mode ring)",
    # float8 converter (torchao: tensorwise, rowwise) and mx converter (mxfp8)
    fp8_recipes=("fp8", "fp8-rowwise", "mxfp8"),
    optimizers=("adam",),
    # parallelism.enable_async_tensor_parallel; pipeline_parallel_expert_parallel_overlap registers
    # overlap_callback for ScheduleDualPipeV's OVERLAP_F_B actions (torchtitan/distributed/pipeline_parallel.py
    # and dual_pipe_v.py at 02ef790)
    switches=frozenset({"tp_comm_overlap", "ep_comm_overlap"}),
    refusals=(
        # torchtitan/distributed/pipeline_parallel.py (02ef790): torch.distributed.pipelining's schedules by
        # name (get_schedule_class), ZBVZeroBubble and DualPipeV placed in a V (style "v", 2 stages per
        # rank); no bidirectional DualPipe with its two parameter copies
        # torch's zero-bubble schedules need several stages per rank (ScheduleInterleavedZeroBubble, ZBV): a
        # one-stage-per-rank ZB-H1 does not run there
        Refusal("torchtitan-pipeline-schedule", "torchtitan runs DualPipeV and ZBV, not DualPipe or one-stage ZB-H1",
                ("pp", "schedule_code"),
                lambda P: (P.pp > 1) & np.isin(np.asarray(P.schedule_code), [int(Schedule.DUALPIPE), int(Schedule.ZB_H1)]),
                lambda p: ("torchtitan runs torch.distributed.pipelining's schedules (get_schedule_class): DualPipeV "
                           "(one parameter copy, V placement), not DualPipe's two directions with two parameter "
                           "copies; its zero-bubble schedules place several stages on each rank (zbv), not "
                           f"one-stage {Schedule(p.schedule_code).label}"),
                field="schedule", accepted="1f1b, interleaved, gpipe, zbv, dualpipev"),
        # unsharded data parallelism is 1-D only: torchtitan 0.2.2's DDP raises "DDP has not supported > 1D
        # parallelism" (torchtitan/models/llama3/infra/parallelize.py); 0.3.0 applies fully_shard to every model
        # (torchtitan/models/llama3/parallelize.py), so a ZeRO-0 plan with tp, pp or cp runs as FSDP2
        Refusal("torchtitan-ddp-pure-dp", "torchtitan replicates (ZeRO-0) only without tp, pp or cp",
                ("zero", "tp", "pp", "cp"),
                lambda P: (np.asarray(P.zero) == 0) & ((np.asarray(P.tp) * np.asarray(P.pp) * np.asarray(P.cp)) > 1),
                lambda p: (f"torchtitan's unsharded data parallelism (DDP) is 1-D: with tp({p.tp}) pp({p.pp}) cp({p.cp}) "
                           "it shards with FSDP2 (ZeRO-2 without resharding, ZeRO-3 with)"),
                field="zero", accepted="2 or 3 with tp, pp or cp > 1; 0 for pure data parallelism"),
        Refusal("torchtitan-ep-overlap-dualpipev", "torchtitan overlaps the expert all-to-all under DualPipeV only",
                ("ep_comm_overlap", "schedule_code", "pp"),
                lambda P: np.asarray(P.ep_comm_overlap, bool) & ((np.asarray(P.schedule_code) != Schedule.DUALPIPE_V)
                                                                 | (P.pp == 1)),
                lambda p: ("torchtitan overlaps the expert-parallel all-to-all only in ScheduleDualPipeV's "
                           "forward-backward pairs (pipeline_parallel_expert_parallel_overlap), not under "
                           f"{Schedule(p.schedule_code).label} with pp({p.pp})"),
                field="ep_comm_overlap", accepted="--schedule dualpipev --pp N>1, or no --ep-comm-overlap"),
        # torchtitan/models/llama3/infra/parallelize.py: the TP plan applies SequenceParallel to the norms
        Refusal("torchtitan-tp-shards-sequence", "torchtitan's tensor parallelism always shards the sequence",
                ("tp", "sp"), lambda P: (P.tp > 1) & ~np.asarray(P.sp, bool),
                lambda p: "torchtitan's tensor parallelism always shards the sequence (SequenceParallel norms): add --sp",
                field="sp"),
    ),
    grad_accumulation_fusion=False,
    behaviour=Behaviour(
        # torch.distributed.pipelining: the stage output kept in the stage's fwd_cache until backward;
        # pipeline_parallel_split_points place any number of layers per stage
        blocking_p2p=False, overlapped_p2p=False, p2p_sends_whole_output=False, p2p_partitions_over_tp=False,
        holds_stage_outputs=True, splits_layer_specs=False,
        # DTensor matmuls keep the gathered input (op-level SAC aside: tpcomm.op_sac_regather_time); async TP
        # micro-pipelines the forward's collectives only (TORCHTITAN_ASYNC_TP_SOURCE in tpcomm.py)
        sp_regather=False, saves_gathered_sp_inputs=False, async_tp_forward_only=True,
        # plain PyTorch cross-entropy on fp32-upcast logits (2 + 4 + 4), vocabulary-parallel under TP
        loss_bytes_per_logit=10.0, vocab_parallel_loss=True,
        flat_state_buffers=True,   # FSDP2's sharded parameters
        eager_temporaries=False, eager_elementwise=False, keeps_dropout_score_bytes=False,
        saves_permuted_flash_output=False,
        # ScaledDotProductAttentionWrapper: sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, ...],
        # set_priority=True) (torchtitan/models/attention.py @ 0012170)
        picks_cudnn_attention=True,
        cudnn_attention_note="torchtitan runs torch SDPA's cuDNN backend (its wrapper sets cuDNN first)",
        # training.compile; wq, wk, wv and w1, w3 are separate nn.Linear (torchtitan/models/llama3/model.py)
        compiled_blocks=True, separate_input_linears=True,
        # torchao Float8Linear recasts the weights in every pass and saves the high-precision input; its
        # float8 TP (tensorwise only) and FSDP float8 all-gather (enable_fsdp_float8_all_gather) carry fp8
        caches_fp8_weights=False, saves_fp8_linear_inputs=False, fp8_tp_gather_dtypes=("fp8",),
        fp8_fsdp_gather_dtypes=("fp8",),
        router_weights_in_activation=False, eager_expert_biases=False, dropless_host_sync=False,
        folds_expert_parallelism=False,
        # reduce_dtype fp32 (training.mixed_precision_reduce, torchtitan/config/job_config.py)
        main_grad_buffer=False, fp32_grad_reduction=True, bf16_optimizer=False,
        dp_collectives_outside_backward=False, reduces_in_optimizer_step=False,
        # FSDP2 frees the unsharded gradients after each layer's reduce-scatter from ZeRO-2
        fsdp2_copies=True, churns_allocator_from_zero=2,
        # under pp, apply_fsdp's default reshard_after_forward policy is ``not pp_enabled`` ("For PP, do not
        # reshard after forward to avoid per-microbatch all-gathers", torchtitan/models/llama3/parallelize.py),
        # and torch.distributed.pipelining's stage runs every backward but the last with
        # set_reshard_after_backward(False) and set_requires_gradient_sync(False), then FSDP's post-backward
        # once (pytorch/pytorch torch/distributed/pipelining/stage.py, backward_maybe_with_nosync)
        fsdp_syncs_once_under_pp=True),
    export=ExportMapping(
        # What torchtitan 0.3.0, the release the export targets, runs (its wheel's source, checked against the
        # installed release by benchmarks/engine_configs/check_exports.py). A Python config registry
        # (torchtitan/config/manager.py: --module / --config, section.key overrides); the TOML job config of
        # releases up to 0.2.2 behind --torchtitan-format toml (paraplan.planner.export_torchtitan).
        format="python", notes_in_text=True, target="torchtitan 0.3.0",
        switch_options=(("tp_comm_overlap", (("enable_async_tensor_parallel", True),)),),   # [compile] in 0.3.0
        # paraplan fp8 dtype -> (converter class, recipe_name or None for its default).
        # torchtitan/components/quantization/float8.py: Float8LinearConverter.Config.recipe_name is
        # Literal["rowwise", "rowwise_with_gw_hp"]: no per-tensor (tensorwise) recipe, and with it no float8
        # FSDP all-gather (0.2.x's enable_fsdp_float8_all_gather is gone); mx.py: MXFP8LinearConverter.
        # The engine's fp8_recipes keep "fp8" (tensorwise): the torchtitan of the published runs
        # (paraplan/calibration) and 0.2.2's TOML ran it; a 0.3.0 export runs such a plan row-wise.
        fp8_recipes={"fp8-rowwise": ("Float8LinearConverter", "rowwise"), "mxfp8": ("MXFP8LinearConverter", None)},
        # torch.distributed.pipelining schedules (get_schedule_class); its zero-bubble schedules need several
        # stages per rank, so zb-h1 (one stage per rank) is exported as 1F1B, re-estimated
        # ZBVZeroBubble and DualPipeV: two V-placed stages per rank (torch.distributed.pipelining; torchtitan
        # runs them uncompiled, paraplan.planner.export_torchtitan)
        schedules={"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble",
                   "dualpipev": "DualPipeV"},
        # ScheduleZBVZeroBubble / ScheduleDualPipeV refuse torch.compile'd stage modules
        # (_check_torch_compile_compatibility, torch/distributed/pipelining/schedules.py, PyTorch 2.13)
        eager_schedules=("zbv", "dualpipev"),
        # 0.3.0 has no pipeline_parallel_expert_parallel_overlap (ParallelismConfig, torchtitan/config/configs.py;
        # the DualPipeV overlap callback is in later sources and experiments/graph_trainer only)
        switches_without_option=("ep_comm_overlap",),
        # its TP plan shards the sequence (sequence parallelism always on with tp); no unfused attention: 0.3.0's
        # language models run FlexAttention (flex, flex_flash or varlen, torchtitan/models/common/config_utils.py
        # get_attention_config), 0.2.2's torch SDPA (torchtitan/models/attention.py); the export compiles the
        # model (compile.enable, components model and loss); FSDP2 / replicate reduce gradients during the
        # backward with no option to turn it off (0.3.0 torchtitan/config/configs.py ParallelismConfig, 0.2.2
        # job_config.py Parallelism); its DDP is 1-D data parallelism only (ZeRO-0 with tp/pp/cp runs FSDP)
        tp_shards_sequence=True, attention_always_fused=True, compiles_model=True,
        grad_reduce_always_overlapped=True, zero0_needs_pure_dp=True,
        # torchtitan/models/common/config_utils.py get_attention_config: attn_backend flex (the registries'
        # default), flex_flash or varlen; "sdpa is no longer supported for language models": no torch SDPA
        # backend (cuDNN, flash, memory-efficient) can be named, the plan runs its own kernel (auto)
        attention_kernels=("auto",),
        # torchtitan/config/configs.py ParallelismConfig: expert_parallel_degree only, no
        # expert_tensor_parallel_degree (0.2.x had one); "EP borrows ranks from FSDP and TP"
        expert_tensor_parallel=False),
)


# --- Scaling (Aleph-Alpha/scaling at 01b9d21, the codebase of Hagemann et al. 2023's sweep) -------------
# transformer/model/layers/lm_head.py: a ColumnParallelLinear with parallel_output=False all-gathers the
# logits over tp, and transformer/model/losses/cross_entropy.py runs torch cross_entropy on logits.float():
# every tp rank holds all V logits of its tokens. The peak, in backward: the gathered 16-bit logits (2
# bytes), the fp32 log-softmax cross_entropy saved (4), nll_loss's gradient (4) and log_softmax's input
# gradient (4); the fp32 copy of the input (4 more in forward) is freed by then.
SCALING_LOSS_BYTES_PER_LOGIT = 2.0 + 4.0 + 4.0 + 4.0


def scaling_states(a: StateArgs) -> ModelStates:
    """core/optimizer/parameter_group.py: the ZeRO paper's accounting at ZeRO-0/1, 16-bit weights and
    gradients and K or K/N (its fp32 partition, ``float_parameter_partition_owned``, and Adam's
    moments); the fp32 gradient partition exists only inside the optimizer step."""
    return zero_paper_states(a)


SCALING = EngineSpec(
    engine=Engine.SCALING, title="Scaling", codebase="github.com/Aleph-Alpha/scaling",
    model_states=scaling_states, buffers=zero_paper_buffers,
    zero_stages=(0, 1), zero_note="Scaling shards optimizer states only (optimizer zero: true, ZeRO-1)",
    recompute=("none", "full"), recompute_note="Scaling checkpoints every layer or nothing: --recompute full or none",
    cp_modes=(), cp_mode_note="",     # no context parallelism: its refusal scaling-no-cp
    fp8_recipes=(), optimizers=("adam",),
    switches=frozenset(),
    refusals=(
        # ParallelModule.train_step's PipelineScheduleTrain (core/nn/parallel_module): 1F1B, one stage per rank
        Refusal("scaling-pipeline-schedule", "Scaling's pipeline runs 1F1B only", ("pp", "schedule_code", "vpp"),
                lambda P: ((P.pp > 1) & (P.schedule_code != Schedule.ONE_F_ONE_B)) | (P.vpp > 1),
                lambda p: ("Scaling's pipeline runs 1F1B (PipelineScheduleTrain) without virtual stages, not "
                           f"{Schedule(p.schedule_code).label} with vpp({p.vpp})"),
                field="schedule", accepted="1f1b (vpp 1)"),
        Refusal("scaling-no-cp", "Scaling has no context parallelism", ("cp",), lambda P: P.cp > 1,
                lambda p: f"Scaling has no context parallelism, not cp({p.cp})", field="cp", accepted="1"),
    ),
    grad_accumulation_fusion=False,
    behaviour=Behaviour(
        # PipeCommunicator (core/nn/parallel_module/communicator.py): blocking send / recv instructions, the
        # whole output sent, kept in its PIPELINE_STAGE_OUTPUT buffer until the gradient arrives;
        # pipe_partition_uniform over its L + 3 layer specs (plan.SCALING_EXTRA_LAYER_SPECS)
        blocking_p2p=True, overlapped_p2p=False, p2p_sends_whole_output=True, p2p_partitions_over_tp=False,
        holds_stage_outputs=True, splits_layer_specs=True,
        # core/nn/norm/rms_norm.py gathers the norm output under sequence parallelism and the column-parallel
        # linears save the gathered tensor (memory.SCALING_SP_GATHERED_SAVED_BYTES_PER_HIDDEN)
        sp_regather=False, saves_gathered_sp_inputs=True, async_tp_forward_only=False,
        loss_bytes_per_logit=SCALING_LOSS_BYTES_PER_LOGIT, vocab_parallel_loss=False,
        # flat 16-bit and fp32 buffers; its per-step gradients come back in the same blocks every step, but its
        # eager code (SwiGLU, norm upcasts, permuted attention copies) leaves odd-sized temporaries: the
        # allocator fraction and backward working set fitted on the sweep (memory.py)
        flat_state_buffers=True, eager_temporaries=True, allocator_fragmentation="scaling_allocator_fragmentation",
        # core/nn/mlp.py (silu(dense_in(x)) * siglu_weight(x)) and rotary.py (q * cos + rotate_half(q) * sin)
        # are eager PyTorch
        eager_elementwise=True,
        # its eager attention keeps Korthikanti's 5 bytes per score (memory.unfused_score_bytes)
        keeps_dropout_score_bytes=True,
        # core/nn/attention/attention.py: flash_attn_varlen_func's output rearranged (a permuted copy)
        saves_permuted_flash_output=True,
        picks_cudnn_attention=False, cudnn_attention_note="", compiled_blocks=False, separate_input_linears=False,
        caches_fp8_weights=True, saves_fp8_linear_inputs=False, fp8_tp_gather_dtypes=(), fp8_fsdp_gather_dtypes=(),
        router_weights_in_activation=False, eager_expert_biases=False, dropless_host_sync=False,
        folds_expert_parallelism=False,
        main_grad_buffer=False, fp32_grad_reduction=False, bf16_optimizer=False,
        # core/optimizer/optimizer.py and allreduce.py: an fp32 all-reduce of every gradient inside
        # optimizer.step(), then (ZeRO-1) the 16-bit parameter all-gather
        dp_collectives_outside_backward=False, reduces_in_optimizer_step=True,
        churns_allocator_from_zero=3),
)

#: the engines by code (``Engine`` order)
SPECS: tuple[EngineSpec, ...] = (GENERIC, MEGATRON, DEEPSPEED, TORCHTITAN, SCALING)
