"""A parallelism plan: degrees, micro-batch, schedule, ZeRO, recomputation, offload, dtype.

Categorical choices are :class:`Mode` enums (``paraplan.modes``, re-exported here; the engine choice
with the engines, ``paraplan.engines``): a user-facing label (the string a ``Plan`` holds and
JSON shows) and an integer code (its position) that the cost formulas read, over numpy arrays of
plans (:class:`PlanBatch`) as well as over one plan. The legality rules that tie several fields
together live in one table, :data:`RULES`, read by ``Plan`` itself, by :func:`check_plan` and by
the search's vectorized mask (``paraplan.planner.space.compose``); the rules about what an engine
runs are generated from its spec (``paraplan.engines.ENGINE_RULES``) and placed here by name.

``Plan`` is the one hand-written list of plan fields: each field's kind (:data:`PLAN_FIELD_SPECS`)
follows from its declaration, ``PlanBatch`` is generated from it, and the string under each field is
its documentation and its command-line flag's help (``paraplan.cli.common.add_plan_args``).
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import Field, asdict, dataclass, field, fields, make_dataclass, replace
from types import SimpleNamespace
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from paraplan.engines import ENGINE_RULES, Engine, engine_flag
from paraplan.errors import ConfigError, shown
from paraplan.modes import (AttentionKernel, CpMode, Dtype, Mode, Offload, Optimizer, OptimizerStateDtype, Recompute,
                            Schedule, is_fp8)

# re-exported, so that ``from paraplan.plan import ...`` keeps working where these lived before
from paraplan.engines import MEGATRON_FSDP_STRATEGY  # noqa: F401
from paraplan.modes import FP4_DTYPES, FP8_DTYPES, compute_dtype, gemm_dtype, is_fp4, quantized_bytes  # noqa: F401


SCHEDULES = Schedule.labels()
RECOMPUTE = Recompute.labels()
OFFLOAD = Offload.labels()
DTYPES = Dtype.labels()
CP_MODES = CpMode.labels()
OPTIMIZERS = Optimizer.labels()
ENGINES = Engine.labels()
ATTENTION_KERNELS = AttentionKernel.labels()
ZERO_STAGES = (0, 1, 2, 3)
# Megatron-Core's fine-grained recomputation (--recompute-granularity selective --recompute-modules ...;
# megatron/core/transformer/transformer_config.py, recompute_modules), in the order a plan writes them.
# core_attn, mlp, moe and shared_experts checkpoint their submodule (keep its input, run its forward
# again in backward); layernorm, moe_act and mla_up_proj discard their output and recompute it.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
RECOMPUTE_MODULE_BIT = {name: 1 << i for i, name in enumerate(RECOMPUTE_MODULES)}


def recompute_modules_mask(text: str) -> int:
    """The bit mask of a comma-separated module list (no checks: :func:`canonical_recompute_modules`)."""
    return sum(RECOMPUTE_MODULE_BIT[m] for m in {x.strip() for x in text.split(",") if x.strip()})


def recompute_modules_text(mask: int) -> str:
    """The comma-separated module list of a bit mask, in RECOMPUTE_MODULES order."""
    return ",".join(m for m in RECOMPUTE_MODULES if int(mask) & RECOMPUTE_MODULE_BIT[m])


def recomputes_module(plan, name: str):
    """Per plan (a Plan or a PlanBatch): whether its module list names ``name``."""
    return (np.asarray(getattr(plan, "recompute_modules_mask", 0)) & RECOMPUTE_MODULE_BIT[name]) != 0


def recomputes_attention_core(plan):
    """Per plan: whether selective recomputation re-runs the attention core: with no module list (the
    default, core_attn) or with one that names core_attn."""
    return (np.asarray(getattr(plan, "recompute_modules_mask", 0)) == 0) | recomputes_module(plan, "core_attn")


def canonical_recompute_modules(value, where: str | None = None) -> str:
    """A module list (``"moe_act, layernorm"`` or a sequence of names) as the plan holds it: known
    names, each once, in RECOMPUTE_MODULES order; ConfigError naming the field and the accepted names."""
    where = where or "recompute_modules"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ConfigError(where, f"expected a comma-separated list of modules, got {shown(value)}",
                          accepted=", ".join(RECOMPUTE_MODULES))
    names = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [x for x in names if x not in RECOMPUTE_MODULE_BIT]
    if unknown:
        raise ConfigError(where, f"unknown module {shown(unknown[0])}", accepted=", ".join(RECOMPUTE_MODULES))
    return recompute_modules_text(recompute_modules_mask(",".join(names)))


MAX_DEGREE = 2**31 - 1    # degrees, micro-batches and stage sizes past a C int are typos (numpy overflows)


# --- how a plan field is declared ------------------------------------------------------------------
# Plan (below) is the one list of plan fields. Each field's kind says how it is checked, read from
# text, held in a PlanBatch and offered as a command-line flag; it follows from the default, or from
# the helper that declares the field:
#   a bool default                   SWITCH   true or false (flag --name, or --no-name when on by default)
#   an int default >= 1              COUNT    a positive integer (tp, pp, ...)
#   derived_count_field(zero_means)  DERIVED  a positive integer, or 0 for what the others leave (dp)
#   layer_count_field(zero_means)    LAYERS   a non-negative layer count, 0 meaning ``zero_means``
#   choice_field(default, ...)       CHOICE   one of a few integers (zero)
#   mode_field(member)               MODE     the label of a Mode member; a PlanBatch holds <name>_code
#                                             (per_batch=True: one label for the whole batch, dtype)
#   module_list_field()              MODULES  a list of RECOMPUTE_MODULES; a PlanBatch holds <name>_mask
# The string literal under a field is its documentation and its flag's --help (attribute_docstrings).
SWITCH, COUNT, DERIVED, LAYERS, CHOICE, MODE, MODULES = (
    "switch", "count", "derived", "layers", "choice", "mode", "modules")
#: the order Plan checks its fields in, kind by kind (of several bad fields, the first is named)
CHECK_ORDER = (COUNT, DERIVED, MODE, CHOICE, LAYERS, SWITCH, MODULES)
#: the kinds that hold integer counts (MAX_DEGREE bounds them)
_COUNTING = (COUNT, DERIVED, LAYERS)


def mode_field(default: Mode, *, per_batch: bool = False):
    """A categorical field holding a label of ``default``'s Mode, ``default``'s by default. A PlanBatch
    holds its codes as ``<name>_code``; with ``per_batch`` it holds one label for the whole batch
    (dtype: the formulas branch on it in Python)."""
    return field(default=default.label, metadata={"kind": MODE, "mode": type(default), "per_batch": per_batch})


def choice_field(default: int, choices: tuple[int, ...], what: str):
    """An integer field that takes one of ``choices``; ``what`` names it in the error
    ("unknown ZeRO stage 4")."""
    return field(default=default, metadata={"kind": CHOICE, "choices": choices, "what": what})


def derived_count_field(zero_means: str):
    """A positive integer, or 0 (the default) for what the other fields leave (``zero_means``); its
    flag takes positive values only, leaving the flag out is what 0 says."""
    return field(default=0, metadata={"kind": DERIVED, "zero_means": zero_means})


def layer_count_field(zero_means: str):
    """A non-negative count of layers, 0 (the default) meaning ``zero_means`` (its errors say it)."""
    return field(default=0, metadata={"kind": LAYERS, "zero_means": zero_means})


def module_list_field():
    """A comma-separated list of RECOMPUTE_MODULES, held canonical (:func:`canonical_recompute_modules`);
    a PlanBatch holds its bit mask as ``<name>_mask``. Empty by default."""
    return field(default="", metadata={"kind": MODULES, "metavar": "MODULE[,MODULE...]"})


@dataclass(frozen=True)
class FieldSpec:
    """What a Plan field's declaration says about it, derived once (:data:`PLAN_FIELD_SPECS`).

    ``column`` is its PlanBatch attribute: ``<name>_code`` for a mode, ``<name>_mask`` for a module
    list, else the name; ``per_batch`` fields are one value for the whole batch."""
    name: str
    kind: str
    default: Any
    column: str
    mode: type[Mode] | None = None
    choices: tuple | None = None
    what: str | None = None
    zero_means: str | None = None
    metavar: str | None = None
    per_batch: bool = False

    @classmethod
    def of(cls, f: Field) -> "FieldSpec":
        meta = f.metadata
        kind = meta.get("kind")
        if kind is None:
            if isinstance(f.default, bool):
                kind = SWITCH
            elif isinstance(f.default, int) and f.default >= 1:
                kind = COUNT
            else:
                raise TypeError(f"Plan.{f.name}: its kind does not follow from the default {f.default!r}; declare "
                                "it with mode_field, choice_field, derived_count_field, layer_count_field or "
                                "module_list_field")
        per_batch = bool(meta.get("per_batch", False))
        column = (f"{f.name}_code" if kind == MODE and not per_batch else f"{f.name}_mask" if kind == MODULES
                  else f.name)
        return cls(f.name, kind, f.default, column, meta.get("mode"), meta.get("choices"), meta.get("what"),
                   meta.get("zero_means"), meta.get("metavar"), per_batch)

    def encode(self, value):
        """A plan's value as its PlanBatch element (a mode's code, a module list's mask)."""
        if self.kind == MODE and not self.per_batch:
            return int(self.mode.parse(value, self.name))
        if self.kind == MODULES:
            return recompute_modules_mask(value)
        return value

    def decode(self, element):
        """A PlanBatch element as the plan's value (Python int, bool or label)."""
        if self.kind == SWITCH:
            return bool(element)
        if self.kind == MODE:
            return element if self.per_batch else self.mode(int(element)).label
        if self.kind == MODULES:
            return recompute_modules_text(int(element))
        return int(element)


def _check(spec: FieldSpec, value, where: str | None):
    """:func:`validate_field` for a field's spec."""
    name, kind = spec.name, spec.kind
    if kind in _COUNTING and isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
            and value > MAX_DEGREE:
        raise ConfigError(where or name.replace("_", "-"), f"must be at most {MAX_DEGREE:,}, got {shown(value)}")
    if kind == COUNT:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(where or name.replace("_", "-"), f"must be a positive integer, got {shown(value)}")
    elif kind in (DERIVED, LAYERS):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConfigError(where or name.replace("_", "-"), f"must be a positive integer (or 0 for "
                              f"{spec.zero_means}), got {shown(value)}")
    elif kind == CHOICE:
        if isinstance(value, bool) or value not in spec.choices:
            raise ConfigError(where or name, f"unknown {spec.what} {shown(value)}",
                              accepted=", ".join(str(c) for c in spec.choices))
    elif kind == MODE:
        return spec.mode.parse(value, where or name)
    elif kind == SWITCH:
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(where or name, f"expected true or false, got {shown(value)}")
    elif kind == MODULES:
        return canonical_recompute_modules(value, where)
    return value


def validate_field(name: str, value, where: str | None = None):
    """Check one plan field on its own (type and range, by its kind); return the value (a Mode for
    modes, the canonical list for a module list; a name that is no plan field: the value as given).

    ``where`` names the field in the error (default: the field, as ``Plan`` reports it)."""
    spec = PLAN_FIELD_SPECS.get(name)
    return value if spec is None else _check(spec, value, where)


def parse_field(name: str, text, where: str | None = None):
    """A plan field's value from text (``"8"``, ``"adam"``, ``"true"``) or an already typed value,
    validated with :func:`validate_field`; modes come back as their labels."""
    where = where or name
    spec = PLAN_FIELD_SPECS.get(name)
    kind = spec.kind if spec else None
    if isinstance(text, str):
        if kind in (*_COUNTING, CHOICE):
            try:
                text = int(text.strip())
            except ValueError:
                raise ConfigError(where, f"expected an integer, got {shown(text)}") from None
        elif kind == SWITCH:
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0"):
                raise ConfigError(where, f"expected true or false (or 1 or 0), got {shown(text)}")
            text = low in ("true", "1")
        else:
            text = text.strip()
    elif kind == SWITCH and isinstance(text, (int, np.integer)) and text in (0, 1):
        text = bool(text)
    value = validate_field(name, text, where)
    return value.label if isinstance(value, Mode) else value


@functools.lru_cache(maxsize=None)
def attribute_docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings of a class: the string literal right below each annotated field
    (PEP 257's attribute docstrings, as torchtitan's ``torchtitan/config/job_config.py`` documents
    its fields and Megatron-LM's ``megatron/training/argument_utils.py`` turns them into help), by
    field name, cleaned with ``inspect.cleandoc``. Read from the source with ``ast`` on the first
    call (the CLI's, when it builds a parser), then cached; the package never reads them otherwise."""
    import ast
    import inspect
    import textwrap
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {node.target.id: inspect.cleandoc(doc.value.value) for node, doc in itertools.pairwise(body)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)}


@dataclass(frozen=True)
class Plan:
    """How a job is laid out on the cluster: one field per choice, each documented by the string
    below it (its ``--flag``'s help). Fields are in the order JSON output and plan files show them.

    Every mode field also reads as its Mode member, ``<name>_code`` (``plan.engine_code``), and the
    module list as its bit mask, ``recompute_modules_mask``: the attributes the cost formulas read,
    the same on a Plan as on a :class:`PlanBatch`."""
    tp: int = 1
    """Tensor-parallel degree: each layer's weights and GEMMs split over tp GPUs (Shoeybi et al. 2019,
    Megatron-LM; --tensor-model-parallel-size)."""
    pp: int = 1
    """Pipeline-parallel degree: the layers split into pp stages that pass activations from one to the
    next (Megatron-LM --pipeline-model-parallel-size)."""
    dp: int = derived_count_field("'what is left'")
    """Data-parallel degree; default: what the GPU count leaves, gpus / (tp*pp*cp) (0 in a plan file)."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp GPUs (Megatron-LM --context-parallel-size),
    by ring attention or Ulysses (cp_mode, on the command line --cp-mode)."""
    sp: bool = False
    """Megatron sequence parallelism: norms and dropout run on a sequence shard of the tp group, with
    all-gather / reduce-scatter in place of the all-reduce (Korthikanti et al. 2022; needs tp > 1)."""
    vpp: int = 1
    """Virtual pipeline stages: model chunks per pipeline stage under the interleaved schedule
    (Narayanan et al. 2021; Megatron-LM --num-layers-per-virtual-pipeline-stage); 1: no interleaving.
    On estimate and whatif, --vpp above 1 without --schedule picks the interleaved schedule."""
    micro_batch: int = 1
    """Sequences per micro-batch on each data-parallel rank; a step runs global batch / (dp *
    micro_batch) micro-batches through the pipeline (Megatron-LM --micro-batch-size)."""
    schedule: str = mode_field(Schedule.ONE_F_ONE_B)
    """Pipeline schedule: 1f1b (one forward, one backward; Narayanan et al. 2021), interleaved (1F1B
    over vpp model chunks per stage), gpipe (all forwards, then all backwards; Huang et al. 2019) or
    zb-h1 (zero-bubble H1, its weight gradients filling the bubble; Qi et al. 2024), zbv (zero-bubble V:
    two chunks per rank in a V, 1F1B's activation memory; Qi et al. 2024 sec. 6), dualpipe (DeepSeek-V3's
    bidirectional pipeline: two parameter copies, pp + 1 micro-batches in flight, forward and backward
    chunks overlapped; even pp, micro-batches even and >= 2*pp) or dualpipev (DualPipe folded onto one
    parameter copy, two V-placed chunks per rank; >= 2*pp micro-batches)."""
    zero: int = choice_field(0, ZERO_STAGES, "ZeRO stage")
    """ZeRO stage: what the data-parallel ranks shard (Rajbhandari et al. 2020): 0 nothing, 1 the
    optimizer states, 2 also the gradients, 3 also the parameters. Megatron-LM runs 1 as its
    distributed optimizer, 2 and 3 as Megatron-FSDP."""
    recompute: str = mode_field(Recompute.NONE)
    """Activation recomputation: none; selective (Megatron: the attention core); full (layer inputs
    only); op-sac (torchtitan: every other matmul output and the attention output)."""
    offload: str = mode_field(Offload.NONE)
    """Where the optimizer states (with --offload-params also the parameters) live: none (the GPU),
    cpu (ZeRO-Offload, Ren et al. 2021) or nvme (ZeRO-Infinity, Rajbhandari et al. 2021); needs
    ZeRO >= 1."""
    offload_params: bool = False
    """With --offload cpu or nvme, the parameters live there too (DeepSpeed offload_param; needs
    ZeRO-3)."""
    dtype: str = mode_field(Dtype.BF16, per_batch=True)
    """Training precision: bf16, fp16, fp32 (CPU validation), or fp8 linear layers with their scaling
    recipe: fp8 (per-tensor current scaling), fp8-delayed, fp8-rowwise, fp8-blockwise, mxfp8
    (Blackwell), or fp4 linear layers: nvfp4 (Blackwell: B200, GB200, B300, GB300), mxfp4 (parts
    with MXFP4 tensor cores: Blackwell, AMD MI350X / MI355X). On plan and whatif without a fixed
    plan: search plans in that precision."""
    flash_attention: bool = True
    """Attention as a fused kernel that never materialises the score matrix (FlashAttention, Dao et
    al. 2022); off: the scores and probabilities are materialised, and the softmax output is kept for
    backward."""
    overlap_grad_reduce: bool = True
    """The data-parallel gradient reduction overlapped with the backward pass (Megatron-LM
    --overlap-grad-reduce, PyTorch DDP's buckets); off: it runs after the backward, on the critical
    path."""
    ep: int = 1
    """Expert-parallel degree: each MoE layer's experts split over ep GPUs, carved from data
    parallelism (Megatron-Core's MoE parallel folding, --engine megatron, folds them over tp*cp*dp)."""
    etp: int = 1
    """Expert tensor parallelism: 1 (each expert whole on every tp rank, run on its sequence shard)
    or tp (each expert split over the tp group; Megatron-Core --expert-tensor-parallel-size)."""
    cp_mode: str = mode_field(CpMode.RING)
    """How context parallelism splits attention: ring (ring attention over load-balanced causal
    chunks; Megatron-LM --cp-comm-type p2p, its default) or ulysses (all-to-all over heads,
    DeepSpeed-Ulysses; Megatron-LM --cp-comm-type a2a). Ties in the planner go to the engine's
    default (the first of its EngineSpec.cp_modes)."""
    optimizer: str = mode_field(Optimizer.ADAM)
    """Adam, or a communication-compressing DeepSpeed variant (onebit-adam, zero-one-adam,
    onebit-lamb) that needs ZeRO-0."""
    delayed_update: bool = False
    """ZeRO-Offload's one-step delayed parameter update (with --offload cpu): the CPU optimizer step
    overlaps the next step's GPU work, with weights one step stale (Ren et al. 2021)."""
    grad_accumulation_fusion: bool = True
    """Gradient accumulation over micro-batches fused into the weight-gradient GEMMs (Megatron-LM's
    gradient_accumulation_fusion writes into main_grad with beta = 1); off: every micro-batch after
    the first adds its gradients with separate kernels (plain PyTorch, DDP no_sync, FSDP). On plan
    and whatif without a fixed plan: search unfused plans."""
    fused_elementwise: bool = True
    """Norms (RMSNorm / LayerNorm) and the MLP's activation (SwiGLU) as fused kernels (Megatron-LM
    with Transformer Engine or Apex); off: eager PyTorch ops (the norm's fp32 upcast and four kernels,
    SwiGLU as silu and mul), which move more bytes and keep more tensors for backward."""
    fused_softmax: bool = True
    """Without flash attention: the scale-mask-softmax over the materialised scores as one fused
    kernel (Megatron-LM's FusedScaleMaskSoftmax, --masked-softmax-fusion, its default); off: eager
    PyTorch ops, a copy of the scores, an in-place mask fill and the softmax (Megatron-LM
    --no-masked-softmax-fusion; Scaling's MaskedSoftmaxTorch, the `torch` kernel of Hagemann et al.
    2023), which stream more than twice the bytes."""
    rope_fusion: bool = True
    """The rotary embedding of the queries and keys as one fused kernel (Megatron-LM's
    --apply-rope-fusion, its command line's default; Transformer Engine's fused RoPE); off: eager
    PyTorch, q*cos + rotate_half(q)*sin in five kernels with five times the bytes (Megatron-LM
    --no-rope-fusion, and Megatron-Core's TransformerConfig default apply_rope_fusion=False, which
    model providers that do not set it keep, as Megatron-Bridge's GPT-OSS and DeepSeek-V3 do)."""
    engine: str = mode_field(Engine.GENERIC)
    """The engine that runs the plan: its model-state layout, buffers and the layouts it offers
    (megatron, deepspeed, torchtitan, scaling; generic: the ZeRO paper's accounting with no engine's
    restrictions, what no engine runs as such). On plan and whatif without a fixed plan: search only
    what that engine runs. Plan() defaults to generic; the commands to paraplan.scenario.DEFAULT_ENGINE."""
    first_stage_layers: int = layer_count_field("the automatic split")
    """Transformer layers on the first pipeline stage (Megatron-LM
    --decoder-first-pipeline-num-layers); 0 (default): the automatic split (stage_layer_counts)."""
    last_stage_layers: int = layer_count_field("the automatic split")
    """Transformer layers on the last pipeline stage (Megatron-LM --decoder-last-pipeline-num-layers);
    0 (default): the automatic split (stage_layer_counts)."""
    tp_comm_overlap: bool = False
    """Tensor-parallel all-gather / reduce-scatter overlapped with the neighbouring GEMMs
    (Megatron-LM --tp-comm-overlap with Transformer Engine userbuffers; torchtitan async TP,
    micro-pipelined all-gather / reduce-scatter matmuls; needs tp > 1 and --sp); off: every TP
    collective sits on the critical path."""
    grad_reduce_bf16: bool = False
    """Megatron-LM's gradient buffer (main_grad) and its data-parallel reduction in bf16
    (--grad-reduce-in-bf16; the Megatron-Bridge and NeMo performance recipes set
    grad_reduce_in_fp32=False): 2 bytes per parameter held and reduced instead of 4."""
    fp8_param_gather: bool = False
    """Megatron-LM under an fp8 dtype: the parameters are the fp8 tensors themselves
    (--fp8-param-gather, Transformer Engine's fp8_model_init; Megatron-Bridge's fp8 presets set it):
    no 16-bit copy beside the fp8 weight and its transpose, and the distributed optimizer / FSDP
    gathers parameters in fp8, 1 byte per parameter instead of 2; off: 16-bit parameters and fp8
    copies made from them each step."""
    offload_activation_layers: int = layer_count_field("none")
    """Transformer layers whose saved activations go to host memory in forward and come back for
    backward (Megatron-LM --cpu-offloading --cpu-offloading-num-layers, Transformer Engine's
    cpu_offload context; Megatron-Bridge cpu_offloading_num_layers; pp 1, no recomputation);
    0 (default): none."""
    attention_kernel: str = mode_field(AttentionKernel.AUTO)
    """The fused attention kernel: auto (the generation's calibrated efficiency), or cudnn, flash2,
    efficient at their efficiency measured by sequence length (Hopper; attention_kernels.yaml), or
    flash1 (FlashAttention 1.x: half FlashAttention-2's rate)."""
    ep_comm_overlap: bool = False
    """Expert-parallel dispatch and combine all-to-alls of one micro-batch hidden under the other
    direction's compute of the neighbouring micro-batch (Megatron-Core's combined 1F1B,
    --overlap-moe-expert-parallel-comm; Megatron-Bridge moe_a2a_overlap; needs ep > 1, pp 1 or the
    interleaved schedule, no full recomputation); off: every all-to-all sits on the critical path.
    On plan: --fix ep_comm_overlap=true turns it on for every candidate that can run it."""
    moe_flex_dispatch: bool = False
    """The expert-parallel dispatch and combine on DeepEP / HybridEP kernels (Megatron-Core's flex
    token dispatcher, --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep|hybridep):
    a token crosses once to each node and GPU that holds one of its experts, not once per routed
    copy, and the copies are grouped by expert on arrival (needs ep > 1, --engine megatron or
    generic); off: the all-to-all dispatcher (--moe-token-dispatcher-type alltoall, torchtitan's
    expert parallelism). On plan: --fix moe_flex_dispatch=true turns it on for every candidate that
    can run it."""
    recompute_modules: str = module_list_field()
    """With --recompute selective: the modules Megatron-Core recomputes (--recompute-granularity
    selective --recompute-modules), comma-separated from core_attn, layernorm, mla_up_proj, mlp,
    moe_act, moe, shared_experts; default: the attention core (Megatron-LM's selective). On plan:
    --fix recompute_modules=moe_act,layernorm sets them on every selective candidate that can run
    them."""
    overlap_param_gather: bool = True
    """ZeRO-1/2's all-gather of the updated parameters overlapped with the next step's first forward,
    bucket by bucket (Megatron-LM --overlap-param-gather; megatron/training/arguments.py validate_args
    allows it only with --overlap-grad-reduce and the distributed optimizer or Megatron-FSDP; the
    Megatron-Bridge and NeMo performance recipes set it). --no-overlap-param-gather: the all-gather runs
    whole between the optimizer step and the forward, exposed, as Megatron-LM does without the flag.
    Without --overlap-grad-reduce nothing overlaps either way; DeepSpeed's ZeRO-1/2 all-gather is exposed
    whatever this says (its optimizer gathers inside step())."""
    te_cross_entropy: bool = False
    """Megatron-LM's loss as Transformer Engine's fused cross-entropy (--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te; Megatron-Bridge's performance overrides set
    cross_entropy_fusion_impl="te"): one kernel reads the 16-bit logits and writes their gradient over
    them in place, 2 bytes per logit held instead of the native loss's 16-bit logits and fp32 softmax
    (2 + 4)."""
    expandable_segments: bool = False
    """PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
    any engine on CUDA; Megatron-Bridge's performance launcher sets it for some runs): memory freed within a
    step is given back page by page and mapped again where the next request lands, so the tensors that
    come and go leave no stranded blocks; off: the allocator's default, fixed-size segments."""
    precision_aware_optimizer: bool = False
    """Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer; Transformer Engine's
    FusedAdam holds the master weights and moments: megatron/core/optimizer/optimizer_config.py,
    OptimizerConfig.use_precision_aware_optimizer): with bf16 parameters the fp32 master weight is kept as
    the 16 bits below the bf16 weight (store_param_remainders, on by default), 2 bytes per parameter
    instead of 4; not under fp8 parameters or an fp8 recipe other than delayed (Megatron-Core then keeps
    fp32 master weights itself). The moments' dtype is --optimizer-state-dtype. Needs the distributed
    optimizer (--zero 1; Megatron-Bridge's performance scripts set it for bf16 runs and turn it off under
    Megatron-FSDP)."""
    optimizer_state_dtype: str = mode_field(OptimizerStateDtype.FP32)
    """With --precision-aware-optimizer: the dtype of Adam's moments, exp_avg and exp_avg_sq (Megatron-LM
    --exp-avg-dtype and --exp-avg-sq-dtype): fp32 (4 bytes each), bf16 or fp16 (2), fp8 (1);
    Megatron-Bridge's DeepSeek-V3 recipe keeps them in bf16."""

    def __post_init__(self):
        for spec in _CHECKED:
            value = _check(spec, getattr(self, spec.name), None)
            if spec.kind == MODULES:                 # held canonical
                object.__setattr__(self, spec.name, value)
        view = PlanBatch.from_plans([self])
        for rule in RULES:
            if rule.kind == ILLEGAL and not rule.uses_scene and rule.bad(view, None)[0]:
                raise ConfigError(rule.field, rule.explain(view, None), accepted=rule.accepted)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def with_dp_for(self, gpus: int) -> "Plan":
        """Fill dp = gpus / (tp·pp·cp) when it was left at 0."""
        if self.dp:
            return self
        mp = self.model_parallel
        if gpus % mp:
            raise ConfigError("gpus", f"tp({self.tp}) * pp({self.pp}) * cp({self.cp}) = {mp} does not divide "
                              f"gpus({gpus})", accepted=f"a GPU count that is a multiple of {mp}")
        return replace(self, dp=gpus // mp)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "plan") -> "Plan":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(str(unknown[0])[:60], "unknown plan key", accepted=", ".join(sorted(names)), source=source)
        try:
            return cls(**dict(data))
        except ConfigError as e:
            # name the field as the user wrote it: the flag (--micro-batch) or the file's key (plan.micro_batch)
            key = e.field.replace("-", "_")
            if key not in names or e.source:
                raise
            field = f"--{e.field.replace('_', '-')}" if source == "flags" else f"plan.{key}"
            raise ConfigError(field, e.problem, accepted=e.accepted,
                              source=None if source == "flags" else source) from None

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        parts.append(f"mb{self.micro_batch}")
        if self.sp:
            parts.append("sp")
        return " ".join(parts)


#: every Plan field's spec (kind, default, PlanBatch column), in declaration order
PLAN_FIELD_SPECS: dict[str, FieldSpec] = {f.name: FieldSpec.of(f) for f in fields(Plan)}
PLAN_FIELDS = tuple(PLAN_FIELD_SPECS)
_CHECKED = tuple(s for kind in CHECK_ORDER for s in PLAN_FIELD_SPECS.values() if s.kind == kind)


def _names(kind: str) -> tuple[str, ...]:
    return tuple(s.name for s in PLAN_FIELD_SPECS.values() if s.kind == kind)


# The fields by kind, derived from Plan (the names modules import)
MODES: dict[str, type[Mode]] = {s.name: s.mode for s in PLAN_FIELD_SPECS.values() if s.kind == MODE}
MODE_FIELD_NAMES = {cls: name for name, cls in MODES.items()}
POSITIVE_INT_FIELDS = _names(COUNT)
BOOL_FIELDS = _names(SWITCH)
#: layer counts a plan pins (non-negative integers), and what 0 means for each (their errors say it)
STAGE_LAYER_FIELDS = _names(LAYERS)
STAGE_LAYER_ZERO_MEANS = {s.name: s.zero_means for s in PLAN_FIELD_SPECS.values() if s.kind == LAYERS}


def _column_property(spec: FieldSpec) -> property:
    """A Plan's value as the PlanBatch column reads it: a mode's member (an int), a module list's mask."""
    name = spec.name
    if spec.kind == MODE:
        parse = spec.mode.parse
        return property(lambda self: parse(getattr(self, name)), doc=f"The {spec.mode.__name__} of ``{name}``.")
    return property(lambda self: recompute_modules_mask(getattr(self, name)), doc=f"The bit mask of ``{name}``.")


for _spec in PLAN_FIELD_SPECS.values():
    if _spec.column != _spec.name:
        setattr(Plan, _spec.column, _column_property(_spec))


class _PlanBatchRows:
    """The methods of :class:`PlanBatch`, generic over its columns."""

    def __post_init__(self):
        n = next((len(getattr(self, s.column)) for s in _BATCH_ARRAYS if getattr(self, s.column) is not None), None)
        if n is None:
            raise TypeError("PlanBatch needs at least one column")
        for spec, default in _BATCH_DEFAULTS:
            if getattr(self, spec.column) is None:
                object.__setattr__(self, spec.column, np.full(n, default))

    @classmethod
    def from_plans(cls, plans: Sequence[Plan]) -> "PlanBatch":
        """Plans (one dtype) as a batch; ``from_plans([plan])`` is the one-plan view the rules read."""
        columns = {s.column: np.array([getattr(p, s.column) for p in plans]) if s.column == s.name
                   else np.array([int(getattr(p, s.column)) for p in plans]) for s in _BATCH_ARRAYS}
        for s in _BATCH_SCALARS:
            columns[s.column] = getattr(plans[0], s.name) if plans else s.default
        return cls(**columns)

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, index) -> "PlanBatch":
        """The plans at ``index`` (an index array, a mask or a slice) as a batch."""
        return type(self)(**{s.column: getattr(self, s.column)[index] for s in _BATCH_ARRAYS},
                          **{s.column: getattr(self, s.column) for s in _BATCH_SCALARS})

    def plan(self, i: int) -> Plan:
        """Plan ``i`` of the batch (checked, as every Plan is)."""
        return Plan(**{s.name: s.decode(getattr(self, s.column) if s.per_batch else getattr(self, s.column)[i])
                       for s in PLAN_FIELD_SPECS.values()})


_BATCH_ARRAYS = tuple(s for s in PLAN_FIELD_SPECS.values() if not s.per_batch)
_BATCH_SCALARS = tuple(s for s in PLAN_FIELD_SPECS.values() if s.per_batch)
_BATCH_DEFAULTS = tuple((s, s.encode(s.default)) for s in _BATCH_ARRAYS)

PlanBatch = make_dataclass(
    "PlanBatch", [(s.column, Any if s.per_batch else np.ndarray, field(default=s.default if s.per_batch else None))
                  for s in PLAN_FIELD_SPECS.values()],
    bases=(_PlanBatchRows,), frozen=True)
PlanBatch.__module__ = __name__
PlanBatch.__doc__ = """Many plans as parallel numpy arrays, one attribute per Plan field, derived from
:data:`PLAN_FIELD_SPECS`: a mode's codes as ``<name>_code`` (``engine_code``), the module list's bit masks
as ``recompute_modules_mask``, the other fields under their names; ``dtype`` is one label for the
whole batch. Columns left out take the Plan default; ``dataclasses.replace`` swaps one."""


# --- layers per pipeline stage ---------------------------------------------------------------------
class StageLayers(NamedTuple):
    """Transformer layers per pipeline stage, one entry per plan (numpy arrays, or Python ints for
    one plan): the first stage's, the largest middle stage's (0 without middle stages, pp <= 2),
    the last stage's and the largest of all. With pp = 1 the one stage is both first and last."""
    first: Any
    middle: Any
    last: Any
    largest: Any


def _stage_split(layers: int, pp, first, last):
    """(first, extra-per-middle count, base per unset stage, last) of the split; see :func:`stage_layers`."""
    pp = np.asarray(pp, dtype=np.int64)
    has_f, has_l = np.asarray(first) > 0, np.asarray(last) > 0
    unset = np.maximum(pp - has_f - has_l, 1)
    rest = np.maximum(layers - np.asarray(first) - np.asarray(last), 0)
    base, extra = rest // unset, rest % unset
    n_mid = np.maximum(pp - 2, 0)
    extra_mid = np.minimum(extra, n_mid)
    left = extra - extra_mid                       # what the middle stages could not take
    last_extra = ~has_l & (left >= 1)
    first_extra = ~has_f & (left - last_extra >= 1)
    f = np.where(has_f, first, base + first_extra)
    l_ = np.where(pp == 1, f, np.where(has_l, last, base + last_extra))
    return f, extra_mid, base, l_


# Aleph Alpha's Scaling splits its layer specs, not its transformer layers: [embedding, the L
# transformer layers, final norm, LM head] (transformer/model/model.py get_transformer_layer_specs),
# L + 3 items cut by pipe_partition_uniform, its default pipe_partition_method (core/topology/
# topology_config.py; core/nn/parallel_module/pipeline_partitioning.py): floor((L + 3) / pp) items per
# stage and one more to each of the first (L + 3) mod pp stages. 13B (40 layers) on pp 2: 21 and 19
# transformer layers; 65B (80 layers) on pp 8: 10, 11, 11, 10, 10, 10, 10, 8.
SCALING_EXTRA_LAYER_SPECS = 3


def _scaling_stage_layer_count(layers: int, pp, stage):
    """Transformer layers in Scaling's pipeline stage ``stage`` (0-based) of ``pp``: the layer specs
    1..L that fall in the stage's share of the uniform split of L + 3 specs."""
    pp, stage = np.asarray(pp, dtype=np.int64), np.asarray(stage, dtype=np.int64)
    items = layers + SCALING_EXTRA_LAYER_SPECS
    base, extra = items // pp, items % pp
    start = stage * base + np.minimum(stage, extra)
    end = start + base + (stage < extra)
    return np.maximum(0, np.minimum(end, layers + 1) - np.maximum(start, 1))


def _is_scaling_auto_split(plan):
    """Plans whose split Scaling makes itself: an engine that splits its layer specs (engine scaling,
    ``Behaviour.splits_layer_specs``) with no explicit first / last stage layers."""
    return (engine_flag(plan, "splits_layer_specs")
            & (np.asarray(getattr(plan, "first_stage_layers", 0)) == 0)
            & (np.asarray(getattr(plan, "last_stage_layers", 0)) == 0))


def model_stage_layers(model, plan) -> StageLayers:
    """:func:`stage_layers` of a model's layers, with its multi-token-prediction blocks
    (``model.mtp_layers``) on the last stage, where Megatron-LM places them beside the loss (the
    one stage of pp = 1 holds them too): what a stage's time, memory and parameters count."""
    sl = stage_layers(model.layers, plan)
    # a hybrid's depth counts its mtp_pattern layers (each priced as an average layer of the stack)
    mtp = getattr(model, "mtp_layers", 0) * getattr(model, "mtp_block_layers", 1)
    if not mtp:
        return sl
    one_stage = np.asarray(plan.pp) == 1
    first = np.where(one_stage, sl.first + mtp, sl.first)
    last = sl.last + mtp
    return StageLayers(first, sl.middle, last, np.maximum(np.maximum(first, sl.middle), last))


#: plans from which :func:`stage_layers` looks the automatic split up per pipeline depth
_SPLIT_TABLE_MIN = 256


def _split_by_depth(layers: int, deepest: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, largest middle, last) stage layers of the automatic split (no first / last stage layers set)
    for every pipeline depth 0..``deepest`` (:func:`_stage_split`, the same formula; index 0 unused)."""
    depths = np.arange(deepest + 1, dtype=np.int64)
    f, extra_mid, base, l_ = _stage_split(layers, depths, 0, 0)
    return f, np.where(depths > 2, base + (extra_mid > 0), 0), l_


def stage_layers(layers: int, plan) -> StageLayers:
    """Layers per pipeline stage for a plan or a :class:`PlanBatch`, vectorized.

    Explicit ``first_stage_layers`` / ``last_stage_layers`` (Megatron-LM's
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
    megatron/training/arguments.py) are kept; the other stages share what is left. The automatic
    split gives every unset stage floor(rest / stages) layers and the remainder one more each to
    the middle stages first, then to the last and then the first: the first stage also holds the
    embedding, the last the LM head and the loss, so they are the lighter ones (Llama 3 405B,
    126 layers on pp 16: 7, 8 x 14, 7; BLOOM-176B, 70 layers on pp 12: 5, 6 x 10, 5). Layers that
    divide evenly give layers / pp everywhere. Engine scaling splits as Scaling does
    (SCALING_EXTRA_LAYER_SPECS: uniform over its L + 3 layer specs). Floats, so that formulas read them like
    ``layers / pp`` (exactly equal when the split is even)."""
    pp = np.asarray(plan.pp)
    first = np.asarray(getattr(plan, "first_stage_layers", 0))
    last = np.asarray(getattr(plan, "last_stage_layers", 0))
    if pp.size >= _SPLIT_TABLE_MIN and not first.any() and not last.any() and 1 <= pp.min() and pp.max() <= 4096:
        # the automatic split depends on pp alone: worked out once per pipeline depth and looked up
        # (the search's chunks of 200,000 plans hold a few depths; the same integers, a seventh of the time)
        f, middle, l_ = (table[pp] for table in _split_by_depth(layers, int(pp.max())))
    else:
        f, extra_mid, base, l_ = _stage_split(layers, pp, first, last)
        middle = np.where(pp > 2, base + (extra_mid > 0), 0)
    scaling = _is_scaling_auto_split(plan) & (pp > 1)
    if np.any(scaling):
        # Scaling's own split (SCALING_EXTRA_LAYER_SPECS); its largest middle stage is the second
        f = np.where(scaling, _scaling_stage_layer_count(layers, pp, 0), f)
        middle = np.where(scaling & (pp > 2), _scaling_stage_layer_count(layers, pp, 1), middle)
        l_ = np.where(scaling, _scaling_stage_layer_count(layers, pp, pp - 1), l_)
    f, middle, l_ = (np.asarray(x, dtype=float) for x in (f, middle, l_))
    return StageLayers(f, middle, l_, np.maximum(np.maximum(f, middle), l_))


def stage_layer_counts(layers: int, plan) -> list[int]:
    """Every stage's layer count for one plan, first to last (:func:`stage_layers`); the middle
    stages that get an extra layer are the earliest ones (engine scaling: Scaling's own uniform split
    of its L + 3 layer specs, which may leave the last stages with the final norm and head alone). With vpp > 1 each stage's count is
    split evenly over its vpp model chunks."""
    pp = int(plan.pp)
    if pp == 1:
        return [layers]
    if bool(_is_scaling_auto_split(plan)):
        return [int(_scaling_stage_layer_count(layers, pp, i)) for i in range(pp)]
    f, extra_mid, base, l_ = (int(x) for x in _stage_split(layers, pp, plan.first_stage_layers,
                                                             plan.last_stage_layers))
    return [f] + [base + (i < extra_mid) for i in range(pp - 2)] + [l_]


def interleaved_split_accounts(layers: int, pp: int, vpp: int) -> tuple[bool, bool] | None:
    """How interleaved (virtual) stages split ``layers`` over pp * vpp model chunks, as Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` do
    (megatron/core/transformer/transformer_layer.py: the embedding and the loss each count as one
    layer, and layers + those must divide by pp, then by vpp; Megatron-Bridge's Llama 3.1 405B
    recipe, 126 layers on pp 8 x vpp 8): (embedding counted, loss counted), (False, False) when the
    layers divide evenly, None when no accounting makes them divide. The first chunk of the first
    stage then holds one layer fewer (embedding counted), the last chunk of the last stage one fewer
    (loss counted): the automatic split of :func:`stage_layers` gives exactly these stage totals."""
    n = pp * vpp
    if not _interleaved_split_exists(layers, n):
        return None
    r = layers % n
    return (r != 0, r != 0 and r == n - 2)      # r = n - 1: the embedding alone; r = n - 2: both


def _interleaved_split_exists(layers: int, chunks):
    """Vectorized :func:`interleaved_split_accounts` is not None, over arrays of pp * vpp."""
    n = np.asarray(chunks)
    r = layers % n
    return (r == 0) | ((n > 2) & ((r == n - 1) | (r == n - 2)))


def virtual_stage_layer_counts(layers: int, plan) -> list[int]:
    """Layers of every model chunk in model order (pp * vpp entries; the stages' counts with vpp 1):
    chunk i runs on stage i mod pp. floor(layers / chunks) each and one more for the remainder's
    chunks, the middle ones first, then the last, then the first (they hold the LM head and the
    embedding). Where Megatron-LM's embedding / loss accounting makes the layers divide
    (:func:`interleaved_split_accounts`) this is exactly its split; otherwise it is the layout a
    ``--pipeline-model-parallel-layout`` (Megatron-Core; its docs' "Custom Pipeline Model Parallel
    Layout" puts DeepSeek-V3's 61 layers on pp 16 x vpp 2 as ``Et*3|(tt|)*29,m|L``) or torchtitan's split
    points give. Every engine that runs the interleaved schedule takes such uneven chunks, so no layer
    count is refused for interleaving beyond one layer per chunk (rule ``layer-per-stage``)."""
    vpp = int(plan.vpp)
    if vpp == 1:
        return stage_layer_counts(layers, plan)
    n = int(plan.pp) * vpp
    base, extra = divmod(layers, n)
    order = list(range(1, n - 1)) + [n - 1, 0]
    counts = [base] * n
    for i in order[:extra]:
        counts[i] += 1
    return counts


class PipelineLayout(NamedTuple):
    """What a Megatron-Core pipeline layout places on each pipeline rank (:func:`read_megatron_layout`):
    per rank, first to last, its transformer layers and its multi-token-prediction blocks over all its
    model chunks, and the virtual stages (chunks) per rank."""
    layers: tuple[int, ...]
    mtp: tuple[int, ...]
    vpp: int


#: Megatron-Core's layout letters (megatron/core/transformer/pipeline_parallel_layer_layout.py,
#: PipelineParallelLayerLayout.parse_str_to_list): embedding, loss, transformer ("decoder") layer, MTP block
LAYOUT_LETTERS = "ELtm"


def read_megatron_layout(layout: str, pp: int) -> PipelineLayout:
    """A ``--pipeline-model-parallel-layout`` string read as Megatron-Core reads it
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, ``parse_str_to_list`` and the
    constructor): commas dropped; each ``(...)*n`` written out n times, then each ``x*n``; chunks split at
    "|" ("E" embedding, "L" loss, "t" a transformer layer, "m" an MTP block); the chunk count a multiple
    of ``pp``, vpp = chunks / pp, chunk i on rank i mod pp. "Et|(tt|)*30mL" on pp 8: 32 chunks, vpp 4,
    ranks holding 7, 8 x 6 and 6 layers, the last with the MTP block. Raises ConfigError (field
    pipeline_layout) on another letter or a chunk count pp does not divide."""
    text = str(layout).replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), text)
    bad = sorted(set(text) - set(LAYOUT_LETTERS + "|"))
    if bad:
        raise ConfigError("pipeline_layout", f"{layout!r} holds {''.join(bad)!r}; accepted: E (embedding), L (loss), "
                          "t (transformer layer), m (MTP block), '|' between chunks, (...)*n and x*n repeats")
    chunks = text.split("|")
    if pp < 1 or len(chunks) % pp:
        raise ConfigError("pipeline_layout", f"{layout!r} has {len(chunks)} chunks, not a multiple of pp({pp})")
    return PipelineLayout(tuple(sum(c.count("t") for c in chunks[r::pp]) for r in range(pp)),
                          tuple(sum(c.count("m") for c in chunks[r::pp]) for r in range(pp)), len(chunks) // pp)


def expert_parallel_folded(plan):
    """Whether the plan's expert layers are laid out by Megatron-Core's MoE parallel folding: the
    expert layers take the same tp·cp·dp ranks as the attention but regroup them as etp × ep × edp
    (etp fastest), so ep may exceed dp (Liu et al. 2025, "MoE Parallel Folding", arXiv:2504.14960;
    megatron/core/parallel_state.py builds the expert groups from the tp·cp·dp ranks). Other engines
    carve ep from data parallelism (DeepSpeed-MoE's expert groups: dp ranks at stride tp·cp). The
    engine's ``Behaviour.folds_expert_parallelism``."""
    return engine_flag(plan, "folds_expert_parallelism")


def expert_data_parallel(plan):
    """Replicas of one expert shard (the expert-data-parallel degree): tp·cp·dp / (ep·etp) under
    folding, dp·cp / ep where ep is carved from dp."""
    tp, cp, dp, ep, etp = (np.asarray(getattr(plan, k), dtype=float) for k in ("tp", "cp", "dp", "ep", "etp"))
    return np.where(expert_parallel_folded(plan), tp * cp * dp / (ep * etp), dp * cp / ep)


def expert_group_strides(plan):
    """(rank stride of the ep group, rank stride of the expert-data-parallel group) in the global
    rank order: etp and etp·ep under folding (etp fastest, then ep, then edp), tp·cp and tp·cp·ep
    where ep is carved from dp."""
    tp, cp, ep, etp = (np.asarray(getattr(plan, k)) for k in ("tp", "cp", "ep", "etp"))
    folded = expert_parallel_folded(plan)
    return np.where(folded, etp, tp * cp), np.where(folded, etp * ep, tp * cp * ep)


def stage_split_is_even(layers: int, plan) -> bool:
    """Whether every stage holds the same number of layers."""
    return len(set(stage_layer_counts(layers, plan))) == 1


# --- legality rules --------------------------------------------------------------------------------
ILLEGAL = "illegal"  # no such plan may run: Plan / check_plan reject it, the search removes it
PRUNE = "prune"      # legal but a duplicate of a plan the search keeps: only the search removes it


class Scene(NamedTuple):
    """What the rules that look beyond the plan read: the model, the job, the cluster, and a dp the
    user gave (``--fix dp`` or a plan's explicit dp; None when dp is what the GPU count leaves)."""
    model: Any
    job: Any
    cluster: Any
    fixed_dp: int | None = None

    @property
    def gpus(self) -> int:
        return self.cluster.num_gpus


@dataclass(frozen=True)
class Rule:
    """One named legality rule, vectorized: ``bad(P, scene)`` is a boolean per plan of ``P`` (a
    :class:`PlanBatch`, or any object with its attribute names as arrays); ``message(p, scene)``
    explains it for one plan ``p`` (the same attributes as Python scalars).

    ``reason`` is the key the search counts removals under (rules may share one); ``axes`` the
    attributes ``bad`` reads (the search applies a rule in the earliest stage that has them all);
    ``field`` and ``accepted`` what ``Plan`` names when the rule needs no scene (``uses_scene``).
    Prune rules may read the search's own ``etp_is_tp`` (expert TP equal to TP)."""
    name: str
    reason: str
    kind: str
    axes: frozenset
    bad: Callable[[Any, Scene | None], Any]
    message: Callable[[Any, Scene | None], str]
    field: str = "plan"
    accepted: str | None = None
    uses_scene: bool = True

    def mask(self, P, scene: Scene | None, rows: int | None = None) -> np.ndarray:
        """``bad`` as a boolean array with one entry per plan of ``P`` (``rows``: their count, when the
        caller already knows it)."""
        return np.broadcast_to(np.asarray(self.bad(P, scene), bool), (_rows(P) if rows is None else rows,))

    def explain(self, P, scene: Scene | None) -> str:
        """The message for the first plan of ``P``."""
        return self.message(_first(P), scene)


def _rows(P) -> int:
    """How many plans ``P`` holds (its longest array attribute)."""
    return max((np.size(v) for v in vars(P).values() if isinstance(v, np.ndarray)), default=1)


def _first(P) -> SimpleNamespace:
    """The first plan of ``P`` as Python scalars."""
    return SimpleNamespace(**{k: (np.ravel(v)[0].item() if isinstance(v, np.ndarray) else v)
                              for k, v in vars(P).items()})


def _mp(P):
    return P.tp * P.pp * P.cp


def _degrees_message(p, s: Scene) -> str:
    mp = p.tp * p.pp * p.cp
    if s.fixed_dp:
        return (f"tp({p.tp}) * pp({p.pp}) * dp({s.fixed_dp}) * cp({p.cp}) = {mp * s.fixed_dp} != "
                f"gpus({s.gpus})")
    return f"tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {mp} does not divide gpus({s.gpus})"


def _batch_ok(P, s: Scene):
    return (P.dp > 0) & (s.job.global_batch % np.maximum(P.dp * P.micro_batch, 1) == 0)


def _micro_batches(P, s: Scene):
    return np.where(_batch_ok(P, s), s.job.global_batch // np.maximum(P.dp * P.micro_batch, 1), 0)


def _seq_shard_message(p, s: Scene) -> str:
    sp = getattr(p, "sp", False)
    shard = p.cp * (p.tp if sp else 1)
    what = f"cp({p.cp}) * tp({p.tp})" if sp else f"cp({p.cp})"
    return f"seq_len({s.job.seq_len}) % {what} = {s.job.seq_len % shard}, must be 0"


def _moe(s: Scene) -> bool:
    return s.model.moe is not None


def _mamba(s: Scene):
    """The scene's Mamba-2 mixer (a hybrid layer pattern's M layers), or None."""
    return getattr(s.model, "mamba", None)


def _even_hybrid_stage_split_refused(P, s: Scene):
    """Megatron-LM's hybrid stack gives every pipeline rank num_layers // pp consecutive layers of the
    pattern and asserts there is no virtual pipeline (NVIDIA/Megatron-LM megatron/core/ssm/mamba_block.py,
    MambaStack._select_layers_for_pipeline_parallel): uneven stages, interleaving and a pp that does not
    divide the layers (whose remainder layers it would drop) do not run there."""
    if not getattr(s.model, "layer_pattern", ""):
        return np.zeros(np.shape(np.asarray(P.pp)), dtype=bool)
    even = engine_flag(P, "hybrid_layers") == "even"
    split = ((s.model.layers % np.asarray(P.pp)) != 0) | (np.asarray(P.vpp) > 1) \
        | (np.asarray(P.first_stage_layers) > 0) | (np.asarray(P.last_stage_layers) > 0)
    return even & split


def _hybrid_engine_refused(P, s: Scene):
    return bool(getattr(s.model, "layer_pattern", "")) & (engine_flag(P, "hybrid_layers") == "none")


def _experts_message(p, s: Scene) -> str:
    e = s.model.moe.experts
    return f"experts({e}) % ep({p.ep}) = {e % p.ep}, must be 0"


def _stage_fields_bad(P, layers: int):
    """Explicit first/last stage layers that leave another stage empty or do not add up."""
    has_f, has_l = P.first_stage_layers > 0, P.last_stage_layers > 0
    unset = P.pp - has_f - has_l
    rest = layers - P.first_stage_layers - P.last_stage_layers
    return (has_f | has_l) & np.where(unset == 0, rest != 0, rest < unset)


def _stage_fields_message(p, s: Scene) -> str:
    L, f, l_ = s.model.layers, p.first_stage_layers, p.last_stage_layers
    unset = p.pp - (f > 0) - (l_ > 0)
    if unset == 0:
        return f"first_stage_layers({f}) + last_stage_layers({l_}) must equal layers({L}) with pp=2"
    return (f"first_stage_layers({f}) + last_stage_layers({l_}) = {f + l_} leaves {L - f - l_} layers for "
            f"{unset} other stages; at most layers - {unset} = {L - unset}")


def _modules_the_model_lacks(s: Scene) -> int:
    """The bit mask of RECOMPUTE_MODULES the scene's model has no submodule for: mla_up_proj without
    latent attention, moe_act / moe without MoE layers, shared_experts without shared experts, mlp
    without a dense MLP layer."""
    m = s.model
    lacks = [name for name, missing in (
        ("mla_up_proj", getattr(m, "mla", None) is None),
        ("moe_act", m.moe is None), ("moe", m.moe is None),
        ("shared_experts", m.moe is None or not m.moe.shared_experts),
        ("mlp", m.moe is not None and m.moe_layers >= m.layers))
        if missing]
    return recompute_modules_mask(",".join(lacks))


def _r(name, reason, kind, axes, bad, message, **kw) -> Rule:
    return Rule(name, reason, kind, frozenset(axes), bad, message, **kw)


def _engine_rule(name: str) -> Rule:
    """The engine rule ``name``, generated from the engine specs (``paraplan.engines.ENGINE_RULES``):
    illegal, and read without the scene."""
    r = ENGINE_RULES[name]
    return Rule(r.name, r.reason, ILLEGAL, frozenset(r.axes), r.bad, r.message, field=r.field, accepted=r.accepted,
                uses_scene=False)


def _fp4_refusal(dtype: str, accelerator) -> str:
    """Why an fp4 dtype is refused on ``accelerator``, with the dtypes it does take."""
    takes = [d for d in Dtype.labels() if d not in FP4_DTYPES or d in accelerator.fp4_formats]
    takes = [d for d in takes if d != "fp32" and (gemm_dtype(d) in accelerator.peak_flops or d in ("bf16", "fp16"))
             and (d != Dtype.MXFP8.label or accelerator.microscaling)]
    has = (f"its fp4 tensor cores take {', '.join(accelerator.fp4_formats)}" if accelerator.fp4_formats
           else "it has no fp4 tensor cores")
    return (f"{accelerator.name} cannot train in {dtype}: {has} (nvfp4 runs on Blackwell: b200, gb200, b300, gb300; "
            f"mxfp4 on Blackwell and AMD mi350x, mi355x); accepted here: {', '.join(takes)}")


RULES: tuple[Rule, ...] = (
    _r("degrees-divide-gpus", "tp*pp*cp does not divide the GPU count", ILLEGAL, ("tp", "pp", "cp"),
       lambda P, s: s.gpus % _mp(P) != 0, _degrees_message),
    _r("dp-matches-degrees", "dp differs from --fix dp", ILLEGAL, ("tp", "pp", "cp"),
       lambda P, s: bool(s.fixed_dp) & (s.gpus % _mp(P) == 0) & (_mp(P) * (s.fixed_dp or 0) != s.gpus),
       _degrees_message),
    _r("tp-splits-heads", "tp does not divide the attention heads", ILLEGAL, ("tp",),
       lambda P, s: s.model.heads % P.tp != 0,
       lambda p, s: f"heads({s.model.heads}) % tp({p.tp}) = {s.model.heads % p.tp}, must be 0"),
    _r("tp-kv-heads", "tp and the KV heads do not divide one another", ILLEGAL, ("tp",),
       lambda P, s: (s.model.kv_heads % P.tp != 0) & (P.tp % s.model.kv_heads != 0),
       lambda p, s: f"kv_heads({s.model.kv_heads}) and tp({p.tp}) must divide one another"),
    _r("hybrid-needs-megatron", "the engine does not run hybrid Mamba-2 / attention layer patterns", ILLEGAL,
       ("engine_code",), _hybrid_engine_refused,
       lambda p, s: (f"{s.model.name} is a hybrid Mamba-2 / attention model (layer_pattern); "
                     f"{Engine(int(p.engine_code)).label} has no Mamba layer: Megatron-LM runs it (pretrain_mamba.py "
                     "--is-hybrid-model --hybrid-override-pattern)"),
       field="engine", accepted="megatron, generic"),
    _r("megatron-hybrid-even-stages", "Megatron-LM splits a hybrid's layers evenly over pp, without interleaving",
       ILLEGAL, ("pp", "vpp", "engine_code", "first_stage_layers", "last_stage_layers"),
       _even_hybrid_stage_split_refused,
       lambda p, s: (f"Megatron-LM's hybrid Mamba stack gives each of pp({p.pp}) stages layers({s.model.layers}) // pp "
                     f"layers and has no interleaved schedule (mamba_block.py MambaStack): pp must divide "
                     f"{s.model.layers}, vpp 1, no first/last stage layers"),
       field="pp", accepted="a pp that divides the layers, vpp 1"),
    _r("tp-splits-mamba-heads", "tp does not divide the Mamba heads and groups", ILLEGAL, ("tp",),
       lambda P, s: _mamba(s) is not None and ((_mamba(s).heads % P.tp != 0) | (_mamba(s).groups % P.tp != 0)),
       lambda p, s: (f"Mamba heads({_mamba(s).heads}) and groups({_mamba(s).groups}) must both be divisible by "
                     f"tp({p.tp}) (Megatron-Core MambaMixer shards heads and groups over tp)")),
    _r("cp-splits-mamba-heads", "cp does not divide the Mamba heads per tp rank", ILLEGAL, ("tp", "cp"),
       lambda P, s: _mamba(s) is not None and ((P.cp > 1) & ((_mamba(s).heads // P.tp) % P.cp != 0)),
       lambda p, s: (f"Mamba heads per tp rank ({_mamba(s).heads // p.tp}) % cp({p.cp}) must be 0 (Megatron-Core "
                     "MambaContextParallel gives each cp rank whole heads)")),
    _r("batch-divisible", "global batch not divisible by dp*micro_batch", ILLEGAL, ("dp", "micro_batch"),
       lambda P, s: (P.dp > 0) & ~_batch_ok(P, s),
       lambda p, s: (f"global_batch({s.job.global_batch}) % (dp({p.dp}) * micro_batch({p.micro_batch})) = "
                     f"{s.job.global_batch % (p.dp * p.micro_batch)}, must be 0")),
    _r("layer-per-stage", "fewer layers than pipeline stages (pp*vpp)", ILLEGAL, ("pp", "vpp"),
       lambda P, s: s.model.layers < P.pp * P.vpp,
       lambda p, s: (f"layers({s.model.layers}) < pp({p.pp}) * vpp({p.vpp}) = {p.pp * p.vpp}: every "
                     "(virtual) pipeline stage needs at least one layer")),
    _r("stage-layers-need-pp", "first/last stage layers need pp >= 2", ILLEGAL,
       ("pp", "first_stage_layers", "last_stage_layers"),
       lambda P, s: ((P.first_stage_layers > 0) | (P.last_stage_layers > 0)) & (P.pp < 2),
       lambda p, s: (f"first_stage_layers({p.first_stage_layers}) / last_stage_layers({p.last_stage_layers}) "
                     f"need a pipeline (pp >= 2, got {p.pp})"),
       field="first_stage_layers", accepted="0 (automatic) with pp=1", uses_scene=False),
    _r("stage-layers-not-interleaved", "first/last stage layers not modelled with interleaving", ILLEGAL,
       ("vpp", "first_stage_layers", "last_stage_layers"),
       lambda P, s: ((P.first_stage_layers > 0) | (P.last_stage_layers > 0)) & (P.vpp > 1),
       lambda p, s: (f"first_stage_layers / last_stage_layers with vpp={p.vpp}: uneven interleaved stages are "
                     "not modelled; use vpp=1 or leave them 0"),
       field="first_stage_layers", accepted="0 (automatic) with vpp > 1", uses_scene=False),
    _r("stage-layers-fit", "first/last stage layers leave a stage without layers", ILLEGAL,
       ("pp", "first_stage_layers", "last_stage_layers"),
       lambda P, s: (P.pp >= 2) & _stage_fields_bad(P, s.model.layers), _stage_fields_message),
    _r("schedule-needs-pipeline", "schedule irrelevant without pipeline (pp=1 keeps 1f1b)", PRUNE,
       ("pp", "schedule_code"), lambda P, s: (P.pp == 1) & (P.schedule_code != Schedule.ONE_F_ONE_B),
       lambda p, s: "without a pipeline (pp=1) every schedule runs alike; the search keeps 1f1b", uses_scene=False),
    _r("interleaved-needs-pp", "the interleaved schedule needs pp > 1", ILLEGAL, ("pp", "schedule_code"),
       lambda P, s: (P.pp == 1) & (P.schedule_code == Schedule.INTERLEAVED),
       lambda p, s: "the interleaved schedule needs pp > 1", field="schedule", uses_scene=False),
    _r("vpp-needs-interleaved", "vpp>1 needs the interleaved schedule and vice versa", ILLEGAL,
       ("vpp", "schedule_code"), lambda P, s: (P.vpp > 1) & (P.schedule_code != Schedule.INTERLEAVED),
       lambda p, s: f"vpp={p.vpp} needs --schedule interleaved (got {Schedule(p.schedule_code).label})",
       field="vpp", uses_scene=False),
    _r("interleaved-needs-vpp", "vpp>1 needs the interleaved schedule and vice versa", PRUNE,
       ("vpp", "schedule_code"), lambda P, s: (P.vpp == 1) & (P.schedule_code == Schedule.INTERLEAVED),
       lambda p, s: "interleaved with vpp=1 runs as 1f1b; the search keeps 1f1b", uses_scene=False),
    _r("interleaved-micro-batches", "interleaved needs micro-batches % pp == 0", ILLEGAL,
       ("schedule_code", "dp", "micro_batch", "pp"),
       lambda P, s: (P.schedule_code == Schedule.INTERLEAVED) & _batch_ok(P, s) & (_micro_batches(P, s) % P.pp != 0),
       lambda p, s: (lambda m: f"micro-batches per step ({m}) % pp({p.pp}) = {m % p.pp}; the interleaved "
                               "schedule needs a multiple of pp")(s.job.global_batch // (p.dp * p.micro_batch))),
    _r("dualpipe-even-pp", "DualPipe needs an even pp", ILLEGAL, ("pp", "schedule_code"),
       lambda P, s: (P.schedule_code == Schedule.DUALPIPE) & (P.pp > 1) & (P.pp % 2 != 0),
       lambda p, s: (f"DualPipe pairs rank r with rank pp - 1 - r and needs an even pp, not pp({p.pp}) "
                     "(dualpipe/dualpipe.py: assert num_ranks % 2 == 0)"),
       field="schedule", accepted="--pp 2, 4, 6, ...", uses_scene=False),
    _r("dualpipe-micro-batches", "DualPipe needs an even number of micro-batches, at least 2*pp", ILLEGAL,
       ("schedule_code", "dp", "micro_batch", "pp"),
       lambda P, s: ((P.schedule_code == Schedule.DUALPIPE) & (P.pp > 1) & _batch_ok(P, s)
                     & ((_micro_batches(P, s) % 2 != 0) | (_micro_batches(P, s) < 2 * P.pp))),
       lambda p, s: (lambda m: f"micro-batches per step ({m}): DualPipe splits them between its two directions and "
                               f"needs an even number, at least 2 * pp({p.pp}) = {2 * p.pp} (dualpipe/dualpipe.py: "
                               "assert num_chunks % 2 == 0 and num_chunks >= num_ranks * 2)")(
           s.job.global_batch // (p.dp * p.micro_batch)),
       field="schedule"),
    _r("dualpipev-micro-batches", "DualPipeV needs at least 2*pp micro-batches", ILLEGAL,
       ("schedule_code", "dp", "micro_batch", "pp"),
       lambda P, s: ((P.schedule_code == Schedule.DUALPIPE_V) & (P.pp > 1) & _batch_ok(P, s)
                     & (_micro_batches(P, s) < 2 * P.pp)),
       lambda p, s: (lambda m: f"micro-batches per step ({m}) < 2 * pp({p.pp}): ScheduleDualPipeV requires at "
                               "least as many micro-batches as its 2 * pp stages (torch.distributed.pipelining)")(
           s.job.global_batch // (p.dp * p.micro_batch)),
       field="schedule"),
    _r("v-schedule-layers", "ZBV, DualPipe and DualPipeV need two layers per pipeline rank", ILLEGAL,
       ("schedule_code", "pp"),
       lambda P, s: (np.isin(np.asarray(P.schedule_code), [int(Schedule.ZBV), int(Schedule.DUALPIPE),
                                                            int(Schedule.DUALPIPE_V)])
                     & (P.pp > 1) & (s.model.layers < 2 * P.pp)),
       lambda p, s: (f"{Schedule(p.schedule_code).label} places two model chunks on every rank: "
                     f"{s.model.layers} layers < 2 * pp({p.pp})"),
       field="schedule"),
    _r("v-schedule-stage-layers", "first/last stage layers not modelled with two chunks per rank", ILLEGAL,
       ("schedule_code", "first_stage_layers", "last_stage_layers"),
       lambda P, s: (((P.first_stage_layers > 0) | (P.last_stage_layers > 0))
                     & np.isin(np.asarray(P.schedule_code), [int(Schedule.ZBV), int(Schedule.DUALPIPE),
                                                             int(Schedule.DUALPIPE_V)])),
       lambda p, s: (f"first_stage_layers / last_stage_layers with {Schedule(p.schedule_code).label}: its ranks hold "
                     "two chunks each (the first rank both the first and the last); uneven stages are not modelled"),
       field="first_stage_layers", accepted="0 (automatic)", uses_scene=False),
    _r("seq-splits-over-cp", "seq_len not divisible by cp", ILLEGAL, ("cp",),
       lambda P, s: s.job.seq_len % P.cp != 0, _seq_shard_message),
    _r("ring-balanced-chunks", "ring attention needs seq_len divisible by 2*cp", ILLEGAL, ("cp", "cp_mode_code"),
       lambda P, s: (P.cp > 1) & (P.cp_mode_code == CpMode.RING) & (s.job.seq_len % (2 * P.cp) != 0),
       lambda p, s: f"seq_len({s.job.seq_len}) % (2 * cp({p.cp})) must be 0 (load-balanced causal chunks)"),
    _r("bf16-supported", "no bf16 support on this accelerator", ILLEGAL, ("dtype",),
       lambda P, s: (P.dtype == Dtype.BF16.label) and Dtype.BF16.label not in s.cluster.accelerator.peak_flops,
       lambda p, s: f"{s.cluster.accelerator.name} has no bf16 support; use --dtype fp16"),
    _r("fp8-supported", "no fp8 tensor cores on this accelerator", ILLEGAL, ("dtype",),
       lambda P, s: is_fp8(P.dtype) and "fp8" not in s.cluster.accelerator.peak_flops,
       lambda p, s: (f"{s.cluster.accelerator.name} has no fp8 tensor cores (fp8 needs Hopper, Ada, Blackwell "
                     "or MI300); use --dtype bf16"), field="dtype", accepted="bf16, fp16"),
    _r("mxfp8-needs-microscaling", "mxfp8 needs microscaling tensor cores (Blackwell)", ILLEGAL, ("dtype",),
       lambda P, s: (P.dtype == Dtype.MXFP8.label) and not s.cluster.accelerator.microscaling,
       lambda p, s: (f"{s.cluster.accelerator.name} has no microscaling (MX) tensor cores; mxfp8 runs on "
                     "Blackwell (b200, gb200, gb300); use --dtype fp8 or fp8-blockwise"),
       field="dtype", accepted="fp8, fp8-delayed, fp8-rowwise, fp8-blockwise"),
    _r("fp4-supported", "no tensor cores for this fp4 format on this accelerator", ILLEGAL, ("dtype",),
       lambda P, s: is_fp4(P.dtype) and P.dtype not in s.cluster.accelerator.fp4_formats,
       lambda p, s: _fp4_refusal(p.dtype, s.cluster.accelerator),
       field="dtype", accepted=None),
    _r("ep-needs-moe", "expert parallelism needs a mixture-of-experts model", ILLEGAL, ("ep",),
       lambda P, s: (P.ep > 1) & (not _moe(s)),
       lambda p, s: f"ep({p.ep}) needs a mixture-of-experts model; {s.model.name} is dense"),
    _r("ep-divides-dp", "ep must divide dp (Megatron: ep·etp must divide tp·cp·dp)", ILLEGAL,
       ("ep", "dp", "tp", "cp", "etp", "engine_code"),
       lambda P, s: (P.dp > 0) & _moe(s) & np.where(
           expert_parallel_folded(P), (P.tp * P.cp * P.dp) % (P.ep * P.etp) != 0, P.dp % P.ep != 0),
       lambda p, s: (f"tp({p.tp}) * cp({p.cp}) * dp({p.dp}) = {p.tp * p.cp * p.dp} is not a multiple of ep({p.ep}) * "
                     f"etp({p.etp}) = {p.ep * p.etp} (Megatron-Core folds the expert layers onto the tp·cp·dp ranks)"
                     if expert_parallel_folded(p) else
                     f"dp({p.dp}) % ep({p.ep}) = {p.dp % p.ep}, must be 0 (expert parallelism is carved from "
                     "data parallelism; Megatron's MoE parallel folding, --engine megatron, also takes tp and cp)")),
    _r("ep-divides-experts", "ep does not divide the experts", ILLEGAL, ("ep",),
       lambda P, s: _moe(s) and (s.model.moe.experts % P.ep != 0), _experts_message),
    _r("cp-mode-needs-cp", "cp mode irrelevant without context parallelism", PRUNE, ("cp", "cp_mode_code"),
       lambda P, s: (P.cp == 1) & (P.cp_mode_code != CpMode.RING),
       lambda p, s: "without context parallelism (cp=1) the cp mode changes nothing; the search keeps ring",
       uses_scene=False),
    _r("ulysses-splits-heads", "Ulysses needs heads/tp divisible by cp", ILLEGAL, ("cp_mode_code", "tp", "cp"),
       lambda P, s: (P.cp_mode_code == CpMode.ULYSSES) & ((s.model.heads // P.tp) % P.cp != 0),
       lambda p, s: f"Ulysses splits heads: heads/tp ({s.model.heads // p.tp}) % cp({p.cp}) must be 0"),
    _r("offload-params-needs-zero3", "offload needs ZeRO>=1, parameter offload ZeRO-3", ILLEGAL,
       ("offload_params", "offload_code", "zero"),
       lambda P, s: P.offload_params & ((P.offload_code == Offload.NONE) | (P.zero != 3)),
       lambda p, s: "parameter offload (ZeRO-Infinity) needs --zero 3 and --offload cpu or nvme",
       field="offload_params", uses_scene=False),
    _r("offload-needs-zero", "offload needs ZeRO>=1, parameter offload ZeRO-3", ILLEGAL, ("offload_code", "zero"),
       lambda P, s: (P.offload_code != Offload.NONE) & (P.zero == 0),
       lambda p, s: "optimizer offload needs a ZeRO stage >= 1 (ZeRO-Offload builds on ZeRO-2)",
       field="offload", accepted="--zero 1, 2 or 3 with --offload cpu|nvme", uses_scene=False),
    _r("compression-needs-zero0", "compressed optimizers need ZeRO-0", ILLEGAL, ("optimizer_code", "zero"),
       lambda P, s: (P.optimizer_code != Optimizer.ADAM) & (P.zero != 0),
       lambda p, s: (f"{Optimizer(p.optimizer_code).label} compresses the plain data-parallel all-reduce and "
                     "does not combine with ZeRO (DeepSpeed)"),
       field="optimizer", accepted="--zero 0", uses_scene=False),
    _r("delayed-update-needs-cpu-offload", "delayed update needs CPU offload", ILLEGAL,
       ("delayed_update", "offload_code"), lambda P, s: P.delayed_update & (P.offload_code != Offload.CPU),
       lambda p, s: "the one-step delayed parameter update (ZeRO-Offload DPU) needs --offload cpu",
       field="delayed_update", uses_scene=False),
    _r("sp-needs-tp", "sequence parallelism needs tp>1", ILLEGAL, ("sp", "tp"),
       lambda P, s: P.sp & (P.tp == 1), lambda p, s: "Megatron sequence parallelism needs tp > 1",
       field="sp", uses_scene=False),
    _r("seq-splits-over-cp-tp", "seq_len not divisible by cp*tp under sequence parallelism", ILLEGAL,
       ("sp", "cp", "tp"),
       lambda P, s: P.sp & (s.job.seq_len % P.cp == 0) & (s.job.seq_len % (P.cp * P.tp) != 0),
       _seq_shard_message),
    _r("etp-equal-tp-needs-tp", "expert tensor parallelism needs tp>1", PRUNE, ("etp_is_tp", "tp"),
       lambda P, s: P.etp_is_tp & (P.tp == 1),
       lambda p, s: "with tp=1, expert TP equal to TP is expert TP 1; the search keeps that", uses_scene=False),
    _r("etp-divides-tp", "etp must divide tp", ILLEGAL, ("tp", "etp"),
       lambda P, s: P.tp % P.etp != 0,
       lambda p, s: f"expert tensor parallelism etp({p.etp}) must divide tp({p.tp})", field="etp",
       uses_scene=False),
    # --- what each engine runs (Engine) ---------------------------------------------------------
    _engine_rule("engine-zero-stages"),
    _engine_rule("engine-offload"),
    _engine_rule("deepspeed-pipeline-zero"),
    _engine_rule("torchtitan-ddp-pure-dp"),
    _engine_rule("deepspeed-pipeline-schedule"),
    _engine_rule("megatron-pipeline-schedule"),
    _engine_rule("torchtitan-pipeline-schedule"),
    _engine_rule("scaling-pipeline-schedule"),
    _engine_rule("scaling-no-cp"),
    _engine_rule("torchtitan-tp-shards-sequence"),
    _engine_rule("engine-cp-mode"),
    _r("attention-kernel-needs-flash", "a fused attention kernel needs fused (flash) attention", ILLEGAL,
       ("attention_kernel_code", "flash_attention"),
       lambda P, s: (P.attention_kernel_code != AttentionKernel.AUTO) & ~np.asarray(P.flash_attention, bool),
       lambda p, s: (f"--attention-kernel {AttentionKernel(p.attention_kernel_code).label} names a fused kernel, "
                     "but --no-flash-attention materialises the scores: drop one of them"),
       field="attention_kernel", accepted="auto (with --no-flash-attention)", uses_scene=False),
    _r("eager-softmax-needs-unfused-attention", "an eager softmax runs only over materialised scores", ILLEGAL,
       ("fused_softmax", "flash_attention"),
       lambda P, s: ~np.asarray(P.fused_softmax, bool) & np.asarray(P.flash_attention, bool),
       lambda p, s: ("--no-fused-softmax prices an eager softmax over the materialised score matrix, but flash "
                     "attention never materialises it: add --no-flash-attention, or drop --no-fused-softmax"),
       field="fused_softmax", accepted="true; false only with --no-flash-attention", uses_scene=False),
    _engine_rule("engine-optimizer"),
    _r("tp-comm-overlap-needs-sp", "TP communication overlap needs tp > 1 with sequence parallelism",
       ILLEGAL, ("tp_comm_overlap", "tp", "sp"),
       lambda P, s: np.asarray(P.tp_comm_overlap, bool) & ((P.tp == 1) | ~np.asarray(P.sp, bool)),
       lambda p, s: (f"--tp-comm-overlap overlaps the all-gather / reduce-scatter of sequence parallelism with "
                     f"the GEMMs; it needs tp > 1 and --sp (tp({p.tp}), sp {bool(p.sp)})"),
       field="tp_comm_overlap", accepted="--tp N>1 --sp, or no --tp-comm-overlap", uses_scene=False),
    _r("tp-comm-overlap-within-nvlink", "TP communication overlap needs the TP group inside one NVLink domain",
       ILLEGAL, ("tp_comm_overlap", "tp"),
       lambda P, s: np.asarray(P.tp_comm_overlap, bool) & (P.tp > s.cluster.gpus_per_node),
       lambda p, s: (f"--tp-comm-overlap runs its GEMM-overlapped collectives over NVLink peer memory "
                     f"(Transformer Engine userbuffers, torch symmetric memory): the tensor-parallel GPUs must "
                     f"share one NVLink domain of {s.cluster.gpus_per_node} GPUs, but tp is {p.tp} "
                     "(TransformerEngine examples/pytorch/comm_gemm_overlap/README.md, Requirements); use "
                     f"--tp {s.cluster.gpus_per_node} or less, or no --tp-comm-overlap")),
    _engine_rule("activation-offload-engine"),
    _r("activation-offload-no-pp", "activation offload has no pipeline support", ILLEGAL,
       ("pp", "offload_activation_layers"),
       lambda P, s: (np.asarray(P.offload_activation_layers) > 0) & (P.pp > 1),
       lambda p, s: (f"Megatron-LM's activation offload does not run with pipeline parallelism (pp={p.pp}): "
                     "megatron/core/transformer/transformer_config.py"),
       field="offload_activation_layers", accepted="0 with pp > 1", uses_scene=False),
    _r("activation-offload-no-recompute", "activation offload excludes recomputation", ILLEGAL,
       ("recompute_code", "offload_activation_layers"),
       lambda P, s: (np.asarray(P.offload_activation_layers) > 0) & (np.asarray(P.recompute_code) != int(Recompute.NONE)),
       lambda p, s: ("Megatron-LM's activation offload does not work with activation recomputation "
                     f"(--recompute {Recompute(p.recompute_code).label})"),
       field="offload_activation_layers", accepted="--recompute none, or 0", uses_scene=False),
    _r("activation-offload-layers", "activation offload needs fewer layers than the model has", ILLEGAL,
       ("offload_activation_layers",),
       lambda P, s: np.asarray(P.offload_activation_layers) >= s.model.layers,
       lambda p, s: (f"offload_activation_layers({p.offload_activation_layers}) must be below the model's "
                     f"layers({s.model.layers})"), field="offload_activation_layers"),
    _engine_rule("grad-reduce-bf16-megatron"),
    _engine_rule("fp8-param-gather-megatron-fp8"),
    _r("fp8-param-gather-sharded", "fp8 parameters need the distributed optimizer or Megatron-FSDP", ILLEGAL,
       ("fp8_param_gather", "zero"),
       lambda P, s: np.asarray(P.fp8_param_gather, bool) & (np.asarray(P.zero) == 0),
       lambda p, s: ("Megatron-LM's --fp8-param-gather runs only with the distributed optimizer (ZeRO-1) or "
                     "Megatron-FSDP (ZeRO-2/3): its fp8 weights are refreshed by the parameter all-gather "
                     "(megatron/training/arguments.py validate_args)"),
       field="fp8_param_gather", accepted="--zero 1, 2 or 3, or no --fp8-param-gather", uses_scene=False),
    _engine_rule("te-cross-entropy-megatron"),
    _engine_rule("precision-aware-optimizer-megatron"),
    _r("precision-aware-optimizer-distributed", "the precision-aware optimizer needs the distributed optimizer",
       ILLEGAL, ("precision_aware_optimizer", "zero"),
       lambda P, s: np.asarray(P.precision_aware_optimizer, bool) & (np.asarray(P.zero) != 1),
       lambda p, s: ("Megatron-Core's precision-aware optimizer runs only with the distributed optimizer "
                     "('--use-precision-aware-optimizer only supported with distributed optimizer', "
                     "megatron/core/optimizer/optimizer_config.py); this plan runs ZeRO-0" if p.zero == 0 else
                     f"ZeRO-{p.zero} runs as Megatron-FSDP, under which Megatron-Bridge turns the precision-aware "
                     "optimizer off ('cannot work with FSDP together': scripts/performance/utils/overrides.py); "
                     "paraplan prices it with the distributed optimizer (ZeRO-1) only"),
       field="precision_aware_optimizer", accepted="--zero 1, or no --precision-aware-optimizer", uses_scene=False),
    _r("optimizer-state-dtype-precision-aware", "low-precision optimizer moments need the precision-aware optimizer",
       ILLEGAL, ("optimizer_state_dtype_code", "precision_aware_optimizer"),
       lambda P, s: ((np.asarray(P.optimizer_state_dtype_code) != int(OptimizerStateDtype.FP32))
                     & ~np.asarray(P.precision_aware_optimizer, bool)),
       lambda p, s: (f"--optimizer-state-dtype {OptimizerStateDtype(p.optimizer_state_dtype_code).label} needs "
                     "--precision-aware-optimizer "
                     "(Megatron-Core: 'exp_avg_dtype can only be fp32 when not using precision-aware optimizer')"),
       field="optimizer_state_dtype", accepted="fp32, or --precision-aware-optimizer", uses_scene=False),
    _engine_rule("engine-tp-comm-overlap"),
    _r("ep-comm-overlap-needs-ep", "expert-parallel communication overlap needs expert parallelism", ILLEGAL,
       ("ep_comm_overlap", "ep"),
       lambda P, s: np.asarray(P.ep_comm_overlap, bool) & (P.ep == 1),
       lambda p, s: ("--ep-comm-overlap hides the expert-parallel all-to-alls; with ep(1) there are none "
                     "(Megatron-Core: 'only supported with expert model parallelism')"),
       field="ep_comm_overlap", accepted="--ep N>1, or no --ep-comm-overlap", uses_scene=False),
    _r("ep-comm-overlap-schedule", "expert-parallel communication overlap needs pp 1, the interleaved schedule "
       "or DualPipe(V)", ILLEGAL, ("ep_comm_overlap", "pp", "schedule_code"),
       lambda P, s: (np.asarray(P.ep_comm_overlap, bool) & (P.pp > 1)
                     & ~np.isin(np.asarray(P.schedule_code), [int(Schedule.INTERLEAVED), int(Schedule.DUALPIPE),
                                                              int(Schedule.DUALPIPE_V)])),
       lambda p, s: (f"the expert all-to-all hides behind another micro-batch's pass only where a schedule pairs a "
                     f"forward with a backward: Megatron-Core's combined 1F1B without pipelining or interleaved "
                     f"(megatron/core/transformer/transformer_config.py), DualPipe and DualPipeV; pp({p.pp}) runs "
                     f"{Schedule(p.schedule_code).label}"),
       field="ep_comm_overlap", accepted="--pp 1, --schedule interleaved --vpp N>1, --schedule dualpipe or dualpipev",
       uses_scene=False),
    _r("ep-comm-overlap-no-full-recompute", "expert-parallel communication overlap excludes full recomputation",
       ILLEGAL, ("ep_comm_overlap", "recompute_code"),
       lambda P, s: np.asarray(P.ep_comm_overlap, bool) & (np.asarray(P.recompute_code) == int(Recompute.FULL)),
       lambda p, s: ("Megatron-Core's combined 1F1B runs layer by layer across two micro-batches and refuses full "
                     "recomputation ('disable full recomputation when enabling overlap_moe_expert_parallel_comm')"),
       field="ep_comm_overlap", accepted="--recompute none, selective or op-sac", uses_scene=False),
    _engine_rule("engine-ep-comm-overlap"),
    _engine_rule("torchtitan-ep-overlap-dualpipev"),
    _r("ep-comm-overlap-hybrid", "expert-parallel communication overlap is not run for hybrid Mamba models",
       ILLEGAL, ("ep_comm_overlap",),
       lambda P, s: np.asarray(P.ep_comm_overlap, bool) & bool(getattr(s.model, "layer_pattern", "")),
       lambda p, s: (f"{s.model.name} is a hybrid model (layer_pattern): --ep-comm-overlap runs combined 1F1B through "
                     "GPTModel.build_schedule_plan, which Megatron-Core's MambaModel does not have "
                     "(megatron/core/models/mamba/mamba_model.py)"),
       field="ep_comm_overlap", accepted="no --ep-comm-overlap for a hybrid layer_pattern"),
    _r("ep-comm-overlap-dispatch", "expert-parallel communication overlap needs the all-to-all token dispatcher",
       ILLEGAL, ("ep_comm_overlap",),
       lambda P, s: np.asarray(P.ep_comm_overlap, bool) & (_moe(s) and s.model.moe.dispatch != "permute"),
       lambda p, s: (f"{s.model.name} dispatches tokens by {s.model.moe.dispatch}; Megatron-Core overlaps only the "
                     "alltoall / flex token dispatchers' all-to-alls"),
       field="ep_comm_overlap", accepted="a model with permute dispatch, or no --ep-comm-overlap"),
    _r("moe-flex-dispatch-needs-ep", "DeepEP / HybridEP dispatch needs expert parallelism", ILLEGAL,
       ("moe_flex_dispatch", "ep"),
       lambda P, s: np.asarray(P.moe_flex_dispatch, bool) & (P.ep == 1),
       lambda p, s: ("--moe-flex-dispatch runs the expert-parallel dispatch and combine on DeepEP / HybridEP "
                     "kernels; with ep(1) there are none"),
       field="moe_flex_dispatch", accepted="--ep N>1, or no --moe-flex-dispatch", uses_scene=False),
    _engine_rule("engine-moe-flex-dispatch"),
    _r("moe-flex-dispatch-needs-permute", "DeepEP / HybridEP dispatch needs token permutation",
       ILLEGAL, ("moe_flex_dispatch",),
       lambda P, s: np.asarray(P.moe_flex_dispatch, bool) & (not _moe(s) or s.model.moe.dispatch != "permute"),
       lambda p, s: (f"{s.model.name} " + (f"dispatches tokens by {s.model.moe.dispatch}" if _moe(s) else "has no experts")
                     + "; DeepEP / HybridEP replace the all-to-all of a permuting token dispatcher"),
       field="moe_flex_dispatch", accepted="an MoE model with permute dispatch, or no --moe-flex-dispatch"),
    _r("recompute-modules-need-selective", "recompute modules need selective recomputation", ILLEGAL,
       ("recompute_modules_mask", "recompute_code"),
       lambda P, s: (np.asarray(P.recompute_modules_mask) != 0) & (np.asarray(P.recompute_code) != int(Recompute.SELECTIVE)),
       lambda p, s: (f"--recompute-modules {recompute_modules_text(p.recompute_modules_mask)} picks what selective "
                     f"recomputation recomputes (Megatron-LM --recompute-granularity selective); --recompute is "
                     f"{Recompute(p.recompute_code).label}"),
       field="recompute_modules", accepted="--recompute selective, or no --recompute-modules", uses_scene=False),
    _engine_rule("engine-recompute-modules"),
    _r("recompute-module-not-in-model", "a recompute module the model does not have", ILLEGAL,
       ("recompute_modules_mask",),
       lambda P, s: (np.asarray(P.recompute_modules_mask) & _modules_the_model_lacks(s)) != 0,
       lambda p, s: (f"{s.model.name} has no "
                     f"{recompute_modules_text(p.recompute_modules_mask & _modules_the_model_lacks(s)).replace(',', ', ')} "
                     "to recompute (mla_up_proj: latent attention; moe_act, moe: MoE layers; shared_experts: shared "
                     "experts; mlp: dense MLP layers)"),
       field="recompute_modules",
       accepted=None),
    _engine_rule("engine-fp8-recipe"),
    _engine_rule("engine-recompute"),
)
RULES_BY_NAME = {r.name: r for r in RULES}


def failed_rules(P, scene: Scene | None, kinds=(ILLEGAL,), available=None) -> list[Rule]:
    """The rules of the given kinds that reject the first plan of ``P``; with ``available`` (attribute
    names) only the rules that read nothing else."""
    rows = _rows(P)
    return [r for r in RULES if r.kind in kinds and (available is None or r.axes <= set(available))
            and r.mask(P, scene, rows)[0]]


def check_plan(plan: Plan, model, job, cluster) -> Plan:
    """Check a plan against the model, the job and the cluster; return it with dp filled.

    Raises one ConfigError listing every violated rule (of :data:`RULES`) with its factors.
    """
    gpus = cluster.num_gpus
    scene = Scene(model, job, cluster, plan.dp or None)
    if plan.dp:
        filled = plan
    else:
        filled = replace(plan, dp=max(1, gpus // plan.model_parallel))
    view = PlanBatch.from_plans([filled])
    failed = failed_rules(view, scene)
    if failed:
        problems = [r.explain(view, scene) for r in failed]
        if not plan.dp and any("dp" in r.axes for r in failed):
            problems.append(f"dp({filled.dp}) is what gpus({gpus}) leave: gpus / (tp*pp*cp)")
        named = {r.field for r in failed}
        field = named.pop() if len(named) == 1 else "plan"
        raise ConfigError(field, "; ".join(problems))
    return filled
