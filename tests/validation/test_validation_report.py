"""``paraplan validate`` end to end (one real torchrun launch) and the report's contents."""
import json
import os
import statistics
import subprocess
import sys

import pytest

from paraplan.cli.validate import main
from paraplan.validation.compare import rel_err

REQUIRED = ("plan", "world_size", "backend", "measured", "predicted", "relative_error",
            "loss_matches_reference")


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    predicted = {"step_time_s": 0.1, "memory_bytes_per_rank": 2_000_000,
                 "time_breakdown_s": {"compute": 0.05, "tp_comm": 0.04, "optimizer": 0.01}}
    (out / "pred.json").write_text(json.dumps(predicted))
    rc = main(["validate", "--nproc-per-node", "2", "--tp", "2", "--sequence-parallel",
               "--micro-batch", "2", "--global-batch", "4", "--steps", "2", "--warmup", "1",
               "--layers", "2", "--predicted", str(out / "pred.json"), "--out", str(out)])
    return rc, out, predicted


@pytest.mark.slow
@pytest.mark.torch
def test_validate_writes_complete_report(validated):
    rc, out, predicted = validated
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    for k in REQUIRED:
        assert k in report, k
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    assert report["loss_matches_reference"] is True
    # the plan in the Plan's own fields, as the harness ran it (--sequence-parallel is --sp), the run apart
    assert (report["plan"]["sp"], report["plan"]["tp"], report["plan"]["dtype"]) == (True, 2, "fp32")
    assert report["run"]["global_batch"] == 4 and report["run"]["steps"] == 2
    for side in ("measured", "predicted"):
        for k in ("step_time_s", "memory_bytes_per_rank", "time_breakdown_s"):
            assert k in report[side]
    m = report["measured"]
    assert m["step_time_s"] > 0 and m["memory_bytes_per_rank"] > 0
    # the step time is the median of the slowest rank's timed steps, the mean kept beside it
    assert m["step_time_s"] == pytest.approx(statistics.median(m["step_times_s"]))
    assert m["step_time_mean_s"] == pytest.approx(statistics.mean(m["step_times_s"]))
    assert report["relative_error"]["step_time"] == pytest.approx(
        rel_err(predicted["step_time_s"], m["step_time_s"]))
    assert report["relative_error"]["memory"] == pytest.approx(
        rel_err(predicted["memory_bytes_per_rank"], m["memory_bytes_per_rank"]))
    assert (out / "breakdown.png").stat().st_size > 1000
    table = (out / "report.txt").read_text()
    assert "time.tp_comm" in table and "%" in table
    assert not list(out.glob(".tmp-*"))


@pytest.mark.torch
def test_bad_input_exits_2_with_one_line(capsys, tmp_path):
    rc = main(["validate", "--nproc-per-node", "2", "--tp", "3", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: ") and "Traceback" not in err


def _rank(rank, steps, breakdown=None):
    return {"rank": rank, "step_times_s": steps, "time_breakdown_s": breakdown or {"compute": 1.0},
            "memory_bytes": {"total": 10, "parameters": 10}}


def test_the_slowest_rank_is_the_one_with_the_slowest_median_step():
    from paraplan.validation.compare import summarize_measured
    # rank 0: one disturbed step (mean 4.0, median 1.0); rank 1: steadily 2.0
    m = summarize_measured([_rank(0, [1.0, 1.0, 10.0]), _rank(1, [2.0, 2.1, 1.9])])
    assert m["slowest_rank"] == 1 and m["step_time_s"] == pytest.approx(2.0)
    assert m["step_time_mean_s"] == pytest.approx(2.0)


PIN = """
import json, os, sys
from paraplan.validation.procs import pin_rank_to_cores
before = sorted(os.sched_getaffinity(0))
got = pin_rank_to_cores(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
print(json.dumps({"before": before, "got": got, "after": sorted(os.sched_getaffinity(0))}))
"""


def _pin(local_rank, local_world, threads, **env):
    out = subprocess.run([sys.executable, "-c", PIN, str(local_rank), str(local_world), str(threads)],
                         capture_output=True, text=True, check=True, env={**os.environ, **env})
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two usable cores")
def test_cpu_ranks_are_pinned_to_cores_of_their_own_when_there_are_enough():
    r = _pin(1, 2, 1)
    assert r["got"] == [r["before"][1]] and r["after"] == r["got"]          # rank 1 of 2: the second core
    n = len(r["before"])
    for args, env in (((0, n + 1, 1), {}),                     # more ranks than cores: left to the OS
                      ((0, 1, n + 1), {}),                     # more threads than cores
                      ((1, 2, 1), {"PARAPLAN_PIN_CORES": "0"})):   # switched off
        r = _pin(*args, **env)
        assert r["got"] is None and r["after"] == r["before"]


def test_a_ranks_abort_message_above_torchruns_summary_is_kept():
    from paraplan.validation.launch import _worker_tail
    summary = [f'  File "/x/torch/distributed/run.py", line {i}, in main' for i in range(30)]
    summary += ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                "  exitcode  : -6 (pid: 31309)  (SIGABRT)"]
    lines = ["starting", "terminate called after throwing an instance of 'gloo::IoException'",
             "  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer", *summary]
    tail = _worker_tail(lines)
    assert tail[:2] == lines[1:3] and tail[-1] == summary[-1] and len(tail) == 27
    # ranks that torchrun prefixed: one rank's own lines, as before
    assert _worker_tail(["[rank0]: a", "[rank1]: b", "[rank0]: c"]) == ["[rank0]: a", "[rank0]: c"]


@pytest.mark.torch
def test_a_collective_launch_that_dies_is_run_once_more_then_reported(monkeypatch, capsys):
    from paraplan.validation import profile
    from paraplan.validation.launch import WorkerFailed
    calls = []

    def launch(opts, module, args, log_path):      # stands in for torchrun: fails as often as told
        calls.append(opts.nproc_per_node)
        if len(calls) <= fails:
            raise WorkerFailed(1, ["torchrun"], "terminate called after throwing an instance of 'gloo::IoException'")
        with open(args[args.index("--out") + 1], "w") as f:
            json.dump([{"kind": "collective", "world_size": opts.nproc_per_node}], f)
    monkeypatch.setattr(profile, "run_torchrun", launch)
    opts = profile.ProfileOptions(world_sizes=(2,))
    fails = 1
    assert profile.collective_rows(opts) == [{"kind": "collective", "world_size": 2}] and calls == [2, 2]
    err = capsys.readouterr().err
    assert "benchmarks at 2 ranks failed" in err and "gloo::IoException" in err
    calls.clear()
    fails = 2
    with pytest.raises(WorkerFailed):
        profile.collective_rows(opts)
    assert calls == [2, 2]


def test_harness_other_time_counts_one_pass_per_copy_of_the_gradients():
    """Flattening reads and writes the gradients once; the 1/dp scaling once more with dp > 1;
    FSDP2 (ZeRO-3) does neither in the harness."""
    from paraplan.plan import Plan
    from paraplan.validation.predict import harness_other_time
    g, bw = 16e6, 32e9
    assert harness_other_time(Plan(tp=2, dp=1), g, bw) == pytest.approx(2 * g / bw)
    assert harness_other_time(Plan(dp=2, zero=1), g, bw) == pytest.approx(4 * g / bw)
    assert harness_other_time(Plan(dp=2, zero=3), g, bw) == 0.0
    # the sequence-parallel sync concatenates whole experts' gradients and copies them back: two passes
    s = 8e6
    assert harness_other_time(Plan(tp=2, dp=1, sp=True), g, bw, s) == pytest.approx(2 * g / bw + 4 * s / bw)
    assert harness_other_time(Plan(tp=2, dp=1), g, bw, s) == pytest.approx(2 * g / bw)   # no sp, no such sync
    assert harness_other_time(Plan(tp=2, dp=2, zero=3, sp=True), g, bw, s) == pytest.approx(4 * s / bw)


def test_an_fp32_estimate_states_fp32_assumptions():
    """validate's plans train in fp32: the estimate's first assumption says so, not 16-bit."""
    from paraplan.costmodels.estimate import assumptions_for
    from paraplan.plan import Plan
    fp32, bf16 = assumptions_for(Plan(dtype="fp32")), assumptions_for(Plan())
    assert fp32[0].startswith("fp32 weights") and bf16[0].startswith("16-bit weights")
    assert fp32[1:] == bf16[1:]


@pytest.mark.torch
def test_reference_check_holds_the_first_step_tighter_than_the_drifting_later_ones():
    """The first step (same parameters, only the order of sums differs) within LOSS_RTOL; later steps,
    whose trajectories AdamW's sign-like first update separates, within LATER_LOSS_RTOL; a run that
    is off by more, or one step short, does not match."""
    from paraplan.validation.reference import LATER_LOSS_RTOL, LOSS_RTOL, compare_to_reference
    ref = {"losses": [7.0, 6.9, 6.8]}

    def check(losses):
        return compare_to_reference([{"is_last_stage": True, "losses": losses}], ref)

    drifted = check([7.0 * (1 + 0.5 * LOSS_RTOL), 6.9 * (1 + 3 * LOSS_RTOL), 6.8 * (1 - 0.5 * LATER_LOSS_RTOL)])
    assert drifted["matches"] and drifted["first_loss_rel_err"] < LOSS_RTOL < drifted["loss_rel_err"]
    assert not check([7.0 * (1 + 2 * LOSS_RTOL), 6.9, 6.8])["matches"]
    assert not check([7.0, 6.9, 6.8 * (1 + 2 * LATER_LOSS_RTOL)])["matches"]
    assert not check([7.0, 6.9])["matches"]


@pytest.mark.torch
def test_later_steps_may_differ_by_the_references_own_spread_but_not_at_the_second_step():
    """Each later step's tolerance is the larger of LATER_LOSS_RTOL and SPREAD_FACTOR times the
    reference's own spread so far (a run from parameters nudged by one unit in the last place): a
    trajectory that rounding alone moves by 2e-4 by the fourth step may differ by 1e-3 there, while a
    wrong update at the second step (1e-3 off, where the spread is 1e-8) still fails."""
    from paraplan.validation.reference import LATER_LOSS_RTOL, SPREAD_FACTOR, compare_to_reference, later_step_tolerances
    ref = {"losses": [7.0, 6.9, 6.8, 6.7]}
    spread = [0.0, 1e-8, 3e-5, 2e-4]
    assert later_step_tolerances(spread, 4)[1:] == pytest.approx([LATER_LOSS_RTOL, SPREAD_FACTOR * 3e-5, SPREAD_FACTOR * 2e-4])
    assert later_step_tolerances(None, 4)[1:] == [LATER_LOSS_RTOL] * 3

    def check(losses, spread=spread):
        return compare_to_reference([{"is_last_stage": True, "losses": losses}], ref, spread=spread)

    drifted = check([7.0, 6.9, 6.8, 6.7 * (1 + 1e-3)])
    assert drifted["matches"] and drifted["worst_step"] == 4
    assert not check([7.0, 6.9, 6.8, 6.7 * (1 + 1e-3)], spread=None)["matches"]
    assert not check([7.0, 6.9 * (1 + 1e-3), 6.8, 6.7])["matches"]


@pytest.mark.torch
def test_the_nudged_reference_starts_one_ulp_away_and_drifts_by_rounding_only():
    """reference_spread reruns the reference from parameters each one unit in the last place away: the
    first step's loss within 1e-6 of the reference's, and the spread stays far below a wrong update's."""
    from paraplan.plan import Plan
    from paraplan.validation.config import RunOptions
    from paraplan.validation.model import GPTConfig
    from paraplan.validation.reference import reference_run, reference_spread
    cfg = GPTConfig(vocab_size=256, seq_len=32, hidden=64, heads=4, layers=2, seed=3)
    plan, options = Plan(dp=1, micro_batch=1), RunOptions(global_batch=2, steps=4, warmup=1, profile_ops=False)
    ref = reference_run(cfg, plan, options)
    spread = reference_spread(cfg, plan, options, ref)
    assert len(spread) == len(ref["losses"]) == 5
    assert spread[0] < 1e-6 and max(spread) < 1e-4


@pytest.mark.torch
def test_the_spread_includes_the_reference_split_into_other_micro_batches():
    """reference_spread also reruns the reference with the global batch in other micro-batches (the
    gradient sums in another order, as a parallel layout has them): its spread is at least that run's
    difference at every step, and a single-sample batch has no other split."""
    from paraplan.plan import Plan
    from paraplan.validation.config import RunOptions
    from paraplan.validation.model import GPTConfig
    from paraplan.validation.reference import reference_run, reference_spread, resplit_micro_batch
    cfg = GPTConfig(vocab_size=256, seq_len=32, hidden=64, heads=4, layers=2, seed=3, experts=4, top_k=1)
    plan, options = Plan(dp=1, micro_batch=1), RunOptions(global_batch=4, steps=2, warmup=1, profile_ops=False)
    assert (resplit_micro_batch(plan, options), resplit_micro_batch(Plan(dp=1, micro_batch=4), options)) == (4, 1)
    assert resplit_micro_batch(plan, RunOptions(global_batch=1)) is None
    ref = reference_run(cfg, plan, options)
    other = reference_run(cfg, Plan(dp=1, micro_batch=4), options, dump_grads=False)["losses"]
    spread = reference_spread(cfg, plan, options, ref)
    assert all(s >= abs(o - r) / abs(r) for s, o, r in zip(spread, other, ref["losses"]))
