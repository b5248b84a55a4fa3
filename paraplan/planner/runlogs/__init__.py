"""Real training logs read into runs paraplan can score and calibrate on (issue 65).

    read_run_log(path_or_text, *, kind=None, overrides=Overrides()) -> RunLog

reads a log of one of :data:`KINDS` (detected from its content unless ``kind`` names it) into a
:class:`RunLog`: the configuration the log prints, read by the export readers
(:mod:`paraplan.planner.readers`) into the :class:`~paraplan.plan.Plan` it runs, the model, the job, the
GPU and its count, and the measurement: the median over the logged steps after the warm-up (which
steps were skipped is in ``RunLog.skipped``) of the step time, with tokens/s per GPU, TFLOP/s per GPU,
MFU and peak memory where the log prints them. ``RunLog.row`` is the run as a row of the published-run
schema (``paraplan score RUNS.csv`` reads it; :data:`paraplan.calibration.FILE_COLUMNS`), and
:func:`case_of` the calibration case ``paraplan score --log`` estimates (the log's own plan, with every
switch its configuration states). What a log does not say (its GPU, GPU count, model, layout) comes
from :class:`Overrides`; where it is missing the error names it and the flag that supplies it.

The readers are pure functions of the text: no engine is imported. Per kind (each module's docstring
says what it reads, from which engine source file):
  * megatron: Megatron-LM / NeMo / Megatron-Bridge / Megatron-DeepSpeed (the arguments block,
    ``elapsed time per iteration (ms)``, ``throughput per GPU (TFLOP/s/GPU)``, memory reports);
  * torchtitan: its printed job config, ``step: ... tps: ... tflops: ... mfu:`` lines;
  * deepspeed: ``DeepSpeedEngine configuration:`` and its json, ``CurrSamplesPerSec`` / ``samples/sec``;
  * mlperf: MLPerf Training result logs (``:::MLLOG {json}``: submission, batch, sequence, blocks).
"""
from __future__ import annotations

import csv
import gzip
import io
import os
from pathlib import Path

from paraplan.calibration import FILE_COLUMNS
from paraplan.errors import ConfigError, shown
from paraplan.io import path_problem
from paraplan.planner.runlogs import deepspeed, megatron, mlperf, torchtitan
from paraplan.planner.runlogs.build import case_of
from paraplan.planner.runlogs.common import LAYOUT_FIELDS, Measured, Overrides, RunLog

READERS = {"megatron": megatron.read, "torchtitan": torchtitan.read, "deepspeed": deepspeed.read,
           "mlperf": mlperf.read}
KINDS = tuple(READERS)
#: the largest log read (a training log past this is cut to its start and end by the user)
MAX_BYTES = 256 * 2**20

__all__ = ["KINDS", "LAYOUT_FIELDS", "Measured", "Overrides", "RunLog", "case_of", "detect_kind", "read_run_log",
           "read_log_text", "runs_csv"]


def detect_kind(text: str) -> str | None:
    """The kind of log ``text`` is, by the lines only that kind prints (None when none matches). A
    Megatron-DeepSpeed log prints both Megatron's arguments and DeepSpeed's config: it is read as
    megatron (its arguments hold the layout)."""
    if mlperf.MLLOG.search(text) or ":::MLLOG" in text:
        return "mlperf"
    if torchtitan.CONFIG.search(text) or torchtitan.STEP.search(torchtitan.ANSI.sub("", text)):
        return "torchtitan"
    if megatron.ARGS_START.search(text) or "elapsed time per iteration (ms)" in text:
        return "megatron"
    if (deepspeed.ENGINE_CONFIG.search(text) or deepspeed.USER_JSON_LINE.search(text) or "CurrSamplesPerSec=" in text
            or deepspeed.PIPE_STEP.search(text)):
        return "deepspeed"
    return None


def read_log_text(path: str | Path) -> str:
    """A log file's text (gzip-compressed when its name ends in .gz; undecodable bytes replaced).
    Raises ConfigError naming the file when it cannot be read."""
    problem = path_problem(str(path))
    if problem:
        raise ConfigError("--log", f"{shown(str(path), 80)}: {problem}")
    if not os.path.isfile(path):
        raise ConfigError("--log", f"{shown(str(path), 80)} is a folder" if os.path.isdir(path)
                          else f"no such file: {shown(str(path), 80)}")
    if os.path.getsize(path) > MAX_BYTES:
        raise ConfigError("--log", f"{shown(str(path), 80)} is over {MAX_BYTES // 2**20} MiB; keep its start (the "
                          "configuration) and its last steps")
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError) as e:
        raise ConfigError("--log", f"{shown(str(path), 80)} cannot be read ({type(e).__name__}: {e})") from None
    return data.decode("utf-8", errors="replace")


#: what a reader raises on a value it cannot take: turned into one ConfigError naming the log
UNREADABLE = (ValueError, TypeError, OverflowError, RecursionError, KeyError, AttributeError, IndexError,
              ZeroDivisionError)


def read_run_log(log: str | Path, *, kind: str | None = None, overrides: Overrides | None = None,
                 source: str | None = None) -> RunLog:
    """A training log (a path, or its text when ``log`` holds a newline) read into a RunLog (module
    docstring). ``kind``: one of :data:`KINDS`, else detected from the content. ``source``: the name the
    row gives the run (default: '<kind> log <file name>'). Raises ConfigError (one line: what is
    missing, and the flag that supplies it) for an unknown format, a log without its configuration or
    its measurements, and for what the overrides contradict."""
    overrides = overrides or Overrides()
    is_text = isinstance(log, str) and "\n" in log
    text = log if is_text else read_log_text(log)
    name = "text" if is_text else Path(log).name
    if kind is not None and kind not in READERS:
        raise ConfigError("--log-kind", f"unknown kind {kind!r}", accepted=", ".join(KINDS))
    found = kind or detect_kind(text)
    if found is None:
        raise ConfigError("--log", f"{shown(name, 80)} is not a training log paraplan reads (none of the lines "
                          "Megatron-LM, torchtitan, DeepSpeed or MLPerf print)", accepted=", ".join(KINDS))
    engine_word = {"megatron": "Megatron-LM", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed",
                   "mlperf": "MLPerf Training"}[found]
    try:
        return READERS[found](text, source or f"{engine_word} log {name}", overrides)
    except UNREADABLE as e:
        # a value in the log the reader cannot take (a flag's value that is not a number, a count past any
        # machine's, a config nested past the JSON reader's depth): named, with the file, in one line
        raise ConfigError("--log", f"{shown(name, 80)}: a value the {engine_word} reader cannot read "
                          f"({type(e).__name__}: {shown(str(e), 100)})",
                          accepted=f"a {engine_word} log as the engine prints it") from None


def runs_csv(logs) -> str:
    """Read logs as the text of a runs file: the published-run columns (:data:`FILE_COLUMNS`), one row
    per log, which ``paraplan score RUNS.csv`` (and calibrate) read back."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(FILE_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for log in logs:
        writer.writerow({k: ("" if v is None else v) for k, v in log.row.items()})
    return out.getvalue()
