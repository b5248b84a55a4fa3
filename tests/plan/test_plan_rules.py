"""Modes as enums, the one table of legality rules (Plan, check_plan and the search's mask agree),
and ``--fix`` by name with the same validation as the plan fields."""
import json

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import (CP_MODES, ILLEGAL, OPTIMIZERS, PRUNE, RULES, SCHEDULES, CpMode, Dtype, Offload, Optimizer, Plan,
                           PlanBatch, Recompute, Scene, Schedule, check_plan)
from paraplan.planner.search import search
from paraplan.planner.space import SpaceOptions, compose, parse_fix, rule_stage
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

SCENARIO = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64"]


# --- modes -------------------------------------------------------------------------------------------
def test_modes_keep_their_codes_and_labels():
    assert SCHEDULES == ("1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "dualpipe", "dualpipev")
    assert CP_MODES == ("ring", "ulysses")
    assert OPTIMIZERS == ("adam", "onebit-adam", "zero-one-adam", "onebit-lamb")
    assert Schedule.ONE_F_ONE_B.label == "1f1b" and Schedule.ONE_F_ONE_B == 0 and Schedule.ZB_H1 == 3
    assert Schedule.parse("interleaved") is Schedule.INTERLEAVED
    assert Recompute.FULL == 2 and Dtype.FP32.label == "fp32"
    assert Plan(optimizer="zero-one-adam").optimizer_code is Optimizer.ZERO_ONE_ADAM
    assert np.array_equal(np.array([0, 1]) == CpMode.ULYSSES, [False, True])


def test_mode_parse_names_field_and_accepted():
    with pytest.raises(ConfigError) as e:
        Schedule.parse("1F1B")
    assert e.value.field == "schedule" and e.value.accepted == "1f1b, interleaved, gpipe, zb-h1, zbv, dualpipe, dualpipev"


def test_plan_batch_round_trips_plans():
    plans = [Plan(tp=2, pp=2, dp=2, schedule="interleaved", vpp=2, sp=True, cp_mode="ulysses"),
             Plan(zero=3, offload="nvme", offload_params=True, recompute="selective")]
    batch = PlanBatch.from_plans(plans)
    assert [batch.plan(i) for i in range(len(batch))] == plans


# --- --fix by name (CLI) ------------------------------------------------------------------------------
def _plan_cli(capsys, *fix):
    argv = ["plan", *SCENARIO, "--top", "3", "--format", "json"]
    for f in fix:
        argv += ["--fix", f]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_fix_optimizer_by_name(capsys):
    code, doc, _ = _plan_cli(capsys, "optimizer=adam")
    assert code == 0 and doc["plans"]
    assert {p["plan"]["optimizer"] for p in doc["plans"]} == {"adam"}
    assert "compressed optimizers need ZeRO-0" not in doc["rejected_by_reason"]


def _exit_and_message(capsys, *fix):
    code, doc, err = _plan_cli(capsys, *fix)
    assert doc is None and code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paraplan: error: ")
    return lines[0]


def test_fix_optimizer_code_is_one_line_error(capsys):
    line = _exit_and_message(capsys, "optimizer=0")
    assert "--fix optimizer" in line and "adam, onebit-adam, zero-one-adam, onebit-lamb" in line


def test_fix_illegal_tp_explains_the_rule(capsys):
    line = _exit_and_message(capsys, "tp=3")
    assert "--fix tp" in line and "heads(32) % tp(3) = 2, must be 0" in line
    # the same text check_plan gives for that tp
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 24)
    with pytest.raises(ConfigError) as e:
        check_plan(Plan(tp=3), model, TrainingJob(4096, 64), cluster)
    assert "heads(32) % tp(3) = 2, must be 0" in str(e.value)


def test_fix_zero_out_of_range_fails_before_search(capsys, monkeypatch):
    import paraplan.planner.space as space
    monkeypatch.setattr(space, "_grid", lambda *a: pytest.fail("the space was composed"))
    line = _exit_and_message(capsys, "zero=5")
    assert "--fix zero" in line and "0, 1, 2, 3" in line


@pytest.mark.parametrize("fix, field, value", [("cp_mode=ulysses", "cp_mode", "ulysses"),
                                               ("dtype=bf16", "dtype", "bf16"),
                                               ("flash_attention=false", "flash_attention", False),
                                               ("flash-attention=0", "flash_attention", False),
                                               ("schedule=gpipe", "schedule", "gpipe"),
                                               ("zero=1", "zero", 1), ("tp=8", "tp", 8)])
def test_fix_modes_and_flags_by_name(capsys, fix, field, value):
    # GPipe holds every micro-batch: on 8 GPUs only the generic engine's accounting fits it (megatron, the
    # commands' default, holds an fp32 main_grad besides)
    code, doc, _ = _plan_cli(capsys, fix, *(("engine=generic",) if fix == "schedule=gpipe" else ()))
    assert code == 0 and doc["plans"]
    assert {p["plan"][field] for p in doc["plans"]} == {value}


def test_fix_unknown_axis_names_the_accepted(capsys):
    line = _exit_and_message(capsys, "bogus=1")
    assert "unknown axis 'bogus'" in line and "optimizer" in line and "cp_mode" in line and "flash_attention" in line


@pytest.mark.parametrize("item, where", [("sp=maybe", "--fix sp"), ("tp=0", "--fix tp"), ("tp=x", "--fix tp"),
                                         ("dtype=fp4", "--fix dtype"), ("tp", "--fix")])
def test_parse_fix_rejects_bad_values(item, where):
    with pytest.raises(ConfigError) as e:
        parse_fix([item])
    assert e.value.field == where


def test_parse_fix_types():
    assert parse_fix(["tp=8", "sp=true", "zero=0", "optimizer=onebit-adam", "offload_params=1"]) == \
        {"tp": 8, "sp": True, "zero": 0, "optimizer": "onebit-adam", "offload_params": True}


# --- --fix through the Python API --------------------------------------------------------------------
def _llama():
    return load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 8)


def test_api_fixed_by_name():
    model, job, cluster = _llama()
    batch, rejected, _ = compose(model, job, cluster, SpaceOptions(fixed={"optimizer": "adam", "cp_mode": "ulysses"}))
    assert len(batch) and set(batch.optimizer_code) == {Optimizer.ADAM} and set(batch.cp_mode_code) == {CpMode.ULYSSES}
    result = search(model, job, cluster, options=SpaceOptions(fixed={"flash_attention": False}), top=2)
    assert result.plans and all(not e.plan.flash_attention for e in result.plans)


@pytest.mark.parametrize("fixed, field", [({"tp": 3}, "--fix tp"), ({"zero": 5}, "--fix zero"),
                                          ({"optimizer": 0}, "--fix optimizer"), ({"nope": 1}, "--fix"),
                                          ({"pp": 16, "vpp": 4}, "--fix pp, vpp"),
                                          ({"pp": 64, "vpp": 1}, "--fix pp, vpp")])
def test_api_fixed_errors(fixed, field):
    model, job, cluster = _llama()
    with pytest.raises(ConfigError) as e:
        compose(model, job, cluster, SpaceOptions(fixed=fixed))
    assert e.value.field == field


# --- one rule table: scalar check and vectorized mask agree ------------------------------------------
def test_rule_table_shape():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.kind for r in RULES} == {ILLEGAL, PRUNE}
    assert rule_stage(next(r for r in RULES if r.name == "tp-splits-heads")) == 1
    assert rule_stage(next(r for r in RULES if r.name == "compression-needs-zero0")) == 2
    assert rule_stage(next(r for r in RULES if r.name == "sp-needs-tp")) == 3


def test_bf16_without_support_is_illegal_both_ways():
    model, job, cluster = load_model("llama2-13b"), TrainingJob(4096, 32), load_cluster("dgx1-v100", 8)
    with pytest.raises(ConfigError, match="no bf16 support"):
        check_plan(Plan(dtype="bf16"), model, job, cluster)
    with pytest.raises(ConfigError, match="no bf16 support") as e:
        compose(model, job, cluster, SpaceOptions(fixed={"dtype": "bf16"}))
    assert e.value.field == "--fix dtype"


def test_search_reasons_come_from_the_table():
    model, job, cluster = _llama()
    _, rejected, _ = compose(model, job, cluster)
    assert set(rejected) <= {r.reason for r in RULES}


SCENES = [("llama3-8b", "dgx-h100", 16, 4096, 64), ("mixtral-8x7b", "dgx-h100", 32, 4096, 128),
          ("gpt3-175b", "dgx-a100-80g", 64, 2048, 256), ("llama2-13b", "dgx1-v100", 8, 4096, 32)]


@pytest.mark.slow
@pytest.mark.parametrize("model_name, system, gpus, seq, gbs", SCENES)
def test_every_candidate_passes_check_plan(model_name, system, gpus, seq, gbs):
    model, job, cluster = load_model(model_name), TrainingJob(seq, gbs), load_cluster(system, gpus)
    batch, _, _ = compose(model, job, cluster, SpaceOptions(allow_delayed_update=True))
    scene = Scene(model, job, cluster)
    for rule in RULES:
        if rule.kind == ILLEGAL:
            assert not rule.mask(batch, scene).any(), rule.name
    rng = np.random.default_rng(0)
    for i in rng.choice(len(batch), size=min(150, len(batch)), replace=False):
        plan = batch.plan(int(i))
        assert check_plan(plan, model, job, cluster) == plan


def _random_batch(rng, n: int, gpus: int, dtype: str) -> PlanBatch:
    """Random plans over all fields, legal or not, dp left for the GPU count (0 where it does not divide)."""
    pick = lambda *vals: rng.choice(np.array(vals), n)  # noqa: E731
    tp, pp, cp = pick(1, 2, 3, 4, 8), pick(1, 2, 3, 4), pick(1, 2, 3, 4)
    mp = tp * pp * cp
    return PlanBatch(tp=tp, pp=pp, dp=np.where(gpus % mp == 0, gpus // mp, 0), cp=cp, sp=pick(False, True),
                     vpp=pick(1, 1, 2, 3), micro_batch=pick(1, 2, 3, 4), schedule_code=pick(*range(len(Schedule))),
                     zero=pick(0, 1, 2, 3), recompute_code=pick(0, 1, 2), offload_code=pick(0, 1, 2),
                     offload_params=pick(False, False, True), flash_attention=np.ones(n, bool),
                     overlap_grad_reduce=np.ones(n, bool), ep=pick(1, 1, 2, 3), etp=pick(1, 1, 2),
                     cp_mode_code=pick(0, 1), optimizer_code=pick(0, 0, 1, 3), delayed_update=pick(False, True),
                     dtype=dtype)


def _plan_fields(batch: PlanBatch, i: int) -> dict:
    """Plan keyword arguments for row i (dp left at 0), without constructing (and so checking) a Plan."""
    out = {k: getattr(batch, k)[i].item() for k in ("tp", "pp", "cp", "sp", "vpp", "micro_batch", "zero",
                                                    "offload_params", "ep", "etp", "delayed_update")}
    for name, mode in (("schedule", Schedule), ("recompute", Recompute), ("offload", Offload),
                       ("cp_mode", CpMode), ("optimizer", Optimizer)):
        out[name] = mode(int(getattr(batch, f"{name}_code")[i])).label
    out["dtype"] = batch.dtype
    return out


@pytest.mark.parametrize("model_name, system, gpus, seq, gbs", SCENES)
def test_illegal_rules_and_scalar_check_agree(model_name, system, gpus, seq, gbs):
    model, job, cluster = load_model(model_name), TrainingJob(seq, gbs), load_cluster(system, gpus)
    scene = Scene(model, job, cluster)
    rng = np.random.default_rng(1)
    dtype = "bf16" if "bf16" in cluster.accelerator.peak_flops else "fp16"
    batch = _random_batch(rng, 400, gpus, dtype)
    illegal = np.zeros(len(batch), bool)
    for rule in RULES:
        if rule.kind == ILLEGAL:
            illegal |= rule.mask(batch, scene)
    assert illegal.any() and (~illegal).any()
    for i in range(len(batch)):
        fields = _plan_fields(batch, i)
        try:
            check_plan(Plan(**fields), model, job, cluster)
            rejected = False
        except ConfigError:
            rejected = True
        assert rejected == illegal[i], fields
