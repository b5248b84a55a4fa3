"""The engine specs (paraplan.engines): one per engine, the rules generated from them, their
model-state accounting against the documented bytes per parameter, and the vectorized lookups the cost
models read instead of comparing engine codes."""
from __future__ import annotations

import numpy as np
import pytest

from paraplan.costmodels import memory as M
from paraplan.engines import (BEHAVIOUR_FIELDS, ENGINE_RULES, SPECS, SWITCHES, Engine, engine_flag, engine_offers,
                              engine_select, spec_named, spec_of)
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.modes import MODE_FIELDS, FP8_DTYPES
from paraplan.plan import MODES, RULES, RULES_BY_NAME, Optimizer, Plan, PlanBatch, Recompute
from paraplan.planner.space import SpaceOptions, compose
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

LABELS = [s.label for s in SPECS]


def _refused(**kw) -> ConfigError | None:
    try:
        Plan(**kw)
    except ConfigError as e:
        return e
    return None


# --- one spec per engine ----------------------------------------------------------------------------
def test_one_spec_per_engine_in_code_order():
    assert [s.engine for s in SPECS] == list(Engine)
    assert [s.code for s in SPECS] == [0, 1, 2, 3, 4]
    assert spec_named(None) is SPECS[0] and spec_named("torchtitan").title == "torchtitan"
    assert spec_of(Plan(engine="scaling")).label == "scaling"
    with pytest.raises(ConfigError) as e:
        spec_named("megatronn")
    assert e.value.field == "engine"
    # the engine is a plan field like the other modes (plan.MODES and the modes' registry agree)
    assert all(MODE_FIELDS[cls] == name for name, cls in MODES.items())


def test_every_spec_offers_what_the_shared_choices_know():
    for s in SPECS:
        assert set(s.zero_stages) <= {0, 1, 2, 3} and 0 in s.zero_stages
        assert {"none", "full"} <= set(s.recompute) <= {"none", "selective", "full", "op-sac"}
        assert set(s.cp_modes) <= {"ring", "ulysses"}
        assert set(s.fp8_recipes) <= FP8_DTYPES
        assert "adam" in s.optimizers
        assert bool(s.zero_note) == (set(s.zero_stages) != {0, 1, 2, 3})
        assert bool(s.behaviour.cudnn_attention_note) == s.behaviour.picks_cudnn_attention
        assert (s.codebase is None) == (s.engine == Engine.GENERIC)


# --- the rules come from the specs ------------------------------------------------------------------
def test_every_engine_capability_yields_its_rule_in_the_table():
    """Every switch, every engine's own refusal and the five shared choices have a rule in
    plan.RULES, with the generated name, reason, axes, field and accepted text; no other rule of the
    table is generated."""
    names = [r.name for r in RULES]
    expected = ({sw.rule for sw in SWITCHES} | {ref.rule for s in SPECS for ref in s.refusals}
                | {"engine-zero-stages", "engine-recompute", "engine-cp-mode", "engine-fp8-recipe", "engine-optimizer"})
    assert set(ENGINE_RULES) == expected
    assert all(names.count(n) == 1 for n in expected)
    for name, er in ENGINE_RULES.items():
        rule = RULES_BY_NAME[name]
        assert (rule.reason, rule.axes, rule.field, rule.accepted, rule.kind, rule.uses_scene) == \
            (er.reason, frozenset(er.axes), er.field, er.accepted, "illegal", False)
        assert "engine_code" in rule.axes


SWITCH_PLANS = {   # a plan that turns the switch on and passes every rule but the engine's
    "offload": dict(offload="cpu"),
    "offload_activation_layers": dict(offload_activation_layers=2),
    "grad_reduce_bf16": dict(grad_reduce_bf16=True),
    "fp8_param_gather": dict(fp8_param_gather=True, dtype="fp8"),
    "te_cross_entropy": dict(te_cross_entropy=True),
    "precision_aware_optimizer": dict(precision_aware_optimizer=True, optimizer_state_dtype="bf16"),
    "tp_comm_overlap": dict(tp=2, sp=True, tp_comm_overlap=True),
    "ep_comm_overlap": dict(ep=2, ep_comm_overlap=True),
    "moe_flex_dispatch": dict(ep=2, moe_flex_dispatch=True),
    "recompute_modules": dict(recompute="selective", recompute_modules="moe_act"),
}


#: where an engine runs a switch only in one layout (torchtitan: the expert all-to-all overlap under DualPipeV)
SWITCH_PLAN_ON_ENGINE = {("ep_comm_overlap", "torchtitan"): dict(pp=2, schedule="dualpipev")}


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda sw: sw.field)
def test_a_switch_the_spec_refuses_is_refused_by_plan_with_its_message(switch):
    assert set(SWITCH_PLANS) == {sw.field for sw in SWITCHES}
    for spec in SPECS:
        zero = min(z for z in spec.zero_stages if z >= 1)     # fp8 parameters and offload need ZeRO >= 1
        plan = {**SWITCH_PLANS[switch.field], **SWITCH_PLAN_ON_ENGINE.get((switch.field, spec.label), {})}
        err = _refused(engine=spec.label, zero=zero, **plan)
        if spec.offers(switch.field):
            assert err is None, (spec.label, err)
            continue
        assert err is not None, spec.label
        assert (err.field, err.problem) == (switch.field, switch.refusal.format(engine=spec.label))
        assert err.accepted == RULES_BY_NAME[switch.rule].accepted


def test_switch_texts_name_the_engines_that_offer_them():
    """The accepted texts are derived from the specs (named engines, generic last), and read as before."""
    accepted = {sw.field: RULES_BY_NAME[sw.rule].accepted for sw in SWITCHES}
    assert accepted["tp_comm_overlap"] == "--engine megatron, torchtitan or generic"
    assert accepted["moe_flex_dispatch"] == "--engine megatron or generic"
    assert accepted["grad_reduce_bf16"] == "--engine megatron, or no --grad-reduce-bf16"
    assert accepted["offload_activation_layers"] == "--engine megatron or generic, or 0"
    assert accepted["offload"] == "--offload none, or --engine deepspeed"
    assert accepted["fp8_param_gather"] == "--engine megatron with an fp8 --dtype, or no --fp8-param-gather"


def test_a_switch_that_needs_more_than_the_engine_says_so():
    err = _refused(engine="megatron", zero=1, fp8_param_gather=True)
    assert err.field == "fp8_param_gather" and err.problem.endswith("this plan trains in bf16")


@pytest.mark.parametrize("spec", SPECS, ids=LABELS)
def test_the_shared_choices_a_spec_refuses_are_refused_by_plan_with_its_note(spec):
    for z in range(4):
        err = _refused(engine=spec.label, zero=z)
        assert (err is None) == (z in spec.zero_stages)
        if err:
            assert (err.field, err.problem) == ("zero", f"--engine {spec.label} has no ZeRO-{z}: {spec.zero_note}")
    for r in ("none", "selective", "full", "op-sac"):
        err = _refused(engine=spec.label, recompute=r)
        assert (err is None) == (r in spec.recompute)
        if err:
            assert err.field == "recompute" and err.problem == spec.recompute_note.format(
                engine=spec.label, offered=", ".join(spec.recompute))
    for dtype in sorted(FP8_DTYPES):
        err = _refused(engine=spec.label, dtype=dtype)
        assert (err is None) == (dtype in spec.fp8_recipes)
    for opt in ("adam", "onebit-adam", "zero-one-adam", "onebit-lamb"):
        err = _refused(engine=spec.label, optimizer=opt)
        assert (err is None) == (opt in spec.optimizers)
        if err:
            assert err.problem == f"{opt} is DeepSpeed's; --engine {spec.label} runs adam" and err.accepted == "adam"
    if spec.cp_modes:        # an engine without cp modes refuses cp itself (scaling-no-cp)
        for mode in ("ring", "ulysses"):
            err = _refused(engine=spec.label, cp=2, cp_mode=mode, zero=0 if spec.label != "torchtitan" else 2)
            assert (err is None) == (mode in spec.cp_modes)
            if err:
                assert (err.field, err.problem) == ("cp_mode", spec.cp_mode_note)


def test_an_engines_own_refusals_are_refused_by_plan_with_their_message():
    cases = {"deepspeed-pipeline-zero": dict(pp=2, zero=2),
             "deepspeed-pipeline-schedule": dict(pp=2, schedule="gpipe"),
             "scaling-pipeline-schedule": dict(pp=2, vpp=2, schedule="interleaved"),
             "scaling-no-cp": dict(cp=2),
             "torchtitan-tp-shards-sequence": dict(tp=2, zero=2),
             "megatron-pipeline-schedule": dict(pp=2, schedule="zbv"),
             "torchtitan-pipeline-schedule": dict(pp=2, schedule="dualpipe", zero=2),
             "torchtitan-ep-overlap-dualpipev": dict(pp=2, vpp=2, schedule="interleaved", ep=2, ep_comm_overlap=True,
                                                     zero=2),
             "torchtitan-ddp-pure-dp": dict(pp=2, zero=0)}
    assert set(cases) == {ref.rule for s in SPECS for ref in s.refusals}
    for spec in SPECS:
        for ref in spec.refusals:
            err = _refused(engine=spec.label, **cases[ref.rule])
            p = Plan(**cases[ref.rule])              # the same layout on the generic engine runs
            assert err is not None and p.engine == "generic"
            assert (err.field, err.problem, err.accepted) == (ref.field, ref.message(p), ref.accepted)


def test_the_search_proposes_only_what_the_engine_offers():
    model, job, cluster = load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 16)
    for spec in SPECS:
        batch, _, _ = compose(model, job, cluster, SpaceOptions(fixed={"engine": spec.label}, max_micro_batch=2,
                                                                max_vpp=2))
        assert len(batch) > 0
        assert set(np.unique(batch.zero)) == set(spec.zero_stages)
        assert {Recompute(c).label for c in np.unique(batch.recompute_code)} == set(spec.recompute)
        assert {Optimizer(c).label for c in np.unique(batch.optimizer_code)} <= set(spec.optimizers)
        assert not np.any(batch.offload_code) or spec.offers("offload")
        assert bool(np.all(batch.grad_accumulation_fusion == spec.grad_accumulation_fusion))


# --- what each engine holds -------------------------------------------------------------------------
N = 8.0     # dp ranks the states are sharded over
#: bytes per parameter by engine and ZeRO stage (docs/usage.md "Engines" table; docs/planner.md), 16-bit training
DOCUMENTED = {
    ("generic", 0): 2 + 2 + 12, ("generic", 1): 2 + 2 + 12 / N, ("generic", 2): 2 + 14 / N, ("generic", 3): 16 / N,
    ("megatron", 0): 2 + 4 + 12, ("megatron", 1): 6 + 12 / N, ("megatron", 2): 2 + (4 + 12) / N,
    ("megatron", 3): (2 + 4 + 12) / N,
    ("deepspeed", 0): 2 + 2 + 16, ("deepspeed", 1): 2 + 2 + 16 / N, ("deepspeed", 2): 2 + 18 / N,
    ("deepspeed", 3): 18 / N,
    ("torchtitan", 0): 16, ("torchtitan", 2): 16 / N + 2, ("torchtitan", 3): 16 / N,
    ("scaling", 0): 2 + 2 + 12, ("scaling", 1): 2 + 2 + 12 / N,
}


@pytest.mark.parametrize("engine,zero", sorted(DOCUMENTED))
def test_each_spec_holds_the_documented_bytes_per_parameter(engine, zero):
    plan = Plan(engine=engine, zero=zero, dp=int(N))
    states = M.model_state_bytes(1.0, plan)
    assert sum(float(v) for v in states.values()) == DOCUMENTED[engine, zero]


def test_megatron_bf16_gradient_buffer_and_deepspeed_offload_hold_less():
    assert sum(float(v) for v in M.model_state_bytes(1.0, Plan(engine="megatron", zero=1, dp=8,
                                                                grad_reduce_bf16=True)).values()) == 2 + 2 + 12 / N
    held = M.model_state_bytes(1.0, Plan(engine="deepspeed", zero=2, dp=8, offload="cpu"))
    assert (float(held["parameters"]), float(held["gradients"]), float(held["optimizer_states"])) == (2.0, 0.0, 0.0)
    titan = M.model_state_bytes(1.0, Plan(engine="torchtitan", zero=3, dp=8))
    assert float(titan["parameters"]) == float(titan["gradients"]) == 4 / N and float(titan["optimizer_states"]) == 8 / N


def test_a_batch_that_mixes_engines_holds_what_each_engine_holds_alone():
    """model_state_bytes and buffer_bytes over a PlanBatch of every engine (np.select on the code)
    equal each plan evaluated on its own, exactly."""
    model = load_model("mixtral-8x7b")
    plans = [Plan(engine=s.label, zero=z, dp=8, offload=o)
             for s in SPECS for z in s.zero_stages for o in ("none", "cpu")
             if o == "none" or (z >= 1 and s.offers("offload"))]
    batch = PlanBatch.from_plans(plans)
    mixed = M.model_state_bytes(7e9, batch)
    buffers = M.buffer_bytes(model, batch, 1.0)
    for i, p in enumerate(plans):
        alone = M.model_state_bytes(7e9, p)
        assert all(mixed[k][i] == alone[k] for k in alone), p
        assert buffers[i] == M.buffer_bytes(model, p, 1.0), p
    assert len({s.engine for s in SPECS}) == len(set(batch.engine_code))


def test_engine_select_evaluates_only_the_engines_present():
    seen = []
    batch = PlanBatch.from_plans([Plan(engine="deepspeed"), Plan(engine="torchtitan")])
    out, = engine_select(batch, lambda s: (seen.append(s.label) or np.full(2, float(s.code)),))
    assert seen == ["deepspeed", "torchtitan"] and list(out) == [2.0, 3.0]


# --- how each engine behaves -------------------------------------------------------------------------
def test_engine_flags_are_vectorized_lookups_by_engine_code():
    batch = PlanBatch.from_plans([Plan(engine=label) for label in LABELS])
    for name in BEHAVIOUR_FIELDS - {"fp8_tp_gather_dtypes", "fp8_fsdp_gather_dtypes", "cudnn_attention_note",
                                    "churns_allocator_from_zero"}:
        per_plan = engine_flag(batch, name)
        assert list(per_plan) == [getattr(s.behaviour, name) for s in SPECS], name
        assert engine_flag(Plan(engine="scaling"), name) == getattr(SPECS[4].behaviour, name)
    assert list(engine_offers(batch, "tp_comm_overlap")) == [True, True, False, True, False]
    assert engine_flag(object(), "blocking_p2p") == SPECS[0].behaviour.blocking_p2p     # no engine: generic
    with pytest.raises(KeyError):
        engine_flag(batch, "blocking_p2p_typo")
    with pytest.raises(KeyError):
        engine_offers(batch, "tp_comm_overlap_typo")


def test_what_torchtitan_holds_and_refuses_is_one_spec():
    """The question of issue 63, answered from ``paraplan.engines.TORCHTITAN`` alone."""
    tt = spec_named("torchtitan")
    assert tt.model_states.__name__ == "torchtitan_states" and tt.buffers.__name__ == "torchtitan_buffers"
    assert tt.zero_stages == (0, 2, 3) and tt.recompute == ("none", "full", "op-sac") and tt.cp_modes == ("ring",)
    assert tt.fp8_recipes == ("fp8", "fp8-rowwise", "mxfp8") and tt.optimizers == ("adam",)
    assert tt.switches == {"tp_comm_overlap", "ep_comm_overlap"}
    assert [r.rule for r in tt.refusals] == ["torchtitan-pipeline-schedule", "torchtitan-ddp-pure-dp",
                                             "torchtitan-ep-overlap-dualpipev", "torchtitan-tp-shards-sequence"]
    assert (tt.export.schedules["zbv"], tt.export.schedules["dualpipev"]) == ("ZBVZeroBubble", "DualPipeV")
    assert "dualpipe" not in tt.export.schedules
    assert tt.behaviour.fp32_grad_reduction and tt.behaviour.holds_stage_outputs and not tt.behaviour.sp_regather
    assert tt.export.format == "python" and tt.export.target == "torchtitan 0.3.0"
    assert tt.export.schedules["interleaved"] == "Interleaved1F1B" and "zb-h1" not in tt.export.schedules


def test_torchtitan_export_mapping_states_what_torchtitan_030_runs():
    """The export mapping is torchtitan 0.3.0's (the release it targets; each fact cited in specs.py and
    checked against the installed release by benchmarks/engine_configs/check_exports.py): row-wise float8
    and MXFP8 converters but no per-tensor recipe (float8.py: recipe_name Literal["rowwise",
    "rowwise_with_gw_hp"]), FlexAttention with no SDPA backend to name (models/common/config_utils.py), no
    expert-tensor-parallel degree (config/configs.py ParallelismConfig). So the nearest plan it runs, asked
    of the spec alone, has row-wise fp8, its own attention kernel and experts not split over tp (before,
    the mapping still held 0.2.x's facts and nearest_runnable kept all three)."""
    from paraplan.planner.runnable import nearest_runnable
    tt = spec_named("torchtitan").export
    assert tt.fp8_recipes == {"fp8-rowwise": ("Float8LinearConverter", "rowwise"), "mxfp8": ("MXFP8LinearConverter", None)}
    assert tt.attention_kernels == ("auto",) and tt.expert_tensor_parallel is False
    assert all(s.export.expert_tensor_parallel for s in SPECS if s.export is not None and s.label != "torchtitan")
    # the engine itself (its cost model, the published runs it is calibrated on) keeps per-tensor fp8
    assert "fp8" in spec_named("torchtitan").fp8_recipes
    planned = Plan(tp=2, sp=True, ep=2, etp=2, zero=3, dtype="fp8", attention_kernel="flash2", engine="torchtitan")
    runs, changes = nearest_runnable(planned, "torchtitan")
    assert (runs.dtype, runs.attention_kernel, runs.etp) == ("fp8-rowwise", "auto", 1)
    assert {c.field for c in changes} == {"dtype", "attention_kernel", "etp"}
    # the TOML format (torchtitan 0.2.2) still names them: the export module's table, not the spec's
    from paraplan.planner.export_torchtitan import TORCHTITAN_FORMATS
    toml = TORCHTITAN_FORMATS["toml"]
    assert toml.fp8_recipes["fp8"] == ("quantize.linear.float8", "tensorwise") and toml.expert_tensor_parallel
    runs, _ = nearest_runnable(planned, "torchtitan", toml.fp8_recipes, toml.expert_tensor_parallel, toml.attention_kernels)
    assert (runs.dtype, runs.attention_kernel, runs.etp) == ("fp8", "flash2", 2)
