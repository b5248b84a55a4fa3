"""The A100 / V100 file (data/published_runs_calibration.csv): Megatron-LM 2020 and 2021, llm-foundry,
the BLOOM prototypes, Korthikanti et al. 2022 (held out).

Each throughput row becomes (model, job, cluster, plan, measured step time) and each peak-memory row a
memory case. GPT-style rows give their architecture in columns; GPU and model names outside the
file's own tables are read by hardware/names.py and workloads/names.py ("A100-SXM4-80GB", "Llama 3.1
70B"); a row that leaves the architecture blank takes the preset its model name denotes. A row is used
only when its configuration is complete (shape, GPUs, every degree, batch); rows that leave a field
blank are reported as skipped with the missing field. What the source states beyond the columns
(engine, cluster, gradient-reduce overlap, held out) is the sidecar's (recipes.py); inferences made
for complete rows are listed per row in ``assumed``.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from paraplan.calibration.cases import (CalibrationCase, MemoryCase, lightest_fitting_recompute,
                                        say_unstated_vpp, system_of_row_gpu)
from paraplan.calibration.cells import (THROUGHPUT_METRICS, VOCAB_IN_NOTES, blank, cases_of_table, cp_sp,
                                        dtype_of_precision, int_cell, is_gpt_mlp, measured_step_time_s,
                                        notes_guess_full_recompute, offload_of_cell, params_mismatch,
                                        peak_16bit, preset_with_row_shape, read_runs_file, recompute_of_cell, row_notes,
                                        source_counts_causal_half, vocab_from_notes,
                                        zero_stage)
from paraplan.calibration.recipes import a100_recipes
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, check_plan
from paraplan.workloads.names import model_preset_for_name
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import MoESpec, TrainingJob, TransformerModel

DEFAULT_CSV = a100_recipes().csv
#: the columns that make two rows of the A100 file the same run (a step time and its peak memory)
RUN_COLUMNS = ("source", "model", "gpu", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len")


def short_source(source: str) -> str:
    """How the A100 file's tables name a source (its sidecar's sources), else the source as written."""
    return a100_recipes().source_name(source)


def case_from_row(i: int, r: pd.Series) -> CalibrationCase | str:
    """A calibration case, or the reason the row is skipped."""
    if r["measured_metric"] == "peak_memory_per_gpu":
        return "a peak-memory row (load_memory_cases scores those)"
    if r["measured_metric"] not in THROUGHPUT_METRICS:
        return f"metric {r['measured_metric']} is not a throughput"
    entry = a100_recipes().source_entry(str(r["source"]))
    if entry is not None and entry.held_out:
        return entry.held_out
    setup = _setup_from_row(r)
    if isinstance(setup, str):
        return setup
    model, job, cluster, plan, assumed, src, gbs, mb = setup
    step = measured_step_time_s(r["measured_metric"], float(r["measured_value"]), r["measured_unit"], gbs,
                                job.seq_len, cluster.num_gpus, model, peak_16bit(cluster),
                                source_counts_causal_half(r["source"], row_notes(r)))
    return CalibrationCase(i, src, _row_label(r, cluster, plan, mb, job), model, job, cluster, plan, step,
                           tuple(assumed))


def _row_label(r: pd.Series, cluster, plan: Plan, mb: int, job: TrainingJob) -> str:
    """How an A100-file row is named in tables: model, GPU, count and layout."""
    return f"{r['model']} {r['gpu']} x{cluster.num_gpus} tp{plan.tp} pp{plan.pp} dp{plan.dp} mb{mb} s{job.seq_len}"


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


def load_cases(csv_path: Path | str = DEFAULT_CSV) -> tuple[list[CalibrationCase], list[tuple[int, str, str]]]:
    """(usable cases, skipped rows as (row, source, reason)) of the A100 file."""
    return cases_of_table(read_runs_file(csv_path), case_from_row, short_source)


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


def _richer_preset_of_same_shape(r: pd.Series) -> str | None:
    """The preset a row's model name denotes when the row's columns give its shape (layers, hidden,
    heads) and the preset has what the columns cannot say (grouped-query attention, a gated MLP):
    Llama-family rows written with their shape. GPT-style presets are left to the columns."""
    name = model_preset_for_name(r["model"])
    if name is None:
        return None
    m = load_model(name)
    same = (m.layers, m.hidden, m.heads) == (int_cell(r["layers"], "layers"), int_cell(r["hidden"], "hidden"), int_cell(r["heads"], "heads"))
    return name if same and (m.activation != "gelu" or m.kv_heads != m.heads) else None


def _setup_from_row(r: pd.Series):
    """(model, job, cluster, plan, assumptions, short source, global batch, micro-batch) of a row of
    the A100 file, or the reason it cannot be set up."""
    recipes = a100_recipes()
    notes = str(r["notes"])
    vocab_assumed = None
    if blank(r["vocab"]) and not blank(r["tp"]):
        vocab = vocab_from_notes(notes, int_cell(r["tp"], "tp"))
        if vocab is not None:
            r = r.copy()
            r["vocab"] = vocab
            vocab_assumed = (f"vocab = {vocab:,d}: the notes' '{VOCAB_IN_NOTES.search(notes).group(0)}' padded to a "
                             f"multiple of 128 x tp as Megatron pads it")
    architecture = ("layers", "hidden", "heads", "vocab")
    blank_architecture = [k for k in architecture if blank(r[k])]
    preset = model_preset_for_name(r["model"]) if blank_architecture else _richer_preset_of_same_shape(r)
    if not preset and blank_architecture == ["vocab"]:
        r = r.copy()
        r["vocab"] = recipes.blank_vocab
        vocab_assumed = f"vocab = {recipes.blank_vocab:,d}: not stated ({recipes.blank_vocab_note})"
        blank_architecture = []
        preset = _richer_preset_of_same_shape(r)
    required = (() if preset else architecture) + ("seq_len", "num_gpus", "tp", "pp", "dp", "global_batch")
    missing = [k for k in required if blank(r[k])]
    if missing:
        return "configuration incomplete: " + ", ".join(missing) + " blank"
    assumed = [vocab_assumed] if vocab_assumed else []
    system = system_of_row_gpu(r["gpu"], recipes.gpu_systems, assumed)
    if system is None:
        return assumed[-1]
    entry = recipes.source_entry(str(r["source"]))
    src = recipes.source_name(r["source"])
    if entry is not None and system in entry.systems:
        system = entry.systems[system]
        assumed.append(entry.system_note)
    if preset and blank_architecture:
        model = preset_with_row_shape(load_model(preset), r, assumed)
        if isinstance(model, str):
            return model
        assumed.append(f"architecture of the {preset} preset: the row names {r['model']!r} and leaves "
                       + ", ".join(blank_architecture) + " blank")
    elif preset:
        model = preset_with_row_shape(load_model(preset), r, assumed)
        if isinstance(model, str):
            return model
        assumed.append(f"architecture of the {preset} preset, whose shape the row's columns give (they cannot "
                       "state its grouped-query attention or gated MLP)")
    else:
        megatron_gpt = entry is not None and entry.megatron_gpt
        ffn = None if blank(r["ffn_hidden"]) else int_cell(r["ffn_hidden"], "ffn_hidden")
        gelu = is_gpt_mlp(ffn, int_cell(r["hidden"], "hidden"))
        if not gelu:
            assumed.append("SwiGLU MLP: ffn_hidden is not 4 x hidden (the GPT MLP's width)")
        model = TransformerModel(
            name=str(r["model"]), layers=int_cell(r["layers"], "layers"), hidden=int_cell(r["hidden"], "hidden"),
            heads=int_cell(r["heads"], "heads"), vocab=int_cell(r["vocab"], "vocab"), ffn_hidden=ffn,
            activation="gelu" if gelu else "swiglu", tied_embeddings=gelu, learned_positions=megatron_gpt and gelu,
            rotary=not gelu, max_positions=int_cell(r["seq_len"], "seq_len"), bias=megatron_gpt and gelu)
    dp, gbs = int_cell(r["dp"], "dp"), int_cell(r["global_batch"], "global_batch")
    if blank(r["micro_batch"]):
        mb = gbs // dp
        assumed.append(f"micro_batch = global_batch/dp = {mb} (no accumulation; not stated)")
    else:
        mb = int_cell(r["micro_batch"], "micro_batch")
    rec = str(r["recompute"]).lower()
    if blank(r["recompute"]):
        if r["measured_metric"] == "step_time" and "TFLOP/s per GPU reported" in notes:
            rec = "full"
            assumed.append("recompute = full: the reported TFLOP/s equal the 96BsLh^2 (recompute) formula")
        elif notes_guess_full_recompute(notes):
            rec = "full"
            assumed.append("recompute = full: the notes' guess (the TFLOPs the log printed count the recomputed forward)")
        else:
            rec = ""     # not stated: the lightest recomputation that fits, chosen once the plan is built
    recompute = recompute_of_cell(rec, assumed) if rec else "none"
    precision = str(r["precision"]).lower()
    if blank(r["precision"]) and "bf16" in notes.lower():
        precision = "bf16"
        assumed.append("precision = bf16: the notes' guess (not restated by the source)")
    if blank(r["precision"]) and precision != "bf16":
        dtype = "fp16"      # the A100 sources' Megatron-LM and DeepSpeed runs trained in fp16 unless they say
    else:
        dtype = dtype_of_precision(precision, assumed)
        if not dtype:       # 'fp32', 'tf32', 'mixed': not read as fp16 (as they once were), the row skipped
            return (f"precision {r['precision']!r} not understood (bf16, fp16, mixed (fp16), amp_bf16, FP8-CS, "
                    "FP8-DS / delayed, FP8-MX / mxfp8, float8 tensorwise / rowwise are)")
    flash = "flashattention" in notes.lower()
    if preset and not flash:
        flash = re.search(r"no flash|unfused|eager attention", notes, flags=re.IGNORECASE) is None
        if flash:
            assumed.append("fused (flash) attention: not stated; the preset's model postdates FlashAttention")
    vpp = 1 if blank(r["vpp"]) else int_cell(r["vpp"], "vpp")
    zero = zero_stage(r["zero_stage"], default=0)
    tp = int_cell(r["tp"], "tp")
    cp, sp, cp_mode = cp_sp(r["cp_or_sp"])
    ep = 1 if blank(r["ep"]) else int_cell(r["ep"], "ep")
    if not preset and not blank(r["moe_experts"]):
        model = replace(model, moe=MoESpec(experts=int_cell(r["moe_experts"], "moe_experts"),
                                           top_k=1 if blank(r["moe_topk"]) else int_cell(r["moe_topk"], "moe_topk"),
                                           expert_ffn_hidden=model.ffn_hidden))
        if blank(r["moe_topk"]):
            assumed.append("MoE top-k = 1 (not stated)")
    overlap = not ("DDP-impl local" in notes or (entry is not None and entry.overlap_grad_reduce is False))
    if entry is not None and entry.overlap_grad_reduce is False:
        assumed.append(entry.overlap_note)
    engine = entry.engine if entry is not None and entry.engine else recipes.default_engine
    if entry is not None and entry.engine:
        assumed.append(entry.engine_note)
    offload, offload_params = offload_of_cell(r["offload"], assumed)
    switched = recipes.optimizer_offload_switch(engine) if offload != "none" else None
    if switched:
        engine = switched
        assumed.append(recipes.optimizer_offload_note)
    try:
        plan = Plan(tp=tp, pp=int_cell(r["pp"], "pp"), dp=dp, cp=cp, cp_mode=cp_mode or "ring", sp=sp and tp > 1, ep=ep, vpp=vpp,
                    schedule="interleaved" if vpp > 1 else "1f1b", micro_batch=mb, zero=zero, recompute=recompute,
                    dtype=dtype, flash_attention=flash, overlap_grad_reduce=overlap, engine=engine,
                    offload=offload, offload_params=offload_params)
        cluster = load_cluster(system, int_cell(r["num_gpus"], "num_gpus"))
        job = TrainingJob(seq_len=int_cell(r["seq_len"], "seq_len"), global_batch=gbs)
        plan = check_plan(plan, model, job, cluster)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    say_unstated_vpp(job, plan, not blank(r["vpp"]), assumed)
    mismatch = params_mismatch(model, r)
    if mismatch:
        return mismatch
    if not rec:
        plan = lightest_fitting_recompute(model, job, cluster, plan, assumed)
    return model, job, cluster, plan, assumed, src, gbs, mb
