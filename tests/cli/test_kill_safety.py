"""Nothing is lost: ``plan --out``, ``export --out`` and ``whatif --out`` killed with SIGKILL at random
moments (real subprocesses, a fixed seed for the moments) leave the previous result or the new one,
whole, never a part, a mix or nothing; files of the user's in the ``--out`` folder survive; outputs
honour the umask; and two identical ``whatif`` runs write byte-identical files.

How the moments are chosen: each command is first run to completion (its duration T, and for
``whatif`` the duration W of its write phase, from the moment its new generation folder appears
to the end). Then some kills land uniformly over the run and the rest a random time within W
after the write phase has started, so that kills hit the renames and the figure writing, not only
Python's start-up. A kill after the commit (one rename) finds the new report; before it, the old.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

SEED = 20261123
CLI = [sys.executable, "-m", "paraplan.cli"]
UMASK = 0o027
SMALL = ["--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--seq-len", "2048", "--global-batch", "64"]
REPORT = ("report.html", "points.csv", "scenario.yaml", "figures", "data")


def _env(hashseed: str = "0") -> dict:
    return {**os.environ, "PARAPLAN_PROGRESS": "0", "MPLBACKEND": "Agg", "PYTHONHASHSEED": hashseed}


def _umask():
    os.umask(UMASK)


def run(args, hashseed: str = "0") -> float:
    """Run the CLI to completion under UMASK; its wall time."""
    t0 = time.monotonic()
    r = subprocess.run(CLI + args, capture_output=True, text=True, env=_env(hashseed), preexec_fn=_umask,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return time.monotonic() - t0


def kill_at(args, delay_s: float, started=None) -> bool:
    """Start the CLI, wait until ``started()`` (if given) and then ``delay_s``, SIGKILL it.
    True if it was killed, False if it finished first."""
    p = subprocess.Popen(CLI + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                         preexec_fn=_umask)
    try:
        if started is not None:
            while p.poll() is None and not started():
                time.sleep(0.002)
        deadline = time.monotonic() + delay_s
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
            return True
        return False
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def user_files(folder: Path) -> dict[str, bytes]:
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    files = {"notes.txt": b"my notes\n", "sub/keep.csv": b"a,b\n1,2\n", ".hidden": b"x"}
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    return files


def assert_user_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (folder / rel).read_bytes() == data, f"the user's {rel} was changed or removed"


# --- plan and export: one file each ---------------------------------------------------------------

def _moments(rng: random.Random, t: float, n: int) -> list[float]:
    """n kill moments over the run, denser towards its end where the file is written."""
    return sorted(rng.uniform(0.3 * t, 1.05 * t) for _ in range(n))


@pytest.mark.slow
def test_plan_out_killed_leaves_old_or_new_plan_file(tmp_path):
    rng = random.Random(SEED)
    out = tmp_path / "plans"
    out.mkdir()
    mine = user_files(out)
    target = out / "plan.json"
    run(["plan", *SMALL, "--gpus", "8", "--out", str(target)])
    old = target.read_bytes()
    new_args = ["plan", *SMALL, "--gpus", "16", "--out", str(tmp_path / "ref.json")]
    t = run(new_args)
    new = (tmp_path / "ref.json").read_bytes()
    assert old != new and json.loads(new)["scenario"]["gpus"] == 16
    outcomes = []
    for moment in _moments(rng, t, 4):
        killed = kill_at(new_args[:-1] + [str(target)], moment)
        data = target.read_bytes()                      # exists: never missing
        assert data in (old, new), "plan.json is neither the old nor the new file (a partial write)"
        json.loads(data)
        assert_user_files(out, mine)
        outcomes.append(("killed " if killed else "finished ") + ("old" if data == old else "new"))
        if data == new:                                  # start again from the old file
            target.write_bytes(old)
    print("plan --out:", outcomes)
    run(new_args[:-1] + [str(target)])
    assert target.read_bytes() == new                    # same run, same bytes
    assert target.stat().st_mode & 0o777 == 0o666 & ~UMASK, "plan file ignores the umask"


@pytest.mark.slow
def test_export_out_killed_leaves_old_or_new_script(tmp_path):
    rng = random.Random(SEED + 1)
    plan_a, plan_b = tmp_path / "a.json", tmp_path / "b.json"
    run(["plan", *SMALL, "--gpus", "8", "--out", str(plan_a)])
    run(["plan", *SMALL, "--gpus", "16", "--out", str(plan_b)])
    out = tmp_path / "launch"
    out.mkdir()
    mine = user_files(out)
    script = out / "train.sh"
    run(["export", str(plan_a), "--to", "megatron", "--out", str(script)])
    old = script.read_bytes()
    assert script.stat().st_mode & 0o777 == 0o777 & ~UMASK, "the script is executable under the umask"
    t = run(["export", str(plan_b), "--to", "megatron", "--out", str(tmp_path / "ref.sh")])
    new = (tmp_path / "ref.sh").read_bytes()
    assert old != new
    for moment in _moments(rng, t, 4):
        kill_at(["export", str(plan_b), "--to", "megatron", "--out", str(script)], moment)
        data = script.read_bytes()
        assert data in (old, new), "train.sh is neither the old nor the new script"
        assert script.stat().st_mode & 0o111, "a killed export left the script without its x bits"
        assert_user_files(out, mine)
        if data == new:
            script.write_bytes(old)


# --- whatif: a folder of files --------------------------------------------------------------------

OLD_SWEEP = ["whatif", *SMALL, "--sweep", "gpus=8"]
NEW_SWEEP = ["whatif", *SMALL, "--sweep", "gpus=8,16"]


def snapshot(folder: Path) -> dict[str, bytes] | None:
    """The report's files (through its links), each checked whole; None if no report is there."""
    if not (folder / "report.html").exists():
        assert not any((folder / n).exists() for n in REPORT), "part of a report without report.html"
        return None
    files = {}
    for name in REPORT:
        p = folder / name
        assert p.exists(), f"{name} missing beside report.html"
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file():
                files[str(f.relative_to(folder))] = f.read_bytes()
    html = files["report.html"].decode()
    assert html.rstrip().endswith("</html>") and 'id="report-check"' in html
    points = pd.read_csv(folder / "points.csv")
    assert f"{len(points)} points" in html, "report.html and points.csv come from different runs"
    assert yaml.safe_load(files["scenario.yaml"])["sweep"]["gpus"] in ("8", "8,16")
    for rel, data in files.items():
        if rel.endswith(".png"):
            assert data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82"), f"{rel} is cut short"
        elif rel.endswith(".svg"):
            assert data.rstrip().endswith(b"</svg>"), f"{rel} is cut short"
        elif rel.endswith(".csv"):
            pd.read_csv(folder / rel)
    return files


@pytest.fixture(scope="module")
def whatif_runs(tmp_path_factory):
    """The old report in a folder with the user's files; the new sweep twice into fresh folders (two
    processes, different hash seeds), timing the second and its write phase."""
    root = tmp_path_factory.mktemp("kill")
    out = root / "out"
    out.mkdir()
    mine = user_files(out)
    run(OLD_SWEEP + ["--out", str(out)])
    ref1, ref2 = root / "ref1", root / "ref2"
    run(NEW_SWEEP + ["--out", str(ref1)], hashseed="1")
    p = subprocess.Popen(CLI + NEW_SWEEP + ["--out", str(ref2)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=_env("2"), preexec_fn=_umask)
    t0 = time.monotonic()
    t_gen = None
    while p.poll() is None:
        if t_gen is None and any((ref2 / ".paraplan").glob("gen-*")):
            t_gen = time.monotonic()
        time.sleep(0.002)
    assert p.returncode == 0 and t_gen is not None
    t_end = time.monotonic()
    return {"out": out, "mine": mine, "ref1": ref1, "ref2": ref2, "T": t_end - t0, "W": t_end - t_gen}


@pytest.mark.slow
def test_two_identical_whatif_runs_write_identical_files(whatif_runs):
    a, b = snapshot(whatif_runs["ref1"]), snapshot(whatif_runs["ref2"])
    assert a is not None and sorted(a) == sorted(b)
    assert {k for k in a if k.endswith(".svg")} and "data/heatmap.csv" in a
    different = [k for k in a if a[k] != b[k]]
    assert different == [], f"differ between identical runs: {different}"
    assert "Computed in" not in a["report.html"].decode() and "search_s" not in a["points.csv"].decode()


@pytest.mark.slow
def test_whatif_out_killed_leaves_old_or_new_report(whatif_runs, tmp_path):
    rng = random.Random(SEED + 2)
    out, mine = whatif_runs["out"], whatif_runs["mine"]
    old, new = snapshot(out), snapshot(whatif_runs["ref1"])
    assert old is not None and old != new
    mode = (out / ".paraplan" / "current" / "points.csv").stat().st_mode & 0o777
    assert mode == 0o666 & ~UMASK and (out / "figures").stat().st_mode & 0o777 == 0o777 & ~UMASK

    def gen_started(folder: Path, live: set[str]):
        return lambda: any(g.name not in live for g in (folder / ".paraplan").glob("gen-*"))

    pristine = tmp_path / "old-copy"
    shutil.copytree(out, pristine, symlinks=True)

    T, W = whatif_runs["T"], whatif_runs["W"]
    moments = [(rng.uniform(0, T), False) for _ in range(2)] + [(rng.uniform(0.3 * W, 1.1 * W), True)
                                                               for _ in range(4)]
    outcomes = []
    for moment, after_write_starts in moments:
        live = {g.name for g in (out / ".paraplan").glob("gen-*")}
        killed = kill_at(NEW_SWEEP + ["--out", str(out)], moment, gen_started(out, live) if after_write_starts else None)
        now = snapshot(out)
        assert now in (old, new), "the report is neither the old one nor the new one, whole"
        assert_user_files(out, mine)
        outcomes.append(("killed " if killed else "finished ") + ("old" if now == old else "new"))
        if now == new:                                   # back to the old report for the next kill
            shutil.rmtree(out)
            shutil.copytree(pristine, out, symlinks=True)
            assert snapshot(out) == old
    print(f"whatif --out (T {T:.1f} s, write phase {W:.1f} s):", outcomes)

    # a first report into a folder that has none: nothing or all of it
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    theirs = user_files(fresh)
    moment = rng.uniform(0, W)
    killed = kill_at(NEW_SWEEP + ["--out", str(fresh)], moment, gen_started(fresh, set()))
    now = snapshot(fresh)
    assert now in (None, new)
    assert_user_files(fresh, theirs)
    print("first report:", ("killed " if killed else "finished ") + ("none" if now is None else "new"))

    # a run to the end publishes the new report and removes what killed runs left
    run(NEW_SWEEP + ["--out", str(out)])
    assert snapshot(out) == new
    assert_user_files(out, mine)
    assert [g.name for g in (out / ".paraplan").glob("gen-*")] == [os.readlink(out / ".paraplan" / "current")]


def test_the_next_write_removes_a_killed_writers_temporary(tmp_path):
    """A SIGKILLed write_atomic leaves .NAME.PID.XXXX; the next write of the file removes it, but
    not a temporary of a writer that is still alive."""
    import os
    import subprocess
    import sys
    from paraplan.io import write_atomic
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".plan.json.{dead}.abc123"
    live = tmp_path / f".plan.json.{os.getppid()}.def456"
    stale.write_text("partial")
    live.write_text("in progress")
    write_atomic(tmp_path / "plan.json", "{}")
    assert (tmp_path / "plan.json").read_text() == "{}"
    assert not stale.exists() and live.exists()
