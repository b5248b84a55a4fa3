"""Megatron-Core's fine-grained recomputation (--recompute-granularity selective --recompute-modules)."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from paraplan.costmodels import memory as M
from paraplan.calibration import load_h100_cases
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import RECOMPUTE_MODULE_BIT, Plan, Recompute, check_plan
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.space import SpaceOptions, compose
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

DSV3 = load_model("deepseek-v3")
QWEN = load_model("qwen3-30b-a3b")
LLAMA = load_model("llama3-8b")
JOB = TrainingJob(seq_len=4096, global_batch=512)
H100_16 = load_cluster("dgx-h100", 16)
SEL = Plan(tp=2, sp=True, dp=8, ep=8, micro_batch=1, zero=1, engine="megatron", recompute="selective")


def per_layer(model, plan, job=JOB):
    return float(M.activation_bytes_per_layer(model, job, plan))


def with_modules(plan, modules):
    return dataclasses.replace(plan, recompute_modules=modules)


def test_the_list_is_canonical_and_unknown_names_are_refused():
    p = with_modules(SEL, " moe_act, layernorm,moe_act ")
    assert p.recompute_modules == "layernorm,moe_act"
    assert p.recompute_modules_mask == RECOMPUTE_MODULE_BIT["layernorm"] | RECOMPUTE_MODULE_BIT["moe_act"]
    with pytest.raises(ConfigError) as err:
        with_modules(SEL, "layernrm")
    assert err.value.field == "recompute_modules" and "core_attn, layernorm" in str(err.value)


def test_each_output_discarding_module_frees_exactly_its_output():
    """layernorm: the two norm outputs (2·2h per token, ÷ tp under SP); mla_up_proj: the attention's
    Q, K and V; moe_act: FC2's input of every routed token copy."""
    T, t, h = JOB.seq_len, 2, DSV3.hidden
    base = per_layer(DSV3, SEL)        # the default list: the attention core
    assert base - per_layer(DSV3, with_modules(SEL, "core_attn,layernorm")) == pytest.approx(2 * 2 * h * T / t)
    qkv = 2 * (DSV3.q_hidden + DSV3.kv_hidden + DSV3.v_hidden) * T / t
    assert base - per_layer(DSV3, with_modules(SEL, "core_attn,mla_up_proj")) == pytest.approx(qkv)
    e = QWEN.moe
    acts = 2 * e.expert_ffn_hidden * e.top_k * T / t * QWEN.moe_layers / QWEN.layers
    assert per_layer(QWEN, SEL) - per_layer(QWEN, with_modules(SEL, "core_attn,moe_act")) == pytest.approx(acts)
    # a list without core_attn keeps the attention's fp32 softmax statistics (4 bytes per head and token)
    stats = 4 * DSV3.heads * T / t
    assert per_layer(DSV3, with_modules(SEL, "layernorm")) - per_layer(DSV3, with_modules(SEL, "core_attn,layernorm")) \
        == pytest.approx(stats)


def test_fp8_linear_inputs_free_one_byte_each():
    """In fp8 the QKV projection keeps its norm output as a 1-byte cast; an MoE layer's pre-MLP norm
    output feeds the router, a 16-bit GEMM, and stays 2 bytes (a dense layer's FC1 keeps 1)."""
    fp8 = dataclasses.replace(SEL, dtype="fp8")
    freed = per_layer(QWEN, fp8) - per_layer(QWEN, with_modules(fp8, "core_attn,layernorm"))
    assert freed == pytest.approx((1 + 2) * QWEN.hidden * JOB.seq_len / 2)   # 1 + 2 bytes, ÷ tp
    dense = dataclasses.replace(fp8, ep=1)
    freed = per_layer(LLAMA, dense) - per_layer(LLAMA, with_modules(dense, "core_attn,layernorm"))
    assert freed == pytest.approx(2 * LLAMA.hidden * JOB.seq_len / 2)       # two 1-byte casts, ÷ tp


def test_moe_covers_moe_act_and_frees_the_most():
    moe = per_layer(QWEN, with_modules(SEL, "moe"))
    assert per_layer(QWEN, with_modules(SEL, "moe,moe_act")) == pytest.approx(moe)
    assert moe < per_layer(QWEN, with_modules(SEL, "moe_act")) < per_layer(QWEN, SEL)


def test_recompute_time_follows_the_modules():
    def rec(modules):
        return estimate(DSV3, JOB, H100_16, with_modules(SEL, modules)).time_breakdown_s["recompute"]
    # the default list is the attention core
    assert rec("") == pytest.approx(rec("core_attn"))
    both = rec("core_attn,mla_up_proj")
    assert both > rec("core_attn") > 0 and both > rec("mla_up_proj") > 0
    # modules add up: the attention core costs the same beside either module, and so do the up-projections
    assert both - rec("mla_up_proj") == pytest.approx(rec("core_attn,layernorm") - rec("layernorm"))
    assert both - rec("core_attn") == pytest.approx(rec("layernorm,mla_up_proj") - rec("layernorm"))


def test_moe_recompute_runs_the_all_to_alls_again():
    plan = Plan(dp=16, ep=16, micro_batch=1, zero=1, engine="megatron", recompute="selective")
    plain = estimate(QWEN, JOB, H100_16, plan)
    again = estimate(QWEN, JOB, H100_16, with_modules(plan, "moe"))
    # four all-to-alls per MoE layer and micro-batch (dispatch and combine, each way), two more
    assert again.time_breakdown_s["ep_comm"] == pytest.approx(1.5 * plain.time_breakdown_s["ep_comm"])
    assert again.memory_bytes_per_gpu["activations"] < plain.memory_bytes_per_gpu["activations"]
    # more hardware FLOPs per model FLOP (the experts' GEMMs run twice), and a longer step
    assert again.hfu / again.mfu > plain.hfu / plain.mfu and again.step_time_s > plain.step_time_s


@pytest.mark.parametrize("kw, field, words", [
    (dict(recompute="none"), "recompute_modules", "--recompute is none"),
    (dict(recompute="full"), "recompute_modules", "--recompute is full"),
    (dict(engine="deepspeed"), "recompute_modules", "deepspeed has no --recompute-modules"),
])
def test_plans_that_cannot_run_them_are_refused_by_name(kw, field, words):
    with pytest.raises(ConfigError) as err:
        Plan(**{**dataclasses.asdict(SEL), "recompute_modules": "layernorm", **kw})
    assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize("model, modules, missing", [
    (LLAMA, "moe_act", "moe_act"), (LLAMA, "mla_up_proj,layernorm", "mla_up_proj"),
    (QWEN, "shared_experts", "shared_experts"), (QWEN, "mlp", "mlp")])
def test_modules_the_model_lacks_are_refused(model, modules, missing):
    plan = with_modules(SEL if model.moe else dataclasses.replace(SEL, ep=1), modules)
    with pytest.raises(ConfigError) as err:
        check_plan(plan, model, JOB, H100_16)
    assert err.value.field == "recompute_modules" and f"has no {missing} to recompute" in str(err.value)


def test_search_sets_them_where_they_run_and_keeps_the_rest():
    fixed = {"engine": "megatron"}
    plain, _, _ = compose(QWEN, JOB, H100_16, SpaceOptions(fixed={**fixed, "recompute_modules": ""}))
    batch, _, _ = compose(QWEN, JOB, H100_16, SpaceOptions(fixed={**fixed, "recompute_modules": "layernorm,moe_act"}))
    assert len(batch) == len(plain) and not plain.recompute_modules_mask.any()
    on = batch.recompute_modules_mask != 0
    assert on.sum() > 1000
    assert np.array_equal(on, batch.recompute_code == Recompute.SELECTIVE)
    assert set(np.unique(batch.recompute_modules_mask)) == {0, with_modules(SEL, "layernorm,moe_act").recompute_modules_mask}


def test_megatron_export_writes_the_modules():
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "deepseek-v3", "cluster": "dgx-b200", "gpus": 1024,
                                               "seq_len": 4096, "global_batch": 8192},
           "plan": dataclasses.asdict(Plan(tp=2, pp=8, vpp=4, schedule="interleaved", sp=True, ep=64, zero=1,
                                           engine="megatron", recompute="selective",
                                           recompute_modules="mlp,mla_up_proj")), "estimate": {}}
    text = ex.to_megatron(doc)
    assert "--recompute-granularity selective" in text and "--recompute-modules mla_up_proj mlp" in text
    doc["plan"]["recompute_modules"] = ""
    assert "--recompute-modules" not in ex.to_megatron(doc)


def test_calibration_rows_whose_recipe_names_them_have_them():
    cases, _ = load_h100_cases()
    got = sorted((c.label.split(" x")[0], c.plan.recompute_modules) for c in cases if c.plan.recompute_modules)
    assert got == [("DeepSeekV3 (dropless) DGX-H100", "mla_up_proj,mlp"),
                   ("DeepSeekV3 (w/ MTP) DGX-B200", "mla_up_proj"),
                   ("DeepSeekV3 (w/o MTP) DGX-GB200", "mla_up_proj"),
                   ("GPT OSS 120B DGX-B200", "layernorm,moe_act"),
                   ("GPT OSS 120B DGX-H100", "layernorm,moe_act"),
                   ("GPT OSS 120B DGX-H100", "layernorm,moe_act")]   # global batch 1280 and 512


@pytest.mark.slow
def test_cli_flag_and_its_errors():
    common = [sys.executable, "-m", "paraplan.cli", "estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100",
              "--gpus", "16", "--seq-len", "4096", "--global-batch", "512", "--engine", "megatron", "--ep", "16"]
    ok = subprocess.run(common + ["--recompute", "selective", "--recompute-modules", "moe_act,layernorm",
                                  "--format", "json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["plan"]["recompute_modules"] == "layernorm,moe_act"
    bad = subprocess.run(common + ["--recompute-modules", "moe_act"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--recompute selective" in bad.stderr


def test_search_tries_the_recipes_module_lists_on_moe_models_only():
    from paraplan.planner.space import searched_recompute_module_sets
    assert searched_recompute_module_sets(LLAMA) == ()
    assert searched_recompute_module_sets(QWEN) == ("layernorm,moe_act",)
    assert searched_recompute_module_sets(DSV3) == ("layernorm,moe_act", "layernorm,mla_up_proj,moe_act")
    fixed = {"engine": "megatron"}
    plain, _, composed_plain = compose(QWEN, JOB, H100_16, SpaceOptions(fixed={**fixed, "recompute_modules": ""}))
    batch, _, composed = compose(QWEN, JOB, H100_16, SpaceOptions(fixed=fixed))
    selective = int((plain.recompute_code == Recompute.SELECTIVE).sum())
    assert len(batch) == len(plain) + selective and composed > composed_plain
    masks = batch.recompute_modules_mask[batch.recompute_code == Recompute.SELECTIVE]
    assert int((masks != 0).sum()) == selective
    llama, _, _ = compose(LLAMA, JOB, H100_16, SpaceOptions(fixed=fixed))
    assert not llama.recompute_modules_mask.any()
    titan, _, _ = compose(QWEN, JOB, H100_16, SpaceOptions(fixed={"engine": "torchtitan"}))
    assert not titan.recompute_modules_mask.any()


def test_pipeline_stage_costs_switch_recompute_modes_under_a_module_list():
    """The stage ILPs price each layer under full and no recomputation: the module list goes with
    selective and must not make those plans illegal (it did, at first)."""
    from paraplan.planner.stages import layer_costs, stage_layout
    plan = Plan(tp=2, sp=True, pp=4, dp=2, ep=2, micro_batch=1, zero=1, engine="megatron", recompute="selective",
                recompute_modules="layernorm,moe_act")
    full = layer_costs(QWEN, JOB, H100_16, plan, recompute="full")
    none = layer_costs(QWEN, JOB, H100_16, plan, recompute="none")
    mine = layer_costs(QWEN, JOB, H100_16, plan)
    assert full[5].activation_bytes < mine[5].activation_bytes < none[5].activation_bytes
    assert stage_layout(QWEN, JOB, H100_16, plan) is not None
