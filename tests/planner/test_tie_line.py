"""The why-line of a tie names what the step time does not show: GPU memory held, host memory used."""
from __future__ import annotations

from dataclasses import replace

from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner.search import what_step_time_does_not_show, why_best_beats_runner_up
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL, JOB, CLUSTER = load_model("llama3-70b"), TrainingJob(8192, 512), load_cluster("dgx-h100", 64)
BASE = Plan(tp=2, pp=4, dp=2, cp=4, sp=True, micro_batch=1, schedule="zb-h1", zero=1, cp_mode="ulysses")


def test_offload_and_memory_are_named_on_a_tie():
    offloaded = estimate(MODEL, JOB, CLUSTER, replace(BASE, offload="cpu"))
    kept = estimate(MODEL, JOB, CLUSTER, BASE)
    assert offloaded.host_memory_bytes_per_node > 2 ** 30 and kept.host_memory_bytes_per_node < 2 ** 30
    notes = what_step_time_does_not_show(offloaded, kept)
    assert "the runner-up offloads nothing to host memory" in notes
    gib = (kept.memory_bytes_per_gpu["total"] - offloaded.memory_bytes_per_gpu["total"]) / 2 ** 30
    assert any(f"the best holds {gib:.1f} GiB less per GPU" in n for n in notes)
    # the sides swap with the plans
    assert "the best offloads nothing to host memory" in what_step_time_does_not_show(kept, offloaded)


def test_a_plan_against_itself_shows_nothing_and_a_clear_win_says_no_tie():
    e = estimate(MODEL, JOB, CLUSTER, BASE)
    assert what_step_time_does_not_show(e, e) == []
    slow = estimate(MODEL, JOB, CLUSTER, replace(BASE, recompute="full"))
    line = why_best_beats_runner_up(e, slow)
    assert "tie" not in line and "recompute: none vs full" in line
