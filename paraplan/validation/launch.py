"""Build and run the ``torchrun`` command for a worker, wait, and gather per-rank results."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from paraplan.errors import ConfigError, ParaplanError
from paraplan.validation.config import read_run_spec, world_size
from paraplan.validation.procs import die_with_parent, kill_pids, kill_tree, process_state

WORKER_MODULE = "paraplan.validation.worker"
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WorkerFailed(ParaplanError):
    """A torchrun worker exited non-zero; the message carries its last stderr lines."""

    def __init__(self, returncode: int, command: list[str], tail: str):
        self.returncode, self.command, self.tail = returncode, command, tail
        super().__init__(f"torchrun exited with code {returncode}: {' '.join(command)}\n"
                         f"last worker output:\n{tail}")


@dataclass(frozen=True)
class LaunchOptions:
    """How to start torchrun: processes on this node and multi-node rendezvous flags."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port; None on one node = localhost, free port
    rdzv_id: str = "paraplan"
    timeout_s: float = 900.0

    def __post_init__(self):
        if self.nproc_per_node < 1:
            raise ConfigError("nproc_per_node", f"must be >= 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise ConfigError("nnodes", f"must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError("node_rank", f"{self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("rdzv_endpoint", "multi-node runs need --rdzv-endpoint host:port")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def torchrun_command(opts: LaunchOptions, module: str, args: list[str]) -> list[str]:
    """The argv that starts ``python -m <module> <args>`` on every local process via torchrun."""
    endpoint = opts.rdzv_endpoint or "localhost:0"
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nproc-per-node={opts.nproc_per_node}", f"--nnodes={opts.nnodes}",
            f"--node-rank={opts.node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={opts.rdzv_id}",
            "-m", module, *args]


def worker_env(extra: dict | None = None) -> dict:
    """Environment for workers: one intra-op thread unless set, the package importable."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


class WorkerTimeout(ParaplanError):
    """torchrun did not finish within the timeout; names the ranks that did not finish.

    Everything the launch started has been killed when this is raised."""

    def __init__(self, timeout_s: float, unfinished: list[str], log_path: str):
        self.timeout_s, self.unfinished, self.log_path = timeout_s, unfinished, log_path
        super().__init__(f"timeout after {timeout_s:g} s: {'; '.join(unfinished) or 'no rank reported'} "
                         f"(torchrun and every rank killed; log: {log_path})")


def status_path(out_dir: str, rank: int) -> str:
    """Where rank ``rank`` keeps its progress (pid, phase, step) while it runs."""
    return os.path.join(out_dir, f".rank{rank}.status.json")


def read_status(out_dir: str, rank: int) -> dict | None:
    """A rank's last progress record, None if it never wrote one (or it is unreadable)."""
    try:
        with open(status_path(out_dir, rank)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def unfinished_ranks(out_dir: str, ranks: range) -> list[str]:
    """One phrase per rank of ``ranks`` that did not finish: its process state and last step."""
    out = []
    for r in ranks:
        st = read_status(out_dir, r)
        if st is None:
            out.append(f"rank {r} did not start (no progress record)")
        elif st.get("phase") != "done":
            state = process_state(int(st.get("pid", 0) or 0))
            where = st.get("phase", "?")
            if st.get("step") is not None:
                where += f", step {st['step']} of {st.get('steps') or '?'}"
            out.append(f"rank {r} did not finish ({state}; last at {where})")
    return out


def slowest_progress(out_dir: str, ranks: range) -> int:
    """Steps done by the rank furthest behind (0 until every rank has a progress record)."""
    steps = []
    for r in ranks:
        st = read_status(out_dir, r)
        if st is None:
            return 0
        steps.append(st.get("step") or 0)
    return min(steps)


def clear_status(out_dir: str, ranks: range) -> None:
    """Remove the progress records of ``ranks`` (left by an earlier run)."""
    for r in ranks:
        try:
            os.remove(status_path(out_dir, r))
        except FileNotFoundError:
            pass


def _start_child():
    """preexec_fn of torchrun: die with the launcher (see :mod:`paraplan.validation.procs`)."""
    die_with_parent()


class _Interrupted(BaseException):
    """SIGTERM / SIGINT / SIGHUP arrived while torchrun ran (re-raised after the cleanup)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signum)


def run_torchrun(opts: LaunchOptions, module: str, args: list[str], log_path: str,
                 status_dir: str | None = None, on_poll=None) -> None:
    """Run torchrun to completion, output to ``log_path``; raise WorkerFailed on failure.

    torchrun runs with its own process group; on the timeout, on SIGTERM / SIGINT / SIGHUP to
    this process, or on any exception here, torchrun and every rank below it (and any rank whose
    progress record in ``status_dir`` names its pid) are SIGKILLed before this returns: nothing is
    left running. A timeout raises :class:`WorkerTimeout` naming the ranks that did not finish
    (from ``status_dir``'s progress records). ``on_poll()`` is called about twice a second while
    torchrun runs (progress display)."""
    import signal
    import threading
    import time

    cmd = torchrun_command(opts, module, args)
    ranks = range(opts.node_rank * opts.nproc_per_node, (opts.node_rank + 1) * opts.nproc_per_node)
    if status_dir is not None:
        clear_status(status_dir, ranks)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            raise _Interrupted(signum)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            handlers[sig] = signal.signal(sig, on_signal)
    proc = None
    timed_out, unfinished = False, []
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(),
                                    start_new_session=True, preexec_fn=_start_child)
            deadline = time.monotonic() + opts.timeout_s
            while True:
                try:
                    rc = proc.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if on_poll is not None:
                        on_poll()
                    if time.monotonic() >= deadline:
                        timed_out = True
                        break
    except _Interrupted as e:
        _stop(proc, status_dir, ranks)
        _restore(handlers)
        handlers = {}
        if e.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + e.signum) from None
    finally:
        if proc is not None and proc.poll() is None:
            unfinished = unfinished_ranks(status_dir, ranks) if status_dir and timed_out else []
            _stop(proc, status_dir, ranks)
        _restore(handlers)
    if timed_out:
        raise WorkerTimeout(opts.timeout_s, unfinished, log_path)
    if rc != 0:
        with open(log_path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if "USDT:" not in ln and "Warning" not in ln]
        raise WorkerFailed(rc, cmd, "\n".join(_worker_tail(lines)))


def _rank_pids(status_dir: str | None, ranks: range) -> list[int]:
    """Pids of the ranks whose progress record does not say they are done."""
    if status_dir is None:
        return []
    records = [read_status(status_dir, r) or {} for r in ranks]
    return [int(st.get("pid", 0) or 0) for st in records if st.get("phase") != "done"]


def _stop(proc, status_dir, ranks) -> None:
    """SIGKILL torchrun's tree and the unfinished ranks named in the progress records, then reap
    torchrun."""
    if proc is None:
        return
    if proc.poll() is None:
        kill_tree(proc.pid, _rank_pids(status_dir, ranks))
    else:   # torchrun is gone: only ranks it may have left behind
        kill_pids(_rank_pids(status_dir, ranks))
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _restore(handlers: dict) -> None:
    import signal
    for sig, h in handlers.items():
        signal.signal(sig, h)


#: words of a rank's own failure message (a Python exception, a C++ abort such as gloo's) in torchrun's log
FAILURE_MARKS = ("terminate called", "what():", "Error", "Exception", "Aborted", "Fatal")


def _worker_tail(lines: list[str], n: int = 15) -> list[str]:
    """The workers' own last lines (torchrun prefixes them ``[rankN]:``), else the log's end, preceded
    by the earlier lines that read like a rank's own failure (torchrun's summary at the end names
    only the rank and its signal, e.g. SIGABRT, while the abort's message sits above it)."""
    ranked = [ln for ln in lines if ln.startswith("[rank")]
    if not ranked:
        earlier = [ln for ln in lines[:-25] if any(m in ln for m in FAILURE_MARKS)
                   and "torch/distributed/" not in ln and "ChildFailedError" not in ln]
        return earlier[-10:] + lines[-25:]
    first = ranked[0].split("]", 1)[0]  # one rank's traceback is enough
    return [ln for ln in ranked if ln.startswith(first)][-n:]


def clear_results(out_dir: str) -> None:
    """Remove the rank results of an earlier run from ``out_dir`` (``rank<N>.json``,
    ``grads_rank<N>.pt`` and progress records): a run never merges another run's files."""
    for pattern in ("rank*.json", "grads_rank*.pt", ".rank*.status.json"):
        for old in glob.glob(os.path.join(out_dir, pattern)):
            os.remove(old)


def launch_worker(spec: dict, out_dir: str, opts: LaunchOptions, on_poll=None,
                  log_path: str | None = None) -> list[dict]:
    """Run the validation worker for ``spec`` and return the rank results found on this node.

    Parameters
    ----------
    spec : dict
        ``{"model": {...GPTConfig fields}, "plan": {...Plan fields}, "run": {...RunOptions fields},
        "dump_grads": bool}``: :func:`paraplan.validation.config.run_spec`.
    out_dir : str
        Where ``rank<N>.json`` (and ``grads_rank<N>.pt``, ``torchrun.log``) are written; rank
        files of an earlier run there are removed first.
    opts : LaunchOptions
    on_poll : callable or None
        Called about twice a second while the ranks run (progress display).
    log_path : str or None
        torchrun's output (default ``out_dir/torchrun.log``).
    """
    _, plan, _ = read_run_spec(spec)
    if world_size(plan) != opts.world_size:
        raise ConfigError("nproc_per_node", f"tp({plan.tp}) * cp({plan.cp}) * pp({plan.pp}) * dp({plan.dp}) = "
                          f"{world_size(plan)} != nproc_per_node({opts.nproc_per_node}) * "
                          f"nnodes({opts.nnodes}) = {opts.world_size}")
    os.makedirs(out_dir, exist_ok=True)
    clear_results(out_dir)
    fd, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    try:
        run_torchrun(opts, WORKER_MODULE, [spec_path, "--out", out_dir],
                     log_path or os.path.join(out_dir, "torchrun.log"), status_dir=out_dir, on_poll=on_poll)
    finally:
        os.remove(spec_path)
    return gather_results(out_dir)


def launch_worker_batch(specs: list[dict], out_dir: str, opts: LaunchOptions) -> dict:
    """Run several plans of the same world size in one torchrun launch (saves start-up time).

    ``specs`` are single-run specs each with a unique ``name``; returns name -> rank results,
    each run's files under ``out_dir/<name>``.
    """
    names = [s.get("name") for s in specs]
    if None in names or len(set(names)) != len(names):
        raise ConfigError("specs", "every spec needs a unique 'name'")
    for s in specs:
        _, plan, _ = read_run_spec({k: v for k, v in s.items() if k != "name"})
        if world_size(plan) != opts.world_size:
            raise ConfigError(f"specs[{s['name']}].plan", f"world size {world_size(plan)} != "
                              f"{opts.world_size} processes")
    os.makedirs(out_dir, exist_ok=True)
    for n in names:
        clear_results(os.path.join(out_dir, n))
    fd, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump({"runs": specs}, f)
    try:
        run_torchrun(opts, WORKER_MODULE, [spec_path, "--out", out_dir],
                     os.path.join(out_dir, "torchrun.log"), status_dir=out_dir)
    finally:
        os.remove(spec_path)
    return {n: gather_results(os.path.join(out_dir, n)) for n in names}


def gather_results(out_dir: str) -> list[dict]:
    """Every ``rank<N>.json`` in ``out_dir``, sorted by rank."""
    results = []
    for path in glob.glob(os.path.join(out_dir, "rank*.json")):
        with open(path) as f:
            results.append(json.load(f))
    if not results:
        raise ParaplanError(f"no rank results in {out_dir}")
    return sorted(results, key=lambda r: r["rank"])
