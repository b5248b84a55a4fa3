"""The assumption lines an estimate prints come from the term modules, each beside the formula it qualifies;
estimate.py only lists them in the order they are printed and assembles the step (issue 63)."""
import ast
import inspect
from pathlib import Path

import pytest

from paraplan.costmodels import estimate as E
from paraplan.costmodels.efficiency import curves_for
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

ESTIMATE_PY = Path(E.__file__)
#: the keywords :func:`paraplan.costmodels.estimate.assumptions` passes every builder
INPUTS = set(inspect.signature(E.assumptions).parameters)
BUILDERS = E.PLAN_ASSUMPTIONS + E.ESTIMATE_ASSUMPTIONS


@pytest.mark.parametrize("say", BUILDERS, ids=lambda f: f"{f.__module__.rsplit('.', 1)[1]}.{f.__name__}")
def test_each_builder_lives_in_a_term_module_and_takes_the_uniform_keywords(say):
    assert say.__module__.startswith("paraplan.costmodels.") and say.__module__ != E.__name__
    params = inspect.signature(say).parameters.values()
    named = {p.name for p in params if p.kind is not p.VAR_KEYWORD}
    assert any(p.kind is p.VAR_KEYWORD for p in params), f"{say.__name__} must ignore the keywords it does not read"
    assert named <= INPUTS, f"{say.__name__} reads {sorted(named - INPUTS)}, which assumptions() does not pass"
    if say in E.PLAN_ASSUMPTIONS:
        assert named <= {"plan"}, f"{say.__name__} is listed as a plan-only line but reads {sorted(named)}"


def test_a_default_plan_says_the_default_lines():
    """An Estimate's default ``assumptions`` are what the builders say for a plan that changes nothing."""
    assert E.assumptions_for(Plan()) == E.ASSUMPTIONS


def test_an_estimate_prints_its_builders_lines_in_the_listed_order():
    model, cluster, job = load_model("mixtral-8x7b"), load_cluster("dgx-h100", 64), TrainingJob(4096, 256)
    plan = Plan(tp=2, pp=4, ep=4, sp=True, schedule="interleaved", vpp=2, zero=1, engine="megatron", dtype="fp8")
    e = E.estimate(model, job, cluster, plan)
    curves = curves_for(cluster)
    inputs = dict(model=model, job=job, cluster=cluster, plan=e.plan, curves=curves,
                  gpu_total=e.memory_bytes_per_gpu["total"])
    said = [say(**inputs) for say in BUILDERS]
    assert e.assumptions == tuple(line for lines in said for line in lines)
    # this plan is fp8, pipelined, MoE and analytical: each of those builders said something
    for say in (E.fp8_assumptions, E.pipeline_transfer_assumption, E.moe_dispatch_assumption,
                E.gemm_level_assumption):
        assert say(**inputs), say.__name__


def test_estimate_py_keeps_no_formula_or_assumption_text():
    """No ``*_time`` or ``*_assumption`` function in the assembler, and step_terms stays short."""
    tree = ast.parse(ESTIMATE_PY.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    kept = [name for name in functions if name.endswith(("_time", "_assumption"))]
    assert not kept, f"formulas or assumption builders in estimate.py: {kept}"
    step_terms = functions["step_terms"]
    assert step_terms.end_lineno - step_terms.lineno + 1 <= 60
