"""The categorical choices of a plan as :class:`Mode` enums: a user-facing label (the string a
``Plan`` holds and JSON shows) and an integer code (its position) that the cost formulas read over
numpy arrays. The bottom of the plan layers: ``paraplan.engines`` (what each engine offers of these)
and ``paraplan.plan`` (the plan, its rules) build on it; ``paraplan.plan`` re-exports every name.
"""
from __future__ import annotations

from enum import IntEnum

from paraplan.errors import ConfigError, shown

#: the Plan field each Mode subclass is the type of (:func:`plan_field`; Mode.parse names it in errors)
MODE_FIELDS: dict = {}


def plan_field(name: str):
    """Class decorator: register a Mode subclass as the type of the Plan field ``name``."""
    def register(cls):
        MODE_FIELDS[cls] = name
        return cls
    return register


# label -> member, per Mode subclass (Mode.parse)
_MODE_LABELS: dict = {}


class Mode(IntEnum):
    """A categorical plan choice: its integer code (declaration order) and its user-facing label."""

    def __new__(cls, label: str):
        code = len(cls.__members__)
        obj = int.__new__(cls, code)
        obj._value_ = code
        obj.label = label
        return obj

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        """The labels in code order (what ``--schedule`` and friends accept)."""
        return tuple(m.label for m in cls)

    @classmethod
    def parse(cls, value, field: str | None = None) -> "Mode":
        """The member for a label (or a member); ConfigError naming the field and the labels otherwise."""
        if isinstance(value, cls):
            return value
        by_label = _MODE_LABELS.get(cls)
        if by_label is None:                     # built once per mode: iterating an Enum is slow
            by_label = _MODE_LABELS[cls] = {m.label: m for m in cls}
        if isinstance(value, str) and value in by_label:
            return by_label[value]
        raise ConfigError(field or MODE_FIELDS[cls], f"unknown value {shown(value)}", accepted=", ".join(cls.labels()))


@plan_field("schedule")
class Schedule(Mode):
    """Pipeline schedule."""
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    GPIPE = "gpipe"
    ZB_H1 = "zb-h1"
    ZBV = "zbv"
    DUALPIPE = "dualpipe"
    DUALPIPE_V = "dualpipev"


@plan_field("recompute")
class Recompute(Mode):
    """Activation recomputation, as a saved-tensor policy: none keeps everything; selective
    (Megatron-LM) recomputes the attention core; full keeps only each layer's input; op-sac
    (torchtitan's op-level selective activation checkpointing) keeps every other matmul output and
    the attention output and recomputes the rest."""
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP_SAC = "op-sac"


@plan_field("offload")
class Offload(Mode):
    """Where optimizer states (and with ``offload_params`` the parameters) live."""
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


@plan_field("dtype")
class Dtype(Mode):
    """Training precision; fp32 is plain fp32 training (the CPU validation runs).

    The fp8 members are bf16 mixed precision whose linear-layer GEMMs (QKV, output projection, MLP,
    experts) run in fp8, each with its scaling recipe; attention, embeddings, the LM head, norms and
    the optimizer stay in bf16/fp32 (Transformer Engine and torchao float8 keep them there):
      fp8            per-tensor current scaling: an amax pass, then the cast (TE Float8CurrentScaling,
                     Megatron ``--fp8-recipe tensorwise``, torchtitan float8 default "tensorwise")
      fp8-delayed    per-tensor delayed scaling from an amax history (TE DelayedScaling, Megatron's
                     ``--fp8-recipe delayed``): scale known before the cast, amax taken in the same pass
      fp8-rowwise    one scale per row (torchtitan/torchao ``recipe_name = "rowwise"``)
      fp8-blockwise  1x128 activation / 128x128 weight blocks (DeepSeek-V3; TE Float8BlockScaling,
                     Megatron ``--fp8-recipe blockwise``)
      mxfp8          OCP microscaling, 32-element blocks with e8m0 scales, in the tensor cores of
                     Blackwell (Megatron ``--fp8-recipe mxfp8``, TE MXFP8BlockScaling)

    The fp4 members run the same linear-layer GEMMs (fprop, dgrad and wgrad) in 4-bit E2M1 with
    block scales, on parts whose tensor cores take the format (``Accelerator.fp4_formats``), and keep
    the same layers as fp8 outside it; they reuse the fp8 machinery (casts, cached weight copies,
    saved quantized inputs) with their own byte counts (:data:`QUANTIZED_BYTES`):
      nvfp4          NVIDIA's NVFP4: 16-element blocks with an fp8 E4M3 scale, plus one fp32 scale per
                     tensor; weights in 16x16 blocks, a 16-point random Hadamard transform on the wgrad
                     GEMM's inputs, stochastic rounding of gradients (TE NVFP4BlockScaling; Megatron
                     ``--fp4-format e2m1 --fp4-recipe nvfp4``); Blackwell (sm100+). The recipe keeps a
                     share of the linear layers in bf16 (NVFP4_BF16_LINEAR_SHARE)
      mxfp4          OCP MXFP4: 32-element blocks with e8m0 scales (AMD CDNA 4's MXFP4, Blackwell's)"""
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"
    FP8_DELAYED = "fp8-delayed"
    FP8_ROWWISE = "fp8-rowwise"
    FP8_BLOCKWISE = "fp8-blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"


#: the 4-bit recipes (their linear-layer GEMMs run at the part's fp4 peak)
FP4_DTYPES = frozenset({Dtype.NVFP4.label, Dtype.MXFP4.label})
#: every dtype whose linear layers run quantized with a scaling recipe (the fp8 recipes and the fp4 ones,
#: which reuse the fp8 machinery: casts, cached weight copies, saved quantized inputs, engine recipes)
FP8_DTYPES = frozenset({Dtype.FP8.label, Dtype.FP8_DELAYED.label, Dtype.FP8_ROWWISE.label,
                        Dtype.FP8_BLOCKWISE.label, Dtype.MXFP8.label}) | FP4_DTYPES

#: bytes per element of a quantized tensor, its block scales included: fp8 1 (per-tensor / per-row
#: scales are negligible); NVFP4 0.5 + 1/16 (an E4M3 scale per 16 elements; the fp32 per-tensor scale
#: is negligible), MXFP4 0.5 + 1/32 (an E8M0 scale per 32 elements). Sources: Transformer Engine
#: docs, features/low_precision_training/nvfp4 ("x = x_e2m1 * s_block * s_global", s_block FP8 E4M3
#: per 16 consecutive elements, s_global FP32 per tensor); OCP Microscaling Formats (MX) v1.0 (MXFP4:
#: k = 32, E8M0 scale)
QUANTIZED_BYTES = {Dtype.NVFP4.label: 0.5 + 1 / 16, Dtype.MXFP4.label: 0.5 + 1 / 32}


def is_fp8(dtype: str) -> bool:
    """Whether the training dtype runs its linear-layer GEMMs quantized with a scaling recipe: any fp8
    recipe, or an fp4 one (:data:`FP4_DTYPES`, which reuses the fp8 machinery)."""
    return dtype in FP8_DTYPES


def is_fp4(dtype: str) -> bool:
    """Whether the training dtype runs its linear-layer GEMMs in a 4-bit format (nvfp4, mxfp4)."""
    return dtype in FP4_DTYPES


def quantized_bytes(dtype: str) -> float:
    """Bytes per element of the recipe's quantized tensors (:data:`QUANTIZED_BYTES`; 1 for fp8)."""
    return QUANTIZED_BYTES.get(dtype, 1.0)


def gemm_dtype(dtype: str) -> str:
    """The number format of the linear-layer GEMMs: ``fp8`` for every fp8 recipe, ``fp4`` for the
    4-bit ones, else the dtype."""
    if dtype in FP4_DTYPES:
        return "fp4"
    return "fp8" if dtype in FP8_DTYPES else dtype


def compute_dtype(dtype: str) -> str:
    """The number format of everything else (attention, embeddings, LM head, the MFU peak): the
    bf16 that fp8 recipes keep outside the linear layers, else the dtype itself."""
    return "bf16" if dtype in FP8_DTYPES else dtype


@plan_field("optimizer_state_dtype")
class OptimizerStateDtype(Mode):
    """The dtype Adam's two moments (exp_avg, exp_avg_sq) are stored in under Megatron-Core's
    precision-aware optimizer (--exp-avg-dtype / --exp-avg-sq-dtype: fp32, fp16, bf16, fp8; NVIDIA/Megatron-LM
    megatron/training/arguments.py _add_experimental_args). fp16 and fp8 moments carry one fp32 scale per
    tensor (Transformer Engine's FusedAdam), negligible beside the elements."""
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


#: bytes per element of an optimizer moment in each OptimizerStateDtype
OPTIMIZER_STATE_BYTES = {OptimizerStateDtype.FP32.label: 4, OptimizerStateDtype.BF16.label: 2,
                         OptimizerStateDtype.FP16.label: 2, OptimizerStateDtype.FP8.label: 1}


@plan_field("cp_mode")
class CpMode(Mode):
    """Context-parallel attention: ring (load-balanced causal chunks) or Ulysses (all-to-all over heads)."""
    RING = "ring"
    ULYSSES = "ulysses"


@plan_field("attention_kernel")
class AttentionKernel(Mode):
    """The fused attention kernel: ``auto`` leaves it to the engine and prices attention at the
    generation's one calibrated efficiency (published runs rarely say which kernel ran); the others
    name a kernel whose efficiency was measured by sequence length (where the generation has a
    measured table: cuDNN fused attention, FlashAttention-2, PyTorch's memory-efficient kernel).
    ``flash1`` is FlashAttention 1.x (the flash-attn package before 2.0): FlashAttention-2's work at
    half its rate (``attention.FLASH1_TIME_FACTOR``)."""
    AUTO = "auto"
    CUDNN = "cudnn"
    FLASH2 = "flash2"
    EFFICIENT = "efficient"
    FLASH1 = "flash1"


@plan_field("optimizer")
class Optimizer(Mode):
    """Adam, or a communication-compressing variant (DeepSpeed) that needs ZeRO-0."""
    ADAM = "adam"
    ONEBIT_ADAM = "onebit-adam"
    ZERO_ONE_ADAM = "zero-one-adam"
    ONEBIT_LAMB = "onebit-lamb"
