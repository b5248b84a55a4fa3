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


def run_torchrun(opts: LaunchOptions, module: str, args: list[str], log_path: str) -> None:
    """Run torchrun to completion, output to ``log_path``; raise WorkerFailed on failure."""
    cmd = torchrun_command(opts, module, args)
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(),
                                  timeout=opts.timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if rc != 0:
        with open(log_path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if "USDT:" not in ln and "Warning" not in ln]
        raise WorkerFailed(rc, cmd, "\n".join(_worker_tail(lines)))


def _worker_tail(lines: list[str], n: int = 15) -> list[str]:
    """The workers' own last lines (torchrun prefixes them ``[rankN]:``), else the log's end."""
    ranked = [ln for ln in lines if ln.startswith("[rank")]
    if not ranked:
        return lines[-25:]
    first = ranked[0].split("]", 1)[0]  # one rank's traceback is enough
    return [ln for ln in ranked if ln.startswith(first)][-n:]


def launch_worker(spec: dict, out_dir: str, opts: LaunchOptions) -> list[dict]:
    """Run the validation worker for ``spec`` and return the rank results found on this node.

    Parameters
    ----------
    spec : dict
        ``{"model": {...GPTConfig fields}, "plan": {...RunPlan fields}, "dump_grads": bool}``.
    out_dir : str
        Where ``rank<N>.json`` (and ``grads_rank<N>.pt``, ``torchrun.log``) are written.
    opts : LaunchOptions
    """
    from paraplan.validation.worker import RunPlan
    plan = RunPlan.from_dict(dict(spec.get("plan", {})))
    if plan.world_size != opts.world_size:
        raise ConfigError("nproc_per_node", f"tp({plan.tp}) * pp({plan.pp}) * dp({plan.dp}) = "
                          f"{plan.world_size} != nproc_per_node({opts.nproc_per_node}) * "
                          f"nnodes({opts.nnodes}) = {opts.world_size}")
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "rank*.json")):
        os.remove(old)
    fd, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    try:
        run_torchrun(opts, WORKER_MODULE, [spec_path, "--out", out_dir],
                     os.path.join(out_dir, "torchrun.log"))
    finally:
        os.remove(spec_path)
    return gather_results(out_dir)


def launch_worker_batch(specs: list[dict], out_dir: str, opts: LaunchOptions) -> dict:
    """Run several plans of the same world size in one torchrun launch (saves start-up time).

    ``specs`` are single-run specs each with a unique ``name``; returns name -> rank results,
    each run's files under ``out_dir/<name>``.
    """
    from paraplan.validation.worker import RunPlan
    names = [s.get("name") for s in specs]
    if None in names or len(set(names)) != len(names):
        raise ConfigError("specs", "every spec needs a unique 'name'")
    for s in specs:
        plan = RunPlan.from_dict(dict(s.get("plan", {})))
        if plan.world_size != opts.world_size:
            raise ConfigError(f"specs[{s['name']}].plan", f"world size {plan.world_size} != "
                              f"{opts.world_size} processes")
    os.makedirs(out_dir, exist_ok=True)
    fd, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump({"runs": specs}, f)
    try:
        run_torchrun(opts, WORKER_MODULE, [spec_path, "--out", out_dir],
                     os.path.join(out_dir, "torchrun.log"))
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
