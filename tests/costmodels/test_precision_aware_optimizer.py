"""Megatron-Core's precision-aware optimizer (--precision-aware-optimizer, --optimizer-state-dtype): the optimizer
bytes per parameter it keeps, the step it shortens, its rules through the CLI, its export and read-back.

Sources: NVIDIA/Megatron-LM megatron/core/optimizer/optimizer_config.py (use_precision_aware_optimizer,
store_param_remainders, exp_avg_dtype; the distributed-optimizer assertion), megatron/training/arguments.py
_add_experimental_args (--use-precision-aware-optimizer, --exp-avg-dtype, --exp-avg-sq-dtype), Transformer
Engine transformer_engine/pytorch/optimizers/fused_adam.py (remainders only for bf16 parameters).
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import model_state_bytes, optimizer_bytes_per_param
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.export import export
from paraplan.planner.readback import read_back
from paraplan.planner.readers import read_megatron_args
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL, JOB, CLUSTER = load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 16)
BASE = Plan(dp=16, zero=1, engine="megatron")
AWARE = replace(BASE, precision_aware_optimizer=True)
BF16_MOMENTS = replace(AWARE, optimizer_state_dtype="bf16")


@pytest.mark.parametrize("kw, k", [
    (dict(), 12),                                                              # fp32 master, fp32 moments
    (dict(precision_aware_optimizer=True), 2 + 4 + 4),                         # the master as its bf16 remainder
    (dict(precision_aware_optimizer=True, optimizer_state_dtype="bf16"), 2 + 2 + 2),
    (dict(precision_aware_optimizer=True, optimizer_state_dtype="fp16"), 2 + 2 + 2),
    (dict(precision_aware_optimizer=True, optimizer_state_dtype="fp8"), 2 + 1 + 1),
    # fp8 tensorwise: Megatron-Core keeps fp32 main parameters itself, no remainders
    (dict(dtype="fp8", precision_aware_optimizer=True, optimizer_state_dtype="bf16"), 4 + 2 + 2),
    # delayed scaling: FusedAdam holds the master; remainders of the bf16 weights, not of fp8 parameters
    (dict(dtype="fp8-delayed", precision_aware_optimizer=True), 2 + 4 + 4),
    (dict(dtype="fp8-delayed", fp8_param_gather=True, precision_aware_optimizer=True), 4 + 4 + 4),
    (dict(dtype="fp16", precision_aware_optimizer=True), 4 + 4 + 4),            # fp16 weights: no remainders
])
def test_optimizer_bytes_per_parameter(kw, k):
    assert float(optimizer_bytes_per_param(replace(BASE, **kw))) == k


def test_bf16_moments_halve_the_sharded_optimizer_states_and_nothing_else():
    psi = 1e9
    a, b = model_state_bytes(psi, BASE), model_state_bytes(psi, BF16_MOMENTS)
    assert np.isclose(a["optimizer_states"], 12 * psi / 16) and np.isclose(b["optimizer_states"], 6 * psi / 16)
    assert a["parameters"] == b["parameters"] and a["gradients"] == b["gradients"]


def test_the_estimate_holds_less_and_steps_faster_and_says_why():
    a, b = estimate(MODEL, JOB, CLUSTER, BASE), estimate(MODEL, JOB, CLUSTER, BF16_MOMENTS)
    ma, mb = a.memory_bytes_per_gpu, b.memory_bytes_per_gpu
    assert np.isclose(mb["optimizer_states"], ma["optimizer_states"] / 2, rtol=1e-9)
    assert mb["total"] < ma["total"]
    # the Adam step touches 28 - 2·(12 - 6) = 16 bytes a parameter instead of 28
    assert b.time_breakdown_s["optimizer"] < a.time_breakdown_s["optimizer"]
    said = [line for line in b.assumptions if "precision-aware" in line]
    assert said and "6 bytes/param" in said[0] and not any("precision-aware" in line for line in a.assumptions)


def _cli(capsys, *extra):
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--zero", "1", "--engine", "megatron", "--format", "json", *extra]
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out


def test_the_flags_reach_the_plan_and_the_json(capsys):
    rc, out = _cli(capsys, "--precision-aware-optimizer", "--optimizer-state-dtype", "bf16")
    assert rc == 0
    d = json.loads(out.out)
    assert d["plan"]["precision_aware_optimizer"] is True and d["plan"]["optimizer_state_dtype"] == "bf16"
    assert Plan.from_dict(d["plan"]).optimizer_state_dtype == "bf16"
    rc, out = _cli(capsys)
    assert d["memory_bytes_per_gpu"]["optimizer_states"] < json.loads(out.out)["memory_bytes_per_gpu"]["optimizer_states"]


@pytest.mark.parametrize("extra, field, needle", [
    (("--optimizer-state-dtype", "int8"), "--optimizer-state-dtype", "fp32, bf16, fp16, fp8"),
    (("--optimizer-state-dtype", "bf16"), "--optimizer-state-dtype", "needs --precision-aware-optimizer"),
    (("--precision-aware-optimizer", "--engine", "deepspeed"), "--precision-aware-optimizer", "Megatron-Core's option"),
    (("--precision-aware-optimizer", "--engine", "scaling"), "--precision-aware-optimizer",
     "Megatron-Core's option"),
    (("--precision-aware-optimizer", "--zero", "0"), "--precision-aware-optimizer", "distributed optimizer"),
    (("--precision-aware-optimizer", "--zero", "3"), "--precision-aware-optimizer", "Megatron-FSDP"),
    (("--precision-aware-optimizer", "--dtype", "fp32"), "--precision-aware-optimizer", "trains in fp32"),
])
def test_bad_input_is_one_line_naming_the_field(capsys, extra, field, needle):
    rc, out = _cli(capsys, *extra)
    lines = out.err.strip().splitlines()
    assert rc == 2 and out.out == ""
    assert lines[0].startswith("paraplan") and "error:" in lines[0] and field in lines[0] and needle in lines[0]
    assert "Traceback" not in out.err


def doc(**plan):
    return {"schema": PLAN_SCHEMA, "estimate": {},
            "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16, "seq_len": 4096, "global_batch": 64},
            "plan": dict(zero=1, engine="megatron", **plan)}


@pytest.mark.parametrize("plan, flags", [
    (dict(precision_aware_optimizer=True), ["--use-precision-aware-optimizer"]),
    (dict(precision_aware_optimizer=True, optimizer_state_dtype="bf16"),
     ["--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]),
    (dict(), []),
])
def test_megatron_export_writes_the_flags_and_reads_back_to_the_same_estimate(plan, flags):
    text = export(doc(**plan), "megatron").text
    for flag in flags:
        assert f"  {flag} \\" in text.splitlines()
    if not flags:
        assert "precision-aware" not in text and "--exp-avg" not in text
    assert read_back(doc(**plan), "megatron", torchtitan_format="python").same


def test_the_reader_reads_megatron_lms_flags():
    argv = ["--use-distributed-optimizer", "--bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
            "--exp-avg-sq-dtype", "fp32", "--main-grads-dtype", "bf16"]
    r = read_megatron_args(argv)
    assert r.plan.precision_aware_optimizer and r.plan.optimizer_state_dtype == "fp32"     # the wider of the two
    assert any("--exp-avg-sq-dtype fp32" in u for u in r.unexpressed)
    assert not any("--main-grads-dtype" in u for u in r.unexpressed)
    r = read_megatron_args(["--use-distributed-optimizer", "--bf16"])
    assert not r.plan.precision_aware_optimizer and r.plan.optimizer_state_dtype == "fp32"
    # Megatron-Core refuses low-precision moments without the option; so does the read plan
    r = read_megatron_args(["--use-distributed-optimizer", "--bf16", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype",
                            "bf16"])
    assert r.plan is None and any("optimizer_state_dtype" in u for u in r.unexpressed)


@pytest.mark.parametrize("engine", ["deepspeed", "torchtitan"])
def test_other_engines_run_it_as_fp32_states(engine):
    out = export(doc(precision_aware_optimizer=True, optimizer_state_dtype="bf16"), engine)
    assert not out.plan.precision_aware_optimizer and out.plan.optimizer_state_dtype == "fp32"
    assert "fp32 master weights" in out.summary


def test_plan_fix_turns_it_on_where_it_runs(capsys):
    argv = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--engine", "megatron", "--fix", "precision_aware_optimizer=true", "--fix",
            "optimizer_state_dtype=bf16", "--top", "20", "--format", "json"]
    assert main(argv) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    # the moments' dtype pins every candidate; the precision-aware optimizer is on wherever it runs (ZeRO-1), and
    # the candidates it cannot run on are dropped by the moments' rule
    assert plans and all(p["plan"]["optimizer_state_dtype"] == "bf16" for p in plans)
    assert all(p["plan"]["precision_aware_optimizer"] and p["plan"]["zero"] == 1 for p in plans)


# --- calibration: where Megatron-Bridge's recipes and scripts set it -----------------------------------
def _h100_cases():
    from paraplan.calibration.h100 import load_h100_cases
    return load_h100_cases()[0]


def test_calibration_reads_the_precision_aware_optimizer_where_the_recipes_set_it():
    cases = _h100_cases()
    bridge = [c for c in cases if c.source == "Megatron-Bridge"]
    deepseek = [c for c in bridge if c.model.name.startswith("deepseek-v3")]
    # the DeepSeek-V3 recipe: bf16 moments in every precision (6 rows of the file)
    assert len(deepseek) == 6
    assert all(c.plan.precision_aware_optimizer and c.plan.optimizer_state_dtype == "bf16" for c in deepseek)
    # the performance scripts: on for bf16 runs with fp32 moments, off for the other fp8 runs and under FSDP
    for c in bridge:
        if c in deepseek:
            continue
        on = c.plan.dtype == "bf16" and c.plan.zero == 1
        assert (c.plan.precision_aware_optimizer, c.plan.optimizer_state_dtype) == (on, "fp32"), c.label
        assert any("precision-aware optimizer" in a for a in c.assumed) == on
    assert any(c.plan.dtype == "bf16" and c.plan.precision_aware_optimizer for c in bridge)
    assert any(c.plan.zero == 3 and not c.plan.precision_aware_optimizer for c in bridge)
    # NeMo 24.07 predates it (and its memory switches are not the lightest-settings fallback's to turn on)
    assert not any(c.plan.precision_aware_optimizer for c in cases if c.source != "Megatron-Bridge")


@pytest.mark.parametrize("model, gpus, tp, moments", [
    ("llama3-8b", 2, 1, "fp32"),      # 97 GiB; bf16 gradients 82; the precision-aware optimizer 75: stops there
    ("llama3-70b", 16, 8, "bf16"),    # 108; 91; 83; with bf16 moments 66
])
def test_a_run_that_states_nothing_gets_it_only_where_lighter_switches_do_not_fit(model, gpus, tp, moments):
    from paraplan.calibration.cases import lightest_fitting_settings
    model, job, cluster = load_model(model), TrainingJob(4096, 64), load_cluster("dgx-h100", gpus)
    plan = Plan(tp=tp, dp=gpus // tp, zero=1, engine="megatron", recompute="full")
    assert not estimate(model, job, cluster, plan).feasible
    notes: list[str] = []
    fit = lightest_fitting_settings(model, job, cluster, plan, {"recompute"}, notes)
    assert fit.grad_reduce_bf16 and fit.precision_aware_optimizer and fit.optimizer_state_dtype == moments
    assert estimate(model, job, cluster, fit).feasible
    assert not estimate(model, job, cluster, replace(fit, precision_aware_optimizer=False,
                                                     optimizer_state_dtype="fp32")).feasible
    assert notes and "precision_aware_optimizer = True" in notes[0] and "not stated by the source" in notes[0]
    # a source that states it (Megatron-Bridge's scripts, NeMo 24.07) keeps it as stated
    kept = lightest_fitting_settings(model, job, cluster, plan, {"recompute", "precision_aware_optimizer"}, [])
    assert not kept.precision_aware_optimizer
