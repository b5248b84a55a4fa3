"""Expert-parallel all-to-all overlap (Megatron-Core combined 1F1B, --overlap-moe-expert-parallel-comm)."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from paraplan.calibration import load_h100_cases
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.moe import EP_OVERLAP_CONTENTION, ep_exposed_time, ep_unpaired_share
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, Recompute, Schedule
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.space import SpaceOptions, compose
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

QWEN = load_model("qwen3-30b-a3b")
JOB = TrainingJob(seq_len=4096, global_batch=512)
H100_16 = load_cluster("dgx-h100", 16)
BASE = Plan(tp=1, pp=1, dp=16, ep=16, micro_batch=1, zero=1, engine="megatron", dtype="fp8")


def test_each_all_to_all_hides_under_the_block_of_the_other_pass_beside_it():
    """Windows (combined 1F1B's pairing): combine-grad | forward attention, dispatch | backward experts,
    dispatch-grad | forward experts, combine | backward attention. An all-to-all longer than its window
    shows the remainder; the hidden part pays the contention share; unpaired passes pay all four."""
    job, plan = TrainingJob(seq_len=4096, global_batch=64), Plan(dp=8, ep=8, ep_comm_overlap=True)
    u = float(ep_unpaired_share(job, plan))
    assert u == pytest.approx(1 / 8)                  # 8 micro-batches, one unpaired pass each way
    attn_f, attn_b, moe_f, moe_b = 1.0, 2.0, 3.0, 6.0    # windows 1.0, 4.0, 2.0, 2.0
    got = ep_exposed_time(1.5, attn_f, attn_b, moe_f, moe_b, job, plan)
    paired = (1.5 - 1.0) + EP_OVERLAP_CONTENTION * (1.0 + 1.5 + 1.5 + 1.5)
    assert got == pytest.approx(u * 6 + (1 - u) * paired)
    short = ep_exposed_time(0.5, attn_f, attn_b, moe_f, moe_b, job, plan)
    assert short == pytest.approx(u * 2 + (1 - u) * EP_OVERLAP_CONTENTION * 2)
    off = dataclasses.replace(plan, ep_comm_overlap=False)
    assert ep_exposed_time(1.5, attn_f, attn_b, moe_f, moe_b, job, off) == 6


def test_interleaved_warmup_is_the_unpaired_share():
    plan = Plan(pp=4, vpp=2, schedule="interleaved", dp=8, ep=8, ep_comm_overlap=True)
    job = TrainingJob(seq_len=4096, global_batch=8 * 32)          # 32 micro-batches per pipeline
    assert float(ep_unpaired_share(job, plan)) == pytest.approx((2 * 3 + 1 * 4) / (32 * 2))
    few = TrainingJob(seq_len=4096, global_batch=8 * 4)
    assert float(ep_unpaired_share(few, plan)) == 1.0            # nothing to pair: all exposed


def test_overlap_shortens_the_step_and_keeps_memory():
    off = estimate(QWEN, JOB, H100_16, BASE)
    on = estimate(QWEN, JOB, H100_16, dataclasses.replace(BASE, ep_comm_overlap=True))
    assert on.time_breakdown_s["ep_comm"] < 0.7 * off.time_breakdown_s["ep_comm"]
    assert on.step_time_s < off.step_time_s
    for k in ("compute", "recompute", "dp_comm"):
        assert on.time_breakdown_s[k] == pytest.approx(off.time_breakdown_s[k])
    assert on.memory_bytes_per_gpu["total"] == off.memory_bytes_per_gpu["total"]
    assert any("combined 1F1B" in a for a in on.assumptions)
    assert not any("combined 1F1B" in a for a in off.assumptions)


@pytest.mark.parametrize("kw, words", [
    (dict(ep=1, dp=16), "with ep(1)"),
    (dict(pp=2, dp=8, ep=8), "pp(2) runs 1f1b"),
    (dict(recompute="full"), "full recomputation"),
    (dict(engine="torchtitan", zero=3), "torchtitan overlaps the expert-parallel all-to-all only in ScheduleDualPipeV"),
    (dict(engine="deepspeed", zero=1), "deepspeed does not overlap"),
])
def test_plans_that_cannot_run_it_are_refused_by_name(kw, words):
    with pytest.raises(ConfigError) as err:
        Plan(**{**dataclasses.asdict(BASE), "ep_comm_overlap": True, **kw})
    assert err.value.field == "ep_comm_overlap" and words in str(err.value)


def test_search_turns_it_on_where_it_runs_and_keeps_the_rest():
    fixed = {"engine": "megatron"}
    plain, _, _ = compose(QWEN, JOB, H100_16, SpaceOptions(fixed=fixed))
    batch, _, _ = compose(QWEN, JOB, H100_16, SpaceOptions(fixed={**fixed, "ep_comm_overlap": True}))
    assert len(batch) == len(plain) and not plain.ep_comm_overlap.any()
    on = batch.ep_comm_overlap
    assert on.sum() > 1000
    can = (batch.ep > 1) & (batch.recompute_code != Recompute.FULL) \
        & ((batch.pp == 1) | (batch.schedule_code == Schedule.INTERLEAVED))
    assert np.array_equal(on, can)


def test_exports_say_it():
    doc = {"schema": PLAN_SCHEMA, "scenario": {"model": "qwen3-30b-a3b", "cluster": "dgx-h200", "gpus": 16,
                                               "seq_len": 4096, "global_batch": 512},
           "plan": dataclasses.asdict(dataclasses.replace(BASE, ep_comm_overlap=True)), "estimate": {}}
    assert "--overlap-moe-expert-parallel-comm" in ex.to_megatron(doc)
    doc["plan"].update(engine="generic", dtype="bf16")
    for target in ("torchtitan", "deepspeed"):      # no combined 1F1B: the nearest plan, unoverlapped, re-estimated
        out = ex.export(doc, target)
        assert not out.plan.ep_comm_overlap and "no EP overlap" in out.notes[0], target
    doc["plan"]["ep_comm_overlap"] = False
    assert "--overlap-moe-expert-parallel-comm" not in ex.to_megatron(doc)


def test_the_calibration_rows_whose_recipe_ran_it_have_it():
    cases, _ = load_h100_cases()
    on = [c for c in cases if c.plan.ep_comm_overlap]
    assert [c.label.split(" DGX")[0] for c in on] == ["Qwen3_235B_a22B", "DeepSeekV3 (dropless)"]
    assert all(c.plan.vpp == 4 and any("overlap_moe_expert_parallel_comm" in a for a in c.assumed) for c in on)


def test_the_deepseek_1024_h100_row_runs_its_recipe_deepep_and_grad_reduce_unoverlapped():
    """The DeepSeek-V3 1024-H100 configs set enable_deepep, the a2a-1F1B overrides and
    overlap_grad_reduce=False; the only other row on the flex dispatcher is Qwen3-30B-A3B on 16 H100
    (26.06 archive; its recipe names HybridEP, no a2a overlap); no other row loses the grad-reduce
    overlap, and each choice is named among the row's assumptions."""
    cases, _ = load_h100_cases()
    flex = [c for c in cases if c.plan.moe_flex_dispatch]
    unoverlapped = [c for c in cases if not c.plan.overlap_grad_reduce]
    assert [c.row for c in flex] == [43, 50]
    assert [c.row for c in unoverlapped] == [43]
    row, qwen = flex
    assert (row.plan.tp, row.plan.pp, row.plan.vpp, row.plan.ep, row.cluster.num_gpus) == (2, 8, 4, 64, 1024)
    assert any("enable_deepep" in a for a in row.assumed)
    assert any("overlap_grad_reduce=False" in a for a in row.assumed)
    for case in flex:
        est = estimate(case.model, case.job, case.cluster, case.plan)
        alltoall = estimate(case.model, case.job, case.cluster, dataclasses.replace(case.plan, moe_flex_dispatch=False))
        assert est.time_breakdown_s["ep_comm"] < alltoall.time_breakdown_s["ep_comm"]
    assert qwen.model.name == "qwen3-30b-a3b" and qwen.model.moe.capacity_factor is None
    assert (qwen.plan.pp, qwen.plan.ep, qwen.plan.micro_batch, qwen.cluster.num_gpus) == (1, 16, 1, 16)
    assert not qwen.plan.ep_comm_overlap and any("moe_flex_dispatcher_backend" in a for a in qwen.assumed)


def test_cli_flag_and_its_error():
    common = [sys.executable, "-m", "paraplan.cli", "estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100",
              "--gpus", "16", "--seq-len", "4096", "--global-batch", "512", "--engine", "megatron"]
    ok = subprocess.run(common + ["--ep", "16", "--ep-comm-overlap", "--format", "json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["plan"]["ep_comm_overlap"] is True
    bad = subprocess.run(common + ["--ep-comm-overlap"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--ep-comm-overlap" in bad.stderr and "with ep(1)" in bad.stderr
