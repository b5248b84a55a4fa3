"""Deep pipelines over few micro-batches (issue 64, regime 4): the estimate says how much a plain 1F1B / GPipe
pipeline idles, (p - 1)/m of the compute, and that interleaving cuts it to (p - 1)/(v m) (Llama 3 paper,
arXiv:2407.21783 sec. 3.3.2; Narayanan et al. 2021), once that share reaches half the compute."""
from __future__ import annotations

import pytest

from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL = load_model("llama3-405b")
CLUSTER = load_cluster("dgx-h100", 16384)


def _bubble_lines(plan, gbs=2048):
    e = estimate(MODEL, TrainingJob(8192, gbs), CLUSTER, plan)
    return [a for a in e.assumptions if a.startswith("pipeline bubble:")], e


def test_llama3_405b_16_stages_over_16_micro_batches_says_94_percent():
    """tp 8, pp 16, dp 128 on 16,384 H100 at 2,048 sequences: 16 micro-batches a replica, (16 - 1)/16 = 94 %,
    and the priced bubble is that share of the stage's compute."""
    plan = Plan(tp=8, pp=16, dp=128, sp=True, zero=1, recompute="full", engine="megatron")
    lines, e = _bubble_lines(plan)
    assert len(lines) == 1 and "16 stages over 16 micro-batches" in lines[0] and "= 94 %" in lines[0]
    assert e.details["bubble_fraction"] == pytest.approx(15 / 16, rel=0.02)


@pytest.mark.parametrize("plan,gbs", [
    (Plan(tp=8, pp=16, dp=128, sp=True, zero=1, recompute="full", engine="megatron", vpp=7,
          schedule="interleaved"), 2048),                                   # interleaved: (p-1)/(v m)
    (Plan(tp=8, pp=16, dp=128, sp=True, zero=1, recompute="full", engine="megatron"), 8192),   # 15/64 < 1/2
    (Plan(tp=8, pp=1, dp=2048, sp=True, zero=1, recompute="full", engine="megatron"), 2048),   # no pipeline
])
def test_nothing_said_below_half_or_when_interleaved(plan, gbs):
    assert _bubble_lines(plan, gbs)[0] == []
