"""ZeRO-1/2's parameter all-gather overlapped with the next forward or exposed (Plan.overlap_param_gather,
Megatron-LM --overlap-param-gather, off by default in Megatron-LM, on in the NeMo / Megatron-Bridge recipes)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.costmodels.dataparallel import dp_traffic
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.export import to_megatron
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL, JOB, CLUSTER = load_model("llama3-70b"), TrainingJob(8192, 512), load_cluster("dgx-h100", 64)
PARAMS = 8.8e9          # a stage's parameters per GPU, any value: the windows are linear in it
OVERLAPPED = Plan(tp=8, pp=2, dp=4, zero=1, engine="megatron")
EXPOSED = replace(OVERLAPPED, overlap_param_gather=False)


def test_the_gather_moves_from_the_first_forward_to_the_exposed_time():
    on, off = dp_traffic(PARAMS, OVERLAPPED, CLUSTER), dp_traffic(PARAMS, EXPOSED, CLUSTER)
    assert on["first_forward"] > 0 and off["first_forward"] == 0
    assert np.isclose(off["exposed"] - on["exposed"], on["first_forward"], rtol=1e-12)
    for window in ("last_backward", "each_backward", "each_micro"):
        assert on[window] == off[window]


@pytest.mark.parametrize("kw", [dict(zero=0), dict(zero=3), dict(dp=1, pp=8), dict(engine="deepspeed", pp=1, dp=8)])
def test_nothing_moves_where_there_is_no_overlapped_gather(kw):
    """ZeRO-0 has no parameter all-gather, ZeRO-3 gathers per layer (prefetched), dp 1 gathers nothing,
    and DeepSpeed's ZeRO-1/2 all-gather is exposed either way."""
    on = replace(OVERLAPPED, **kw)
    a, b = estimate(MODEL, JOB, CLUSTER, on), estimate(MODEL, JOB, CLUSTER, replace(on, overlap_param_gather=False))
    assert a.step_time_s == b.step_time_s


def test_the_estimate_pays_the_gather_and_says_so():
    a, b = estimate(MODEL, JOB, CLUSTER, OVERLAPPED), estimate(MODEL, JOB, CLUSTER, EXPOSED)
    assert b.time_breakdown_s["dp_comm"] > a.time_breakdown_s["dp_comm"]
    assert b.step_time_s > a.step_time_s
    said = [line for line in b.assumptions if "--overlap-param-gather" in line]
    assert len(said) == 1 and not any("--overlap-param-gather" in line for line in a.assumptions)


def test_the_flag_and_the_plan_file(tmp_path, capsys):
    argv = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
            "--global-batch", "512", "--tp", "8", "--pp", "2", "--zero", "1", "--engine", "megatron", "--format", "json"]
    assert main(argv) == 0
    on = json.loads(capsys.readouterr().out)
    assert main(argv + ["--no-overlap-param-gather"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["plan"]["overlap_param_gather"] is True and off["plan"]["overlap_param_gather"] is False
    assert off["step_time_s"] > on["step_time_s"]
    assert Plan.from_dict(off["plan"]).overlap_param_gather is False


def test_megatron_export_writes_the_flag_only_when_the_plan_overlaps():
    def doc(plan):
        return {"schema": PLAN_SCHEMA, "scenario": {"model": MODEL.name, "cluster": "dgx-h100", "gpus": 64,
                                                    "seq_len": 8192, "global_batch": 512},
                "plan": plan.to_dict(), "estimate": {}}
    fits = dict(recompute="full")            # the layout fits in 80 GiB with its activations recomputed
    assert "--overlap-param-gather" in to_megatron(doc(replace(OVERLAPPED, **fits)))
    script = to_megatron(doc(replace(EXPOSED, **fits)))
    assert "--overlap-param-gather" not in script and "--overlap-grad-reduce" in script
