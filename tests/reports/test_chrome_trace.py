"""The timeline as a Chrome trace (issue 65): every event checked against the Trace Event Format's shape
written as a JSON schema, the trace read back by a real trace parser (Holistic Trace Analysis, which reads
PyTorch profiler traces; skipped where it is not installed, except under PARAPLAN_REQUIRE_TRACE_PARSER=1, which
.ci/run sets), and the size of a 512-micro-batch step."""
from __future__ import annotations

import json
import os
from collections import defaultdict

import jsonschema
import pytest

from paraplan.costmodels.estimate import TIME_TERMS, estimate
from paraplan.plan import Plan
from paraplan.reports.chrome_trace import TRACK_TID, chrome_trace, chrome_trace_json, write_trace
from paraplan.reports.timeline import build_timeline
from paraplan.scenario import load_scenario

# The Trace Event Format (Google; the format chrome://tracing and ui.perfetto.dev open, and
# torch.profiler's export_chrome_trace writes): complete events ("X") with ts and dur in microseconds and
# metadata events ("M") naming and ordering processes and threads.
COMPLETE_EVENT = {
    "type": "object",
    "required": ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args"],
    "additionalProperties": False,
    "properties": {
        "ph": {"const": "X"},
        "name": {"type": "string", "minLength": 1},
        "cat": {"enum": list(TIME_TERMS)},
        "pid": {"type": "integer", "minimum": 0},
        "tid": {"type": "integer", "minimum": 1},
        "ts": {"type": "number", "minimum": 0},
        "dur": {"type": "number", "exclusiveMinimum": 0},
        "args": {"type": "object", "required": ["exposed_s"],
                 "properties": {"exposed_s": {"type": "number", "minimum": 0}}},
    },
}
METADATA_EVENT = {
    "type": "object",
    "required": ["ph", "name", "pid", "tid", "args"],
    "additionalProperties": False,
    "properties": {
        "ph": {"const": "M"},
        "pid": {"type": "integer", "minimum": 0},
        "tid": {"type": "integer", "minimum": 0},
        "name": {"type": "string"},
        "args": {"type": "object"},
    },
    "oneOf": [
        {"properties": {"name": {"enum": ["process_name", "thread_name"]},
                        "args": {"type": "object", "required": ["name"], "additionalProperties": False,
                                 "properties": {"name": {"type": "string", "minLength": 1}}}}},
        {"properties": {"name": {"enum": ["process_sort_index", "thread_sort_index"]},
                        "args": {"type": "object", "required": ["sort_index"], "additionalProperties": False,
                                 "properties": {"sort_index": {"type": "integer"}}}}},
    ],
}
TRACE = {
    "type": "object",
    "required": ["traceEvents", "displayTimeUnit"],
    "properties": {
        "traceEvents": {"type": "array", "minItems": 1, "items": {"oneOf": [COMPLETE_EVENT, METADATA_EVENT]}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object", "required": ["step_time_s", "notes"]},
    },
}

SCENARIO = load_scenario("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=32)
PLANS = [dict(tp=2, pp=4), dict(tp=2, pp=4, vpp=2, schedule="interleaved"), dict(tp=2, pp=4, schedule="zbv"),
         dict(tp=2, pp=4, schedule="dualpipe"), dict(tp=8, zero=1)]


def _estimate(scenario=SCENARIO, **plan):
    plan = Plan(**plan)
    return estimate(scenario.model, scenario.job(plan), scenario.cluster, plan)


@pytest.mark.parametrize("kw", PLANS, ids=lambda kw: kw.get("schedule", f"pp{kw.get('pp', 1)}"))
def test_every_event_has_the_trace_event_formats_shape(kw):
    e = _estimate(**kw)
    doc = json.loads(chrome_trace_json(build_timeline(e), e))
    jsonschema.validate(doc, TRACE)
    named_threads = {(ev["pid"], ev["tid"]) for ev in doc["traceEvents"] if ev["name"] == "thread_name"}
    named_processes = {ev["pid"] for ev in doc["traceEvents"] if ev["name"] == "process_name"}
    complete = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    for ev in complete:
        assert (ev["pid"], ev["tid"]) in named_threads and ev["pid"] in named_processes
        assert ev["args"]["exposed_s"] * 1e6 <= ev["dur"] + 1e-3
    end = max(ev["ts"] + ev["dur"] for ev in complete)
    assert end == pytest.approx(e.step_time_s * 1e6, abs=1e-2)
    assert doc["otherData"]["time_breakdown_s"] == dict(e.time_breakdown_s)


def test_the_schema_refuses_what_a_viewer_cannot_read():
    """The schema is a real check: a complete event without dur, with ts in a string, or an unknown phase
    fails it."""
    e = _estimate(tp=2, pp=4)
    doc = chrome_trace(build_timeline(e), e)
    x = next(ev for ev in doc["traceEvents"] if ev["ph"] == "X")
    for bad in ({k: v for k, v in x.items() if k != "dur"}, {**x, "ts": str(x["ts"])}, {**x, "ph": "Q"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"traceEvents": [bad], "displayTimeUnit": "ms"}, TRACE)


@pytest.mark.filterwarnings("ignore:The inplace keyword")     # HTA 0.5's own pandas calls
def test_a_trace_parser_reads_it_back(tmp_path):
    """Holistic Trace Analysis (the PyTorch profiler trace reader) parses the file into one row per complete
    event, with our names, tracks and durations (it rounds each start up and each end down to the
    microsecond)."""
    try:
        import hta.common.trace as hta_trace
    except ImportError:
        why = "HolisticTraceAnalysis (in the test extra) is not installed: pip install -e '.[test]'"
        if os.environ.get("PARAPLAN_REQUIRE_TRACE_PARSER") == "1":
            pytest.fail(why + " (PARAPLAN_REQUIRE_TRACE_PARSER=1 is set, as in .ci/run)")
        pytest.skip(why)
    e = _estimate(tp=2, pp=4, vpp=2, schedule="interleaved")
    (tmp_path / "trace").mkdir()
    write_trace(tmp_path / "trace" / "predicted.json", e)
    doc = json.loads((tmp_path / "trace" / "predicted.json").read_text())
    complete = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    t = hta_trace.Trace(trace_dir=str(tmp_path / "trace"))
    t.parse_traces()
    df = t.get_trace(0)
    symbols = t.symbol_table.get_sym_table()
    assert len(df) == len(complete)
    assert sorted(symbols[i] for i in df["name"]) == sorted(ev["name"] for ev in complete)
    assert {symbols[i] for i in df["cat"]} == {ev["cat"] for ev in complete}
    ours, count = defaultdict(float), defaultdict(int)
    for ev in complete:
        ours[(ev["pid"], ev["tid"])] += ev["dur"]
        count[(ev["pid"], ev["tid"])] += 1
    for (pid, tid), dur in df.groupby(["pid", "tid"])["dur"].sum().items():
        assert dur == pytest.approx(ours[(pid, tid)], abs=2 * count[(pid, tid)] + 1)
    assert set(df["tid"]) <= set(TRACK_TID.values())


def test_512_micro_batches_are_all_drawn_in_a_few_megabytes():
    """llama3-70b on 64 GPUs, tp 8 × pp 8, global batch 512 at dp 1: 512 micro-batches on 8 ranks, every one
    drawn (no grouping), the file under 6 MB."""
    sc = load_scenario("llama3-70b", "dgx-h100", gpus=64, seq_len=4096, global_batch=512)
    e = _estimate(sc, tp=8, pp=8)
    assert e.details["micro_batches_per_step"] == 512
    tl = build_timeline(e)
    text = chrome_trace_json(tl, e)
    assert tl.micro_batch_group == 1
    assert {f"B{i}" for i in range(512)} <= {s.name for s in tl.slices if s.rank == tl.pace_rank}
    assert len(text.encode()) < 6e6
