"""Prediction intervals from calibration residuals per hardware generation."""
import json

import numpy as np
import pytest

from paraplan.costmodels import intervals as I
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def test_quantile_interval_is_exp_of_residual_quantiles():
    r = np.log(np.linspace(0.8, 1.2, 101))
    lo, hi = I.quantile_interval(r, 0.9)
    assert lo == pytest.approx(np.exp(np.quantile(r, 0.05))) and hi == pytest.approx(np.exp(np.quantile(r, 0.95)))
    assert 0.8 < lo < 0.85 and 1.15 < hi < 1.2


def test_generation_with_too_few_rows_or_one_source_is_pooled_and_says_so():
    res = {"A100": [("a", 0.0), ("b", 0.1), ("d", 0.05)] * 4, "Blackwell": [("c", -0.2)] * 18}
    iv = I.fit_intervals(res)
    assert not iv["A100"].pooled and iv["A100"].rows == 12
    assert iv["Blackwell"].pooled and iv["Blackwell"].rows == 30     # one source: all rows pooled
    assert "pooled" in iv["Blackwell"].basis()
    assert iv["Blackwell"].basis().startswith("30 calibration rows of all generations")   # not "of Blackwell"


def test_a_generation_of_two_sources_is_pooled():
    """Two sources cannot say how far a third lies: the generation borrows every generation's rows."""
    res = {"H100-class": [("a", 0.0), ("b", 0.05)] * 6, "A100": [("c", -0.2), ("d", 0.2), ("e", 0.0)] * 4}
    assert I.fit_intervals(res)["H100-class"].pooled and not I.fit_intervals(res)["A100"].pooled


def test_weighted_quantiles_make_every_source_count_the_same():
    # 100 rows of source "big" at 0.0, 2 rows of "small" at 1.0: unweighted, "small" is 2 % of the
    # mass and the 95 % quantile sits at 0; weighted, it is half the mass and the quantile rises.
    sources = ["big"] * 100 + ["small"] * 2
    r = [0.0] * 100 + [1.0] * 2
    w = I.source_weights(sources)
    assert w[:100].sum() == pytest.approx(1.0) and w[100:].sum() == pytest.approx(1.0)
    assert I.quantile_interval(r, 0.9)[1] == pytest.approx(1.0)
    assert I.quantile_interval(r, 0.9, w)[1] > np.exp(0.9)


def _shifted_sources(shifts, n=40, seed=3):
    rng = np.random.default_rng(seed)
    return {"A100": [(f"s{i}", float(x)) for i, shift in enumerate(shifts)
                     for x in rng.normal(shift, 0.05, n)]}


def test_quantile_level_widens_only_when_held_out_sources_fall_outside():
    same = _shifted_sources([0.0, 0.0, 0.0, 0.0])
    assert I.calibrated_quantile_level(same) <= 0.92
    shifted = _shifted_sources([0.0, 0.12, -0.1, 0.05])
    q = I.calibrated_quantile_level(shifted)
    assert q > 0.92
    assert I.held_out_coverage(shifted, q) >= 0.9 > I.held_out_coverage(shifted, 0.90)
    iv = I.fit_intervals(shifted)["A100"]
    assert iv.quantile_level == q and iv.low < np.exp(-0.1) and iv.high > np.exp(0.12)


def test_two_sources_keep_the_nominal_level():
    two = _shifted_sources([0.0, 0.3])
    assert I.calibrated_quantile_level(two) == 0.9


def test_a_generation_without_rows_gets_the_pooled_interval():
    iv = I.fit_intervals(_shifted_sources([0.0, 0.1, -0.1]), generations=["V100"])["V100"]
    assert iv.pooled and iv.rows == 120


def _est(cluster):
    return estimate(load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster(cluster, 8),
                    Plan(dp=8, zero=1, recompute="full"))


def test_estimates_carry_the_interval_of_their_generation():
    e = _est("dgx-a100-80g")
    iv = I.interval_for("a100-80g")
    assert iv is not None and iv.generation == "A100"
    lo, hi = e.prediction_interval["tokens_per_s"]
    w = 1 + I.widening_k() * e.prediction_interval["evidence_distance"]     # widened with the evidence distance
    assert lo == pytest.approx(e.tokens_per_s * iv.low ** w, rel=1e-3)
    assert hi == pytest.approx(e.tokens_per_s * iv.high ** w, rel=1e-3)
    s_lo, s_hi = e.prediction_interval["step_time_s"]
    assert s_lo == pytest.approx(e.step_time_s / iv.high ** w, rel=1e-3)
    assert s_hi == pytest.approx(e.step_time_s / iv.low ** w, rel=1e-3)
    assert "A100" in e.prediction_interval["basis"]
    assert json.loads(json.dumps(e.to_dict()))["prediction_interval"]["level"] == 0.9


def test_hardware_without_calibration_says_so():
    e = _est("mi300x-x8")
    assert "tokens_per_s" not in e.prediction_interval
    assert "no calibration data for MI300X" in e.prediction_interval["basis"]


def test_interval_is_printed(capsys):
    from paraplan.cli import main
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
                 "--global-batch", "64", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "90% interval" in out and "tokens/s per GPU" in out and "H100-class" in out


def test_every_accelerator_preset_has_a_generation():
    from paraplan.hardware.catalog import preset_names
    assert set(preset_names("accelerators")) <= set(I.GENERATION)


def test_whatif_throughput_figure_draws_the_band_only_where_calibrated():
    import pandas as pd
    from paraplan.reports.figures import throughput_figure
    nan = float("nan")
    data = pd.DataFrame({"series": ["h100", "h100", "mi300x", "mi300x"], "x": [1, 2, 1, 2],
                         "x_label": ["1", "2", "1", "2"], "tokens_per_s": [10.0, 20.0, 9.0, 18.0],
                         "tokens_per_s_lo90": [9.0, 18.0, nan, nan], "tokens_per_s_hi90": [11.0, 22.0, nan, nan],
                         "mfu": [0.5, 0.5, 0.4, 0.4], "feasible": [True] * 4, "plan": ["a"] * 4})
    fig = throughput_figure(data, "t", "x", "cluster")
    bands = [c for c in fig.axes[0].collections if c.get_gid() == "interval90"]
    assert len(bands) == 1                       # h100 only: mi300x has no calibration data
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "90 % prediction interval" in labels


def test_moe_rows_form_their_own_regime_even_from_one_source():
    res = {"H100-class": [("a", 0.0), ("b", 0.05), ("d", 0.02)] * 4, I.MOE_REGIME: [("c", -0.8), ("c", -0.3)] * 4}
    iv = I.fit_intervals(res)
    moe = iv[I.MOE_REGIME]
    assert not moe.pooled and moe.rows == 8 and "MoE models (all generations)" in moe.basis()
    assert moe.low < 0.5 < iv["H100-class"].low       # the MoE rows' spread, not the dense rows'
    few = I.fit_intervals({"H100-class": res["H100-class"], I.MOE_REGIME: res[I.MOE_REGIME][:7]})
    assert few[I.MOE_REGIME].pooled                     # under MIN_ROWS: pooled, and says so


def test_moe_estimate_takes_the_moe_interval_when_one_is_stored(monkeypatch):
    stored = {"level": 0.9, "generations": {
        "H100-class": {"low": 0.9, "high": 1.1, "rows": 20, "sources": ["a", "b"], "pooled": False},
        I.MOE_REGIME: {"low": 0.4, "high": 1.2, "rows": 9, "sources": ["c"], "pooled": False}}}
    monkeypatch.setattr(I, "_stored", lambda: stored)
    assert I.interval_for("h100-sxm").low == 0.9
    assert I.interval_for("h100-sxm", moe=True).low == 0.4
    assert I.interval_for("mi300x", moe=True) is None          # no generation: no interval at all
    del stored["generations"][I.MOE_REGIME]
    assert I.interval_for("h100-sxm", moe=True).low == 0.9      # none stored: the generation's


def _ev(**kw):
    base = dict(source="s", generation="H100-class", seq_len=4096, gpus=64, params=8e9, moe=False,
                engine="megatron", fp8=False, pp=1, cp=1)
    return I.Evidence(**{**base, **kw})


def test_evidence_distance_counts_doublings_and_mismatches():
    rows = [_ev()]
    assert I.evidence_distance(_ev(), rows) == 0.0
    assert I.evidence_distance(_ev(seq_len=8192), rows) == pytest.approx(1.0)       # one doubling of the sequence
    assert I.evidence_distance(_ev(gpus=256), rows) == pytest.approx(1.0)           # 4x the GPUs
    assert I.evidence_distance(_ev(engine="deepspeed"), rows) == pytest.approx(0.5)
    assert I.evidence_distance(_ev(moe=True, fp8=True), rows) == pytest.approx(1.5)
    assert I.evidence_distance(_ev(seq_len=8192), rows + [_ev(seq_len=8192, source="t")]) == 0.0   # the nearest row


def test_held_out_distance_ignores_the_rows_own_source():
    rows = [_ev(source="a"), _ev(source="a", seq_len=8192), _ev(source="b", seq_len=16384)]
    d = I.held_out_distances(rows)
    assert list(d) == pytest.approx([2.0, 1.0, 1.0])
    held = I.held_out_distances(rows, exclude="b")      # a's rows: no other source left; b's row: a's rows
    assert np.isinf(held[:2]).all() and held[2] == pytest.approx(1.0)


def test_extrapolation_notes_say_what_lies_beyond_the_rows():
    rows = [_ev(seq_len=2048), _ev(seq_len=16384, gpus=512)]
    assert I.extrapolation_notes(_ev(), rows) == []
    notes = I.extrapolation_notes(_ev(seq_len=131072, moe=True), rows)
    assert "extrapolating: sequence 131072, H100-class calibration rows reach 16384" in notes
    assert any("MoE" in n for n in notes)
    assert I.extrapolation_notes(_ev(generation="MI300X"), rows)[0] == "extrapolating: no calibration row on MI300X"


def test_expert_parallelism_is_evidence_for_moe_plans():
    """An MoE plan's expert-parallel degree counts like the pipeline depth (4x = one unit) and is said where it
    lies outside the MoE rows' range; a dense plan (ep 1 against dense rows at ep 1) is unaffected."""
    rows = [_ev(), _ev(moe=True, ep=8), _ev(moe=True, ep=32)]
    assert I.evidence_distance(_ev(moe=True, ep=8), rows) == 0.0
    assert I.evidence_distance(_ev(moe=True, ep=2), rows) == pytest.approx(1.0)       # log2(8/2) / 2
    assert I.evidence_distance(_ev(), rows) == 0.0
    assert "extrapolating: expert parallelism 1, H100-class calibration rows of MoE models start at 8" \
        in I.extrapolation_notes(_ev(moe=True, ep=1), rows)
    assert "extrapolating: expert parallelism 128, H100-class calibration rows of MoE models reach 32" \
        in I.extrapolation_notes(_ev(moe=True, ep=128), rows)
    assert not any("expert parallelism" in n for n in I.extrapolation_notes(_ev(moe=True, ep=16), rows))


def test_an_moe_estimate_at_ep_1_is_further_from_the_evidence_than_at_the_rows_ep():
    """Qwen3-30B-A3B on 16 H100 at ep 16 (a published layout's degree) and at ep 1: the stored MoE rows run
    ep 8-64, so ep 1 is farther, says so, and its interval is wider."""
    model, job, cluster = load_model("qwen3-30b-a3b"), TrainingJob(4096, 512), load_cluster("dgx-h100", 16)
    at = {ep: estimate(model, job, cluster, Plan(dp=16, ep=ep, zero=1, dtype="fp8")).prediction_interval
          for ep in (16, 1)}
    assert at[1]["evidence_distance"] > at[16]["evidence_distance"]
    assert any(n.startswith("extrapolating: expert parallelism 1,") for n in at[1]["extrapolating"])
    assert not any("expert parallelism" in n for n in at[16]["extrapolating"])
    width = lambda iv: iv["mfu"][1] / iv["mfu"][0]        # noqa: E731
    if I.widening_k() > 0:
        assert width(at[1]) > width(at[16])


def test_interval_widens_away_from_the_evidence():
    """The same model and GPUs at 4k and at 128k tokens: the long sequence lies far from every calibration
    row, its interval is wider (as a share of the prediction) and it says so."""
    if I.widening_k() <= 0:
        pytest.skip("the stored widening slope is 0")
    near = estimate(load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 8),
                    Plan(dp=8, zero=1, recompute="full")).prediction_interval
    far = estimate(load_model("llama3-8b"), TrainingJob(131072, 8), load_cluster("dgx-h100", 8),
                   Plan(dp=1, cp=8, zero=1, recompute="full")).prediction_interval
    width = lambda iv: iv["mfu"][1] / iv["mfu"][0]        # noqa: E731
    assert far["evidence_distance"] > near["evidence_distance"] and width(far) > width(near)
    assert any(n.startswith("extrapolating: sequence 131072") for n in far["extrapolating"])


def test_stored_interval_holds_leave_one_source_out():
    """The stored fit says how it was fitted and what it reached: >= 88 % leave-one-source-out coverage
    with a median half-width <= 25 % (benchmarks/accuracy.py --write-intervals)."""
    stored = json.loads(I.INTERVALS_JSON.read_text())
    w = stored["widening"]
    assert "how" in w and "how" in stored["distance"] and w["loso_coverage_pct"] >= 88.0
    assert w["loso_median_half_width_pct"] <= 25.0
    assert len(stored["evidence"]["rows"]) >= 100 and all(len(r) == len(I.EVIDENCE_COLUMNS) for r in stored["evidence"]["rows"])
