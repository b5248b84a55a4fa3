"""Engine configs read back into a :class:`~paraplan.plan.Plan`: Megatron-LM's ``pretrain_gpt.py`` flags,
a DeepSpeed config, a torchtitan config (0.3.0 sections, the 0.2.x TOML job config).

Each reader takes the engine's own configuration as a user has it (an argument list, a JSON mapping,
a ``section -> {key: value}`` mapping, the text of an export) and returns a :class:`ReadConfig`: the
plan it describes, the job figures it names (sequence length, global batch, GPUs where the launch says
so, the model's shape where the flags give it) and, one line each, what it holds that a Plan cannot
express (``unexpressed``). Nothing here imports an engine: the readers are pure functions of text, so
they read exported configs (``paraplan export``, whose estimate the read plan must reproduce) and the
configs users' training logs print alike.

Sources for the names: Megatron-LM megatron/training/arguments.py (flags and their defaults; the
config fields megatron-core 0.16.1 reads them into), DeepSpeed docs/_pages/config-json.md and
deepspeed/runtime/config.py, torchtitan 0.3.0 torchtitan/config/configs.py and
torchtitan/distributed/activation_checkpoint.py, torchtitan 0.2.2 torchtitan/config/job_config.py.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from paraplan.engines import DEEPSPEED, MEGATRON, TORCHTITAN
from paraplan.planner.export_torchtitan import V_SCHEDULE_LABELS
from paraplan.errors import ConfigError
from paraplan.modes import OPTIMIZER_STATE_BYTES
from paraplan.plan import RECOMPUTE_MODULES, Plan, read_megatron_layout

#: Megatron-LM --fp8-recipe -> paraplan dtype (the megatron engine's export mapping, inverted)
MEGATRON_FP8 = {v: k for k, v in MEGATRON.export.fp8_recipes.items()}
MEGATRON_CP_MODE = {"p2p": "ring", "a2a": "ulysses"}
MEGATRON_FSDP_ZERO = {v: k for k, v in MEGATRON.export.fsdp_strategy.items()}
#: flags that say nothing a Plan holds (model shape, data, launch length): read into ``model`` / ignored
MEGATRON_MODEL_FLAGS = {"--num-layers": "layers", "--hidden-size": "hidden", "--ffn-hidden-size": "ffn_hidden",
                        "--num-attention-heads": "heads", "--num-query-groups": "kv_heads", "--vocab-size": "vocab",
                        "--num-experts": "experts", "--moe-router-topk": "top_k", "--mtp-num-layers": "mtp_layers",
                        "--moe-latent-size": "latent_size"}
MEGATRON_IGNORED = {
    "--group-query-attention", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--kv-channels", "--max-position-embeddings", "--position-embedding-type",
    "--normalization", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--tokenizer-type",
    "--mock-data", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-flex-dispatcher-backend", "--train-iters", "--lr",
    "--ckpt-format", "--fsdp-double-buffer", "--main-grads-dtype", "--fp8-format", "--data-path",
    "--recompute-method", "--recompute-num-layers", "--cpu-offloading", "--seq-length", "--micro-batch-size",
    "--global-batch-size", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"}
TITAN_SCHEDULES = {v: k for k, v in TORCHTITAN.export.schedules.items()}
TITAN_AC = {"selective": "op-sac", "full": "full", "none": "none", None: "none"}
#: torchtitan fp8 converter (0.3.0 class or 0.2.x name, recipe) -> paraplan dtype
TITAN_FP8 = {("Float8LinearConverter", "rowwise"): "fp8-rowwise", ("MXFP8LinearConverter", None): "mxfp8",
             ("quantize.linear.float8", "tensorwise"): "fp8", ("quantize.linear.float8", "rowwise"): "fp8-rowwise",
             ("quantize.linear.mx", "mxfp8_cublas"): "mxfp8"}

#: the Megatron-LM entry points an export runs (GPT-style models; hybrid Mamba-2 / attention models)
MEGATRON_SCRIPTS = r"pretrain_(gpt|mamba)\.py"


@dataclass(frozen=True)
class ReadConfig:
    """A parsed engine config: the plan it describes (``plan``; None where its fields break a rule, the
    reason in ``unexpressed``), the job figures it names (``seq_len``, ``global_batch``, ``gpus``), the
    model's shape where given (``model``: layers, hidden, ...), and what a Plan cannot express."""
    engine: str
    plan: Plan | None
    seq_len: int | None = None
    global_batch: int | None = None
    gpus: int | None = None
    model: Mapping[str, int] = field(default_factory=dict)
    unexpressed: tuple[str, ...] = ()


def _plan(engine: str, fields: dict[str, Any], unexpressed: list[str]) -> Plan | None:
    try:
        return Plan(engine=engine, **fields)
    except ConfigError as err:
        unexpressed.append(f"no plan: {err.field}: {err.problem}")
        return None


# --- Megatron-LM ----------------------------------------------------------------------------------------
def megatron_flags(argv: Sequence[str]) -> dict[str, Any]:
    """``--flag value...`` tokens as {flag: value, list of values, or True}; ``--flag=value`` too."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise ConfigError("argv", f"stray token {tok!r} (flags start with --)")
        if "=" in tok:
            key, value = tok.split("=", 1)
            out[key], i = value, i + 1
            continue
        values = []
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        out[tok] = True if not values else values[0] if len(values) == 1 else values
    return out


def read_megatron_args(argv: Sequence[str]) -> ReadConfig:
    """pretrain_gpt.py flags (Megatron-LM megatron/training/arguments.py) -> the plan they run."""
    f = megatron_flags(argv)
    unexpressed: list[str] = []
    num = lambda flag, default=1: int(f.get(flag, default))    # noqa: E731
    tp, pp, cp = num("--tensor-model-parallel-size"), num("--pipeline-model-parallel-size"), num("--context-parallel-size")
    layers = int(f["--num-layers"]) if "--num-layers" in f else None
    p: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "sp": "--sequence-parallel" in f,
                         "micro_batch": num("--micro-batch-size"),
                         "ep": num("--expert-model-parallel-size"), "etp": num("--expert-tensor-parallel-size", tp),
                         "overlap_grad_reduce": "--overlap-grad-reduce" in f,
                         "grad_accumulation_fusion": "--no-gradient-accumulation-fusion" not in f,
                         "fused_softmax": "--no-masked-softmax-fusion" not in f,
                         "rope_fusion": "--no-rope-fusion" not in f,
                         "tp_comm_overlap": "--tp-comm-overlap" in f,
                         "ep_comm_overlap": "--overlap-moe-expert-parallel-comm" in f,
                         "moe_flex_dispatch": f.get("--moe-token-dispatcher-type") == "flex",
                         "grad_reduce_bf16": "--grad-reduce-in-bf16" in f,
                         "fp8_param_gather": "--fp8-param-gather" in f,
                         "te_cross_entropy": ("--cross-entropy-loss-fusion" in f
                                              and f.get("--cross-entropy-fusion-impl") == "te"),
                         "offload_activation_layers": num("--cpu-offloading-num-layers", 0) if "--cpu-offloading" in f else 0}
    if p["etp"] not in (1, tp):
        unexpressed.append(f"--expert-tensor-parallel-size {p['etp']} (a plan's etp is 1 or tp)")
        p["etp"] = 1
    vpp = 1
    if "--num-layers-per-virtual-pipeline-stage" in f and layers:
        vpp = layers // (pp * int(f["--num-layers-per-virtual-pipeline-stage"]))
    elif "--num-virtual-stages-per-pipeline-rank" in f:
        vpp = int(f["--num-virtual-stages-per-pipeline-rank"])
    elif "--pipeline-model-parallel-layout" in f:
        try:
            layout = read_megatron_layout(str(f["--pipeline-model-parallel-layout"]), pp)
        except ConfigError as err:
            unexpressed.append(f"--pipeline-model-parallel-layout: {err.problem}")
        else:
            vpp, counts = layout.vpp, list(layout.layers)
            if vpp == 1:
                p["first_stage_layers"], p["last_stage_layers"] = counts[0], counts[-1]
                if len(set(counts[1:-1])) > 1:
                    unexpressed.append(f"--pipeline-model-parallel-layout with unequal middle stages {counts[1:-1]}")
            else:
                unexpressed.append(f"--pipeline-model-parallel-layout of interleaved chunks (ranks hold {counts} "
                                   "layers; a plan splits them itself)")
            if any(layout.mtp[:-1]):
                unexpressed.append("--pipeline-model-parallel-layout with MTP blocks before the last stage (a plan "
                                   "keeps them on the last)")
    p["vpp"], p["schedule"] = vpp, "interleaved" if vpp > 1 else "1f1b"
    if "--decoder-first-pipeline-num-layers" in f:
        p["first_stage_layers"] = int(f["--decoder-first-pipeline-num-layers"])
    if "--decoder-last-pipeline-num-layers" in f:
        p["last_stage_layers"] = int(f["--decoder-last-pipeline-num-layers"])
    p["zero"] = (MEGATRON_FSDP_ZERO.get(f.get("--data-parallel-sharding-strategy"), 3) if "--use-megatron-fsdp" in f
                 else 1 if "--use-distributed-optimizer" in f else 0)
    if p["zero"] >= 1 and p["overlap_grad_reduce"]:    # the export writes it beside --overlap-grad-reduce only
        p["overlap_param_gather"] = "--overlap-param-gather" in f
    granularity = f.get("--recompute-granularity") or ("selective" if "--recompute-activations" in f else None)
    p["recompute"] = granularity or "none"
    if granularity == "full" and (f.get("--recompute-method"), f.get("--recompute-num-layers")) not in (("uniform", "1"), (None, None)):
        unexpressed.append(f"--recompute-method {f.get('--recompute-method')} --recompute-num-layers "
                           f"{f.get('--recompute-num-layers')} (a plan's full recomputation is every layer)")
    if "--recompute-modules" in f:
        mods = f["--recompute-modules"]
        mods = [mods] if isinstance(mods, str) else list(mods)
        known = [m for m in mods if m in RECOMPUTE_MODULES]
        unexpressed += [f"--recompute-modules {m}" for m in mods if m not in RECOMPUTE_MODULES]
        p["recompute_modules"] = "" if known == ["core_attn"] else ",".join(known)
    p["dtype"] = ("fp16" if "--fp16" in f else MEGATRON_FP8.get(f.get("--fp4-recipe"), "nvfp4") if "--fp4-format" in f
                  else MEGATRON_FP8.get(f.get("--fp8-recipe"), "fp8") if "--fp8-format" in f
                  else "bf16" if "--bf16" in f else "fp32")
    if "--fp4-param-gather" in f:
        p["fp8_param_gather"] = True
    backend = f.get("--attention-backend")
    p["flash_attention"] = "--use-flash-attn" in f or backend in ("fused", "flash")
    p["attention_kernel"] = {"fused": "cudnn", "flash": "flash2"}.get(backend, "auto")
    if cp > 1:
        comm = f.get("--cp-comm-type", "p2p")
        if comm not in MEGATRON_CP_MODE:
            unexpressed.append(f"--cp-comm-type {comm} (a plan's cp mode is ring (p2p) or ulysses (a2a))")
        p["cp_mode"] = MEGATRON_CP_MODE.get(comm, "ring")
    if "--optimizer-cpu-offload" in f:
        unexpressed.append("--optimizer-cpu-offload (the megatron engine keeps its optimizer states on the GPU)")
    _read_precision_aware(f, p, unexpressed)
    known = (set(MEGATRON_MODEL_FLAGS) | MEGATRON_IGNORED | set(_MEGATRON_READ))
    unexpressed += [f"{k} (not read)" for k in f if k not in known]
    model = {name: int(f[flag]) for flag, name in MEGATRON_MODEL_FLAGS.items() if flag in f}
    return ReadConfig(MEGATRON.label, _plan(MEGATRON.label, p, unexpressed), int(f["--seq-length"]) if "--seq-length" in f else None,
                      int(f["--global-batch-size"]) if "--global-batch-size" in f else None, None, model,
                      tuple(unexpressed))


def _read_precision_aware(f: Mapping[str, Any], p: dict[str, Any], unexpressed: list[str]) -> None:
    """Megatron-Core's precision-aware optimizer (megatron/training/arguments.py _add_experimental_args):
    --use-precision-aware-optimizer and its moments' dtype, --exp-avg-dtype / --exp-avg-sq-dtype (a plan holds
    one dtype for both: the wider is read where they differ). Under --optimizer-cpu-offload, which Megatron-LM
    runs only with it, the states are on the host: not read (the offload is unexpressed already)."""
    if "--optimizer-cpu-offload" in f:
        return
    p["precision_aware_optimizer"] = "--use-precision-aware-optimizer" in f
    first, second = str(f.get("--exp-avg-dtype", "fp32")), str(f.get("--exp-avg-sq-dtype", "fp32"))
    known = [d for d in (first, second) if d in OPTIMIZER_STATE_BYTES]
    unexpressed += [f"--exp-avg{'-sq' * i}-dtype {d} (accepted: {', '.join(OPTIMIZER_STATE_BYTES)})"
                    for i, d in enumerate((first, second)) if d not in OPTIMIZER_STATE_BYTES]
    if len(set(known)) > 1:
        unexpressed.append(f"--exp-avg-dtype {first} with --exp-avg-sq-dtype {second} (a plan holds one dtype for "
                           "both moments: read as the wider)")
    p["optimizer_state_dtype"] = max(known, key=OPTIMIZER_STATE_BYTES.get, default="fp32")
    if str(f.get("--main-params-dtype", "fp32")) != "fp32":
        unexpressed.append(f"--main-params-dtype {f['--main-params-dtype']} (a plan's master weights are fp32)")


_MEGATRON_READ = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "--sequence-parallel",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--overlap-grad-reduce", "--overlap-param-gather",
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-rope-fusion", "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm", "--moe-token-dispatcher-type", "--grad-reduce-in-bf16", "--fp8-param-gather",
    "--cpu-offloading-num-layers", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--use-distributed-optimizer", "--recompute-granularity",
    "--recompute-activations", "--recompute-modules", "--fp16", "--bf16", "--fp8-recipe", "--attention-backend",
    "--use-flash-attn", "--cp-comm-type", "--optimizer-cpu-offload", "--fp4-format", "--fp4-recipe",
    "--fp4-param-gather", "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--main-params-dtype")


def read_megatron_script(text: str) -> ReadConfig:
    """A launch script (``paraplan export --to megatron``'s, or any torchrun line running pretrain_gpt.py):
    the pretrain_gpt.py flags, and the GPU count from torchrun's --nnodes x --nproc-per-node."""
    joined = re.sub(r"\\\n", " ", text)
    line = next((x for x in joined.splitlines() if re.search(MEGATRON_SCRIPTS, x) and not x.lstrip().startswith("#")),
                None)
    if line is None:
        raise ConfigError("script", "no line runs pretrain_gpt.py or pretrain_mamba.py")
    tokens = [t for t in shlex.split(line) if t != "$@"]
    at = next(i for i, t in enumerate(tokens) if t.endswith(("pretrain_gpt.py", "pretrain_mamba.py")))
    launcher = megatron_flags([t for t in tokens[1:at] if t.startswith("--") or not t.startswith("$")])
    read = read_megatron_args(tokens[at + 1:])
    gpus = None
    if "--nnodes" in launcher and "--nproc-per-node" in launcher:
        gpus = int(launcher["--nnodes"]) * int(launcher["--nproc-per-node"])
    return ReadConfig(read.engine, read.plan, read.seq_len, read.global_batch, gpus, read.model, read.unexpressed)


# --- DeepSpeed ------------------------------------------------------------------------------------------
def read_deepspeed_config(cfg: Mapping[str, Any]) -> ReadConfig:
    """A DeepSpeed config (deepspeed.ai/docs/config-json) -> the plan it runs. The model code decides the
    recomputation policy and attention, which a config does not say (``unexpressed``)."""
    unexpressed: list[str] = []
    mb = int(cfg.get("train_micro_batch_size_per_gpu", 1))
    gas = int(cfg.get("gradient_accumulation_steps", 1))
    batch = cfg.get("train_batch_size")
    zero = cfg.get("zero_optimization", {}) or {}
    pipe = cfg.get("pipeline", {}) or {}
    p: dict[str, Any] = {"micro_batch": mb, "zero": int(zero.get("stage", 0)), "pp": int(pipe.get("stages", 1)),
                         "tp": int((cfg.get("tensor_parallel") or {}).get("autotp_size", 1)),
                         "grad_accumulation_fusion": False,
                         "dtype": "bf16" if (cfg.get("bf16") or {}).get("enabled") else
                                  "fp16" if (cfg.get("fp16") or {}).get("enabled") else "fp32"}
    if batch is not None:
        p["dp"] = int(batch) // (mb * gas)
    if p["zero"] >= 1:
        p["overlap_grad_reduce"] = bool(zero.get("overlap_comm", False))
    off = zero.get("offload_optimizer") or {}
    if off.get("device") in ("cpu", "nvme"):
        p["offload"] = off["device"]
        p["offload_params"] = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
    if "activation_checkpointing" in cfg:
        p["recompute"] = "full" if pipe.get("activation_checkpoint_interval", 0) == 1 or p["pp"] == 1 else "selective"
        unexpressed.append("recomputation policy: the model code wraps its layers (read as full recomputation)")
    return ReadConfig(DEEPSPEED.label, _plan(DEEPSPEED.label, p, unexpressed), None,
                      int(batch) if batch is not None else None, None, {}, tuple(unexpressed))


# --- torchtitan -----------------------------------------------------------------------------------------
def read_torchtitan_sections(sections: Mapping[str, Mapping[str, Any]], activation_checkpoint: str | None = None,
                             fp8: Sequence | None = None) -> ReadConfig:
    """torchtitan sections (``training``, ``parallelism``, ``compile``, ...: 0.3.0's names, as
    ``Trainer.Config.to_dict()`` prints them; 0.2.x's ``parallelism.enable_async_tensor_parallel`` read
    too), the activation-checkpointing policy (selective = op-level SAC, full, none) and the fp8 converter
    ([converter, recipe]) -> the plan they run."""
    unexpressed: list[str] = []
    tr, par, comp = (dict(sections.get(k) or {}) for k in ("training", "parallelism", "compile"))
    tp, pp, cp = (int(par.get(k, 1)) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                                "context_parallel_degree"))
    replicate, shard = int(par.get("data_parallel_replicate_degree", 1)), int(par.get("data_parallel_shard_degree", -1))
    p: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "sp": tp > 1 and par.get("enable_sequence_parallel", True),
                         "ep": int(par.get("expert_parallel_degree", 1)), "grad_accumulation_fusion": False,
                         "tp_comm_overlap": bool(comp.get("enable_async_tensor_parallel")
                                                 or par.get("enable_async_tensor_parallel"))}
    if "expert_tensor_parallel_degree" in par:      # 0.2.x
        p["etp"] = int(par["expert_tensor_parallel_degree"])
    if shard > 0:
        p["dp"] = replicate * shard
    reshard = par.get("fsdp_reshard_after_forward", "default")
    p["zero"] = 0 if shard == 1 and replicate > 1 else 2 if reshard == "never" else 3
    if replicate > 1 and shard > 1:
        unexpressed.append(f"HSDP (replicate {replicate} x shard {shard}): read as ZeRO over dp {replicate * shard}")
    if pp > 1:
        p["micro_batch"] = int(par.get("pipeline_parallel_microbatch_size", 1))
        p["schedule"] = TITAN_SCHEDULES.get(par.get("pipeline_parallel_schedule", "1F1B"), "1f1b")
        if par.get("pipeline_parallel_schedule", "1F1B") not in TITAN_SCHEDULES:
            unexpressed.append(f"pipeline_parallel_schedule {par.get('pipeline_parallel_schedule')} (read as 1F1B)")
        chunks = par.get("module_fqns_per_model_part")
        if chunks and p["schedule"] in V_SCHEDULE_LABELS:     # two V-placed chunks a rank: one stage each
            p["vpp"] = 1
        elif chunks:
            p["vpp"] = max(1, len(chunks) // pp)
            counts = [sum(1 for n in c if str(n).startswith("layers.")) for c in chunks]
            if p["vpp"] == 1:
                p["first_stage_layers"], p["last_stage_layers"] = counts[0], counts[-1]
                if len(set(counts[1:-1])) > 1:
                    unexpressed.append(f"unequal middle pipeline stages {counts[1:-1]}")
    else:
        p["micro_batch"] = int(tr.get("local_batch_size", 1))
    # compile off (the V schedules' stages run eager): elementwise chains run as separate kernels
    p["fused_elementwise"] = bool(comp.get("enable", True))
    if tr.get("enable_cpu_offload"):
        unexpressed.append("training.enable_cpu_offload (the torchtitan engine keeps its states on the GPU)")
    p["recompute"] = TITAN_AC.get(activation_checkpoint, "none")
    if activation_checkpoint not in TITAN_AC:
        unexpressed.append(f"activation checkpointing {activation_checkpoint!r} (read as none)")
    p["dtype"] = TITAN_FP8.get(tuple(fp8), "bf16") if fp8 else "bf16"
    if tr.get("mixed_precision_param", "bfloat16") != "bfloat16":
        p["dtype"] = "fp32"
    return ReadConfig(TORCHTITAN.label, _plan(TORCHTITAN.label, p, unexpressed),
                      int(tr["seq_len"]) if "seq_len" in tr else None,
                      int(tr["global_batch_size"]) if int(tr.get("global_batch_size", -1)) > 0 else None,
                      None, {}, tuple(unexpressed))


def read_torchtitan_module(text: str) -> ReadConfig:
    """A torchtitan 0.3.0 config module written by ``paraplan export`` (its SETTINGS,
    ACTIVATION_CHECKPOINT and FP8 literals, read with ``ast.literal_eval``, never executed)."""
    names: dict[str, Any] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    if "SETTINGS" not in names:
        raise ConfigError("module", "no SETTINGS literal (not a paraplan torchtitan export)")
    return read_torchtitan_sections(names["SETTINGS"], names.get("ACTIVATION_CHECKPOINT"), names.get("FP8"))


def read_torchtitan_toml(text: str) -> ReadConfig:
    """A torchtitan 0.2.x TOML job config -> the plan it runs."""
    doc = tomllib.loads(text)
    ac = doc.get("activation_checkpoint", {})
    mode = ac.get("mode", "selective")
    unexpressed = []
    if mode == "selective" and str(ac.get("selective_ac_option", "2")) != "op":
        unexpressed.append(f"selective_ac_option {ac.get('selective_ac_option', '2')} (every n-th layer: read as full)")
        mode = "full"
    comp = dict(doc.get("compile", {}))
    sections = {"training": doc.get("training", {}), "parallelism": doc.get("parallelism", {}), "compile": comp}
    converters = doc.get("model", {}).get("converters", [])
    fp8 = None
    if converters:
        node: Any = doc
        for part in converters[0].split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        fp8 = [converters[0], node.get("recipe_name")]
    read = read_torchtitan_sections(sections, mode, fp8)
    return ReadConfig(read.engine, read.plan, read.seq_len, read.global_batch, read.gpus, read.model,
                      read.unexpressed + tuple(unexpressed))


def read_export(engine: str, text: str) -> ReadConfig:
    """The text ``paraplan export --to engine`` wrote (any torchtitan format), read back."""
    reader = EXPORT_READERS.get(engine)
    if reader is None:
        raise ConfigError("engine", f"no reader for {engine!r}", accepted=", ".join(EXPORT_READERS))
    return reader(text)


def _read_deepspeed_text(text: str) -> ReadConfig:
    return read_deepspeed_config(json.loads(text))


#: the reader of each engine's export text (torchtitan: the 0.3.0 Python module or the 0.2.2 TOML)
EXPORT_READERS = {
    MEGATRON.label: read_megatron_script,
    DEEPSPEED.label: _read_deepspeed_text,
    TORCHTITAN.label: lambda text: read_torchtitan_module(text) if "SETTINGS = " in text else read_torchtitan_toml(text),
}
