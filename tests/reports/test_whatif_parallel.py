"""What-if points in worker processes: the same results as one process, in the points' order, errors raised
as one process raises them, and no worker left behind when ``whatif`` is killed."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paraplan.errors import ConfigError
from paraplan.reports import sweep
from paraplan.reports.sweep import Scenario, parse_sweep, resolve_points, run_points

fork_only = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="workers are forked (Linux)")

SMALL = Scenario(model="gpt-1.7b", cluster="dgx-a100-80g", seq_len=2048, global_batch=64,
                 sweeps=(parse_sweep("gpus=8..64"), parse_sweep("offload=none,auto")))


@fork_only
def test_parallel_points_equal_one_process():
    points = resolve_points(SMALL)
    assert len(points) == 8
    one = run_points(points, SMALL, jobs=1)
    many = run_points(points, SMALL, jobs=3)
    assert [r.point for r in many] == points                          # the points' order, the same objects
    assert [(r.estimate, r.reason, r.candidates) for r in many] == [(r.estimate, r.reason, r.candidates) for r in one]
    assert all(r.estimate is not None for r in many)


@fork_only
def test_an_error_at_a_point_is_raised_as_one_process_raises_it(monkeypatch):
    """The workers are forked after the patch: points 2 and 5 fail; the first in the points' order comes back
    as the ConfigError it was (field, problem, accepted kept), although its constructor takes other arguments."""
    points = resolve_points(SMALL)
    real = sweep.evaluate_point

    def failing(point, scenario):
        if point.index in (2, 5):
            raise ConfigError("--fix tp", f"illegal at point {point.index}", accepted="1, 2")
        return real(point, scenario)
    monkeypatch.setattr(sweep, "evaluate_point", failing)
    with pytest.raises(ConfigError) as err:
        run_points(points, SMALL, jobs=2)
    assert err.value.field == "--fix tp" and err.value.accepted == "1, 2"
    assert str(err.value) == str(ConfigError("--fix tp", "illegal at point 2", accepted="1, 2"))


def test_one_job_or_one_point_stays_in_this_process(monkeypatch):
    monkeypatch.setattr(sweep, "_run_parallel", lambda *a: pytest.fail("no worker process for one job"))
    points = resolve_points(SMALL)
    assert len(run_points(points[:1], SMALL)) == 1
    assert len(run_points(points[:2], SMALL, jobs=1)) == 2
    assert sweep.default_jobs() >= 1


def _children(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
@fork_only
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_killed_whatif_leaves_no_worker(tmp_path):
    """SIGKILL the command while its workers compute (DeepSeek-V3 points, seconds each): they die with it
    (PR_SET_PDEATHSIG) at once, rather than finishing their point on a core nobody waits for."""
    args = [sys.executable, "-m", "paraplan.cli", "whatif", "--model", "deepseek-v3", "--cluster", "dgx-h100",
            "--seq-len", "4096", "--global-batch", "4096", "--sweep", "gpus=512,1024", "--out",
            str(tmp_path / "report")]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "PARAPLAN_PROGRESS": "0", "MPLBACKEND": "Agg"})
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while p.poll() is None and time.monotonic() < deadline and len(workers) < 2:
        workers = _children(p.pid)
        time.sleep(0.01)
    assert len(workers) >= 2, "the sweep finished or never started its workers"
    time.sleep(0.5)                                     # both inside a point's search
    assert p.poll() is None
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(0.5)
    alive = [w for w in workers if _running(w)]
    assert alive == [], f"workers still running after their parent was killed: {alive}"
