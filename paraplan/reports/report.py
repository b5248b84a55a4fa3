"""What-if reports: run a sweep, build the figures that make sense for it, write them atomically.

Python API (notebooks)::

    from paraplan.reports import whatif
    r = whatif("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=512,
               sweep={"cluster": ["dgx-h100", "dgx-h200"]}, price_per_gpu_hour=2.5, train_tokens=15e12)
    r.table                 # pandas DataFrame, one row per point
    r.figures["breakdown"]  # matplotlib Figure
    r.figures["timeline"]   # the fastest point's predicted step as a Gantt chart
    r.data["breakdown"]     # the numbers that figure draws
    r.skipped               # figures not drawn for this sweep, and why
    r.write("report-dir")   # PNG + SVG figures, points.csv, report.html (atomic)
"""
from __future__ import annotations

import io
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import yaml

from paraplan.costmodels.efficiency import analytical_curves
from paraplan.errors import ConfigError
from paraplan.io import check_publish_dir, publish_folder
from paraplan.reports import data as D
from paraplan.reports import figures as F
from paraplan.reports.html import FIGURE_ORDER, render_html
from paraplan.reports.timeline import build_timeline
from paraplan.reports.sweep import (LABELS, Point, PointResult, Scenario, base_point, load_scenario,
                                    parse_sweep, resolve_points, run_points, scenario_from_mapping,
                                    with_specs_relative_to)



@dataclass
class WhatIfResult:
    """A finished sweep: points, the table, the figures, the data behind each figure."""
    scenario: Scenario
    points: list[PointResult]
    table: pd.DataFrame
    figures: dict[str, Any] = field(default_factory=dict)
    data: dict[str, pd.DataFrame] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    heatmap_point: Point | None = None
    timeline_point: Point | None = None      # the point the timeline figure lays out (the fastest that fits)
    seconds: float = 0.0

    def write(self, out_dir) -> Path:
        """Write the report folder atomically (see ``write_report``)."""
        return write_report(self, out_dir)


def _scenario_from_kwargs(model, cluster, scenario, sweep, **kw) -> Scenario:
    if scenario is not None:
        if isinstance(scenario, Scenario):
            return scenario
        if isinstance(scenario, Mapping):
            return scenario_from_mapping(scenario)
        return load_scenario(scenario)
    if model is None or cluster is None:
        raise ConfigError("model/cluster", "both are required (or a scenario)")
    if isinstance(sweep, str):
        sweep = [sweep]
    if isinstance(sweep, Mapping):
        sweep = [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in sweep.items()]
    return Scenario(model=model, cluster=cluster, sweeps=tuple(parse_sweep(s) for s in (sweep or ())), **kw)


def whatif(model: str | None = None, cluster: str | None = None, *, sweep=None, gpus: int | None = None,
           seq_len: int | None = None, global_batch: int | None = None, fix: Mapping | None = None,
           plan: Mapping | None = None, allow_offload: bool = True, max_memory_fraction: float = 1.0,
           price_per_gpu_hour: float | None = None, train_tokens: float | None = None, heatmap: bool = True,
           scenario=None, progress: bool = False) -> WhatIfResult:
    """Run a what-if sweep and build its figures.

    Parameters
    ----------
    model, cluster : preset names or files (as ``paraplan plan``).
    sweep : ``"gpus=64..4096"``, a list of one or two such strings, or a mapping
        ``{"cluster": ["dgx-h100", "dgx-h200"]}`` (values as lists or in the string syntax).
    gpus, seq_len, global_batch : the base scenario.
    fix : axes pinned for the search (``{"tp": 8}``); plan : a whole plan (Plan fields), re-estimated
        at each point instead of re-planned.
    price_per_gpu_hour, train_tokens : for the Pareto and cost-to-train figures.
    scenario : a Scenario, a mapping or a YAML path instead of the arguments above.

    Returns
    -------
    WhatIfResult with ``table`` (DataFrame), ``figures`` and ``data`` (dicts by figure name) and
    ``skipped`` (figure name -> why it was not drawn).
    """
    sc = _scenario_from_kwargs(model, cluster, scenario, sweep, gpus=gpus, seq_len=seq_len,
                               global_batch=global_batch, fixed=dict(fix or {}),
                               plan=dict(plan) if plan is not None else None, allow_offload=allow_offload,
                               max_memory_fraction=max_memory_fraction, price_per_gpu_hour=price_per_gpu_hour,
                               train_tokens=train_tokens, heatmap=heatmap)
    t0 = time.perf_counter()
    points = resolve_points(sc)
    results = run_points(points, sc, progress=progress)
    table = D.points_table(results, sc)
    out = WhatIfResult(scenario=sc, points=results, table=table)
    build_figures(out)
    out.seconds = time.perf_counter() - t0
    return out


def _title(sc: Scenario, results, what: str) -> str:
    p = results[0].point
    fixed_vars = [v for v in ("seq_len", "global_batch", "gpus", "cluster") if v not in {s.var for s in sc.sweeps}]
    bits = {"seq_len": f"seq {p.job.seq_len}", "global_batch": f"global batch {p.job.global_batch}",
            "gpus": f"{p.cluster.num_gpus} GPUs", "cluster": p.cluster_spec}
    mode = "best plan per point" if sc.replans else "fixed plan"
    return f"{what}\n{p.model.name}, " + ", ".join(bits[v] for v in fixed_vars) + f" ({mode})"


def _other_label(sc: Scenario, var: str) -> str:
    """Label of the sweep that is not ``var`` (what the series of a two-sweep figure are), else ''."""
    return next((s.label for s in sc.sweeps if s.var != var), "")


def build_figures(r: WhatIfResult) -> None:
    """Fill ``r.figures``, ``r.data`` and ``r.skipped`` with what makes sense for the sweep."""
    sc, df = r.scenario, r.table
    swept = [s.var for s in sc.sweeps]
    xlabel = " / ".join(s.label for s in sc.sweeps)     # what the bars' labels are
    any_estimate = df["step_time_s"].notna().any()
    n_feasible = int(df["feasible"].sum())

    if "gpus" in swept:
        d = D.scaling_data(df, sc)
        if len(d):
            r.data["scaling"] = d
            r.figures["scaling"] = F.scaling_figure(d, _title(sc, r.points, "Throughput scaling"),
                                                    _other_label(sc, "gpus"))
        else:
            r.skipped["scaling"] = "no point of the GPU sweep has a plan that fits"
    else:
        r.skipped["scaling"] = "needs a gpus sweep (e.g. --sweep gpus=64..4096)"

    if swept[0] != "gpus":
        d = D.throughput_data(df, sc)
        r.data["throughput"] = d
        r.figures["throughput"] = F.throughput_figure(
            d, _title(sc, r.points, f"Throughput vs {LABELS[swept[0]]}"), sc.sweeps[0].label,
            _other_label(sc, swept[0]))
    else:
        r.skipped["throughput"] = "the scaling curve shows throughput against GPUs"

    if any_estimate:
        r.data["breakdown"] = D.breakdown_data(df)
        r.figures["breakdown"] = F.breakdown_figure(r.data["breakdown"], _title(sc, r.points, "Step time"), xlabel)
        fastest = D.fastest_point(r.points)
        if fastest is not None:
            tl = build_timeline(fastest.estimate)
            r.timeline_point = fastest.point
            r.data["timeline"] = D.timeline_data(tl)
            r.figures["timeline"] = F.timeline_figure(
                tl, f"Predicted step of the fastest point: {D.describe_point(fastest.point)}\n{tl.plan_line}")
        else:
            r.skipped["timeline"] = "no point has a plan that fits"
        r.data["memory"] = D.memory_data(df)
        r.figures["memory"] = F.memory_figure(r.data["memory"], _title(sc, r.points, "Memory per GPU"), xlabel)
    else:
        r.skipped["breakdown"] = r.skipped["memory"] = r.skipped["timeline"] = "no point has a plan (nothing fits anywhere)"

    if not sc.heatmap:
        r.skipped["heatmap"] = "turned off (--no-heatmap)"
    elif {"tp", "pp"} <= set(sc.fixed):
        r.skipped["heatmap"] = "tp and pp are both fixed"
    else:
        bp = base_point(sc)
        r.heatmap_point = bp
        d = D.heatmap_data(bp, sc)
        r.data["heatmap"] = d
        r.figures["heatmap"] = F.heatmap_figure(d, "Best predicted tokens/s per (tp, pp), best over the other axes\n"
                                              + D.describe_point(bp))

    if n_feasible >= 2:
        d = D.pareto_data(df, sc)
        r.data["pareto"] = d
        r.figures["pareto"] = F.pareto_figure(d, _title(sc, r.points, "Time vs cost vs memory"),
                                              per_train=bool(sc.train_tokens), price=sc.price_per_gpu_hour)
    else:
        r.skipped["pareto"] = f"needs at least two points with a plan that fits ({n_feasible} here)"

    if not sc.train_tokens:
        r.skipped["cost"] = "needs --train-tokens (and --price-per-gpu-hour for dollars)"
    elif n_feasible == 0:
        r.skipped["cost"] = "no point has a plan that fits"
    else:
        d = D.cost_data(df, sc)
        r.data["cost"] = d
        r.figures["cost"] = F.cost_figure(
            d, _title(sc, r.points, f"Cost to train {D.tokens(sc.train_tokens)} tokens"), price=sc.price_per_gpu_hour,
            xlabel=xlabel)

    accs = list({pr.point.cluster.accelerator.name: pr.point.cluster.accelerator for pr in r.points}.values())
    r.data["efficiency"] = D.efficiency_data({a.name: analytical_curves(a) for a in accs})
    names = ", ".join(dict.fromkeys(r.data["efficiency"]["accelerator"]))
    r.figures["efficiency"] = F.efficiency_figure(r.data["efficiency"], f"Efficiency curves — {names} (analytical)")


#: What a report owns in its ``--out`` folder; anything else there is the user's and left alone.
REPORT_ENTRIES = ("report.html", "points.csv", "scenario.yaml", "figures", "data")

#: Fixed SVG id salt and no dates: the same figure gives the same bytes in every run.
SVG_SALT = "paraplan-whatif"


def figure_bytes(fig, fmt: str) -> bytes:
    """A figure as PNG or SVG bytes, identical across runs: matplotlib salts SVG ids with a random
    uuid unless ``svg.hashsalt`` is set, and stamps a date unless the metadata drops it. A name in a
    title or label that the font has no glyph for (fullwidth letters, CJK, emoji in a model's name)
    draws as an empty box: matplotlib's "Glyph ... missing from font(s)" warning for it is dropped here
    rather than spilled on the user's terminal once per figure (the report's text and CSVs keep the name)."""
    import matplotlib
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": SVG_SALT}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else {"Software": None})
    return buf.getvalue()


def _build_report(r: WhatIfResult, folder: Path, scenario_doc: dict) -> None:
    """Every file of the report into a fresh, private folder (published whole by ``write_report``)."""
    (folder / "figures").mkdir()
    (folder / "data").mkdir()
    images = {}
    for name in FIGURE_ORDER:
        fig = r.figures.get(name)
        if fig is None:
            continue
        png = figure_bytes(fig, "png")
        (folder / "figures" / f"{name}.png").write_bytes(png)
        (folder / "figures" / f"{name}.svg").write_bytes(figure_bytes(fig, "svg"))
        images[name] = png
    for name, d in r.data.items():
        d.to_csv(folder / "data" / f"{name}.csv", index=False)
    r.table.to_csv(folder / "points.csv", index=False)
    (folder / "scenario.yaml").write_text(yaml.safe_dump(scenario_doc, sort_keys=False))
    (folder / "report.html").write_text(render_html(r, images), encoding="utf-8")


def check_out_dir(out_dir) -> None:
    """Fail before the sweep if ``--out`` cannot take the report without removing what it did not write."""
    check_publish_dir(Path(out_dir), REPORT_ENTRIES)


def write_report(r: WhatIfResult, out_dir) -> Path:
    """Write ``report.html``, ``points.csv``, ``scenario.yaml``, ``figures/*.png|svg`` and ``data/*.csv``
    into ``out_dir`` with ``paraplan.io.publish_folder``: the previous report stays complete until
    the new one is, one rename switches to it (a kill at any moment leaves one or the other, whole),
    and other files in the folder are never touched; a failure leaves things as they were."""
    # scenario.yaml names model and cluster files relative to the report folder it is read from
    doc = with_specs_relative_to(r.scenario.to_dict(), out_dir)
    return publish_folder(Path(out_dir), REPORT_ENTRIES, lambda folder: _build_report(r, folder, doc))
