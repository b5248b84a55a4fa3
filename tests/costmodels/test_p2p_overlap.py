"""Megatron-Core's interleaved schedule overlaps its steady-state pipeline transfers with compute
(overlap_p2p_comm: on with virtual stages in Megatron-LM, NeMo 2 and Megatron-Bridge); its 1F1B and the
generic engine (Megatron-LM 2021's code) pay every transfer on the critical path."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels.dataparallel import OVERLAP_CONTENTION
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.p2p import p2p_time
from paraplan.costmodels.pipeline import overlapped_p2p_crossings, pipeline_crossings_on_critical_path
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL, JOB, CLUSTER = load_model("llama3-70b"), TrainingJob(8192, 128), load_cluster("dgx-h100", 64)
INTERLEAVED = Plan(tp=4, pp=8, dp=2, sp=True, vpp=5, schedule="interleaved", micro_batch=1, zero=1, engine="megatron")


def test_only_megatrons_interleaved_steady_state_crossings_overlap():
    m = 64
    assert float(overlapped_p2p_crossings(INTERLEAVED, m)) == 2 * m * 5
    # fill and drain stay: 2(p - 1) of the 2(m v + p - 1) crossings
    assert float(pipeline_crossings_on_critical_path(INTERLEAVED, m) - overlapped_p2p_crossings(INTERLEAVED, m)) == 14
    for other in (replace(INTERLEAVED, engine="generic"), replace(INTERLEAVED, vpp=1, schedule="1f1b"),
                  replace(INTERLEAVED, engine="deepspeed", vpp=1, schedule="1f1b")):
        assert float(overlapped_p2p_crossings(other, m)) == 0


def test_the_overlapped_transfers_cost_their_contention_only():
    """pp_comm = 2(p-1) exposed transfers + 2mv hidden ones at OVERLAP_CONTENTION of their duration
    (each shorter than a chunk's forward here), against all of them exposed on the generic engine."""
    e = estimate(MODEL, JOB, CLUSTER, INTERLEAVED)       # 128 sequences over dp 2 at micro-batch 1: m = 64
    p2p = float(p2p_time(MODEL, JOB, INTERLEAVED, CLUSTER))
    expected = 14 * p2p + 2 * 64 * 5 * OVERLAP_CONTENTION * p2p
    assert e.time_breakdown_s["pp_comm"] == pytest.approx(expected, rel=1e-6)
    generic = estimate(MODEL, JOB, CLUSTER, replace(INTERLEAVED, engine="generic"))
    assert generic.time_breakdown_s["pp_comm"] > 3 * e.time_breakdown_s["pp_comm"]
    one_f_one_b = estimate(MODEL, JOB, CLUSTER, replace(INTERLEAVED, vpp=1, schedule="1f1b"))
    assert one_f_one_b.time_breakdown_s["pp_comm"] == pytest.approx(
        float(pipeline_crossings_on_critical_path(replace(INTERLEAVED, vpp=1, schedule="1f1b"), 64))
        * float(p2p_time(MODEL, JOB, replace(INTERLEAVED, vpp=1, schedule="1f1b"), CLUSTER)), rel=1e-6)
    assert np.isfinite(e.step_time_s)


def test_the_estimate_says_how_it_priced_the_pipeline_transfers():
    def said(plan):
        return [a for a in estimate(MODEL, JOB, CLUSTER, plan).assumptions if a.startswith("pipeline transfers")]
    assert "overlap the next model chunks' compute" in said(INTERLEAVED)[0]
    assert "on the critical path" in said(replace(INTERLEAVED, engine="generic"))[0]
    assert said(replace(INTERLEAVED, pp=1, dp=16, vpp=1, schedule="1f1b")) == []
