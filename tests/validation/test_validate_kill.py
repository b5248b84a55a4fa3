"""``paraplan validate`` stopped from outside: real torchrun (gloo on CPU), real signals, real files.

* A stopped rank (SIGSTOP) ends ``validate`` within its ``--timeout`` with an error that says
  "timeout" and names the rank, and nothing the run started is left (checked in /proc).
* SIGTERM and SIGINT to ``validate`` while the ranks train take torchrun and every rank down.
* ``validate --out`` SIGKILLed at random moments leaves the old report or a new one, whole, and
  its children die with it; the next run never reads an earlier run's rank files.

Kept small for CI: a 2-layer model of hidden 64, ``--predicted`` (no profile), tp 2 on 2 ranks.
"""
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.torch

pytest.importorskip("torch")

SMALL = ["--nproc-per-node", "2", "--tp", "2", "--layers", "2", "--hidden", "64", "--heads", "4",
         "--seq-len", "32", "--vocab", "256"]
PREDICTED = {"step_time_s": 0.05, "memory_bytes_per_rank": 2_000_000,
             "time_breakdown_s": {"compute": 0.03, "tp_comm": 0.02}}


def _env():
    env = dict(os.environ, PARAPLAN_PROGRESS="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _start(out, *flags, pred):
    cmd = [sys.executable, "-m", "paraplan.cli", "validate", *SMALL, "--predicted", str(pred),
           "--out", str(out), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _procs_mentioning(text: str) -> list[int]:
    """Live processes (not zombies) whose command line contains ``text``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(pid))
    return found


def _none_left(out, wait_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        left = _procs_mentioning(str(out))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _rank_status(out, rank: int, proc, timeout_s: float = 120.0) -> dict:
    """Wait until ``rank`` has trained a step (its progress record), return the record."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for d in os.listdir(out) if os.path.isdir(out) else []:
            path = os.path.join(out, d, f".rank{rank}.status.json")
            if d.startswith(".validate-") and os.path.exists(path):
                try:
                    with open(path) as f:
                        st = json.load(f)
                except ValueError:
                    continue
                if (st.get("step") or 0) >= 1:
                    return st
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never reported a step")


@pytest.fixture
def pred(tmp_path):
    p = tmp_path / "pred.json"
    p.write_text(json.dumps(PREDICTED))
    return p


@pytest.mark.slow
def test_stopped_rank_times_out_naming_it_and_nothing_is_left(tmp_path, pred):
    out = tmp_path / "out"
    timeout = 25
    proc = _start(out, "--steps", "100000", "--no-reference", "--timeout", str(timeout), pred=pred)
    try:
        started = time.monotonic()
        st = _rank_status(out, 1, proc)
        os.kill(st["pid"], signal.SIGSTOP)
        _, err = proc.communicate(timeout=timeout + 60)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err
    assert elapsed <= timeout + 30
    line = [ln for ln in err.splitlines() if ln.startswith("paraplan: error:")]
    assert len(line) == 1, err
    assert "timeout" in line[0] and "rank 1 did not finish (stopped" in line[0], line[0]
    assert "Traceback" not in err
    assert _none_left(out) == []
    assert not list(out.glob(".validate-*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_validate_kills_torchrun_and_every_rank(tmp_path, pred, sig):
    out = tmp_path / "out"
    proc = _start(out, "--steps", "100000", "--no-reference", pred=pred)
    try:
        st = _rank_status(out, 0, proc)
        assert st["pid"] in _procs_mentioning(str(out))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "Traceback" not in (err or "")
    assert _none_left(out) == []


@pytest.mark.slow
def test_sigkilled_validate_leaves_old_or_new_report_whole(tmp_path, pred):
    out = tmp_path / "out"
    t0 = time.monotonic()
    first = _start(out, "--steps", "2", pred=pred)
    _, err = first.communicate(timeout=300)
    full_s = time.monotonic() - t0
    assert first.returncode == 0, err
    old = (out / "report.json").read_bytes()
    rng = random.Random(1234)
    outcomes = set()
    for frac in (0.4, 0.97):
        delay = full_s * frac * rng.uniform(0.9, 1.1)
        proc = _start(out, "--steps", "2", pred=pred)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        assert _none_left(out) == [], f"children of a SIGKILLed validate left after {delay:.1f} s"
        now = (out / "report.json").read_bytes()
        report = json.loads(now)      # whole: parses, with every section
        assert report["measured"]["step_time_s"] > 0 and report["plan"]["tp"] == 2
        outcomes.add("old" if now == old else "new")
        old = now
    # a fresh run after the kills: stale run folders and rank files are not merged into it
    last = _start(out, "--steps", "2", pred=pred)
    _, err = last.communicate(timeout=300)
    assert last.returncode == 0, err
    assert json.loads((out / "report.json").read_text())["loss_matches_reference"] is True
    assert not list(out.glob(".validate-*"))
    assert outcomes   # which of old/new each kill left depends on timing; both are whole


class _Payload:
    """Unpickling this creates ``path``: stands for code a pickle can run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.slow
def test_stale_files_in_out_are_never_loaded(tmp_path, pred):
    import torch

    from paraplan.validation.reference import load_parallel_grads
    out = tmp_path / "out"
    out.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"blocks.0.attn.qkv.weight": _Payload(marker)}, out / "grads_rank0.pt")
    (out / "rank7.json").write_text(json.dumps({"rank": 7, "losses": [1.0]}))
    stale = out / ".validate-999999999"   # a killed run's folder (no such pid)
    stale.mkdir()
    torch.save({"x": _Payload(marker)}, stale / "grads_rank0.pt")
    proc = _start(out, "--steps", "2", pred=pred)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["loss_matches_reference"] is True and report["reference_check"]["missing_grads"] == []
    assert not marker.exists() and not stale.exists()
    # the loader itself refuses pickled objects other than tensors
    with pytest.raises(pickle.UnpicklingError):
        load_parallel_grads(str(out))
    assert not marker.exists()
