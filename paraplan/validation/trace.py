"""Measured time per term from a PyTorch profiler trace (Kineto's Chrome-trace JSON). No torch.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes ``{"traceEvents": [...]}``:
complete events (``"ph": "X"``, start ``ts`` and ``dur`` in microseconds) for every operator on
the CPU threads that ran it (``cat`` ``cpu_op``, ``user_annotation`` for ``record_function``
ranges such as ``ProfilerStep#N`` and ``Optimizer.step#AdamW.step``) and, with CUDA activity, for
every GPU kernel and copy on its stream (``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``; ``pid``
the device, ``tid`` the stream). The schema is Kineto's (pytorch/kineto,
libkineto/src/output_json.cpp); the operator names are ATen's, the collective names c10d's
(``gloo:all_reduce`` ranges on gloo's run-loop threads, ``nccl:all_reduce`` ranges and
``ncclDevKernel_AllReduce_*`` / ``ncclKernel_AllReduce_*`` kernels under NCCL).

:func:`read_trace` sums, per step (each ``ProfilerStep#N`` range; the whole trace when there is
none), the time of each term:

* **CUDA traces** (kernels present): kernel time by name: ``gemm`` (cuBLAS/CUTLASS GEMM kernels:
  ``gemm``, ``cutlass``, ``xmma``, ``sm80_``/``sm90_`` and the like), ``attention`` (``flash``,
  ``fmha``, ``attention``, ``cudnn`` SDPA), each collective kind from the NCCL kernel's name (the union of its kernels' intervals), and
  ``memory`` (every other kernel, memcpy and memset: elementwise, norms, softmax, copies);
  kernels inside an ``Optimizer.step`` range's correlated launches are not separated (the optimizer
  is the CPU range, see below). Overlap: the collective kernels' time that intersects the union of
  compute kernels on the same device. Idle: the step's span less the union of all kernels on the device.
* **CPU traces**: operator *self* time (its duration less its children's on the same thread) on
  the thread that runs the step: ``gemm`` (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``,
  ``addbmm``, ``_int_mm``), ``attention`` (``aten::_scaled_dot_product_*`` /
  ``_flash_attention_*`` / ``_efficient_attention_*``), ``optimizer`` (everything inside an
  ``Optimizer.step#`` range), ``memory`` (every other ATen operator: elementwise kernels, norms,
  softmax, copies), ``host`` (the self time of what is not an ATen operator: the autograd engine's
  nodes and bookkeeping, Python functions: the per-kernel cost on the host; a wrapper's own time
  while a collective runs, blocked in its wait, is idle). Collectives:
  the ``gloo:<op>`` / ``nccl:<op>`` ranges (on gloo's run-loop threads) by kind, with each call's
  own host time on the step's thread before its range (:func:`_call_intervals`), and the part of
  them that overlaps the step thread's compute operators. Idle: the step's span less the union of
  the step thread's top-level operators (Python between ops, waiting on a collective).

The collective kinds: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``all_to_all``,
``send_recv`` (send, recv and their batched forms), ``broadcast``, ``barrier``.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from bisect import bisect_left
from dataclasses import dataclass, field

from paraplan.errors import ConfigError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", "broadcast", "barrier")
COMPUTE = ("gemm", "attention", "memory", "host")
#: per-term names in a table (collectives as ``comm.<kind>``)
TERMS = COMPUTE + ("optimizer",)

_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_int_mm",
             "aten::_scaled_mm", "aten::addmv", "aten::mv"}
_ATTENTION_OP = re.compile(r"^aten::(_scaled_dot_product|_flash_attention|_efficient_attention|"
                           r"_cudnn_attention|scaled_dot_product)")
_GEMM_KERNEL = re.compile(r"gemm|cutlass|xmma|sm\d+_|cublas|wgmma|Kernel2|s\d+gemm|gemv", re.I)
_ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn", re.I)
#: (pattern, kind): a collective's kind from an op, range or NCCL kernel name
_COMM_KINDS = ((re.compile(r"all_?reduce|allreduce", re.I), "all_reduce"),
               (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
               (re.compile(r"all_?gather|allgather", re.I), "all_gather"),
               (re.compile(r"all_?to_?all|alltoall", re.I), "all_to_all"),
               (re.compile(r"send|recv|sendrecv", re.I), "send_recv"),
               (re.compile(r"broadcast", re.I), "broadcast"),
               (re.compile(r"barrier", re.I), "barrier"))
_COMM_RANGE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):", re.I)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_OPTIMIZER = re.compile(r"^Optimizer\.step#")


@dataclass(frozen=True)
class StepTerms:
    """Measured seconds per term of one step on one rank (see the module docstring)."""
    step: str
    span_s: float
    compute_s: dict            # gemm, attention, memory
    optimizer_s: float
    collectives_s: dict        # kind -> seconds
    overlapped_s: dict         # kind -> seconds of it under compute
    idle_s: float

    def terms(self) -> dict:
        """``{term: seconds}``: the compute terms, optimizer, ``comm.<kind>`` and idle."""
        out = dict(self.compute_s)
        out["optimizer"] = self.optimizer_s
        out.update({f"comm.{k}": v for k, v in self.collectives_s.items()})
        out["idle"] = self.idle_s
        return out


@dataclass(frozen=True)
class TraceSummary:
    """A trace read by :func:`read_trace`: ``kind`` (``cpu`` or ``cuda``), its steps, the rank."""
    path: str
    kind: str
    rank: int | None
    steps: tuple = field(default_factory=tuple)

    def mean(self) -> StepTerms:
        """The mean over the steps, as one StepTerms."""
        n = len(self.steps)

        def avg(get):
            keys = {k for s in self.steps for k in get(s)}
            return {k: sum(get(s).get(k, 0.0) for s in self.steps) / n for k in sorted(keys)}
        return StepTerms("mean", sum(s.span_s for s in self.steps) / n, avg(lambda s: s.compute_s),
                         sum(s.optimizer_s for s in self.steps) / n, avg(lambda s: s.collectives_s),
                         avg(lambda s: s.overlapped_s), sum(s.idle_s for s in self.steps) / n)


def collective_kind(name: str) -> str | None:
    """The collective kind a range, op or kernel name names (None when it names none)."""
    for pattern, kind in _COMM_KINDS:
        if pattern.search(name):
            return kind
    return None


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(intervals, merged) -> float:
    """Length of ``intervals`` (each taken alone) that falls inside the merged ``merged``."""
    total = 0.0
    for a, b in intervals:
        for c, d in merged:
            if d <= a:
                continue
            if c >= b:
                break
            total += min(b, d) - max(a, c)
    return total


def _comm_terms(comm_iv: dict, merged_compute) -> tuple[dict, dict]:
    """({kind: microseconds}, {kind: microseconds under compute}) of each kind's ranges, taken as
    their union: asynchronous collectives queued together (a pipeline's sends and receives) run in
    overlapping ranges, whose durations summed would exceed the step."""
    coll, over = {}, {}
    for kind, ivs in comm_iv.items():
        merged = _union(ivs)
        coll[kind] = sum(b - a for a, b in merged)
        over[kind] = _covered(merged, merged_compute)
    return coll, over


def _clip(events, lo: float, hi: float):
    return [e for e in events if e["ts"] >= lo and e["ts"] + e["dur"] <= hi + 1e-3]


def _self_times(events) -> list[tuple[dict, list, int]]:
    """(event, self intervals, depth) for complete events of one thread: its interval less those of
    its direct children (events nested in time)."""
    out = []
    stack: list[list] = []      # [event, end, children intervals, depth]

    def close(done):
        e, end, kids, depth = done
        own, at = [], e["ts"]
        for a, b in kids:
            if a > at:
                own.append((at, a))
            at = max(at, b)
        if end > at:
            own.append((at, end))
        out.append((e, own, depth))
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while stack and stack[-1][1] <= e["ts"] + 1e-3:
            close(stack.pop())
        if stack:
            stack[-1][2].append((e["ts"], min(end, stack[-1][1])))
        stack.append([e, end, [], len(stack)])
    while stack:
        close(stack.pop())
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _read_json(path: str):
    """The JSON in ``path``, gunzipped first when it is gzip (``.json.gz``, as the TensorBoard plugin's
    ``tensorboard_trace_handler`` writes them)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as f:
        return json.load(f)


def load_events(path: str) -> list[dict]:
    """The complete events of a Chrome-trace JSON file (ConfigError naming the file otherwise)."""
    return _load(path)[0]


def _load(path: str) -> tuple[list[dict], int | None]:
    """(complete events, the rank its ``distributedInfo`` names or None) of a trace file."""
    if not os.path.isfile(path):
        raise ConfigError("trace", f"{path}: no such file", accepted="a PyTorch profiler trace (export_chrome_trace)")
    try:
        data = _read_json(path)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError("trace", f"{path}: not a JSON trace ({type(e).__name__}: {str(e)[:80]})",
                          accepted="a PyTorch profiler trace (export_chrome_trace)") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(events, list):
        raise ConfigError("trace", f"{path}: no traceEvents list", accepted="a Chrome-trace JSON file "
                          "({\"traceEvents\": [...]}, torch.profiler export_chrome_trace)")
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) \
                and isinstance(e.get("dur"), (int, float)) and isinstance(e.get("name"), str):
            out.append(e)
    if not any(e.get("cat") in ("cpu_op", "kernel") for e in out):
        raise ConfigError("trace", f"{path}: no operator or kernel events (cat cpu_op or kernel)",
                          accepted="a PyTorch profiler trace (export_chrome_trace)")
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    try:
        rank = int(info["rank"]) if isinstance(info, dict) and "rank" in info else None
    except (TypeError, ValueError):
        rank = None
    return out, rank


def _step_ranges(events) -> list[tuple[str, float, float, object]]:
    steps = [(e["name"], e["ts"], e["ts"] + e["dur"], e.get("tid")) for e in events if _STEP.match(e["name"])]
    if steps:
        return sorted(steps, key=lambda s: s[1])
    lo = min(e["ts"] for e in events)
    hi = max(e["ts"] + e["dur"] for e in events)
    main = max({e.get("tid") for e in events if e.get("cat") == "cpu_op"} or {None},
               key=lambda t: sum(e["dur"] for e in events if e.get("tid") == t and e.get("cat") == "cpu_op"))
    return [("whole trace", lo, hi, main)]


def _call_intervals(mine, backend: dict) -> list[tuple[str, float, float]]:
    """(kind, start, end) of each collective *call* on the step's thread: from the end of the last
    operator its caller ran before the ``c10d::`` op (the caller's start when none), through the op,
    to the start of the backend range it queued (``gloo:<op>`` on the run-loop thread, the first of
    its kind starting after the op and inside the caller) and, where the caller waits for that range
    to end, from its end to the caller's next operator (the caller's end when none). That is
    ``dist.all_reduce``'s own Python (argument checks, group lookup, the wait's return; 150-450 us
    per call in the harness's tp2 traces on the 2-core machine) and the hand-over to and from the
    backend's thread: time the collective's call costs, which a profile's collective timings include
    (they time ``dist.all_reduce`` whole), not compute's host time. ``backend``: {kind: [(start, end)]} of
    the backend ranges."""
    evs = sorted(mine, key=lambda e: (e["ts"], -e["dur"]))
    ev_starts = [e["ts"] for e in evs]
    queued = {kind: sorted(ivs) for kind, ivs in backend.items()}
    queued_starts = {k: [t for t, _ in ivs] for k, ivs in queued.items()}
    out = []
    stack: list[list] = []          # the enclosing operators: [start, end, end of its last child so far (its start)]
    for e in evs:
        a, b = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][1] <= a + 1e-3:
            stack.pop()
        parent = stack[-1] if stack and stack[-1][1] >= b - 1e-3 else None
        kind = collective_kind(e["name"]) if e["name"].startswith("c10d::") else None
        if kind is not None and parent is None:
            out.append((kind, a, b))
        elif kind is not None:
            begin, p_hi, end = parent[2], parent[1], b
            j = bisect_left(queued_starts.get(kind, []), a)
            if j < len(queued_starts.get(kind, [])) and queued[kind][j][0] <= p_hi:
                q_start, q_end = queued[kind][j]
                end = max(b, q_start)
                if q_end <= p_hi:       # waited for inside the caller: to its next operator
                    k = bisect_left(ev_starts, q_end)
                    end = min(ev_starts[k], p_hi) if k < len(evs) else p_hi
            out.append((kind, begin, end))
        if stack:
            stack[-1][2] = max(stack[-1][2], b)
        stack.append([a, b, a])
    return out


def _cpu_step(events, name, lo, hi, tid) -> StepTerms:
    inside = _clip(events, lo, hi)
    mine = [e for e in inside if e.get("tid") == tid and e.get("cat") in ("cpu_op", "user_annotation")
            and not _STEP.match(e["name"])]
    opt_ranges = _union((e["ts"], e["ts"] + e["dur"]) for e in mine if _OPTIMIZER.match(e["name"]))
    comm_ranges = [e for e in inside if _COMM_RANGE.match(e["name"])]
    if not comm_ranges:     # no backend ranges: the c10d ops on the step's thread
        comm_ranges = [e for e in mine if e["name"].startswith("c10d::")]
    comm_iv: dict = {}
    for e in comm_ranges:
        kind = collective_kind(e["name"])
        if kind is not None:
            comm_iv.setdefault(kind, []).append((e["ts"], e["ts"] + e["dur"]))
    for kind, a, b in _call_intervals(mine, comm_iv):
        comm_iv.setdefault(kind, []).append((a, b))
    comm_all = _union(iv for ivs in comm_iv.values() for iv in ivs)
    compute = dict.fromkeys(COMPUTE, 0.0)
    optimizer = 0.0
    kernel_iv = []
    for e, own, _depth in _self_times(mine):
        if e["name"].startswith("c10d::"):
            continue
        aten = e["name"].startswith("aten::")
        # a wrapper's own time while a collective runs (an autograd node or Python function blocked in
        # its wait) is waiting, not work; an ATen kernel's is work that overlaps the collective
        t = _length(own) - (0.0 if aten else _covered(own, comm_all))
        if any(a <= e["ts"] < b for a, b in opt_ranges):
            optimizer += t
            continue
        if e.get("cat") != "cpu_op":
            continue
        term = "gemm" if e["name"] in _GEMM_OPS else "attention" if _ATTENTION_OP.match(e["name"]) else \
            "memory" if aten else "host"
        compute[term] += t
        if aten:
            kernel_iv.extend(own)
    coll, over = _comm_terms(comm_iv, _union(kernel_iv))
    idle = (hi - lo) - sum(compute.values()) - optimizer
    us = 1e-6
    return StepTerms(name, (hi - lo) * us, {k: v * us for k, v in compute.items()}, optimizer * us,
                     {k: v * us for k, v in coll.items()}, {k: v * us for k, v in over.items()}, max(idle, 0.0) * us)


def _cuda_step(events, name, lo, hi) -> StepTerms:
    inside = _clip(events, lo, hi)
    gpu = [e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    opt_ranges = _union((e["ts"], e["ts"] + e["dur"]) for e in inside if _OPTIMIZER.match(e["name"]))
    # kernels launched inside an optimizer range: the CPU launch's correlation id
    opt_corr = {e.get("args", {}).get("correlation") for e in inside if e.get("cat") == "cuda_runtime"
                and any(a <= e["ts"] < b for a, b in opt_ranges)}
    opt_corr.discard(None)
    compute = dict.fromkeys(("gemm", "attention", "memory"), 0.0)
    optimizer = 0.0
    comm_iv: dict = {}
    compute_iv = []
    for e in gpu:
        nm = e["name"]
        iv = (e["ts"], e["ts"] + e["dur"])
        if "nccl" in nm.lower():
            kind = collective_kind(nm) or "all_reduce"
            comm_iv.setdefault(kind, []).append(iv)
            continue
        compute_iv.append(iv)
        if e.get("args", {}).get("correlation") in opt_corr:
            optimizer += e["dur"]
        elif e.get("cat") == "kernel" and _GEMM_KERNEL.search(nm) and not _ATTENTION_KERNEL.search(nm):
            compute["gemm"] += e["dur"]
        elif e.get("cat") == "kernel" and _ATTENTION_KERNEL.search(nm):
            compute["attention"] += e["dur"]
        else:
            compute["memory"] += e["dur"]
    coll, over = _comm_terms(comm_iv, _union(compute_iv))
    idle = (hi - lo) - sum(b - a for a, b in _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu]))
    us = 1e-6
    return StepTerms(name, (hi - lo) * us, {k: v * us for k, v in compute.items()}, optimizer * us,
                     {k: v * us for k, v in coll.items()}, {k: v * us for k, v in over.items()}, max(idle, 0.0) * us)


def read_trace(path: str) -> TraceSummary:
    """Measured seconds per term, per step, of one rank's profiler trace (module docstring)."""
    events, rank = _load(path)
    cuda = any(e.get("cat") == "kernel" for e in events)
    steps = []
    for name, lo, hi, tid in _step_ranges(events):
        steps.append(_cuda_step(events, name, lo, hi) if cuda else _cpu_step(events, name, lo, hi, tid))
    return TraceSummary(path=path, kind="cuda" if cuda else "cpu", rank=rank, steps=tuple(steps))


def compute_intervals(path: str) -> list[tuple[float, float]]:
    """The merged intervals (microseconds, the trace's clock) in which one rank's trace computes: ATen
    operators' self time on the step's thread (CPU), compute kernels (CUDA), over its first step."""
    events, _ = _load(path)
    name, lo, hi, tid = _step_ranges(events)[0]
    inside = _clip(events, lo, hi)
    if any(e.get("cat") == "kernel" for e in inside):
        return _union((e["ts"], e["ts"] + e["dur"]) for e in inside
                      if e.get("cat") == "kernel" and "nccl" not in e["name"].lower())
    mine = [e for e in inside if e.get("tid") == tid and e.get("cat") in ("cpu_op", "user_annotation")
            and not _STEP.match(e["name"])]
    return _union(iv for e, own, _ in _self_times(mine) if e["name"].startswith("aten::") for iv in own)


def compute_concurrency(paths: list[str]) -> list[float]:
    """Per rank, the share of its compute time during which another rank also computes: the ranks'
    traces of one machine share its clock. Ranks that share cores or a memory system slow each other
    down only while they compute together: ``paraplan profile`` measures that slowdown with every rank
    busy, which a data-parallel step keeps them (0.74-0.93 of their compute on the 2-core development
    machine) and a pipeline's does not (0.41-0.51: each stage waits on the other in the bubble)."""
    ivs = [compute_intervals(p) for p in paths]
    out = []
    for i, mine in enumerate(ivs):
        others = _union(iv for j, o in enumerate(ivs) if j != i for iv in o)
        total = _length(mine)
        out.append(_covered(mine, others) / total if total > 0 else 0.0)
    return out


def format_terms(summary: StepTerms, predicted: dict | None = None) -> str:
    """A fixed-width table of one step's measured terms (ms), with ``predicted`` seconds per term
    beside them where given (the same term names)."""
    predicted = predicted or {}
    rows = list(summary.terms().items()) + [(k, None) for k in predicted if k not in summary.terms()]
    lines = [f"{'term':<22} {'trace ms':>10} {'predicted ms':>13} {'overlapped':>11}"]
    for term, t in rows:
        kind = term.split(".", 1)[1] if term.startswith("comm.") else None
        over = "" if kind is None or not t else f"{100 * summary.overlapped_s.get(kind, 0.0) / t:.0f} %"
        p = predicted.get(term)
        lines.append(f"{term:<22} {'' if t is None else f'{1e3 * t:.2f}':>10} "
                     f"{'' if p is None else f'{1e3 * p:.2f}':>13} {over:>11}")
    lines.append(f"{'step span':<22} {1e3 * summary.span_s:>10.2f}")
    return "\n".join(lines) + "\n"
