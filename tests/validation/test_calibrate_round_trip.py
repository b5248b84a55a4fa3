"""The calibration round trip on this machine: `paraplan validate` runs five layouts of a tiny GPT on two
gloo ranks with the profiler on (dp2, tp2, pp2, and tp2 and pp2 over other micro-batch counts) -> their
traces and reports are read -> `paraplan calibrate` fits a profile, leave-one-run-out -> the layouts
re-predicted, and the stored profile estimates.

The layouts run in turn, twice (a layout's repeats pooled), so that load from other processes on a
shared machine falls on all of them alike. Here the checks are that every piece ran on the real
thing, that the fitted factors bring the layouts closer together, and that leave-one-run-out
predicts each layout on the others' factors with its collectives fitted (the second tp2 and pp2
constrain the all-reduce latency and the send/recv of the fold that leaves the first out). Whether
each left-out layout improves is the benchmark's (benchmarks/calibrate_round_trip.py: the default
model, three rounds; docs/calibrate.md): with this tiny model on a loaded 2-core machine the steps
are rank skew and per-call latency more than work, and the layouts disagree in them (one run with
three layouts: dp2 -22 -> -21 %, tp2 +29 -> +45 %, pp2 -9 -> +21 %); even on the default model a
left-out tp2 over two micro-batches did not improve in every session (its all-reduces cost 15 % less
per call than tp2's in one session, 18 % more in the next: gloo's per-call latency under load).
"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]

# the benchmark's five: tp2 and pp2 again over other micro-batch counts, so that a left-out layout's
# collectives (tp2's latency-bound all-reduces, pp2's send/recv) are constrained by the others
LAYOUTS = {"dp2": ["--dp", "2"], "tp2": ["--tp", "2"], "pp2": ["--pp", "2"],
           "tp2-gb2": ["--tp", "2", "--global-batch", "2"], "pp2-gb4": ["--pp", "2", "--global-batch", "4"]}
MODEL = ["--layers", "2", "--hidden", "128", "--heads", "2", "--seq-len", "128", "--vocab", "256"]


def paraplan(*args, env):
    return subprocess.run([sys.executable, "-m", "paraplan.cli", *args], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from paraplan.validation.predict import ensure_profile
    base = tmp_path_factory.mktemp("round_trip")
    db = str(base / "profiles.sqlite")
    env = dict(os.environ, PARAPLAN_PROFILE_DB=db)
    os.environ["PARAPLAN_PROFILE_DB"] = db
    ensure_profile(db, 2)
    dirs = []
    for k in range(2):
        for name, flags in LAYOUTS.items():
            out = str(base / f"r{k}" / name)
            r = paraplan("validate", *flags, *MODEL, "--steps", "4", "--warmup", "1", "--no-reference",
                         "--db", db, "--out", out, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
            dirs.append(out)
    yield db, env, dirs
    os.environ.pop("PARAPLAN_PROFILE_DB", None)


def test_validate_keeps_each_ranks_trace_and_the_report_names_them(runs):
    _, _, dirs = runs
    for d in dirs:
        rep = json.load(open(os.path.join(d, "report.json")))
        assert rep["traces"] == ["traces/trace_rank0.json", "traces/trace_rank1.json"]
        for t in rep["traces"]:
            assert os.path.getsize(os.path.join(d, t)) > 1000
        assert not [n for n in os.listdir(d) if n.startswith(".validate-")]


def test_calibrate_round_trip_improves_leave_one_run_out_and_stores_a_usable_profile(runs):
    from paraplan.validation.calibrate import base_tables, calibrate, loro_table, pool_runs, predict, read_run
    db, env, dirs = runs
    pooled = pool_runs([read_run(d) for d in dirs])
    assert [r.name for r in pooled] == list(LAYOUTS) and all(r.repeats == 2 for r in pooled)
    assert all(len(r.traces) == 4 and r.trace_shares()["gemm"] > 0 for r in pooled)
    tables = base_tables("local", db)[0]
    cal = calibrate(pooled, tables)
    assert {"gemm", "optimizer", "all_reduce.latency", "send_recv.latency"} <= set(cal.fit.factors)
    assert "attention" in cal.fit.unconstrained and "all_to_all.latency" in cal.fit.unconstrained
    # the factors reach the estimator: fitted on all five, the layouts' errors shrink together. Not each
    # one: least squares over five layouts that disagree (here in per-call latency) may move one that
    # was close further off (seen: pp2 0.7 -> 0.9 %, tp2-gb2 3.2 -> 9.1 %, while the others shrank)
    errs = [(abs(predict(r, tables)["step_time_s"] / r.measured_step_s - 1),
             abs(predict(r, tables, cal.fit.factors)["step_time_s"] / r.measured_step_s - 1)) for r in pooled]
    assert sum(a * a for _, a in errs) < sum(b * b for b, _ in errs), errs
    assert max(a for _, a in errs) < max(b for b, _ in errs), errs
    # leave-one-run-out: every layout predicted on the others' factors; with pp2 over two numbers of
    # micro-batches the fold that leaves one out still fits the send/recv, and tp2's all-reduce latency
    assert [x["run"] for x in cal.loro] == list(LAYOUTS)
    assert all(x["after_s"] > 0 and x["after_s"] != x["before_s"] for x in cal.loro)
    assert all("send_recv.latency" not in x["unfitted"] and "all_reduce.latency" not in x["unfitted"]
               for x in cal.loro), [x["unfitted"] for x in cal.loro]
    print(loro_table(cal))
    r = paraplan("calibrate", *dirs, "--db", db, "--name", "rt", env=env)
    assert r.returncode == 0, r.stderr
    assert "leave" not in r.stderr and "stored as profile:rt" in r.stderr
    assert "not fitted" in r.stdout and "err after" in r.stdout
    est = paraplan("estimate", "--model", "llama3-8b", "--cluster", "profile:rt", "--gpus", "2", "--seq-len", "256",
                   "--global-batch", "2", "--micro-batch", "1", "--dp", "2", "--db", db, env=env)
    assert est.returncode == 0, est.stderr
