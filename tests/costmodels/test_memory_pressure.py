"""A ZeRO-3 / FSDP plan whose peak sits within 2 GiB of the GPU's memory is flagged (the caching
allocator's retries are not priced); plans with room, and engines that do not free gathered parameters
every layer, are not."""
from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.calibration import load_cases, short_source
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import ALLOCATOR_PRESSURE_HEADROOM_BYTES, churns_allocator
from paraplan.plan import Plan


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
