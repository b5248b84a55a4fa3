"""A :class:`~paraplan.reports.timeline.Timeline` as a Chrome trace: the JSON Trace Event Format that
chrome://tracing and Perfetto's UI (ui.perfetto.dev) open and the PyTorch profiler writes
(``torch.profiler.profile.export_chrome_trace``), so a predicted step opens in the same viewer as a
measured one.

The format (Trace Event Format, Google, docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAN1E):
an object ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``; each slice a complete
event ``{"ph": "X", "name", "cat", "pid", "tid", "ts", "dur", "args"}`` with ``ts`` and ``dur`` in
microseconds; metadata events ``{"ph": "M", "name": "process_name" | "thread_name" |
"process_sort_index" | "thread_sort_index", "pid", "tid", "args": {"name" | "sort_index": ...}}`` name
and order the tracks. Here a process (pid) is a pipeline rank and a thread (tid) one of its tracks
(``timeline.TRACKS``): compute, then one per communication kind.
"""
from __future__ import annotations

import json

from paraplan.reports.timeline import TRACKS, Timeline

SCHEMA = "paraplan.timeline/1"
#: tid of each track: its place in TRACKS, from 1 (Perfetto shows tid 0 as the process's main thread)
TRACK_TID = {key: i + 1 for i, (key, _) in enumerate(TRACKS)}
#: digits kept after the microsecond's point: nanoseconds, far below any slice the cost model predicts
US_DIGITS = 3


def _us(seconds: float) -> float:
    return round(seconds * 1e6, US_DIGITS)


def _track_name(timeline: Timeline, key: str, name: str) -> str:
    return timeline.dp_track_name if key == "dp" else name


def trace_events(timeline: Timeline) -> list[dict]:
    """The metadata events (a process per pipeline rank, a thread per track it uses, in TRACKS order), then
    one complete event per slice. A slice's ``args`` carry ``exposed_s`` (its seconds on the critical path)
    and what the estimate knows of it."""
    used = {(s.rank, s.track) for s in timeline.slices}
    events: list[dict] = []
    for r in range(timeline.ranks):
        label = f"pipeline rank {r}" + ("" if timeline.ranks == 1 else " (sets the pace: the estimate's terms)"
                                        if r == timeline.pace_rank else " (laid out with the pace rank's times)")
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for key, name in TRACKS:
            if (r, key) in used:
                tid = TRACK_TID[key]
                events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                               "args": {"name": _track_name(timeline, key, name)}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid,
                               "args": {"sort_index": tid}})
    for s in timeline.slices:
        dur = _us(s.dur_s)
        if dur <= 0:
            continue
        events.append({"ph": "X", "name": s.name, "cat": s.category, "pid": s.rank, "tid": TRACK_TID[s.track],
                       "ts": _us(s.start_s), "dur": dur, "args": dict(s.args)})
    return events


def chrome_trace(timeline: Timeline, estimate=None) -> dict:
    """The whole trace document; ``otherData`` names the plan, the step time, the estimate's breakdown (when
    given ``estimate``) and the notes on what the layout splits or aggregates."""
    other = {"schema": SCHEMA, "title": f"{timeline.title}: {timeline.plan_line}", "step_time_s": timeline.step_time_s,
             "schedule": timeline.schedule, "pipeline_ranks": timeline.ranks, "pace_rank": timeline.pace_rank,
             "micro_batches": timeline.micro_batches,
             "micro_batch_group": timeline.micro_batch_group, "chunks_per_rank": timeline.chunks_per_rank,
             "notes": list(timeline.notes)}
    if estimate is not None:
        other["plan"] = estimate.plan.to_dict()
        other["time_breakdown_s"] = dict(estimate.time_breakdown_s)
        other["model"], other["cluster"], other["num_gpus"] = estimate.model, estimate.cluster, estimate.num_gpus
    return {"traceEvents": trace_events(timeline), "displayTimeUnit": "ms", "otherData": other}


def chrome_trace_json(timeline: Timeline, estimate=None) -> str:
    """:func:`chrome_trace` as compact JSON text (one line: a 512-micro-batch step stays a few MB)."""
    return json.dumps(chrome_trace(timeline, estimate), separators=(",", ":"), allow_nan=False)


def write_trace(path, estimate) -> int:
    """Lay out ``estimate`` (:func:`paraplan.reports.timeline.build_timeline`) and write its Chrome trace to
    ``path`` whole or not at all (``paraplan.io.write_atomic``); returns the number of events."""
    from paraplan.io import write_atomic
    from paraplan.reports.timeline import build_timeline
    doc = chrome_trace(build_timeline(estimate), estimate)
    write_atomic(path, json.dumps(doc, separators=(",", ":"), allow_nan=False))
    return len(doc["traceEvents"])


def wrote_trace_line(path, events: int) -> str:
    """What the commands say on stderr after writing a trace."""
    return (f"wrote {path}: the predicted step as a Chrome trace ({events:,} events); open it in ui.perfetto.dev "
            "or chrome://tracing, beside a torch.profiler trace")
