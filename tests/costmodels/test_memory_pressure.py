"""A ZeRO-3 / FSDP plan whose peak sits within 2 GiB of the GPU's memory is flagged (the caching
allocator's retries are not priced); plans with room, and engines that do not free gathered parameters
every layer, are not."""
from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.calibration import load_cases, short_source
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import (ALLOCATOR_PRESSURE_HEADROOM_BYTES, churns_allocator, churns_allocator_where,
                                        planner_memory_limit)
from paraplan.plan import Plan
from paraplan.scenario import DEFAULT_MEMORY_FRACTION, load_cluster


def _flagged(e):
    return [a for a in e.assumptions if a.startswith("memory pressure")]


@pytest.fixture(scope="module")
def foundry_13b_on_eight_40gb():
    cases, _ = load_cases()
    return next(c for c in cases if short_source(c.source) == "llm-foundry A100-40GB" and c.model.name == "MPT-13b"
                and c.cluster.num_gpus == 8 and c.job.seq_len == 2048)


def test_the_foundry_run_near_capacity_is_flagged_and_its_room_said(foundry_13b_on_eight_40gb):
    c = foundry_13b_on_eight_40gb
    e = estimate(c.model, c.job, c.cluster, c.plan)
    free = e.details["gpu_memory_bytes"] - e.memory_bytes_per_gpu["total"]
    assert 0 <= free <= ALLOCATOR_PRESSURE_HEADROOM_BYTES
    (note,) = _flagged(e)
    assert f"{free / 2**30:.1f} GiB" in note and "not priced" in note
    assert e.feasible


def test_a_plan_with_room_is_not_flagged(foundry_13b_on_eight_40gb):
    c = foundry_13b_on_eight_40gb
    smaller = estimate(c.model, replace(c.job, global_batch=c.job.global_batch // 2), c.cluster,
                       replace(c.plan, micro_batch=1))
    assert smaller.details["gpu_memory_bytes"] - smaller.memory_bytes_per_gpu["total"] > ALLOCATOR_PRESSURE_HEADROOM_BYTES
    assert not _flagged(smaller)


@pytest.mark.parametrize("kw, churns", [
    (dict(engine="generic", zero=3), True), (dict(engine="generic", zero=1), False),
    (dict(engine="deepspeed", zero=3), True), (dict(engine="megatron", zero=1), False),
    (dict(engine="torchtitan", zero=2), True), (dict(engine="torchtitan", zero=0), False),
])
def test_which_plans_churn_the_allocator(kw, churns):
    assert churns_allocator(Plan(dp=8, **kw)) is churns


def test_the_churn_mask_of_a_batch_matches_each_plan():
    plans = [Plan(dp=8, engine=e, zero=z) for e, z in (("generic", 3), ("generic", 1), ("deepspeed", 3),
                                                         ("megatron", 1), ("torchtitan", 2), ("torchtitan", 0),
                                                         ("scaling", 1))]
    assert [bool(churns_allocator_where(p)) for p in plans] == [churns_allocator(p) for p in plans] == \
        [True, False, True, False, True, False, False]


def test_the_planner_keeps_the_pressure_headroom_free_only_for_plans_that_churn():
    """On an 80 GiB H100 at the default share (1.0, issue 64): a Megatron ZeRO-1 plan may fill all 80 GiB,
    an FSDP plan (torchtitan ZeRO-2, DeepSpeed ZeRO-3) 78 GiB; a lower share binds both."""
    cluster = load_cluster("dgx-h100", 8)
    cap = cluster.accelerator.memory_bytes
    assert DEFAULT_MEMORY_FRACTION == 1.0 and ALLOCATOR_PRESSURE_HEADROOM_BYTES == 2 * 2**30
    assert planner_memory_limit(Plan(dp=8, engine="megatron", zero=1), cluster, 1.0) == cap
    for kw in (dict(engine="torchtitan", zero=2), dict(engine="deepspeed", zero=3)):
        assert planner_memory_limit(Plan(dp=8, **kw), cluster, 1.0) == cap - 2 * 2**30
        assert planner_memory_limit(Plan(dp=8, **kw), cluster, 0.9) == pytest.approx(0.9 * cap)


def test_an_fsdp_search_returns_no_plan_within_the_pressure_headroom():
    from paraplan.planner.search import search
    from paraplan.planner.space import SpaceOptions
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    cluster = load_cluster("dgx-h100", 8)
    r = search(load_model("llama3-8b"), TrainingJob(8192, 64), cluster, top=20,
               options=SpaceOptions(fixed={"engine": "torchtitan", "zero": 3, "tp": 1, "pp": 1}),
               max_memory_fraction=1.0)
    assert r.plans
    assert all(e.memory_bytes_per_gpu["total"] <= cluster.accelerator.memory_bytes - ALLOCATOR_PRESSURE_HEADROOM_BYTES
               for e in r.plans)
