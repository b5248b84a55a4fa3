"""MLPerf Training result logs (``:::MLLOG {json}`` lines, mlcommons/logging's mllog format, as the
mlcommons/training_results_v* repositories hold them in results/<system>/<benchmark>/result_N.txt).

What is read:
  * ``:::SYSJSON {...}`` (the system description NVIDIA's and others' logs open with): the accelerator
    (``accelerator_model_name``) and the GPU count (``number_of_nodes`` x ``accelerators_per_node``);
  * POINT_IN_TIME keys: ``submission_benchmark`` (the model: gpt3 -> the GPT-3 175B preset, llama31_8b,
    llama31_405b), ``submission_platform`` (the GPU where no SYSJSON names it: AMD's ``MI355X``),
    ``global_batch_size``, ``max_sequence_length``, and the layout keys some submissions log
    (``tensor_parallelism``, ``pipeline_parallelism``, ``context_parallelism``, ``expert_parallelism``,
    ``micro_batch_size``: AMD's Primus logs);
  * the throughput blocks ``block_start`` / ``block_stop``: each block's wall time over the steps it
    trained (its ``epoch_count``, or its ``samples_count`` difference), i.e. the time per step; evaluation
    (``eval_start`` .. ``eval_stop``) lies between blocks and is not counted. The gpt3 benchmark counts
    tokens (NVIDIA v4.0, Eos 512 GPUs: epoch_count 51,904,512 = 11 steps x 2,304 sequences x 2,048 tokens),
    the others samples.
A result log names neither the layout (NVIDIA's: its config_*.sh does) nor the precision: they come from
the user (``--tp``, ``--pp``, ``--vpp``, ``--micro-batch``, ``--dtype``), and where missing the error says so.
"""
from __future__ import annotations

import json
import re

from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.planner.runlogs.build import finish, layout_overrides
from paraplan.planner.runlogs.common import Measured, Overrides, RunLog, agree, missing, steady
from paraplan.workloads.presets import load_model

KIND = "mlperf"
MLLOG = re.compile(r":::MLLOG (\{.*\})\s*$")
SYSJSON = re.compile(r":::SYSJSON (\{.*\})\s*$")
#: MLPerf Training benchmark -> model preset (the reference models: GPT-3 175B; Llama 3.1 8B and 405B)
BENCHMARK_PRESETS = {"gpt3": "gpt3-175b", "llama31_8b": "llama3-8b", "llama31_405b": "llama3-405b"}
#: benchmarks whose block counts are tokens, not samples
COUNTS_TOKENS = ("gpt3",)
#: layout keys some submissions log -> plan fields
LAYOUT_KEYS = {"tensor_parallelism": "tp", "pipeline_parallelism": "pp", "context_parallelism": "cp",
               "expert_parallelism": "ep", "micro_batch_size": "micro_batch"}
#: the low-precision names the logs' lowest_numerical_precision_linear uses -> paraplan dtypes
PRECISIONS = {"mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8": "fp8", "mxfp8": "mxfp8", "bf16": "bf16"}
#: the first block carries the first steps' set-up (CUDA graphs, allocator growth)
DEFAULT_WARMUP = 1
SEQ_KEYS = ("max_sequence_length", "sequence_length", "seq_length", "max_seq_len")


def events(text: str) -> list[dict]:
    """The parsed ``:::MLLOG`` events in log order (a line cut short is skipped)."""
    out = []
    for line in text.splitlines():
        m = MLLOG.search(line)
        if m:
            try:
                out.append(json.loads(m.group(1)))
            except json.JSONDecodeError:
                continue
    return out


def system(text: str) -> dict:
    """The last ``:::SYSJSON`` description ({} when none)."""
    found = [m.group(1) for m in map(SYSJSON.search, text.splitlines()) if m]
    try:
        return json.loads(found[-1]) if found else {}
    except json.JSONDecodeError:
        return {}


def blocks(evs: list[dict]) -> list[tuple[int, float, float | None]]:
    """(index, block wall time in s, the block's count or None) of each block_start / block_stop pair."""
    out, start = [], None
    last_count = None
    for e in evs:
        meta = e.get("metadata") or {}
        if e.get("key") == "block_start":
            start = e
        elif e.get("key") == "block_stop" and start is not None:
            count = meta.get("epoch_count")
            samples = meta.get("samples_count")
            if count is None and samples is not None:
                begin = (start.get("metadata") or {}).get("samples_count", last_count)
                count = samples - begin if begin is not None else None
                last_count = samples
            out.append((len(out) + 1, (e["time_ms"] - start["time_ms"]) / 1000, count))
            start = None
    return out


def read(text: str, source: str, overrides: Overrides) -> RunLog:
    """An MLPerf Training result log -> RunLog (module docstring)."""
    evs = events(text)
    if not evs:
        raise ConfigError(f"{KIND} log", "has no ':::MLLOG {json}' lines")
    point = {e["key"]: e.get("value") for e in evs if e.get("event_type") == "POINT_IN_TIME"}
    bench = point.get("submission_benchmark")
    if bench is None:
        raise ConfigError(f"{KIND} log", "has no submission_benchmark line (its start is cut off: the configuration "
                          "lines precede run_start)")
    gbs = point.get("global_batch_size")
    seq = next((point[k] for k in SEQ_KEYS if k in point), None)
    if gbs is None:
        raise ConfigError(f"{KIND} log", "has no global_batch_size line (its start is cut off)")
    notes = [f"MLPerf Training benchmark {bench} ({point.get('submission_org', '?')}, "
             f"{point.get('submission_division', '?')} division)"]
    if overrides.model:
        model = load_model(overrides.model)
    elif bench in BENCHMARK_PRESETS:
        model = load_model(BENCHMARK_PRESETS[bench])
        notes.append(f"model {BENCHMARK_PRESETS[bench]}: the {bench} benchmark's reference model")
    else:
        raise missing(KIND, "model's architecture", "model", f"benchmark {bench!r} has no preset here (the "
                      f"pretraining ones do: {', '.join(BENCHMARK_PRESETS)})")
    sysj = system(text)
    gpu = sysj.get("accelerator_model_name")
    gpus = None
    if sysj.get("number_of_nodes") and sysj.get("accelerators_per_node"):
        gpus = int(sysj["number_of_nodes"]) * int(sysj["accelerators_per_node"])
    if gpu is None and point.get("submission_platform"):
        gpu = str(point["submission_platform"])
        notes.append(f"GPU from submission_platform {gpu!r} (the log has no SYSJSON line)")
    found_blocks = blocks(evs)
    counted = [(i, t, c) for i, t, c in found_blocks if c]
    if found_blocks and not counted:
        raise ConfigError(f"{KIND} log", "its blocks carry no epoch_count or samples_count: their steps cannot be counted")
    per_step = gbs * (seq or 0) if bench in COUNTS_TOKENS else gbs
    if bench in COUNTS_TOKENS and not seq:
        raise missing(KIND, "sequence length", "seq_len")
    warmup = DEFAULT_WARMUP if overrides.warmup is None else overrides.warmup
    step_s, kept, skipped = steady(KIND, [(i, t / (c / per_step)) for i, t, c in counted], warmup,
                                   "block_start/block_stop")
    logged_layout = {LAYOUT_KEYS[k]: int(v) for k, v in point.items() if k in LAYOUT_KEYS and v is not None}
    precision = point.get("lowest_numerical_precision_linear")
    if precision is not None and str(precision).lower() in PRECISIONS:
        logged_layout["dtype"] = PRECISIONS[str(precision).lower()]
    fields = layout_overrides(KIND, logged_layout, overrides)
    for f, key in (("tp", "tp"), ("pp", "pp")):
        if f not in fields:
            raise missing(KIND, f"{'tensor' if f == 'tp' else 'pipeline'}-parallel degree", key,
                          "a result log prints no layout (the submission's config_*.sh sets it)")
    if "dtype" not in fields:
        raise ConfigError(f"{KIND} log", "does not state the precision the run trained in; give --dtype "
                          "(e.g. fp8-delayed for Transformer Engine's default recipe, bf16)")
    framework = str(sysj.get("framework", "")) + " " + str(sysj.get("framework_name", ""))
    engine = "megatron" if re.search(r"nemo|megatron|primus", framework + " " + source, re.IGNORECASE) else "generic"
    notes.append(f"engine {engine}: " + (f"the framework {framework.strip()!r} runs Megatron-Core" if engine == "megatron"
                                         else "the log names no framework paraplan models"))
    if fields.get("vpp", 1) > 1:
        fields.setdefault("schedule", "interleaved")
    try:
        plan = Plan(engine=engine, **fields)
    except ConfigError as e:
        raise ConfigError(f"{KIND} log", f"{e.field}: {e.problem}") from None
    tokens = gbs * seq / step_s / gpus if seq and gpus else None
    measured = Measured(step_time_s=step_s, steps=kept, skipped=skipped, tokens_per_s_per_gpu=tokens)
    seq = agree(KIND, "sequence length", seq, overrides.seq_len, "seq_len")
    return finish(KIND, source, None, plan, model, seq, int(gbs), gpu, gpus, measured, overrides, notes)
