"""Uneven pipeline stages (issue 14): layers that pp does not divide, and explicit first/last
stage layers (Megatron-LM --decoder-first/last-pipeline-num-layers)."""
from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels import memory as M
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate, step_terms
from paraplan.costmodels.pipeline import LAST, MIDDLE
from paraplan.errors import ConfigError
from paraplan.plan import Plan, PlanBatch, check_plan, stage_layer_counts, stage_layers
from paraplan.planner import export as ex
from paraplan.planner.search import search
from paraplan.planner.space import SpaceOptions, axis_choices
from paraplan.planner.stages import stage_layout
from paraplan.reports.text import render_estimate
from paraplan.scenario import load_scenario
from tests.planner.test_export import OPTIONS, doc, module_literals, parse_megatron


def _scene(model, cluster, gpus, seq=2048, batch=2048):
    s = load_scenario(model, cluster, gpus=gpus, seq_len=seq, global_batch=batch)
    return s.model, s.job(), s.cluster


BLOOM_PLAN = Plan(tp=4, pp=12, dp=8, micro_batch=2, zero=1, recompute="full")


# --- the split ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers, pp, expected", [
    (126, 16, [7] + [8] * 14 + [7]),          # Llama 3 405B
    (70, 12, [5] + [6] * 10 + [5]),           # BLOOM-176B
    (61, 8, [7, 8, 8, 8, 8, 8, 7, 7]),        # DeepSeek-V3: remainder 5 < pp - 2, to the earliest middle stages
    (60, 16, [3] + [4] * 12 + [3, 3, 3]),
    (5, 2, [2, 3]),                           # no middle stage: the last takes the extra layer
    (64, 8, [8] * 8), (80, 1, [80]),
])
def test_automatic_split(layers, pp, expected):
    plan = Plan(pp=pp)
    counts = stage_layer_counts(layers, plan)
    assert counts == expected and sum(counts) == layers
    sl = stage_layers(layers, plan)
    assert (sl.first, sl.last, sl.largest) == (expected[0], expected[-1], max(expected))
    assert sl.middle == (max(expected[1:-1]) if pp > 2 else 0)


def test_vectorized_split_matches_the_scalar_one():
    plans = [Plan(pp=p, first_stage_layers=f, last_stage_layers=l_)
             for p in (2, 3, 4, 7, 12, 16) for f, l_ in ((0, 0), (3, 0), (0, 2), (4, 5))
             if f + l_ <= 61 - (p - 2) and (p > 2 or (f and l_) == 0 or f + l_ == 61)]
    sl = stage_layers(61, PlanBatch.from_plans(plans))
    for i, p in enumerate(plans):
        c = stage_layer_counts(61, p)
        assert sum(c) == 61
        assert (sl.first[i], sl.last[i], sl.largest[i]) == (c[0], c[-1], max(c))


@pytest.mark.parametrize("engine", ["generic", "megatron", "scaling"])
@pytest.mark.parametrize("layers", [1, 3, 61, 80, 95, 126])
def test_split_looked_up_per_depth_is_the_formulas(monkeypatch, layers, engine):
    """A batch of automatic splits (the search's chunks) is looked up per pipeline depth: the same arrays,
    dtypes included, as the formula on every plan (engine scaling's own split on top of it)."""
    import paraplan.plan as P
    plans = [Plan(pp=p, engine=engine) for p in (1, 2, 3, 4, 5, 7, 8, 12, 16, 32, 64) for _ in range(30)]
    batch = PlanBatch.from_plans(plans)
    looked_up = stage_layers(layers, batch)
    monkeypatch.setattr(P, "_SPLIT_TABLE_MIN", 10**9)
    formula = stage_layers(layers, batch)
    for a, b in zip(looked_up, formula):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    with_first = replace(batch, first_stage_layers=np.where(batch.pp > 1, 1, 0))   # explicit first stages
    formula = stage_layers(layers, with_first)
    monkeypatch.setattr(P, "_SPLIT_TABLE_MIN", 1)
    assert all(np.array_equal(a, b) for a, b in zip(stage_layers(layers, with_first), formula))   # not looked up


def test_explicit_first_last_fields():
    plan = Plan(pp=4, first_stage_layers=3, last_stage_layers=2)
    assert stage_layer_counts(61, plan) == [3, 28, 28, 2]
    assert stage_layer_counts(61, Plan(pp=4, first_stage_layers=4)) == [4, 19, 19, 19]


# --- rules ---------------------------------------------------------------------------------------------
def test_fields_are_validated_with_config_errors():
    with pytest.raises(ConfigError) as e:
        Plan(pp=1, first_stage_layers=3)
    assert e.value.field == "first_stage_layers" and "pp >= 2" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Plan(pp=4, vpp=2, schedule="interleaved", last_stage_layers=3)
    assert "interleaved" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Plan(pp=4, first_stage_layers=-1)
    assert e.value.field == "first-stage-layers"
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    with pytest.raises(ConfigError) as e:
        check_plan(replace(BLOOM_PLAN, first_stage_layers=40, last_stage_layers=30), model, job, cluster)
    assert "leaves 0 layers for 10 other stages" in str(e.value)
    with pytest.raises(ConfigError) as e:
        check_plan(Plan(tp=4, pp=2, dp=48, first_stage_layers=30, last_stage_layers=30), model, job, cluster)
    assert "must equal layers(70)" in str(e.value)
    check_plan(replace(BLOOM_PLAN, first_stage_layers=30, last_stage_layers=30), model, job, cluster)


def test_layer_count_and_interleaving_rules():
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    with pytest.raises(ConfigError, match="every \\(virtual\\) pipeline stage needs at least one layer"):
        check_plan(Plan(tp=1, pp=96, dp=4), model, job, cluster)
    # 70 + embedding + loss = 72 = 12 x 2 x 3: Megatron-LM's --account-for-*-in-pipeline-split
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384, batch=1536)   # 96 micro-batches of 2
    # 70 layers on 48 chunks divide under no accounting: uneven chunks of 1 or 2 layers, as every engine that
    # interleaves takes them (Megatron-Core's pipeline layout, torchtitan's split points)
    check_plan(Plan(tp=4, pp=12, dp=8, vpp=4, schedule="interleaved", micro_batch=2), model, job, cluster)
    check_plan(Plan(tp=4, pp=12, dp=8, vpp=2, schedule="interleaved", micro_batch=2), model, job, cluster)
    check_plan(BLOOM_PLAN, model, job, cluster)       # 70 % 12 != 0 is legal now


@pytest.mark.parametrize("layers,pp,vpp,want", [
    (126, 8, 8, ((True, True), [1] + [2] * 62 + [1], [15] + [16] * 6 + [15])),    # Llama 3.1 405B (Megatron-Bridge)
    (71, 8, 3, ((True, False), [2] + [3] * 23, [8] + [9] * 7)),
    (64, 8, 2, ((False, False), [4] * 16, [8] * 8)),
    (61, 8, 4, (None, [1] + [2] * 29 + [1, 1], [7, 8, 8, 8, 8, 8, 7, 7])),   # DeepSeek-V3 on pp8 x vpp4: no accounting
])
def test_interleaved_split_counts_embedding_and_loss_as_layers(layers, pp, vpp, want):
    from paraplan.plan import interleaved_split_accounts, virtual_stage_layer_counts
    accounts, chunks, stages = want
    assert interleaved_split_accounts(layers, pp, vpp) == accounts
    plan = Plan(pp=pp, vpp=vpp, schedule="interleaved")
    got = virtual_stage_layer_counts(layers, plan)
    assert got == chunks and sum(got) == layers
    # the chunks of stage i are i, i + pp, ...: their totals are the stages' automatic split
    assert [sum(got[i::pp]) for i in range(pp)] == stages == stage_layer_counts(layers, plan)


def test_llama3_405b_interleaved_layout_estimates_and_exports():
    model, job, cluster = _scene("llama3-405b", "dgx-h100", 1024, seq=8192, batch=512)
    plan = Plan(tp=8, pp=8, dp=16, vpp=8, schedule="interleaved", micro_batch=1, sp=True, zero=1,
                recompute="full", engine="megatron")
    e = estimate(model, job, cluster, plan)
    assert e.details["layers_per_stage"] == [15] + [16] * 6 + [15]
    assert e.step_time_s > 0
    d = doc("llama3-405b", "dgx-h100", 1024, 8192, 512, tp=8, pp=8, dp=16, vpp=8, schedule="interleaved",
            micro_batch=1, sp=True, zero=1, recompute="full", engine="megatron")
    _, flags = parse_megatron(ex.to_megatron(d))
    assert flags["--account-for-embedding-in-pipeline-split"] is True
    assert flags["--account-for-loss-in-pipeline-split"] is True
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "2"
    assert "--decoder-first-pipeline-num-layers" not in flags
    assert set(flags) <= set(OPTIONS["megatron"]["flags"])
    d["plan"].update(engine="torchtitan", zero=3)
    titan = tomllib.loads(ex.to_torchtitan(d, "toml"))
    chunks = titan["parallelism"]["module_fqns_per_model_part"]        # pp 8 x vpp 8 chunks: 1, 2 x 62, 1 layers
    assert [sum(n.startswith("layers.") for n in c) for c in chunks] == [1] + [2] * 62 + [1]
    assert chunks[0] == ["tok_embeddings", "layers.0"] and chunks[-1] == ["layers.125", "norm", "output"]


# --- costs ---------------------------------------------------------------------------------------------
def test_bloom_production_layout_estimates():
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    e = estimate(model, job, cluster, BLOOM_PLAN)
    assert e.details["layers_per_stage"] == [5] + [6] * 10 + [5]
    assert e.step_time_s > 0 and e.memory_bytes_per_gpu["total"] > 0
    assert "5, 6 x 10, 5 (uneven" in render_estimate(e)
    json.dumps(e.to_dict())


def test_even_split_reports_its_layers():
    model, job, cluster = _scene("llama3-70b", "dgx-h100", 64, batch=256)
    e = estimate(model, job, cluster, Plan(tp=8, pp=4, micro_batch=1))
    assert e.details["layers_per_stage"] == [20] * 4
    assert "20 x 4 (even)" in render_estimate(e)


def test_the_largest_stage_sets_time_and_a_heavier_middle_stage_memory():
    """Explicit 1/68/1 on pp 3: the middle stage holds nearly everything; it must set the pace and
    the memory, and both must exceed the automatic split's."""
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    curves = curves_for(cluster)
    auto = Plan(tp=8, pp=3, dp=16, micro_batch=1, zero=1, recompute="full")
    skew = replace(auto, first_stage_layers=1, last_stage_layers=1)
    ta, ts = (step_terms(model, job, cluster, p, curves) for p in (auto, skew))
    assert stage_layer_counts(70, skew) == [1, 68, 1]
    assert int(ts.peak_stage) == MIDDLE and int(ts.slowest_stage) == MIDDLE
    assert float(ts.step) > float(ta.step) and float(ts.memory["total"]) > float(ta.memory["total"])
    # the compute term is the middle stage's 68 layers per micro-batch
    assert float(ts.time["compute"]) / float(ta.time["compute"]) > 68 / 24 * 0.9
    first, middle, last = M.stage_params(model, skew)
    assert middle > first and middle > last


def test_uneven_memory_uses_each_stages_layers():
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    acts = M.activation_bytes(model, job, BLOOM_PLAN)
    per_layer = M.activation_bytes_per_layer(model, job, BLOOM_PLAN)
    inflight = M.in_flight_micro_batches_middle(job, BLOOM_PLAN)
    assert inflight == 11                       # min(m, p - 1) at stage 1
    # full recomputation brings back, while one layer runs backward, what that layer dropped
    working = M.activation_bytes_per_layer(model, job, BLOOM_PLAN, recompute_code=0) - per_layer
    assert np.isclose(acts["middle"], 6 * per_layer * inflight + working)
    t = step_terms(model, job, cluster, BLOOM_PLAN, curves_for(cluster))
    # per micro-batch: at least the 6-layer middle stage's compute
    lt = C.layer_times(model, job, BLOOM_PLAN, curves_for(cluster), cluster)
    m = float(t.micro_batches)
    assert int(t.slowest_stage) in (MIDDLE, LAST)
    assert float(t.time["compute"]) >= m * 6 * float(lt["forward"] + lt["backward"]) * (1 - 1e-12)


# --- search --------------------------------------------------------------------------------------------
def test_pp_choices_divide_the_gpus_not_the_layers():
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    pp = axis_choices(model, job, cluster, SpaceOptions())["pp"]
    assert 12 in pp and 24 in pp and all(384 % p == 0 and p <= 70 for p in pp) and 96 not in pp


@pytest.mark.parametrize("model, gpus, pp", [
    ("deepseek-v3", 2048, 4), ("deepseek-v3", 2048, 8), ("deepseek-v3", 2048, 16),
    ("bloom-176b", 512, 4), ("bloom-176b", 512, 8), ("bloom-176b", 512, 16),
    ("llama3-405b", 1024, 4), ("llama3-405b", 1024, 8), ("llama3-405b", 1024, 16),
])
@pytest.mark.slow
def test_search_finds_plans_for_uneven_layer_counts(model, gpus, pp):
    m, job, cluster = _scene(model, "dgx-h100", gpus, seq=4096, batch=2 * gpus)
    opts = SpaceOptions(fixed={"pp": pp, "optimizer": "adam"}, allow_offload=False, max_vpp=1)
    r = search(m, job, cluster, options=opts, top=1)
    assert r.best is not None, r.rejected_by_reason
    e = r.best
    assert e.plan.pp == pp and e.feasible
    counts = e.details["layers_per_stage"]
    assert len(counts) == pp and sum(counts) == m.layers
    check_plan(e.plan, m, job, cluster)


def test_cli_plan_with_fixed_pp(capsys):
    from paraplan.cli import main
    code = main(["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "1024", "--seq-len", "4096",
                 "--global-batch", "2048", "--fix", "pp=16", "--fix", "vpp=1", "--no-offload", "--no-stage-ilp",
                 "--top", "1", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    best = out["plans"][0]
    assert best["plan"]["pp"] == 16 and best["details"]["layers_per_stage"] == [7] + [8] * 14 + [7]


# --- the stage ILP -------------------------------------------------------------------------------------
def test_stage_ilp_accepts_uneven_layer_counts():
    model, job, cluster = _scene("bloom-176b", "dgx-a100-80g", 384)
    layout = stage_layout(model, job, cluster, BLOOM_PLAN, time_limit_s=5)
    u = list(layout.uniform_boundaries) + [len(layout.layer_names)]
    items = [u[i + 1] - u[i] for i in range(len(u) - 1)]
    # embedding and LM head are items of their own on the first and last stage
    assert items == [1 + 5] + [6] * 10 + [5 + 1]
    assert len(layout.boundaries) == 12 or layout.partition_status.startswith("infeasible")


# --- export --------------------------------------------------------------------------------------------
BLOOM_DOC = doc("bloom-176b", "dgx-a100-80g", 384, 2048, 2048, tp=4, pp=12, dp=8, micro_batch=2, zero=1,
                recompute="full")


def test_megatron_writes_first_and_last_stage_layers():
    _, flags = parse_megatron(ex.to_megatron(BLOOM_DOC))
    assert flags["--decoder-first-pipeline-num-layers"] == "5"
    assert flags["--decoder-last-pipeline-num-layers"] == "5"
    assert set(flags) <= set(OPTIONS["megatron"]["flags"])
    even = doc("llama3-70b", "dgx-h100", 64, 4096, 256, tp=8, pp=4)
    assert "--decoder-first-pipeline-num-layers" not in parse_megatron(ex.to_megatron(even))[1]


def test_megatron_spells_out_a_split_first_last_flags_cannot_express():
    d = doc("deepseek-v3", "dgx-h100", 2048, 4096, 4096, tp=8, pp=8, ep=32, micro_batch=1, zero=1,
            recompute="full")
    e = ex.export(d, "megatron")
    flags = parse_megatron(e.text)[1]
    assert "--decoder-first-pipeline-num-layers" not in flags        # uneven middle stages: a layout instead
    layout = flags["--pipeline-model-parallel-layout"].split("|")
    assert len(layout) == 8 and layout[0].startswith("E") and layout[-1].endswith("L")
    d["plan"].update(first_stage_layers=5, last_stage_layers=2)      # 5, 9 x 6, 2
    _, flags = parse_megatron(ex.to_megatron(d))
    assert flags["--decoder-first-pipeline-num-layers"] == "5" and flags["--decoder-last-pipeline-num-layers"] == "2"


def test_deepspeed_notes_the_partition_method():
    # 70 layers on 24 stages, full recomputation: 52 of 80 GiB as DeepSpeed runs it (139 at pp 12 without)
    e = ex.export(doc("bloom-176b", "dgx-a100-80g", 384, 2048, 2048, tp=1, pp=24, dp=16, zero=1, recompute="full"),
                  "deepspeed")
    assert any("partition_method='type:" in n for n in e.notes)


def test_torchtitan_writes_the_modules_of_each_stage():
    """126 layers on 16 stages (7, 8 x 14, 7): each stage's modules (parallelism.module_fqns_per_model_part,
    in torchtitan 0.2.2's TOML and 0.3.0's module alike), the embedding first, the norm and head last."""
    d = doc("llama3-405b", "dgx-h100", 1024, 4096, 1024, tp=8, pp=16, micro_batch=1, recompute="full")
    cfg = tomllib.loads(ex.to_torchtitan(d, "toml"))
    chunks = cfg["parallelism"]["module_fqns_per_model_part"]
    assert [sum(n.startswith("layers.") for n in c) for c in chunks] == [7] + [8] * 14 + [7]
    assert chunks[0][:2] == ["tok_embeddings", "layers.0"] and chunks[1][0] == "layers.7"
    assert chunks[-1][-3:] == ["layers.125", "norm", "output"]
    assert "pipeline_parallel_layers_per_stage" not in cfg["parallelism"]
    assert "parallelism.module_fqns_per_model_part" in OPTIONS["torchtitan"]["keys"]
    module = module_literals(ex.to_torchtitan(d))["SETTINGS"]["parallelism"]["module_fqns_per_model_part"]
    assert [c[:1] + c[-2:] for c in module[::15]] == [["tok_embeddings", "layers.5", "layers.6"],
                                                      ["layers.119", "norm", "lm_head"]]   # 0.3.0's head: lm_head


def test_cli_plan_with_the_stage_and_recompute_ilps_on_126_layers_at_pp4(capsys):
    """As typed, with the stage and recomputation ILPs on (the defaults): Llama 3 405B at pp 4 on 1024
    H100s once stopped with 'CBC did not solve the recomputation tie-break' (the tie-break's
    bottleneck bound sat inside CBC's tolerance of the first solve's value)."""
    from paraplan.cli import main
    code = main(["plan", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "1024", "--seq-len", "4096",
                 "--global-batch", "1024", "--fix", "pp=4", "--top", "1", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    best = json.loads(captured.out)["plans"][0]
    assert best["plan"]["pp"] == 4 and sum(best["details"]["layers_per_stage"]) == 126
