"""Reading the cells of a published-run file: numbers with notes, ZeRO stages, precisions, measurements.

A published-run file has the columns :data:`FILE_COLUMNS` (docs/reference/README.md describes them).
The measured metric is turned into a step time with the source's own FLOP convention:
  * ``tflops_per_gpu_incl_recompute`` (Megatron-LM 2021): F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
    (Narayanan et al. 2021 Eq. 3, full recomputation), step = F / (TFLOP/s · 1e12 · GPUs);
  * ``tflops_per_gpu`` (model FLOPs, no recomputation) and ``mfu`` (% of the GPU's dense 16-bit peak):
    step = F / (TFLOP/s · 1e12 · GPUs), F = B·s·(paraplan's model FLOPs per token: causal attention
    counted whole, or halved where the source counts it so: :func:`source_counts_causal_half`, whose
    rules are paraplan/data/flop_conventions.yaml; at 128k tokens the two counts differ by 1.70x for
    Llama 3 8B, 1.36x at 32k); a source's own count may otherwise differ by a few percent;
  * ``step_time``: as given (seconds, or ms when the unit says so); ``tokens_per_sec_per_gpu``:
    step = B·s / (value · GPUs); ``tokens_per_sec`` (the whole job): B·s / value; ``samples_per_sec``
    (sequences per second, the whole job): B / value.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pandas as pd
import yaml

from paraplan.errors import ConfigError, shown
from paraplan.io import path_problem
from paraplan.workloads.transformer import TransformerModel

THROUGHPUT_METRICS = ("tflops_per_gpu_incl_recompute", "step_time", "tokens_per_sec_per_gpu", "tokens_per_sec",
                      "samples_per_sec", "tflops_per_gpu", "mfu")

#: the columns of a published-run file (paraplan/calibration/data/published_runs_calibration*.csv)
FILE_COLUMNS = ("source", "model", "params_b", "layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len",
                "moe_experts", "moe_topk", "gpu", "num_gpus", "tp", "pp", "dp", "cp_or_sp", "ep", "vpp", "zero_stage",
                "offload", "recompute", "micro_batch", "global_batch", "precision", "measured_metric",
                "measured_value", "measured_unit", "notes")
#: the columns without which no row of a file can be read; the others may be left out (read as blank)
REQUIRED_FILE_COLUMNS = ("source", "model", "gpu", "num_gpus", "tp", "pp", "dp", "measured_metric", "measured_value")

# Megatron-LM pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by 128;
# megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding)
MEGATRON_VOCAB_MULTIPLE = 128
#: how the bigscience rows' notes state the vocabulary: 'vocab ~250k'
VOCAB_IN_NOTES = re.compile(r"vocab\s*~\s*(\d+(?:\.\d+)?)\s*k\b", flags=re.IGNORECASE)
#: how a row's notes give a sequence length its source left to the config's default
CONFIG_DEFAULT_SEQ = re.compile(r"seq_len not stated \(config default (\d+)")
#: how far a row's params_b may sit from the model it was read as (published sizes are rounded:
#: "70B" for 70.6B, "8B" for 8.03B; Llama 4's totals count the vision encoder, 2 %)
PARAMS_TOLERANCE = 0.2


def blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


#: the largest count a cell may hold (GPUs, batch, degrees): past a C int it is a typo, and numpy overflows
MAX_CELL = 2**31 - 1


def int_cell(v, column: str | None = None) -> int:
    """An integer cell: a whole number ('1,024' with separators, 8.0 as pandas reads a column with
    blanks), or one followed by a note ('8 (guess)', '4; per node'); anything else raises ValueError with
    the value and its ``column`` (the row is then skipped with it): a fraction (1.5 was rounded to 2), a
    negative, inf, NaN, a count past ``MAX_CELL`` (2**63 overflowed numpy)."""
    text = v
    where = f"{column} cell" if column else "cell"
    if isinstance(v, str):
        if re.fullmatch(r"\s*\d{1,3}(?:,\d{3})+\s*", v):          # thousands separators: '1,024'
            v = v.replace(",", "")
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:\(.*\)|;.*)?\s*", v)
        if m is None:
            raise ValueError(f"{where} {text!r} is not a number")
        v = m.group(1)
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where} {text!r} is not a number") from None
    if not math.isfinite(f) or f < 0 or f != int(f):
        raise ValueError(f"{where} {text!r} is not a whole number")
    if f > MAX_CELL:
        raise ValueError(f"{where} {text!r} is past {MAX_CELL:,}")
    return int(f)


def row_notes(r: pd.Series) -> str:
    """The row's notes column ("" when blank)."""
    return "" if blank(r["notes"]) else str(r["notes"])


#: the gradient accumulation a row's notes state (Megatron-Bridge's tables: a "GA" column)
NOTES_GA = re.compile(r"\bGA (\d+)\b")


def batch_contradiction(r: pd.Series) -> str | None:
    """What is wrong with a row whose batch figures contradict each other, or None: the global batch must
    be micro-batch x data-parallel degree x gradient accumulation, and the notes may state the last
    (``GA N``). Two of the three figures then fix the third, and the reader cannot tell which one the
    source got wrong: it says so rather than pick silently."""
    m = NOTES_GA.search(row_notes(r))
    if m is None or any(blank(r[k]) for k in ("global_batch", "micro_batch", "dp")):
        return None
    ga, mb, dp = int(m.group(1)), int_cell(r["micro_batch"], "micro_batch"), int_cell(r["dp"], "dp")
    gbs = int_cell(r["global_batch"], "global_batch")
    if gbs == mb * dp * ga:
        return None
    implied = gbs / (mb * dp)
    return (f"the row's batch figures contradict each other: global batch {gbs}, but micro-batch {mb} x data-parallel "
            f"{dp} x gradient accumulation {ga} (its notes) = {mb * dp * ga}; the global batch and micro-batch "
            f"alone imply accumulation {implied:g}")


def notes_say_async_tp(r: pd.Series) -> bool:
    """Whether the row's notes name torchtitan's async TP (``vanilla TP`` rows do not)."""
    return "async tp" in row_notes(r).lower()


def notes_guess_full_recompute(notes: str) -> bool:
    """The row's notes guess full recomputation ('recompute not stated (guess: full)', 'recompute guess full')."""
    return re.search(r"recompute[^;]*guess:?\s*full", notes, flags=re.IGNORECASE) is not None


def vocab_from_notes(notes: str, tp: int) -> int | None:
    """The vocabulary a row's notes give as ``vocab ~250k`` (the bigscience prototypes' only statement
    of it), padded as Megatron pads it to a multiple of 128·tp: ~250k at tp 8 -> 250,880, which is
    also BLOOM's released ``vocab_size`` (bigscience/bloom config.json). None if the notes give none."""
    m = VOCAB_IN_NOTES.search(notes)
    if not m:
        return None
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return int(math.ceil(float(m.group(1)) * 1000 / multiple) * multiple)


#: where each source's FLOP convention for causal attention is read (FLOP_CONVENTIONS_FILE's header)
FLOP_CONVENTIONS_FILE = Path(__file__).parents[1] / "data" / "flop_conventions.yaml"
#: how a row's notes state its own count: 'FLOPs count causal attention halved' (or 'whole')
NOTES_CAUSAL_COUNT = re.compile(r"flops?\b[^;]*causal attention (halved|whole)", flags=re.IGNORECASE)
ATTENTION_COUNTS = ("whole", "halved")


@lru_cache(maxsize=1)
def flop_convention_rules() -> tuple[tuple[tuple[str, ...], bool], ...]:
    """((words, halved), ...) of FLOP_CONVENTIONS_FILE in order, then ((), the default). Raises
    ConfigError for a rule without a source or with a count other than whole / halved."""
    with open(FLOP_CONVENTIONS_FILE, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    rules = []
    for i, r in enumerate(doc["rules"]):
        if r.get("attention") not in ATTENTION_COUNTS or not str(r.get("source", "")).strip() or not r.get("words"):
            raise ConfigError(f"{FLOP_CONVENTIONS_FILE.name}: rules[{i}]",
                              "needs words, attention (whole or halved) and the source it was read from")
        rules.append((tuple(str(w).lower() for w in r["words"]), r["attention"] == "halved"))
    if doc.get("otherwise") not in ATTENTION_COUNTS:
        raise ConfigError(f"{FLOP_CONVENTIONS_FILE.name}: otherwise", "must be whole or halved")
    return (*rules, ((), doc["otherwise"] == "halved"))


def source_counts_causal_half(source, notes: str = "") -> bool:
    """Whether the TFLOP/s or MFU a source publishes counts causal attention's QK^T and PV halved: the
    row's notes where they say so ('FLOPs count causal attention halved'), else the first rule of
    FLOP_CONVENTIONS_FILE whose words all occur in the lower-cased source (Megatron-Bridge's and, since
    July 2025, MaxText's counts halve it; torchtitan's and NeMo's count it whole), else whole."""
    said = NOTES_CAUSAL_COUNT.search(notes or "")
    if said:
        return said.group(1).lower() == "halved"
    s = str(source).lower()
    return next(halved for words, halved in flop_convention_rules() if all(w in s for w in words))


def measured_step_time_s(metric: str, value: float, unit, global_batch: int, seq_len: int, num_gpus: int,
                         model: TransformerModel, peak_flops_16bit: float | None = None,
                         causal_halved: bool = False) -> float:
    """A row's measurement as a step time in seconds (the conventions in the module docstring).
    ``causal_halved``: the source's TFLOP/s or MFU counts causal attention halved
    (:func:`source_counts_causal_half`). Raises ValueError for a measurement that is not a positive
    finite number."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"measured_value {value!r} is not a positive number")
    if metric in ("tflops_per_gpu", "mfu"):
        model_flops = global_batch * seq_len * model.model_flops_per_token(seq_len, causal_halved)
        if metric == "tflops_per_gpu":
            return model_flops / (value * 1e12 * num_gpus)
        share = value / 100 if str(unit).strip() == "%" or value > 1 else value
        return model_flops / (share * peak_flops_16bit * num_gpus)
    if metric == "tflops_per_gpu_incl_recompute":
        s, L, h, V = seq_len, model.layers, model.hidden, model.vocab
        flops = 96 * global_batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        return flops / (value * 1e12 * num_gpus)
    if metric == "step_time":
        return value / 1000 if str(unit).strip().lower() == "ms" else value
    if metric == "tokens_per_sec":
        return global_batch * seq_len / value
    if metric == "samples_per_sec":
        return global_batch / value
    return global_batch * seq_len / (value * num_gpus)


def peak_16bit(cluster) -> float:
    """The dense 16-bit peak (bf16, else fp16) an MFU figure is a share of, FLOP/s."""
    peaks = cluster.accelerator.peak_flops
    return peaks.get("bf16") or peaks["fp16"]


def params_mismatch(model: TransformerModel, r: pd.Series) -> str | None:
    """Why a row's model is not the one its params_b column states (total or active parameters, in
    billions), or None when it agrees or the column is blank: a name read into the wrong preset, or
    columns that do not describe the model, are skipped rather than scored as another model."""
    if blank(r.get("params_b")):
        return None
    try:
        stated = float(r["params_b"])
    except (TypeError, ValueError):
        return None
    sizes = {model.num_params / 1e9, model.active_params / 1e9}
    if stated > 0 and any(abs(size - stated) <= PARAMS_TOLERANCE * stated for size in sizes):
        return None
    return (f"model {r['model']!r} read as {model.name} ({model.num_params / 1e9:.1f}B parameters"
            + (f", {model.active_params / 1e9:.1f}B active" if model.moe else "")
            + f"), but the row states {stated:g}B")


#: the architecture columns a row may state beside a preset's name, and the model field each sets
SHAPE_COLUMNS = ("layers", "hidden", "heads", "ffn_hidden", "vocab", "moe_experts", "moe_topk")


def preset_with_row_shape(model: TransformerModel, r: pd.Series, assumed: list) -> TransformerModel | str:
    """The preset ``model`` a row's name denotes, with the architecture its columns state where they
    differ (before issue 65 a row naming 'Llama 3 8B' with 16 layers was scored as the 32-layer
    preset, silently): layers, hidden, heads, ffn_hidden, vocab, moe_experts, moe_topk. What the
    columns cannot state (grouped-query attention, the MLP's activation, norms, tied embeddings)
    stays the preset's. Each difference is said in ``assumed``; a blank column keeps the preset's.
    Returns the reason instead when the row's shape does not make a model with the preset's
    attention (heads not a multiple of its key/value heads) or sets experts on a dense preset."""
    moe = model.moe
    preset = {"layers": model.layers, "hidden": model.hidden, "heads": model.heads, "ffn_hidden": model.ffn_hidden,
              "vocab": model.vocab, "moe_experts": moe.experts if moe else None, "moe_topk": moe.top_k if moe else None}
    stated = {c: int_cell(r[c], c) for c in SHAPE_COLUMNS if c in r.index and not blank(r[c])}
    differ = {c: v for c, v in stated.items() if v != preset[c]}
    if not differ:
        return model
    if moe is None and ({"moe_experts", "moe_topk"} & set(differ)):
        return (f"model {r['model']!r} reads as the dense {model.name} preset, but the row states "
                + ", ".join(f"{c} {differ[c]}" for c in ("moe_experts", "moe_topk") if c in differ)
                + " (leave them blank, or name a model without a preset to read its columns)")
    fields = {k: differ[k] for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab") if k in differ}
    if moe is not None and ({"moe_experts", "moe_topk"} & set(differ)):
        fields["moe"] = replace(moe, experts=differ.get("moe_experts", moe.experts), top_k=differ.get("moe_topk", moe.top_k))
    kv = model.kv_heads
    if "heads" in fields and kv and fields["heads"] % kv:
        return (f"model {r['model']!r}: the row's heads {fields['heads']} are not a multiple of the {model.name} "
                f"preset's {kv} key/value heads")
    if "hidden" in fields and model.head_dim is None and fields["hidden"] % fields.get("heads", model.heads):
        return f"model {r['model']!r}: the row's hidden {fields['hidden']} is not a multiple of its heads"
    try:
        shaped = replace(model, **fields)
    except (ConfigError, ValueError) as e:
        return f"model {r['model']!r}: the row's shape does not make a model with the {model.name} preset's ({e})"
    assumed.append(f"architecture of the {model.name} preset with the row's "
                   + ", ".join(f"{c} {v} (preset {preset[c]})" for c, v in differ.items())
                   + ": its attention, MLP activation and norms are the preset's")
    return shaped


def recompute_of_cell(text: str, assumed: list) -> str:
    """Plan.recompute for a recompute cell: 'full' / 'full (uniform)' / 'yes' / 'activation checkpointing'
    -> full; 'selective' -> selective; 'selective (per-op SAC)' -> op-sac; 'none' / 'no' / 'off' -> none;
    anything else -> none, said in ``assumed``."""
    t = str(text).strip().lower()
    if "sac" in t:
        return "op-sac"
    if t.startswith("selective"):
        return "selective"
    if t.startswith("full") or t in ("yes", "true", "on", "1") or "checkpoint" in t:
        return "full"
    if t in ("none", "no", "off", "false", "0", "nan"):
        return "none"
    assumed.append(f"recompute cell {text!r} not understood: no recomputation taken")
    return "none"


def is_gpt_mlp(ffn_hidden: int | None, hidden: int) -> bool:
    """Whether a row's MLP width says GPT (GELU, 4 x hidden; blank: the columns' GPT default) rather
    than a gated MLP (SwiGLU, any other width): what both loaders read from columns."""
    return ffn_hidden is None or ffn_hidden == 4 * hidden


#: zero_stage cells that name a stage in words (lower case, parenthesised notes dropped)
ZERO_WORDS = {"none": 0, "no": 0, "off": 0, "ddp": 0, "fsdp": 3, "full_shard": 3, "full shard": 3,
              "distributed optimizer": 1, "distributed optimiser": 1}
ZERO_CELL_HELP = "0-3, 'ZeRO-3', 'stage 2', '3 (FSDP)', 'FSDP', 'distributed optimizer' or 'none'"
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def _without_notes(text: str) -> str:
    """A cell's text without its parenthesised notes ('2 (ulysses)' -> '2 ')."""
    return re.sub(r"\([^()]*\)", " ", text)


def zero_stage(text, default: int) -> int:
    """The ZeRO stage a zero_stage cell states ('3', 3.0, '3 (FSDP)', 'ZeRO-3', 'stage 2', 'FSDP' = 3,
    'distributed optimizer' = 1, 'none' = 0), ``default`` when blank. Raises ValueError naming the cell for
    anything else ('12' was read as 1, 'abc' as the default)."""
    if blank(text):
        return default
    t = " ".join(_without_notes(str(text)).lower().split())
    if t in ZERO_WORDS:
        return ZERO_WORDS[t]
    m = re.fullmatch(r"(?:(?:zero[\s_-]*(?:stage)?|stage)[\s_-]*)?(\d+(?:\.0+)?)", t)
    if m is None or float(m.group(1)) > 3:
        raise ValueError(f"zero_stage cell {text!r} not understood (accepted: {ZERO_CELL_HELP})")
    return int(float(m.group(1)))


#: words a cp_or_sp cell may hold beside the cp degree, and the context-parallel mode some of them name
CP_MODE_WORDS = {"ulysses": "ulysses", "a2a": "ulysses", "all-to-all": "ulysses", "alltoall": "ulysses",
                 "ring": "ring", "p2p": "ring"}
CP_OTHER_WORDS = frozenset("cp sp context parallel parallelism sequence megatron deepspeed attention none no off "
                           "and with all to".split())
CP_CELL_HELP = "a cp degree ('2', 'cp2'), 'sp', both ('cp2; sp'), a mode beside the degree ('2 (ulysses)', 'cp4 ring')"


def cp_sp(text) -> tuple[int, bool, str | None]:
    """(context-parallel degree, Megatron sequence parallel, cp mode or None) a cp_or_sp cell states:
    '2' or 'cp2' (a bare number is the cp degree), 'sp (Megatron sequence parallel)', 'cp2; sp', a mode
    beside the degree ('2 (ulysses)', 'cp4 a2a' -> ulysses; 'ring', 'p2p' -> ring; DeepSpeed-Ulysses'
    'sequence parallel 4' is Ulysses, not Megatron's); (1, False, None) when blank or 'none'.

    Raises ValueError naming the cell for what it cannot read: a degree below 1 or not whole, two degrees,
    a degree on sp (Megatron's sp has none: it spans the tp group), a mode without a degree, an unknown
    word. (Before issue 67 a bare '2' was read as cp 1 and '2 (ulysses)' as ring.)"""
    if blank(text):
        return 1, False, None
    raw = str(text)
    t = raw.lower()

    def bad(why: str) -> ValueError:
        return ValueError(f"cp_or_sp cell {raw!r}: {why} (accepted: {CP_CELL_HELP})")
    mode = next((m for w, m in CP_MODE_WORDS.items() if re.search(rf"(?<![a-z]){re.escape(w)}(?![a-z])", t)), None)
    body = _without_notes(t)
    for w in CP_MODE_WORDS:          # read above ('a2a', 'p2p' hold no degree)
        body = re.sub(rf"(?<![a-z]){re.escape(w)}(?![a-z])", " ", body)
    if re.search(r"(?<![a-z])sp\s*[=:]?\s*-?\d", body):
        raise bad("sp has no degree of its own (Megatron's sequence parallelism spans the tp group); "
                  "write cpN (ulysses) for DeepSpeed-Ulysses")
    numbers = re.findall(r"(?<![\d.])" + NUMBER, re.sub(r"(?<=[a-z])-(?=\d)", " -", body))
    if len(numbers) > 1:
        raise bad(f"two degrees ({', '.join(numbers)})")
    words = [w for w in re.split(r"[^a-z0-9_]+", re.sub(NUMBER, " ", body)) if w]
    unknown = [w for w in words if w not in CP_OTHER_WORDS]
    if unknown:
        raise bad(f"{unknown[0]!r} not understood")
    cp = 1
    if numbers:
        value = float(numbers[0])
        if not math.isfinite(value) or value != int(value):
            raise bad(f"{numbers[0]} is not a whole number")
        if value < 1:
            raise bad(f"cp {numbers[0]} (a degree is >= 1)")
        cp = int(value)
    elif mode is not None:
        raise bad(f"{mode} without a degree")
    sp = (re.search(r"(?<![a-z])sp(?![a-z])", body) is not None
          or ("sequence parallel" in t and mode != "ulysses"))
    return cp, sp, mode


def offload_of_cell(text, assumed: list) -> tuple[str, bool]:
    """(Plan.offload, Plan.offload_params) an offload cell states: blank / 'none' / 'no' keep everything on
    the GPU; 'nvme' or 'cpu' move the optimizer states there (ZeRO-Offload / ZeRO-Infinity), and the
    parameters as well when the cell names them ('params', 'parameters'). Said in ``assumed``."""
    t = "" if blank(text) else str(text).strip().lower()
    if not t or t in ("none", "no", "off", "false", "0"):
        return "none", False
    where = "nvme" if "nvme" in t else "cpu" if ("cpu" in t or "host" in t or t in ("yes", "on", "true")) else ""
    if not where:
        assumed.append(f"offload cell {text!r} not understood: no offload taken")
        return "none", False
    params = "param" in t
    assumed.append(f"optimizer states{' and parameters' if params else ''} offloaded to {where} (the row's "
                   f"offload cell: {text!r})")
    return where, params


def dtype_of_precision(precision: str, assumed: list) -> str:
    """paraplan dtype for a precision cell, "" when not understood: bf16 / amp_bf16, fp16 / mixed (fp16),
    FP8-CS per-tensor current scaling, FP8-DS delayed scaling, FP8-MX mxfp8, torchao's float8 tensorwise /
    rowwise; NVFP4 (Megatron-Bridge's "NVFP4", Transformer Engine's NVFP4BlockScaling) and MXFP4; NeMo
    24.07's Transformer Engine default recipe was delayed scaling; an unnamed FP8 recipe is taken as
    current scaling (the Megatron-Bridge pages' default); ``amp_fp8`` (Composer's and llm-foundry's name
    beside ``amp_bf16``) is fp8 of an unnamed recipe (before issue 65 it was refused as not understood)."""
    p = precision.lower()
    if p.startswith("amp_fp8"):     # Composer / llm-foundry's precision names: amp_bf16, amp_fp8
        p = p.removeprefix("amp_")
    if "mxfp4" in p or "mx-fp4" in p or "fp4-mx" in p:
        return "mxfp4"
    if "nvfp4" in p or "fp4" in p:
        if "nvfp4" not in p:
            assumed.append("fp4 recipe = NVFP4 (Transformer Engine's NVFP4BlockScaling; not stated)")
        return "nvfp4"
    if p.startswith("bf16") or p.startswith("amp_bf16") or p in ("bfloat16", "mixed (bf16)"):
        return "bf16"
    if p.startswith("fp16") or p.startswith("float16") or p == "mixed (fp16)":
        return "fp16"
    if "fp8-mx" in p or "mxfp8" in p:
        return "mxfp8"
    if "fp8-cs" in p or "current scaling" in p:
        return "fp8"
    if "fp8-ds" in p or "delayed" in p:
        return "fp8-delayed"
    if "fp8" in p and "block" in p:
        return "fp8-blockwise"
    if "transformerengine" in p:
        assumed.append("fp8 recipe = delayed scaling (Transformer Engine's default in NeMo 24.07)")
        return "fp8-delayed"
    if p.startswith("fp8"):
        assumed.append("fp8 recipe = per-tensor current scaling (not stated)")
        return "fp8"
    if "float8 tensorwise" in p:
        return "fp8"
    if "float8 rowwise" in p:
        return "fp8-rowwise"
    return ""


def read_runs_file(csv_path) -> pd.DataFrame:
    """A published-run file as a table with every FILE_COLUMNS column (absent optional ones blank).
    Raises ConfigError naming the file and the missing required columns, or why it cannot be read."""
    field = "RUNS.csv"
    problem = path_problem(csv_path)
    if problem:
        raise ConfigError(field, f"{shown(str(csv_path), 80)}: {problem}")
    if not os.path.isfile(csv_path):        # os.path's checks say False for a name too long to look up
        raise ConfigError(field, f"{shown(str(csv_path), 80)} is a folder" if os.path.isdir(csv_path)
                          else f"no such file: {shown(str(csv_path), 80)}", accepted="a CSV file of measured runs")
    try:
        table = pd.read_csv(csv_path)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ConfigError(field, f"cannot be read as a CSV table ({type(e).__name__}: {str(e)[:160]})",
                          source=str(csv_path)) from None
    missing = [c for c in REQUIRED_FILE_COLUMNS if c not in table.columns]
    if missing:
        raise ConfigError(field, "missing column" + "s" * (len(missing) > 1) + " " + ", ".join(missing)
                          + "; a published-run file has " + ", ".join(FILE_COLUMNS), source=str(csv_path))
    for c in FILE_COLUMNS:
        if c not in table.columns:
            table[c] = None
    return table


def cases_of_table(table: pd.DataFrame, case_of, source_of):
    """(usable cases, skipped rows as (row, source, reason)) of a table already read: ``case_of(i, row)``
    gives a case or the reason the row is skipped, ``source_of(source)`` the short source name. A cell
    that cannot be read as the number its column holds ('8 (guess)' in tp) skips its row with the value
    and the error, not the file."""
    cases, skipped = [], []
    for i, r in table.iterrows():
        try:
            c = case_of(int(i), r)
        except ConfigError as e:
            c = f"a cell is out of range ({e})"
        except (ValueError, TypeError, ZeroDivisionError) as e:
            c = f"a cell cannot be read ({type(e).__name__}: {e})"
        if isinstance(c, str):
            skipped.append((int(i), source_of(str(r["source"])), c))
        else:
            cases.append(c)
    return cases, skipped
