"""The H100-class and Blackwell file (data/published_runs_calibration_h100.csv): NeMo 24.07's performance
summary, Megatron-Bridge's performance archive and torchtitan's async-TP benchmark, mostly fp8.

Models come from the presets (the file leaves most architectures out); the engine from the source (NeMo
and Megatron-Bridge run Megatron-Core, their Megatron FSDP rows its ZeRO-3); what each engine's rows
take where their cells are blank, and the recipe facts of single runs (DeepEP dispatch, expert
all-to-all overlap, recomputed modules, the pipeline layout (and the MTP depth it places), offloaded activations, an unfused rotary
embedding, the attention kernel), come from the file's sidecar (recipes.py). Each is said in the
case's ``assumed``.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from paraplan.calibration.cases import (CalibrationCase, lightest_fitting_recompute, lightest_fitting_settings,
                                        say_unstated_vpp, system_of_row_gpu)
from paraplan.calibration.cells import (CONFIG_DEFAULT_SEQ, THROUGHPUT_METRICS, batch_contradiction, blank,
                                        cases_of_table, cp_sp,
                                        dtype_of_precision, int_cell, is_gpt_mlp, measured_step_time_s,
                                        notes_say_async_tp, offload_of_cell, params_mismatch, peak_16bit, preset_with_row_shape,
                                        read_runs_file, recompute_of_cell, row_notes, source_counts_causal_half,
                                        vocab_from_notes,
                                        zero_stage)
from paraplan.calibration.recipes import Recipes, a100_recipes, h100_recipes
from paraplan.costmodels.estimate import estimate
from paraplan.engines import spec_named
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import MEGATRON_FSDP_STRATEGY, Plan, PipelineLayout, check_plan, read_megatron_layout
from paraplan.workloads.names import model_preset_for_name
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import MoESpec, TrainingJob, TransformerModel

H100_CSV = h100_recipes().csv
#: where the assumptions a recipe fact adds point to
SIDECAR = h100_recipes().path.name


def h100_source(source: str) -> str:
    """How the H100 file's tables name a source (its sidecar's sources), else the source as written."""
    return h100_recipes().source_name(source)


def source_name(source: str) -> str:
    """A source's short name by either file's sidecar (the H100 file's first)."""
    short = h100_source(source)
    return short if short != source else a100_recipes().source_name(source)


def engine_of_source(source: str, assumed: list) -> str:
    """The engine a source's runs trained with, by the sidecar's engines table; any other source runs as
    the default engine (its recipe's defaults are then not assumed), said in ``assumed``."""
    recipes = h100_recipes()
    found = recipes.engine_of(source)
    if found is None:
        assumed.append(recipes.default_engine_note.format(source=source_name(source)))
        return recipes.default_engine
    return found


def _blanks_filled_from_notes(r: pd.Series, assumed: list) -> pd.Series:
    """A row with the blanks its notes and its engine's defaults fill: the sequence length its notes
    give as the config default (a guess the file marks), and the global batch as the local batch times
    the data-parallel (FSDP) degree, the global batch when no gradient accumulation is configured (none
    is stated)."""
    r = r.copy()
    m = CONFIG_DEFAULT_SEQ.search(row_notes(r))
    if blank(r["seq_len"]) and m:
        r["seq_len"] = int(m.group(1))
        assumed.append(f"sequence length {m.group(1)} (not stated; the row's notes: torchtitan config default, a guess)")
    if blank(r["global_batch"]) and not blank(r["micro_batch"]) and not blank(r["dp"]):
        r["global_batch"] = int_cell(r["micro_batch"], "micro_batch") * int_cell(r["dp"], "dp")
        assumed.append("global batch = local batch x FSDP degree (torchtitan without gradient accumulation; "
                       "not stated)")
    return r


def _model_from_columns(r: pd.Series, recipes: Recipes, assumed: list) -> TransformerModel | str:
    """The model a row's architecture columns describe when its name has no preset, or why there is
    none. The columns do not give the MLP's activation or the key/value heads: an MLP 4x the hidden
    width is taken as GELU (GPT), any other as SwiGLU (Llama-style), and attention as multi-head; both
    are said in ``assumed``. MoE columns give the experts (each as wide as ffn_hidden)."""
    missing = [k for k in ("layers", "hidden", "heads") if blank(r[k])]
    if missing:
        return f"no preset for model {r['model']!r} and its architecture is blank ({', '.join(missing)})"
    vocab = None if blank(r["vocab"]) else int_cell(r["vocab"], "vocab")
    if vocab is None:
        vocab = vocab_from_notes(row_notes(r), 1 if blank(r["tp"]) else int_cell(r["tp"], "tp")) or recipes.blank_vocab
        assumed.append(f"vocab = {vocab:,d}: not stated" + (" (the notes' figure, padded as Megatron pads it)"
                                                            if vocab != recipes.blank_vocab else
                                                            f" ({recipes.blank_vocab_note})"))
    h = int_cell(r["hidden"], "hidden")
    ffn = None if blank(r["ffn_hidden"]) else int_cell(r["ffn_hidden"], "ffn_hidden")
    gelu = is_gpt_mlp(ffn, h)
    assumed.append(f"model {r['model']!r} from the row's columns: {'GELU' if gelu else 'SwiGLU'} MLP (ffn_hidden "
                   f"{'4x' if gelu else 'not 4x'} hidden), multi-head attention, untied embeddings (not stated)")
    moe = None
    if not blank(r["moe_experts"]):
        moe = MoESpec(experts=int_cell(r["moe_experts"], "moe_experts"), top_k=1 if blank(r["moe_topk"]) else int_cell(r["moe_topk"], "moe_topk"),
                      expert_ffn_hidden=ffn or 4 * h)
    try:
        return TransformerModel(name=str(r["model"]), layers=int_cell(r["layers"], "layers"), hidden=h,
                                heads=int_cell(r["heads"], "heads"), vocab=vocab, ffn_hidden=ffn,
                                activation="gelu" if gelu else "swiglu", rotary=not gelu, tied_embeddings=False,
                                moe=moe)
    except (ConfigError, ValueError) as e:
        return f"model {r['model']!r}: its columns do not make a model ({e})"


def model_of_layout(model: TransformerModel, layout: PipelineLayout) -> TransformerModel:
    """The model with the multi-token-prediction depth its pipeline layout places: Megatron-Core builds the
    layout's "m" blocks and asserts that they number mtp_num_layers
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, validate_layer_layout), so a layout with an
    MTP block is a run with that depth whatever the row's model name says."""
    depth = sum(layout.mtp)
    return model if depth == model.mtp_layers else replace(model, mtp_layers=depth)


def pipeline_layout_note(layout: PipelineLayout) -> str:
    """The ranks' layers of a layout as an assumption says them: "4 layers on the first stage, 4 on each of
    14 middle ones, 1 on the last, with 1 MTP block"."""
    counts, mtp = layout.layers, sum(layout.mtp)
    middle = sorted(set(counts[1:-1]))
    mid = (f"{middle[0]} on each of {len(counts) - 2} middle ones" if len(middle) == 1
           else f"{', '.join(map(str, counts[1:-1]))} on the middle ones")
    ranks = [r for r, n in enumerate(layout.mtp) if n]
    where = "the last" if ranks == [len(counts) - 1] else "stage " + ", ".join(map(str, ranks))
    return (f"{counts[0]} layers on the first stage, {mid}, {counts[-1]} on the last"
            + (f", with {mtp} MTP block{'s' if mtp > 1 else ''} on {where}" if mtp else ", no MTP block"))


def case_from_h100_row(i: int, r: pd.Series) -> CalibrationCase | str:
    """A calibration case from the H100/Blackwell file, or the reason the row is skipped (module docstring)."""
    if r["measured_metric"] not in THROUGHPUT_METRICS:
        return f"metric {r['measured_metric']} is not a throughput"
    recipes = h100_recipes()
    assumed: list[str] = []
    preset = recipes.preset_of_model(r["model"])
    if preset is None:
        preset = model_preset_for_name(r["model"])
    model = (preset_with_row_shape(load_model(preset), r, assumed) if preset
             else _model_from_columns(r, recipes, assumed))
    if isinstance(model, str):
        return model
    mismatch = params_mismatch(model, r)
    if mismatch:
        return mismatch
    system = system_of_row_gpu(r["gpu"], recipes.gpu_systems, assumed)
    if system is None:
        return assumed[-1]
    found_engine = recipes.engine_of(str(r["source"]))
    if found_engine is not None and recipes.engine_defaults[found_engine].fill_from_notes:
        r = _blanks_filled_from_notes(r, assumed)
    missing = [k for k in ("seq_len", "num_gpus", "tp", "pp", "dp", "global_batch", "micro_batch") if blank(r[k])]
    if missing:
        return "configuration incomplete: " + ", ".join(missing) + " blank"
    micro_batch = int_cell(r["micro_batch"], "micro_batch")
    contradiction = batch_contradiction(r)
    fact = recipes.fact("micro_batch", r)
    if fact is not None:
        micro_batch = fact.value
        assumed.append((f"{contradiction}: " if contradiction else "")
                       + f"micro-batch {fact.value}, as the row's recipe sets it ({SIDECAR})")
    elif contradiction:
        assumed.append(f"{contradiction}: read as the global batch and micro-batch stated; the fit and step time "
                       "rest on that reading")
    dtype = dtype_of_precision(str(r["precision"]), assumed)
    if not dtype:
        return (f"precision {r['precision']!r} not understood (bf16, fp16, FP8-CS, FP8-DS / delayed, FP8-MX / "
                "mxfp8, float8 tensorwise / rowwise, NVFP4, MXFP4 are)")
    cp, sp, cp_mode = cp_sp(r["cp_or_sp"])
    engine = engine_of_source(str(r["source"]), assumed)
    defaults = recipes.engine_defaults[engine]
    if dtype in defaults.unmodelled_precisions:
        return (f"precision {r['precision']!r} on a {engine} row: {defaults.unmodelled_precisions[dtype]}; "
                f"paraplan's {engine} engine does not model it (its low-precision recipes: "
                f"{', '.join(spec_named(engine).fp8_recipes) or 'none'}); leave the row out or name the engine "
                "the run used in the source column")
    zero = zero_stage(r["zero_stage"], default=defaults.zero)
    if blank(r["zero_stage"]):
        assumed.append(defaults.zero_note)
    if defaults.megatron_fsdp and zero in MEGATRON_FSDP_STRATEGY:     # a stage outside 0-3 is refused below
        assumed.append(f"Megatron FSDP: Megatron-LM at ZeRO-{zero} (--use-megatron-fsdp, sharding strategy "
                       f"{MEGATRON_FSDP_STRATEGY[zero]}, double-buffered)")
    rec = "none" if blank(r["recompute"]) else str(r["recompute"]).lower()
    # not stated: a NeMo / Megatron-Bridge recipe row runs without (or with its recipe's modules: its
    # memory is where paraplan's estimate is least sure, some of those runs estimate over the GPU);
    # any other source's run is taken to have used the lightest recomputation that fits
    infer_recompute = blank(r["recompute"]) and not defaults.performance_recipe
    if blank(r["recompute"]) and defaults.performance_recipe:
        assumed.append("no activation recomputation (not stated)")
    recompute = recompute_of_cell(rec, assumed)
    if recompute == "selective" and defaults.selective_recompute != "selective":
        recompute = defaults.selective_recompute
        assumed.append(defaults.selective_recompute_note)
    fact = recipes.fact("recompute_modules", r) if blank(r["recompute"]) else None
    modules = fact.value if fact is not None else ""
    if modules:
        recompute = "selective"
        assumed[-1] = f"selective recomputation of {modules} (the row's Megatron-Bridge recipe: {SIDECAR})"
    vpp = 1 if blank(r["vpp"]) else int_cell(r["vpp"], "vpp")
    ep = 1 if blank(r["ep"]) else int_cell(r["ep"], "ep")
    fact = recipes.fact("ep", r)
    if fact is not None:
        assumed.append(f"expert parallelism {fact.value}, not the {ep} the row states: the row's recipe sets it "
                       f"and the source's later run of this layout states it ({SIDECAR})")
        ep = fact.value
    if model.moe is None and ep > 1:
        return "ep > 1 on a dense model"
    fact = recipes.fact("moe_capacity_factor", r)
    if fact is not None and model.moe is not None:
        model = replace(model, moe=replace(model.moe, capacity_factor=fact.value))
        assumed.append("token-drop variant: expert capacity factor 1.0, inputs padded to capacity (Megatron-Bridge's "
                       "token-drop recipes: moe_expert_capacity_factor 1.0, moe_pad_expert_input_to_capacity)")
    fact = recipes.fact("dropout", r, preset=preset)
    if fact is not None and model.dropout:
        model = replace(model, dropout=fact.value)
        assumed.append("no dropout (NeMo's GPTConfig175B: hidden_dropout = attention_dropout = 0.0)")
    n = int_cell(r["num_gpus"], "num_gpus")
    if defaults.tp_is_sequence_parallel:
        sp = int_cell(r["tp"], "tp") > 1
    overlap = {"async_tp_in_notes": sp and notes_say_async_tp(r),
               "recipe": sp and int_cell(r["tp"], "tp") > 1}.get(defaults.tp_overlap, False)
    if overlap and defaults.tp_overlap_note:
        assumed.append(defaults.tp_overlap_note)
    ep_overlap = recipes.fact("ep_comm_overlap", r) is not None
    if ep_overlap:
        assumed.append("expert-parallel all-to-all overlap on (the row's Megatron-Bridge recipe turns on "
                       f"overlap_moe_expert_parallel_comm: {SIDECAR})")
    flex_dispatch = recipes.fact("moe_flex_dispatch", r) is not None
    if flex_dispatch:
        assumed.append("DeepEP / HybridEP token dispatch (the row's Megatron-Bridge recipe sets enable_deepep or "
                       f"moe_flex_dispatcher_backend: Megatron-Core's flex dispatcher; {SIDECAR})")
    grad_reduce_overlap = recipes.fact("overlap_grad_reduce", r) is None
    if not grad_reduce_overlap:
        assumed.append("gradient reduce-scatter not overlapped with the backward (the row's Megatron-Bridge recipe "
                       f"sets overlap_grad_reduce=False: {SIDECAR})")
    bf16_grads = defaults.grad_reduce_bf16
    if bf16_grads:
        assumed.append(defaults.grad_reduce_bf16_note)
    entry = recipes.source_entry(str(r["source"]))
    fp8_params = entry is not None and dtype in entry.fp8_param_gather_dtypes
    if fp8_params:
        assumed.append("fp8 parameters (fp8_param_gather=True in Megatron-Bridge's fp8 precision presets; "
                       "not stated per row)")
    te_cross_entropy = entry is not None and entry.te_cross_entropy and spec_named(engine).offers("te_cross_entropy")
    if te_cross_entropy:
        assumed.append("loss as Transformer Engine's fused cross-entropy, gradient written over the 16-bit logits "
                       "(Megatron-Bridge's performance overrides: cross_entropy_fusion_impl=\"te\"; not stated per row)")
    # Megatron-Core's precision-aware optimizer: where the source's scripts turn it on for the row's dtype, or
    # the row's recipe names its moments' dtype; with the distributed optimizer only (Megatron-Bridge turns it
    # off under Megatron-FSDP)
    moments, stated_off = recipes.fact("optimizer_state_dtype", r), recipes.fact("precision_aware_optimizer", r)
    aware = (moments is not None or (entry is not None and dtype in entry.precision_aware_optimizer_dtypes)) \
        and zero == 1 and spec_named(engine).offers("precision_aware_optimizer") and stated_off is None
    optimizer_state_dtype = moments.value if aware and moments is not None else "fp32"
    if aware:
        assumed.append(f"Megatron-Core's precision-aware optimizer, {optimizer_state_dtype} moments ("
                       + (f"the row's recipe: {SIDECAR}" if moments is not None else
                          f"{entry.precision_aware_optimizer_source}; not stated per row") + ")")
    rope_fusion = recipes.fact("rope_fusion", r, read_on=engine) is None
    if not rope_fusion:
        assumed.append("rotary embedding unfused (Megatron-Core's apply_rope_fusion default, False, which the "
                       f"row's Megatron-Bridge model provider and recipe keep: {SIDECAR})")
    offload, offload_params = offload_of_cell(r["offload"], assumed)
    switched = recipes.optimizer_offload_switch(engine) if offload != "none" else None
    if switched:
        engine, bf16_grads, fp8_params, te_cross_entropy, aware = switched, False, False, False, False
        optimizer_state_dtype = "fp32"
        assumed.append(recipes.optimizer_offload_note)
    fact = recipes.fact("activation_offload_layers", r)
    offload_layers = fact.value if fact is not None else 0
    if offload_layers:
        assumed.append(f"activations of {offload_layers} layers offloaded to host memory (the row's Megatron-Bridge "
                       f"recipe: {SIDECAR})")
    fact = recipes.fact("pipeline_layout", r)
    first_layers = last_layers = 0
    if fact is not None:
        layout = read_megatron_layout(fact.value, int_cell(r["pp"], "pp"))
        if layout.vpp != vpp:
            return f"the recipe's pipeline layout {fact.value!r} has vpp {layout.vpp}, the row states {vpp} ({SIDECAR})"
        model, stages = model_of_layout(model, layout), pipeline_layout_note(layout)
        if layout.vpp == 1:
            first_layers, last_layers = layout.layers[0], layout.layers[-1]
            assumed.append(f"pipeline layout of the row's Megatron-Bridge recipe, {fact.value}: {stages} ({SIDECAR})")
        else:
            assumed.append(f"pipeline layout of the row's Megatron-Bridge recipe, {fact.value}: {stages}; priced with "
                           f"the automatic split of {vpp} chunks a rank (uneven interleaved stages are not modelled; "
                           f"{SIDECAR})")
    if model.mtp_layers:
        assumed.append(f"multi-token prediction, depth {model.mtp_layers}, on the last stage")
    expandable_segments = recipes.fact("expandable_segments", r) is not None
    if expandable_segments:
        assumed.append("PyTorch's allocator with expandable segments (the row's Megatron-Bridge launcher sets "
                       f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: {SIDECAR})")
    fact = recipes.fact("attention_kernel", r)
    attention_kernel = fact.value if fact is not None else "auto"
    if fact is not None:
        assumed.append(fact.note)
    try:
        cluster = load_cluster(system, n)
        plan = Plan(tp=int_cell(r["tp"], "tp"), pp=int_cell(r["pp"], "pp"), dp=int_cell(r["dp"], "dp"), cp=cp, cp_mode=cp_mode or "ring",
                    sp=sp and int_cell(r["tp"], "tp") > 1, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
                    micro_batch=micro_batch, zero=zero, recompute=recompute, dtype=dtype, ep=ep,
                    engine=engine, grad_accumulation_fusion=recipes.engine_defaults[engine].grad_accumulation_fusion,
                    tp_comm_overlap=overlap, grad_reduce_bf16=bf16_grads, fp8_param_gather=fp8_params,
                    ep_comm_overlap=ep_overlap, moe_flex_dispatch=flex_dispatch,
                    overlap_grad_reduce=grad_reduce_overlap, recompute_modules=modules, rope_fusion=rope_fusion,
                    te_cross_entropy=te_cross_entropy, expandable_segments=expandable_segments,
                    precision_aware_optimizer=aware, optimizer_state_dtype=optimizer_state_dtype,
                    offload=offload, offload_params=offload_params,
                    first_stage_layers=first_layers, last_stage_layers=last_layers,
                    offload_activation_layers=offload_layers, attention_kernel=attention_kernel)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    forced = entry is not None and entry.forced_balanced_routing and model.moe is not None
    if forced and not model.moe.capacity_factor:
        assumed.append("MoE routing balanced (the source's performance scripts force the router to balance: "
                       f"{entry.forced_balanced_routing_source})")
    job = TrainingJob(seq_len=int_cell(r["seq_len"], "seq_len"), global_batch=int_cell(r["global_batch"], "global_batch"),
                      moe_imbalance=1.0 if forced else None)
    try:
        plan = check_plan(plan, model, job, cluster)
    except ConfigError as e:
        return f"layout not expressible: {e}"
    say_unstated_vpp(job, plan, not blank(r["vpp"]), assumed)
    if infer_recompute:
        plan = lightest_fitting_recompute(model, job, cluster, plan, assumed)
    elif defaults.performance_recipe:
        # the recipe's recomputation is read as stated (none unless it names modules), and so are the
        # memory switches the sidecar gives for the source; the others are the lightest that fit
        stated = {"recompute"} | ({"zero"} if not blank(r["zero_stage"]) else set()) \
            | ({"fp8_param_gather"} if entry is not None and entry.fp8_param_gather_dtypes else set()) \
            | ({"precision_aware_optimizer", "optimizer_state_dtype"}
               if (entry is not None and entry.precision_aware_optimizer_source) or stated_off is not None else set())
        # (kept only where they make it fit: a switch that does not is not what the run needed)
        notes: list[str] = []
        lighter = lightest_fitting_settings(model, job, cluster, plan, stated, notes)
        if lighter is plan or estimate(model, job, cluster, lighter).feasible:
            plan, assumed = lighter, assumed + notes
        else:
            assumed.append("the memory switches the source leaves unstated kept as read: none of them makes the "
                           "estimate fit")
    step = measured_step_time_s(r["measured_metric"], float(r["measured_value"]), r["measured_unit"],
                                job.global_batch, job.seq_len, n, model, peak_16bit(cluster),
                                source_counts_causal_half(r["source"], row_notes(r)))
    label = f"{r['model']} {r['gpu']} x{n} tp{plan.tp} pp{plan.pp} dp{plan.dp} cp{cp}{f' ({cp_mode})' if cp_mode else ''} ep{ep} {dtype}"
    return CalibrationCase(i, h100_source(str(r["source"])), label, model, job, cluster, plan, step, tuple(assumed))


def load_h100_cases(csv_path: Path | str = H100_CSV) -> tuple[list[CalibrationCase], list[tuple[int, str, str]]]:
    """(usable cases, skipped rows as (row, source, reason)) of the H100/Blackwell file."""
    return cases_of_table(read_runs_file(csv_path), case_from_h100_row, h100_source)
