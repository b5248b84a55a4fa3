"""ZBV, DualPipe and DualPipeV: bubble, in-flight micro-batches, parameter copies, the expert all-to-all
overlap, the rules each schedule's source asserts, and which engines run them.

Golden numbers come from the sources' formulas: DeepSeek-V3 technical report Table 2 (the DualPipe
README's "Pipeline Bubbles and Memory Usage Comparison", deepseek-ai/DualPipe), Qi et al. 2024 (zero
bubble; the sail-sg table "ZBV: bubble rate 0, activation memory 1x 1F1B"), and the schedule tables of
torch.distributed.pipelining (ScheduleZBVZeroBubble, ScheduleDualPipeV), read from the installed torch.
"""
import dataclasses
import types

import numpy as np
import pytest

from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import v_and_dual_in_flight
from paraplan.costmodels.moe import dualpipe_unpaired_share, ep_unpaired_share
from paraplan.costmodels.pipeline import (bubble_factor, chunks_per_rank, parameter_copies,
                                          pipeline_crossings_on_critical_path, schedule_bubble)
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, Schedule, check_plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

ZBV, DUALPIPE, DUALPIPE_V = int(Schedule.ZBV), int(Schedule.DUALPIPE), int(Schedule.DUALPIPE_V)


# --- bubble: the sources' formulas ---------------------------------------------------------------------
def test_dualpipe_bubble_is_table_2s_formula():
    """DeepSeek-V3 Table 2 with F = 1, B = 2 (full backward), W = 1, F&B = F + B = 3 on 8 ranks:
    1F1B (PP−1)(F+B) = 21, ZB1P (PP−1)(F+B−2W) = 7, DualPipe (PP/2−1)(F&B+B−3W) = 3·2 = 6."""
    assert schedule_bubble(8.0, DUALPIPE, 1.0, 2.0, 1.0) == pytest.approx(6.0)
    assert schedule_bubble(8.0, int(Schedule.ZB_H1), 1.0, 2.0, 1.0) == pytest.approx(7.0)     # ZB1P's row
    # a heavier backward (B = 3): 3·(4 + 3 − 3) = 12
    assert schedule_bubble(8.0, DUALPIPE, 1.0, 3.0, 1.0) == pytest.approx(12.0)
    # pp 2: PP/2 − 1 = 0, no bubble
    assert schedule_bubble(2.0, DUALPIPE, 1.0, 2.0, 1.0) == 0.0


def test_zbv_bubble_is_zero_at_equal_times_and_zb_h2s_at_half_chunks_otherwise():
    """Qi et al. 2024: ZB-V is zero-bubble when T_F = T_B = T_W (F = W = 1, full B = 2); otherwise ZB-H2's
    (p − 1)(F + B − 3W) over half-stage chunks: (8 − 1)(1 + 3 − 3)/2 = 3.5."""
    assert schedule_bubble(8.0, ZBV, 1.0, 2.0, 1.0) == 0.0
    assert schedule_bubble(8.0, ZBV, 1.0, 3.0, 1.0) == pytest.approx(3.5)
    assert schedule_bubble(8.0, ZBV, 1.0, 1.0, 1.0) == 0.0            # W filling more than the bubble: 0, never negative


def test_dualpipev_bubble_is_dualpipe_over_2p_half_chunks():
    """DualPipeV: DualPipe on 2p half-size chunks, (2p/2 − 1)(F&B + B − 3W)/2 = (8 − 1)·2/2 = 7 at equal times,
    ZB-H1's (p − 1)·F."""
    assert schedule_bubble(8.0, DUALPIPE_V, 1.0, 2.0, 1.0) == pytest.approx(7.0)


@pytest.mark.parametrize("sc", [ZBV, DUALPIPE, DUALPIPE_V])
@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_bubble_factor_is_the_formula_at_equal_times(sc, p):
    """bubble_factor (the reported share) is schedule_bubble / ((p − 1)(F + B)) with F = W = 1, B = 2."""
    plan = types.SimpleNamespace(schedule_code=sc, vpp=1, pp=p)
    assert float(bubble_factor(plan)) == pytest.approx(schedule_bubble(float(p), sc, 1.0, 2.0, 1.0) / ((p - 1) * 3))


def test_chunks_copies_and_crossings():
    v = types.SimpleNamespace(schedule_code=np.array([0, 1, ZBV, DUALPIPE, DUALPIPE_V]), vpp=np.array([1, 4, 1, 1, 1]),
                              pp=np.array([8] * 5))
    assert list(chunks_per_rank(v)) == [1, 4, 2, 2, 2]
    assert list(parameter_copies(v)) == [1, 1, 1, 2, 1]
    # 2(m·v + p − 1): ZBV and DualPipeV cross twice as many boundaries (sail-sg: "communication volume 2x");
    # DualPipe's micro-batches each run one direction over p stages, like 1F1B
    assert list(pipeline_crossings_on_critical_path(v, 16)) == [46, 142, 78, 46, 78]


# --- in flight and overlap: against the schedules' own tables ---------------------------------------------
def test_in_flight_golden_numbers():
    job = TrainingJob(seq_len=4096, global_batch=64)
    plans = types.SimpleNamespace(schedule_code=np.array([ZBV, DUALPIPE, DUALPIPE_V]), pp=np.array([8, 8, 8]),
                                  dp=np.array([1, 1, 1]), micro_batch=np.array([1, 1, 1]))
    # ZBV: 1F1B's p; DualPipe: Table 2's PP + 1; DualPipeV: 2p + 1 half-stage chunks
    assert list(v_and_dual_in_flight(job, plans)) == [8.0, 9.0, 8.5]
    few = TrainingJob(seq_len=4096, global_batch=4)                       # never more than the micro-batches
    assert list(v_and_dual_in_flight(few, plans)) == [4.0, 4.0, 4.0]


def test_dualpipe_unpaired_share_from_its_step_loop():
    """dualpipe.py step(): rank 0 (h = 0) pairs 2(m/2 − p + 1) chunks in step 4 and p/2 − 1 in step 5 of its
    m forwards: unpaired (3p/2 − 1)/m; DeepSeek-V3's pp 16 with 120 micro-batches: 23/120."""
    assert float(dualpipe_unpaired_share(120, 16.0, DUALPIPE, 0.0)) == pytest.approx(23 / 120)
    p, m = 8, 40
    h = 0
    paired = 2 * (m // 2 - p + h + 1) + (p // 2 - h - 1)
    assert float(dualpipe_unpaired_share(m, float(p), DUALPIPE, 0.0)) == pytest.approx(1 - paired / m)
    assert float(dualpipe_unpaired_share(64, 8.0, DUALPIPE_V, 0.0)) == pytest.approx(23 / 128)
    assert float(dualpipe_unpaired_share(64, 8.0, 0, 0.25)) == 0.25


@pytest.mark.torch
@pytest.mark.parametrize("p, m", [(4, 8), (4, 16), (8, 32), (8, 64)])
def test_torch_schedule_tables_agree(p, m):
    """The installed torch.distributed.pipelining's ScheduleZBVZeroBubble and ScheduleDualPipeV tables
    (their _calculate_single_rank_operations, all ranks): the peak of chunk forwards not yet met by their
    input-gradient backward is 2p (ZBV) and 2p + 1 (DualPipeV) half-stage chunks on every rank, and rank 0
    runs 2m − 3p + 1 OVERLAP_F_B pairs of its 2m chunk forwards."""
    from torch.distributed.pipelining import schedules as S

    def table(cls, rank):
        self = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, _num_stages=2 * p, num_stages=2 * p,
                                     n_local_stages=2)
        return [a for a in cls._calculate_single_rank_operations(self, rank) if a is not None]

    def peak(actions):
        live = top = 0
        for a in actions:
            for x in (a.sub_actions if a.computation_type == S.OVERLAP_F_B else (a,)):
                live += {S.FORWARD: 1, S.FULL_BACKWARD: -1, S.BACKWARD_INPUT: -1}.get(x.computation_type, 0)
                top = max(top, live)
        return top

    job = TrainingJob(seq_len=4096, global_batch=m)
    plans = types.SimpleNamespace(schedule_code=np.array([ZBV, DUALPIPE_V]), pp=np.array([p, p]),
                                  dp=np.array([1, 1]), micro_batch=np.array([1, 1]))
    zbv, dpv = v_and_dual_in_flight(job, plans)
    assert [peak(table(S.ScheduleZBVZeroBubble, r)) for r in range(p)] == [2 * zbv] * p
    assert [peak(table(S.ScheduleDualPipeV, r)) for r in range(p)] == [2 * dpv] * p
    pairs = sum(a.computation_type == S.OVERLAP_F_B for a in table(S.ScheduleDualPipeV, 0))
    assert pairs == 2 * m - 3 * p + 1
    plan = Plan(pp=p, dp=1, schedule="dualpipev")
    assert float(ep_unpaired_share(job, plan)) == pytest.approx(1 - pairs / (2 * m))


# --- the estimate -------------------------------------------------------------------------------------
DSV3 = load_model("deepseek-v3")
DSV3_JOB = TrainingJob(seq_len=4096, global_batch=15360)
H100_2048 = load_cluster("dgx-h100", 2048)
DSV3_PLAN = Plan(tp=1, pp=16, dp=128, ep=64, micro_batch=1, zero=1, recompute="op-sac")


def _est(**kw):
    return estimate(DSV3, DSV3_JOB, H100_2048, dataclasses.replace(DSV3_PLAN, **kw))


def test_deepseek_v3_estimates_by_schedule():
    one, zbh1, zbv, dual, dualv = (_est(schedule=s) for s in ("1f1b", "zb-h1", "zbv", "dualpipe", "dualpipev"))
    bubble = {k: e.time_breakdown_s["pp_bubble"] for k, e in
              (("1f1b", one), ("zb-h1", zbh1), ("zbv", zbv), ("dualpipe", dual), ("dualpipev", dualv))}
    assert bubble["1f1b"] > bubble["zb-h1"] > bubble["zbv"] >= 0.0
    assert bubble["dualpipe"] < bubble["zb-h1"] and bubble["dualpipev"] < bubble["1f1b"] / 2
    # DualPipe holds two copies of the stage's parameters, gradients and optimizer states
    for term in ("parameters", "gradients", "optimizer_states"):
        assert dual.memory_bytes_per_gpu[term] == pytest.approx(2 * one.memory_bytes_per_gpu[term], rel=1e-9)
        assert dualv.memory_bytes_per_gpu[term] == pytest.approx(one.memory_bytes_per_gpu[term], rel=1e-9)
    # ZBV keeps p micro-batches on every rank (1F1B's last keeps 1) and more activations than 1F1B in all
    assert zbv.memory_bytes_per_gpu["activations"] >= one.memory_bytes_per_gpu["activations"]
    assert dual.memory_bytes_per_gpu["activations"] > zbv.memory_bytes_per_gpu["activations"]


def test_dualpipe_hides_the_expert_all_to_all_with_ep_comm_overlap():
    off, on = _est(schedule="dualpipe"), _est(schedule="dualpipe", ep_comm_overlap=True)
    assert on.time_breakdown_s["ep_comm"] < 0.8 * off.time_breakdown_s["ep_comm"]
    assert on.step_time_s < off.step_time_s
    assert any("DualPipe (DeepSeek-V3 sec. 3.2.1" in a for a in on.assumptions)
    assert on.memory_bytes_per_gpu["total"] == off.memory_bytes_per_gpu["total"]


# --- the rules each source asserts ----------------------------------------------------------------------
def _check(model="deepseek-v3", global_batch=15360, **kw):
    plan = Plan(**{**dataclasses.asdict(DSV3_PLAN), **kw})
    return check_plan(plan, load_model(model), TrainingJob(seq_len=4096, global_batch=global_batch),
                      load_cluster("dgx-h100", plan.tp * plan.pp * plan.dp * plan.cp))


@pytest.mark.parametrize("kw, field, words", [
    (dict(schedule="dualpipe", pp=6, dp=1, ep=1, global_batch=12), None, None),                # legal: even pp, m = 12
    (dict(schedule="dualpipe", pp=3, dp=1, ep=1, global_batch=12), "schedule", "even pp"),
    (dict(schedule="dualpipe", pp=8, dp=1, ep=1, global_batch=15), "schedule", "at least 2 * pp(8) = 16"),
    (dict(schedule="dualpipe", pp=8, dp=1, ep=1, global_batch=14), "schedule", "at least 2 * pp(8) = 16"),
    (dict(schedule="dualpipev", pp=8, dp=1, ep=1, global_batch=15), "schedule", "ScheduleDualPipeV requires"),
    (dict(schedule="zbv", pp=4, dp=1, ep=1, global_batch=3), None, None),                       # ZBV pads, any m
    (dict(schedule="zbv", pp=16, dp=1, ep=1, model="gpt-1.7b", global_batch=16), "schedule", "24 layers < 2 * pp(16)"),
])
def test_schedule_rules(kw, field, words):
    if field is None:
        _check(**kw)
        return
    with pytest.raises(ConfigError) as err:
        _check(**kw)
    assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize("engine, schedule, words", [
    ("megatron", "zbv", "Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B"),
    ("megatron", "dualpipe", "Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B"),
    ("megatron", "dualpipev", "Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B"),
    ("deepspeed", "zbv", "DeepSpeed's PipelineEngine runs 1F1B"),
    ("scaling", "dualpipev", "Scaling's pipeline runs 1F1B"),
    ("torchtitan", "dualpipe", "torchtitan runs torch.distributed.pipelining's schedules"),
])
def test_engines_refuse_the_schedules_they_do_not_run(engine, schedule, words):
    with pytest.raises(ConfigError) as err:
        Plan(pp=4, schedule=schedule, engine=engine, zero=1 if engine != "torchtitan" else 2)
    assert err.value.field == "schedule" and words in str(err.value)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_torchtitan_runs_the_v_schedules(schedule):
    assert Plan(pp=4, schedule=schedule, engine="torchtitan", zero=2).schedule == schedule
    assert Plan(pp=4, schedule=schedule, ep=2, engine="torchtitan", zero=2,
                ep_comm_overlap=schedule == "dualpipev").pp == 4


# --- the planner searches them --------------------------------------------------------------------------
def test_plan_puts_the_schedules_side_by_side(capsys):
    """`paraplan plan` on an MoE model: every schedule the generic engine runs is searched, and the best
    plan of each is printed side by side; DualPipe's rows carry the expert overlap where it is fixed on."""
    from paraplan.cli import main
    assert main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "4096",
                 "--global-batch", "512", "--engine", "generic", "--fix", "pp=4", "--fix", "ep=8",
                 "--fix", "ep_comm_overlap=true", "--fix", "recompute=selective", "--fix", "zero=1",
                 "--top", "3", "--no-stage-ilp"]) == 0
    out = capsys.readouterr().out
    side = out.split("schedules side by side")[1].split("\nbest plan")[0]
    rows = {line.split()[0]: line.split() for line in side.splitlines()[2:] if line.strip()}
    assert {"1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"} <= set(rows)
    steps = [float(r[1]) for r in rows.values()]
    assert steps == sorted(steps)                                          # fastest first
    bubble = {k: float(r[2]) for k, r in rows.items()}
    assert bubble["zbv"] < bubble["zb-h1"] < bubble["1f1b"]
    assert "epov" in " ".join(rows["dualpipe"]) and "epov" not in " ".join(rows["zbv"])


def test_megatron_plans_propose_none_of_them():
    from paraplan.planner.search import search
    from paraplan.planner.space import SpaceOptions
    r = search(load_model("qwen3-30b-a3b"), TrainingJob(seq_len=4096, global_batch=512), load_cluster("dgx-h100", 64),
               options=SpaceOptions(fixed={"engine": "megatron", "pp": 4, "ep": 8, "zero": 1}), top=3)
    assert set(r.by_schedule) <= {"1f1b", "interleaved"} and r.by_schedule
    assert r.rejected_by_reason["Megatron-LM runs 1F1B and interleaved 1F1B only"] > 0


@pytest.mark.parametrize("argv, words", [
    (["--gpus", "24", "--global-batch", "48", "--pp", "3", "--schedule", "dualpipe", "--engine", "generic"],
     "paraplan: error: --schedule: DualPipe pairs rank r with rank pp - 1 - r and needs an even pp"),
    (["--gpus", "8", "--pp", "4", "--schedule", "zbv"],            # the default engine, Megatron-LM
     "paraplan: error: --schedule: Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B"),
])
@pytest.mark.slow
def test_estimate_refuses_in_one_line(argv, words):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                        *argv], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith(words) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_stage_ilp_leaves_the_two_chunk_schedules_alone():
    """The partition ILP cuts one contiguous stage per rank; a V or DualPipe rank holds two chunks."""
    from paraplan.planner.stages import stage_layout
    model, job, cluster = load_model("llama3-8b"), TrainingJob(seq_len=4096, global_batch=64), load_cluster("dgx-h100", 8)
    assert stage_layout(model, job, cluster, Plan(pp=4, dp=2, schedule="1f1b")) is not None
    for schedule in ("zbv", "dualpipe", "dualpipev"):
        assert stage_layout(model, job, cluster, Plan(pp=4, dp=2, schedule=schedule)) is None


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "dualpipe", "dualpipev"])
def test_the_reported_bubble_share_is_the_time_charged(schedule):
    """The estimate's bubble_fraction is its pp_bubble over m stage passes for the F, B, W-priced schedules
    (before, ZBV said 'bubble 0.0%' beside a 0.2 s bubble)."""
    e = _est(schedule=schedule)
    m = DSV3_JOB.global_batch // 128                    # dp 128, micro-batch 1
    share = e.details["bubble_fraction"]
    assert share > 0 and e.time_breakdown_s["pp_bubble"] > 0
    one = _est(schedule="1f1b")
    # the stage pass time behind both: 1F1B's bubble is (p − 1) of them
    t = one.time_breakdown_s["pp_bubble"] / 15
    assert share == pytest.approx(e.time_breakdown_s["pp_bubble"] / (m * t), rel=1e-6)


@pytest.mark.slow
def test_the_planner_doc_example_is_what_the_cli_prints(capsys):
    """docs/planner.md's DeepSeek-V3 side-by-side: every line of its block is in what the command prints."""
    from pathlib import Path

    from paraplan.cli import main
    text = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    start = text.index("```\n", text.index("### Pipeline schedules")) + 4
    shown = text[start:text.index("```", start)].splitlines()
    assert main(["plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "2048", "--seq-len", "4096",
                 "--global-batch", "15360", "--engine", "generic", "--fix", "ep=64", "--fix", "ep_comm_overlap=true",
                 "--top", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(shown) == 9 and [line for line in shown if line not in printed] == []   # title, header, 7 schedules


@pytest.mark.slow
def test_deepseek_v3_plan_chooses_among_all_five_schedules():
    """Issue 66's example: DeepSeek-V3 (61 layers) on 2048 H100s with the generic engine ranks a fitting plan of
    1F1B, interleaved (uneven chunks: 61 layers divide into no pp*vpp), zb-h1, ZBV and DualPipe(V)."""
    from paraplan.planner.search import search
    from paraplan.planner.space import SpaceOptions
    r = search(load_model("deepseek-v3"), TrainingJob(seq_len=4096, global_batch=15360), load_cluster("dgx-h100", 2048),
               options=SpaceOptions(fixed={"engine": "generic", "ep": 64, "ep_comm_overlap": True}), top=3)
    assert {"1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"} <= set(r.by_schedule)
    inter = r.by_schedule["interleaved"]
    assert inter.plan.vpp > 1 and 61 % (inter.plan.pp * inter.plan.vpp) != 0
