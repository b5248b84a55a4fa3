"""Published training runs as calibration cases (shared/reference/published_runs_calibration.csv).

Each throughput row becomes (model, job, cluster, plan, measured step time). The measured metric is
converted to a step time with the source's own FLOP convention:
  * ``tflops_per_gpu_incl_recompute`` (Megatron-LM 2021): F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
    (Narayanan et al. 2021 Eq. 3, full recomputation), step = F / (TFLOP/s · 1e12 · GPUs);
  * ``tflops_per_gpu`` (model FLOPs, no recomputation) and ``mfu`` (% of the GPU's dense 16-bit peak):
    step = F / (TFLOP/s · 1e12 · GPUs), F = B·s·(paraplan's model FLOPs per token: Megatron's
    convention, causal attention counted whole); a source's own count may differ by a few percent;
  * ``step_time``: as given (seconds, or ms when the unit says so); ``tokens_per_sec_per_gpu``:
    step = B·s / (value · GPUs); ``tokens_per_sec`` (the whole job): B·s / value; ``samples_per_sec``
    (sequences per second, the whole job): B / value.
GPU and model names outside the files' own tables are read by hardware/names.py and workloads/names.py ("A100-SXM4-80GB",
"Llama 3.1 70B"); a row that leaves the architecture blank takes the preset its model name denotes.
A row is used only when its configuration is complete (shape, GPUs, every degree, batch); rows that
leave a field blank are reported as skipped with the missing field. Inferences made for complete rows
are listed per row in ``assumed``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from paraplan.costmodels.estimate import MEMORY_PRESSURE, estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.hardware.names import system_for_gpu
from paraplan.plan import MEGATRON_FSDP_STRATEGY, Plan, check_plan
from paraplan.workloads.names import model_preset_for_name
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import MoESpec, TrainingJob, TransformerModel

DEFAULT_CSV = Path(__file__).parent / "data" / "published_runs_calibration.csv"  # copy of shared/reference
THROUGHPUT_METRICS = ("tflops_per_gpu_incl_recompute", "step_time", "tokens_per_sec_per_gpu", "tokens_per_sec",
                      "samples_per_sec", "tflops_per_gpu", "mfu")
#: the held-out source: its rows are scored by korthikanti_table (Table 5 step times), not as calibration rows
KORTHIKANTI_SOURCE = "Megatron-LM 2022 (Korthikanti)"
#: the vocabulary an A100-file row that leaves it blank is taken to have: GPT-2's 50,257 tokens padded
#: to 51,200 (Megatron-LM's --make-vocab-size-divisible-by 128 at tp 8, the SC21 runs' figure)
GPT_VOCAB = 51200
#: the vocabulary taken for a model described only by its columns when neither they nor the notes
#: give one (32,000: Llama 1/2 and Mistral; the logit layer is a few percent of a step either way)
DEFAULT_VOCAB = 32000
#: the cluster of the bigscience rows: the A100 partition of IDRIS's Jean Zay, where BLOOM and its
#: prototypes trained (bigscience tr11-176B-ml README: 8 A100-80GB and 4 Omni-Path links per node)
BLOOM_SYSTEM = "jean-zay-a100"
GPU_TO_SYSTEM = {"A100-80GB": "dgx-a100-80g", "A100-40GB": "dgx-a100-40g", "A100 (DGX-A100)": "dgx-a100-40g",
                 "V100-32GB (DGX-2)": "dgx2-v100"}


@dataclass(frozen=True)
class PublishedRun:
    """A row of a calibration file and the run it describes (its measurement in the subclasses)."""
    row: int
    source: str
    label: str
    model: TransformerModel
    job: TrainingJob
    cluster: object
    plan: Plan


@dataclass(frozen=True)
class CalibrationCase(PublishedRun):
    measured_step_time_s: float
    assumed: tuple[str, ...]


def short_source(source: str) -> str:
    s = source.lower()
    if "llm-foundry" in s:
        return "llm-foundry " + ("A100-80GB" if "80gb" in s else "A100-40GB")
    if "bigscience" in s:
        return "bigscience BLOOM prototypes"
    if "megatron" in s and "2020" in s:
        return "Megatron-LM 2020"
    if "megatron" in s and "2022" in s:
        return KORTHIKANTI_SOURCE
    if "megatron" in s and "2021" in s:
        return "Megatron-LM 2021 (SC21)"
    return source


def system_of_row_gpu(gpu, exact: dict, assumed: list) -> str | None:
    """The system preset of a row's GPU: the file's own table first, else hardware.names.system_for_gpu
    (its assumption, if any, appended to ``assumed``); None when there is none (``assumed`` then ends
    with the reason, which the caller reports)."""
    if gpu in exact:
        return exact[gpu]
    found = system_for_gpu(str(gpu))
    if isinstance(found, str):
        assumed.append(found)
        return None
    if found.assumption:
        assumed.append(found.assumption)
    return found.preset


def measured_step_time_s(metric: str, value: float, unit, global_batch: int, seq_len: int, num_gpus: int,
                         model: TransformerModel, peak_flops_16bit: float | None = None) -> float:
    """A row's measurement as a step time in seconds (the conventions in the module docstring).
    Raises ValueError for a measurement that is not a positive finite number."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"measured_value {value!r} is not a positive number")
    if metric in ("tflops_per_gpu", "mfu"):
        model_flops = global_batch * seq_len * model.model_flops_per_token(seq_len)
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


def _peak_16bit(cluster) -> float:
    """The dense 16-bit peak (bf16, else fp16) an MFU figure is a share of, FLOP/s."""
    peaks = cluster.accelerator.peak_flops
    return peaks.get("bf16") or peaks["fp16"]


def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def _int(v) -> int:
    """An integer cell: a number ('1,024' with separators), or a number followed by a note ('8 (guess)');
    anything else raises
    ValueError (the row is then skipped with the cell's value)."""
    if isinstance(v, str):
        if re.fullmatch(r"\s*\d{1,3}(?:,\d{3})+\s*", v):          # thousands separators: '1,024'
            v = v.replace(",", "")
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:\(.*\)|;.*)?\s*", v)
        if m is None:
            raise ValueError(f"not a number: {v!r}")
        v = m.group(1)
    return int(round(float(v)))


# Megatron-LM pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by 128;
# megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding)
MEGATRON_VOCAB_MULTIPLE = 128


#: how the bigscience rows' notes state the vocabulary: 'vocab ~250k'
VOCAB_IN_NOTES = re.compile(r"vocab\s*~\s*(\d+(?:\.\d+)?)\s*k\b", flags=re.IGNORECASE)


def vocab_from_notes(notes: str, tp: int) -> int | None:
    """The vocabulary a row's notes give as ``vocab ~250k`` (the bigscience prototypes' only statement
    of it), padded as Megatron pads it to a multiple of 128·tp: ~250k at tp 8 -> 250,880, which is
    also BLOOM's released ``vocab_size`` (bigscience/bloom config.json). None if the notes give none."""
    m = VOCAB_IN_NOTES.search(notes)
    if not m:
        return None
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return int(math.ceil(float(m.group(1)) * 1000 / multiple) * multiple)


def _notes_guess_full_recompute(notes: str) -> bool:
    """The row's notes guess full recomputation ('recompute not stated (guess: full)', 'recompute guess full')."""
    return re.search(r"recompute[^;]*guess:?\s*full", notes, flags=re.IGNORECASE) is not None


def case_from_row(i: int, r: pd.Series) -> CalibrationCase | str:
    """A calibration case, or the reason the row is skipped."""
    if r["measured_metric"] == "peak_memory_per_gpu":
        return "a peak-memory row (load_memory_cases scores those)"
    if r["measured_metric"] not in THROUGHPUT_METRICS:
        return f"metric {r['measured_metric']} is not a throughput"
    if short_source(str(r["source"])) == KORTHIKANTI_SOURCE:
        return "held out: korthikanti_table scores this source's Table 5 step times"
    setup = _setup_from_row(r)
    if isinstance(setup, str):
        return setup
    model, job, cluster, plan, assumed, src, gbs, mb = setup
    step = measured_step_time_s(r["measured_metric"], float(r["measured_value"]), r["measured_unit"], gbs,
                                job.seq_len, cluster.num_gpus, model, _peak_16bit(cluster))
    return CalibrationCase(i, src, _row_label(r, cluster, plan, mb, job), model, job, cluster, plan, step,
                           tuple(assumed))


def _row_label(r: pd.Series, cluster, plan: Plan, mb: int, job: TrainingJob) -> str:
    """How an A100-file row is named in tables: model, GPU, count and layout."""
    return f"{r['model']} {r['gpu']} x{cluster.num_gpus} tp{plan.tp} pp{plan.pp} dp{plan.dp} mb{mb} s{job.seq_len}"


@dataclass(frozen=True)
class MemoryCase(PublishedRun):
    """A row that gives a run's peak memory per GPU (bytes)."""
    measured_bytes: float
    assumed: tuple[str, ...]


def memory_case_from_row(i: int, r: pd.Series) -> MemoryCase | str:
    """A peak-memory row (``peak_memory_per_gpu``: GB per GPU as the training log printed it, read as
    GiB; the rows do not say whether the allocated or the reserved peak), or the reason it is skipped."""
    if r["measured_metric"] != "peak_memory_per_gpu":
        return f"metric {r['measured_metric']} is not a peak memory"
    setup = _setup_from_row(r)
    if isinstance(setup, str):
        return setup
    model, job, cluster, plan, assumed, src, gbs, mb = setup
    return MemoryCase(i, src, _row_label(r, cluster, plan, mb, job), model, job, cluster, plan,
                      float(r["measured_value"]) * 2**30, tuple(assumed))


#: the columns that make two rows of the A100 file the same run (a step time and its peak memory)
RUN_COLUMNS = ("source", "model", "gpu", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len")


def load_memory_cases(csv_path: Path | str = DEFAULT_CSV) -> tuple[list[MemoryCase], list[tuple[int, str, str]]]:
    """(peak-memory cases, skipped rows) of the A100 file. A memory row reads the notes of the throughput
    row of the same run as well (RUN_COLUMNS): the bigscience rows state the vocabulary, precision and
    recomputation guesses only beside the step time."""
    table = pd.read_csv(csv_path)
    key = lambda r: tuple(str(r[c]) for c in RUN_COLUMNS)
    notes_of_run = {key(r): str(r["notes"]) for _, r in table.iterrows() if r["measured_metric"] in THROUGHPUT_METRICS}

    def case_of(i: int, r: pd.Series) -> MemoryCase | str:
        r = r.copy()
        r["notes"] = f"{r['notes']}; {notes_of_run.get(key(r), '')}"
        return memory_case_from_row(i, r)
    return cases_of_table(table, case_of, short_source)


def _setup_from_row(r: pd.Series):
    """(model, job, cluster, plan, assumptions, short source, global batch, micro-batch) of a row of
    the A100 file, or the reason it cannot be set up."""
    notes = str(r["notes"])
    vocab_assumed = None
    if _blank(r["vocab"]) and not _blank(r["tp"]):
        vocab = vocab_from_notes(notes, _int(r["tp"]))
        if vocab is not None:
            r = r.copy()
            r["vocab"] = vocab
            vocab_assumed = (f"vocab = {vocab:,d}: the notes' '{VOCAB_IN_NOTES.search(notes).group(0)}' padded to a "
                             f"multiple of 128 x tp as Megatron pads it")
    architecture = ("layers", "hidden", "heads", "vocab")
    blank_architecture = [k for k in architecture if _blank(r[k])]
    preset = model_preset_for_name(r["model"]) if blank_architecture else _richer_preset_of_same_shape(r)
    if not preset and blank_architecture == ["vocab"]:
        r = r.copy()
        r["vocab"] = GPT_VOCAB
        vocab_assumed = f"vocab = {GPT_VOCAB:,d}: not stated (GPT-2's tokenizer as Megatron-LM pads it)"
        blank_architecture = []
        preset = _richer_preset_of_same_shape(r)
    required = (() if preset else architecture) + ("seq_len", "num_gpus", "tp", "pp", "dp", "global_batch")
    missing = [k for k in required if _blank(r[k])]
    if missing:
        return "configuration incomplete: " + ", ".join(missing) + " blank"
    assumed = [vocab_assumed] if vocab_assumed else []
    system = system_of_row_gpu(r["gpu"], GPU_TO_SYSTEM, assumed)
    if system is None:
        return assumed[-1]
    src = short_source(r["source"])
    megatron = src.startswith("Megatron")
    if src == "bigscience BLOOM prototypes" and system == "dgx-a100-80g":
        system = BLOOM_SYSTEM
        assumed.append("cluster: Jean Zay's A100 partition, where the BLOOM runs trained (4 x Omni-Path 100 Gb/s "
                       "per node of 8 A100-80GB: systems/jean-zay-a100.yaml)")
    if preset and blank_architecture:
        model = load_model(preset)
        assumed.append(f"architecture of the {preset} preset: the row names {r['model']!r} and leaves "
                       + ", ".join(blank_architecture) + " blank")
    elif preset:
        model = load_model(preset)
        assumed.append(f"architecture of the {preset} preset, whose shape the row's columns give (they cannot "
                       "state its grouped-query attention or gated MLP)")
    else:
        ffn = None if _blank(r["ffn_hidden"]) else _int(r["ffn_hidden"])
        gelu = is_gpt_mlp(ffn, _int(r["hidden"]))
        if not gelu:
            assumed.append("SwiGLU MLP: ffn_hidden is not 4 x hidden (the GPT MLP's width)")
        model = TransformerModel(
            name=str(r["model"]), layers=_int(r["layers"]), hidden=_int(r["hidden"]), heads=_int(r["heads"]),
            vocab=_int(r["vocab"]), ffn_hidden=ffn, activation="gelu" if gelu else "swiglu",
            tied_embeddings=gelu, learned_positions=megatron and gelu, rotary=not gelu,
            max_positions=_int(r["seq_len"]), bias=megatron and gelu)
    dp, gbs = _int(r["dp"]), _int(r["global_batch"])
    if _blank(r["micro_batch"]):
        mb = gbs // dp
        assumed.append(f"micro_batch = global_batch/dp = {mb} (no accumulation; not stated)")
    else:
        mb = _int(r["micro_batch"])
    rec = str(r["recompute"]).lower()
    if _blank(r["recompute"]):
        if r["measured_metric"] == "step_time" and "TFLOP/s per GPU reported" in notes:
            rec = "full"
            assumed.append("recompute = full: the reported TFLOP/s equal the 96BsLh^2 (recompute) formula")
        elif _notes_guess_full_recompute(notes):
            rec = "full"
            assumed.append("recompute = full: the notes' guess (the TFLOPs the log printed count the recomputed forward)")
        else:
            rec = ""     # not stated: the lightest recomputation that fits, chosen once the plan is built
    recompute = recompute_of_cell(rec, assumed) if rec else "none"
    precision = str(r["precision"]).lower()
    if _blank(r["precision"]) and "bf16" in notes.lower():
        precision = "bf16"
        assumed.append("precision = bf16: the notes' guess (not restated by the source)")
    dtype = dtype_of_precision(precision, assumed) or ("bf16" if "bf16" in precision else "fp16")
    flash = "flashattention" in notes.lower()
    if preset and not flash:
        flash = re.search(r"no flash|unfused|eager attention", notes, flags=re.IGNORECASE) is None
        if flash:
            assumed.append("fused (flash) attention: not stated; the preset's model postdates FlashAttention")
    vpp = 1 if _blank(r["vpp"]) else _int(r["vpp"])
    zero = _zero_stage(r["zero_stage"], default=0)
    tp = _int(r["tp"])
    cp, sp = _cp_sp(r["cp_or_sp"])
    ep = 1 if _blank(r["ep"]) else _int(r["ep"])
    if not preset and not _blank(r["moe_experts"]):
        model = replace(model, moe=MoESpec(experts=_int(r["moe_experts"]),
                                           top_k=1 if _blank(r["moe_topk"]) else _int(r["moe_topk"]),
                                           expert_ffn_hidden=model.ffn_hidden))
        if _blank(r["moe_topk"]):
            assumed.append("MoE top-k = 1 (not stated)")
    if "DDP-impl local" in notes or src == "Megatron-LM 2020":
        overlap = False
        if src == "Megatron-LM 2020":
            assumed.append("no gradient all-reduce overlap: Megatron-LM 2020 default --DDP-impl local")
    else:
        overlap = True
    engine = "generic"
    if src == "bigscience BLOOM prototypes":
        # the BLOOM runs trained with Megatron-DeepSpeed: DeepSpeed's PipelineEngine (blocking p2p) and
        # its ZeRO-1 optimizer (bigscience-workshop/Megatron-DeepSpeed; tr11-176B-ml chronicles)
        engine = "deepspeed"
        assumed.append("engine = deepspeed: Megatron-DeepSpeed (DeepSpeed's pipeline engine and ZeRO optimizer)")
    offload, offload_params = offload_of_cell(r["offload"], assumed)
    if offload != "none" and engine == "generic":
        engine = "deepspeed"
        assumed.append("engine = deepspeed: optimizer offload is DeepSpeed's (ZeRO-Offload / ZeRO-Infinity)")
    try:
        plan = Plan(tp=tp, pp=_int(r["pp"]), dp=dp, cp=cp, sp=sp and tp > 1, ep=ep, vpp=vpp,
                    schedule="interleaved" if vpp > 1 else "1f1b", micro_batch=mb, zero=zero, recompute=recompute,
                    dtype=dtype, flash_attention=flash, overlap_grad_reduce=overlap, engine=engine,
                    offload=offload, offload_params=offload_params)
        cluster = load_cluster(system, _int(r["num_gpus"]))
        job = TrainingJob(seq_len=_int(r["seq_len"]), global_batch=gbs)
        plan = check_plan(plan, model, job, cluster)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    mismatch = params_mismatch(model, r)
    if mismatch:
        return mismatch
    if not rec:
        plan = _lightest_fitting_recompute(model, job, cluster, plan, assumed)
    return model, job, cluster, plan, assumed, src, gbs, mb


#: how far a row's params_b may sit from the model it was read as (published sizes are rounded:
#: "70B" for 70.6B, "8B" for 8.03B; Llama 4's totals count the vision encoder, 2 %)
PARAMS_TOLERANCE = 0.2


def params_mismatch(model: TransformerModel, r: pd.Series) -> str | None:
    """Why a row's model is not the one its params_b column states (total or active parameters, in
    billions), or None when it agrees or the column is blank: a name read into the wrong preset, or
    columns that do not describe the model, are skipped rather than scored as another model."""
    if _blank(r.get("params_b")):
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


def _richer_preset_of_same_shape(r: pd.Series) -> str | None:
    """The preset a row's model name denotes when the row's columns give its shape (layers, hidden,
    heads) and the preset has what the columns cannot say (grouped-query attention, a gated MLP):
    Llama-family rows written with their shape. GPT-style presets are left to the columns."""
    name = model_preset_for_name(r["model"])
    if name is None:
        return None
    m = load_model(name)
    same = (m.layers, m.hidden, m.heads) == (_int(r["layers"]), _int(r["hidden"]), _int(r["heads"]))
    return name if same and (m.activation != "gelu" or m.kv_heads != m.heads) else None


def _zero_stage(text, default: int) -> int:
    """The ZeRO stage a zero_stage cell states ('3', 3.0, '1 (distributed optimizer)'), else ``default``."""
    if _blank(text):
        return default
    m = re.match(r"\s*(\d)", str(text))
    return int(m.group(1)) if m else default


def _cp_sp(text) -> tuple[int, bool]:
    """(context-parallel degree, sequence parallel) a cp_or_sp cell states ('cp2; sp', 'sp (Megatron
    sequence parallel)', 'cp4'); (1, False) when blank."""
    t = "" if _blank(text) else str(text).lower()
    m = re.search(r"cp\s*=?\s*(\d+)", t)
    return (int(m.group(1)) if m else 1), re.search(r"(?<![a-z])sp\b|sequence parallel", t) is not None


def offload_of_cell(text, assumed: list) -> tuple[str, bool]:
    """(Plan.offload, Plan.offload_params) an offload cell states: blank / 'none' / 'no' keep everything on
    the GPU; 'nvme' or 'cpu' move the optimizer states there (ZeRO-Offload / ZeRO-Infinity), and the
    parameters as well when the cell names them ('params', 'parameters'). Said in ``assumed``."""
    t = "" if _blank(text) else str(text).strip().lower()
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


def _lightest_fitting_recompute(model, job, cluster, plan: Plan, assumed: list) -> Plan:
    """A row that does not state its recomputation ran, so it fitted: the lightest of none, selective
    and full whose estimate fits the GPU's memory (full when none does), said in ``assumed``."""
    for mode in ("none", "selective", "full"):
        candidate = replace(plan, recompute=mode)
        if estimate(model, job, cluster, candidate).feasible:
            assumed.append(f"recompute = {mode}: not stated; the lightest recomputation whose estimate fits")
            return candidate
    assumed.append("recompute = full: not stated, and no recomputation fits the estimate's memory")
    return replace(plan, recompute="full")


#: the columns of a published-run file (shared/reference/published_runs_calibration*.csv)
FILE_COLUMNS = ("source", "model", "params_b", "layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len",
                "moe_experts", "moe_topk", "gpu", "num_gpus", "tp", "pp", "dp", "cp_or_sp", "ep", "vpp", "zero_stage",
                "offload", "recompute", "micro_batch", "global_batch", "precision", "measured_metric",
                "measured_value", "measured_unit", "notes")
#: the columns without which no row of a file can be read; the others may be left out (read as blank)
REQUIRED_FILE_COLUMNS = ("source", "model", "gpu", "num_gpus", "tp", "pp", "dp", "measured_metric", "measured_value")


def read_runs_file(csv_path) -> pd.DataFrame:
    """A published-run file as a table with every FILE_COLUMNS column (absent optional ones blank).
    Raises ConfigError naming the file and the missing required columns, or why it cannot be read."""
    if not Path(csv_path).is_file():
        raise ConfigError(str(csv_path), "no such file")
    try:
        table = pd.read_csv(csv_path)
    except (OSError, ValueError) as e:
        raise ConfigError(str(csv_path), f"cannot be read as a CSV table ({e})") from None
    missing = [c for c in REQUIRED_FILE_COLUMNS if c not in table.columns]
    if missing:
        raise ConfigError(str(csv_path), "missing column" + "s" * (len(missing) > 1) + " " + ", ".join(missing)
                          + "; a published-run file has " + ", ".join(FILE_COLUMNS))
    for c in FILE_COLUMNS:
        if c not in table.columns:
            table[c] = None
    return table


def _load(csv_path, case_of, source_of) -> tuple[list[CalibrationCase], list[tuple[int, str, str]]]:
    """(usable cases, skipped rows as (row, source, reason)) of a calibration file: ``case_of(i, row)``
    gives a case or the reason the row is skipped, ``source_of(source)`` the short source name."""
    return cases_of_table(read_runs_file(csv_path), case_of, source_of)


def cases_of_table(table: pd.DataFrame, case_of, source_of):
    """:func:`_load` of a table already read (also paraplan score's reader). A cell that cannot be read as the number its column
    holds ('8 (guess)' in tp) skips its row with the value and the error, not the file."""
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


def load_cases(csv_path: Path | str = DEFAULT_CSV) -> tuple[list[CalibrationCase], list[tuple[int, str, str]]]:
    """(usable cases, skipped rows as (row, source, reason)) of the A100 file."""
    return _load(csv_path, case_from_row, short_source)


def score(cases, estimate_fn) -> pd.DataFrame:
    """Predicted vs measured step time per case; ``error`` = predicted/measured − 1; the predicted
    memory headroom and whether the estimate flags memory pressure (estimate.allocator_pressure_assumption)."""
    rows = []
    for c in cases:
        e = estimate_fn(c.model, c.job, c.cluster, c.plan)
        rows.append({"row": c.row, "source": c.source, "case": c.label, "measured_s": c.measured_step_time_s,
                     "predicted_s": e.step_time_s, "error": e.step_time_s / c.measured_step_time_s - 1,
                     "feasible": e.feasible,
                     "headroom_GiB": e.headroom_bytes / 2**30,
                     "memory_pressure": any(a.startswith(MEMORY_PRESSURE) for a in e.assumptions)})
    return pd.DataFrame(rows)


def mape_by_source(df: pd.DataFrame) -> pd.DataFrame:
    g = df.assign(abs_err=df.error.abs()).groupby("source")
    out = pd.DataFrame({"rows": g.size(), "mape_%": 100 * g.abs_err.mean(), "bias_%": 100 * g.error.mean(),
                        "worst_%": 100 * g.abs_err.max()})
    out.loc["OVERALL"] = [len(df), 100 * df.error.abs().mean(), 100 * df.error.mean(), 100 * df.error.abs().max()]
    return out


# --- held out: Korthikanti et al. 2022 (arXiv:2205.05198), Selene A100-80GB ---------------------------
# Execution configurations as encoded in calculon's validation set (calculon-ai/calculon:
# validation/seqsel/{tab5,fig1}/*.json): fp16, sequence 2048, data parallel 1, micro-batch 1 unless
# stated. Model shapes: Korthikanti Table 3. Measured: Table 5 step times (full recomputation;
# sequence parallel + selective) and Fig. 1 activation memory (none; SP + selective), GiB.
KORTHIKANTI_SETUPS = {  # model, GPUs, global batch, layout
    "22B": (TransformerModel("gpt-22b", 48, 6144, 64, 51200, tied_embeddings=True, learned_positions=True,
                             max_positions=2048), 8, 4, dict(tp=8, pp=1, micro_batch=4)),
    "175B": ("gpt3-175b", 64, 64, dict(tp=8, pp=8, vpp=3, schedule="interleaved")),
    "530B": ("gpt-530b", 280, 280, dict(tp=8, pp=35, vpp=3, schedule="interleaved")),
    "1T": ("gpt-1t", 512, 512, dict(tp=8, pp=64)),
}
KORTHIKANTI_TABLE5_STEP_S = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83),
                             "1T": (94.42, 71.49)}
KORTHIKANTI_FIG1_ACTIVATIONS_GIB = {"22B": (59.25, 9.5625), "175B": (66.84375, 12.3515625),
                                    "530B": (114.0234375, 23.076171875), "1T": (131.25, 26.5625)}


def korthikanti_estimate(name: str, estimate_fn, **plan):
    """Estimate one Korthikanti setup with extra plan fields (recompute, sp)."""
    model, gpus, gbs, layout = KORTHIKANTI_SETUPS[name]
    model = load_model(model) if isinstance(model, str) else model
    return estimate_fn(model, TrainingJob(2048, gbs), load_cluster("dgx-a100-80g", gpus),
                       Plan(flash_attention=False, dtype="fp16", **layout, **plan))


def korthikanti_table() -> pd.DataFrame:
    """Predicted vs measured for the held-out Korthikanti rows (step time and activation memory)."""
    rows = []
    for name in KORTHIKANTI_SETUPS:
        for mode, extra, step, act in (
                ("full recompute", dict(recompute="full"), KORTHIKANTI_TABLE5_STEP_S[name][0], None),
                ("SP + selective", dict(recompute="selective", sp=True), KORTHIKANTI_TABLE5_STEP_S[name][1],
                 KORTHIKANTI_FIG1_ACTIVATIONS_GIB[name][1]),
                ("no recompute", {}, None, KORTHIKANTI_FIG1_ACTIVATIONS_GIB[name][0])):
            e = korthikanti_estimate(name, estimate, **extra)
            act_pred = e.memory_bytes_per_gpu["activations"] / 2**30
            rows.append({"model": name, "mode": mode, "step_measured_s": step, "step_predicted_s": e.step_time_s,
                         "step_error_%": None if step is None else 100 * (e.step_time_s / step - 1),
                         "act_measured_GiB": act, "act_predicted_GiB": act_pred,
                         "act_error_%": None if act is None else 100 * (act_pred / act - 1)})
    return pd.DataFrame(rows)


# --- H100-class and Blackwell runs (shared/reference/published_runs_calibration_h100.csv) ----------
H100_CSV = Path(__file__).parent / "data" / "published_runs_calibration_h100.csv"  # copy of shared/reference
H100_GPU_TO_SYSTEM = {"H100 (DGX-H100)": "dgx-h100", "DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200",
                      "DGX-GB200": "gb200-nvl72", "DGX-GB300": "gb300-nvl72",
                      "H100-96GB HBM2e (Grand Teton, 500W)": "grand-teton-h100"}
H100_MODEL_PRESETS = {"llama 3 8b": "llama3-8b", "llama3-8b": "llama3-8b", "llama 3 70b": "llama3-70b",
                      "llama3-70b": "llama3-70b", "llama 3.1 405b": "llama3-405b", "gpt3-175b": "gpt3-175b",
                      "llama2-7b": "llama2-7b", "llama2-13b": "llama2-13b", "llama2-70b": "llama2-70b",
                      "deepseekv3 (w/o mtp)": "deepseek-v3", "deepseekv3 (dropless)": "deepseek-v3",
                      "deepseekv3 (w/ mtp)": "deepseek-v3-mtp",
                      "gpt3-5b": "gpt3-5b", "gpt3-20b": "gpt3-20b", "nemotron-8b": "nemotron3-8b",
                      "nemotron-22b": "nemotron3-22b", "nemotron-340b": "nemotron4-340b",
                      "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b",
                      "qwen3_30b_a3b (tokendrop)": "qwen3-30b-a3b", "qwen3_235b_a22b (tokendrop)": "qwen3-235b-a22b",
                      "gpt oss 120b": "gpt-oss-120b"}

# The layout of Megatron-Bridge's DeepSeek-V3 performance configs for 1024 H100 of the 25.09 era
# (scripts/performance/configs/deepseek/deepseek_llm_pretrain.py, deepseek_v3_h100_1024gpus_{bf16,fp8}_config;
# three versions of the file read, all alike on what is used here; the one with a use_tokendrop switch
# defaults it False, the archive's "(dropless)" label). Today's deepseek_workload_base_configs.py names
# HybridEP and no all-to-all overlap for that layout; it is later than the row.
_DEEPSEEK_V3_H100_1024 = dict(num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, global_batch=8192)

# Rows whose Megatron-Bridge performance recipe turns on the expert-parallel all-to-all overlap
# (Megatron-Core combined 1F1B, overlap_moe_expert_parallel_comm), by the file's model name and GPU, with
# the layout the recipe names: scripts/performance/configs/qwen/qwen3_workload_base_configs.py,
# QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (moe_a2a_overlap=True: 256 GPUs, tp 2, pp 8, vpp 4, ep 32,
# global batch 2048); the DeepSeek-V3 1024-H100 configs above (their a2a-1F1B overrides:
# overlap_moe_expert_parallel_comm and delay_wgrad_compute on, the shared-expert overlap off; neither of
# the last two is priced). The recipes of the other MoE rows set it False or leave
# it out (its default: off); the token-drop rows come from an older recipe that does not say.
RECIPE_EP_COMM_OVERLAP = {("qwen3_235b_a22b", "DGX-H100"): dict(num_gpus=256, tp=2, pp=8, vpp=4, ep=32,
                                                                 global_batch=2048),
                          ("deepseekv3 (dropless)", "DGX-H100"): _DEEPSEEK_V3_H100_1024}

# Rows whose recipe, of the archive the row comes from, dispatches tokens with DeepEP or HybridEP
# (Megatron-Core's flex token dispatcher: plan.moe_flex_dispatch): the DeepSeek-V3 1024-H100 configs above,
# enable_deepep=True (the same files' GB200 and B200 configs set it False); Qwen3-30B-A3B on 16 H100, the
# 26.06 archive's row, whose layout is scripts/performance/configs/qwen/qwen3_workload_base_configs.py
# QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (the "only version": 16 GPUs, ep 16, global batch 1024,
# micro-batch 1 by default, moe_flex_dispatcher_backend="hybridep", moe_a2a_overlap=False; two versions of
# the file read, alike). Those recipes name HybridEP for more rows, but those rows come from the older
# 25.09 / 25.11 archives and other layouts, so they keep the all-to-all dispatcher (docs/accuracy.md).
_QWEN3_30B_H100_16 = dict(num_gpus=16, tp=1, pp=1, ep=16, micro_batch=1, global_batch=1024)
RECIPE_FLEX_DISPATCH = {("deepseekv3 (dropless)", "DGX-H100"): _DEEPSEEK_V3_H100_1024,
                        ("qwen3_30b_a3b", "DGX-H100"): _QWEN3_30B_H100_16}

# Rows whose recipe turns the data-parallel gradient reduce-scatter's overlap off
# (cfg.comm_overlap.overlap_grad_reduce = False, "to avoid functional errors"): the same DeepSeek-V3
# 1024-H100 configs.
RECIPE_NO_GRAD_REDUCE_OVERLAP = {("deepseekv3 (dropless)", "DGX-H100"): _DEEPSEEK_V3_H100_1024}


def _row_has_layout(r: pd.Series, layout: dict) -> bool:
    """Whether the row ran a recipe's layout: every key of ``layout`` equal in the row (a blank vpp
    counts as 1, any other blank as no match)."""
    def value(k):
        return 1 if k == "vpp" and _blank(r[k]) else (None if _blank(r[k]) else _int(r[k]))
    return all(value(k) == v for k, v in layout.items())


def _recipe_key(r: pd.Series) -> tuple[str, str]:
    """The key the RECIPE_* tables file a row under: its model name (lower case) and GPU."""
    return str(r["model"]).strip().lower(), str(r["gpu"])


def _recipe_names_row(recipes: dict, r: pd.Series) -> bool:
    """Whether one of ``recipes`` (model name and GPU -> layout) is the row's: its model and GPU name one
    there, and the row's layout is the recipe's."""
    layout = recipes.get(_recipe_key(r))
    return layout is not None and _row_has_layout(r, layout)


# Rows whose Megatron-Bridge performance recipe recomputes named modules (recompute_modules, Megatron-Core's
# --recompute-granularity selective --recompute-modules), by the file's model name and GPU: the recipe's
# layout and its modules (scripts/performance/configs/deepseek/deepseek_workload_base_configs.py
# DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 and _GB200_BF16_V2; scripts/performance/configs/gpt_oss/
# gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2). Only rows whose layout is
# the recipe's exactly take them: the other MoE rows ran layouts today's recipes no longer name, so what
# they recomputed is not known (they keep "no recomputation, not stated").
RECIPE_RECOMPUTE_MODULES = {
    ("deepseekv3 (dropless)", "DGX-H100"): (dict(num_gpus=1024, tp=2, pp=8, vpp=4, ep=64, global_batch=8192),
                                            "mla_up_proj,mlp"),
    ("deepseekv3 (w/o mtp)", "DGX-GB200"): (dict(num_gpus=256, tp=1, pp=4, vpp=4, ep=64, global_batch=4096,
                                                 micro_batch=1), "mla_up_proj"),
    ("gpt oss 120b", "DGX-H100"): (dict(num_gpus=64, tp=1, pp=4, ep=8, global_batch=1280, micro_batch=1),
                                   "layernorm,moe_act"),
    # DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1 (same file): 256 GPUs, pp 16, ep 8, global batch 2048
    ("deepseekv3 (w/ mtp)", "DGX-B200"): (dict(num_gpus=256, tp=1, pp=16, vpp=1, ep=8, global_batch=2048,
                                               micro_batch=1), "mla_up_proj"),
}

# Rows whose Megatron-Bridge recipe sets the pipeline layout, by the file's model name and GPU: the recipe's
# layout and its (first, last) stage layer counts. DeepSeek-V3 at pp 16 (set_deepseek_v3_pipeline_model_
# parallel_layout, src/megatron/bridge/recipes/deepseek/deepseek_v3.py, layout_map[(16, 1)]): the embedding
# and 4 decoder layers first, 4 on each of the 14 middle stages, 1 decoder layer with the MTP block and the
# loss last.
RECIPE_STAGE_LAYERS = {
    ("deepseekv3 (w/ mtp)", "DGX-B200"): (dict(num_gpus=256, tp=1, pp=16, vpp=1, ep=8, global_batch=2048), (4, 1)),
}


def _recipe_stage_layers(r: pd.Series) -> tuple[int, int]:
    """The (first, last) stage layers the row's recipe sets (RECIPE_STAGE_LAYERS) where the row's layout
    is the recipe's; (0, 0), the automatic split, otherwise."""
    entry = RECIPE_STAGE_LAYERS.get(_recipe_key(r))
    return entry[1] if entry is not None and _row_has_layout(r, entry[0]) else (0, 0)


# Rows whose Megatron-Bridge recipe offloads the activations of some layers to host memory (Megatron-Core's
# --cpu-offloading-num-layers), by the file's model name, GPU and precision: the recipe's layout and the
# layer count (scripts/performance/configs/llama/llama3_workload_base_configs.py,
# LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2: 64 GPUs, Megatron FSDP, micro-batch 2, global batch 256,
# cpu_offloading_num_layers 20; _GB200_FP8_CS_V2: the same with 40). Only rows with the recipe's layout
# and precision take them.
RECIPE_ACTIVATION_OFFLOAD_LAYERS = {
    ("llama 3 70b", "DGX-GB300", "FP8-CS"): (dict(num_gpus=64, tp=1, pp=1, micro_batch=2, global_batch=256), 20),
    ("llama 3 70b", "DGX-GB200", "FP8-CS"): (dict(num_gpus=64, tp=1, pp=1, micro_batch=2, global_batch=256), 40),
}


def _recipe_activation_offload_layers(r: pd.Series) -> int:
    """Layers whose activations the row's recipe offloads (RECIPE_ACTIVATION_OFFLOAD_LAYERS) where the row's
    layout and precision are the recipe's; 0 otherwise."""
    entry = RECIPE_ACTIVATION_OFFLOAD_LAYERS.get((*_recipe_key(r), str(r["precision"]).strip().upper()))
    return entry[1] if entry is not None and _row_has_layout(r, entry[0]) else 0


# Models whose Megatron-Bridge model provider and recipe keep Megatron-Core's TransformerConfig default
# (apply_rope_fusion=False), leaving it unset or setting it False, so the rotary embedding runs eager, by the
# file's model name: GPT-OSS (src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py, GPTOSSProvider: YaRN position
# embedding, no apply_rope_fusion; the GPT-OSS 120B recipes and performance configs do not set it, the 20B
# performance config sets it False; Megatron-Bridge's validate_rope_fusion_compatibility turns it off for any
# position embedding but plain rope); DeepSeek-V3 (src/megatron/bridge/models/deepseek/deepseek_provider.py,
# DeepSeekModelProvider: apply_rope_fusion False; src/megatron/bridge/recipes/deepseek/deepseek_v3.py,
# _deepseek_v3_common(apply_rope_fusion=False), "mla rope fusion is experimental", which the performance
# configs of scripts/performance/configs/deepseek/ do not pass). The Llama providers set it True
# (LlamaModelProvider, Llama3ModelProvider).
RECIPE_UNFUSED_ROPE_MODELS = ("gpt oss 120b", "deepseekv3 (w/o mtp)", "deepseekv3 (w/ mtp)", "deepseekv3 (dropless)")


def _recipe_recompute_modules(r: pd.Series) -> str:
    """The modules the row's recipe recomputes (RECIPE_RECOMPUTE_MODULES) where the row's layout is the
    recipe's; "" otherwise."""
    entry = RECIPE_RECOMPUTE_MODULES.get(_recipe_key(r))
    return entry[1] if entry is not None and _row_has_layout(r, entry[0]) else ""


# The attention kernel a source's runs ran where it differs from what its engine picks today, by a
# substring of the row's source: torchtitan's June 2025 async-TP benchmark states its torch (nightly
# 38410cf9, 2025-06-14). torch SDPA then tried cuDNN attention last (made opt-in by pytorch/pytorch#138522,
# cherry-picked into 2.5.1), and torchtitan's SDPA wrapper of that time put cuDNN first on Blackwell
# (sm100) only ("Add CuDNN on B200 w/ highest priority": FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH
# otherwise), so on the H100 the flash backend ran: FlashAttention-2. Today's torchtitan sets cuDNN first
# everywhere (attention.engine_attention_kernel).
SOURCE_ATTENTION_KERNEL = {
    "asyncTP_llama3_h100_2025-06_torchtitan": (
        "flash2", "attention: FlashAttention-2 (torch SDPA's flash backend: the run's torch nightly of 2025-06-14 "
                  "tried cuDNN last, pytorch/pytorch#138522, and torchtitan then put cuDNN first on sm100 only; "
                  "calibration.SOURCE_ATTENTION_KERNEL)"),
}


def _source_attention_kernel(r: pd.Series, assumed: list) -> str:
    """The attention kernel the row's source ran (SOURCE_ATTENTION_KERNEL), said in ``assumed``; "auto"
    (the engine's own pick) for every other source."""
    for key, (kernel, why) in SOURCE_ATTENTION_KERNEL.items():
        if key in str(r["source"]):
            assumed.append(why)
            return kernel
    return "auto"


def h100_source(source: str) -> str:
    s = source.lower()
    if "torchtitan" in s:
        return "torchtitan async-TP (H100)"
    if "megatron-bridge" in s:
        return "Megatron-Bridge"
    if "nemo" in s:
        return "NeMo 24.07"
    return source


def dtype_of_precision(precision: str, assumed: list) -> str:
    """paraplan dtype for a precision cell, "" when not understood: bf16 / amp_bf16, fp16 / mixed (fp16),
    FP8-CS per-tensor current scaling, FP8-DS delayed scaling, FP8-MX mxfp8, torchao's float8 tensorwise /
    rowwise; NeMo 24.07's Transformer Engine default recipe was delayed scaling; an unnamed FP8 recipe is
    taken as current scaling (the Megatron-Bridge pages' default)."""
    p = precision.lower()
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


TORCHTITAN_DEFAULT_SEQ = re.compile(r"seq_len not stated \(config default (\d+)")


def _row_notes(r: pd.Series) -> str:
    """The row's notes column ("" when blank)."""
    return "" if _blank(r["notes"]) else str(r["notes"])


def _notes_say_async_tp(r: pd.Series) -> bool:
    """Whether the row's notes name torchtitan's async TP (``vanilla TP`` rows do not)."""
    return "async tp" in _row_notes(r).lower()


def _torchtitan_blanks_filled(r: pd.Series, assumed: list) -> pd.Series:
    """A torchtitan row with the blanks its notes and torchtitan's defaults fill: the sequence length its
    notes give as the config default (a guess the file marks), and the global batch as the local batch
    times the data-parallel (FSDP) degree, torchtitan's global batch when no gradient accumulation is
    configured (none is stated). Other sources' rows come back unchanged."""
    if "torchtitan" not in str(r["source"]).lower():
        return r
    r = r.copy()
    m = TORCHTITAN_DEFAULT_SEQ.search(_row_notes(r))
    if _blank(r["seq_len"]) and m:
        r["seq_len"] = int(m.group(1))
        assumed.append(f"sequence length {m.group(1)} (not stated; the row's notes: torchtitan config default, a guess)")
    if _blank(r["global_batch"]) and not _blank(r["micro_batch"]) and not _blank(r["dp"]):
        r["global_batch"] = _int(r["micro_batch"]) * _int(r["dp"])
        assumed.append("global batch = local batch x FSDP degree (torchtitan without gradient accumulation; "
                       "not stated)")
    return r




def _model_from_columns(r: pd.Series, assumed: list) -> TransformerModel | str:
    """The model a row's architecture columns describe when its name has no preset, or why there is
    none. The columns do not give the MLP's activation or the key/value heads: an MLP 4x the hidden
    width is taken as GELU (GPT), any other as SwiGLU (Llama-style), and attention as multi-head; both
    are said in ``assumed``. MoE columns give the experts (each as wide as ffn_hidden)."""
    missing = [k for k in ("layers", "hidden", "heads") if _blank(r[k])]
    if missing:
        return f"no preset for model {r['model']!r} and its architecture is blank ({', '.join(missing)})"
    vocab = None if _blank(r["vocab"]) else _int(r["vocab"])
    if vocab is None:
        vocab = vocab_from_notes(_row_notes(r), 1 if _blank(r["tp"]) else _int(r["tp"])) or DEFAULT_VOCAB
        assumed.append(f"vocab = {vocab:,d}: not stated" + (" (the notes' figure, padded as Megatron pads it)"
                                                            if vocab != DEFAULT_VOCAB else
                                                            " (the Llama 2 / Mistral tokenizer's size taken)"))
    h = _int(r["hidden"])
    ffn = None if _blank(r["ffn_hidden"]) else _int(r["ffn_hidden"])
    gelu = is_gpt_mlp(ffn, h)
    assumed.append(f"model {r['model']!r} from the row's columns: {'GELU' if gelu else 'SwiGLU'} MLP (ffn_hidden "
                   f"{'4x' if gelu else 'not 4x'} hidden), multi-head attention, untied embeddings (not stated)")
    moe = None
    if not _blank(r["moe_experts"]):
        moe = MoESpec(experts=_int(r["moe_experts"]), top_k=1 if _blank(r["moe_topk"]) else _int(r["moe_topk"]),
                      expert_ffn_hidden=ffn or 4 * h)
    try:
        return TransformerModel(name=str(r["model"]), layers=_int(r["layers"]), hidden=h, heads=_int(r["heads"]),
                                vocab=vocab, ffn_hidden=ffn, activation="gelu" if gelu else "swiglu",
                                rotary=not gelu, tied_embeddings=False, moe=moe)
    except (ConfigError, ValueError) as e:
        return f"model {r['model']!r}: its columns do not make a model ({e})"


def engine_of_source(source: str, assumed: list) -> str:
    """The engine a source's runs trained with, by its name: torchtitan; Megatron-LM / NeMo /
    Megatron-Bridge (Megatron-Core); DeepSpeed; any other source runs as the generic engine (its
    recipe's Megatron-specific defaults, TP overlap and bf16 gradients, are not assumed), said."""
    s = source.lower()
    if "torchtitan" in s:
        return "torchtitan"
    if "megatron" in s or "nemo" in s:
        return "megatron"
    if "deepspeed" in s:
        return "deepspeed"
    assumed.append(f"engine = generic: the source {short_source(source)!r} names no engine paraplan models")
    return "generic"


def case_from_h100_row(i: int, r: pd.Series) -> CalibrationCase | str:
    """A calibration case from the H100/Blackwell file, or the reason the row is skipped. Models come
    from the presets (the file leaves most architectures out); the engine from the source (NeMo and
    Megatron-Bridge run Megatron-Core; their Megatron FSDP rows its ZeRO-3)."""
    if r["measured_metric"] not in THROUGHPUT_METRICS:
        return f"metric {r['measured_metric']} is not a throughput"
    assumed: list[str] = []
    preset = H100_MODEL_PRESETS.get(str(r["model"]).strip().lower())
    if preset is None:
        preset = model_preset_for_name(r["model"])
    model = load_model(preset) if preset else _model_from_columns(r, assumed)
    if isinstance(model, str):
        return model
    mismatch = params_mismatch(model, r)
    if mismatch:
        return mismatch
    system = system_of_row_gpu(r["gpu"], H100_GPU_TO_SYSTEM, assumed)
    if system is None:
        return assumed[-1]
    r = _torchtitan_blanks_filled(r, assumed)
    missing = [k for k in ("seq_len", "num_gpus", "tp", "pp", "dp", "global_batch", "micro_batch") if _blank(r[k])]
    if missing:
        return "configuration incomplete: " + ", ".join(missing) + " blank"
    dtype = dtype_of_precision(str(r["precision"]), assumed)
    if not dtype:
        return (f"precision {r['precision']!r} not understood (bf16, fp16, FP8-CS, FP8-DS / delayed, FP8-MX / "
                "mxfp8, float8 tensorwise / rowwise are)")
    cp, sp = _cp_sp(r["cp_or_sp"])
    engine = engine_of_source(str(r["source"]), assumed)
    zero = _zero_stage(r["zero_stage"], default=3 if engine == "torchtitan" else 1)
    if _blank(r["zero_stage"]):
        assumed.append("ZeRO-3 (FSDP2, torchtitan's data parallelism; not stated)" if engine == "torchtitan" else
                       "ZeRO-1 (distributed optimizer, Megatron-Core recipes' default; not stated)")
    nvidia_recipe = engine == "megatron"      # NeMo / Megatron-Bridge performance recipes, FSDP ones included
    if engine == "megatron" and zero in MEGATRON_FSDP_STRATEGY:     # a stage outside 0-3 is refused below
        assumed.append(f"Megatron FSDP: Megatron-LM at ZeRO-{zero} (--use-megatron-fsdp, sharding strategy "
                       f"{MEGATRON_FSDP_STRATEGY[zero]}, double-buffered)")
    rec = "none" if _blank(r["recompute"]) else str(r["recompute"]).lower()
    # not stated: a NeMo / Megatron-Bridge recipe row runs without (or with its recipe's modules: its
    # memory is where paraplan's estimate is least sure, some of those runs estimate over the GPU);
    # any other source's run is taken to have used the lightest recomputation that fits
    infer_recompute = _blank(r["recompute"]) and not nvidia_recipe
    if _blank(r["recompute"]) and nvidia_recipe:
        assumed.append("no activation recomputation (not stated)")
    recompute = recompute_of_cell(rec, assumed)
    modules = _recipe_recompute_modules(r) if _blank(r["recompute"]) else ""
    if modules:
        recompute = "selective"
        assumed[-1] = (f"selective recomputation of {modules} (the row's Megatron-Bridge recipe: "
                       "calibration.RECIPE_RECOMPUTE_MODULES)")
    vpp = 1 if _blank(r["vpp"]) else _int(r["vpp"])
    ep = 1 if _blank(r["ep"]) else _int(r["ep"])
    if model.moe is None and ep > 1:
        return "ep > 1 on a dense model"
    if "tokendrop" in str(r["model"]).lower() and model.moe is not None:
        model = replace(model, moe=replace(model.moe, capacity_factor=1.0))
        assumed.append("token-drop variant: expert capacity factor 1.0, inputs padded to capacity (Megatron-Bridge's "
                       "token-drop recipes: moe_expert_capacity_factor 1.0, moe_pad_expert_input_to_capacity)")
    if preset == "gpt3-175b" and model.dropout:
        model = replace(model, dropout=False)
        assumed.append("no dropout (NeMo's GPTConfig175B: hidden_dropout = attention_dropout = 0.0)")
    n = _int(r["num_gpus"])
    if engine == "torchtitan":
        # torchtitan's TP is sequence parallel (norms and residuals sharded on the sequence); its async TP
        # is the micro-pipelined all-gather/reduce-scatter matmuls the row's notes name
        sp = _int(r["tp"]) > 1
        overlap = sp and _notes_say_async_tp(r)
    else:
        overlap = nvidia_recipe and sp and _int(r["tp"]) > 1
        if overlap:
            assumed.append("TP communication overlap on (the NeMo / Megatron-Bridge performance recipes enable "
                           "tp_comm_overlap with sequence parallelism; not stated per row)")
    ep_overlap = _recipe_names_row(RECIPE_EP_COMM_OVERLAP, r)
    if ep_overlap:
        assumed.append("expert-parallel all-to-all overlap on (the row's Megatron-Bridge recipe turns on "
                       "overlap_moe_expert_parallel_comm: calibration.RECIPE_EP_COMM_OVERLAP)")
    flex_dispatch = _recipe_names_row(RECIPE_FLEX_DISPATCH, r)
    if flex_dispatch:
        assumed.append("DeepEP / HybridEP token dispatch (the row's Megatron-Bridge recipe sets enable_deepep or "
                       "moe_flex_dispatcher_backend: Megatron-Core's flex dispatcher; calibration.RECIPE_FLEX_DISPATCH)")
    grad_reduce_overlap = not _recipe_names_row(RECIPE_NO_GRAD_REDUCE_OVERLAP, r)
    if not grad_reduce_overlap:
        assumed.append("gradient reduce-scatter not overlapped with the backward (the row's Megatron-Bridge recipe "
                       "sets overlap_grad_reduce=False: calibration.RECIPE_NO_GRAD_REDUCE_OVERLAP)")
    bf16_grads = engine == "megatron"
    if bf16_grads:
        assumed.append("gradients kept and reduced in bf16 (grad_reduce_in_fp32=False: Megatron-Bridge's "
                       "scripts/performance/configs/llama/llama3_llm_pretrain.py set_llama3_common_configs, "
                       "NeMo's fp8 performance scripts; not stated per row)")
    # Megatron-Bridge's fp8 precision presets (src/megatron/bridge/training/mixed_precision.py:
    # bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_delayed_scaling_mixed, bf16_with_mxfp8_mixed)
    # set fp8_param_gather=True; its blockwise (subchannel) preset does not
    fp8_params = (engine == "megatron" and h100_source(str(r["source"])) == "Megatron-Bridge"
                  and dtype in ("fp8", "fp8-delayed", "mxfp8"))
    if fp8_params:
        assumed.append("fp8 parameters (fp8_param_gather=True in Megatron-Bridge's fp8 precision presets; "
                       "not stated per row)")
    rope_fusion = not (nvidia_recipe and str(r["model"]).strip().lower() in RECIPE_UNFUSED_ROPE_MODELS)
    if not rope_fusion:
        assumed.append("rotary embedding unfused (Megatron-Core's apply_rope_fusion default, False, which the "
                       "row's Megatron-Bridge model provider and recipe keep: calibration.RECIPE_UNFUSED_ROPE_MODELS)")
    offload, offload_params = offload_of_cell(r["offload"], assumed)
    if offload != "none" and engine != "deepspeed":
        engine, bf16_grads, fp8_params = "deepspeed", False, False
        assumed.append("engine = deepspeed: optimizer offload is DeepSpeed's (ZeRO-Offload / ZeRO-Infinity)")
    offload_layers = _recipe_activation_offload_layers(r)
    if offload_layers:
        assumed.append(f"activations of {offload_layers} layers offloaded to host memory (the row's Megatron-Bridge "
                       "recipe: calibration.RECIPE_ACTIVATION_OFFLOAD_LAYERS)")
    first_layers, last_layers = _recipe_stage_layers(r)
    if first_layers or last_layers:
        assumed.append(f"pipeline layout of the row's Megatron-Bridge recipe: {first_layers} layers on the first "
                       f"stage, {last_layers} on the last (calibration.RECIPE_STAGE_LAYERS)")
    if model.mtp_layers:
        assumed.append(f"multi-token prediction, depth {model.mtp_layers}, on the last stage")
    attention_kernel = _source_attention_kernel(r, assumed)
    try:
        cluster = load_cluster(system, n)
        plan = Plan(tp=_int(r["tp"]), pp=_int(r["pp"]), dp=_int(r["dp"]), cp=cp, sp=sp and _int(r["tp"]) > 1,
                    vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", micro_batch=_int(r["micro_batch"]),
                    zero=zero, recompute=recompute, dtype=dtype, ep=ep, engine=engine,
                    grad_accumulation_fusion=engine != "torchtitan", tp_comm_overlap=overlap,
                    grad_reduce_bf16=bf16_grads, fp8_param_gather=fp8_params, ep_comm_overlap=ep_overlap,
                    moe_flex_dispatch=flex_dispatch, overlap_grad_reduce=grad_reduce_overlap,
                    recompute_modules=modules, rope_fusion=rope_fusion,
                    offload=offload, offload_params=offload_params,
                    first_stage_layers=first_layers, last_stage_layers=last_layers,
                    offload_activation_layers=offload_layers, attention_kernel=attention_kernel)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    job = TrainingJob(seq_len=_int(r["seq_len"]), global_batch=_int(r["global_batch"]))
    try:
        plan = check_plan(plan, model, job, cluster)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    if infer_recompute:
        plan = _lightest_fitting_recompute(model, job, cluster, plan, assumed)
    step = measured_step_time_s(r["measured_metric"], float(r["measured_value"]), r["measured_unit"],
                                job.global_batch, job.seq_len, n, model, _peak_16bit(cluster))
    label = f"{r['model']} {r['gpu']} x{n} tp{plan.tp} pp{plan.pp} dp{plan.dp} cp{cp} ep{ep} {dtype}"
    return CalibrationCase(i, h100_source(str(r["source"])), label, model, job, cluster, plan, step, tuple(assumed))


def load_h100_cases(csv_path: Path | str = H100_CSV) -> tuple[list[CalibrationCase], list[tuple[int, str, str]]]:
    """(usable cases, skipped rows as (row, source, reason)) of the H100/Blackwell file."""
    return _load(csv_path, case_from_h100_row, h100_source)
