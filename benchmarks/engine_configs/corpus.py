"""Write the export corpus: plans covering every plan field, exported for every engine and format, each
read back into a Plan and estimated (paraplan's venv; the engines' own code checks the texts in
check_exports.py, in the engines' venv).

    python benchmarks/engine_configs/corpus.py OUT_DIR

OUT_DIR/manifest.json lists each export (engine, format, file, target release, GPUs) and the read-back
result; the exports themselves are files beside it; OUT_DIR/facts.json holds what the torchtitan and DeepSpeed specs'
export mappings say their target releases run (fp8 converters, attention kernels, expert TP; optimizers,
delayed update), which check_exports.py holds against the installed releases. Prints the counts.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from paraplan.engines import DEEPSPEED, TORCHTITAN
from paraplan.errors import ConfigError
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.readback import read_back
from paraplan.planner.export import export

# (model, cluster, gpus, seq_len, global_batch)
BASES = {
    "llama8b": ("llama3-8b", "dgx-h100", 16, 4096, 64),
    "llama70b": ("llama3-70b", "dgx-h100", 64, 4096, 256),
    "gpt1.7b": ("gpt-1.7b", "dgx-a100-80g", 8, 2048, 64),
    "qwen3moe": ("qwen3-30b-a3b", "dgx-h200", 16, 4096, 512),
    "dsv3": ("deepseek-v3", "dgx-b200", 1024, 4096, 8192),
    "llama8bB200": ("llama3-8b", "dgx-b200", 16, 4096, 64),
    "nemotronh8b": ("nemotron-h-8b", "dgx-h100", 16, 4096, 64),
    "nemotron3nano": ("nemotron3-nano-30b-a3b", "dgx-h100", 64, 8192, 768),
    "nemotron3super": ("nemotron3-super-120b-a12b", "dgx-b200", 256, 8192, 1536),
    "nemotron3supermtp": ("nemotron3-super-120b-a12b-mtp", "dgx-b200", 256, 8192, 1536),
}
# plan variations per base: every field and value the exporters read
DENSE = [
    {}, {"zero": 1}, {"zero": 2}, {"zero": 3}, {"zero": 3, "offload": "cpu"}, {"zero": 3, "offload": "nvme", "offload_params": True},
    {"zero": 1, "offload": "cpu", "delayed_update": True},
    {"tp": 2, "sp": True}, {"tp": 2, "sp": False}, {"tp": 2, "sp": True, "tp_comm_overlap": True},
    {"pp": 2, "zero": 1}, {"pp": 2, "schedule": "gpipe"}, {"pp": 2, "schedule": "zb-h1"},
    {"pp": 2, "vpp": 2, "schedule": "interleaved", "zero": 1},
    {"pp": 4, "first_stage_layers": 6, "last_stage_layers": 6, "zero": 1},
    {"tp": 2, "pp": 2, "sp": True, "zero": 1},
    {"cp": 2, "zero": 1}, {"cp": 2, "cp_mode": "ulysses", "zero": 1},
    {"recompute": "selective"}, {"recompute": "full"}, {"recompute": "op-sac"},
    {"recompute": "selective", "recompute_modules": "core_attn,layernorm,mlp"},
    {"dtype": "fp16"}, {"dtype": "fp8", "zero": 1}, {"dtype": "fp8-delayed"}, {"dtype": "fp8-rowwise"},
    {"dtype": "fp8-blockwise"}, {"dtype": "mxfp8"}, {"dtype": "fp8", "fp8_param_gather": True, "zero": 1},
    {"flash_attention": False}, {"flash_attention": False, "fused_softmax": False},
    {"attention_kernel": "cudnn"}, {"attention_kernel": "flash2"}, {"attention_kernel": "efficient"},
    {"attention_kernel": "flash1"}, {"rope_fusion": False}, {"fused_elementwise": False},
    {"overlap_grad_reduce": False}, {"grad_accumulation_fusion": False}, {"grad_reduce_bf16": True, "zero": 1},
    {"offload_activation_layers": 4}, {"optimizer": "onebit-adam"}, {"micro_batch": 2},
    {"zero": 1, "overlap_param_gather": False},
    {"zero": 1, "precision_aware_optimizer": True}, {"zero": 1, "precision_aware_optimizer": True,
                                                     "optimizer_state_dtype": "bf16"},
    {"zero": 1, "dtype": "fp8", "precision_aware_optimizer": True, "optimizer_state_dtype": "fp8"},
    {"pp": 4, "schedule": "zbv", "zero": 1}, {"pp": 4, "schedule": "dualpipev", "zero": 1},
    {"pp": 4, "schedule": "dualpipe", "zero": 1},
]
#: fp4 on a part with fp4 tensor cores (Blackwell); hybrid Mamba-2 / attention layouts
FP4 = [{"dtype": "nvfp4", "zero": 1}, {"dtype": "nvfp4", "zero": 1, "fp8_param_gather": True}, {"dtype": "mxfp4", "zero": 1}]
HYBRID = [{}, {"zero": 1}, {"tp": 2, "sp": True, "zero": 1}, {"pp": 2, "zero": 1}, {"cp": 2, "zero": 1},
          {"recompute": "full", "zero": 1}]
MOE = [{"ep": 8, "zero": 1}, {"ep": 8, "zero": 1, "moe_flex_dispatch": True}, {"ep": 8, "zero": 1, "ep_comm_overlap": True},
       {"ep": 4, "tp": 2, "sp": True, "etp": 2, "zero": 1}, {"ep": 8, "recompute": "selective",
                                                             "recompute_modules": "moe_act,layernorm", "zero": 1}]
#: hybrid Mamba-2 / attention / MoE (Nemotron 3 Nano: E layers)
HYBRID_MOE = [{"ep": 8, "tp": 2, "sp": True, "zero": 1, "micro_batch": 2}, {"ep": 8, "tp": 2, "sp": True, "zero": 1, "moe_flex_dispatch": True}]
#: Nemotron 3 Super: LatentMoE E layers (--moe-latent-size), NVFP4 on Blackwell; and with its hybrid MTP depths
HYBRID_LATENT_MOE = [{"ep": 8, "pp": 4, "zero": 1, "recompute": "selective", "recompute_modules": "layernorm,moe_act",
                      "dtype": "nvfp4"}]
DSV3 = [{"tp": 2, "sp": True, "pp": 16, "ep": 32, "zero": 1, "recompute": "full", "dtype": "fp8"},
        {"tp": 2, "sp": True, "pp": 16, "ep": 32, "zero": 1, "recompute": "full", "dtype": "fp8",
         "precision_aware_optimizer": True, "optimizer_state_dtype": "bf16"},
        {"tp": 2, "sp": True, "pp": 16, "ep": 32, "zero": 1, "recompute": "op-sac", "schedule": "zb-h1"},
        {"tp": 2, "sp": True, "pp": 16, "vpp": 2, "schedule": "interleaved", "ep": 32, "zero": 1, "recompute": "full"},
        {"tp": 2, "sp": True, "pp": 16, "ep": 32, "etp": 2, "zero": 1, "recompute": "full", "moe_flex_dispatch": True}]
PLAN_ENGINES = ("generic", "megatron", "deepspeed", "torchtitan")
TARGETS = (("megatron", "python"), ("deepspeed", "python"), ("torchtitan", "python"), ("torchtitan", "toml"))
SUFFIX = {"megatron": "sh", "deepspeed": "json", ("torchtitan", "python"): "py", ("torchtitan", "toml"): "toml"}


def plans():
    """(name, plan document) for every base, variation and the engine the plan was made for."""
    for base, (model, cluster, gpus, seq, gb) in BASES.items():
        variations = {"dsv3": DSV3, "llama8bB200": FP4, "nemotronh8b": HYBRID, "nemotron3nano": HYBRID_MOE,
                      "nemotron3super": HYBRID_LATENT_MOE, "nemotron3supermtp": HYBRID_LATENT_MOE}.get(
            base, DENSE + (MOE if base == "qwen3moe" else []))
        for i, v in enumerate(variations):
            for engine in PLAN_ENGINES:
                yield f"{base}-{i:02d}-{engine}", {
                    "schema": PLAN_SCHEMA, "estimate": {},
                    "scenario": {"model": model, "cluster": cluster, "gpus": gpus, "seq_len": seq, "global_batch": gb},
                    "plan": {**v, "engine": engine}}


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    manifest, refused, illegal = [], {}, 0
    for name, doc in plans():
        for engine, fmt in TARGETS:
            try:
                result = export(doc, engine, torchtitan_format=fmt)
            except ConfigError as err:
                if "nearest plan" in err.problem or err.field in ("cp", "sp", "tp", "zero", "schedule", "offload", "dtype"):
                    refused[engine] = refused.get(engine, 0) + 1
                else:
                    illegal += 1          # the plan breaks a rule for its own engine: not a plan
                continue
            suffix = SUFFIX.get((engine, fmt), SUFFIX.get(engine))
            stem = f"{name}.{engine}" if suffix != "py" else "tt_" + "".join(c if c.isalnum() else "_" for c in name)
            path = out / f"{stem}.{suffix}"
            path.write_text(result.text)
            rb = read_back(doc, engine, fmt)
            manifest.append({"name": name, "engine": engine, "format": fmt, "file": path.name, "target": result.target,
                             "gpus": doc["scenario"]["gpus"], "planned": doc["plan"], "summary": result.summary,
                             "same_estimate": rb.same, "read_back": rb.line})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    tt = TORCHTITAN.export
    (out / "facts.json").write_text(json.dumps({"torchtitan": {
        "target": tt.target, "fp8_recipes": tt.fp8_recipes, "attention_kernels": tt.attention_kernels,
        "expert_tensor_parallel": tt.expert_tensor_parallel},
        "deepspeed": {"target": DEEPSPEED.export.target, "optimizers": DEEPSPEED.optimizers,
                      "export_optimizers": DEEPSPEED.export.optimizers, "delayed_update": DEEPSPEED.export.delayed_update}},
        indent=1))
    by = {}
    for m in manifest:
        key = f"{m['engine']} ({m['target']})"
        by.setdefault(key, [0, 0])
        by[key][0] += 1
        by[key][1] += m["same_estimate"]
    print(f"corpus: {len(manifest)} exports of {len(list(plans()))} plans ({illegal} plan/engine pairs break a rule, "
          f"refused by paraplan's export: {refused})")
    for key, (n, same) in sorted(by.items()):
        print(f"  {key}: {n} exports, {same} read back to the same estimate")
    for m in manifest:
        if not m["same_estimate"]:
            print(f"  read-back differs: {m['file']}: {m['read_back']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/engine_configs")))
