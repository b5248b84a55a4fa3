"""Launch-config export: every emitted option is a documented one, values encode the plan, batch
arithmetic holds, and what an engine cannot express is a ConfigError (or a visible note).

The documented option lists live in tests/data/engine_options.yaml with their sources.
"""
import ast
import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from paraplan.errors import ConfigError
from paraplan.planner import export as ex
from paraplan.cli.export import main as export_main
from paraplan.planfile import PLAN_SCHEMA

OPTIONS = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "engine_options.yaml").read_text())


def doc(model, cluster, gpus, seq_len, global_batch, **plan):
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": model, "cluster": cluster, "gpus": gpus, "seq_len": seq_len,
                         "global_batch": global_batch},
            "plan": plan, "estimate": {}}


# Plans covering each axis and option; all pass check_plan.
PLANS = {
    "llama70b-3d-interleaved": doc("llama3-70b", "dgx-h100", 64, 4096, 256, tp=4, pp=4, dp=4, sp=True, vpp=2,
                                   schedule="interleaved", zero=1, recompute="selective"),
    "llama8b-zero3-nvme": doc("llama3-8b", "dgx-a100-80g", 16, 2048, 64, micro_batch=2, zero=3, offload="nvme",
                              offload_params=True, recompute="full"),
    "gpt1.7b-pp-fp16": doc("gpt-1.7b", "dgx-a100-80g", 8, 2048, 64, pp=2, micro_batch=2, schedule="gpipe",
                           zero=1, recompute="full", dtype="fp16"),
    # selective recomputation (Megatron-LM's recomputes the unfused attention): 50 of 80 GiB as Megatron-LM
    # runs it (1F1B), 88 without
    "llama8b-zbh1-cp": doc("llama3-8b", "dgx-h100", 16, 8192, 32, tp=2, pp=2, cp=2, schedule="zb-h1",
                           flash_attention=False, overlap_grad_reduce=False, recompute="selective"),
    "llama8b-autotp-cpu": doc("llama3-8b", "dgx-h100", 8, 4096, 64, tp=2, zero=2, offload="cpu"),
    # DDP keeps 16 bytes a parameter on every GPU: a 3.6B model (58 GB) fits 80 GiB as every engine runs it
    "gpt3.6b-ddp": doc("gpt-3.6b", "dgx-a100-80g", 8, 2048, 32, micro_batch=4, recompute="full"),
    "qwen3-moe-ep-flex": doc("qwen3-30b-a3b", "dgx-h200", 16, 4096, 512, dp=16, ep=8, zero=1, moe_flex_dispatch=True),
    "deepseek-moe-ep-capacity": doc("deepseek-v3", "dgx-b200", 1024, 4096, 8192, tp=2, sp=True, pp=16, dp=32, ep=32,
                                    zero=1, recompute="full", dtype="fp8"),
}


def scenario(name):
    return ex.load_scenario(PLANS[name])


# --- parsers ------------------------------------------------------------------------------------------
def parse_megatron(text):
    """(torchrun flags, pretrain_gpt.py flags) as {flag: value or True}, from the bash script."""
    joined = re.sub(r"\\\n", " ", text)
    cmd = next(line for line in joined.splitlines() if line.startswith("torchrun "))
    tokens = shlex.split(cmd)[1:]
    script = next(i for i, t in enumerate(tokens) if t.endswith("pretrain_gpt.py"))
    return _flags(tokens[:script]), _flags(tokens[script + 1:])


def _flags(tokens):
    out, i = {}, 0
    while i < len(tokens):
        t = tokens[i]
        if t == "$@":
            i += 1
            continue
        assert t.startswith("--"), f"stray token {t!r}"
        assert t not in out, f"flag {t} given twice"
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") and tokens[i + 1] != "$@":
            out[t], i = tokens[i + 1], i + 2
        else:
            out[t], i = True, i + 1
    return out


def dotted_keys(d, prefix=""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        yield path
        if isinstance(v, dict):
            yield from dotted_keys(v, path + ".")


def comments(text):
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


# --- (1) every emitted name is documented -------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in PLANS])
def test_megatron_flags_are_documented(name):
    torchrun, flags = parse_megatron(ex.to_megatron(PLANS[name]))
    assert set(torchrun) <= set(OPTIONS["torchrun"]["flags"])
    assert set(flags) <= set(OPTIONS["megatron"]["flags"]), set(flags) - set(OPTIONS["megatron"]["flags"])
    for flag, accepted in OPTIONS["megatron"]["choices"].items():
        if flag in flags:
            assert flags[flag] in accepted


DEEPSPEED_OK = ["llama8b-zero3-nvme", "gpt1.7b-pp-fp16", "llama8b-autotp-cpu", "gpt3.6b-ddp"]
TITAN_OK = ["llama70b-3d-interleaved", "llama8b-zbh1-cp", "llama8b-autotp-cpu", "gpt3.6b-ddp", "qwen3-moe-ep-flex"]


@pytest.mark.parametrize("name", DEEPSPEED_OK)
def test_deepspeed_keys_are_documented(name):
    cfg = json.loads(ex.to_deepspeed(PLANS[name]))
    documented = set(OPTIONS["deepspeed"]["keys"]) | set(OPTIONS["deepspeed_pipeline"]["keys"])
    assert set(dotted_keys(cfg)) <= documented, set(dotted_keys(cfg)) - documented
    for path, accepted in OPTIONS["deepspeed"]["choices"].items():
        node = cfg
        for part in path.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if node != {}:
            assert node in accepted
    assert not ("bf16" in cfg and "fp16" in cfg)          # documented: cannot be combined


def leaf_keys(d, prefix=""):
    """Dotted paths of the values (not the tables) of a parsed TOML document."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaf_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def at_path(d, path):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def check_torchtitan_names(sections, documented):
    keys = set(leaf_keys(sections))
    assert keys <= set(documented["keys"]), keys - set(documented["keys"])
    for path, accepted in documented["choices"].items():
        value = at_path(sections, path)
        if value is not None:
            assert value in accepted, (path, value)


def module_literals(text):
    """The literal assignments of a torchtitan config module (SETTINGS, FP8, ...), without running it."""
    names = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return names


FP8_TITAN = doc("llama3-8b", "dgx-h100", 16, 4096, 64, tp=2, sp=True, zero=3, recompute="full", dtype="fp8")


@pytest.mark.parametrize("name", TITAN_OK + ["fp8"])
def test_torchtitan_toml_keys_are_documented(name):
    """The 0.2.2 TOML job config: every key one of its JobConfig fields."""
    text = ex.to_torchtitan(PLANS.get(name, FP8_TITAN), "toml")
    check_torchtitan_names(tomllib.loads(text), OPTIONS["torchtitan"])
    if name == "fp8":                     # per-tensor scaling: [quantize.linear.float8], its registered name
        cfg = tomllib.loads(text)
        assert cfg["model"]["converters"] == ["quantize.linear.float8"]
        assert cfg["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"


@pytest.mark.parametrize("name", TITAN_OK + ["fp8"])
def test_torchtitan_module_settings_are_documented(name):
    """The 0.3.0 config module: every SETTINGS key a field of its TrainingConfig / ParallelismConfig /
    CompileConfig, its classes torchtitan's own."""
    text = ex.to_torchtitan(PLANS.get(name, FP8_TITAN))
    names = module_literals(text)
    check_torchtitan_names(names["SETTINGS"], OPTIONS["torchtitan_030"])
    used = set(re.findall(r"\b([A-Z][A-Za-z0-9]+)\.Config\(", text))
    assert used <= set(OPTIONS["torchtitan_030"]["classes"]), used
    if name == "fp8":      # 0.3.0 has no per-tensor recipe: the nearest plan is row-wise, re-estimated
        assert names["FP8"] == ["Float8LinearConverter", "rowwise"]
        assert "fp8-rowwise for fp8" in ex.export(FP8_TITAN, "torchtitan").summary


# --- (2) values encode the plan -----------------------------------------------------------------------
def test_megatron_encodes_3d_interleaved_plan():
    torchrun, f = parse_megatron(ex.to_megatron(PLANS["llama70b-3d-interleaved"]))
    assert torchrun["--nnodes"] == "8" and torchrun["--nproc-per-node"] == "8"
    assert torchrun["--rdzv-backend"] == "c10d" and torchrun["--rdzv-endpoint"] == "${MASTER_ADDR}:${MASTER_PORT}"
    assert (f["--tensor-model-parallel-size"], f["--pipeline-model-parallel-size"], f["--context-parallel-size"]) \
        == ("4", "4", "1")
    assert f["--sequence-parallel"] is True
    assert f["--num-layers-per-virtual-pipeline-stage"] == str(80 // (4 * 2))
    assert (f["--micro-batch-size"], f["--global-batch-size"]) == ("1", "256")
    assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f
    assert f["--use-distributed-optimizer"] is True and "--optimizer-cpu-offload" not in f
    # the estimate hides the reduce-scatter and the parameter all-gather: both overlap flags
    assert f["--overlap-grad-reduce"] is True and f["--overlap-param-gather"] is True
    assert f["--bf16"] is True and "--fp16" not in f
    # model shape: Llama-3-70B is GQA, SwiGLU, RMSNorm, untied, no bias
    assert (f["--num-layers"], f["--hidden-size"], f["--num-attention-heads"]) == ("80", "8192", "64")
    assert f["--group-query-attention"] is True and f["--num-query-groups"] == "8"
    assert f["--swiglu"] is True and f["--normalization"] == "RMSNorm"
    assert f["--untie-embeddings-and-output-weights"] is True and f["--disable-bias-linear"] is True
    assert f["--position-embedding-type"] == "rope" and f["--seq-length"] == "4096"


def test_megatron_zero3_full_recompute_and_no_offload():
    """The megatron engine keeps its optimizer states on the GPU (its spec offers no offload): the script is
    the nearest plan it runs, without offload, re-estimated; no offload flag, no note contradicting one."""
    out = ex.export(PLANS["llama8b-zero3-nvme"], "megatron")
    text = out.text
    _, f = parse_megatron(text)
    assert f["--recompute-granularity"] == "full" and f["--recompute-method"] == "uniform"
    assert f["--use-distributed-optimizer"] is True
    assert "--optimizer-cpu-offload" not in f and "--use-precision-aware-optimizer" not in f
    assert out.plan.offload == "none" and not out.plan.offload_params
    assert "no offload" in out.summary and "no parameter offload" in out.summary
    assert "nearest plan it runs" in comments(text) and "as megatron runs it" in comments(text)
    # ZeRO-3 is Megatron-FSDP: its required flags (Megatron-LM's Megatron-FSDP user guide) and the double
    # buffers the estimate prices
    assert f["--use-megatron-fsdp"] is True and f["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert f["--ckpt-format"] == "fsdp_dtensor" and f["--fsdp-double-buffer"] is True
    notes = comments(text)
    assert "Megatron-FSDP" in notes and "CUDA_DEVICE_MAX_CONNECTIONS" in notes
    assert "NVMe" not in notes and "optimizer-cpu-offload" not in text and "does not offload" not in notes


def test_megatron_zb_h1_runs_1f1b_with_both_estimates():
    out = ex.export(PLANS["llama8b-zbh1-cp"], "megatron")
    _, f = parse_megatron(out.text)
    assert "--num-layers-per-virtual-pipeline-stage" not in f
    assert f["--context-parallel-size"] == "2" and f["--cp-comm-type"] == "p2p"
    assert "--use-flash-attn" not in f and "--overlap-grad-reduce" not in f
    assert out.plan.schedule == "1f1b"
    first = comments(out.text).split("# NOTE: ")[1]          # the first note: both estimates
    assert "nearest plan it runs" in first and "1F1B for zb-h1" in first
    assert "planned (engine generic): " in first and "as megatron runs it" in first


def test_megatron_unfused_grad_accumulation_flag():
    _, fused = parse_megatron(ex.to_megatron(PLANS["gpt3.6b-ddp"]))
    assert "--no-gradient-accumulation-fusion" not in fused
    unfused = doc("gpt-3.6b", "dgx-a100-80g", 8, 2048, 32, micro_batch=4, recompute="full", grad_accumulation_fusion=False)
    _, flags = parse_megatron(ex.to_megatron(unfused))
    assert "--no-gradient-accumulation-fusion" in flags
    # engines that never fuse it re-estimate it unfused, and say so when the plan's estimate assumed it fused
    assert "gradient accumulation unfused" in ex.export(PLANS["gpt3.6b-ddp"], "deepspeed").summary
    assert "gradient accumulation unfused" not in ex.export(unfused, "deepspeed").summary


def test_megatron_eager_softmax_flag():
    unfused = doc("gpt-3.6b", "dgx-a100-80g", 8, 2048, 32, micro_batch=4, recompute="full", flash_attention=False)
    _, flags = parse_megatron(ex.to_megatron(unfused))
    assert "--no-masked-softmax-fusion" not in flags and "--use-flash-attn" not in flags
    eager = doc("gpt-3.6b", "dgx-a100-80g", 8, 2048, 32, micro_batch=4, recompute="full", flash_attention=False, fused_softmax=False)
    _, flags = parse_megatron(ex.to_megatron(eager))
    assert "--no-masked-softmax-fusion" in flags


def test_megatron_gpt_layout_and_fp16():
    _, f = parse_megatron(ex.to_megatron(PLANS["gpt1.7b-pp-fp16"]))
    assert f["--fp16"] is True and "--bf16" not in f
    assert f["--position-embedding-type"] == "learned_absolute" and f["--normalization"] == "LayerNorm"
    assert "--untie-embeddings-and-output-weights" not in f and "--swiglu" not in f
    assert "--use-distributed-optimizer" in f


def test_megatron_script_is_valid_bash(tmp_path):
    for name in PLANS:
        path = tmp_path / f"{name}.sh"
        path.write_text(ex.to_megatron(PLANS[name]))
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_deepspeed_zero3_nvme():
    cfg = json.loads(ex.to_deepspeed(PLANS["llama8b-zero3-nvme"]))
    z = cfg["zero_optimization"]
    assert z["stage"] == 3
    assert z["offload_optimizer"]["device"] == "nvme" and z["offload_param"]["device"] == "nvme"
    assert z["offload_optimizer"]["nvme_path"] == ex.NVME_PLACEHOLDER == z["offload_param"]["nvme_path"]
    assert cfg["bf16"] == {"enabled": True} and "fp16" not in cfg
    assert "activation_checkpointing" in cfg and "pipeline" not in cfg and "tensor_parallel" not in cfg
    assert any("nvme_path" in n for n in ex.export_notes(PLANS["llama8b-zero3-nvme"], "deepspeed"))


def test_deepspeed_pipeline_fp16():
    cfg = json.loads(ex.to_deepspeed(PLANS["gpt1.7b-pp-fp16"]))
    assert cfg["fp16"]["enabled"] is True and "bf16" not in cfg
    assert cfg["pipeline"]["stages"] == 2 and cfg["pipeline"]["activation_checkpoint_interval"] == 1
    assert cfg["zero_optimization"]["stage"] == 1
    out = ex.export(PLANS["gpt1.7b-pp-fp16"], "deepspeed")
    assert any("PipelineModule" in n and "TrainSchedule" in n for n in out.notes)
    # its pipeline engine runs its 1F1B-style TrainSchedule: the nearest plan, with both estimates
    assert out.plan.schedule == "1f1b" and "1F1B for gpipe" in out.summary and "1F1B for gpipe" in out.notes[0]


def test_deepspeed_launch_note_uses_documented_launcher_flags():
    note = next(n for n in ex.export_notes(PLANS["llama8b-zero3-nvme"], "deepspeed") if n.startswith("launch:"))
    flags = set(re.findall(r"(?<!\S)--\w+", note))
    assert flags and flags <= set(OPTIONS["deepspeed_launcher"]["flags"])
    assert "--num_nodes 2" in note and "--num_gpus 8" in note


def test_deepspeed_autotp_and_cpu_offload():
    cfg = json.loads(ex.to_deepspeed(PLANS["llama8b-autotp-cpu"]))
    assert cfg["tensor_parallel"]["autotp_size"] == 2
    z = cfg["zero_optimization"]
    assert z["stage"] == 2 and z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in z and "activation_checkpointing" not in cfg
    assert any("AutoTP" in n and "Megatron-DeepSpeed" in n for n in ex.export_notes(PLANS["llama8b-autotp-cpu"], "deepspeed"))


def test_torchtitan_encodes_3d_interleaved_plan():
    cfg = tomllib.loads(ex.to_torchtitan(PLANS["llama70b-3d-interleaved"], "toml"))
    par = cfg["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (4, 4, 1)
    assert par["data_parallel_shard_degree"] == 4 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and par["pipeline_parallel_microbatch_size"] == 1
    chunks = par["module_fqns_per_model_part"]          # pp 4 x vpp 2 chunks of 10 layers, in model order
    assert [sum(n.startswith("layers.") for n in c) for c in chunks] == [10] * 8
    assert chunks[0][:2] == ["tok_embeddings", "layers.0"] and chunks[-1][-3:] == ["layers.79", "norm", "output"]
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert cfg["training"]["mixed_precision_param"] == "bfloat16" and cfg["training"]["seq_len"] == 4096
    assert cfg["training"]["mixed_precision_reduce"] == "float32"      # what the estimate prices
    assert (cfg["model"]["name"], cfg["model"]["flavor"]) == ("llama3", "70B")


def test_torchtitan_ddp_and_custom_model_note():
    text = ex.to_torchtitan(PLANS["gpt3.6b-ddp"], "toml")
    cfg = tomllib.loads(text)
    assert cfg["parallelism"]["data_parallel_replicate_degree"] == 8
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 1
    assert "fsdp_reshard_after_forward" not in cfg["parallelism"]
    assert cfg["activation_checkpoint"]["mode"] == "full"
    assert "register" in comments(text) and "dim=3072" in comments(text)


@pytest.mark.parametrize("name, zero, reshard", [("llama8b-autotp-cpu", 2, "never"), ("llama8b-zero3-nvme", 3, "default")])
def test_torchtitan_zero2_zero3_without_the_optimizer_offload(name, zero, reshard):
    """The torchtitan engine keeps its optimizer states on the GPU (its spec offers no offload; its
    enable_cpu_offload is FSDP2's CPUOffloadPolicy, parameters and gradients too): the nearest plan."""
    out = ex.export(PLANS[name], "torchtitan", torchtitan_format="toml")
    cfg = tomllib.loads(out.text)
    assert "enable_cpu_offload" not in cfg["training"]
    assert cfg["parallelism"]["fsdp_reshard_after_forward"] == reshard
    assert cfg["parallelism"]["data_parallel_shard_degree"] == scenario(name).plan.dp
    assert out.plan.zero == zero and out.plan.offload == "none" and "no offload" in out.summary


# --- (3) batch arithmetic -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", DEEPSPEED_OK)
def test_deepspeed_batch_arithmetic(name):
    s = scenario(name)
    cfg = json.loads(ex.to_deepspeed(PLANS[name]))
    micro, accum = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    assert cfg["train_batch_size"] == micro * accum * s.plan.dp == s.global_batch
    assert micro == s.plan.micro_batch


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_batch_arithmetic(name):
    s = scenario(name)
    torchrun, f = parse_megatron(ex.to_megatron(PLANS[name]))
    assert int(torchrun["--nnodes"]) * int(torchrun["--nproc-per-node"]) == s.gpus
    world = s.gpus
    mp = int(f["--tensor-model-parallel-size"]) * int(f["--pipeline-model-parallel-size"]) * \
        int(f["--context-parallel-size"])
    assert world % mp == 0 and world // mp == s.plan.dp
    assert int(f["--global-batch-size"]) % (int(f["--micro-batch-size"]) * s.plan.dp) == 0


@pytest.mark.parametrize("name", TITAN_OK)
def test_torchtitan_batch_arithmetic(name):
    s = scenario(name)
    cfg = tomllib.loads(ex.to_torchtitan(PLANS[name], "toml"))
    t, par = cfg["training"], cfg["parallelism"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp == s.plan.dp
    assert dp * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * par["context_parallel_degree"] == s.gpus
    assert t["global_batch_size"] % (t["local_batch_size"] * dp) == 0      # gradient accumulation steps
    micro = par.get("pipeline_parallel_microbatch_size", t["local_batch_size"])
    assert micro == s.plan.micro_batch and t["local_batch_size"] % micro == 0
    assert t["global_batch_size"] == s.global_batch


def test_dp_zero_is_filled_from_gpus():
    s = ex.load_scenario(doc("llama3-8b", "dgx-h100", 16, 2048, 64, tp=2, pp=2, dp=0))
    assert s.plan.dp == 4 and s.hosts == 2 and s.procs_per_host == 8


# --- (4) bad input ------------------------------------------------------------------------------------
def test_unknown_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown engine"):
        ex.export(PLANS["gpt3.6b-ddp"], "colossalai")


@pytest.mark.parametrize("bad, field", [
    ({"schema": "something/1"}, "schema"),
    ({"schema": PLAN_SCHEMA, "plan": {}}, "scenario"),
    (doc("llama3-8b", "dgx-h100", 8, 2048, 8) | {"plan": "tp2"}, "plan"),
    ({**doc("llama3-8b", "dgx-h100", 8, 2048, 8), "scenario": {"model": "llama3-8b", "cluster": "dgx-h100"}},
     "scenario.gpus"),
    (doc("llama3-8b", "dgx-h100", 8, 2048, 8, tpp=2), "tpp"),
    (doc("llama3-8b", "dgx-h100", 8, 2048, 10, tp=2), "plan"),          # 10 % (dp 4 * micro 1) != 0
    (doc("no-such-model", "dgx-h100", 8, 2048, 8), "model"),
])
def test_malformed_plan_documents(bad, field):
    with pytest.raises(ConfigError) as e:
        ex.to_megatron(bad)
    assert e.value.field == field


@pytest.mark.parametrize("name, engine, field", [
    ("llama70b-3d-interleaved", "deepspeed", "sp"),       # refused for its layout, before its memory (81 GiB)
    ("llama8b-zbh1-cp", "deepspeed", "cp"),
    ("gpt1.7b-pp-fp16", "torchtitan", "dtype"),
])
def test_inexpressible_plans_are_config_errors(name, engine, field):
    with pytest.raises(ConfigError) as e:
        ex.export(PLANS[name], engine)
    assert e.value.field == field


def test_a_nearest_plan_that_does_not_fit_is_refused_with_what_overflows():
    d = doc("gpt-3.6b", "dgx-a100-80g", 8, 2048, 32, micro_batch=4)        # DDP, no recomputation
    with pytest.raises(ConfigError, match=r"does not fit.*as megatron runs it.*over by \d+\.\d GiB") as e:
        ex.export(d, "megatron")
    assert e.value.field == "plan" and "paraplan plan --engine megatron" in str(e.value)


def test_deepspeed_rejects_what_its_engine_rejects():
    with pytest.raises(ConfigError, match="3D parallelism"):
        ex.to_deepspeed(doc("llama3-8b", "dgx-h100", 8, 2048, 64, tp=2, pp=2))



def test_deepspeed_runs_nvme_offload_below_zero3_as_cpu_offload():
    """DeepSpeed offloads optimizer states to NVMe only under ZeRO-3 (offload_config.py): below it the
    export is the nearest plan it runs, the optimizer offloaded to host memory, with both estimates."""
    out = ex.export(doc("llama3-8b", "dgx-h100", 8, 2048, 64, zero=2, offload="nvme"), "deepspeed")
    cfg = json.loads(out.text)["zero_optimization"]
    assert cfg["stage"] == 2 and cfg["offload_optimizer"]["device"] == "cpu"
    assert "CPU offload for NVMe (its NVMe offload needs ZeRO-3)" in out.summary


def test_deepspeed_pipeline_runs_zero1_and_1f1b_as_the_nearest_plan():
    """Its PipelineEngine asserts ZeRO < 2 and has no interleaved schedule: the export is the nearest
    plan it runs (ZeRO-1; 1F1B with one model chunk a stage), with both estimates."""
    out = ex.export(doc("gpt-1.7b", "dgx-a100-80g", 8, 2048, 64, pp=2, zero=2), "deepspeed")
    assert json.loads(out.text)["zero_optimization"]["stage"] == 1 and "ZeRO-1 for ZeRO-2" in out.summary
    out = ex.export(doc("gpt-1.7b", "dgx-a100-80g", 8, 2048, 64, pp=2, vpp=2, schedule="interleaved"), "deepspeed")
    assert (out.plan.schedule, out.plan.vpp) == ("1f1b", 1) and json.loads(out.text)["pipeline"]["stages"] == 2
    assert "1F1B for interleaved" in out.summary and "one model chunk per stage for vpp 2" in out.summary


# --- CLI ----------------------------------------------------------------------------------------------
def write(tmp_path, d, name="plan.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_cli_stdout_and_notes(tmp_path, capsys):
    p = write(tmp_path, PLANS["llama8b-zero3-nvme"])
    assert export_main([str(p), "--to", "deepspeed"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["zero_optimization"]["stage"] == 3
    assert "paraplan: note:" in err and "nvme_path" in err


def test_cli_out_file(tmp_path, capsys):
    p = write(tmp_path, PLANS["gpt3.6b-ddp"])
    out_file = tmp_path / "run" / "train.sh"
    assert export_main([str(p), "--to", "megatron", "--out", str(out_file)]) == 0
    assert capsys.readouterr().out == ""
    assert out_file.read_text() == ex.to_megatron(PLANS["gpt3.6b-ddp"])
    assert out_file.stat().st_mode & 0o111
    assert [f.name for f in out_file.parent.iterdir()] == ["train.sh"]     # no temporary left behind


@pytest.mark.parametrize("content, engine, needle", [
    ("{not json", "megatron", "malformed JSON"),
    (json.dumps({"schema": "x"}), "megatron", "not a paraplan plan file"),
    (json.dumps(doc("gpt-7.5b", "dgx-a100-80g", 8, 2048, 32)), "colossalai", "unknown engine"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, content, engine, needle):
    p = tmp_path / "plan.json"
    p.write_text(content)
    assert export_main([str(p), "--to", engine]) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_main_cli_has_export(tmp_path, capsys):
    from paraplan.cli import main
    from paraplan.planner.readers import read_torchtitan_module
    p = write(tmp_path, PLANS["llama8b-autotp-cpu"])
    assert main(["export", str(p), "--to", "torchtitan"]) == 0            # torchtitan 0.3.0: a Python module
    out, err = capsys.readouterr()
    compile(out, "paraplan_llama3_8b.py", "exec")
    assert read_torchtitan_module(out).plan.tp == 2
    assert "paraplan: export for torchtitan 0.3.0; planned (engine generic)" in err and "as torchtitan runs it" in err
    assert main(["export", str(p), "--to", "torchtitan", "--torchtitan-format", "toml"]) == 0
    assert tomllib.loads(capsys.readouterr().out)["parallelism"]["tensor_parallel_degree"] == 2
    assert main(["export", str(tmp_path / "missing.json"), "--to", "torchtitan"]) == 2
    assert "cannot read" in capsys.readouterr().err


# --- property: any legal plan exports to documented names, or says why it cannot ----------------------
from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def legal_plans(draw):
    tp, pp, cp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    gpus = 32
    dp = gpus // (tp * pp * cp)
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zb-h1"] + (["interleaved"] if pp > 1 else [])))
    vpp = draw(st.sampled_from([1, 2])) if schedule == "interleaved" else 1
    zero = draw(st.integers(0, 3))
    offload = draw(st.sampled_from(["none", "cpu", "nvme"])) if zero else "none"
    micro = draw(st.sampled_from([1, 2]))
    plan = dict(tp=tp, pp=pp, cp=cp, dp=dp, vpp=vpp, schedule=schedule, zero=zero, offload=offload,
                offload_params=draw(st.booleans()) if zero == 3 and offload != "none" else False,
                micro_batch=micro, sp=draw(st.booleans()) if tp > 1 else False,
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                dtype=draw(st.sampled_from(["bf16", "fp16"])), flash_attention=draw(st.booleans()),
                overlap_grad_reduce=draw(st.booleans()))
    return doc("llama3-8b", "dgx-h100", gpus, 4096, dp * micro * pp * 4, **plan)


def refused_for(e, layout_fields):
    """A refusal is either a layout the engine cannot run (one of ``layout_fields``) or the nearest plan it
    runs not fitting, said with both estimates and what overflows."""
    if e.field == "plan":
        assert "does not fit" in e.problem and "as " in e.problem and "over by" in e.problem, e.problem
    else:
        assert e.field in layout_fields, (e.field, e.problem)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(legal_plans())
def test_any_legal_plan_exports_documented_names(d):
    try:                                                      # Megatron-LM runs every layout
        _, flags = parse_megatron(ex.to_megatron(d))
    except ConfigError as e:
        refused_for(e, set())
    else:
        assert set(flags) <= set(OPTIONS["megatron"]["flags"])
    try:
        cfg = json.loads(ex.to_deepspeed(d))
    except ConfigError as e:
        refused_for(e, {"cp", "sp", "tp", "offload"})
    else:
        documented = set(OPTIONS["deepspeed"]["keys"]) | set(OPTIONS["deepspeed_pipeline"]["keys"])
        assert set(dotted_keys(cfg)) <= documented
        assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                           * cfg["gradient_accumulation_steps"] * d["plan"]["dp"])
    for fmt in ("toml", "python"):
        try:
            text = ex.to_torchtitan(d, fmt)
        except ConfigError as e:
            refused_for(e, {"dtype"})
        else:
            if fmt == "toml":
                check_torchtitan_names(tomllib.loads(text), OPTIONS["torchtitan"])
            else:
                check_torchtitan_names(module_literals(text)["SETTINGS"], OPTIONS["torchtitan_030"])
