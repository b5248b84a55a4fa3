"""A plan field is declared once (issue 63): ``Plan`` is the one list of fields; each field's kind
(how it is checked, parsed, held in a PlanBatch and offered as a flag) follows from its declaration,
``PlanBatch`` is generated from it and the flag help is the field's docstring."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, fields

import numpy as np
import pytest

from paraplan.cli.common import PLAN_FLAG_CHOICES
from paraplan.errors import ConfigError
from paraplan.plan import (BOOL_FIELDS, CHECK_ORDER, MODES, PLAN_FIELD_SPECS, PLAN_FIELDS, POSITIVE_INT_FIELDS,
                           RECOMPUTE_MODULES, STAGE_LAYER_FIELDS, STAGE_LAYER_ZERO_MEANS, AttentionKernel, CpMode,
                           Dtype, Engine, FieldSpec, Offload, Optimizer, Plan, PlanBatch, Recompute, Schedule,
                           attribute_docstrings, parse_field)


def test_the_kind_tuples_are_derived_from_plan():
    """The names other modules import are derived (a new field joins its kind's tuple), and start
    with what they held when they were written out by hand."""
    specs = PLAN_FIELD_SPECS.values()
    assert POSITIVE_INT_FIELDS == tuple(f.name for f in fields(Plan) if type(f.default) is int and f.default >= 1
                                        and not f.metadata)
    assert BOOL_FIELDS == tuple(f.name for f in fields(Plan) if type(f.default) is bool)
    assert MODES == {s.name: s.mode for s in specs if s.mode is not None}
    assert POSITIVE_INT_FIELDS[:7] == ("tp", "pp", "cp", "vpp", "micro_batch", "ep", "etp")
    assert BOOL_FIELDS[:14] == ("sp", "offload_params", "flash_attention", "overlap_grad_reduce", "delayed_update",
                                "grad_accumulation_fusion", "fused_elementwise", "fused_softmax", "rope_fusion",
                                "tp_comm_overlap", "grad_reduce_bf16", "fp8_param_gather", "ep_comm_overlap",
                                "moe_flex_dispatch")
    assert STAGE_LAYER_FIELDS[:3] == ("first_stage_layers", "last_stage_layers", "offload_activation_layers")
    assert STAGE_LAYER_ZERO_MEANS.items() >= {"first_stage_layers": "the automatic split",
                                              "last_stage_layers": "the automatic split",
                                              "offload_activation_layers": "none"}.items()
    assert MODES.items() >= {"schedule": Schedule, "recompute": Recompute, "offload": Offload, "dtype": Dtype,
                             "cp_mode": CpMode, "optimizer": Optimizer, "engine": Engine,
                             "attention_kernel": AttentionKernel}.items()
    assert PLAN_FLAG_CHOICES.items() >= {"schedule": Schedule.labels(), "recompute": Recompute.labels(),
                                         "offload": Offload.labels(), "dtype": Dtype.labels(),
                                         "optimizer": Optimizer.labels(), "zero": (0, 1, 2, 3),
                                         "engine": Engine.labels(), "attention_kernel": AttentionKernel.labels()}.items()
    assert PLAN_FLAG_CHOICES["cp_mode"] == CpMode.labels()     # its own flag, --cp-mode (issue 67; --sp-mode before)
    assert {s.kind for s in specs} == set(CHECK_ORDER)


def test_planbatch_columns_are_the_plan_fields():
    """One column per field, in Plan's order: modes as codes, the module list as a mask, dtype one label."""
    columns = [f.name for f in fields(PlanBatch)]
    assert columns == [s.column for s in PLAN_FIELD_SPECS.values()]
    assert columns[:35] == [
        "tp", "pp", "dp", "cp", "sp", "vpp", "micro_batch", "schedule_code", "zero", "recompute_code", "offload_code",
        "offload_params", "dtype", "flash_attention", "overlap_grad_reduce", "ep", "etp", "cp_mode_code",
        "optimizer_code", "delayed_update", "grad_accumulation_fusion", "fused_elementwise", "fused_softmax",
        "rope_fusion", "engine_code", "first_stage_layers", "last_stage_layers", "tp_comm_overlap", "grad_reduce_bf16",
        "fp8_param_gather", "offload_activation_layers", "attention_kernel_code", "ep_comm_overlap",
        "moe_flex_dispatch", "recompute_modules_mask"]
    plan = Plan(tp=2, sp=True, recompute="selective", recompute_modules="mlp", engine="megatron")
    for spec in PLAN_FIELD_SPECS.values():          # a Plan reads as the batch does
        assert getattr(plan, spec.column) == spec.encode(getattr(plan, spec.name))
    assert plan.engine_code is Engine.MEGATRON and plan.recompute_modules_mask == 8


def _random_plans(rng, n: int) -> list[Plan]:
    """Plans with a few fields each drawn from their kind's values (the ones Plan refuses dropped)."""
    values = {"count": [1, 2, 4], "derived": [0, 2, 8], "layers": [0, 1, 3], "choice": [0, 1, 2, 3],
              "switch": [False, True], "modules": ["", "core_attn", "layernorm,moe_act"]}
    specs = [s for s in PLAN_FIELD_SPECS.values() if s.name != "dtype"]
    plans = []
    for _ in range(100 * n):
        kw = {}
        for i in rng.choice(len(specs), size=3, replace=False):
            pool = specs[i].mode.labels() if specs[i].kind == "mode" else values[specs[i].kind]
            kw[specs[i].name] = pool[rng.integers(len(pool))]
        try:
            plans.append(Plan(**kw))
        except ConfigError:
            continue
        if len(plans) == n:
            break
    return plans


#: plans that set the fields a few random ones rarely reach (they need other fields set with them)
RARE = [Plan(pp=4, vpp=2, schedule="interleaved", first_stage_layers=0), Plan(pp=2, first_stage_layers=3, last_stage_layers=5),
        Plan(zero=3, offload="nvme", offload_params=True, engine="deepspeed"),
        Plan(zero=1, offload="cpu", delayed_update=True, engine="deepspeed"),
        Plan(flash_attention=False, fused_softmax=False), Plan(tp=2, sp=True, tp_comm_overlap=True, etp=2),
        Plan(engine="megatron", grad_reduce_bf16=True), Plan(ep=4, moe_flex_dispatch=True, ep_comm_overlap=True),
        Plan(recompute="selective", recompute_modules="moe_act,mla_up_proj", engine="megatron")]


def test_a_batch_gives_back_the_plans_it_was_built_from():
    plans = _random_plans(np.random.default_rng(0), 100) + RARE
    varied = {s.name for s in PLAN_FIELD_SPECS.values() if any(getattr(p, s.name) != s.default for p in plans)}
    assert len(varied) >= 33            # all 35 fields of the time but dtype and fp8_param_gather (below)
    assert {PLAN_FIELD_SPECS[name].kind for name in varied} == set(CHECK_ORDER)
    batch = PlanBatch.from_plans(plans)
    assert len(batch) == len(plans) and batch.dtype == "bf16"
    assert [batch.plan(i) for i in range(len(plans))] == plans
    picked = batch.take(np.array([5, 0, len(plans) - 1]))
    assert [picked.plan(i) for i in range(3)] == [plans[5], plans[0], plans[-1]]
    assert batch.take(slice(10, 12)).plan(1) == plans[11]
    fp8 = [Plan(engine="megatron", dtype="fp8", zero=1, fp8_param_gather=True), Plan(dtype="fp8")]
    batch = PlanBatch.from_plans(fp8)                  # dtype: one label for the batch
    assert batch.dtype == "fp8" and [batch.plan(0), batch.plan(1)] == fp8


def test_columns_left_out_take_the_plan_defaults():
    batch = PlanBatch(tp=np.array([2, 4]), recompute_code=np.array([0, 1]), dtype="fp16")
    assert batch.plan(0) == Plan(tp=2, dtype="fp16") and batch.plan(1) == Plan(tp=4, recompute="selective", dtype="fp16")
    assert batch.flash_attention.dtype == bool and batch.engine_code.tolist() == [0, 0]
    assert batch.recompute_modules_mask.tolist() == [0, 0] and batch.dp.tolist() == [0, 0]
    with pytest.raises(TypeError):
        PlanBatch()


@pytest.mark.parametrize("kw, message", [
    ({"zero": 4}, "zero: unknown ZeRO stage 4 (accepted: 0, 1, 2, 3)"),
    ({"first_stage_layers": -1}, "first-stage-layers: must be a positive integer (or 0 for the automatic split), got -1"),
    ({"offload_activation_layers": -1}, "offload-activation-layers: must be a positive integer (or 0 for none), got -1"),
    ({"dp": -1}, "dp: must be a positive integer (or 0 for 'what is left'), got -1"),
    ({"micro_batch": 0}, "micro-batch: must be a positive integer, got 0"),
    ({"tp": 2**31}, "tp: must be at most 2,147,483,647, got 2147483648"),
    ({"sp": 1}, "sp: expected true or false, got 1"),
    ({"cp_mode": "x"}, "cp_mode: unknown value 'x' (accepted: ring, ulysses)"),
    ({"recompute_modules": "foo"}, "recompute_modules: unknown module 'foo'"),
    # of several bad fields the first in CHECK_ORDER is named (counts, dp, modes, zero, layers, switches)
    ({"dp": -1, "schedule": "x"}, "dp: "),
    ({"ep": 0, "schedule": "x"}, "ep: "),
    ({"schedule": "x", "zero": 9}, "schedule: "),
    ({"zero": 9, "offload_activation_layers": -2}, "zero: "),
    ({"first_stage_layers": -1, "sp": "no"}, "first-stage-layers: "),
])
def test_each_kind_checks_its_field(kw, message):
    with pytest.raises(ConfigError) as e:
        Plan(**kw)
    assert str(e.value).startswith(message)


def test_fields_from_text():
    assert parse_field("sp", "1") is True and parse_field("zero", " 2 ") == 2 and parse_field("engine", "megatron ") == "megatron"
    assert parse_field("recompute_modules", "moe_act, layernorm") == "layernorm,moe_act"
    assert parse_field("first_stage_layers", "0") == 0
    for name, text, message in (("tp", "x", "--fix tp: expected an integer, got 'x'"),
                                ("sp", "maybe", "--fix sp: expected true or false (or 1 or 0), got 'maybe'"),
                                ("zero", "5", "--fix zero: unknown ZeRO stage 5")):
        with pytest.raises(ConfigError) as e:
            parse_field(name, text, where=f"--fix {name}")
        assert str(e.value).startswith(message)


def test_a_field_whose_kind_does_not_follow_is_refused():
    @dataclass
    class Odd:
        layers: int = 0
        name: str = "x"

    for f in fields(Odd):
        with pytest.raises(TypeError, match=f"Odd|{f.name}"):
            FieldSpec.of(f)


def test_attribute_docstrings():
    @dataclass
    class Documented:
        a: int = 1
        """The first
        field, on two lines."""
        b: bool = False
        c: str = "x"
        """About c."""
        "a string that documents nothing"

    docs = attribute_docstrings(Documented)
    assert docs == {"a": "The first\nfield, on two lines.", "c": "About c."}
    assert attribute_docstrings(Documented) is docs                # read once
    assert set(attribute_docstrings(Plan)) == set(PLAN_FIELDS)
    assert all(len(doc) > 20 for doc in attribute_docstrings(Plan).values())
    assert ", ".join(RECOMPUTE_MODULES) in " ".join(attribute_docstrings(Plan)["recompute_modules"].split())


NOT_ON_THE_HOT_PATH = """
from paraplan.plan import attribute_docstrings
from paraplan.scenario import load_scenario
from paraplan.costmodels.estimate import estimate
from paraplan.plan import Plan
sc = load_scenario("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64)
plan = Plan(tp=2).with_dp_for(8)
estimate(sc.model, sc.job(plan), sc.cluster, plan)
assert attribute_docstrings.cache_info().misses == 0, "an estimate read the docstrings"
from paraplan.cli import build_parser
build_parser(); build_parser()
info = attribute_docstrings.cache_info()
assert (info.misses, info.currsize) == (2, 2), info   # Plan's and SpaceOptions' (plan --no-engine-switches)
"""


def test_docstrings_are_read_once_and_only_for_the_command_line():
    r = subprocess.run([sys.executable, "-c", NOT_ON_THE_HOT_PATH], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
