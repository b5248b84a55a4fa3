"""A log's parts put together: the model (the log's shape, or the user's preset / file checked against
it), the cluster, the plan checked against both, and the published-run row."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from paraplan.calibration import CalibrationCase
from paraplan.calibration.cases import lightest_fitting_settings
from paraplan.errors import ConfigError
from paraplan.plan import Plan, check_plan
from paraplan.planner.readers import ReadConfig
from paraplan.planner.runlogs.common import (LAYOUT_FIELDS, Measured, Overrides, RunLog, agree, missing,
                                             published_row)
from paraplan.scenario import load_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel

#: the shape fields a log may state, compared with a model the user names
SHAPE = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


def model_of(kind: str, logged: TransformerModel | None, logged_shape: Mapping[str, int], overrides: Overrides,
             why_needed: str) -> tuple[TransformerModel, list[str]]:
    """The run's model: the user's (``--model``) checked against every shape field the log states
    (a difference is an error naming the fields), else the one the log describes whole (``logged``),
    else ConfigError naming what is missing and ``--model``."""
    notes: list[str] = []
    if overrides.model:
        model = load_model(overrides.model)
        have = {"layers": model.layers, "hidden": model.hidden, "heads": model.heads,
                "kv_heads": model.kv_heads or model.heads, "ffn_hidden": model.ffn_hidden, "vocab": model.vocab}
        differ = [f"{k} {v} (the model: {have[k]})" for k, v in logged_shape.items()
                  if k in have and v is not None and have[k] is not None and v != have[k]]
        # a vocabulary padded by the engine (Megatron: to a multiple of 128 x tp) is the same model
        differ = [d for d in differ if not (d.startswith("vocab ") and 0 < logged_shape["vocab"] - model.vocab < 128 * 8)]
        if differ:
            raise ConfigError(f"{kind} log", f"states {', '.join(differ)}, which --model {overrides.model} does not "
                              "have; give the model the run trained (or leave --model out where the log states it)")
        if logged_shape:
            notes.append(f"model {model.name} (--model), whose shape the log's agrees with")
        return model, notes
    if logged is None:
        raise missing(kind, "model's architecture", "model", why_needed)
    return logged, notes


def layout_overrides(kind: str, fields: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    """The plan fields with the user's layout (``--tp`` ...) applied; one the log states too must agree."""
    out = dict(fields)
    for k, v in overrides.layout.items():
        if k not in LAYOUT_FIELDS:
            raise ConfigError(f"{kind} log", f"layout field {k!r} cannot be given", accepted=", ".join(LAYOUT_FIELDS))
        out[k] = agree(kind, k, fields.get(k), v)
    return out


def finish(kind: str, source: str, config: ReadConfig | None, plan: Plan | None, model: TransformerModel,
           seq_len: int | None, global_batch: int | None, gpu: str | None, gpus: int | None, measured: Measured,
           overrides: Overrides, notes: list[str]) -> RunLog:
    """The RunLog of the parts a reader found, with the user's overrides checked against them: the
    cluster loaded (``gpu`` by name, preset or profile), the plan checked against model, job and
    cluster (dp from the GPU count), the published-run row."""
    seq_len = agree(kind, "sequence length", seq_len, overrides.seq_len, "seq_len")
    global_batch = agree(kind, "global batch", global_batch, overrides.global_batch, "global_batch")
    gpus = agree(kind, "GPU count", gpus, overrides.gpus, "gpus")
    gpu = overrides.gpu or gpu
    for value, what, key in ((gpu, "GPU type", "gpu"), (gpus, "GPU count", "gpus"), (seq_len, "sequence length", "seq_len"),
                             (global_batch, "global batch", "global_batch")):
        if value is None:
            raise missing(kind, what, key)
    if plan is None:
        raise ConfigError(f"{kind} log", "its configuration makes no plan: "
                          + ("; ".join(u for u in config.unexpressed if u.startswith("no plan")) if config else "?"))
    try:
        cluster = load_cluster(gpu, gpus)
    except ConfigError as e:
        given = "--gpu" if overrides.gpu else "its GPU"
        raise ConfigError(f"{kind} log", f"{given} {gpu!r}: {e.problem}",
                          accepted=e.accepted or "a GPU as papers name it (H100-SXM, A100-80GB), a system preset "
                          "(`paraplan list systems`) or profile:NAME") from None
    try:
        job = TrainingJob(seq_len=seq_len, global_batch=global_batch)
        plan = check_plan(replace(plan, dp=0) if plan.dp == 1 and gpus > plan.model_parallel else plan, model, job,
                          cluster)
    except ConfigError as e:
        raise ConfigError(f"{kind} log", f"{e.field}: {e.problem}") from None
    if config is None:
        # a log that prints no configuration (an MLPerf result log) states none of the memory settings the
        # user did not give: the run fitted, so the lightest the engine offers that fits, said
        stated = set(overrides.layout) - {"dtype"}
        plan = lightest_fitting_settings(model, job, cluster, plan, stated, notes)
    row = published_row(kind, source, model, plan, gpu, gpus, seq_len, global_batch, measured)
    engine = plan.engine
    return RunLog(kind, source, engine, config, plan, model, seq_len, global_batch, gpu, gpus, measured, row,
                  tuple(notes) + (config.unexpressed if config else ()))


def case_of(log: RunLog, row: int = 0) -> CalibrationCase:
    """A read log as the calibration case ``paraplan score`` estimates: its own model, plan and cluster
    (every switch the log's configuration states, which a published-run row cannot hold), and the
    measured step time."""
    cluster = load_cluster(log.gpu, log.gpus)
    label = f"{log.model.name} {log.gpu} x{log.gpus} tp{log.plan.tp} pp{log.plan.pp} dp{log.plan.dp} {log.plan.dtype}"
    return CalibrationCase(row, log.source, label, log.model, TrainingJob(seq_len=log.seq_len, global_batch=log.global_batch),
                           cluster, log.plan, log.measured.step_time_s, log.notes)
