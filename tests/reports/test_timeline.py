"""The predicted step as a timeline (issue 65): its length is the estimate's step time, the pace rank's slices
add up to the estimate's breakdown, every schedule runs its operations in its own order and respects the
pipeline's dependencies, and the figure draws it."""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

from paraplan.costmodels.estimate import TIME_TERMS, estimate
from paraplan.plan import Plan
from paraplan.reports import timeline as T
from paraplan.reports.figures import timeline_figure
from paraplan.scenario import load_scenario

SCENARIO = load_scenario("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=32)
MOE = load_scenario("mixtral-8x7b", "dgx-h100", gpus=32, seq_len=4096, global_batch=64)

PLANS = {
    "1f1b": dict(tp=2, pp=4),
    "interleaved": dict(tp=2, pp=4, vpp=2, schedule="interleaved"),
    "gpipe": dict(tp=2, pp=4, schedule="gpipe"),
    "zb-h1": dict(tp=2, pp=4, schedule="zb-h1"),
    "zbv": dict(tp=2, pp=4, schedule="zbv"),
    "dualpipe": dict(tp=2, pp=4, schedule="dualpipe"),
    "dualpipev": dict(tp=2, pp=4, schedule="dualpipev"),
    "pp1-zero1": dict(tp=8, zero=1),
    "recompute-unfused": dict(tp=2, pp=4, recompute="full", zero=1, grad_accumulation_fusion=False),
    "offload": dict(tp=4, pp=2, zero=2, offload="cpu"),
}


def _estimate(scenario=SCENARIO, **plan):
    plan = Plan(engine=plan.pop("engine", "generic"), **plan)
    return estimate(scenario.model, scenario.job(plan), scenario.cluster, plan)


@pytest.fixture(scope="module")
def laid_out():
    out = {name: (e := _estimate(**kw), T.build_timeline(e)) for name, kw in PLANS.items()}
    e = _estimate(MOE, tp=2, pp=2, ep=8, engine="megatron")
    out["moe-ep"] = (e, T.build_timeline(e))
    return out


@pytest.mark.parametrize("name", [*PLANS, "moe-ep"])
def test_length_is_the_step_time_and_the_pace_rank_adds_up_to_the_breakdown(laid_out, name):
    e, tl = laid_out[name]
    end = max(s.end_s for s in tl.slices)
    assert end == pytest.approx(e.step_time_s, rel=1e-9)
    assert min(s.start_s for s in tl.slices) >= 0
    got = tl.by_category()
    for term in TIME_TERMS:
        assert got.get(term, 0.0) == pytest.approx(e.time_breakdown_s[term], rel=1e-9, abs=1e-12), term
    assert set(got) <= set(TIME_TERMS)


@pytest.mark.parametrize("name", [*PLANS, "moe-ep"])
def test_no_track_holds_two_slices_at_once(laid_out, name):
    _, tl = laid_out[name]
    tracks = defaultdict(list)
    for s in tl.slices:
        tracks[(s.rank, s.track)].append(s)
    for key, ss in tracks.items():
        ss.sort(key=lambda s: s.start_s)
        for a, b in zip(ss, ss[1:]):
            assert b.start_s >= a.end_s - 1e-12, (key, a.name, b.name)


def _ops(tl):
    """(kind, micro-batch, chunk) -> (rank, start, end) of each operation's compute (recompute + backward
    merged), from the slice names F3 / B3 / W3 / R3 (with .chunk when a micro-batch crosses a rank twice)."""
    ops = {}
    for s in tl.slices:
        m = re.fullmatch(r"([FBWR])(\d+)(?:\.(\d+))?", s.name)
        if not m:
            continue
        kind = "B" if m[1] == "R" else m[1]
        key = (kind, int(m[2]), int(m[3]) if m[3] else s.rank)
        r, a, b = ops.get(key, (s.rank, s.start_s, s.end_s))
        ops[key] = (r, min(a, s.start_s), max(b, s.end_s))
    return ops


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "gpipe", "zb-h1", "zbv", "dualpipev"])
def test_operations_wait_for_their_inputs(laid_out, name):
    """A forward after the previous chunk's, a backward after the next chunk's, a weight gradient after its
    own backward: the re-timing clock keeps every dependency."""
    e, tl = laid_out[name]
    ops = _ops(tl)
    chunks = max(c for _, _, c in ops) + 1
    m = int(e.details["micro_batches_per_step"])
    assert len([k for k in ops if k[0] == "F"]) == m * chunks
    for (kind, mb, c), (_, start, _) in ops.items():
        if kind == "F" and c > 0:
            assert start >= ops[("F", mb, c - 1)][2] - 1e-12
        if kind == "B":
            dep = ("B", mb, c + 1) if c + 1 < chunks else ("F", mb, c)
            assert start >= ops[dep][2] - 1e-12
        if kind == "W":
            assert start >= ops[("B", mb, c)][2] - 1e-12


def _compute_order(tl, rank):
    return [s.name for s in sorted(tl.slices, key=lambda s: s.start_s)
            if s.rank == rank and s.track == "compute" and re.fullmatch(r"[FB]\d+(\.\d+)?", s.name)]


def test_1f1b_runs_p_minus_r_minus_1_warmup_forwards_then_alternates(laid_out):
    _, tl = laid_out["1f1b"]
    m = tl.micro_batches
    for r in range(4):
        w = 4 - r - 1
        expect = [f"F{i}" for i in range(w)]
        for i in range(m - w):
            expect += [f"F{w + i}", f"B{i}"]
        expect += [f"B{i}" for i in range(m - w, m)]
        assert _compute_order(tl, r) == expect


def test_gpipe_runs_every_forward_before_any_backward(laid_out):
    _, tl = laid_out["gpipe"]
    for r in range(4):
        order = _compute_order(tl, r)
        assert order == [f"F{i}" for i in range(tl.micro_batches)] + [f"B{i}" for i in range(tl.micro_batches)]


def test_interleaved_follows_megatron_order_over_the_chunks(laid_out):
    """Rank 0 of pp 4 × v 2: (p − 1)·2 + (v − 1)·p = 10 warm-up forwards, chunk 0 for micro-batches 0-3, then
    chunk 4 (its second) for 0-3, then chunk 0 again for 4-7; the first backward is of chunk 4."""
    _, tl = laid_out["interleaved"]
    order = _compute_order(tl, 0)
    assert order[:11] == ["F0.0", "F1.0", "F2.0", "F3.0", "F0.4", "F1.4", "F2.4", "F3.4", "F4.0", "F5.0", "F6.0"]
    assert order[11] == "B0.4"
    assert tl.chunks_per_rank == 2


def test_zero_bubble_schedules_defer_weight_gradients(laid_out):
    for name in ("zb-h1", "zbv", "dualpipe", "dualpipev"):
        _, tl = laid_out[name]
        assert any(s.name.startswith("W") for s in tl.slices), name
    for name in ("1f1b", "interleaved", "gpipe"):
        assert not any(re.fullmatch(r"W\d+.*", s.name) for s in laid_out[name][1].slices)


def test_v_schedules_put_the_head_and_the_pace_on_rank_0(laid_out):
    assert laid_out["zbv"][1].pace_rank == 0 and laid_out["dualpipev"][1].pace_rank == 0
    assert laid_out["1f1b"][1].pace_rank == 3


def test_bubble_shrinks_from_gpipe_to_interleaved_to_zbv(laid_out):
    """The bubble the timeline draws is the estimate's: 1F1B's equals GPipe's, interleaving halves it at
    v = 2, ZB-H1 cuts it and ZBV less still."""
    bubble = {n: laid_out[n][1].by_category().get("pp_bubble", 0.0) for n in ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv")}
    assert bubble["gpipe"] == pytest.approx(bubble["1f1b"])
    assert bubble["interleaved"] == pytest.approx(bubble["1f1b"] / 2, rel=0.05)
    assert bubble["zbv"] < bubble["zb-h1"] < bubble["1f1b"]


def test_communication_gets_its_own_tracks_and_hidden_dp_is_marked(laid_out):
    _, tl = laid_out["moe-ep"]
    tracks = {s.track for s in tl.slices}
    assert {"compute", "tp", "ep", "pp", "dp"} <= tracks
    e, tl = laid_out["pp1-zero1"]
    hidden = [s for s in tl.slices if s.track == "dp" and s.exposed_s == 0]
    assert hidden and hidden[0].dur_s == pytest.approx(e.details["dp_comm_total_s"] - e.time_breakdown_s["dp_comm"])
    assert "knows only the hidden total" in hidden[0].args["what"]
    assert tl.dp_track_name == "dp reduce-scatter + all-gather"
    assert any(s.track == "offload" for s in laid_out["offload"][1].slices)


def test_without_pipelining_a_rank_alternates_forward_and_backward(laid_out):
    _, tl = laid_out["pp1-zero1"]
    order = _compute_order(tl, 0)
    assert order[:4] == ["F0", "B0", "F1", "B1"]
    assert not any(s.category == "pp_bubble" for s in tl.slices)


def test_interleaved_groups_not_a_multiple_of_pp_fall_back_to_the_list_schedule(monkeypatch):
    """Megatron's order needs the micro-batches in multiples of p (a plan's rule); micro-batches drawn in
    groups may not be (16 in groups of 3: 6 operations per chunk), and the list schedule lays them out, to
    the same sums."""
    e = _estimate(tp=2, pp=4, vpp=2, schedule="interleaved")
    monkeypatch.setattr(T, "MAX_OPERATIONS", int(e.details["micro_batches_per_step"]) * 8 * 2 // 3 + 1)
    tl = T.build_timeline(e)
    assert tl.micro_batch_group == 3
    assert max(s.end_s for s in tl.slices) == pytest.approx(e.step_time_s, rel=1e-9)
    for term in TIME_TERMS:
        assert tl.by_category().get(term, 0.0) == pytest.approx(e.time_breakdown_s[term], rel=1e-9, abs=1e-12)


def test_very_many_micro_batches_are_grouped_and_say_so(monkeypatch):
    monkeypatch.setattr(T, "MAX_OPERATIONS", 100)      # 16 micro-batches x 4 ranks x (F, B) = 128
    e = _estimate(tp=2, pp=4)
    tl = T.build_timeline(e)
    assert tl.micro_batch_group == 2 and any("groups of 2" in n for n in tl.notes)
    assert any(s.name == "F0-1" for s in tl.slices)
    assert max(s.end_s for s in tl.slices) == pytest.approx(e.step_time_s, rel=1e-9)
    for term in TIME_TERMS:
        assert tl.by_category().get(term, 0.0) == pytest.approx(e.time_breakdown_s[term], rel=1e-9, abs=1e-12)


def test_timeline_figure_draws_one_band_per_rank_with_a_legend(laid_out):
    for name in ("1f1b", "interleaved", "pp1-zero1"):
        _, tl = laid_out[name]
        fig = timeline_figure(tl)
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) == tl.ranks
        if tl.ranks > 1:
            assert labels[tl.pace_rank].startswith("★")
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "forward" in legend and "optimizer step" in legend
        assert ax.get_xlim()[1] == pytest.approx(tl.step_time_s * 1e3)
