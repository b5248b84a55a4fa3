"""``paraplan validate --plan FILE``: the layout of a plan file on the harness's model, under torchrun;
what the harness cannot run is refused by field, what it runs differently is said."""
from __future__ import annotations

import json
import pytest

from paraplan.cli import main as cli_main
from paraplan.cli.validate import main, plan_file_layout
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


def test_the_layout_comes_from_the_file_and_flags_override_it(tmp_path):
    flags, notes = plan_file_layout(_plan_file(tmp_path / "p.json", pp=2, schedule="zb-h1", recompute="full"))
    assert flags == {"tp": 2, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "zero": 0, "offload": "none", "micro_batch": 2,
                     "recompute": "full",
                     "virtual_stages": 1, "sequence_parallel": True}
    assert any("zb-h1 runs as 1F1B" in n for n in notes)
    assert any("the model is the harness's" in n for n in notes)


def test_flags_given_beside_the_file_win(tmp_path):
    import argparse

    from paraplan.cli.validate import add_validate_parser, resolve_layout_flags
    parser = argparse.ArgumentParser()
    add_validate_parser(parser.add_subparsers())
    args = parser.parse_args(["validate", "--plan", str(_plan_file(tmp_path / "p.json", recompute="full")),
                              "--recompute", "none", "--micro-batch", "1", "--out", str(tmp_path / "o")])
    resolve_layout_flags(args)
    assert (args.tp, args.recompute, args.micro_batch, args.virtual_stages) == (2, "none", 1, 1)
    # a recomputation the harness lacks is no refusal when the flag replaces it
    sac = _plan_file(tmp_path / "sac.json", recompute="op-sac", engine="torchtitan", zero=3)
    args = parser.parse_args(["validate", "--plan", str(sac), "--recompute", "full", "--out", str(tmp_path / "o")])
    resolve_layout_flags(args)
    assert args.recompute == "full" and args.zero == 3


@pytest.mark.parametrize("fields, said", [({"offload": "nvme", "zero": 3}, "nvme offload"),
                                          ({"offload": "cpu", "offload_params": True, "zero": 3, "engine": "deepspeed"},
                                           "parameter offload"),
                                          ({"dtype": "fp8"}, "fp8")])
def test_what_the_harness_cannot_run_is_refused_by_field(tmp_path, capsys, fields, said):
    path = _plan_file(tmp_path / "p.json", **fields)
    assert main(["validate", "--plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --plan") and said in err and "Traceback" not in err


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
    assert report["plan"]["tp"] == 2 and report["plan"]["sequence_parallel"] is True
    assert report["plan"]["micro_batch"] == 2 and report["loss_matches_reference"] is True
    assert "layout from" in capsys.readouterr().err


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
    flags, notes = plan_file_layout(_plan_file(tmp_path / "u.json", cp=2, cp_mode="ulysses"))
    assert flags["cp"] == 2 and flags["tp"] == 2
    assert any("ulysses runs as ring attention" in n for n in notes)
    flags, notes = plan_file_layout(_plan_file(tmp_path / "r.json", cp=2))
    assert flags["cp"] == 2 and not any("runs as ring" in n for n in notes)


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


def test_optimizer_offload_comes_from_the_file(tmp_path, capsys):
    """A plan's optimizer offload to host memory is run (ZeRO 1-2); asked with ZeRO 0 it is refused by flag."""
    flags, _ = plan_file_layout(_plan_file(tmp_path / "o.json", offload="cpu", zero=1))
    assert flags["offload"] == "cpu" and flags["zero"] == 1
    assert main(["validate", "--offload", "cpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --offload") and "--zero 1 or 2" in err


def test_nvme_offload_is_refused_by_flag(tmp_path, capsys):
    assert main(["validate", "--zero", "1", "--offload", "nvme", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --offload") and "accepted: none, cpu" in err


def test_a_pipeline_of_more_chunks_than_the_default_layers_gets_one_layer_per_chunk(tmp_path):
    """The planner's Llama 3 8B pick on 8 H100 (tp 2, pp 2, vpp 8): without --layers the harness runs
    16 layers (the smallest multiple of pp x vpp above its 4) and says so; --layers wins."""
    import argparse

    from paraplan.cli.validate import add_validate_parser, harness_layers, resolve_layout_flags
    assert (harness_layers(1, 1), harness_layers(2, 1), harness_layers(3, 1), harness_layers(2, 8)) == (4, 4, 6, 16)
    path = str(_plan_file(tmp_path / "p.json", pp=2, vpp=8, schedule="interleaved", micro_batch=1))
    parser = argparse.ArgumentParser()
    add_validate_parser(parser.add_subparsers())
    args = parser.parse_args(["validate", "--plan", path, "--out", str(tmp_path)])
    notes = resolve_layout_flags(args)
    assert args.layers == 16 and any("the harness runs 16 layers" in n for n in notes)
    args = parser.parse_args(["validate", "--plan", path, "--layers", "32", "--out", str(tmp_path)])
    resolve_layout_flags(args)
    assert args.layers == 32
