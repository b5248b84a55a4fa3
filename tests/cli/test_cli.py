"""The command line: outputs and one-line errors (exit 2, no traceback)."""
import json
import subprocess
import sys

import pytest

from paraplan.cli import main

REQUIRED_JSON = {"schema", "plan", "feasible", "infeasible_reason", "step_time_s", "tokens_per_s",
                 "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu", "flop_convention",
                 "time_breakdown_s", "memory_bytes_per_gpu", "host_memory_bytes_per_node", "nvme_bytes_per_node"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "paraplan.cli", *args], capture_output=True, text=True, timeout=120)


def test_estimate_json_has_the_documented_keys(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2",
                 "--global-batch", "64", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert REQUIRED_JSON <= set(out)
    assert set(out["time_breakdown_s"]) == {"compute", "recompute", "grad_accumulation", "tp_comm", "cp_comm", "ep_comm", "moe_host", "pp_comm", "pp_bubble",
                                            "dp_comm", "optimizer", "offload"}
    assert set(out["memory_bytes_per_gpu"]) == {"parameters", "gradients", "optimizer_states", "activations",
                                                "buffers", "allocator", "total"}
    assert out["plan"]["dp"] == 4
    assert sum(out["time_breakdown_s"].values()) == pytest.approx(out["step_time_s"])
    assert out["time_breakdown_s"]["grad_accumulation"] == 0.0   # fused (Megatron-LM) by default


def test_unfused_grad_accumulation_flag(capsys):
    """64 sequences over dp 4 at micro-batch 1: 16 micro-batches, 15 of them add their gradients."""
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2",
                 "--global-batch", "64", "--no-grad-accumulation-fusion", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["grad_accumulation_fusion"] is False
    assert out["time_breakdown_s"]["grad_accumulation"] > 0
    assert sum(out["time_breakdown_s"].values()) == pytest.approx(out["step_time_s"])


def test_infeasible_plan_still_prints_its_estimate(capsys):
    assert main(["estimate", "--model", "llama3-70b", "--cluster", "dgx-a100-40g", "--gpus", "8",
                 "--global-batch", "8", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False and "GPU memory" in out["infeasible_reason"] and out["step_time_s"] > 0


def test_table_view_shows_the_breakdown(capsys):
    assert main(["estimate", "--model", "gpt-7.5b", "--cluster", "dgx-a100-80g", "--gpus", "16", "--tp", "4",
                 "--pp", "2", "--global-batch", "64"]) == 0
    out = capsys.readouterr().out
    for word in ("step time", "MFU", "pipeline bubble", "optimizer states", "FLOP convention"):
        assert word in out


def test_table_view_lists_the_plans_own_assumptions(capsys):
    """The table view prints the estimate's assumptions, and they follow the plan: a kernel the accelerator
    has no measured table for is said to be priced at the calibrated efficiency, TP overlap replaces the
    'exposed' line, a DP reduction that does not overlap says so."""
    assert main(["estimate", "--model", "llama2-7b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--dp", "8",
                 "--attention-kernel", "flash2"]) == 0
    out = capsys.readouterr().out
    assert "assumptions" in out and "no measured flash2 table for this accelerator" in out
    assert "tensor-parallel collectives are exposed" in out and "overlaps the last micro-batch's backward" in out
    assert main(["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--sp",
                 "--dp", "8", "--tp-comm-overlap", "--no-overlap-grad-reduce", "--format", "json"]) == 0
    said = json.loads(capsys.readouterr().out)["assumptions"]
    assert not any("collectives are exposed" in a for a in said)
    assert any("overlap the GEMMs next to them" in a for a in said)
    assert any("runs after the backward" in a and "nothing hidden" in a for a in said)


@pytest.mark.parametrize("args,needle", [
    (["--model", "lama3-8b", "--cluster", "dgx-h100"], "did you mean 'llama3-8b'"),
    (["--model", "llama3-8b", "--cluster", "dgx-h101"], "did you mean 'dgx-h100'"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "12"], "not whole nodes"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "3"], "tp(3)"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--pp", "8", "--vpp", "8"], "layers(32) < pp(8) * vpp(8)"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "12", "--micro-batch", "2"],
     "global_batch(12) % (dp(8) * micro_batch(2))"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--vpp", "2"], "--vpp: 2 virtual stages per pipeline stage need --pp > 1"),
    (["--model", "llama3-8b", "--cluster", "dgx1-v100", "--dtype", "bf16"], "no bf16"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run_cli("estimate", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_malformed_cluster_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("system: dgx-a100-80g\ngpus: [8\n")
    r = run_cli("estimate", "--model", "gpt-1.7b", "--cluster", str(f))
    assert r.returncode == 2 and "malformed YAML" in r.stderr and "Traceback" not in r.stderr


def test_negative_field_in_cluster_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("system: dgx-a100-80g\ngpus: -8\n")
    r = run_cli("estimate", "--model", "gpt-1.7b", "--cluster", str(f))
    assert r.returncode == 2 and "gpus" in r.stderr and "positive" in r.stderr


def test_negative_flag_is_rejected_by_the_parser():
    r = run_cli("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--tp", "-2")
    assert r.returncode == 2 and "--tp must be a positive integer" in r.stderr and "Traceback" not in r.stderr


def test_list_commands(capsys):
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "llama3-405b" in out and "405.85B" in out
    assert main(["list", "hardware"]) == 0
    out = capsys.readouterr().out
    for name in ("dgx2-v100", "h200", "a64fx", "graviton3"):
        assert name in out


def test_plan_file_round_trip(tmp_path, capsys):
    from paraplan.costmodels.estimate import estimate
    from paraplan.hardware.catalog import load_cluster
    from paraplan.plan import Plan
    from paraplan.planfile import write_plan_file
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    e = estimate(load_model("llama2-7b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 8), Plan(tp=2, zero=1))
    f = tmp_path / "plan.json"
    write_plan_file(f, e, "llama2-7b", "dgx-h100")
    assert main(["estimate", "--plan", str(f), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_s"] == pytest.approx(e.step_time_s) and again["plan"] == e.plan.to_dict()


@pytest.mark.parametrize("bad", ["", "2", 2.5, True, None, [], -1])
def test_plan_file_vpp_that_is_not_a_count_is_named(tmp_path, capsys, bad):
    """A plan file's vpp reached a comparison with 1 before the plan's own checks (a traceback for
    "" found by benchmarks/fuzz_cli.py); now every non-count is refused naming plan.vpp."""
    from paraplan.costmodels.estimate import estimate
    from paraplan.hardware.catalog import load_cluster
    from paraplan.plan import Plan
    from paraplan.planfile import write_plan_file
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    e = estimate(load_model("llama2-7b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 8), Plan(tp=2, zero=1))
    f = tmp_path / "plan.json"
    write_plan_file(f, e, "llama2-7b", "dgx-h100")
    doc = json.loads(f.read_text())
    doc["plan"]["vpp"] = bad
    f.write_text(json.dumps(doc))
    assert main(["estimate", "--plan", str(f)]) == 2
    assert "plan.vpp" in capsys.readouterr().err
