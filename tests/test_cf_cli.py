"""End-to-end: `cf plan`, `cf profile` and a tiny `cf validate` write complete, sane outputs."""
import json

from paraplan.cli.cf import main

REQUIRED = ("chosen_tile", "best_measured_tile", "chosen_vs_best_time_ratio", "epoch_time_mape",
            "speedup_vs_baseline", "recall_at_20_tiled", "recall_at_20_untiled")


def test_plan_json(capsys):
    rc = main(["cf", "plan", "--cpu", "epyc-7742", "--users", "52643", "--items", "91599", "--interactions",
               "2380730", "--dim", "128", "--negatives", "64", "--threads", "64", "--batch", "4096",
               "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choices"][0]["rank"] == 1 and out["choices"][0]["footprint_bytes"] <= 4 * 2**20


def test_bad_input_is_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "d.txt"
    bad.write_text("0 1 2\n1 two\n")
    assert main(["cf", "plan", "--cpu", "epyc-7742", "--dataset", str(bad), "--negatives", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2" in err and "Traceback" not in err
    assert main(["cf", "plan", "--cpu", "epyc-7742", "--users", "10", "--items", "10", "--interactions", "50",
                 "--negatives", "0"]) == 2


def test_tiny_validate_writes_complete_report(tmp_path, capsys):
    out = tmp_path / "rep"
    prof = tmp_path / "prof.json"
    rc = main(["cf", "validate", "--out", str(out), "--users", "120", "--items", "600", "--interactions", "2400",
               "--dim", "16", "--negatives", "16", "--batch", "64", "--epochs", "1", "--sweep", "3",
               "--repeats", "1", "--profile", str(prof)])
    assert rc == 0, capsys.readouterr().err
    rep = json.loads((out / "report.json").read_text())
    for k in REQUIRED:
        assert k in rep
    assert rep["tiles_measured"] == 3 and rep["chosen_vs_best_time_ratio"] >= 1.0
    assert rep["epoch_time_mape"] >= 0 and rep["speedup_vs_baseline"] > 0
    assert (out / rep["figure"]).stat().st_size > 1000
    assert prof.exists() and not list(out.glob(".report-*"))
    # the saved profile is reused by plan
    assert main(["cf", "plan", "--cpu", "local", "--profile", str(prof), "--users", "120", "--items", "600",
                 "--interactions", "1900", "--dim", "16", "--negatives", "16", "--batch", "64"]) == 0
