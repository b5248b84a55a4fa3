"""Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 sec. 2.2): each depth adds two RMSNorms, a
2h -> h projection, one transformer block and a second pass through the shared LM head and a loss, all
on the last pipeline stage (Megatron-LM's --mtp-num-layers; Megatron-Bridge's DeepSeek-V3 layouts put
the MTP block beside the loss)."""
import json
from dataclasses import replace

import pytest

from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, model_stage_layers, stage_layers
from paraplan.workloads.presets import load_model, model_from_mapping
from paraplan.workloads.transformer import TrainingJob

BASE, MTP = load_model("deepseek-v3"), load_model("deepseek-v3-mtp")


def test_the_module_adds_a_block_a_projection_and_a_head_pass():
    h = BASE.hidden
    assert MTP.mtp_layers == 1 and BASE.mtp_layers == 0
    # parameters: one MoE block, the 2h -> h projection and two norms (embedding and head are shared)
    assert MTP.num_params - BASE.num_params == BASE.params_per_moe_layer + 2 * h * h + 2 * h
    assert 11.5e9 < MTP.mtp_params < 11.8e9            # the checkpoint's 14B also stores embedding and head copies
    active = MTP.active_params - BASE.active_params
    assert 2 * h * h < active < BASE.active_params / BASE.layers * 2
    # training FLOPs: 3 x (projection + block GEMMs + full attention + the head's logits)
    extra = MTP.model_flops_per_token(4096) - BASE.model_flops_per_token(4096)
    assert extra == pytest.approx(3 * MTP.mtp_flops_per_token(4096))
    assert MTP.mtp_flops_per_token(4096) > BASE.logit_flops_per_token() + 4 * h * h
    assert "multi-token prediction depth 1" in MTP.describe()


def test_configs_name_it_and_bad_values_name_the_field(tmp_path):
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
           "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 129280, "hidden_act": "silu", "rope_theta": 10000,
           "num_nextn_predict_layers": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    hf = load_model(str(path))
    assert hf.mtp_layers == 1 and hf.num_params == MTP.num_params
    with pytest.raises(ConfigError) as err:
        model_from_mapping({"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "mtp_layers": -1}, "m.yaml")
    assert err.value.field == "mtp_layers"
    assert model_from_mapping({"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "mtp_layers": 2},
                              "m.yaml").mtp_layers == 2


def test_the_last_stage_holds_it():
    plan = Plan(tp=1, pp=4, dp=16, ep=8, micro_batch=1, zero=1, engine="megatron")
    main, with_mtp = stage_layers(MTP.layers, plan), model_stage_layers(MTP, plan)
    assert (with_mtp.first, with_mtp.middle) == (main.first, main.middle) and with_mtp.last == main.last + 1
    one = model_stage_layers(MTP, replace(plan, pp=1, dp=64))
    assert one.first == one.last == MTP.layers + 1
    assert model_stage_layers(BASE, plan) == stage_layers(BASE.layers, plan)
    # parameters and activations on the last stage only; routed experts of the MTP block there too
    f0, m0, l0 = M.stage_params(BASE, plan)
    f1, m1, l1 = M.stage_params(MTP, plan)
    assert (f1, m1) == (f0, m0) and l1 - l0 == pytest.approx(
        (MTP.mtp_params - MTP.routed_expert_params_per_moe_layer) / plan.tp)
    job = TrainingJob(4096, 1024)
    a0, a1 = M.activation_bytes(BASE, job, plan), M.activation_bytes(MTP, job, plan)
    assert a1["first"] == a0["first"] and a1["last"] > a0["last"]


def test_a_stage_layout_that_leaves_room_for_it_pays_less():
    """On pp 16 the automatic split gives the last stage 3 layers; with the MTP block and a second head
    pass it paces the pipeline. Megatron-Bridge's layout (4 first, 1 last) leaves it room."""
    cluster, job = load_cluster("dgx-b200", 256), TrainingJob(4096, 2048)
    auto = Plan(tp=1, pp=16, dp=16, ep=8, micro_batch=1, zero=1, dtype="mxfp8", engine="megatron")
    recipe = replace(auto, first_stage_layers=4, last_stage_layers=1)
    e_base, e_auto, e_recipe = (estimate(m, job, cluster, p) for m, p in ((BASE, auto), (MTP, auto), (MTP, recipe)))
    assert e_auto.step_time_s > e_base.step_time_s * 1.2          # the last stage: 3 + 1 blocks and 2 heads
    assert e_base.step_time_s < e_recipe.step_time_s < e_auto.step_time_s
    assert e_recipe.details["model_params"] == MTP.num_params
    assert e_recipe.details["mtp_blocks_on_last_stage"] == 1 and "mtp_blocks_on_last_stage" not in e_base.details
    from paraplan.reports.text import render_estimate
    assert "+ 1 multi-token-prediction block(s)" in render_estimate(e_recipe)


def test_published_mtp_run_is_scored_with_its_recipe_layout():
    from paraplan.calibration import load_h100_cases
    cases, skipped = load_h100_cases()
    (c,) = [c for c in cases if "w/ MTP" in c.label]
    assert c.model.mtp_layers == 1 and (c.plan.first_stage_layers, c.plan.last_stage_layers) == (4, 1)
    assert c.plan.recompute_modules == "mla_up_proj" and not skipped
    assert any("multi-token prediction" in a for a in c.assumed)


def test_megatron_export_names_it():
    from paraplan.planfile import PLAN_SCHEMA
    from paraplan.planner import export as ex
    d = {"schema": PLAN_SCHEMA, "scenario": {"model": "deepseek-v3-mtp", "cluster": "dgx-b200", "gpus": 256,
                                            "seq_len": 4096, "global_batch": 2048},
         "plan": {"tp": 1, "pp": 16, "dp": 16, "ep": 8, "zero": 1, "engine": "megatron", "recompute": "full"},
         "estimate": {}}
    out = ex.export(d, "megatron")
    assert "--mtp-num-layers 1" in out.text
