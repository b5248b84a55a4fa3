"""torchtitan launch configs: a Python config registry for torchtitan 0.3.0 (the default), or the TOML
job config of torchtitan 0.2.x (``--torchtitan-format toml``, for users still on it).

torchtitan 0.3.0 (torchtitan/config/manager.py) reads no job files: ``--module M --config F`` names a
Python function returning a ``Trainer.Config`` and ``--section.key value`` overrides its fields. The
export is such a module: it starts from torchtitan's own registry function for the model
(``llama3_8b``, ``deepseek_v3_671b``, ...), sets the plan's fields from :data:`SETTINGS`-style
dictionaries (``section -> {key: value}``, the shape ``Trainer.Config.to_dict()`` prints), picks the
activation-checkpointing policy (``SelectiveAC`` is op-level SAC, ``FullAC`` full recomputation) and
the fp8 converters (in the model spec, which no command-line override reaches). The dictionaries are
literals, so ``paraplan.planner.readers`` reads the export back without running it.

Data parallelism maps by ZeRO stage: 0 -> DDP (data_parallel_replicate_degree) when dp is the only
axis, 2-3 -> FSDP2 (data_parallel_shard_degree; reshard after forward at 3). The plan given is the
nearest plan torchtitan runs (``paraplan.planner.runnable``). ConfigError for fp16 (torchtitan trains
in bf16 or fp32 only).
"""
from __future__ import annotations

import json
import pprint
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Mapping

from paraplan.costmodels.pipeline import V_SCHEDULES
from paraplan.engines import TORCHTITAN, EngineSpec
from paraplan.errors import ConfigError
from paraplan.plan import Plan, virtual_stage_layer_counts
from paraplan.planner.export_common import (MTP_NOTE, RDZV_PORT, SDPA_BACKEND_OF_KERNEL, TRAIN_ITERS, Export,
                                            Scenario, headline)

# paraplan preset -> torchtitan (model, flavor, its config_registry function): torchtitan 0.3.0
# torchtitan/models/{llama3,deepseek_v3,qwen3}/config_registry.py and their model_registry flavors
# (deepseek_v3 "671B": 61 layers, dim 7168, 256 experts top-8, 1 shared, 3 dense, MLA q_lora 1536)
TITAN_MODELS = {"llama3-8b": ("llama3", "8B", "llama3_8b"), "llama3-70b": ("llama3", "70B", "llama3_70b"),
                "llama3-405b": ("llama3", "405B", "llama3_405b"),
                "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"),
                "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b")}
#: the base for a model torchtitan has no flavor of: its Llama-3 8B (or DeepSeek-V3 671B for MoE / MLA)
TITAN_DENSE_BASE = ("llama3", "8B", "llama3_8b")
TITAN_MOE_BASE = ("deepseek_v3", "671B", "deepseek_v3_671b")
#: activation-checkpointing policy per plan recomputation (torchtitan 0.3.0
#: torchtitan/distributed/activation_checkpoint.py ActivationCheckpointingConfig: tyro subcommands
#: selective | full | memory-budget | none; SelectiveAC is per-op SAC)
AC_POLICY = {"op-sac": "selective", "full": "full", "none": "none"}
AC_CLASS = {"selective": "SelectiveAC", "full": "FullAC"}


@dataclass(frozen=True)
class TitanFormat:
    """One torchtitan config format: the release it targets, its fp8 recipes (paraplan fp8 dtype ->
    (converter, recipe_name)), the attention kernels a plan can name for it (the others run as the
    nearest plan, ``auto``) and whether it has an expert-tensor-parallel degree."""
    target: str
    fp8_recipes: Mapping[str, tuple]
    attention_kernels: tuple
    expert_tensor_parallel: bool


_TT = TORCHTITAN.export
#: the formats ``export --torchtitan-format`` writes. ``python``: torchtitan 0.3.0, the engine spec's
#: export mapping (paraplan/engines/specs.py: its fp8 converters, FlexAttention, no expert TP). ``toml``:
#: 0.2.2's [quantize.linear.float8] recipe_name tensorwise | rowwise | rowwise_with_gw_hp,
#: [quantize.linear.mx]; its models run torch SDPA inside ScaledDotProductAttentionWrapper
#: (torchtitan/models/attention.py: cuDNN, flash, math, set_priority); Parallelism.expert_tensor_parallel_degree
TORCHTITAN_FORMATS = {
    "python": TitanFormat(_TT.target, _TT.fp8_recipes, _TT.attention_kernels, _TT.expert_tensor_parallel),
    "toml": TitanFormat("torchtitan 0.2.2", {"fp8": ("quantize.linear.float8", "tensorwise"),
                                              "fp8-rowwise": ("quantize.linear.float8", "rowwise"),
                                              "mxfp8": ("quantize.linear.mx", "mxfp8_cublas")},
                        ("auto", "cudnn", "flash2", "efficient"), True),
}


def titan_model(s: Scenario) -> tuple[tuple[str, str, str], list[str]]:
    """(model, flavor, registry function) for the plan's model, and a note where torchtitan has none."""
    m = s.model
    if s.model_spec in TITAN_MODELS:
        return TITAN_MODELS[s.model_spec], []
    base = TITAN_MOE_BASE if (m.moe is not None or m.mla) else TITAN_DENSE_BASE
    return base, [
        f"torchtitan has no flavor for this model: the config starts from its {base[2]} and its model_spec must be "
        f"replaced by one registered in torchtitan's {base[0]} model registry with dim={m.hidden}, n_layers={m.layers}, "
        f"n_heads={m.heads}, n_kv_heads={m.kv_heads}, vocab_size={m.vocab}, FFN width {m.ffn_hidden}"
        + (f", multi-head latent attention (q_lora_rank={m.mla.q_lora_rank}, kv_lora_rank={m.mla.kv_lora_rank}, "
           f"qk_nope_head_dim={m.head_dim}, qk_rope_head_dim={m.mla.qk_rope_head_dim}, v_head_dim={m.mla.v_head_dim})"
           if m.mla else f", head_dim={m.head_dim}" if m.q_hidden != m.hidden else "")
        + (f", MoE: {m.moe.experts} routed experts of width {m.moe.expert_ffn_hidden}, top-{m.moe.top_k}, "
           f"{m.moe.shared_experts} shared, {m.moe_layers} MoE layers" if m.moe is not None else "")]


#: the schedules whose two stages a rank are placed in a V (paraplan.costmodels.pipeline.V_SCHEDULES)
V_SCHEDULE_LABELS = tuple(s.label for s in V_SCHEDULES)


def stage_modules(layers: int, p: Plan, output: str) -> list[list[str]]:
    """The modules of each pipeline model chunk in model order (parallelism.module_fqns_per_model_part):
    the plan's layers per (virtual) stage (2·pp chunks under ZBV and DualPipeV), the embedding on the
    first, the final norm and ``output`` (the LM head: ``lm_head`` in 0.3.0, ``output`` in 0.2.x) on the last."""
    chunks, at = [], 0
    shape = SimpleNamespace(pp=p.pp, vpp=2) if p.schedule in V_SCHEDULE_LABELS else p     # two chunks a rank
    for c in virtual_stage_layer_counts(layers, shape):
        chunks.append([f"layers.{i}" for i in range(at, at + c)])
        at += c
    chunks[0].insert(0, "tok_embeddings")
    chunks[-1] += ["norm", output]
    return chunks


def titan_settings(s: Scenario, spec: EngineSpec, output: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The plan's fields as torchtitan sections (``section -> {key: value}``, 0.3.0 names), and notes."""
    p, m, notes = s.plan, s.model, []
    fmt_is_python = output == "lm_head"
    if p.dtype not in ("bf16", "fp8", "fp8-rowwise", "fp8-delayed", "fp8-blockwise", "mxfp8"):
        raise ConfigError("dtype", f"torchtitan has no {p.dtype} mixed precision (training.mixed_precision_param "
                          "accepts bfloat16 or float32)", accepted="bf16 or an fp8 dtype")
    if p.zero == 0 and p.model_parallel == 1:
        replicate, shard, reshard = p.dp, 1, None
    else:
        replicate, shard = 1, p.dp
        reshard = "default" if p.zero == 3 else "never"
    pp = p.pp > 1
    training: dict[str, Any] = {
        # with a pipeline one step holds all micro-batches of the DP rank: no gradient accumulation
        "local_batch_size": s.global_batch // p.dp if pp else p.micro_batch,
        "global_batch_size": s.global_batch, "seq_len": s.seq_len, "steps": TRAIN_ITERS,
        "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"}   # the estimate reduces in fp32
    if fmt_is_python:      # 0.3.0 captures CUDA graphs by default, which the estimate does not price (and which
        training["disable_cuda_graphs"] = True     # refuse pipelines and host-synced expert dispatch)
    parallelism: dict[str, Any] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard}
    if reshard:
        parallelism["fsdp_reshard_after_forward"] = reshard
    parallelism["tensor_parallel_degree"] = p.tp
    if m.moe is not None:
        parallelism["expert_parallel_degree"] = p.ep
    parallelism.update(pipeline_parallel_degree=p.pp, context_parallel_degree=p.cp)
    if pp:
        parallelism.update(pipeline_parallel_schedule=spec.export.schedules[p.schedule],
                           pipeline_parallel_microbatch_size=p.micro_batch,
                           module_fqns_per_model_part=stage_modules(m.layers, p, output))
    # the estimate prices compiled blocks (fused casts, gradient sums); async TP needs the model compiled.
    # ZBVZeroBubble and DualPipeV refuse compiled stages ("not supported with stage modules that have used
    # torch.compile", torch/distributed/pipelining/schedules.py, PyTorch 2.13)
    v_shape = pp and p.schedule in spec.export.eager_schedules
    if v_shape:
        notes.append(f"{spec.export.schedules[p.schedule]} places two stages on every rank in a V (rank r: stages r "
                     f"and {2 * p.pp - 1}-r) and refuses torch.compile'd stages, so compile is off; the estimate "
                     "priced compiled blocks (fused casts and elementwise kernels) and is optimistic by that much")
    compile_: dict[str, Any] = {"enable": not v_shape, "components": ["model", "loss"]}
    if p.tp_comm_overlap:
        compile_["enable_async_tensor_parallel"] = True
    if s.model.mtp_layers:
        notes.append(MTP_NOTE.format(engine=spec.title))
    if not fmt_is_python:
        notes += sdpa_wrapper_note(p)
    return {"training": training, "parallelism": parallelism, "compile": compile_}, notes


def sdpa_wrapper_note(p: Plan) -> list[str]:
    """How to pin a named attention kernel under torchtitan 0.2.x, whose ScaledDotProductAttentionWrapper
    runs every call under its own ``sdpa_kernel(sdpa_backends, set_priority=True)`` (cuDNN first;
    torchtitan 0.2.2 torchtitan/models/attention.py), which replaces any backend choice made around the
    step. Nothing for ``auto`` or ``cudnn``, the backend it runs first."""
    if not p.flash_attention or p.attention_kernel in ("auto", "cudnn"):
        return []
    return [f"the plan was priced with the {p.attention_kernel} attention kernel; torchtitan's "
            f"ScaledDotProductAttentionWrapper tries cuDNN first inside every call (a sdpa_kernel context around "
            f"the step does not reach it): set torchtitan.models.attention.ScaledDotProductAttentionWrapper."
            f"sdpa_backends = [SDPBackend.{SDPA_BACKEND_OF_KERNEL[p.attention_kernel]}] before the model is built"]


def build_torchtitan(s: Scenario, spec: EngineSpec, fmt: str = "python") -> Export:
    """A torchtitan config in ``fmt`` (:data:`TORCHTITAN_FORMATS`) for the nearest plan it runs."""
    (name, flavor, function), notes = titan_model(s)
    settings, more = titan_settings(s, spec, "lm_head" if fmt == "python" else "output")
    notes += more
    target = TORCHTITAN_FORMATS[fmt].target
    if fmt == "toml":
        return Export(spec.label, _toml(s, name, flavor, settings, notes, target), notes, True, target)
    return Export(spec.label, _python(s, name, flavor, function, settings, notes, target), notes, True, target)


def _fp8_converter(p: Plan, fmt: str) -> tuple | None:
    recipes = TORCHTITAN_FORMATS[fmt].fp8_recipes
    return recipes.get(p.dtype)


def _python(s: Scenario, name: str, flavor: str, function: str, settings, notes, target: str) -> str:
    p = s.plan
    ac = AC_POLICY[p.recompute]
    fp8 = _fp8_converter(p, "python")
    module = f"paraplan_{''.join(c if c.isalnum() else '_' for c in s.model_spec)}"
    launch = (f"PYTHONPATH=$(dirname THIS_FILE):$PYTHONPATH torchrun --nnodes {s.hosts} --nproc-per-node "
              f"{s.procs_per_host} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:{RDZV_PORT} -m torchtitan.train "
              f"--module {module} --config paraplan_job   (save this file as {module}.py)")
    converters = "None"
    if fp8 is not None:
        cls, recipe = fp8
        args = "model_compile_enabled=True" + (f", recipe_name={recipe!r}" if recipe else "")
        converters = f"[{cls}.Config({args})]"
    imports = [f"from torchtitan.models.{name} import model_registry",
               f"from torchtitan.models.{name}.config_registry import {function}"]
    if ac in AC_CLASS:
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {AC_CLASS[ac]}")
    if fp8 is not None:
        imports.append(f"from torchtitan.components.quantization import {fp8[0]}")
    lines = ["# torchtitan config registry written by `paraplan export --to torchtitan`.",
             f"# Plan: {headline(s)}",
             f"# Targets {target}: its ConfigManager loads the function below (torchtitan/config/manager.py).",
             f"# Launch on every node: {launch}",
             *(f"# NOTE: {n}" for n in notes),
             '"""paraplan export for torchtitan (see the comments above)."""',
             *sorted(imports), "",
             f"TORCHTITAN_VERSION = {target.split()[-1]!r}",
             f"MODEL = {name!r}",
             f"FLAVOR = {flavor!r}",
             f"BASE_CONFIG = {function!r}",
             f"ACTIVATION_CHECKPOINT = {ac!r}   # selective: SelectiveAC (op-level SAC); full: FullAC; none",
             f"FP8 = {list(fp8) if fp8 else None!r}   # [converter, recipe_name]",
             "SETTINGS = " + pprint.pformat(settings, width=110, sort_dicts=False), "", "",
             "def paraplan_job():",
             f'    """torchtitan\'s {function} with the plan\'s layout."""',
             f"    config = {function}()",
             f"    config.model_spec = model_registry({flavor!r}, converters={converters})",
             "    for section, values in SETTINGS.items():",
             "        for key, value in values.items():",
             "            setattr(getattr(config, section), key, value)",
             "    config.activation_checkpoint = " + (f"{AC_CLASS[ac]}.Config()" if ac in AC_CLASS else "None"),
             "    return config", ""]
    return "\n".join(lines)


def _toml(s: Scenario, name: str, flavor: str, settings, notes, target: str) -> str:
    """The 0.2.x TOML job config (torchtitan 0.2.2 torchtitan/config/job_config.py): async TP under
    [parallelism], compile under [compile], fp8 converters named quantize.linear.*, op-level SAC as mode
    selective with selective_ac_option "op"."""
    p = s.plan
    training, parallelism, compile_ = (dict(settings[k]) for k in ("training", "parallelism", "compile"))
    training.pop("disable_cuda_graphs", None)
    if compile_.pop("enable_async_tensor_parallel", False):
        parallelism["enable_async_tensor_parallel"] = True
    if s.model.moe is not None:
        parallelism["expert_tensor_parallel_degree"] = p.etp
    model: list[tuple[str, Any]] = [("name", name), ("flavor", flavor)]
    sections: list[tuple[str, list[tuple[str, Any]]]] = []
    fp8 = _fp8_converter(p, "toml")
    if fp8 is not None:
        converter, recipe = fp8
        model.append(("converters", [converter]))
        items: list[tuple[str, Any]] = [("recipe_name", recipe)]
        if p.dtype == "fp8" and p.zero >= 1:     # per-tensor scaling under FSDP: float8 all-gather
            items += [("enable_fsdp_float8_all_gather", True), ("precompute_float8_dynamic_scale_for_fsdp", True)]
        sections.append((converter, items))
    ac = AC_POLICY[p.recompute]
    sections = [("job", [("description", f"paraplan export: {s.model_spec} {p.label()}"), ("dump_folder", "./outputs")]),
                ("model", model), ("training", list(training.items())), ("parallelism", list(parallelism.items())),
                ("compile", list(compile_.items())), *sections,
                ("activation_checkpoint", [("mode", ac)] + ([("selective_ac_option", "op")] if ac == "selective" else []))]
    head = ["# torchtitan job config written by `paraplan export --to torchtitan --torchtitan-format toml`.",
            f"# Plan: {headline(s)}",
            f"# Targets {target} (the last release that reads TOML job configs: torchtitan/config/job_config.py);",
            "# torchtitan 0.3.0 reads Python config registries: export without --torchtitan-format toml. Launch with",
            f"#   torchrun --nnodes {s.hosts} --nproc-per-node {s.procs_per_host} --rdzv-backend c10d "
            f"--rdzv-endpoint $MASTER_ADDR:{RDZV_PORT} -m torchtitan.train --job.config_file THIS_FILE",
            *(f"# NOTE: {n}" for n in notes)]
    body = []
    for title, items in sections:
        body.append(f"\n[{title}]")
        body += [f"{k} = {_toml_value(v)}" for k, v in items]
    return "\n".join(head + body) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML form for {v!r}")
