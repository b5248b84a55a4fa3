"""The profiler-trace reader (paraplan.validation.trace): real CPU traces `paraplan validate` wrote on
this machine (tests/data/traces/, gzipped), a CUDA-shaped trace built here, and bad input."""
import gzip
import json
import os

import pytest

from paraplan.errors import ConfigError
from paraplan.validation.trace import collective_kind, format_terms, read_trace

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "traces")


def fixture(layout: str, rank: int = 0) -> str:
    return os.path.join(DATA, layout, "traces", f"trace_rank{rank}.json.gz")


@pytest.mark.parametrize("layout,kind", [("dp2", "all_reduce"), ("tp2", "all_reduce"), ("pp2", "send_recv")])
def test_cpu_trace_of_validate_has_its_step_compute_and_collective(layout, kind):
    s = read_trace(fixture(layout))
    assert s.kind == "cpu" and s.rank == 0
    assert len(s.steps) == 1 and s.steps[0].step.startswith("ProfilerStep#")
    step = s.steps[0]
    assert step.compute_s["gemm"] > 0 and step.compute_s["memory"] > 0 and step.compute_s["attention"] == 0
    assert step.optimizer_s > 0
    assert step.collectives_s.get(kind, 0) > 0
    assert 0 <= step.overlapped_s[kind] <= step.collectives_s[kind] + 1e-12
    # self times on one thread never exceed the step; the collectives (another thread, their union) neither
    busy = sum(step.compute_s.values()) + step.optimizer_s + step.idle_s
    assert busy == pytest.approx(step.span_s, rel=1e-6)
    assert all(v <= step.span_s for v in step.collectives_s.values())


def test_pipeline_trace_has_no_all_reduce_of_gradients_and_dp_has_no_send():
    assert "send_recv" not in read_trace(fixture("dp2")).steps[0].collectives_s
    assert "send_recv" not in read_trace(fixture("tp2")).steps[0].collectives_s


def _cuda_trace(tmp_path, gz=False):
    """A trace in Kineto's CUDA shape: kernels on a stream (pid = device, tid = stream), two steps."""
    ev = []
    for step, t0 in ((0, 0.0), (1, 1000.0)):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": 1000.0})
        ev += [{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, "tid": 7,
                "ts": t0 + 10, "dur": 300.0},
               {"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<...>", "pid": 0, "tid": 7,
                "ts": t0 + 320, "dur": 100.0},
               {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "pid": 0,
                "tid": 7, "ts": t0 + 430, "dur": 50.0},
               # an all-reduce on its own stream, half of it under the GEMM
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)",
                "pid": 0, "tid": 13, "ts": t0 + 160, "dur": 300.0},
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgs)", "pid": 0,
                "tid": 13, "ts": t0 + 600, "dur": 100.0},
               {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 1, "dur": 5.0}]
    path = tmp_path / ("cuda.json.gz" if gz else "cuda.json")
    data = json.dumps({"traceEvents": ev, "distributedInfo": {"rank": 3}})
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(data)
    else:
        path.write_text(data)
    return str(path)


@pytest.mark.parametrize("gz", [False, True])
def test_cuda_trace_kernels_by_term_overlap_and_idle(tmp_path, gz):
    s = read_trace(_cuda_trace(tmp_path, gz))
    assert s.kind == "cuda" and s.rank == 3 and len(s.steps) == 2
    m = s.mean()
    assert m.compute_s == pytest.approx({"gemm": 300e-6, "attention": 100e-6, "memory": 50e-6})
    assert m.collectives_s == pytest.approx({"all_reduce": 300e-6, "send_recv": 100e-6})
    # 160..460 against compute 10..310, 320..420, 430..480: 150 + 100 + 30 us under compute
    assert m.overlapped_s["all_reduce"] == pytest.approx(280e-6)
    assert m.overlapped_s["send_recv"] == 0
    # busy on the device: 10..480 and 600..700 -> 570 of 1000 us
    assert m.idle_s == pytest.approx(430e-6)
    table = format_terms(m, {"gemm": 250e-6})
    assert "comm.all_reduce" in table and "93 %" in table and "0.25" in table


@pytest.mark.parametrize("name,kind", [("gloo:all_reduce", "all_reduce"), ("nccl:_reduce_scatter_base", "reduce_scatter"),
                                       ("ncclDevKernel_AllGather_RING_LL", "all_gather"), ("gloo:all_to_all", "all_to_all"),
                                       ("gloo:recv", "send_recv"), ("nccl:broadcast", "broadcast"), ("aten::mm", None)])
def test_collective_kind_from_names(name, kind):
    assert collective_kind(name) == kind


def test_bad_traces_are_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        read_trace(str(tmp_path / "missing.json"))
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(ConfigError, match="not a JSON trace"):
        read_trace(str(tmp_path / "text.json"))
    (tmp_path / "other.json").write_text(json.dumps({"events": []}))
    with pytest.raises(ConfigError, match="no traceEvents"):
        read_trace(str(tmp_path / "other.json"))
    (tmp_path / "chrome.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "frame", "cat": "blink", "ts": 0, "dur": 5}]}))
    with pytest.raises(ConfigError, match="no operator or kernel events"):
        read_trace(str(tmp_path / "chrome.json"))


def test_compute_concurrency_of_ranks_on_one_clock():
    from paraplan.validation.trace import compute_concurrency
    share = {lay: compute_concurrency([fixture(lay, 0), fixture(lay, 1)]) for lay in ("dp2", "pp2")}
    assert all(0 <= c <= 1 for cs in share.values() for c in cs)
    # a pipeline's stages compute together less than data-parallel replicas do
    assert max(share["pp2"]) < max(share["dp2"])
    # against itself a rank computes together all the time
    assert compute_concurrency([fixture("dp2"), fixture("dp2")]) == pytest.approx([1.0, 1.0])


def test_a_collective_calls_own_host_time_is_the_collectives_not_compute_host(tmp_path):
    """A tensor-parallel wrapper (an autograd Function) clones its input, calls dist.all_reduce (Python,
    then the c10d op that queues gloo's range on its run-loop thread), waits, and returns: the Python
    before the op and after the wait is the call's, as a profile that times dist.all_reduce whole counts
    it; the wrapper's own time before its first operator stays host."""
    main, loop = 1, 2
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": main, "ts": 0, "dur": 2000},
          {"ph": "X", "cat": "cpu_op", "name": "_ReduceFromTP", "pid": 1, "tid": main, "ts": 100, "dur": 1000},
          {"ph": "X", "cat": "cpu_op", "name": "aten::clone", "pid": 1, "tid": main, "ts": 110, "dur": 50},
          {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": main, "ts": 400, "dur": 40},
          {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": loop, "ts": 460, "dur": 500},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": main, "ts": 1200, "dur": 300}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    step = read_trace(str(path)).steps[0]
    # the call: from the clone's end (160) to the wrapper's end (1100), the gloo range inside it
    assert step.collectives_s["all_reduce"] == pytest.approx(940e-6)
    # host: the wrapper's 10 us before its clone, nothing of the 240 us of Python before the op
    assert step.compute_s["host"] == pytest.approx(10e-6)
    assert step.compute_s["gemm"] == pytest.approx(300e-6) and step.compute_s["memory"] == pytest.approx(50e-6)
