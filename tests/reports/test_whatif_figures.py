"""The data behind each what-if figure, and that each figure draws exactly those numbers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from paraplan.costmodels.estimate import MEMORY_TERMS, TIME_TERMS
from paraplan.planner.search import search
from paraplan.planner.space import SpaceOptions
from paraplan.reports import WhatIfResult, whatif
from paraplan.reports.data import pareto_flags

GIB = 2**30
PRICE, TOKENS = 2.5, 1e12


@pytest.fixture(scope="module")
def scaling():
    """Llama 3 70B without offload: 8 GPUs cannot hold it, 16..64 can (a gap in the curve)."""
    return whatif("llama3-70b", "dgx-h100", seq_len=4096, global_batch=128, sweep="gpus=8..64",
                  allow_offload=False, price_per_gpu_hour=PRICE, train_tokens=TOKENS)


@pytest.fixture(scope="module")
def hbm_offload():
    """Two sweeps, no GPU sweep: HBM x offload on one node."""
    return whatif("llama3-70b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64,
                  sweep=["hbm=x0.5,x1,x2", "offload=none,auto"])


def _patches(fig, prefix):
    out = {}
    for ax in fig.axes:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if gid.startswith(prefix):
                out.setdefault(gid[len(prefix):], []).append(p)
    return out


def _lines(fig, gid):
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]


def test_api_returns_table_and_figures(scaling):
    assert isinstance(scaling, WhatIfResult)
    df = scaling.table
    assert list(df["gpus"]) == [8, 16, 32, 64]
    assert list(df["feasible"]) == [False, True, True, True]
    for col in ("tp", "pp", "dp", "cp", "zero", "recompute", "offload", "step_time_s", "tokens_per_s", "mfu",
                "mem_total_gib", "feasible", *(f"time_{k}_s" for k in TIME_TERMS),
                *(f"mem_{k}_gib" for k in MEMORY_TERMS)):
        assert col in df
    assert "GPU memory" in df.loc[0, "reason"]
    assert set(scaling.figures) >= {"scaling", "breakdown", "memory", "heatmap", "pareto", "cost"}
    assert "throughput" in scaling.skipped


def test_table_equals_the_planner(scaling):
    from paraplan.hardware.catalog import load_cluster
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    row = scaling.table.iloc[2]
    r = search(load_model("llama3-70b"), TrainingJob(4096, 128), load_cluster("dgx-h100", 32),
               options=SpaceOptions(allow_offload=False), top=1)
    assert row["step_time_s"] == pytest.approx(r.best.step_time_s)
    assert (row["tp"], row["pp"], row["dp"], row["micro_batch"]) == (r.best.plan.tp, r.best.plan.pp, r.best.plan.dp,
                                                                     r.best.plan.micro_batch)


def test_scaling_curve_ideal_is_first_fitting_point_times_gpu_ratio(scaling):
    d = scaling.data["scaling"]
    df = scaling.table
    first = df[df["feasible"]].iloc[0]
    assert first["gpus"] == 16
    np.testing.assert_allclose(d["ideal_tokens_per_s"], first["tokens_per_s"] * d["gpus"] / 16)
    np.testing.assert_allclose(d["tokens_per_s"].iloc[1:], df["tokens_per_s"].iloc[1:])
    assert np.isnan(d["tokens_per_s"].iloc[0])           # 8 GPUs: no plan, a gap, not a zero
    np.testing.assert_allclose(d["mfu"].iloc[1:], df["mfu"].iloc[1:])
    fig = scaling.figures["scaling"]
    (ideal,) = _lines(fig, "ideal")
    np.testing.assert_allclose(ideal.get_ydata(), d["ideal_tokens_per_s"])
    (tokens,) = _lines(fig, "tokens")
    np.testing.assert_allclose(np.asarray(tokens.get_ydata(), float)[1:], df["tokens_per_s"].iloc[1:])
    (mfu,) = _lines(fig, "mfu")
    np.testing.assert_allclose(np.asarray(mfu.get_ydata(), float)[1:], 100 * df["mfu"].iloc[1:])


def test_breakdown_bars_sum_to_step_time(scaling, hbm_offload):
    for r in (scaling, hbm_offload):
        d = r.data["breakdown"]
        terms = d[list(TIME_TERMS)].sum(axis=1, min_count=1)
        np.testing.assert_allclose(terms, d["step_time_s"], rtol=1e-12)
        bars = _patches(r.figures["breakdown"], "time:")
        heights = np.zeros(len(d))
        for term, patches in bars.items():
            assert len(patches) == len(d)
            heights += [p.get_height() for p in patches]
            for p, v in zip(patches, d[term].fillna(0)):   # each segment is that term
                assert p.get_height() == pytest.approx(v)
        ok = d["step_time_s"].notna()
        np.testing.assert_allclose(heights[ok], d["step_time_s"][ok], rtol=1e-12)
        shares = _patches(r.figures["breakdown"], "share:")
        total = sum(np.array([p.get_height() for p in ps]) for ps in shares.values())
        np.testing.assert_allclose(total[ok], 100, rtol=1e-9)
        for pr, (_, row) in zip(r.points, d.iterrows()):   # and equals the estimate itself
            if pr.estimate is not None:
                assert row["step_time_s"] == pr.estimate.step_time_s


def test_memory_bars_sum_to_total_against_hbm(scaling, hbm_offload):
    for r in (scaling, hbm_offload):
        d = r.data["memory"]
        ok = d["total"].notna()
        np.testing.assert_allclose(d[list(MEMORY_TERMS)].sum(axis=1)[ok], d["total"][ok], rtol=1e-12)
        heights = sum(np.array([p.get_height() for p in ps]) for ps in _patches(r.figures["memory"], "mem:").values())
        np.testing.assert_allclose(heights[ok], d["total"][ok], rtol=1e-12)
        for pr, (_, row) in zip(r.points, d.iterrows()):
            assert row["hbm_gib"] == pr.point.cluster.accelerator.memory_bytes / GIB
            if pr.feasible:
                assert row["total"] <= row["hbm_gib"]
    d = hbm_offload.data["memory"]
    assert list(d["hbm_gib"]) == [40, 40, 80, 80, 160, 160]
    hbm = [c for ax in hbm_offload.figures["memory"].axes for c in ax.collections if c.get_gid() == "hbm"]
    segs = hbm[0].get_segments()
    assert [s[0][1] for s in segs] == list(d["hbm_gib"])


def test_heatmap_cells_equal_search_restricted_to_that_tp_pp(hbm_offload):
    from paraplan.reports.sweep import base_point
    d = hbm_offload.data["heatmap"]
    point = base_point(hbm_offload.scenario)
    assert point.cluster.num_gpus == 8
    assert set(d["status"]) >= {"fits", "no legal layout"}
    for _, cell in d.iterrows():
        # the fastest plan (search's best is the simplest of those tied with it) under the report's memory margin
        r = search(point.model, point.job, point.cluster, top=1, max_memory_fraction=hbm_offload.scenario.max_memory_fraction,
                   options=SpaceOptions(fixed={"tp": int(cell["tp"]), "pp": int(cell["pp"])}))
        if r.best is None:
            assert cell["status"] == ("no legal layout" if r.candidates_evaluated == 0 else "does not fit")
            assert np.isnan(cell["tokens_per_s"])
        else:
            assert cell["status"] == "fits"
            assert cell["tokens_per_s"] == pytest.approx(r.fastest.tokens_per_s, rel=1e-12)
    best = d[d["best"]].iloc[0]
    overall = search(point.model, point.job, point.cluster, top=1,
                     max_memory_fraction=hbm_offload.scenario.max_memory_fraction)
    assert best["tokens_per_s"] == pytest.approx(overall.fastest.tokens_per_s)
    # the picture: each cell's colour value is that number
    (img,) = [im for ax in hbm_offload.figures["heatmap"].axes for im in ax.get_images()]
    arr = img.get_array()
    tps, pps = sorted(d["tp"].unique()), sorted(d["pp"].unique())
    for _, cell in d.iterrows():
        v = arr[tps.index(cell["tp"]), pps.index(cell["pp"])]
        assert (v is np.ma.masked) if np.isnan(cell["tokens_per_s"]) else v == pytest.approx(cell["tokens_per_s"])


def test_heatmap_marks_cells_that_do_not_fit():
    r = whatif("llama3-70b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64, sweep="seq_len=4k",
               allow_offload=False)
    d = r.data["heatmap"]
    assert "does not fit" in set(d["status"]) and not d["best"].any()
    hatched = [p for ax in r.figures["heatmap"].axes for p in ax.patches if p.get_hatch()]
    assert len(hatched) == (d["status"] == "does not fit").sum()
    assert "pareto" in r.skipped and "cost" in r.skipped


def test_pareto_points_are_non_dominated(scaling):
    d = scaling.data["pareto"]
    assert len(d) == 3
    obj = d[["time_h", "gpu_hours", "memory_gib"]].to_numpy()
    for i, on_front in enumerate(d["pareto"]):
        dominated = np.any(np.all(obj <= obj[i], axis=1) & np.any(obj < obj[i], axis=1))
        assert on_front == (not dominated)
    df = scaling.table[scaling.table["feasible"]].reset_index(drop=True)
    np.testing.assert_allclose(d["time_h"], TOKENS / df["tokens_per_s"] / 3600)
    np.testing.assert_allclose(d["gpu_hours"], df["gpus"] * TOKENS / df["tokens_per_s"] / 3600)
    np.testing.assert_allclose(d["usd"], d["gpu_hours"] * PRICE)
    (pts,) = [c for ax in scaling.figures["pareto"].axes for c in ax.collections if c.get_gid() == "points"]
    np.testing.assert_allclose(pts.get_offsets()[:, 1], d["gpu_hours"])
    np.testing.assert_allclose(pts.get_offsets()[:, 0], d["time_h"] / 24)   # plotted in days


def test_pareto_flags_small_cases():
    assert list(pareto_flags([[1, 3], [2, 2], [3, 1], [3, 3], [2, 2]])) == [True, True, True, False, True]
    assert list(pareto_flags([[1, 1, 1], [1, 1, 2]])) == [True, False]


def test_cost_to_train(scaling):
    d = scaling.data["cost"]
    df = scaling.table[scaling.table["feasible"]].reset_index(drop=True)
    np.testing.assert_allclose(d["days"], TOKENS / df["tokens_per_s"] / 86400)
    np.testing.assert_allclose(d["usd"], df["gpus"] * TOKENS / df["tokens_per_s"] / 3600 * PRICE)
    np.testing.assert_allclose(df["train_usd"], d["usd"])
    bars = {gid: [p.get_height() for p in ps] for gid, ps in _patches(scaling.figures["cost"], "").items()}
    np.testing.assert_allclose(bars["days"], d["days"])
    np.testing.assert_allclose(bars["cost"], d["usd"])


def test_throughput_figure_and_skips(hbm_offload):
    r = hbm_offload
    assert "scaling" in r.skipped and "gpus sweep" in r.skipped["scaling"]
    assert "cost" in r.skipped and "--train-tokens" in r.skipped["cost"]
    d = r.data["throughput"]
    assert list(d["series"].unique()) == ["offload none", "offload auto"]
    ys = [np.asarray(line.get_ydata(), float) for line in _lines(r.figures["throughput"], "tokens")]
    df = r.table
    for series, y in zip(("none", "auto"), ys):
        expect = df[df["sweep_offload"] == series]
        assert list(expect["sweep_hbm"]) == [40, 80, 160]
        np.testing.assert_allclose(y, np.where(expect["feasible"], expect["tokens_per_s"], np.nan))
    # at 40 GiB nothing fits without offload; letting the planner offload makes it fit
    small = df[df["sweep_hbm"] == 40].set_index("sweep_offload")
    assert not small.loc["none", "feasible"] and small.loc["auto", "feasible"]
    assert small.loc["auto", "offload"] != "none"


def test_fixed_plan_is_re_estimated_not_re_planned():
    r = whatif("llama3-8b", "dgx-h100", seq_len=4096, global_batch=64, sweep="gpus=8,16,24",
               plan={"tp": 8, "pp": 1, "zero": 1, "recompute": "selective"}, heatmap=False)
    df = r.table
    assert list(df["tp"][:2]) == [8, 8] and list(df["dp"][:2]) == [1, 2]
    assert df.loc[2, "feasible"] == False and "plan does not apply" in df.loc[2, "reason"]  # noqa: E712
    from paraplan.costmodels.estimate import estimate
    from paraplan.hardware.catalog import load_cluster
    from paraplan.plan import Plan
    from paraplan.workloads.presets import load_model
    from paraplan.workloads.transformer import TrainingJob
    e = estimate(load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster("dgx-h100", 16),
                 Plan(tp=8, zero=1, recompute="selective"))
    assert df.loc[1, "step_time_s"] == e.step_time_s


# --- the defects a tester found in the figures, each held by a check on the drawn figure ---------

def _texts(fig, gid):
    return [t for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


def _throughput_frame(feasible):
    """Three series (more than the two the plan labels are drawn for) over two clusters."""
    import pandas as pd
    rows = []
    for i, series in enumerate(("4k", "8k", "16k")):
        for j, x in enumerate(("dgx-h100", "dgx-h200")):
            ok = feasible[i][j]
            rows.append({"series": series, "x": x, "x_label": x, "feasible": ok, "plan": "tp2 pp1" if ok else "",
                         "tokens_per_s": 1e5 - 1e4 * i + 5e3 * j if ok else np.nan,
                         "mfu": 0.55 + 0.01 * i + 0.05 * j if ok else np.nan})
    return pd.DataFrame(rows)


def test_throughput_marks_no_fit_only_where_nothing_fits():
    from paraplan.reports.figures import throughput_figure
    fig = throughput_figure(_throughput_frame([[True, True]] * 3), "t", "cluster", "sequence length")
    assert _texts(fig, "no-fit") == []                       # was: every point of >2 series said so
    fig = throughput_figure(_throughput_frame([[False, True], [True, True], [True, False]]), "t", "cluster")
    assert len(_texts(fig, "no-fit")) == 2 and _texts(fig, "plan") == []   # plans only with <= 2 series
    mfu_ax = next(ax for ax in fig.axes if any(line.get_gid() == "mfu" for line in ax.get_lines()))
    tok_ax = next(ax for ax in fig.axes if any(line.get_gid() == "tokens" for line in ax.get_lines()))
    assert mfu_ax is not tok_ax                              # MFU on its own panel, not over the tokens/s lines
    lo, hi = mfu_ax.get_ylim()
    assert 40 < lo and hi < 75                               # zoomed, so 1-point MFU gaps stay apart


def test_every_panel_has_an_x_label_and_no_title_is_clipped(scaling, hbm_offload):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    for r in (scaling, hbm_offload):
        for name, fig in r.figures.items():
            FigureCanvasAgg(fig)
            renderer = fig.canvas.get_renderer()
            fig.draw(renderer)
            box = fig.bbox
            for ax in fig.axes:
                if ax.get_label() == "<colorbar>":
                    continue
                assert ax.get_xlabel(), f"{name}: a panel without an x label"
            titles = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle else [])
            for t in titles:
                if t.get_text():
                    e = t.get_window_extent(renderer)
                    assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1, f"{name}: title clipped: {t.get_text()!r}"


def test_scaling_note_explains_above_linear():
    import pandas as pd
    from paraplan.reports.figures import scaling_note
    g = pd.DataFrame({"gpus": [8, 16], "tokens_per_s": [1e4, 2.6e4], "ideal_tokens_per_s": [1e4, 2e4],
                      "mfu": [0.40, 0.52], "scaling_efficiency": [1.0, 1.3], "feasible": [True, True],
                      "plan": ["tp1 pp1 dp4 cp2 (offload)", "tp2 pp1 dp8"]})
    note = scaling_note(g)
    assert "130% of linear scaling from 8 GPUs" in note and "above 100%" in note and "52% vs 40%" in note
    g.loc[1, "scaling_efficiency"] = 0.9
    assert "above 100%" not in scaling_note(g)


def test_efficiency_curves_are_data_and_merged_when_identical(hbm_offload):
    d = hbm_offload.data["efficiency"]
    assert set(d.columns) >= {"accelerator", "n", "gemm_percent_of_peak", "attention_percent_of_peak"}
    assert d["gemm_percent_of_peak"].between(0, 100).all()
    (gemm,) = _lines(hbm_offload.figures["efficiency"], "gemm")
    np.testing.assert_allclose(gemm.get_ydata(), d["gemm_percent_of_peak"])
    from paraplan.costmodels.efficiency import analytical_curves
    from paraplan.hardware.catalog import load_cluster
    from paraplan.reports.data import efficiency_data
    h100, h200 = (load_cluster(s, 8).accelerator for s in ("dgx-h100", "dgx-h200"))
    a100 = load_cluster("dgx-a100-80g", 8).accelerator
    both = efficiency_data({a.name: analytical_curves(a) for a in (h100, h200, a100)})
    assert list(dict.fromkeys(both["accelerator"])) == [f"{h100.name}, {h200.name}", a100.name]


def test_a_name_the_font_cannot_draw_spills_no_warning(tmp_path, capsys):
    """A model named in fullwidth letters or CJK (a model file's ``name``) is drawn as boxes in the
    figures' titles; matplotlib's "Glyph ... missing from font(s)" UserWarning, printed six times per
    report by a fuzzed `whatif`, stays off the terminal."""
    import warnings

    import yaml

    from paraplan.cli import main
    doc = {"name": "Ｌｌａｍａ８ 名前", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn_hidden": 1024,
           "vocab": 32000, "activation": "swiglu", "norm": "rmsnorm", "max_positions": 4096}
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(["whatif", "--model", str(model), "--cluster", "dgx-h100", "--gpus", "8", "--sweep", "gpus=8,16",
                   "--no-heatmap", "--quiet", "--out", str(tmp_path / "report")])
    assert rc == 0
    assert [str(w.message) for w in caught] == []
    assert "Warning" not in capsys.readouterr().err
