"""What the validation harness runs of a Plan (validation.support's table), tied to what its builder
(validation.sizing.size_run) accepts, refuses and runs instead; validate's flags are the shared plan flags.
No torchrun here, and no torch needed but for the last test's worker import."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from paraplan.errors import ConfigError
from paraplan.plan import MODES, Plan
from paraplan.validation.config import GPTConfig, RunOptions
from paraplan.validation.sizing import size_run
from paraplan.validation.support import (HARNESS_LIMITS, REFUSED, RUNS, RUNS_AS, SUPPORT, as_run, check_runs,
                                         refused, support_markdown, support_of)

#: what a value needs beside it to make a Plan (its own rules) that the harness runs
COMPANIONS = {
    ("sp", True): dict(tp=2), ("vpp", 2): dict(pp=2, schedule="interleaved"),
    ("schedule", "interleaved"): dict(pp=2, vpp=2), ("schedule", "zb-h1"): dict(pp=2), ("schedule", "gpipe"): dict(pp=2),
    ("offload", "cpu"): dict(zero=1), ("offload", "nvme"): dict(zero=1),
    ("offload_params", True): dict(zero=3, offload="cpu", engine="deepspeed"),
    ("delayed_update", True): dict(zero=1, offload="cpu"), ("ep", 2): dict(dp=2),
    ("etp", 2): dict(tp=2, sp=True), ("cp_mode", "ulysses"): dict(cp=2), ("cp", 2): {}, ("tp", 2): {},
    ("optimizer", "onebit-adam"): dict(engine="deepspeed"), ("optimizer", "zero-one-adam"): dict(engine="deepspeed"),
    ("optimizer", "onebit-lamb"): dict(engine="deepspeed"), ("flash_attention", False): dict(attention_kernel="auto"),
    ("fused_softmax", False): dict(flash_attention=False), ("first_stage_layers", 1): dict(pp=2),
    ("last_stage_layers", 1): dict(pp=2), ("tp_comm_overlap", True): dict(tp=2, sp=True, engine="megatron"),
    ("grad_reduce_bf16", True): dict(engine="megatron"), ("te_cross_entropy", True): dict(engine="megatron"), ("fp8_param_gather", True): dict(dtype="fp8", engine="megatron", zero=1),
    ("offload_activation_layers", 1): dict(engine="megatron"), ("ep_comm_overlap", True): dict(ep=2, dp=2, engine="megatron"),
    ("moe_flex_dispatch", True): dict(ep=2, dp=2, engine="megatron"),
    ("recompute_modules", "core_attn"): dict(recompute="selective", engine="megatron"),
    ("engine", "deepspeed"): {}, ("engine", "scaling"): {}, ("dtype", "mxfp8"): {},
    ("precision_aware_optimizer", True): dict(engine="megatron", zero=1, dtype="bf16"),
    **{("optimizer_state_dtype", d): dict(engine="megatron", zero=1, dtype="bf16", precision_aware_optimizer=True)
       for d in ("bf16", "fp16", "fp8")},
}
#: the harness model a value needs (experts for ep, the fused attention for op-sac)
MODEL_FOR = {("ep", 2): dict(experts=4), ("etp", 2): dict(experts=4), ("ep_comm_overlap", True): dict(experts=4),
             ("moe_flex_dispatch", True): dict(experts=4), ("recompute", "op-sac"): dict(attention="sdpa")}
#: values to try for fields that take any count
SAMPLES = {"tp": (1, 2), "pp": (1, 2), "dp": (0, 1, 2), "cp": (1, 2), "vpp": (1, 2), "micro_batch": (1, 2),
           "ep": (1, 2), "etp": (1, 2), "first_stage_layers": (0, 1), "last_stage_layers": (0, 1),
           "offload_activation_layers": (0, 1), "recompute_modules": ("", "core_attn")}
SMALL = {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab_size": 256}


def _values(field):
    default = next(f.default for f in fields(Plan) if f.name == field)
    if field in SAMPLES:
        return SAMPLES[field]
    if isinstance(default, bool):
        return (False, True)
    if field == "zero":
        return (0, 1, 2, 3)
    return MODES[field].labels()


CASES = [(f.name, v) for f in fields(Plan) for v in _values(f.name)]


def _plan(field, value):
    return Plan(**{**COMPANIONS.get((field, value), {}), field: value})


def _size(plan, field=None, value=None, **kw):
    model = {**SMALL, **MODEL_FOR.get((field, value), {})}
    return size_run(plan, model, RunOptions(), **kw)


@pytest.mark.parametrize("field, value", CASES)
def test_every_value_the_table_runs_the_builder_runs_and_every_refusal_names_the_field(field, value):
    s = support_of(field, value)
    plan = _plan(field, value)
    if s.verdict == REFUSED:
        with pytest.raises(ConfigError) as e:
            _size(plan, field, value)
        first, _, entry = refused(plan)[0]   # fp8_param_gather comes with an fp8 dtype, refused first
        assert (field, value, s) in refused(plan)
        assert e.value.field == first and entry.what in e.value.problem and e.value.accepted == entry.accepted
        return
    sized = _size(plan, field, value)
    ran = getattr(sized.plan, field)
    if s.verdict == RUNS and s.runs_as is None:
        assert ran == value or (field, value, ran) == ("dp", 0, 1)   # dp 0: what the ranks leave
    else:                                      # runs as the value the table gives, said where it differs
        assert ran == s.value_run(plan, sized.model)
        if ran != value and value != next(f.default for f in fields(Plan) if f.name == field):
            assert any(n.startswith(f"{field} ") and "runs as" in n for n in sized.notes), sized.notes
    assert as_run(sized.plan, sized.model) == sized.plan     # what it runs, it runs as itself


def test_the_table_names_every_enumerable_value_and_only_plan_fields():
    names = {f.name for f in fields(Plan)}
    assert {s.field for s in SUPPORT} <= names
    for field in names:
        for value in _values(field):
            assert support_of(field, value).verdict in (RUNS, RUNS_AS, REFUSED)
    # a value the table does not list runs at the field's default
    assert support_of("optimizer", "onebit-lamb").runs_as == "adam"
    assert support_of("schedule", "zb-h1").runs_as == "1f1b" and support_of("dtype", "bf16").runs_as == "fp32"
    assert {s.what for s in SUPPORT if s.verdict == REFUSED} >= {"parameter offload", "fp8"}


def test_a_refusal_from_a_plan_file_names_the_file_and_a_flag_beside_it_wins(tmp_path):
    nvme = Plan(zero=1, offload="nvme")
    with pytest.raises(ConfigError) as e:
        _size(nvme, plan_file="p.json")
    assert e.value.field == "plan" and e.value.problem.startswith("p.json: offload nvme:")
    with pytest.raises(ConfigError) as e:        # the flag gave it: the flag is named
        _size(nvme, plan_file="p.json", flags_given={"offload"})
    assert e.value.field == "offload"


def test_the_prediction_sees_the_plan_the_harness_runs():
    """estimator_plan is the plan as run (dtype fp32, the generic engine, ...): a plan file's switches the
    harness has not change nothing, and the mapping is the one validate used before it took a Plan."""
    from paraplan.validation.predict import estimator_plan
    cfg = GPTConfig(**SMALL, activation="swiglu", attention="sdpa")
    plain = Plan(tp=2, pp=2, dp=1, sp=True, vpp=2, schedule="interleaved", zero=1, recompute="full")
    fancy = replace(plain, dtype="bf16", engine="megatron", tp_comm_overlap=True, grad_reduce_bf16=True,
                    attention_kernel="cudnn", grad_accumulation_fusion=True, fused_softmax=True, rope_fusion=False,
                    overlap_grad_reduce=True)
    assert estimator_plan(cfg, fancy, cpu=True) == estimator_plan(cfg, plain, cpu=True) == Plan(
        tp=2, pp=2, dp=1, cp=1, cp_mode="ring", ep=1, etp=1, sp=True, vpp=2, micro_batch=1, schedule="interleaved",
        zero=1, recompute="full", dtype="fp32", offload="none", flash_attention=True, overlap_grad_reduce=False,
        grad_accumulation_fusion=False, fused_elementwise=False)
    offload = Plan(dp=2, zero=2, offload="cpu", engine="deepspeed", delayed_update=True, dtype="fp16")
    assert estimator_plan(GPTConfig(**SMALL), offload, cpu=True) == Plan(
        dp=2, zero=2, offload="cpu", dtype="fp32", flash_attention=False, overlap_grad_reduce=False,
        grad_accumulation_fusion=False)
    z3 = Plan(dp=2, zero=3)
    assert estimator_plan(cfg, z3, cpu=False).overlap_grad_reduce and not estimator_plan(cfg, z3, cpu=True).overlap_grad_reduce


LIMIT_CASES = {
    "whole-layers-per-chunk": (Plan(pp=2, dp=1), dict(layers=3)),
    "vocabulary-over-tp": (Plan(tp=2, dp=1), dict(vocab_size=255)),
    "kv-heads-over-tp": (Plan(tp=2, dp=1), dict(kv_heads=1)),
    "zero3-without-pipeline": (Plan(pp=2, dp=1, zero=3), {}),
    "optimizer-offload-zero-1-2": (Plan(dp=2, zero=3, offload="cpu"), {}),
    "moe-under-tp-needs-sp": (Plan(tp=2, dp=1), dict(experts=4)),
    "etp-needs-experts": (Plan(tp=2, dp=1, sp=True, etp=2), {}),
    "etp-whole-tp-group": (Plan(tp=4, dp=1, sp=True, etp=2), dict(experts=4)),
    "etp-with-ep-1": (Plan(tp=2, dp=2, sp=True, etp=2, ep=2), dict(experts=4)),
    "expert-width-over-etp": (Plan(tp=2, dp=1, sp=True, etp=2), dict(experts=4, expert_ffn=15)),
    "zero3-without-ep": (Plan(dp=2, ep=2, zero=3), dict(experts=4)),
    "op-sac-on-fused-attention": (Plan(dp=1, recompute="op-sac"), {}),
    "op-sac-dense": (Plan(dp=1, recompute="op-sac"), dict(attention="sdpa", experts=4)),
    "op-sac-without-cp": (Plan(dp=1, cp=2, recompute="op-sac"), dict(attention="sdpa")),
}


@pytest.mark.parametrize("limit", HARNESS_LIMITS, ids=lambda x: x.name)
def test_each_harness_limit_refuses_by_its_field(limit):
    plan, model = LIMIT_CASES[limit.name]
    cfg = GPTConfig(**{**SMALL, **model})
    with pytest.raises(ConfigError) as e:
        check_runs(plan, cfg, RunOptions())
    assert e.value.field == limit.field and e.value.problem == limit.message(plan, cfg, RunOptions().for_plan(plan))


@pytest.mark.parametrize("plan, model, field, said", [
    (Plan(tp=3, dp=1), {}, "tp", "heads(4) % tp(3)"),
    (Plan(cp=3, dp=1), {}, "cp", "seq_len(32) % (2 * cp(3))"),
    (Plan(dp=2, ep=2), {}, "ep", "needs a mixture-of-experts model"),
    (Plan(dp=1, ep=2), dict(experts=4), "ep", "dp(1) % ep(2)"),
    (Plan(dp=4, ep=4), dict(experts=6), "ep", "experts(6) % ep(4)"),
    (Plan(tp=4, cp=2, dp=1, sp=True), dict(seq_len=36), "sp", "seq_len(36) % cp(2) * tp(4)"),
])
def test_the_plans_own_rules_are_checked_on_the_harness_model_not_repeated(plan, model, field, said):
    """The Plan's rules (paraplan.plan.RULES) on the harness's model and batch, with their own messages,
    named by the field the harness changes."""
    with pytest.raises(ConfigError) as e:
        check_runs(plan, GPTConfig(**{**SMALL, **model}), RunOptions())
    assert e.value.field == field and said in e.value.problem
    with pytest.raises(ConfigError) as e:
        check_runs(Plan(dp=2, micro_batch=2), GPTConfig(**SMALL), RunOptions(global_batch=6))
    assert e.value.field == "global_batch" and "global_batch(6) % (dp(2) * micro_batch(2))" in e.value.problem


def test_docs_hold_the_support_table():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "validation.md").read_text()
    assert support_markdown() in docs


def test_validate_flags_are_the_shared_plan_flags_and_every_flag_has_help():
    """validate's plan flags are estimate's (names, types, choices, help); its own flags all say what they do;
    the two spellings validate had before (--sequence-parallel, --virtual-stages) set the same fields."""
    from paraplan.cli import build_parser
    from paraplan.cli.common import PLAN_FLAGS
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    validate, estimate = sub.choices["validate"], sub.choices["estimate"]

    def plan_actions(p):
        return {a.option_strings[0]: (a.dest, a.type is None, a.choices, a.help, a.nargs, a.const)
                for a in p._actions if a.dest in PLAN_FLAGS or a.dest in ("plan", "sp_mode")}
    shared, ours = plan_actions(estimate), plan_actions(validate)
    assert {k: v for k, v in ours.items() if k in shared} == shared
    assert set(ours) - set(shared) == {"--sequence-parallel", "--virtual-stages"}
    own = [a for a in validate._actions if a.dest not in PLAN_FLAGS and a.dest not in ("plan", "sp_mode", "help")]
    assert own and all(a.help for a in own), [a.option_strings for a in own if not a.help]
    args = build_parser().parse_args(["validate", "--sequence-parallel", "--virtual-stages", "2", "--out", "o"])
    assert (args.sp, args.vpp) == (True, 2)


def test_validate_is_sized_and_checked_without_torch(tmp_path):
    """The flags, a plan file, the model's sizing and every check run with torch unimportable."""
    from paraplan.costmodels.estimate import estimate
    from paraplan.hardware.catalog import load_cluster
    from paraplan.planfile import write_plan_file
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    plan = Plan(tp=2, dp=1, sp=True, pp=2, vpp=4, schedule="interleaved")
    write_plan_file(tmp_path / "p.json", estimate(load_model("llama3-8b"), TrainingJob(2048, 8),
                                                  load_cluster("dgx-h100", 4), plan), "llama3-8b", "dgx-h100")
    code = ("import sys\nsys.modules['torch'] = None\n"
            "from paraplan.cli import build_parser\nfrom paraplan.cli.validate import check_validate_args\n"
            f"s = check_validate_args(build_parser().parse_args(['validate', '--plan', {str(tmp_path / 'p.json')!r}, "
            f"'--out', {str(tmp_path / 'o')!r}]))\n"
            "print(s.world_size, s.model.layers, s.model.kv_heads, s.model.activation, s.plan.dtype)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["4", "8", "2", "swiglu", "fp32"]
