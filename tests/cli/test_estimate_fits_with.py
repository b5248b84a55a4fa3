"""`paraplan estimate` of a plan that does not fit names the nearest plans that do (paraplan.planner.nearest):
each as the flags a user adds, and each of those, typed back into `estimate`, fits at the memory and step time
it was shown with."""
from __future__ import annotations

import json
import shlex

import pytest

from paraplan.cli import main
from paraplan.hardware.catalog import load_cluster
from paraplan.planner.nearest import memory_changes, nearest_fitting_plans
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

#: Llama 3 70B on 64 H100 at 8k, tp4 sp, one sequence per micro-batch, no ZeRO: 342.9 GiB of 80
OVER = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8k",
        "--global-batch", "512", "--tp", "4", "--sp", "--micro-batch", "2"]


def _json(capsys, argv):
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_suggestion_typed_back_fits_as_shown(capsys):
    doc = _json(capsys, OVER)
    assert not doc["feasible"]
    fits = doc["fits_with"]
    assert 1 <= len(fits) <= 3
    assert [f["step_time_s"] for f in fits] == sorted(f["step_time_s"] for f in fits)
    for f in fits:
        again = _json(capsys, [*OVER, *shlex.split(f["flags"])])
        assert again["feasible"] and "fits_with" not in again, f["flags"]
        assert again["step_time_s"] == pytest.approx(f["step_time_s"], rel=1e-9)
        assert again["memory_bytes_per_gpu"]["total"] == pytest.approx(f["memory_bytes_per_gpu"], rel=1e-9)
        assert again["memory_bytes_per_gpu"]["total"] <= 80 * 2**30


def test_the_table_shows_the_flags_memory_and_step_time(capsys):
    assert main(OVER) == 0
    out = capsys.readouterr().out
    block = out.split("fits with (the nearest plans that fit", 1)[1].splitlines()[1:]
    doc = _json(capsys, OVER)
    for line, f in zip(block, doc["fits_with"]):
        assert line.strip().startswith(f["flags"]) and "GiB" in line and "s/step" in line
        assert f"{f['memory_bytes_per_gpu'] / 2**30:.1f} GiB" in line


def test_a_plan_that_fits_gets_no_suggestion(capsys):
    fitting = [*OVER[:-2], "--micro-batch", "1", "--zero", "3"]
    doc = _json(capsys, fitting)
    assert doc["feasible"] and "fits_with" not in doc
    assert main(fitting) == 0
    assert "fits with" not in capsys.readouterr().out


def test_nothing_tried_fits_says_so(capsys):
    """Llama 3 405B on one H100: no change of the plan on one GPU fits; the plan search is named."""
    argv = ["estimate", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "1", "--seq-len", "8k"]
    assert _json(capsys, argv)["fits_with"] == []
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fits with: no single or paired change tried fits" in out and "`paraplan plan`" in out


def test_changes_are_the_engines_own():
    """DeepSpeed offers no Megatron switches and Megatron-LM no optimizer offload: each change tried is one the
    plan's engine runs (check_plan), and the layout changes keep the GPU count."""
    model, job, cluster = load_model("llama3-70b"), TrainingJob(8192, 512), load_cluster("dgx-h100", 64)
    ds = Plan(tp=4, sp=True, dp=16, micro_batch=2, zero=1, engine="deepspeed", grad_accumulation_fusion=False)
    assert not any("grad_reduce_bf16" in c or "fp8_param_gather" in c for c in memory_changes(ds))
    mg = Plan(tp=4, sp=True, dp=16, micro_batch=2, zero=0, engine="megatron")
    found = nearest_fitting_plans(model, job, cluster, mg, limit=10)
    assert found and all(f.plan.engine == "megatron" and f.plan.offload == "none" for f in found)
    assert all(f.plan.tp * f.plan.pp * f.plan.cp * f.plan.dp == 64 for f in found)


def test_where_no_near_change_fits_the_fastest_plan_of_the_engine_is_offered_and_fits(capsys):
    """Llama 3 70B on 16 H100, tp2 dp8, micro-batch 2: no single or paired change fits, but the planner's search
    (Megatron-LM, bf16, the same GPUs) finds plans that do; the fastest, typed back as its flags, fits as shown."""
    argv = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "8k",
            "--global-batch", "64", "--tp", "2", "--micro-batch", "2", "--zero", "1"]
    doc = _json(capsys, argv)
    assert not doc["feasible"] and doc["fits_with"] == []
    best = doc["fastest_fitting"]
    again = _json(capsys, [*argv, *shlex.split(best["flags"])])
    assert again["feasible"] and again["plan"]["engine"] == "megatron" and again["plan"]["dtype"] == "bf16"
    assert again["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-6)
    assert main(argv) == 0
    assert "the fastest megatron bf16 plan that fits on these GPUs" in capsys.readouterr().out


def test_nothing_on_these_gpus_says_so_and_names_plan(capsys):
    argv = ["estimate", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8k"]
    doc = _json(capsys, argv)
    assert doc["fits_with"] == [] and "fastest_fitting" not in doc
    assert main(argv) == 0
    assert "no megatron bf16 plan fits on these 8 GPUs" in capsys.readouterr().out


def test_on_a_modelled_fabric_each_suggestion_is_placed_by_its_own_groups(capsys):
    """With --network flat --oversubscription the estimate places the plan's groups on the fabric; a suggestion that changes
    the layout (tp 8 -> 16 here) is placed by its own groups, so typed back with the same flag it estimates as
    shown (placed by the original plan's groups it read 91.54 s instead of 91.72)."""
    argv = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8k",
            "--global-batch", "512", "--tp", "8", "--sp", "--micro-batch", "2", "--zero", "1",
            "--network", "flat", "--oversubscription", "4"]
    fits = _json(capsys, argv)["fits_with"]
    assert any(dict(f["change"]).get("tp") == 16 for f in fits)
    for f in fits:
        again = _json(capsys, [*argv, *shlex.split(f["flags"])])
        assert again["feasible"] and again["step_time_s"] == pytest.approx(f["step_time_s"], rel=1e-9), f["flags"]
