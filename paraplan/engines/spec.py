"""The types an engine is described with: the :class:`Engine` choice and one :class:`EngineSpec` per
engine (what it holds, what it offers and refuses, how it behaves, its defaults and its export
mapping), and the small records a spec is made of. No facts here: they are in
:mod:`paraplan.engines.specs`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, NamedTuple

from paraplan.modes import Mode, plan_field

HALF_BYTES = 2     # a 16-bit element (bf16 / fp16), as ``paraplan.costmodels.kernels.BYTES``
FP32_BYTES = 4.0   # an fp32 element


@plan_field("engine")
class Engine(Mode):
    """The training engine the plan runs on: it decides which model states are held (and how they
    are laid out), which buffers exist, and which layouts can be expressed at all.

    generic: the ZeRO paper's accounting, no engine restrictions; megatron: Megatron-LM (fp32
    main_grad, distributed optimizer; ZeRO-2/3 run as Megatron-FSDP, its
    --data-parallel-sharding-strategy optim_grads / optim_grads_params); deepspeed: DeepSpeed ZeRO 0-3 with offload; torchtitan:
    PyTorch FSDP2 + DTensor TP/SP + torch.distributed.pipelining; scaling: Aleph Alpha's Scaling
    (github.com/Aleph-Alpha/scaling; its ZeRO-1 optimizer, Megatron-style TP/SP, DeepSpeed-style 1F1B
    pipeline), the codebase of Hagemann et al. 2023's layout sweep. Each is described by its
    :class:`EngineSpec` (``paraplan.engines.SPECS``, by code)."""
    GENERIC = "generic"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    SCALING = "scaling"


# --- what an engine holds ---------------------------------------------------------------------------
class StateArgs(NamedTuple):
    """What a model-state function reads, per plan (numpy arrays over a PlanBatch, or scalars): Ψ the
    parameters, N the ranks they are sharded over, the ZeRO stage, whether the optimizer states are
    offloaded, the bytes of a weight element (2, or 4 in fp32 training), K the optimizer's bytes per
    parameter (12, or 8 in fp32 training) and the plan itself (its switches)."""
    params: Any
    shard: Any
    zero: Any
    offload: Any
    element_bytes: Any
    optimizer_bytes: Any
    plan: Any


class ModelStates(NamedTuple):
    """Bytes of parameters, gradients and optimizer states one GPU holds, before parameter / optimizer
    offload takes them off it (``paraplan.costmodels.memory.model_state_bytes`` does that for every
    engine alike)."""
    parameters: Any
    gradients: Any
    optimizer_states: Any


class BufferArgs(NamedTuple):
    """What a buffer function reads, per plan: the parameters of the largest layer a GPU holds whole
    while it is gathered (``paraplan.costmodels.memory.gathered_layer_params``), the ZeRO stage,
    whether the optimizer states are offloaded, the bytes of a weight element and the plan."""
    layer: Any
    zero: Any
    offload: Any
    element_bytes: Any
    plan: Any


class EngineBuffers(NamedTuple):
    """The engine's own communication buffers on one GPU, in bytes: gathered parameters (and the
    gradient copies a sharded reduction needs), sharded-gradient double buffers, and bucketed
    collectives' buckets."""
    gathered: Any
    gradients: Any
    buckets: Any


# --- how an engine behaves: what the cost models read ------------------------------------------------
@dataclass(frozen=True)
class Behaviour:
    """The facts about an engine's runtime that the cost models read, one value per engine
    (``paraplan.engines.engine_flag(plan, name)`` looks one up per plan, vectorized). Each spec says
    where its values come from; the cost model that reads a field says what it changes."""
    #: pipeline: send and receive are separate blocking instructions (costmodels/pipeline.py: two
    #: transfers per crossing on the critical path)
    blocking_p2p: bool
    #: pipeline: the interleaved schedule's steady-state transfers overlap compute (overlap_p2p_comm)
    overlapped_p2p: bool
    #: pipeline: a stage sends its whole output, not a 1/tp scatter (costmodels/p2p.py)
    p2p_sends_whole_output: bool
    #: pipeline: the transfer is partitioned over tp and gathered back by the receiver (costmodels/p2p.py)
    p2p_partitions_over_tp: bool
    #: pipeline: the runtime holds each stage's output until its backward (costmodels/memory.py)
    holds_stage_outputs: bool
    #: pipeline: the stages split L + embedding, norm and head as uniform "layer specs" (plan.stage_layers)
    splits_layer_specs: bool
    #: sequence parallelism: column-parallel linears keep the input shard and all-gather it again in
    #: backward (costmodels/tpcomm.py)
    sp_regather: bool
    #: sequence parallelism: linears save the all-gathered input for backward (costmodels/memory.py)
    saves_gathered_sp_inputs: bool
    #: TP communication overlap hides the forward's collectives only (costmodels/tpcomm.py)
    async_tp_forward_only: bool
    #: peak bytes per logit element (tokens x vocabulary / tp) while the loss runs (costmodels/memory.py)
    loss_bytes_per_logit: float
    #: each tp rank holds only its vocabulary shard of the logits in the loss (else gathered over tp)
    vocab_parallel_loss: bool
    #: model states live in flat buffers allocated once: only activations and buffers fragment the
    #: caching allocator (costmodels/memory.allocator_bytes)
    flat_state_buffers: bool
    #: eager code leaves many odd-sized temporaries: the backward working set fitted apart
    #: (memory.SCALING_BACKWARD_LAYER_TRANSIENT)
    eager_temporaries: bool
    #: SwiGLU and the rotary embedding run as eager PyTorch whatever ``fused_elementwise`` says
    eager_elementwise: bool
    #: non-flash attention keeps the dropout bytes of the scores even without dropout (costmodels/memory.py)
    keeps_dropout_score_bytes: bool
    #: FlashAttention's output is saved twice (a permuted copy feeds the output projection)
    saves_permuted_flash_output: bool
    #: attention left to ``auto`` runs cuDNN fused attention where the generation has it measured
    picks_cudnn_attention: bool
    #: who picks cuDNN, said with the estimate ("" where ``picks_cudnn_attention`` is False)
    cudnn_attention_note: str
    #: transformer blocks run compiled (torch.compile): said with the estimate
    compiled_blocks: bool
    #: q, k, v and the MLP's gate and up projections are separate linears (costmodels/kernels.py)
    separate_input_linears: bool
    #: under fp8 a weight's fp8 copy is made once per step and kept, not recast in every pass (fp8.py, memory.py)
    caches_fp8_weights: bool
    #: under fp8 the linear layers save their inputs as fp8 casts (Transformer Engine; costmodels/memory.py)
    saves_fp8_linear_inputs: bool
    #: the fp8 dtypes whose sequence-parallel all-gathers carry fp8 (costmodels/fp8.tp_gathers_fp8)
    fp8_tp_gather_dtypes: tuple
    #: the fp8 dtypes whose FSDP parameter all-gathers carry fp8 (dataparallel.fp8_all_gather_factor)
    fp8_fsdp_gather_dtypes: tuple
    #: MoE: the router weights are applied inside the experts' activation; no copy of their output kept
    router_weights_in_activation: bool
    #: MoE: a biased model's expert biases are added in an eager loop after the grouped GEMM (moe.py)
    eager_expert_biases: bool
    #: MoE: dropless dispatch waits for the per-expert token counts on the host (moe.MOE_HOST_SECONDS_PER_LAYER)
    dropless_host_sync: bool
    #: MoE: expert layers fold etp x ep x edp onto the tp x cp x dp ranks (plan.expert_parallel_folded)
    folds_expert_parallelism: bool
    #: gradients live in a main_grad buffer, fp32 or bf16 (``grad_reduce_bf16``), and are reduced in it
    main_grad_buffer: bool
    #: gradients are reduced in fp32 (dataparallel.dp_grad_bytes)
    fp32_grad_reduction: bool
    #: bf16 layouts run an optimizer that accumulates gradients in fp32 (memory.bf16_optimizer_layout)
    bf16_optimizer: bool
    #: the pipeline / ZeRO-0 gradient reduction and the ZeRO-1/2 parameter all-gather run outside the
    #: backward, exposed (dataparallel.deepspeed_exposed)
    dp_collectives_outside_backward: bool
    #: the optimizer step all-reduces every gradient in fp32 after the backward, exposed (dataparallel.py)
    reduces_in_optimizer_step: bool
    #: the lowest ZeRO stage at which gathered parameters are allocated and freed every layer (None: never)
    churns_allocator_from_zero: int | None
    #: hybrid Mamba-2 / attention layer patterns: "none" (no Mamba layer in its model code), "even" (its
    #: hybrid stack gives every pipeline rank layers // pp consecutive layers, no interleaving: Megatron-LM's
    #: MambaStack, megatron/core/ssm/mamba_block.py), "any" (any stage split: the papers' accounting)
    hybrid_layers: str = "none"
    #: ZeRO-2/3 run as FSDP2 (torch.distributed.fsdp fully_shard), whose copy-out after each all-gather and
    #: chunk-cat before each reduce-scatter are priced (costmodels/dataparallel.fsdp2_copy_times)
    fsdp2_copies: bool = False
    #: its communication buffers are allocated once and reused (never freed between layers or steps), so
    #: they stay out of the caching allocator's fragmentation (costmodels/memory.allocator_bytes)
    persistent_comm_buffers: bool = False
    #: attention left to ``auto`` runs FlashAttention-2 (costmodels/attention.runs_flash2_attention)
    auto_attention_is_flash2: bool = False
    #: under pipeline parallelism ZeRO-2/3 gather the parameters once per step and keep them unsharded across
    #: the micro-batches, accumulate unsharded gradients and reduce-scatter them once after the last
    #: micro-batch's backward (costmodels/dataparallel.fsdp_syncs_once_per_step; the engines' specs memory)
    fsdp_syncs_once_under_pp: bool = False
    #: the fitted_constants.yaml entry giving the share of the churning bytes the caching allocator strands
    #: (costmodels/memory.allocator_bytes): "allocator_fragmentation", "scaling_allocator_fragmentation" or
    #: "megatron_allocator_fragmentation"
    allocator_fragmentation: str = "allocator_fragmentation"


BEHAVIOUR_FIELDS = frozenset(f.name for f in fields(Behaviour))


# --- what an engine offers and refuses ----------------------------------------------------------------
@dataclass(frozen=True)
class Switch:
    """A plan field that some engines implement and others refuse (an engine switch): the rule that
    refuses it on an engine without it is generated from this declaration and the specs that offer it.

    ``used(P)`` says per plan whether the plan turns it on (``axis``: the PlanBatch attribute it reads).
    ``refusal`` is the rule's message ({engine}: the plan's engine); ``accepted`` what the error
    accepts ({engines}: the engines offering it, generic last; {named}: the same without generic).
    ``requires`` (reading ``requires_axes``) is a further condition the switch needs on an engine that
    offers it, with its own message ``requirement`` ({dtype}: the plan's dtype)."""
    field: str
    axis: str
    used: Callable[[Any], Any]
    rule: str
    reason: str
    refusal: str
    accepted: str
    requires: Callable[[Any], Any] | None = None
    requires_axes: tuple = ()
    requirement: str | None = None


@dataclass(frozen=True)
class Refusal:
    """A layout one engine refuses beyond the shared switches and choices: its own named rule. ``bad``
    reads the plan's ``axes`` (the engine test is added by the rule), ``message`` explains it for one
    plan; ``field`` and ``accepted`` are what the error names."""
    rule: str
    reason: str
    axes: tuple
    bad: Callable[[Any], Any]
    message: Callable[[Any], str]
    field: str
    accepted: str | None = None


# --- how a plan is exported for it ----------------------------------------------------------------
@dataclass(frozen=True)
class ExportMapping:
    """What ``paraplan.planner.export`` writes for the engine where it is data (the builders read it;
    every option name is checked against the engine's source in tests/data/engine_options.yaml).

    ``target``: the engine release the export is written for (named in its header, checked by
    benchmarks/engine_configs/check_exports.py with that release's own config code);
    ``switch_options``: (Plan field, the options written when it is on), in the order written;
    ``fp8_recipes``: paraplan fp8 dtype -> the engine's recipe; ``schedules``: paraplan schedule ->
    the engine's, for the schedules the engine runs (a plan with another is exported as the nearest
    plan it runs: 1F1B); ``fsdp_strategy``: ZeRO stage -> the sharded data-parallel strategy it runs
    as; ``attention_kernels``: the named attention kernels the engine can be made to run (``auto``
    always), the others exported as ``auto``; ``expert_tensor_parallel``: whether the target release
    has an expert-tensor-parallel degree of its own (a plan with ``etp > 1`` is otherwise exported as
    the nearest plan, ``etp = 1``); ``optimizers``: the spec's optimizers the target release still has
    (None: all of them; the others are exported as the nearest plan, Adam); ``delayed_update``: whether
    it runs ZeRO-Offload's one-step delayed parameter update; ``eager_schedules``: schedules the target
    runs only with eager (uncompiled) model chunks, exported with compile off and re-estimated with unfused
    elementwise kernels; ``switches_without_option``: switches the engine's spec offers (a newer source has
    them) that the target release has no option for, exported off and re-estimated; the fields below them:
    what the target runs whatever the plan says."""
    format: str                    # "bash", "json" or "python"
    notes_in_text: bool            # notes as comments in the text (bash, Python); JSON's go to stderr
    target: str = ""
    switch_options: tuple = ()
    fp8_recipes: Mapping[str, Any] = field(default_factory=dict)
    schedules: Mapping[str, str] = field(default_factory=dict)
    fsdp_strategy: Mapping[int, str] = field(default_factory=dict)
    attention_kernels: tuple = ("auto", "cudnn", "flash2", "efficient", "flash1")
    expert_tensor_parallel: bool = True
    optimizers: tuple | None = None
    delayed_update: bool = False
    eager_schedules: tuple = ()
    switches_without_option: tuple = ()
    #: what the target runs whatever the plan says (each a nearest-plan change of
    #: paraplan.planner.runnable): its TP plan shards the sequence (sp with tp > 1); attention always fused
    #: (no unfused kernel to choose); the model always compiled (elementwise chains fused) outside
    #: ``eager_schedules``; gradient reduction always overlapped with the backward; ZeRO-0 data parallelism
    #: only without model parallelism (else FSDP, ZeRO-2)
    tp_shards_sequence: bool = False
    attention_always_fused: bool = False
    compiles_model: bool = False
    grad_reduce_always_overlapped: bool = False
    zero0_needs_pure_dp: bool = False
    #: the highest ZeRO stage its pipeline runs (None: any) and the lowest at which it offloads to NVMe
    pipeline_max_zero: int | None = None
    nvme_offload_min_zero: int = 0


@dataclass(frozen=True)
class EngineSpec:
    """One engine, one object (Megatron-Core's ``BackendSpecProvider``,
    megatron/core/models/backends.py, is the model: one provider answers "which modules does this
    backend build"; here one spec answers "what does this engine do").

    * what it holds: ``model_states`` and ``buffers``, one short function each (bytes per parameter
      by ZeRO stage, and the engine's own buffers), citing the engine's source;
    * what it offers: ZeRO stages, recomputation policies, context-parallel modes, fp8 recipes,
      optimizers (each refusal explained by its ``*_note``), the switches (:class:`Switch` fields) it
      implements, and the layouts it refuses besides (``refusals``); the engine rules of
      ``paraplan.plan.RULES`` are generated from these (``paraplan.engines.rules``);
    * how it behaves: ``behaviour`` (:class:`Behaviour`), what the cost models read;
    * its defaults (``grad_accumulation_fusion``) and its export mapping (``export``; None where
      paraplan writes no launch config for it)."""
    engine: Engine
    title: str                                   # how the engine is named in prose
    codebase: str | None                         # its repository; None for generic (no code: the papers)
    model_states: Callable[[StateArgs], ModelStates]
    buffers: Callable[[BufferArgs], EngineBuffers]
    zero_stages: tuple
    zero_note: str
    recompute: tuple                             # Recompute labels
    recompute_note: str                          # {engine}, {offered}
    cp_modes: tuple                              # CpMode labels; () where the engine has no cp (a refusal)
    cp_mode_note: str
    fp8_recipes: tuple                           # fp8 Dtype labels
    optimizers: tuple                            # Optimizer labels
    switches: frozenset                          # Switch fields it implements
    refusals: tuple                              # its own Refusal rules
    grad_accumulation_fusion: bool               # fused into the weight-gradient GEMMs by default
    behaviour: Behaviour
    export: ExportMapping | None = None

    @property
    def code(self) -> int:
        return int(self.engine)

    @property
    def label(self) -> str:
        return self.engine.label

    def offers(self, switch: str) -> bool:
        """Whether the engine implements the switch (a :class:`Switch` field)."""
        return switch in self.switches
