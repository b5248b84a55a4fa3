"""End-to-end: `cf plan`, `cf profile` and a tiny `cf validate` write complete, sane outputs."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from paraplan.cf.model import default_batch
from paraplan.cli.cf import main
from paraplan.hardware.catalog import load_part, preset_names

REQUIRED = ("chosen_tile", "best_measured_tile", "chosen_vs_best_time_ratio", "epoch_time_mape",
            "speedup_vs_baseline", "recall_at_20_tiled", "recall_at_20_untiled")
AMAZON = ["--users", "52643", "--items", "91599", "--interactions", "2380730"]
TINY = ["--users", "120", "--items", "600", "--interactions", "2400", "--dim", "16", "--negatives", "16",
        "--batch", "64", "--epochs", "1", "--sweep", "3", "--repeats", "1"]
PNG_END = b"IEND\xaeB`\x82"


def test_plan_json(capsys):
    rc = main(["cf", "plan", "--cpu", "epyc-7742", *AMAZON, "--dim", "128", "--negatives", "64", "--threads", "64",
               "--batch", "4096", "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choices"][0]["rank"] == 1 and out["choices"][0]["footprint_bytes"] <= 4 * 2**20
    assert out["relaxed"] == [] and out["notes"] == [] and out["batch"] == 4096


@pytest.mark.parametrize("cpu", preset_names("cpus"))
def test_plan_with_default_arguments_works_on_every_catalogue_cpu(cpu, capsys):
    """Default threads (all cores) and default batch: 512 rounded to a multiple of the cores, said so."""
    assert main(["cf", "plan", "--cpu", cpu, "--users", "50000", "--items", "20000", "--interactions", "1000000",
                 "--negatives", "128", "--format", "json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    cores = load_part("cpus", cpu).cores
    assert out["threads"] == cores and out["batch"] % cores == 0 and out["batch"] == default_batch(cores)
    assert abs(out["batch"] - 512) <= cores / 2
    assert (out["batch"] == 512) == (not any("rounded to the nearest multiple" in n for n in out["notes"]))
    assert out["choices"] and out["relaxed"] == []


def test_default_batch_is_nearest_multiple_of_threads():
    assert [default_batch(t) for t in (1, 20, 40, 48, 64, 96, 1000)] == [512, 520, 520, 528, 512, 480, 1000]


def test_amazon_books_1000_negatives_returns_a_plan_naming_the_relaxed_bound(capsys):
    """HEAT's d = 128 with SimpleX's 1000 negatives at 64 threads on the EPYC 7742: no tile holds 8 rows
    per negative in a thread's 4 MiB L3 share (8000 rows = 8 MiB), so the bound is relaxed to 4096/1000."""
    args = ["cf", "plan", "--cpu", "epyc-7742", *AMAZON, "--dim", "128", "--negatives", "1000", "--threads", "64"]
    assert main(args) == 0
    text = capsys.readouterr().out
    note = next(line for line in text.splitlines() if line.startswith("note: relaxed tile rows per negative"))
    assert "bound 8, best plan 4.096 (1.95x below the bound)" in note and "--min-rows-per-negative" in note
    assert "--min-tile-per-negative" not in text
    assert main(args + ["--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["relaxed"]
    assert r["bound"] == "min_rows_per_negative" and r["factor"] == pytest.approx(8000 / 4096)
    assert out["choices"][0]["tile_rows"] == 4096 and out["choices"][0]["tile_level"] == "L3"
    # the flag the note names exists, and setting the bound yourself removes the relaxation
    assert main(args + ["--format", "json", "--min-rows-per-negative", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["relaxed"] == []


def test_bad_input_is_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "d.txt"
    bad.write_text("0 1 2\n1 two\n")
    assert main(["cf", "plan", "--cpu", "epyc-7742", "--dataset", str(bad), "--negatives", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2" in err and "Traceback" not in err
    assert main(["cf", "plan", "--cpu", "epyc-7742", "--users", "10", "--items", "10", "--interactions", "50",
                 "--negatives", "0"]) == 2
    capsys.readouterr()
    assert main(["cf", "plan", "--cpu", "xeon-8380", "--users", "10", "--items", "10", "--interactions", "50",
                 "--negatives", "1", "--batch", "500"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch: 500 is not a multiple of threads (40)" in err and "480 or 520" in err
    assert main(["cf", "plan", "--cpu", "epyc-7742", "--users", "10", "--items", "4", "--interactions", "50",
                 "--negatives", "1"]) == 2
    assert "items:" in capsys.readouterr().err


def test_validate_checks_out_before_the_run(tmp_path, capsys):
    """--out that is a file fails at once (one line, exit 2), before profiling: no profile is written."""
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    prof = tmp_path / "prof.json"
    t0 = time.perf_counter()
    assert main(["cf", "validate", "--out", str(blocker), *TINY, "--profile", str(prof)]) == 2
    assert time.perf_counter() - t0 < 5 and not prof.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paraplan: error: --out:") and "not a folder" in err
    assert main(["cf", "validate", "--out", str(blocker / "sub"), *TINY, "--profile", str(prof)]) == 2
    assert "out:" in capsys.readouterr().err and not prof.exists()


@pytest.fixture(scope="module")
def tiny_validate(tmp_path_factory):
    """One tiny `cf validate --out` (profiling into a new profile file), shared by the tests below."""
    d = tmp_path_factory.mktemp("cfv")
    out, prof = d / "rep", d / "prof.json"
    env = dict(os.environ, PARAPLAN_PROGRESS="1")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", "cf", "validate", "--out", str(out), *TINY,
                        "--profile", str(prof)], capture_output=True, text=True, env=env, timeout=600)
    return r, out, prof, time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.torch
def test_tiny_validate_writes_complete_report(tiny_validate, capsys):
    r, out, prof, _ = tiny_validate
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    for k in REQUIRED:
        assert k in rep
    assert rep["tiles_measured"] == 3 and rep["chosen_vs_best_time_ratio"] >= 1.0
    assert rep["epoch_time_mape"] >= 0 and rep["speedup_vs_baseline"] > 0
    png = (out / rep["figure"]).read_bytes()
    assert len(png) > 1000 and png.startswith(b"\x89PNG") and png.endswith(PNG_END)
    assert prof.exists() and not [p.name for p in out.iterdir() if p.name.startswith(".")]
    # progress: a bar per phase and a summary line per phase, on stderr only
    for phase in ("cf validate: profiling this CPU at 1 threads: done in", "cf validate: timing tiles",
                  "cf validate: 3 tiles x 1 timed epochs in", "cf validate: training tiled and untiled",
                  "cf validate: 1 epochs tiled and untiled in"):
        assert phase in r.stderr and phase not in r.stdout
    # the saved profile is reused by plan
    assert main(["cf", "plan", "--cpu", "local", "--profile", str(prof), "--users", "120", "--items", "600",
                 "--interactions", "1900", "--dim", "16", "--negatives", "16", "--batch", "64"]) == 0


def _whole(out, old_report: bytes | None) -> str:
    """'old', 'new' or 'none' for the result folder; fails if report.json or the figure is partial."""
    rep_path, fig_path = out / "report.json", out / "cf_tiles.png"
    if not rep_path.exists():
        assert old_report is None
        return "none"
    data = rep_path.read_bytes()
    rep = json.loads(data)     # whole: parses, and has every field
    for k in REQUIRED:
        assert k in rep
    png = fig_path.read_bytes()
    assert png.startswith(b"\x89PNG") and png.endswith(PNG_END), f"partial figure ({len(png)} bytes)"
    return "old" if data == old_report else "new"


@pytest.mark.slow
@pytest.mark.torch
def test_validate_killed_at_random_moments_leaves_old_or_new_result_whole(tiny_validate, tmp_path):
    """SIGKILL `cf validate --out` at seeded random moments, most of them late in the run where the
    files are written: report.json and the figure are each the old one or the new one, whole."""
    r, first, prof, _ = tiny_validate
    assert r.returncode == 0, r.stderr
    out = tmp_path / "rep"
    shutil.copytree(first, out)
    cmd = [sys.executable, "-m", "paraplan.cli", "cf", "validate", "--out", str(out), *TINY, "--profile", str(prof)]
    env = dict(os.environ, PARAPLAN_PROGRESS="0")
    t0 = time.perf_counter()   # one uninterrupted run (profile reused) gives the length to kill within
    assert subprocess.run(cmd, capture_output=True, env=env, timeout=600).returncode == 0
    run_s = time.perf_counter() - t0
    rng = random.Random(20261123)
    seen, killed = [], 0
    for _ in range(4):
        old = (out / "report.json").read_bytes()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            proc.wait(timeout=run_s * rng.uniform(0.4, 1.1))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed += 1
        seen.append(_whole(out, old))
    assert killed >= 1 and set(seen) <= {"old", "new"}, (killed, seen)
