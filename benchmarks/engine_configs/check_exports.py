"""Parse every export of a corpus (corpus.py) with the engines' own configuration code; count rejections.

    python benchmarks/engine_configs/check_exports.py CORPUS_DIR [--torchtitan022 DIR]

Runs in the engines' venv (requirements.txt beside this file), never imports paraplan:
* Megatron-LM: the flags after pretrain_gpt.py become megatron-core 0.16.1's TransformerConfig (or
  MLATransformerConfig), DistributedDataParallelConfig and OptimizerConfig, as Megatron-LM's
  core_transformer_config_from_args builds them (a field per argparse dest, its renames), so their
  __post_init__ checks run; a flag that is no field and no recorded Megatron-LM training argument is a
  rejection. Megatron-LM's parser and validate_args ship in no wheel (see requirements.txt); the batch
  arithmetic validate_args checks is repeated here.
* DeepSpeed 0.19.8: deepspeed.runtime.config.DeepSpeedConfig on the JSON, with the data-parallel size as
  its mpu reports it (its batch arithmetic and ZeRO / offload pydantic configs).
* torchtitan 0.3.0: ConfigManager().parse_args(["--module", M, "--config", "paraplan_job"]) on the
  exported module, then ParallelDims(world_size) and the pipeline schedule class; 0.2.2 (TOML): its
  ConfigManager with --job.config_file, in a subprocess with 0.2.2 first on sys.path.
* DeepSpeed's spec facts (facts.json): the optimizers 0.19.8 has (runtime/config.py DEEPSPEED_OPTIMIZERS), no
  delayed parameter update (runtime/zero/offload_config.py).
* The torchtitan spec's facts (facts.json, written by corpus.py) against the installed 0.3.0: each fp8
  converter and recipe exists and no per-tensor recipe is left out (components/quantization/float8.py
  Float8LinearConverter.Config.recipe_name), no expert-tensor-parallel degree unless the spec says so
  (config/configs.py ParallelismConfig), no SDPA backend for language models unless the spec names kernels
  (models/common/config_utils.py get_attention_config).
Prints, per engine and release, exports checked, rejections (target 0) and each rejection's message.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

# Megatron-LM arguments that are no field of megatron-core's config classes (megatron/training/arguments.py:
# data, tokenizer, schedule length, checkpointing and the flags validate_args turns into config fields)
MEGATRON_TRAINING_ARGS = {
    "seq_length", "max_position_embeddings", "position_embedding_type", "vocab_size", "tokenizer_type", "mock_data",
    "micro_batch_size", "global_batch_size", "train_iters", "lr", "ckpt_format", "untie_embeddings_and_output_weights",
    "disable_bias_linear", "swiglu", "group_query_attention", "use_flash_attn", "num_layers_per_virtual_pipeline_stage",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "num_experts", "fp8_param_gather", "bf16", "fp16", "fp8_format",
    "no_gradient_accumulation_fusion", "no_masked_softmax_fusion", "no_rope_fusion", "cp_comm_type",
    "use_megatron_fsdp", "data_parallel_sharding_strategy", "fsdp_double_buffer", "grad_reduce_in_bf16",
    "moe_layer_freq", "use_distributed_optimizer", "optimizer_cpu_offload", "use_precision_aware_optimizer",
    "overlap_param_gather", "overlap_grad_reduce", "cpu_offloading", "cpu_offloading_num_layers", "normalization",
    "num_virtual_stages_per_pipeline_rank", "pipeline_model_parallel_layout", "attention_backend",
    # renamed into config fields below: --fp4-format (dest fp4), --fp4-param-gather (fp4_param), --squared-relu
    # (activation_func); --hybrid-override-pattern is pretrain_mamba.py's, read by its MambaModel builder
    # (megatron/training/arguments.py, NVIDIA/Megatron-LM core_v0.16.1)
    "fp4_format", "fp4_param_gather", "squared_relu", "hybrid_override_pattern",
}

#: the Megatron-LM entry points an export runs (GPT-style models; hybrid Mamba-2 / attention models)
MEGATRON_SCRIPTS = r"pretrain_(gpt|mamba)\.py"


def megatron_args(text: str) -> tuple[dict, int]:
    joined = re.sub(r"\\\n", " ", text)
    line = next(x for x in joined.splitlines() if re.search(MEGATRON_SCRIPTS, x) and not x.startswith("#"))
    tokens = [t for t in shlex.split(line) if t != "$@"]
    at = next(i for i, t in enumerate(tokens) if t.endswith(("pretrain_gpt.py", "pretrain_mamba.py")))
    launch = tokens[1:at]
    gpus = int(launch[launch.index("--nnodes") + 1]) * int(launch[launch.index("--nproc-per-node") + 1])
    args, i, rest = {}, 0, tokens[at + 1:]
    while i < len(rest):
        dest = rest[i][2:].replace("-", "_")
        values = []
        i += 1
        while i < len(rest) and not rest[i].startswith("--"):
            values.append(rest[i])
            i += 1
        args[dest] = True if not values else values[0] if len(values) == 1 and dest != "recompute_modules" else values
    return args, gpus


def check_megatron(text: str, gpus: int) -> None:
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    a, world = megatron_args(text)
    cls = MLATransformerConfig if a.get("multi_latent_attention") else TransformerConfig
    tfields = {f.name for f in dataclasses.fields(cls)}
    dfields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    ofields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    unknown = [k for k in a if k not in tfields | dfields | ofields | MEGATRON_TRAINING_ARGS]
    if unknown:
        raise ValueError(f"not a Megatron-LM argument: {unknown}")
    dtype = torch.float16 if a.get("fp16") else torch.bfloat16
    ints = lambda v: int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v    # noqa: E731
    kw = {k: ints(v) for k, v in a.items() if k in tfields}
    kw.update(params_dtype=dtype, pipeline_dtype=dtype, bf16=not a.get("fp16"), fp16=bool(a.get("fp16")),
              deallocate_pipeline_outputs=True, add_bias_linear=not a.get("disable_bias_linear"),
              gradient_accumulation_fusion=not a.get("no_gradient_accumulation_fusion"),
              masked_softmax_fusion=not a.get("no_masked_softmax_fusion"), apply_rope_fusion=not a.get("no_rope_fusion"),
              num_query_groups=int(a["num_query_groups"]) if a.get("group_query_attention") else None)
    if "num_experts" in a:
        kw["num_moe_experts"] = int(a["num_experts"])
    if "moe_layer_freq" in a:
        kw["moe_layer_freq"] = eval(a["moe_layer_freq"], {})       # Megatron-LM's moe_freq_type evaluates a list
    for src, dst in (("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
                     ("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage")):
        if src in a:
            kw[dst] = int(a[src])
    if a.get("fp8_param_gather"):
        kw["fp8_param"] = True
    if "fp8_format" in a:
        kw["fp8"] = a["fp8_format"]
    if "fp4_format" in a:
        kw["fp4"] = a["fp4_format"]
    if a.get("fp4_param_gather"):
        kw["fp4_param"] = True
    if a.get("squared_relu"):
        from megatron.core.activations import squared_relu
        kw["activation_func"] = squared_relu
    if a.get("swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if "cp_comm_type" in a:
        kw["cp_comm_type"] = a["cp_comm_type"]
    if "attention_backend" in a:
        kw["attention_backend"] = AttnBackend[a["attention_backend"]]
    if "num_layers_per_virtual_pipeline_stage" in a:
        pp = int(a.get("pipeline_model_parallel_size", 1))
        kw["virtual_pipeline_model_parallel_size"] = int(a["num_layers"]) // (pp * int(a["num_layers_per_virtual_pipeline_stage"]))
    if a.get("recompute_modules") is not None:
        kw["recompute_modules"] = list(a["recompute_modules"])
    if "pipeline_model_parallel_layout" in a:
        kw["pipeline_model_parallel_layout"] = a["pipeline_model_parallel_layout"]
    if a.get("cpu_offloading"):
        kw["cpu_offloading"] = True
    if a.get("use_flash_attn") and "attention_backend" not in a:
        kw["attention_backend"] = AttnBackend.flash if False else AttnBackend.auto
    # the checks that need Transformer Engine (a CUDA build) are left to a GPU machine: its fused RoPE and
    # MoE permutation (import-time TE checks in __post_init__); every other check runs
    kw.update(apply_rope_fusion=False, moe_permute_fusion=False)
    cls(**kw)                                     # __post_init__: megatron-core's own checks
    DistributedDataParallelConfig(
        overlap_grad_reduce=bool(a.get("overlap_grad_reduce")), overlap_param_gather=bool(a.get("overlap_param_gather")),
        use_distributed_optimizer=bool(a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp")),
        grad_reduce_in_fp32=not a.get("grad_reduce_in_bf16"),
        **{k: a[k] for k in ("data_parallel_sharding_strategy", "use_megatron_fsdp", "fsdp_double_buffer") if k in a
           and k in dfields})
    # the precision-aware optimizer's moments as Megatron-LM's training.py get_megatron_optimizer_config turns the
    # --exp-avg-dtype / --exp-avg-sq-dtype names into torch dtypes (fp8 is torch.uint8, Transformer Engine's FusedAdam)
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.uint8}
    OptimizerConfig(lr=float(a.get("lr", 1e-4)), bf16=not a.get("fp16"), fp16=bool(a.get("fp16")), params_dtype=dtype,
                    use_distributed_optimizer=bool(a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp")),
                    **{k: dtypes[a[k]] for k in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype",
                                                 "main_grads_dtype") if k in a},
                    **{k: True for k in ("optimizer_cpu_offload", "use_precision_aware_optimizer") if a.get(k)})
    # validate_args's batch arithmetic (megatron/training/arguments.py; not shipped in a wheel)
    mp = int(a.get("tensor_model_parallel_size", 1)) * int(a.get("pipeline_model_parallel_size", 1)) \
        * int(a.get("context_parallel_size", 1))
    if world % mp:
        raise ValueError(f"world size {world} not divisible by tp*pp*cp {mp}")
    dp = world // mp
    if int(a["global_batch_size"]) % (int(a.get("micro_batch_size", 1)) * dp):
        raise ValueError("global batch size not divisible by micro batch size times data-parallel size")


def check_deepspeed(text: str, dp: int) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    import deepspeed.comm as ds_dist
    if not ds_dist.is_initialized():         # one gloo rank, so that DeepSpeedConfig asks the mpu for the dp size
        # On a CPU machine deepspeed.comm's TorchBackend JIT-compiles its shared-memory all-reduce kernel
        # (ShareMemCommBuilder, deepspeed/comm/torch.py build_shm_op) unless the op is marked incompatible:
        # minutes of C++ on a fresh CI machine for a kernel one rank checking configs never calls
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        shm = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if shm is not None:
            deepspeed.ops.__compatible_ops__[shm.NAME] = False
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)

    class Topology:             # the mpu interface DeepSpeedConfig reads the data-parallel size from
        def get_data_parallel_world_size(self):
            return dp

    DeepSpeedConfig(json.loads(text), mpu=Topology())


def check_torchtitan(path: Path, gpus: int) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    sys.path.insert(0, str(path.parent))
    try:
        sys.modules.pop(path.stem, None)
        config = ConfigManager().parse_args(["--module", path.stem, "--config", "paraplan_job"])
    finally:
        sys.path.remove(str(path.parent))
    par = config.parallelism
    ParallelDims.from_config(par, world_size=gpus)
    if par.pipeline_parallel_degree > 1:
        get_schedule_class(par.pipeline_parallel_schedule)
    shard = par.data_parallel_shard_degree
    if par.expert_parallel_degree > 1 and (shard * par.context_parallel_degree * par.tensor_parallel_degree) \
            % par.expert_parallel_degree:
        raise ValueError("expert parallel degree does not divide dp_shard * cp * tp (torchtitan's mesh constraint)")


def check_torchtitan_facts(facts: dict) -> list[str]:
    """What the torchtitan spec's export mapping says the installed release runs, held against its code:
    the list of facts that do not hold (empty when all do)."""
    import typing

    import torchtitan.components.quantization as quantization
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.models.common.config_utils import get_attention_config

    wrong = []
    float8_recipes = set(typing.get_args(typing.get_type_hints(
        quantization.Float8LinearConverter.Config)["recipe_name"]))
    for dtype, (cls, recipe) in facts["fp8_recipes"].items():
        converter = getattr(quantization, cls, None)
        if converter is None:
            wrong.append(f"fp8 {dtype}: torchtitan.components.quantization has no {cls}")
        elif recipe and cls == "Float8LinearConverter" and recipe not in float8_recipes:
            wrong.append(f"fp8 {dtype}: Float8LinearConverter recipe_name {recipe!r} not in {sorted(float8_recipes)}")
    named = {r for c, r in facts["fp8_recipes"].values() if c == "Float8LinearConverter"}
    if "tensorwise" in float8_recipes and "tensorwise" not in named:
        wrong.append("fp8: Float8LinearConverter takes recipe_name 'tensorwise', the spec says it has none")
    has_etp = "expert_tensor_parallel_degree" in {f.name for f in dataclasses.fields(ParallelismConfig)}
    if has_etp != facts["expert_tensor_parallel"]:
        wrong.append(f"ParallelismConfig expert_tensor_parallel_degree: {has_etp}, the spec says "
                     f"{facts['expert_tensor_parallel']}")
    try:
        get_attention_config("sdpa")
        sdpa = True
    except ValueError:
        sdpa = False
    if sdpa != (facts["attention_kernels"] != ["auto"]):
        wrong.append(f"attention: get_attention_config('sdpa') {'accepted' if sdpa else 'refused'}, the spec names "
                     f"kernels {facts['attention_kernels']}")
    return wrong


#: paraplan optimizer -> DeepSpeed's optimizer type name (deepspeed/runtime/config.py, lowercased)
DEEPSPEED_OPTIMIZER_NAMES = {"adam": "adam", "onebit-adam": "onebitadam", "zero-one-adam": "zerooneadam",
                             "onebit-lamb": "onebitlamb"}


def check_deepspeed_facts(facts: dict) -> list[str]:
    """The DeepSpeed spec's export mapping against the installed release: the optimizers it says the
    release has (export_optimizers) are DEEPSPEED_OPTIMIZERS, the spec's others are not, and its offload
    config has a delayed parameter update only where the spec says so."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    wrong = []
    runs = set(facts["export_optimizers"] or facts["optimizers"])
    for opt in facts["optimizers"]:
        has = DEEPSPEED_OPTIMIZER_NAMES[opt] in DEEPSPEED_OPTIMIZERS
        if has != (opt in runs):
            wrong.append(f"optimizer {opt}: {'in' if has else 'not in'} DEEPSPEED_OPTIMIZERS, the spec says "
                         f"{'it runs' if opt in runs else 'it does not'}")
    delayed = any("delay" in name for name in DeepSpeedZeroOffloadOptimizerConfig.model_fields)
    if delayed != facts["delayed_update"]:
        wrong.append(f"offload_optimizer delayed update field: {delayed}, the spec says {facts['delayed_update']}")
    return wrong


#: messages of checks that need a GPU build: torchtitan's float8 converters build only with torchao on SM89+,
#: megatron-core's fp8 checks and its precision-aware optimizer's (OptimizerConfig.__post_init__, after its adam and
#: distributed-optimizer asserts) read Transformer Engine's version and FusedAdam
NEEDS_GPU = ("torchao is not installed", "only supported on NVIDIA SM89", "'>=' not supported between instances of "
             "'NoneType' and 'Version'", "requires FusedAdam from TransformerEngine")

TT022 = """
import sys, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from torchtitan.config.manager import ConfigManager
bad = []
for path in sys.argv[1:]:
    try:
        ConfigManager().parse_args(["--job.config_file", path])
    except BaseException as e:
        bad.append(path + ": " + type(e).__name__ + ": " + str(e)[:300])
print("\\n".join(bad))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--torchtitan022", type=Path, help="a folder holding torchtitan 0.2.2 (pip install --target)")
    args = ap.parse_args()
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    versions = {}
    for pkg in ("megatron.core", "deepspeed", "torchtitan"):
        mod = __import__(pkg, fromlist=["__version__"])
        versions[pkg] = getattr(mod, "__version__", "?")
    try:
        from importlib.metadata import version
        versions["torchtitan"] = version("torchtitan")
        versions["megatron.core"] = version("megatron-core")
    except Exception:
        pass
    print(f"engine code: megatron-core {versions['megatron.core']}, deepspeed {versions['deepspeed']}, "
          f"torchtitan {versions['torchtitan']}" + (", torchtitan 0.2.2 (TOML)" if args.torchtitan022 else ""))
    counts: dict[str, list] = {}
    toml, unchecked = [], []
    seconds: dict[str, float] = {}
    t0 = time.time()
    for m in manifest:
        path = args.corpus / m["file"]
        key = f"{m['engine']} -> {m['target']}"
        if m["format"] == "toml":
            toml.append((key, path))
            continue
        counts.setdefault(key, [0, []])
        counts[key][0] += 1
        started = time.time()
        try:
            if m["engine"] == "megatron":
                check_megatron(path.read_text(), m["gpus"])
            elif m["engine"] == "deepspeed":
                cfg = json.loads(path.read_text())
                check_deepspeed(path.read_text(), cfg["train_batch_size"] // (cfg["train_micro_batch_size_per_gpu"]
                                                                               * cfg["gradient_accumulation_steps"]))
            else:
                check_torchtitan(path, m["gpus"])
        except BaseException as e:         # noqa: BLE001 - the engines raise anything from asserts to SystemExit
            text = f"{type(e).__name__}: {str(e)[:300]}"
            if any(n in text for n in NEEDS_GPU):
                unchecked.append(f"{m['file']}: {text}")
            else:
                counts[key][1].append(f"{m['file']}: {text}")
        seconds[key] = seconds.get(key, 0.0) + time.time() - started
    if toml and args.torchtitan022:
        key = toml[0][0]
        started = time.time()
        env = dict(os.environ, PYTHONPATH=str(args.torchtitan022))
        res = subprocess.run([sys.executable, "-c", TT022, *map(str, (p for _, p in toml))], env=env,
                             capture_output=True, text=True)
        bad = [x for x in res.stdout.splitlines() if x.strip()]
        if res.returncode:
            bad.append(f"torchtitan 0.2.2 check failed: {res.stderr[-500:]}")
        counts[key] = [len(toml), bad]
        seconds[key] = time.time() - started
    facts = args.corpus / "facts.json"
    wrong = []
    if facts.exists():
        known = json.loads(facts.read_text())
        wrong = check_torchtitan_facts(known["torchtitan"]) + check_deepspeed_facts(known["deepspeed"])
    total_bad = len(wrong)
    for key, (n, bad) in sorted(counts.items()):
        total_bad += len(bad)
        print(f"{key}: {n} exports parsed by the engine's own code, {len(bad)} rejected ({seconds.get(key, 0):.0f} s)")
        for b in bad:
            print(f"  REJECTED {b}")
    if facts.exists():
        print(f"spec facts against torchtitan {versions['torchtitan']} (fp8 converters, expert TP, attention) and "
              f"deepspeed {versions['deepspeed']} (optimizers, delayed update): {len(wrong)} wrong")
    for w in wrong:
        print(f"  WRONG FACT {w}")
    for u in unchecked:
        print(f"  UNCHECKED ON CPU {u}")
    print(f"checked {sum(n for n, _ in counts.values())} exports in {time.time() - t0:.0f} s; {total_bad} rejected or wrong; "
          f"{len(unchecked)} exports left unchecked (fp8 recipes and the precision-aware optimizer: their checks read "
          "Transformer Engine, a CUDA build; megatron-core's own asserts before that ran)")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
