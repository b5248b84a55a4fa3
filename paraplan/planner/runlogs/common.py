"""What every training-log reader returns, and the pieces they share: the measurement (median of the
steps after the warm-up), what the user supplies where a log is silent, and the published-run row.

A log reader is a pure function of the log's text: ``read(text, source, overrides) -> RunLog``. It reads
the engine configuration the log prints (through :mod:`paraplan.planner.readers`, the export readers)
and the measurements it prints per step, and raises :class:`~paraplan.errors.ConfigError` with one line
naming what is missing and the flag that supplies it.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from paraplan.calibration import FILE_COLUMNS
from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.planner.readers import ReadConfig
from paraplan.workloads.transformer import TransformerModel

#: the flag that supplies each thing a log may not say (the CLI's; ``Overrides`` fields in the API)
FLAG = {"gpu": "--gpu NAME (as papers name it: H100-SXM, A100-80GB, a system preset, or profile:NAME)",
        "gpus": "--gpus N", "model": "--model PRESET|FILE", "tp": "--tp N", "pp": "--pp N",
        "global_batch": "--global-batch N", "seq_len": "--seq-len N", "micro_batch": "--micro-batch N"}
#: the layout fields a user may supply for a log that prints no configuration of its own (MLPerf)
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "zero", "dtype", "recompute", "schedule", "sp",
                 "tp_comm_overlap")


@dataclass(frozen=True)
class Overrides:
    """What the user states that the log does not: the GPU (a name as papers write it, a system preset
    or ``profile:NAME``), the GPU count, the model (a preset or a model file), the layout fields of
    :data:`LAYOUT_FIELDS`, the global batch and sequence length, and how many logged measurements are
    warm-up (None: the reader's default). A field the log states too must agree with it."""
    gpu: str | None = None
    gpus: int | None = None
    model: str | None = None
    layout: Mapping[str, int] = field(default_factory=dict)
    global_batch: int | None = None
    seq_len: int | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class Measured:
    """A run's measurement: the median over the steps kept (``steps``; the warm-up ``skipped``) of the
    step time (s), tokens per second per GPU, model TFLOP/s per GPU and MFU (%) as the log printed them
    (None where it printed none), and the peak memory per GPU (GiB: the largest the log reports)."""
    step_time_s: float
    steps: tuple[int, ...]
    skipped: tuple[int, ...]
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu_pct: float | None = None
    peak_memory_gib: float | None = None
    memory_kind: str = ""


@dataclass(frozen=True)
class RunLog:
    """One training log read: its ``kind`` (megatron, torchtitan, deepspeed, mlperf), where it came
    from, the engine configuration as the export reader read it (``config``) and the plan it runs (dp
    filled from the GPU count), the model, the job figures, the GPU and its count, the measurement, the
    published-run ``row`` (:data:`paraplan.calibration.FILE_COLUMNS`; what its columns cannot say is in
    its notes) and the reader's ``notes`` (each assumption or what the log holds that a plan cannot)."""
    kind: str
    source: str
    engine: str
    config: ReadConfig | None
    plan: Plan
    model: TransformerModel
    seq_len: int
    global_batch: int
    gpu: str
    gpus: int
    measured: Measured
    row: Mapping[str, Any]
    notes: tuple[str, ...] = ()

    @property
    def skipped(self) -> tuple[int, ...]:
        """The warm-up steps (or blocks) left out of the median."""
        return self.measured.skipped


def missing(kind: str, what: str, flag_key: str, why: str = "") -> ConfigError:
    """The one-line error for something a log does not say, naming the flag that supplies it."""
    return ConfigError(f"{kind} log", f"does not state the {what}{': ' + why if why else ''}; give {FLAG[flag_key]}")


def number(text: str) -> float:
    """A number as logs print it: '30,768', '1.065542E+01', '0.36%'."""
    return float(text.replace(",", "").rstrip("%"))


def steady(kind: str, points: Sequence[tuple[int, float]], warmup: int, what: str) -> tuple[float, tuple, tuple]:
    """(median value, steps kept, steps skipped) of ``points`` (step, value) in log order, the first
    ``warmup`` left out (the first steps carry compilation, allocator growth and NCCL set-up). Raises
    ConfigError for a log with no measurement after the warm-up (a truncated log)."""
    if len(points) <= warmup:
        raise ConfigError(f"{kind} log", f"{len(points)} {what} line{'s' * (len(points) != 1)}, all within the "
                          f"warm-up of {warmup} (a truncated log?); give --warmup N with N < {max(len(points), 1)}"
                          if points else f"no {what} lines (a truncated log, or not this kind of log)")
    kept = points[warmup:]
    return (statistics.median(v for _, v in kept), tuple(s for s, _ in kept), tuple(s for s, _ in points[:warmup]))


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values given (None where none was)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def agree(kind: str, name: str, logged, given, key: str | None = None) -> Any:
    """The value the log states, unless the user gave another: then ConfigError naming both, and the flag
    that gave it (``--`` + ``key``, the field, dashed; ``key`` defaults to ``name``)."""
    if given is None:
        return logged
    if logged is not None and logged != given:
        flag = "--" + (key or name).replace("_", "-")
        raise ConfigError(f"{kind} log", f"states {name} {logged}, but {flag} {given} was given")
    return given


def cp_cell(plan: Plan) -> str:
    """The cp_or_sp cell of a plan ('cp2 (ulysses); sp', 'sp', '')."""
    parts = [f"cp{plan.cp}" + (f" ({plan.cp_mode})" if plan.cp_mode != "ring" else "")] if plan.cp > 1 else []
    if plan.sp:
        parts.append("sp")
    return "; ".join(parts)


def published_row(kind: str, source: str, model: TransformerModel, plan: Plan, gpu: str, gpus: int, seq_len: int,
                  global_batch: int, measured: Measured) -> dict[str, Any]:
    """The published-run row of a log (the columns :data:`FILE_COLUMNS`): the measured step time in
    seconds, and in the notes what else the log measured and the plan fields the columns cannot hold."""
    m = measured
    extra = [f"median of {len(m.steps)} logged steps {m.steps[0]}-{m.steps[-1]}"
             + (f", warm-up {', '.join(map(str, m.skipped))} skipped" if m.skipped else "")]
    for label, v, fmt in (("tokens/s/GPU", m.tokens_per_s_per_gpu, ",.0f"), ("TFLOP/s/GPU", m.tflops_per_gpu, ".1f"),
                          ("MFU %", m.mfu_pct, ".2f"), (f"peak memory GiB ({m.memory_kind})", m.peak_memory_gib, ".2f")):
        if v is not None:
            extra.append(f"{label} {v:{fmt}}")
    extra.append(f"read from a {kind} log by paraplan; plan: {plan_summary(plan)}")
    row = {c: None for c in FILE_COLUMNS}
    row.update(source=source, model=model.name, params_b=round(model.num_params / 1e9, 2), layers=model.layers,
               hidden=model.hidden, heads=model.heads, ffn_hidden=model.ffn_hidden, vocab=model.vocab, seq_len=seq_len,
               moe_experts=model.moe.experts if model.moe else None, moe_topk=model.moe.top_k if model.moe else None,
               gpu=gpu, num_gpus=gpus, tp=plan.tp, pp=plan.pp, dp=plan.dp, cp_or_sp=cp_cell(plan), ep=plan.ep,
               vpp=plan.vpp, zero_stage=plan.zero, offload=plan.offload if plan.offload != "none" else None,
               recompute=plan.recompute, micro_batch=plan.micro_batch, global_batch=global_batch,
               precision=plan.dtype, measured_metric="step_time", measured_value=round(m.step_time_s, 6),
               measured_unit="s", notes="; ".join(extra))
    return row


def plan_summary(plan: Plan) -> str:
    """The plan's fields that differ from Plan's defaults, as 'field=value' words."""
    defaults = Plan()
    return " ".join(f"{k}={getattr(plan, k)}" for k in plan.__dataclass_fields__
                    if getattr(plan, k) != getattr(defaults, k))


def last_block(text: str, start: str | re.Pattern, end: str | re.Pattern) -> str | None:
    """The text between the last ``start`` and the ``end`` after it (None when there is none)."""
    starts = [m for m in re.finditer(start, text)]
    if not starts:
        return None
    rest = text[starts[-1].end():]
    e = re.search(end, rest)
    return rest[:e.start()] if e else None
