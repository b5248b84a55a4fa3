"""Group-limited routing (MoESpec.router_groups / router_group_top_k; Megatron-Core's
moe_router_num_groups / moe_router_group_topk, Hugging Face's n_group / topk_group): a token picks
some expert groups first, then its top-k experts among theirs. DeepSeek-V3 picks 4 of 8 groups, which
over the 8 nodes of a 64-GPU expert-parallel group bounds a token to 4 nodes: DeepEP sends each token
to fewer nodes than uniform routing over all 256 experts would."""
import json
from dataclasses import replace
from itertools import combinations

import pytest

from paraplan.cli import main
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.moe import ep_alltoall_time, expected_destinations, expert_holders_per_token
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import MoESpec, TrainingJob


def brute_force_destinations(experts, k, held, groups, picked):
    """The mean, over every choice of ``picked`` groups and then of k experts among theirs (uniform),
    of the distinct holders of ``held`` consecutive experts that the k experts sit on."""
    size = experts // groups
    total, count = 0.0, 0
    for chosen in combinations(range(groups), picked):
        pool = [g * size + i for g in chosen for i in range(size)]
        choices = list(combinations(pool, k))
        total += sum(len({x // held for x in c}) for c in choices) / len(choices)
        count += 1
    return total / count


@pytest.mark.parametrize("experts, k, held, groups, picked", [
    (16, 3, 2, 4, 2),     # a holder inside one group
    (16, 3, 4, 4, 2),     # a holder that is one group
    (16, 3, 8, 4, 2),     # a holder of two whole groups
    (24, 4, 3, 4, 3),
    (12, 2, 1, 6, 1),     # one group picked: all k experts in it
])
def test_group_limited_destinations_match_counting_every_choice(experts, k, held, groups, picked):
    got = float(expected_destinations(experts, k, held, groups, picked))
    assert got == pytest.approx(brute_force_destinations(experts, k, held, groups, picked))


def test_picking_every_group_is_unlimited_routing():
    for held in (1, 2, 4, 16):
        assert float(expected_destinations(16, 3, held, 4, 4)) == pytest.approx(float(expected_destinations(16, 3, held)))


def test_a_holder_that_straddles_groups_is_priced_as_unlimited_routing():
    # 6 experts per holder against groups of 4: neither inside one nor whole groups
    assert float(expected_destinations(24, 3, 6, 6, 2)) == pytest.approx(float(expected_destinations(24, 3, 6)))


def test_deepseek_v3_is_node_limited_and_reaches_fewer_nodes_with_deep_ep():
    """ep 64 over 8 DGX H100 nodes: a node holds 32 experts, one routing group. Uniform routing over
    all 256 experts reaches 5.3 nodes a token; 4 of 8 groups reach 3.6. DeepEP's dispatch gets cheaper;
    the all-to-all dispatcher, one message per routed copy, does not change."""
    dsv3 = load_model("deepseek-v3")
    assert (dsv3.moe.router_groups, dsv3.moe.router_group_top_k) == (8, 4) and dsv3.moe.group_limited
    unlimited = replace(dsv3, moe=replace(dsv3.moe, router_groups=None, router_group_top_k=None))
    assert float(expert_holders_per_token(unlimited.moe, 32)) == pytest.approx(5.30, abs=0.01)
    assert float(expert_holders_per_token(dsv3.moe, 32)) == pytest.approx(3.63, abs=0.01)
    job = TrainingJob(4096, 8192)
    h100 = load_cluster("dgx-h100", 1024)
    plan = Plan(tp=2, sp=True, pp=8, dp=64, ep=64, engine="megatron", dtype="bf16", moe_flex_dispatch=True)
    limited_time = float(ep_alltoall_time(dsv3, job, plan, h100))
    unlimited_time = float(ep_alltoall_time(unlimited, job, plan, h100))
    assert limited_time < 0.85 * unlimited_time
    a2a = replace(plan, moe_flex_dispatch=False)
    assert float(ep_alltoall_time(dsv3, job, a2a, h100)) == pytest.approx(float(ep_alltoall_time(unlimited, job, a2a, h100)))
    said = " ".join(estimate(dsv3, job, h100, plan).assumptions)
    assert "4 of 8 expert groups" in said


@pytest.mark.parametrize("kw, field, words", [
    (dict(router_groups=8), "moe.router_group_top_k", "neither"),
    (dict(router_groups=7, router_group_top_k=2), "moe.router_groups", "evenly"),
    (dict(router_groups=8, router_group_top_k=9), "moe.router_group_top_k", "1..8"),
    (dict(router_groups=64, router_group_top_k=1), "moe.router_group_top_k", "fewer than top_k"),
    (dict(router_groups=8, router_group_top_k=0), "moe.router_group_top_k", "positive"),
    (dict(router_groups=True, router_group_top_k=1), "moe.router_groups", "positive"),
])
def test_bad_router_groups_are_refused_by_name(kw, field, words):
    with pytest.raises(ConfigError) as e:
        MoESpec(experts=256, top_k=8, expert_ffn_hidden=2048, **kw)
    assert e.value.field == field and words in str(e.value)


def hf_deepseek(tmp_path, **over):
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 32000, "n_routed_experts": 64,
           "num_experts_per_tok": 4, "moe_intermediate_size": 512, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "n_group": 8, "topk_group": 4}
    cfg.update(over)
    cfg = {k: v for k, v in cfg.items() if v is not ...}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_hugging_face_configs_give_their_router_groups(tmp_path):
    m = load_model(hf_deepseek(tmp_path))
    assert (m.moe.router_groups, m.moe.router_group_top_k) == (8, 4)
    # Kimi K2 writes one group, one picked: no limit
    m = load_model(hf_deepseek(tmp_path, n_group=1, topk_group=1))
    assert m.moe.router_groups is None and not m.moe.group_limited
    m = load_model(hf_deepseek(tmp_path, n_group=..., topk_group=...))
    assert m.moe.router_groups is None


def test_a_bad_hugging_face_group_count_names_its_key(tmp_path, capsys):
    rc = main(["estimate", "--model", hf_deepseek(tmp_path, n_group=7), "--cluster", "dgx-h100", "--gpus", "8",
               "--global-batch", "8", "--seq-len", "1024"])
    err = capsys.readouterr().err
    assert rc == 2 and "n_group" in err and "Traceback" not in err
    rc = main(["estimate", "--model", hf_deepseek(tmp_path, topk_group=...), "--cluster", "dgx-h100", "--gpus", "8",
               "--global-batch", "8", "--seq-len", "1024"])
    err = capsys.readouterr().err
    assert rc == 2 and "n_group / topk_group" in err


def test_a_model_file_takes_router_groups(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: tiny-moe\nlayers: 4\nhidden: 1024\nheads: 8\nffn_hidden: 4096\nvocab: 32000\n"
                    "moe: {experts: 64, top_k: 4, expert_ffn_hidden: 512, router_groups: 8, router_group_top_k: 2}\n")
    m = load_model(str(path))
    assert (m.moe.router_groups, m.moe.router_group_top_k) == (8, 2)


def test_exports_carry_the_router_groups(tmp_path):
    """Megatron-LM gets the router's groups as flags (megatron/training/arguments.py _add_moe_args);
    DeepSpeed-MoE's gate has none, which its notes say; a model without groups gets no flag."""
    from paraplan.planner import export as ex
    from paraplan.planfile import PLAN_SCHEMA

    def doc(model, gpus, **plan):
        return {"schema": PLAN_SCHEMA, "plan": plan, "estimate": {},
                "scenario": {"model": model, "cluster": "dgx-h100", "gpus": gpus, "seq_len": 4096,
                             "global_batch": 8192}}
    # full recomputation: 28 of 80 GiB as Megatron-LM runs it (81 without)
    script = ex.to_megatron(doc("deepseek-v3", 1024, tp=2, sp=True, pp=8, dp=64, ep=64, zero=1, recompute="full"))
    assert "--moe-router-num-groups 8" in script and "--moe-router-group-topk 4" in script
    assert "--moe-router-num-groups" not in ex.to_megatron(doc("qwen3-30b-a3b", 16, dp=16, ep=8, zero=1,
                                                                recompute="full"))
    small = tmp_path / "small-moe.yaml"
    small.write_text("name: small-moe\nlayers: 4\nhidden: 1024\nheads: 8\nffn_hidden: 4096\nvocab: 32000\n"
                     "moe: {experts: 64, top_k: 4, expert_ffn_hidden: 512, router_groups: 8, router_group_top_k: 2}\n")
    notes = " ".join(ex.export_notes(doc(str(small), 8, dp=8, ep=8, zero=1, engine="deepspeed"), "deepspeed"))
    assert "no group-limited routing" in notes and "2 of 8 expert groups" in notes


def test_a_pinned_switch_the_listed_plans_cannot_run_is_said(tmp_path, capsys):
    """--fix moe_flex_dispatch=true holds only where a plan can run it (ep > 1); when the ranked plans
    run at ep 1 the output says which ranks run without it and why, instead of dropping it silently;
    pinning ep as well gives plans that all run it, and no note."""
    small = tmp_path / "small-moe.yaml"
    small.write_text("name: small-moe\nlayers: 8\nhidden: 2048\nheads: 16\nffn_hidden: 8192\nvocab: 32000\n"
                     "moe: {experts: 64, top_k: 4, expert_ffn_hidden: 1024, router_groups: 8, router_group_top_k: 2}\n")
    base = ["plan", "--model", str(small), "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "256", "--top", "3", "--format", "json", "--fix", "moe_flex_dispatch=true"]
    assert main(base) == 0
    doc = json.loads(capsys.readouterr().out)
    without = [i + 1 for i, p in enumerate(doc["plans"]) if not p["plan"]["moe_flex_dispatch"]]
    flex_notes = [n for n in doc["notes"] if n.startswith("--fix moe_flex_dispatch=true")]
    assert without, "this small model's fastest plans run at ep 1 (no all-to-all at all)"
    assert len(flex_notes) == 1 and f"rank {without[0]}:" in flex_notes[0] and "ep(1)" in flex_notes[0]
    assert main(base + ["--fix", "ep=8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(p["plan"]["moe_flex_dispatch"] and p["plan"]["ep"] == 8 for p in doc["plans"])
    assert not [n for n in doc["notes"] if n.startswith("--fix moe_flex_dispatch")]


def test_the_switches_fixed_where_they_run_have_one_registry():
    """planner.space.FIXED_WHERE_THEY_RUN is the one list of switches a --fix holds only where a plan can
    run them: each names a plan field whose default is its ``off`` value, each boolean one has cross
    rules that decide where it runs (OPT_IN_FLAG_RULES is derived from it), and the pin hint is a --fix."""
    from dataclasses import fields
    from paraplan.plan import Plan
    from paraplan.planner.space import FIXED_WHERE_THEY_RUN, OPT_IN_FLAG_RULES
    defaults = {f.name: f.default for f in fields(Plan)}
    for key, switch in FIXED_WHERE_THEY_RUN.items():
        assert defaults[key] == switch.off and switch.pin_hint.startswith("--fix ")
    booleans = {k for k, s in FIXED_WHERE_THEY_RUN.items() if s.off is False}
    assert set(OPT_IN_FLAG_RULES) == booleans == {"ep_comm_overlap", "moe_flex_dispatch", "tp_comm_overlap",
                                                  "grad_reduce_bf16", "fp8_param_gather", "precision_aware_optimizer"}
    assert all(OPT_IN_FLAG_RULES[k] for k in booleans)
