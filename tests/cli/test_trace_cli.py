"""``estimate --trace FILE.json`` and ``plan --trace`` (issue 65): the file as typed, whole, its step as long as the
estimate's; a bad path is one line naming --trace and exit 2, and nothing is written."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paraplan.cli import main

ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "4",
            "--global-batch", "32", "--seq-len", "4096"]


def test_estimate_trace_writes_the_predicted_step(tmp_path, capsys):
    out = tmp_path / "step.json"
    assert main([*ESTIMATE, "--format", "json", "--trace", str(out)]) == 0
    captured = capsys.readouterr()
    estimate = json.loads(captured.out)           # stdout stays the estimate's JSON alone
    assert f"wrote {out}" in captured.err and "ui.perfetto.dev" in captured.err
    doc = json.loads(out.read_text())
    complete = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    assert max(ev["ts"] + ev["dur"] for ev in complete) == pytest.approx(estimate["step_time_s"] * 1e6, abs=1e-2)
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["pipeline_ranks"] == 4
    processes = {ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "process_name"}
    assert len(processes) == 4 and any("sets the pace" in p for p in processes)
    threads = {ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "thread_name"}
    assert {"compute: forward, backward, recompute", "tp collectives", "pp send/recv"} <= threads
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]          # no temporary left beside it


def test_estimate_trace_replaces_an_old_file_whole(tmp_path, capsys):
    out = tmp_path / "step.json"
    out.write_text("old")
    assert main([*ESTIMATE, "--trace", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]
    assert "step time" in capsys.readouterr().out       # the table as without --trace


@pytest.mark.parametrize("make, expect", [
    (lambda d: d, "is a folder"),
    (lambda d: (d / "file.txt").write_text("x") and d / "file.txt" / "t.json", "is a file"),
    (lambda d: "", "empty path"),
])
def test_a_bad_trace_path_is_one_line_naming_the_flag(tmp_path, make, expect):
    path = make(tmp_path)
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", *ESTIMATE, "--trace", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("paraplan: error: --trace") and expect in r.stderr and r.stderr.count("\n") == 1


def test_plan_trace_writes_the_best_plans_step(tmp_path, capsys):
    out = tmp_path / "best.json"
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                 "--top", "1", "--format", "json", "--trace", str(out)]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]
    doc = json.loads(out.read_text())
    assert doc["otherData"]["plan"] == best["plan"]
    assert doc["otherData"]["step_time_s"] == pytest.approx(best["step_time_s"])
