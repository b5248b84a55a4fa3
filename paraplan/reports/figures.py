"""Matplotlib figures of a what-if sweep, each drawn from a DataFrame of ``reports.data`` and
readable alone (title, units, legend, annotations). Figures are built with ``Figure()`` (no
pyplot state), so they work headless (Agg) and display in notebooks.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from paraplan.costmodels.estimate import MEMORY_TERMS, TIME_TERMS
from paraplan.reports.data import si
from paraplan.reports.text import MEMORY_LABELS, TIME_LABELS

TIME_COLORS = dict(zip(TIME_TERMS, ("#4c72b0", "#8da0cb", "#b3c6e6", "#dd8452", "#e5ae38", "#64b5cd", "#c44e52", "#f2a2a4",
                                    "#55a868", "#8172b3", "#937860")))
assert len(TIME_COLORS) == len(TIME_TERMS), "one colour per time term"
MEMORY_COLORS = dict(zip(MEMORY_TERMS, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8c8c8c", "#cfcfcf")))
assert len(MEMORY_COLORS) == len(MEMORY_TERMS), "one colour per memory term"
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _si_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator
    axis.set_major_formatter(FuncFormatter(lambda x, _: si(x)))
    if axis.get_scale() == "log":
        axis.set_minor_locator(LogLocator(subs=(2, 5)))
        axis.set_minor_formatter(FuncFormatter(lambda x, _: si(x)))


def _bar_width_for(n: int) -> float:
    return min(16.0, max(6.0, (0.45 if n <= 16 else 0.22) * n + 3))


def scaling_figure(data, title: str) -> Figure:
    """Tokens/s (log-log) against GPUs with the ideal linear line; MFU on a second axis."""
    fig = _figure(8, 4.8)
    ax = fig.add_subplot()
    mfu_ax = ax.twinx()
    notes = []
    for i, (series, g) in enumerate(data.groupby("series", sort=False)):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        name = f" {series}" if series else ""
        ax.plot(g["gpus"], g["tokens_per_s"], "o-", color=color, label=f"predicted tokens/s{name}", gid="tokens")
        ax.plot(g["gpus"], g["ideal_tokens_per_s"], "--", color=color, alpha=0.55, label=f"ideal linear{name}",
                gid="ideal")
        mfu_ax.plot(g["gpus"], 100 * g["mfu"], "s:", color=color, alpha=0.8, markersize=4, label=f"MFU{name}",
                    gid="mfu")
        last = g[g["tokens_per_s"].notna()].tail(1)
        for _, r in last.iterrows():
            notes.append((color, f"{name.strip() or 'at'} {r['gpus']:.0f} GPUs: {100 * r['scaling_efficiency']:.0f}% "
                                 f"of linear, MFU {100 * r['mfu']:.0f}%, {r['plan']}"))
        for _, r in g[~g["feasible"].astype(bool)].iterrows():
            ax.annotate("no plan fits", (r["gpus"], r["ideal_tokens_per_s"]), fontsize=8, color=color,
                        ha="center", textcoords="offset points", xytext=(0, 6))
    for k, (color, note) in enumerate(reversed(notes[-3:])):
        ax.text(0.99, 0.03 + 0.055 * k, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
                color=color, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _si_axis(ax.yaxis)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("throughput (tokens/s)")
    mfu_ax.set_ylabel("MFU (%)")
    mfu_ax.set_ylim(0, 100)
    gpus = sorted(set(data["gpus"]))
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.grid(True, which="major", alpha=0.3)
    series = list(dict.fromkeys(data["series"]))
    if len(series) > 1:
        from matplotlib.lines import Line2D
        handles = [Line2D([], [], color=SERIES_COLORS[i % len(SERIES_COLORS)], linewidth=3, label=s)
                   for i, s in enumerate(series)]
        handles += [Line2D([], [], color="black", marker="o", label="predicted tokens/s"),
                    Line2D([], [], color="black", linestyle="--", alpha=0.6, label="ideal linear"),
                    Line2D([], [], color="black", linestyle=":", marker="s", markersize=4, label="MFU (right axis)")]
        ax.legend(handles=handles, fontsize=8, loc="upper left")
    else:
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = mfu_ax.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=11)
    return fig


def _seconds(v: float) -> str:
    return f"{v:,.0f} s" if v >= 100 else f"{v:.3g} s"


def breakdown_figure(data, title: str) -> Figure:
    """Stacked bars of the step-time terms per point (bar height = step time), and their shares."""
    n = len(data)
    many = n > 16
    if many:
        fig = _figure(min(16.0, 4 + 0.22 * n), 8)
        ax, share = fig.subplots(2, 1, gridspec_kw={"height_ratios": (3, 2)})
    else:
        fig = _figure(max(9.0, 2 * _bar_width_for(n) - 2), 4.8)
        ax, share = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3, 2)})
    x = np.arange(n)
    bottom = np.zeros(n)
    step = data["step_time_s"].to_numpy(float)
    share_bottom = np.zeros(n)
    for k in TIME_TERMS:
        v = data[k].fillna(0).to_numpy()
        if not v.any():
            continue
        ax.bar(x, v, bottom=bottom, color=TIME_COLORS[k], label=TIME_LABELS[k], gid=f"time:{k}")
        frac = np.where(np.isnan(step), 0, 100 * v / np.where(np.isnan(step), 1, step))
        share.bar(x, frac, bottom=share_bottom, color=TIME_COLORS[k], gid=f"share:{k}")
        bottom += v
        share_bottom += frac
    for i, r in data.iterrows():
        if np.isnan(r["step_time_s"]):
            ax.text(x[i], 0, "×" if many else "no plan\nfits", ha="center", va="bottom", fontsize=7, color="#c44e52")
        elif not many:
            ax.text(x[i], r["step_time_s"], _seconds(r["step_time_s"]) + ("" if r["feasible"] else "\n(no fit)"),
                    ha="center", va="bottom", fontsize=7)
    rot = 45 if n > 6 else 0
    for a in (ax, share):
        a.set_xticks(x, data["label"], rotation=rot, ha="right" if rot else "center", fontsize=6 if many else None)
    ax.set_ylabel("time per optimizer step (s)")
    ax.set_ylim(0, np.nanmax(np.r_[bottom, 1e-9]) * 1.15)
    share.set_ylabel("share of the step (%)")
    share.set_ylim(0, 100)
    share.set_title("shares", fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside right upper")
    fig.suptitle(title, fontsize=11)
    return fig


def memory_figure(data, title: str) -> Figure:
    """Stacked bars of per-GPU memory terms per point with each point's HBM capacity marked."""
    fig = _figure(_bar_width_for(len(data)), 4.8)
    ax = fig.add_subplot()
    x = np.arange(len(data))
    bottom = np.zeros(len(data))
    for k in MEMORY_TERMS:
        v = data[k].fillna(0).to_numpy()
        ax.bar(x, v, bottom=bottom, color=MEMORY_COLORS[k], label=MEMORY_LABELS[k], gid=f"mem:{k}")
        bottom += v
    hbm = data["hbm_gib"].to_numpy()
    if np.allclose(hbm, hbm[0]):
        ax.axhline(hbm[0], color="black", linestyle="--", linewidth=1.2, label=f"HBM per GPU ({hbm[0]:.0f} GiB)",
                   gid="hbm")
    else:
        ax.hlines(hbm, x - 0.45, x + 0.45, color="black", linestyle="--", linewidth=1.5, label="HBM per GPU", gid="hbm")
    many = len(data) > 16
    for i, r in data.iterrows():
        if np.isnan(r["total"]):
            ax.text(x[i], 0, "×" if many else "no plan\nfits", ha="center", va="bottom", fontsize=7, color="#c44e52")
        elif not many:
            ax.text(x[i], r["total"], f"{r['total']:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, data["label"], rotation=45 if len(data) > 6 else 0, ha="right" if len(data) > 6 else "center",
                  fontsize=6 if many else None)
    ax.set_ylabel("memory per GPU (GiB), peak pipeline stage")
    ax.set_ylim(0, max(np.nanmax(np.r_[bottom, 0]), np.nanmax(hbm)) * 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title, fontsize=11)
    return fig


def heatmap_figure(data, title: str) -> Figure:
    """tp x pp grid coloured by the best predicted tokens/s; infeasible cells hatched and labelled."""
    tps = sorted(data["tp"].unique())
    pps = sorted(data["pp"].unique())
    grid = np.full((len(tps), len(pps)), np.nan)
    for _, r in data.iterrows():
        grid[tps.index(r["tp"]), pps.index(r["pp"])] = r["tokens_per_s"]
    fig = _figure(max(6.0, 0.75 * len(pps) + 3), max(4.0, 0.5 * len(tps) + 2.2))
    ax = fig.add_subplot()
    ax.set_facecolor("#eeeeee")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto", origin="lower", gid="heatmap")
    fig.colorbar(im, ax=ax, label="best predicted throughput (tokens/s)")
    for _, r in data.iterrows():
        i, j = tps.index(r["tp"]), pps.index(r["pp"])
        if r["status"] == "fits":
            val = r["tokens_per_s"]
            light = val < np.nanmin(grid) + 0.6 * (np.nanmax(grid) - np.nanmin(grid))
            ax.text(j, i, si(val), ha="center", va="center", fontsize=7, color="white" if light else "black",
                    fontweight="bold" if r["best"] else "normal")
            if r["best"]:
                ax.add_patch(_cell(j, i, edgecolor="#d62728", fill=False, linewidth=2.5))
        elif r["status"] == "does not fit":
            ax.add_patch(_cell(j, i, facecolor="#f4cccc", hatch="xx", edgecolor="#c44e52", linewidth=0))
            ax.text(j, i, "OOM", ha="center", va="center", fontsize=6, color="#7f0000")
        else:
            ax.text(j, i, "–", ha="center", va="center", fontsize=8, color="#888888")
    ax.set_xticks(range(len(pps)), [str(p) for p in pps])
    ax.set_yticks(range(len(tps)), [str(t) for t in tps])
    ax.set_xlabel("pipeline-parallel degree (pp)")
    ax.set_ylabel("tensor-parallel degree (tp)")
    ax.legend(handles=[Patch(facecolor="none", edgecolor="#d62728", linewidth=2, label="best plan"),
                       Patch(facecolor="#f4cccc", hatch="xx", edgecolor="#c44e52", label="no layout fits in memory"),
                       Patch(facecolor="#eeeeee", label="– no legal layout")],
              fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14), ncol=3, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig


def _cell(j, i, **kw):
    from matplotlib.patches import Rectangle
    return Rectangle((j - 0.5, i - 0.5), 1, 1, **kw)


def _axis_scale(ax, values, axis: str) -> None:
    """Log scale when the values span more than a factor of 8, with plain tick labels."""
    from matplotlib.ticker import FuncFormatter
    v = np.asarray(values, float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    fmt = FuncFormatter(lambda x, _: si(x))
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)
    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_formatter(FuncFormatter(lambda x, _: ""))


def pareto_figure(data, title: str, *, per_train: bool, price: float | None) -> Figure:
    """Time vs GPU-hours (and dollars) with memory per GPU as colour; non-dominated points ringed."""
    fig = _figure(8.5, 5)
    ax = fig.add_subplot()
    scale = 1 / 24 if per_train else 1.0
    t = data["time_h"] * scale
    sc = ax.scatter(t, data["gpu_hours"], c=data["memory_gib"], cmap="plasma", s=45, zorder=3, gid="points")
    front = data[data["pareto"]]
    ax.scatter(front["time_h"] * scale, front["gpu_hours"], s=170, facecolors="none", edgecolors="black",
               linewidths=1.4, zorder=4, label="Pareto-optimal (time, cost, memory)", gid="front")
    front2 = _front_2d(data)
    if len(front2) > 1:
        ax.step(front2["time_h"] * scale, front2["gpu_hours"], where="post", color="black", alpha=0.4, linewidth=1,
                label="time-cost front", gid="front2d")
    for _, r in data.iterrows():
        if len(data) <= 12 or r["pareto"]:
            ax.annotate(r["label"], (r["time_h"] * scale, r["gpu_hours"]), textcoords="offset points",
                        xytext=(6, 5), fontsize=7)
    unit = "to train" if per_train else "per 1B tokens"
    ax.set_xlabel(f"wall-clock {'days' if per_train else 'hours'} {unit}")
    ax.set_ylabel(f"GPU-hours {unit}")
    _axis_scale(ax, t, "x")
    _axis_scale(ax, data["gpu_hours"], "y")
    ax.margins(0.12)
    if price:
        from matplotlib.ticker import FuncFormatter
        sec = ax.secondary_yaxis("right", functions=(lambda h: h * price, lambda d: d / price))
        sec.set_ylabel(f"US\\$ {unit} at \\${price:g}/GPU-hour")
        sec.yaxis.set_major_formatter(FuncFormatter(lambda x, _: "\\$" + si(x)))
        sec.yaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    fig.colorbar(sc, ax=ax, label="memory per GPU (GiB)", pad=0.02)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=11)
    return fig


def _front_2d(data):
    d = data.sort_values(["time_h", "gpu_hours"])
    best = np.inf
    keep = []
    for _, r in d.iterrows():
        if r["gpu_hours"] < best:
            keep.append(r)
            best = r["gpu_hours"]
    import pandas as pd
    return pd.DataFrame(keep)


def cost_figure(data, title: str, *, price: float | None) -> Figure:
    """Two panels per point: days to train and the cost (dollars at the price, else GPU-hours)."""
    fig = _figure(_bar_width_for(len(data)) + 2, 4.6)
    ax_t, ax_c = fig.subplots(1, 2)
    x = np.arange(len(data))
    ax_t.bar(x, data["days"], color="#4c72b0", gid="days")
    for i, v in enumerate(data["days"]):
        ax_t.text(x[i], v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
    ax_t.set_ylabel("days to train (wall clock)")
    ax_t.set_title("time", fontsize=10)
    cost = data["usd"] if price else data["gpu_hours"]
    ax_c.bar(x, cost, color="#55a868", gid="cost")
    for i, v in enumerate(cost):
        ax_c.text(x[i], v, ("\\$" if price else "") + si(v), ha="center", va="bottom", fontsize=7)
    _si_axis(ax_c.yaxis)
    ax_c.set_ylabel(f"US\\$ at \\${price:g} per GPU-hour" if price else "GPU-hours")
    ax_c.set_title("cost" + ("" if price else " (give --price-per-gpu-hour for dollars)"), fontsize=10)
    rot = 45 if len(data) > 5 else 0
    for a in (ax_t, ax_c):
        a.set_xticks(x, data["label"], rotation=rot, ha="right" if rot else "center")
        a.set_ylim(0, a.get_ylim()[1] * 1.12)
    fig.suptitle(title, fontsize=11)
    return fig


def throughput_figure(data, title: str, xlabel: str) -> Figure:
    """Tokens/s against the swept variable (categorical axis), MFU on a second axis."""
    fig = _figure(8, 4.6)
    ax = fig.add_subplot()
    mfu_ax = ax.twinx()
    labels = list(dict.fromkeys(data["x_label"]))
    for i, (series, g) in enumerate(data.groupby("series", sort=False)):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        pos = [labels.index(v) for v in g["x_label"]]
        name = f" {series}" if series else ""
        ax.plot(pos, g["tokens_per_s"], "o-", color=color, label=f"tokens/s{name}", gid="tokens")
        mfu_ax.plot(pos, 100 * g["mfu"], "s:", color=color, alpha=0.7, markersize=4, label=f"MFU{name}", gid="mfu")
        for p, (_, r) in zip(pos, g.iterrows()):
            if r["feasible"] and data["series"].nunique() <= 2:
                ax.annotate(r["plan"], (p, r["tokens_per_s"]), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=6, color=color)
            else:
                ax.annotate("no plan fits", (p, 0), xycoords=("data", "axes fraction"), textcoords="offset points",
                            xytext=(0, 5), ha="center", fontsize=7, color=color)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("throughput (tokens/s)")
    top = np.nanmax(np.r_[data["tokens_per_s"].to_numpy(float), 1.0])
    ax.set_ylim(0, top * 1.2)
    mfu_ax.set_ylabel("MFU (%)")
    mfu_ax.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = mfu_ax.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=11)
    return fig


def efficiency_figure(curves, title: str) -> Figure:
    """The efficiency curves the estimates used: square GEMM achieved/peak against size."""
    fig = _figure(6.5, 3.6)
    ax = fig.add_subplot()
    n = 2.0 ** np.arange(7, 15.01, 0.125)
    t = curves.gemm_time(n, n, n)
    peak = curves.accelerator.peak("bf16")
    ax.plot(n, 100 * 2 * n**3 / t / peak, color="#4c72b0", label="GEMM n×n×n, bf16", gid="gemm")
    ax.axhline(100 * curves.flash_attention_efficiency, color="#dd8452", linestyle="--",
               label="fused attention (plateau)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GEMM size n")
    ax.set_ylabel("achieved / peak (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig

