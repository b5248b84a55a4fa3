"""DeepSpeed training logs (DeepSpeed's own logger at INFO, as HF Trainer and most launch scripts show it).

What is read (DeepSpeed deepspeed/runtime/config.py ``DeepSpeedConfig.print`` and ``print_user_config``,
deepspeed/utils/timer.py ``ThroughputTimer.stop``, deepspeed/runtime/pipe/engine.py):
  * ``DeepSpeedEngine configuration:`` ... ``json = {...}``: the user's config as JSON, read by
    :func:`paraplan.planner.readers.read_deepspeed_config`, and ``world_size ...... N`` of the same print
    (the data-parallel world: GPUs = world_size x tp x pp); an excerpt that keeps only the print's
    ``print_user_config] json = {...}`` lines is read as well;
  * ``global_step=N, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=S, MemAllocated=..GB, MaxMemAllocated=M GB``
    (one line every ``steps_per_print`` steps, each for the step it ends):
    the step time train_batch_size / S (S counts the whole job's samples per second), and the peak
    allocated memory (GB = 2**30 bytes: ``max_memory_allocated() / 1024**3``);
  * the pipeline engine's ``steps: N loss: L iter time (s): T samples/sec: S``: the step time T.
DeepSpeed prints neither the model, the GPU nor the sequence length: ``--model``, ``--gpu``, ``--seq-len``.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace

from paraplan.errors import ConfigError
from paraplan.planner.readers import read_deepspeed_config
from paraplan.planner.runlogs.build import finish, layout_overrides, model_of
from paraplan.planner.runlogs.common import Measured, Overrides, RunLog, median_of, steady

KIND = "deepspeed"
ENGINE_CONFIG = re.compile(r"DeepSpeedEngine configuration:")
#: the print's last line: the user's config as JSON (an excerpt may keep this without the print's start)
USER_JSON_LINE = re.compile(r"print_user_config\]\s+json = \{")
USER_JSON = re.compile(r"json = (\{)")
WORLD_SIZE = re.compile(r"\]\s+world_size \.+ (\d+)")
TIMER = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=([\d.eE+-]+), CurrSamplesPerSec=([\d.eE+-]+)"
                   r"(?:[^\n]*?MaxMemAllocated=([\d.]+)GB)?")
PIPE_STEP = re.compile(r"steps: (\d+) loss: [\d.eE+-]+ iter time \(s\): ([\d.]+) samples/sec: ([\d.]+)")
DEFAULT_WARMUP = 2


def user_config(text: str) -> dict | None:
    """The JSON config DeepSpeed printed after ``DeepSpeedEngine configuration:`` (the last one; or the
    print's ``print_user_config] json = {`` line where an excerpt kept only that), None when the log
    has none. Raises ConfigError for a JSON cut short."""
    found = list(ENGINE_CONFIG.finditer(text))
    if found:
        rest = text[found[-1].end():]
    else:                   # an excerpt that keeps the print's json line without its start
        lines = list(USER_JSON_LINE.finditer(text))
        if not lines:
            return None
        rest = text[lines[-1].start():]
    m = USER_JSON.search(rest)
    if m is None:
        raise ConfigError(f"{KIND} log", "its 'DeepSpeedEngine configuration:' print has no 'json = {...}' (a truncated log)")
    depth, i = 0, m.start(1)
    for j in range(i, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[j], 0)
        if depth == 0:
            try:
                return json.loads(rest[i:j + 1])
            except json.JSONDecodeError as e:
                raise ConfigError(f"{KIND} log", f"its printed json config does not parse ({e})") from None
    raise ConfigError(f"{KIND} log", "its printed json config is cut short (a truncated log)")


def read(text: str, source: str, overrides: Overrides) -> RunLog:
    """A DeepSpeed log -> RunLog (module docstring)."""
    cfg = user_config(text)
    if cfg is None:
        raise ConfigError(f"{KIND} log", "has no 'DeepSpeedEngine configuration:' print and no 'json = {...}' (DeepSpeed "
                          "prints them at INFO on rank 0 when the engine starts): its configuration is not in the log")
    read_cfg = read_deepspeed_config(cfg)
    batch = read_cfg.global_batch
    points, mem = [], []
    for m in TIMER.finditer(text):
        if batch is None:
            raise ConfigError(f"{KIND} log", "its config has no train_batch_size: CurrSamplesPerSec cannot be turned "
                              "into a step time")
        points.append((int(m.group(1)), batch / float(m.group(3))))
        if m.group(4):
            mem.append(float(m.group(4)))
    if not points:
        points = [(int(m.group(1)), float(m.group(2))) for m in PIPE_STEP.finditer(text)]
    warmup = DEFAULT_WARMUP if overrides.warmup is None else overrides.warmup
    step_s, kept, skipped = steady(KIND, points, warmup, "'CurrSamplesPerSec' or 'iter time (s)'")
    worlds = WORLD_SIZE.findall(text)
    plan = read_cfg.plan
    notes = list(read_cfg.unexpressed)
    if plan is not None:
        fields = layout_overrides(KIND, {k: getattr(plan, k) for k in plan.__dataclass_fields__}, overrides)
        plan = type(plan)(**fields)
    gpus = int(worlds[-1]) * (plan.tp * plan.pp if plan else 1) if worlds else None
    model, model_notes = model_of(KIND, None, {}, overrides, "DeepSpeed prints no model")
    tokens = None
    measured = Measured(step_time_s=step_s, steps=kept, skipped=skipped, tokens_per_s_per_gpu=tokens,
                        peak_memory_gib=max(mem) if mem else None,
                        memory_kind="MaxMemAllocated, rank 0" if mem else "")
    log = finish(KIND, source, read_cfg, plan, model, read_cfg.seq_len, batch, None, gpus, measured, overrides,
                 notes + model_notes)
    tps = median_of([log.global_batch * log.seq_len / t / log.gpus for _, t in points[warmup:]])
    return _with_tokens(log, tps)


def _with_tokens(log: RunLog, tps: float | None) -> RunLog:
    """The log with its tokens per second per GPU (known once the sequence length is)."""
    measured = replace(log.measured, tokens_per_s_per_gpu=tps)
    row = dict(log.row)
    row["notes"] = row["notes"].replace("; read from", f"; tokens/s/GPU {tps:,.0f}; read from", 1) if tps else row["notes"]
    return replace(log, measured=measured, row=row)
