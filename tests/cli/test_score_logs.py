"""`paraplan score --log FILE ...` as typed (issue 65): real logs of four kinds scored as runs, the
rows written with --write-rows and scored again as a runs file, and the one-line errors (exit 2) for a
log without its configuration, a file of no known kind, and flags that do not go together."""
import json
from pathlib import Path

import pandas as pd
import pytest

from paraplan.calibration import FILE_COLUMNS
from paraplan.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
MEGATRON = ["--log", str(LOGS / "megatron_deepspeed_llama_tp2pp2.log"), "--gpu", "A100-80GB"]
MLPERF = ["--log", str(LOGS / "mlperf_v4.0_nvidia_eos_n64_gpt3_result_0.txt"), "--tp", "4", "--pp", "8", "--vpp", "4",
          "--micro-batch", "2", "--dtype", "fp8-delayed", "--zero", "1", "--sp", "--tp-comm-overlap"]
DEEPSPEED = ["--log", str(LOGS / "deepspeed_0.19.8_cpu_zero1_dp2.log"), "--model",
             str(LOGS / "deepspeed_cpu_tiny_model.yaml"), "--gpu", "H100-SXM", "--seq-len", "64"]
TORCHTITAN = ["--log", str(LOGS / "torchtitan_pr1437_flex_debug_steps.log"), "--tp", "1", "--gpus", "8", "--gpu",
              "H100-SXM", "--seq-len", "2048", "--global-batch", "64", "--model", "llama3-8b"]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("argv, kind, skipped", [(MEGATRON, "megatron", [1, 2]), (MLPERF, "mlperf", [1]),
                                                 (DEEPSPEED, "deepspeed", [3, 4]), (TORCHTITAN, "torchtitan", [3, 4])])
def test_each_kind_of_log_is_scored_as_a_run(capsys, argv, kind, skipped):
    assert main(["score", *argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,), (log,) = doc["rows"], doc["logs"]
    assert log["kind"] == kind and log["skipped_warmup"] == skipped
    assert row["measured_step_s"] == pytest.approx(log["step_time_s"]) and row["predicted_step_s"] > 0
    assert doc["skipped"] == []


def test_the_table_says_what_was_read_and_skipped(capsys):
    assert main(["score", *MEGATRON]) == 0
    out = capsys.readouterr().out
    assert "[megatron]: steps 3..2500 (4 kept; warm-up 1, 2 skipped): step 1.208 s" in out
    assert "TFLOP/s/GPU 59.3" in out and "1 rows scored" in out


def test_written_rows_are_a_runs_file_score_reads(tmp_path, capsys):
    out = tmp_path / "runs.csv"
    assert main(["score", *MLPERF, "--write-rows", str(out), "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)["rows"][0]
    table = pd.read_csv(out)
    assert list(table.columns) == list(FILE_COLUMNS) and len(table) == 1
    assert table.loc[0, "measured_metric"] == "step_time" and table.loc[0, "num_gpus"] == 512
    assert main(["score", str(out), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)["rows"][0]
    assert again["measured_step_s"] == pytest.approx(first["measured_step_s"], rel=1e-6)


def test_a_log_without_its_configuration_is_one_line_exit_2(capsys):
    assert main(["score", "--log", str(LOGS / "megatron_llama2_3p5b_4090_no_arguments.log"), "--gpu", "A100-80GB"]) == 2
    assert "no arguments block" in _error(capsys)
    assert main(["score", "--log", str(LOGS / "torchtitan_pr1437_flex_debug_steps.log")]) == 2
    assert "--debug.print_config" in _error(capsys)


def test_what_a_log_does_not_say_is_named_with_its_flag(capsys):
    assert main(["score", "--log", str(LOGS / "megatron_deepspeed_llama_tp2pp2.log")]) == 2
    assert "give --gpu NAME" in _error(capsys)
    assert main(["score", "--log", str(LOGS / "mlperf_v4.0_nvidia_eos_n64_gpt3_result_0.txt")]) == 2
    assert "give --tp N" in _error(capsys)


def test_a_value_the_user_gave_is_named_by_its_flag(capsys):
    """Found by benchmarks/fuzz_cli.py: an unknown --gpu was reported as 'cluster: unknown name', a --seq-len the
    log contradicts as 'sequence length 7 was given'; the errors now name the flag the user typed."""
    log = str(LOGS / "megatron_deepspeed_llama_tp2pp2.log")
    assert main(["score", "--log", log, "--gpu", "H1OO"]) == 2
    assert "--gpu 'H1OO'" in _error(capsys)
    assert main(["score", "--log", log, "--gpu", "A100-80GB", "--seq-len", "7"]) == 2
    assert "but --seq-len 7 was given" in _error(capsys)


def test_unknown_files_and_flags_that_do_not_go_together(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("nothing a trainer prints\n")
    assert main(["score", "--log", str(other)]) == 2
    err = _error(capsys)
    assert all(k in err for k in ("megatron", "torchtitan", "deepspeed", "mlperf"))
    assert main(["score"]) == 2
    assert "RUNS.csv or --log" in _error(capsys)
    runs = tmp_path / "runs.csv"
    pd.DataFrame([], columns=list(FILE_COLUMNS)).to_csv(runs, index=False)
    assert main(["score", str(runs), "--gpu", "H100-SXM"]) == 2
    err = _error(capsys)
    assert "--gpu" in err and "applies to --log only" in err
    assert main(["score", str(runs), *MEGATRON]) == 2
    assert "not both" in _error(capsys)
    assert main(["score", "--log", str(LOGS / "megatron_deepspeed_llama_tp2pp2.log"), "--log-kind", "mlperf"]) == 2
    _error(capsys)
