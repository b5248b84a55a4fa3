"""torchtitan training logs.

What is read (torchtitan 0.3.0 torchtitan/trainer.py ``Trainer.Config.maybe_log``,
torchtitan/components/metrics.py ``MetricsProcessor.log``):
  * ``Running with configs: {json}`` (printed with ``--debug.print_config``; 0.2.x printed
    ``Running with args: {dict}``): the ``training``, ``parallelism`` and ``compile`` sections read by
    :func:`paraplan.planner.readers.read_torchtitan_sections`; the activation-checkpointing policy from
    the fields its section holds (``force_recompute_mm_shapes_by_fqns``: SelectiveAC, per-op SAC;
    ``memory_budget``: MemoryBudgetAC; only the base fields: FullAC; null: none), since the printed dict
    does not name the class; the model from ``model_spec`` (name and flavor -> a preset, else its shape:
    dim, layers, heads, key/value heads, MLP width, vocabulary);
  * ``CUDA capacity: <GPU name> with N GiB memory``: the GPU;
  * ``Building N-D device mesh with [...], [a, b]``: the GPU count (their product);
  * ``step: N  loss: L  [grad_norm: G]  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%``: tokens per
    second per GPU (torchtitan divides the data-parallel rank's tokens by the model-parallel group),
    hence step = global batch x sequence / (T x GPUs), TFLOP/s and MFU as printed, and the peak
    reserved memory M (GiB) since the previous line.
The printed config does not show the low-precision converters (they rewrite the model's Linear configs):
such a run is read as bf16, said in the notes; ``--dtype`` states it. Without a printed config the
layout comes from ``--tp``/``--pp``/... with ``--seq-len`` and ``--global-batch``.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import replace

from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.planner.readers import read_torchtitan_sections
from paraplan.planner.runlogs.build import finish, layout_overrides, model_of
from paraplan.planner.runlogs.common import Measured, Overrides, RunLog, median_of, number, steady
from paraplan.workloads.transformer import TransformerModel

KIND = "torchtitan"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CONFIG = re.compile(r"Running with (configs|args): ")
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.]+)(?:\s+grad_norm:\s*[-\d.naif]+)?\s+memory:\s*([\d.]+)GiB\(([\d.]+)%\)"
                  r"\s+tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+%|N/A)")
CAPACITY = re.compile(r"CUDA capacity: (.+?) with ([\d.]+)GiB memory")
MESH = re.compile(r"Building \d+-D device mesh with \[[^\]]*\], \[([\d, ]+)\]")
#: torchtitan model name and flavor -> preset (torchtitan 0.3.0 torchtitan/models/*/config_registry.py)
PRESETS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("deepseek_v3", "671B"): "deepseek-v3"}
#: step 1 carries compilation and allocator growth, step 2 often the first optimizer step's
DEFAULT_WARMUP = 2


def printed_config(text: str) -> dict | None:
    """The last printed job config as a dict (JSON in 0.3.0, a Python dict literal in 0.2.x), None when
    the log has none; ConfigError when it is cut short."""
    found = list(CONFIG.finditer(text))
    if not found:
        return None
    rest = text[found[-1].end():]
    depth, quote, esc = 0, "", False
    for j, ch in enumerate(rest):
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                body = rest[:j + 1]
                try:
                    return json.loads(body)
                except json.JSONDecodeError:
                    try:
                        return ast.literal_eval(body)
                    except (ValueError, SyntaxError) as e:
                        raise ConfigError(f"{KIND} log", f"its printed config does not parse ({e})") from None
    raise ConfigError(f"{KIND} log", "its printed config is cut short (a truncated log)")


def activation_policy(section) -> tuple[str | None, str | None]:
    """(torchtitan AC mode for the export reader, a note) from the printed activation_checkpoint section."""
    if section is None:
        return "none", None
    if "mode" in section:                                   # 0.2.x: mode = none | selective | full
        return section["mode"], None
    if "force_recompute_mm_shapes_by_fqns" in section:
        return "selective", "activation checkpointing: SelectiveAC (its section has force_recompute_mm_shapes_by_fqns)"
    if "memory_budget" in section:
        return "selective", (f"activation checkpointing: MemoryBudgetAC (budget {section['memory_budget']}), read as "
                             "per-op selective checkpointing")
    return "full", "activation checkpointing: FullAC (its section has only the base fields)"


def model_from_spec(spec: dict) -> tuple[TransformerModel | None, str | None, dict]:
    """(the model a printed model_spec describes, its preset name if any, the shape it states)."""
    m = spec.get("model") or {}
    layers = m.get("layers")
    shape: dict = {}
    if isinstance(layers, list) and layers:
        att, ff = layers[0].get("attention") or {}, layers[0].get("feed_forward") or {}
        qkv = att.get("qkv_linear") or {}
        shape = {"layers": len(layers), "hidden": m.get("dim"), "heads": att.get("n_heads"),
                 "kv_heads": qkv.get("n_kv_heads"), "ffn_hidden": (ff.get("w1") or {}).get("out_features"),
                 "vocab": m.get("vocab_size")}
        shape = {k: v for k, v in shape.items() if v is not None}
    preset = PRESETS.get((spec.get("name"), spec.get("flavor")))
    if {"layers", "hidden", "heads", "vocab"} <= set(shape) and layers[0].get("moe") is None:
        model = TransformerModel(name=f"torchtitan-{spec.get('name')}-{spec.get('flavor')}", layers=shape["layers"],
                                 hidden=shape["hidden"], heads=shape["heads"], vocab=shape["vocab"],
                                 kv_heads=shape.get("kv_heads") if shape.get("kv_heads") != shape["heads"] else None,
                                 ffn_hidden=shape.get("ffn_hidden"), activation="swiglu", norm="rmsnorm", bias=False,
                                 rotary=True, dropout=False)
        return model, preset, shape
    return None, preset, shape


def steps(text: str) -> list[tuple[int, dict]]:
    """(step, fields) of each printed step line."""
    out = []
    for m in STEP.finditer(text):
        out.append((int(m.group(1)), {"memory_gib": float(m.group(3)), "tps": number(m.group(5)),
                                      "tflops": number(m.group(6)),
                                      "mfu": None if m.group(7) == "N/A" else number(m.group(7))}))
    return out


def read(text: str, source: str, overrides: Overrides) -> RunLog:
    """A torchtitan log -> RunLog (module docstring)."""
    text = ANSI.sub("", text)
    cfg = printed_config(text)
    notes: list[str] = []
    lines = steps(text)
    gpu = None
    cap = CAPACITY.findall(text)
    if cap:
        gpu = cap[-1][0].strip()
    mesh = MESH.findall(text)
    gpus = None
    if mesh:
        gpus = 1
        for d in mesh[-1].split(","):
            gpus *= int(d)
    if cfg is not None:
        ac_mode, ac_note = activation_policy(cfg.get("activation_checkpoint"))
        read_cfg = read_torchtitan_sections(cfg, ac_mode)
        notes += [n for n in (ac_note,) if n]
        notes.append("low-precision converters are not in the printed config: read as "
                     f"{read_cfg.plan.dtype if read_cfg.plan else 'bf16'} (give --dtype if the run converted its Linears)")
        plan = read_cfg.plan
        if plan is not None:
            plan = Plan(**layout_overrides(KIND, {k: getattr(plan, k) for k in plan.__dataclass_fields__}, overrides))
        logged, preset, shape = model_from_spec(cfg.get("model_spec") or {})
        if preset and not overrides.model:
            overrides = replace(overrides, model=preset)
            notes.append(f"model {preset}: torchtitan's {cfg['model_spec'].get('name')} {cfg['model_spec'].get('flavor')}")
        model, more = model_of(KIND, logged, shape, overrides, "its model_spec gives no shape")
        seq, gbs = read_cfg.seq_len, read_cfg.global_batch
        tr, par = cfg.get("training") or {}, cfg.get("parallelism") or {}
        degrees = [int(par.get(k, 1)) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                                "context_parallel_degree", "data_parallel_replicate_degree")]
        shard = int(par.get("data_parallel_shard_degree", -1))
        if gpus is None and shard > 0:
            gpus = shard * degrees[0] * degrees[1] * degrees[2] * degrees[3]
        if gbs is None and gpus and tr.get("local_batch_size"):
            gbs = int(tr["local_batch_size"]) * gpus // (degrees[0] * degrees[1] * degrees[2])
            notes.append("global batch = local batch x data-parallel degree (global_batch_size -1: no accumulation)")
    else:
        if not overrides.layout:
            raise ConfigError(f"{KIND} log", "prints no job config ('Running with configs:', which torchtitan prints "
                              "with --debug.print_config): its layout is not in the log; rerun with --debug.print_config, "
                              "or give the layout (--tp N --pp N, --seq-len, --global-batch, --model)")
        read_cfg = None
        fields = layout_overrides(KIND, {}, overrides)
        fields.setdefault("zero", 3)
        notes.append("layout from the flags given (the log prints no job config); data parallelism FSDP (ZeRO-3), "
                     "torchtitan's default")
        plan = Plan(engine=KIND, grad_accumulation_fusion=False, **fields)
        model, more = model_of(KIND, None, {}, overrides, "the log prints no job config")
        seq, gbs = None, None
    notes += more
    warmup = DEFAULT_WARMUP if overrides.warmup is None else overrides.warmup
    tps, kept, skipped = steady(KIND, [(s, f["tps"]) for s, f in lines], warmup, "'step: ... tps: ...'")
    kept_fields = [f for s, f in lines if s in kept]
    seq_final = overrides.seq_len or seq
    gbs_final = overrides.global_batch or gbs
    gpus_final = overrides.gpus or gpus
    step_s = gbs_final * seq_final / (tps * gpus_final) if gbs_final and seq_final and gpus_final else None
    if step_s is None:
        what = ("GPU count", "gpus") if not gpus_final else ("sequence length", "seq_len") if not seq_final else \
            ("global batch", "global_batch")
        raise ConfigError(f"{KIND} log", f"does not state the {what[0]} that turns tokens/s into a step time; give "
                          f"--{what[1].replace('_', '-')} N")
    measured = Measured(step_time_s=step_s, steps=kept, skipped=skipped, tokens_per_s_per_gpu=tps,
                        tflops_per_gpu=median_of([f["tflops"] for f in kept_fields]),
                        mfu_pct=median_of([f["mfu"] for f in kept_fields]),
                        peak_memory_gib=max(f["memory_gib"] for _, f in lines) if lines else None,
                        memory_kind="max reserved")
    return finish(KIND, source, read_cfg, plan, model, seq, gbs, gpu, gpus, measured, overrides, notes)
