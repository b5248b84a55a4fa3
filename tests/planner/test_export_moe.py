"""Launch configs of MoE plans carry the experts and expert parallelism the estimate priced: a Megatron-LM
script without --num-experts trains a dense model of another shape."""
import dataclasses

from paraplan.plan import Plan
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.export import megatron_moe_layer_freq
from paraplan.planner.readers import read_export
from paraplan.workloads.presets import load_model


def _doc(model, cluster, gpus, seq, gbs, plan):
    return {"schema": PLAN_SCHEMA, "scenario": {"model": model, "cluster": cluster, "gpus": gpus, "seq_len": seq,
                                                "global_batch": gbs},
            "plan": dataclasses.asdict(plan), "estimate": {}}


def _flags(script: str) -> dict:
    """pretrain_gpt.py's flags in a written script: flag -> value ('' for a switch)."""
    out = {}
    for line in script.splitlines():
        parts = line.strip().rstrip("\\").split(maxsplit=1)
        if parts and parts[0].startswith("--"):
            out[parts[0]] = parts[1].strip().strip("'") if len(parts) > 1 else ""
    return out


def test_megatron_script_of_an_moe_plan_names_its_experts_and_expert_parallelism():
    qwen = _doc("qwen3-30b-a3b", "dgx-h200", 16, 4096, 512,
                Plan(dp=16, ep=8, micro_batch=1, zero=1, engine="megatron"))
    f = _flags(ex.to_megatron(qwen))
    assert (f["--num-experts"], f["--moe-router-topk"], f["--moe-ffn-hidden-size"]) == ("128", "8", "768")
    assert (f["--expert-model-parallel-size"], f["--expert-tensor-parallel-size"]) == ("8", "1")
    assert f["--moe-token-dispatcher-type"] == "alltoall" and "--moe-grouped-gemm" in f
    assert "--moe-layer-freq" not in f and "--moe-shared-expert-intermediate-size" not in f


def test_deepseek_v3_keeps_its_dense_first_layers_and_shared_expert():
    dsv3 = load_model("deepseek-v3")
    doc = _doc("deepseek-v3", "dgx-b200", 1024, 4096, 8192,
               Plan(tp=2, sp=True, pp=16, dp=32, ep=32, micro_batch=1, zero=1, recompute="full", engine="megatron",
                    dtype="fp8"))
    f = _flags(ex.to_megatron(doc))
    pattern = eval(f["--moe-layer-freq"])        # Megatron-LM evaluates the list expression the same way
    assert len(pattern) == dsv3.layers and sum(pattern) == dsv3.moe_layers and pattern[:3] == [0, 0, 0]
    assert f["--moe-shared-expert-intermediate-size"] == str(dsv3.moe.expert_ffn_hidden)


def test_every_other_layer_patterns_match_the_models_moe_layer_count():
    for name in ("ted-6.7b-16e", "ds-moe-1.3b-128"):
        m = load_model(name)
        pattern = eval(megatron_moe_layer_freq(m))
        assert len(pattern) == m.layers and sum(pattern) == m.moe_layers and m.moe_layers < m.layers
    assert megatron_moe_layer_freq(load_model("mixtral-8x7b")) is None


def test_dense_models_get_no_moe_flags():
    doc = _doc("llama3-8b", "dgx-h100", 8, 8192, 64, Plan(dp=8, micro_batch=1, zero=1, recompute="full", engine="megatron"))
    assert not any(k.startswith(("--num-experts", "--moe", "--expert")) for k in _flags(ex.to_megatron(doc)))


def test_torchtitan_and_deepspeed_exports_carry_expert_parallelism():
    doc = _doc("qwen3-30b-a3b", "dgx-h200", 16, 4096, 512, Plan(dp=16, ep=8, micro_batch=1, zero=1, engine="generic"))
    titan = ex.export(doc, "torchtitan")                 # torchtitan 0.3.0: no expert-tensor-parallel degree
    settings = read_export("torchtitan", titan.text)
    assert settings.plan.ep == 8 and "'expert_parallel_degree': 8" in titan.text
    assert "expert_tensor_parallel_degree" not in titan.text
    assert "MODEL = 'qwen3'" in titan.text and "FLAVOR = '30B-A3B'" in titan.text    # its own Qwen3 MoE flavor
    toml = ex.export(doc, "torchtitan", torchtitan_format="toml")                      # 0.2.2 has both
    assert "expert_parallel_degree = 8" in toml.text and "expert_tensor_parallel_degree = 1" in toml.text
    ds = ex.export(doc, "deepspeed")
    assert any("deepspeed.moe.layer.MoE(num_experts=128, ep_size=8, k=8" in n for n in ds.notes)
