"""The calibration round trip on this machine: `paraplan validate` runs three layouts of a tiny GPT on two
gloo ranks with the profiler on -> their traces and reports are read -> `paraplan calibrate` fits a
profile, leave-one-run-out -> the layouts re-predicted, and the stored profile estimates.

The layouts run in turn, twice (a layout's repeats pooled), so that load from other processes on a
shared machine falls on all of them alike. Here the checks are that every piece ran on the real
thing, that the fitted factors bring each layout's prediction closer, and that leave-one-run-out
predicts each layout on the others' factors. Whether each left-out layout improves is the
benchmark's (benchmarks/calibrate_round_trip.py: the default model, three rounds; docs/calibrate.md):
with this tiny model on a loaded 2-core machine the steps are rank skew and per-call latency more
than work, and the layouts disagree in them (one run here: dp2 -22 -> -21 %, tp2 +29 -> +45 %,
pp2 -9 -> +21 %).
"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LAYOUTS = {"dp2": ["--dp", "2"], "tp2": ["--tp", "2"], "pp2": ["--pp", "2"]}
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
    assert [r.name for r in pooled] == ["dp2", "tp2", "pp2"] and all(r.repeats == 2 for r in pooled)
    assert all(len(r.traces) == 4 and r.trace_shares()["gemm"] > 0 for r in pooled)
    tables = base_tables("local", db)[0]
    cal = calibrate(pooled, tables)
    assert {"gemm", "optimizer", "all_reduce.latency", "send_recv.latency"} <= set(cal.fit.factors)
    assert "attention" in cal.fit.unconstrained and "all_to_all.latency" in cal.fit.unconstrained
    # the factors reach the estimator: fitted on all three, every layout's step is closer than before
    for r in pooled:
        m = r.measured_step_s
        before = abs(predict(r, tables)["step_time_s"] / m - 1)
        after = abs(predict(r, tables, cal.fit.factors)["step_time_s"] / m - 1)
        assert after < before, (r.name, before, after)
    # leave-one-run-out: every layout predicted on the others' factors; pp2 is the only one with a
    # send/recv, so the fold that leaves it out cannot fit it
    assert [x["run"] for x in cal.loro] == ["dp2", "tp2", "pp2"]
    assert all(x["after_s"] > 0 and x["after_s"] != x["before_s"] for x in cal.loro)
    assert "send_recv.latency" in cal.loro[2]["unfitted"]
    print(loro_table(cal))
    r = paraplan("calibrate", *dirs, "--db", db, "--name", "rt", env=env)
    assert r.returncode == 0, r.stderr
    assert "leave" not in r.stderr and "stored as profile:rt" in r.stderr
    assert "not fitted" in r.stdout and "err after" in r.stdout
    est = paraplan("estimate", "--model", "llama3-8b", "--cluster", "profile:rt", "--gpus", "2", "--seq-len", "256",
                   "--global-batch", "2", "--micro-batch", "1", "--dp", "2", "--db", db, env=env)
    assert est.returncode == 0, est.stderr
