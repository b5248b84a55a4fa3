"""The engine's usual switches (Megatron-LM's --tp-comm-overlap, --grad-reduce-in-bf16, --fp8-param-gather) are
part of the plan space: the search tries each candidate with none and with every switch on where it runs, the
tied plans again with fewer, and the ranking (fastest that fits, ties to fewer switches) decides."""
import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.hardware.catalog import load_cluster
from paraplan.planner import space as S
from paraplan.planner.runnable import nearest_runnable
from paraplan.planner.search import search
from paraplan.planner.simplicity import tie_limit
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

SMALL = (load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 16))


def _columns(options):
    """The composed candidates for Megatron-LM (SpaceOptions' own default engine is generic)."""
    batch, _, _ = S.compose(*SMALL, replace(options, fixed={"engine": "megatron", **(options.fixed or {})}))
    return batch


def test_each_candidate_comes_again_with_every_switch_on_where_it_runs():
    off = _columns(S.SpaceOptions(engine_switches=False))
    both = _columns(S.SpaceOptions())
    assert not np.any(off.tp_comm_overlap) and not np.any(off.grad_reduce_bf16)
    # grad_reduce_bf16 runs on every Megatron-LM candidate: each one comes once more, every switch on where it runs
    assert len(both) == 2 * len(off)
    on = slice(len(off), None)
    assert np.array_equal(both.grad_reduce_bf16[on], np.ones(len(off), bool))
    assert np.array_equal(both.tp_comm_overlap[on], (off.tp > 1) & off.sp & (off.tp <= 8))   # one NVLink domain
    assert not np.any(both.fp8_param_gather)          # bf16: no fp8 parameters


def test_fix_false_pins_a_switch_off_and_true_turns_it_on_where_it_runs():
    pinned_off = _columns(S.SpaceOptions(fixed={"tp_comm_overlap": False}))
    assert not np.any(pinned_off.tp_comm_overlap) and np.any(pinned_off.grad_reduce_bf16)
    on = _columns(S.SpaceOptions(fixed={"tp_comm_overlap": True}, engine_switches=False))
    runs = (on.tp > 1) & on.sp & (on.tp <= 8)
    assert np.any(on.tp == 1)                           # the plans that cannot run it stay in the search
    assert np.array_equal(on.tp_comm_overlap, runs)


def test_fp8_searches_fp8_parameters_where_zero_shards_them():
    batch = _columns(S.SpaceOptions(fixed={"dtype": "fp8"}))
    assert np.any(batch.fp8_param_gather)
    assert not np.any(batch.fp8_param_gather & (batch.zero == 0))


@pytest.mark.parametrize("engine, searched", [("megatron", ("tp_comm_overlap", "grad_reduce_bf16", "fp8_param_gather")),
                                              ("torchtitan", ("tp_comm_overlap",)), ("deepspeed", ())])
def test_only_the_switches_the_engine_offers_are_searched(engine, searched):
    code = S.spec_named(engine).code
    assert S.searched_switches({}, S.SpaceOptions(), code) == searched
    assert S.searched_switches({}, S.SpaceOptions(engine_switches=False), code) == ()
    assert "grad_reduce_bf16" not in S.searched_switches({}, S.SpaceOptions(), code, "fp16")   # Megatron's --bf16 only


README = (load_model("llama3-70b"), TrainingJob(8192, 512), load_cluster("dgx-h100", 64))


@pytest.fixture(scope="module")
def readme_searches():
    opts = dict(max_memory_fraction=0.95, top=10)
    return (search(*README, options=S.SpaceOptions(fixed={"engine": "megatron"}), **opts),
            search(*README, options=S.SpaceOptions(fixed={"engine": "megatron"}, engine_switches=False), **opts))


def test_the_readme_search_uses_tp_overlap_and_is_faster_than_without(readme_searches):
    new, old = readme_searches
    assert not any(e.plan.tp_comm_overlap or e.plan.grad_reduce_bf16 for e in old.plans)
    assert new.best.plan.tp_comm_overlap and new.best.plan.tp > 1
    assert new.best.step_time_s < old.best.step_time_s * 0.95


def test_a_tied_best_plan_keeps_only_the_switches_that_pay(readme_searches):
    """Each switch the best plan uses: without it the plan does not fit or leaves the tie with the fastest
    (else the tie rule would have ranked the plan with fewer switches first)."""
    from paraplan.costmodels.estimate import estimate
    new, _ = readme_searches
    best, limit = new.best, tie_limit(new.fastest.step_time_s)
    used = [c for c in S.ENGINE_SWITCHES if getattr(best.plan, c)]
    assert used
    for c in used:
        e = estimate(*README, replace(best.plan, **{c: False}), max_memory_fraction=0.95)
        assert not e.feasible or e.step_time_s >= limit, c


def test_the_plan_table_and_json_show_the_switches_and_the_export_writes_them(capsys, tmp_path):
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--top", "3"]
    assert main([*args, "--format", "json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert any(p["plan"]["grad_reduce_bf16"] for p in plans)
    out = tmp_path / "plan.json"
    assert main([*args, "--fix", "tp=2", "--fix", "sp=true", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "switches" in text and "tpov" in text and "tpov TP comm overlap (--tp-comm-overlap)" in text
    assert main(["export", str(out), "--to", "megatron"]) == 0
    assert "--tp-comm-overlap" in capsys.readouterr().out
    assert main([*args, "--no-engine-switches", "--format", "json"]) == 0
    assert not any(p["plan"]["grad_reduce_bf16"] or p["plan"]["tp_comm_overlap"]
                   for p in json.loads(capsys.readouterr().out)["plans"])


def test_engines_without_a_switch_run_the_plan_without_it():
    best = search(*SMALL, options=S.SpaceOptions(fixed={"tp": 2, "sp": True, "engine": "megatron"}), top=1).best.plan
    assert best.tp_comm_overlap and not best.grad_reduce_bf16     # bf16 gradients buy nothing here: dropped again
    best = replace(best, grad_reduce_bf16=True)
    runs, changes = nearest_runnable(best, "deepspeed")
    assert not runs.tp_comm_overlap and not runs.grad_reduce_bf16
    assert {"no TP overlap", "fp32 gradient reduction"} <= {c.phrase for c in changes}
    runs, changes = nearest_runnable(best, "torchtitan")
    assert runs.tp_comm_overlap and not runs.grad_reduce_bf16


def test_the_megatron_fp8_search_finds_fp8_parameters_where_only_they_fit(capsys):
    """Llama 3 70B on 16 H100 at ZeRO-1 in fp8 (test_fp8_param_gather: nothing fits with 16-bit weights): the
    search now finds the plan with fp8 parameters itself."""
    args = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "2048",
            "--global-batch", "32", "--engine", "megatron", "--dtype", "fp8", "--no-offload", "--fix", "zero=1",
            "--format", "json", "--top", "1"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["plan"]["fp8_param_gather"] is True


def test_tp_overlap_only_inside_one_nvlink_domain(capsys):
    """Transformer Engine's userbuffers (and torch's symmetric memory behind torchtitan's async TP) run the
    overlapped collectives over NVLink peer memory: a TP group across nodes cannot overlap them
    (TransformerEngine examples/pytorch/comm_gemm_overlap/README.md, Requirements)."""
    from paraplan.plan import RULES_BY_NAME, Scene
    P = _columns(S.SpaceOptions(fixed={"tp_comm_overlap": True}, engine_switches=False))
    assert np.any(P.tp == 16) and not np.any(P.tp_comm_overlap & (P.tp == 16))   # not even composed
    bad = RULES_BY_NAME["tp-comm-overlap-within-nvlink"].bad(replace(P, tp_comm_overlap=P.sp & (P.tp > 1)), Scene(*SMALL))
    assert np.array_equal(bad, P.sp & (P.tp > 8))
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--tp", "16", "--sp", "--tp-comm-overlap"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "one NVLink domain of 8 GPUs, but tp is 16" in err and "Traceback" not in err
    argv[argv.index("16", argv.index("--tp"))] = "8"
    assert main(argv) == 0
