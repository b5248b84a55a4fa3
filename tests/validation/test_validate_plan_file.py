"""``paraplan validate --plan FILE``: the layout of a plan file on the harness's model, under torchrun;
what the harness cannot run is refused by field, what it runs differently is said."""
from __future__ import annotations

import json
import pytest

from paraplan.cli import build_parser, main as cli_main
from paraplan.cli.validate import check_validate_args, main
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import write_plan_file
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def _plan_file(path, **fields):
    plan = Plan(**{"tp": 2, "dp": 1, "sp": True, "micro_batch": 2, **fields})
    e = estimate(load_model("llama3-8b"), TrainingJob(2048, 8), load_cluster("dgx-h100", plan.tp * plan.pp *
                                                                              plan.dp * plan.cp), plan)
    write_plan_file(path, e, "llama3-8b", "dgx-h100")
    return path


def _sized(tmp_path, *argv):
    """The run validate would launch for ``argv`` (sized and checked, nothing launched)."""
    return check_validate_args(build_parser().parse_args(["validate", *argv, "--out", str(tmp_path / "o")]))


def test_the_layout_comes_from_the_file_and_flags_override_it(tmp_path):
    sized = _sized(tmp_path, "--plan", str(_plan_file(tmp_path / "p.json", pp=2, schedule="zb-h1", recompute="full")))
    p = sized.plan
    assert (p.tp, p.pp, p.dp, p.cp, p.ep, p.etp, p.zero, p.offload, p.micro_batch, p.recompute, p.vpp, p.sp) == \
        (2, 2, 1, 1, 1, 1, 0, "none", 2, "full", 1, True)
    # what the harness runs differently is said, and the plan it runs says so too
    assert p.schedule == "1f1b" and any("schedule zb-h1 runs as 1F1B" in n for n in sized.notes)
    assert p.dtype == "fp32" and p.engine == "generic"
    assert any("the model is the harness's" in n for n in sized.notes)


def test_flags_given_beside_the_file_win(tmp_path):
    plan = _sized(tmp_path, "--plan", str(_plan_file(tmp_path / "p.json", recompute="full")),
                  "--recompute", "none", "--micro-batch", "1").plan
    assert (plan.tp, plan.recompute, plan.micro_batch, plan.vpp) == (2, "none", 1, 1)
    # --tp 1 beside a file with sequence parallelism: no tp group is left, so it is off (and said)
    sized = _sized(tmp_path, "--plan", str(tmp_path / "p.json"), "--tp", "1")
    assert (sized.plan.tp, sized.plan.sp) == (1, False) and any("sp of " in n and "--tp 1" in n for n in sized.notes)
    # the validate's earlier spellings of --sp and --vpp are still accepted
    plan = _sized(tmp_path, "--tp", "2", "--sequence-parallel", "--pp", "2", "--virtual-stages", "2",
                  "--nproc-per-node", "4").plan
    assert (plan.sp, plan.vpp, plan.schedule) == (True, 2, "interleaved")
    sac = _plan_file(tmp_path / "sac.json", recompute="op-sac", engine="torchtitan", zero=3)
    sized = _sized(tmp_path, "--plan", str(sac), "--recompute", "full")
    assert sized.plan.recompute == "full" and sized.plan.zero == 3
    assert any("engine torchtitan runs as generic" in n for n in sized.notes), sized.notes


@pytest.mark.parametrize("fields, said", [({"offload": "nvme", "zero": 3}, "offload nvme: the validation harness runs "
                                                                               "no nvme offload"),
                                          ({"offload": "cpu", "offload_params": True, "zero": 3, "engine": "deepspeed"},
                                           "offload_params true: the validation harness runs no parameter offload"),
                                          ({"dtype": "fp8"}, "dtype fp8: the validation harness runs no fp8")])
@pytest.mark.torch
def test_what_the_harness_cannot_run_is_refused_by_field(tmp_path, capsys, fields, said):
    path = _plan_file(tmp_path / "p.json", **fields)
    assert main(["validate", "--plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --plan") and f"p.json: {said}" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.torch
def test_validate_runs_a_plan_files_layout(tmp_path, capsys):
    path = _plan_file(tmp_path / "p.json")
    predicted = {"step_time_s": 0.1, "memory_bytes_per_rank": 2_000_000,
                 "time_breakdown_s": {"compute": 0.05, "tp_comm": 0.04, "optimizer": 0.01}}
    (tmp_path / "pred.json").write_text(json.dumps(predicted))
    out = tmp_path / "out"
    rc = cli_main(["validate", "--plan", str(path), "--nproc-per-node", "2", "--global-batch", "4", "--steps", "2",
                   "--warmup", "1", "--layers", "2", "--predicted", str(tmp_path / "pred.json"), "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["plan"]["tp"] == 2 and report["plan"]["sp"] is True and report["plan"]["dtype"] == "fp32"
    assert report["plan"]["micro_batch"] == 2 and report["loss_matches_reference"] is True
    assert report["run"]["global_batch"] == 4 and report["run"]["steps"] == 2
    assert "layout from" in capsys.readouterr().err and any("layout from" in n for n in report["notes"])


@pytest.mark.slow
@pytest.mark.torch
def test_an_op_sac_plan_runs_on_the_fused_attention(tmp_path, capsys):
    """torchtitan's op-level SAC from a plan file (tp 2, sequence parallel, ZeRO-3): it runs on SDPA,
    said, and matches the single process."""
    path = _plan_file(tmp_path / "sac.json", recompute="op-sac", engine="torchtitan", zero=3)
    out = tmp_path / "out"
    rc = cli_main(["validate", "--plan", str(path), "--nproc-per-node", "2", "--global-batch", "4", "--steps", "2",
                   "--warmup", "1", "--layers", "2", "--predicted", str(_predicted(tmp_path)), "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["plan"]["recompute"], report["plan"]["zero"], report["plan"]["tp"]) == ("op-sac", 3, 2)
    assert report["loss_matches_reference"] is True
    assert "op-sac runs on --attention sdpa" in capsys.readouterr().err


def test_context_parallelism_runs_as_ring_attention(tmp_path):
    """A plan's cp is the harness's (ring attention); a Ulysses plan is said to run as ring."""
    sized = _sized(tmp_path, "--plan", str(_plan_file(tmp_path / "u.json", cp=2, cp_mode="ulysses")))
    assert (sized.plan.cp, sized.plan.tp, sized.plan.cp_mode) == (2, 2, "ring")
    assert any("cp_mode ulysses runs as ring attention" in n for n in sized.notes)
    sized = _sized(tmp_path, "--plan", str(_plan_file(tmp_path / "r.json", cp=2)))
    assert sized.plan.cp == 2 and not any("runs as ring" in n for n in sized.notes)


@pytest.mark.slow
@pytest.mark.torch
def test_validate_runs_a_context_parallel_plan_file(tmp_path):
    """cp 2 from a plan file (tp and sp overridden to fit two ranks): the loss matches the single
    process and the report carries the measured and predicted ring exchange."""
    path = _plan_file(tmp_path / "p.json", cp=2)
    out = tmp_path / "out"
    rc = cli_main(["validate", "--plan", str(path), "--tp", "1", "--micro-batch", "1", "--nproc-per-node", "2",
                   "--global-batch", "2", "--steps", "2", "--warmup", "1", "--layers", "2", "--seq-len", "64",
                   "--hidden", "64", "--vocab", "256", "--predicted", str(_predicted(tmp_path)), "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["plan"]["cp"] == 2 and report["plan"]["tp"] == 1
    assert report["loss_matches_reference"] is True
    assert report["measured"]["time_breakdown_s"]["cp_comm"] > 0


def _predicted(tmp_path):
    path = tmp_path / "pred.json"
    path.write_text(json.dumps({"step_time_s": 0.05, "memory_bytes_per_rank": 2_000_000,
                                "time_breakdown_s": {"compute": 0.04, "cp_comm": 0.005, "optimizer": 0.005}}))
    return path


@pytest.mark.torch
def test_optimizer_offload_comes_from_the_file(tmp_path, capsys):
    """A plan's optimizer offload to host memory is run (ZeRO 1-2); asked with ZeRO 0 (the Plan's own rule) or
    ZeRO 3 (the harness's) it is refused by flag."""
    plan = _sized(tmp_path, "--plan", str(_plan_file(tmp_path / "o.json", offload="cpu", zero=1))).plan
    assert plan.offload == "cpu" and plan.zero == 1
    assert main(["validate", "--offload", "cpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --offload") and "ZeRO stage >= 1" in err
    assert main(["validate", "--offload", "cpu", "--zero", "3", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --offload") and "zero 1 or 2" in err


@pytest.mark.torch
def test_nvme_offload_is_refused_by_flag(tmp_path, capsys):
    assert main(["validate", "--zero", "1", "--offload", "nvme", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --offload") and "accepted: none, cpu" in err


@pytest.mark.torch
def test_a_pipeline_of_more_chunks_than_the_default_layers_gets_one_layer_per_chunk(tmp_path):
    """The planner's Llama 3 8B pick on 8 H100 (tp 2, pp 2, vpp 8): without --layers the harness runs
    16 layers (the smallest multiple of pp x vpp above its 4) and says so; --layers wins."""
    from paraplan.validation.sizing import harness_layers
    assert (harness_layers(1, 1), harness_layers(2, 1), harness_layers(3, 1), harness_layers(2, 8)) == (4, 4, 6, 16)
    path = str(_plan_file(tmp_path / "p.json", pp=2, vpp=8, schedule="interleaved", micro_batch=1))
    sized = _sized(tmp_path, "--plan", path)
    assert sized.model.layers == 16 and any("the harness runs 16 layers" in n for n in sized.notes)
    assert _sized(tmp_path, "--plan", path, "--layers", "32").model.layers == 32
    # layers that do not split into whole, equal chunks are refused before anything launches
    assert main(["validate", "--plan", path, "--layers", "24", "--out", str(tmp_path / "o")]) == 2
