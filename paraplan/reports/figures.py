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

TIME_COLORS = dict(zip(TIME_TERMS, ("#4c72b0", "#8da0cb", "#b3c6e6", "#dd8452", "#e5ae38", "#64b5cd", "#da8bc3", "#c44e52", "#f2a2a4",
                                    "#55a868", "#8172b3", "#937860")))
assert len(TIME_COLORS) == len(TIME_TERMS), "one colour per time term"
MEMORY_COLORS = dict(zip(MEMORY_TERMS, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8c8c8c", "#cfcfcf")))
assert len(MEMORY_COLORS) == len(MEMORY_TERMS), "one colour per memory term"
SERIES_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


#: Inches per character of an 11 pt title line in DejaVu Sans (measured: ~0.08; a margin added).
TITLE_INCH_PER_CHAR = 0.085


def _figure(width: float, height: float, title: str = "") -> Figure:
    """A constrained-layout figure at least as wide as the longest line of its title (not clipped)."""
    longest = max((len(line) for line in title.splitlines()), default=0)
    return Figure(figsize=(max(width, TITLE_INCH_PER_CHAR * longest + 0.6), height), dpi=100, layout="constrained")


def _series_legend(ax, series: list[str], styles: list[tuple[str, dict]], **kw) -> None:
    """One legend entry per series colour, then one per line style (what each line means)."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=SERIES_COLORS[i % len(SERIES_COLORS)], linewidth=3, label=s)
               for i, s in enumerate(series)]
    handles += [Line2D([], [], color="black", label=label, **style) for label, style in styles]
    if any(c.get_gid() == "interval90" for c in ax.collections):
        from matplotlib.patches import Patch
        handles.append(Patch(color="black", alpha=0.15, linewidth=0, label="90 % prediction interval"))
    ax.legend(handles=handles, fontsize=8, **kw)


def _si_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator
    axis.set_major_formatter(FuncFormatter(lambda x, _: si(x)))
    if axis.get_scale() == "log":
        axis.set_minor_locator(LogLocator(subs=(2, 5)))
        axis.set_minor_formatter(FuncFormatter(lambda x, _: si(x)))


def _bar_width_for(n: int) -> float:
    return min(16.0, max(6.0, (0.45 if n <= 16 else 0.22) * n + 3))


def scaling_note(g) -> str:
    """What the last fitting point of a series reaches against linear scaling, and why when above it.

    ``% of linear = tokens/s ÷ (tokens/s at the first fitting point × GPUs / its GPUs)``, i.e. the
    per-GPU rate against the first point's; above 100 % the larger cluster runs a more efficient
    plan than the first point could (the MFUs of both are given).
    """
    ok = g[g["feasible"].astype(bool) & g["tokens_per_s"].notna()]
    first, last = ok.iloc[0], ok.iloc[-1]
    eff = 100 * last["scaling_efficiency"]
    note = (f"at {last['gpus']:.0f} GPUs: {eff:.0f}% of linear scaling from {first['gpus']:.0f} GPUs, "
            f"MFU {100 * last['mfu']:.0f}%, {last['plan']}")
    if eff > 100.5:
        note += (f"\nabove 100%: this plan runs at a higher MFU than the {first['gpus']:.0f}-GPU one "
                 f"({100 * last['mfu']:.0f}% vs {100 * first['mfu']:.0f}%, {first['plan']})")
    return note


def scaling_figure(data, title: str, series_label: str = "") -> Figure:
    """Tokens/s (log-log) against GPUs with the ideal linear line; MFU in a panel below."""
    fig = _figure(8, 6.4, title)
    ax, mfu_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1.3)})
    notes = []
    series = list(dict.fromkeys(data["series"]))
    for i, (name, g) in enumerate(data.groupby("series", sort=False)):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        suffix = f" {name}" if name else ""
        ax.plot(g["gpus"], g["tokens_per_s"], "o-", color=color, label=f"predicted tokens/s{suffix}", gid="tokens")
        _interval_band(ax, g["gpus"], g, color)
        ax.plot(g["gpus"], g["ideal_tokens_per_s"], "--", color=color, alpha=0.55,
                label=f"ideal linear{suffix}", gid="ideal")
        mfu_ax.plot(g["gpus"], 100 * g["mfu"], "s-", color=color, markersize=4, label=f"MFU{suffix}", gid="mfu")
        if g["tokens_per_s"].notna().any():
            notes.append((color, (f"{name}: " if name else "") + scaling_note(g)))
        for _, r in g[~g["feasible"].astype(bool)].iterrows():
            ax.annotate("no plan fits", (r["gpus"], r["ideal_tokens_per_s"]), fontsize=8, color=color,
                        ha="center", textcoords="offset points", xytext=(0, 6))
    y = 0.03
    for color, note in reversed(notes[-3:]):
        ax.text(0.99, y, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5, color=color,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
        y += 0.06 * (note.count("\n") + 1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _si_axis(ax.yaxis)
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_xlabel("GPUs")
    mfu_ax.set_xlabel("GPUs")
    mfu_ax.set_ylabel("MFU (%)")
    _zoom_percent(mfu_ax, 100 * data["mfu"])
    gpus = sorted(set(data["gpus"]))
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.tick_params(labelbottom=True)
    for a in (ax, mfu_ax):
        a.grid(True, which="major", alpha=0.3)
    styles = [("predicted tokens/s", {"marker": "o"}), ("ideal linear (from the first point that fits)",
                                                         {"linestyle": "--", "alpha": 0.6})]
    if len(series) > 1:
        _series_legend(ax, series, styles, loc="upper left", title=series_label or None, title_fontsize=8)
    else:
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=11)
    return fig


def _zoom_percent(ax, values) -> None:
    """A percent axis around the values (so close lines separate), at least 10 points tall, within 0-100."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not len(v):
        ax.set_ylim(0, 100)
        return
    lo, hi = float(v.min()), float(v.max())
    pad = max(2.0, 0.15 * (hi - lo), (10 - (hi - lo)) / 2)
    ax.set_ylim(max(0.0, lo - pad), min(100.0, hi + pad))


def _seconds(v: float) -> str:
    return f"{v:,.0f} s" if v >= 100 else f"{v:.3g} s"


def breakdown_figure(data, title: str, xlabel: str = "") -> Figure:
    """Stacked bars of the step-time terms per point (bar height = step time), and their shares."""
    n = len(data)
    many = n > 16
    if many:
        fig = _figure(min(16.0, 4 + 0.22 * n), 8, title)
        ax, share = fig.subplots(2, 1, gridspec_kw={"height_ratios": (3, 2)})
    else:
        fig = _figure(max(9.0, 2 * _bar_width_for(n) - 2), 4.8, title)
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
        a.set_xlabel(xlabel)
    ax.set_ylabel("time per optimizer step (s)")
    ax.set_ylim(0, np.nanmax(np.r_[bottom, 1e-9]) * 1.15)
    share.set_ylabel("share of the step (%)")
    share.set_ylim(0, 100)
    share.set_title("shares", fontsize=9)
    share.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title, fontsize=11)
    return fig


def memory_figure(data, title: str, xlabel: str = "") -> Figure:
    """Stacked bars of per-GPU memory terms per point with each point's HBM capacity marked."""
    fig = _figure(_bar_width_for(len(data)) + 2, 4.8, title)
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
            ax.text(x[i], r["total"], f"{r['total']:.0f}", ha="center", va="bottom", fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})   # readable over the HBM line
    ax.set_xticks(x, data["label"], rotation=45 if len(data) > 6 else 0, ha="right" if len(data) > 6 else "center",
                  fontsize=6 if many else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("memory per GPU (GiB), peak pipeline stage")
    ax.set_ylim(0, max(np.nanmax(np.r_[bottom, 0]), np.nanmax(hbm)) * 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(title, fontsize=11)
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


def cost_figure(data, title: str, *, price: float | None, xlabel: str = "") -> Figure:
    """Two panels per point: days to train and the cost (dollars at the price, else GPU-hours)."""
    fig = _figure(_bar_width_for(len(data)) + 2, 4.6, title)
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
        a.set_xlabel(xlabel)
        a.set_ylim(0, a.get_ylim()[1] * 1.12)
    fig.suptitle(title, fontsize=11)
    return fig


def _interval_band(ax, x, g, color) -> None:
    """The 90 % prediction interval of a series as a shaded band (nothing where the hardware has no
    calibration data: the columns are NaN)."""
    if "tokens_per_s_lo90" not in g or not g["tokens_per_s_lo90"].notna().any():
        return
    ax.fill_between(list(x), g["tokens_per_s_lo90"].to_numpy(float), g["tokens_per_s_hi90"].to_numpy(float),
                    color=color, alpha=0.15, linewidth=0, gid="interval90")


def throughput_figure(data, title: str, xlabel: str, series_label: str = "") -> Figure:
    """Tokens/s against the swept variable (categorical axis), one line per series; MFU in a panel
    below on its own zoomed axis, so that series with close MFUs stay apart. Points without a plan
    that fits are gaps marked "no plan fits"; plans are written on the points when two series or fewer."""
    fig = _figure(8, 6.2, title)
    ax, mfu_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1.4)})
    labels = list(dict.fromkeys(data["x_label"]))
    series = list(dict.fromkeys(data["series"]))
    few = len(series) <= 2
    for i, (name, g) in enumerate(data.groupby("series", sort=False)):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        pos = [labels.index(v) for v in g["x_label"]]
        suffix = f" {name}" if name else ""
        ax.plot(pos, g["tokens_per_s"], "o-", color=color, label=f"tokens/s{suffix}", gid="tokens")
        _interval_band(ax, pos, g, color)
        mfu_ax.plot(pos, 100 * g["mfu"], "s-", color=color, markersize=4, label=f"MFU{suffix}", gid="mfu")
        for p, (_, r) in zip(pos, g.iterrows()):
            if not r["feasible"]:
                ax.annotate("no plan fits", (p, 0), xycoords=("data", "axes fraction"), textcoords="offset points",
                            xytext=(0, 5 + 10 * i), ha="center", fontsize=7, color=color, gid="no-fit")
            elif few:
                ax.annotate(r["plan"], (p, r["tokens_per_s"]), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=6, color=color, gid="plan")
    ax.set_xticks(range(len(labels)), labels)
    ax.tick_params(labelbottom=True)
    ax.set_xlabel(xlabel)
    mfu_ax.set_xlabel(xlabel)
    ax.set_ylabel("throughput (tokens/s)")
    band = data["tokens_per_s_hi90"].to_numpy(float) if "tokens_per_s_hi90" in data else []
    top = np.nanmax(np.r_[data["tokens_per_s"].to_numpy(float), band, 1.0])
    ax.set_ylim(0, top * 1.2)
    _si_axis(ax.yaxis)
    mfu_ax.set_ylabel("MFU (%)")
    _zoom_percent(mfu_ax, 100 * data["mfu"])
    if len(series) > 1:
        _series_legend(ax, series, [], loc="lower right", title=series_label or None, title_fontsize=8,
                       ncol=min(4, len(series)))
    else:
        ax.legend(fontsize=8, loc="lower right")
    for a in (ax, mfu_ax):
        a.grid(True, alpha=0.3)
        a.set_xlim(-0.4, len(labels) - 0.6)
    fig.suptitle(title, fontsize=11)
    return fig


def efficiency_figure(data, title: str) -> Figure:
    """The efficiency curves the estimates used (``data.efficiency_data``): square GEMM achieved/peak
    against size, and the fused-attention plateau."""
    fig = _figure(6.5, 3.6, title)
    ax = fig.add_subplot()
    groups = list(data.groupby("accelerator", sort=False))
    for i, (acc, g) in enumerate(groups):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        who = f" — {acc}" if len(groups) > 1 else ""
        ax.plot(g["n"], g["gemm_percent_of_peak"], color=color, label=f"GEMM n×n×n, bf16{who}", gid="gemm")
        ax.plot(g["n"], g["attention_percent_of_peak"], color=color, linestyle="--", alpha=0.7,
                label=f"fused attention (plateau){who}", gid="attention")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GEMM size n")
    ax.set_ylabel("achieved / peak (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


#: colour of each kind of slice in the timeline figure: the step-time breakdown's colour of its term, the
#: forward and backward shades of compute's blue, the deferred weight gradient teal
TIMELINE_COLORS = {"forward": "#4c72b0", "backward": "#2a3f6b", "weight-grad": "#2a9d8f",
                   "recompute": TIME_COLORS["recompute"], "pp_bubble": "#eeeeee", "tp_comm": TIME_COLORS["tp_comm"],
                   "cp_comm": TIME_COLORS["cp_comm"], "ep_comm": TIME_COLORS["ep_comm"],
                   "moe_host": TIME_COLORS["moe_host"], "pp_comm": TIME_COLORS["pp_comm"],
                   "dp_comm": TIME_COLORS["dp_comm"], "dp hidden": "#b7dbbf",
                   "grad_accumulation": TIME_COLORS["grad_accumulation"], "optimizer": TIME_COLORS["optimizer"],
                   "offload": TIME_COLORS["offload"]}
TIMELINE_LABELS = {"forward": "forward", "backward": "backward (input + weight gradients)",
                   "weight-grad": "weight gradient (deferred)", "recompute": "recomputation",
                   "pp_bubble": "bubble (idle)", "tp_comm": "tp collectives", "cp_comm": "cp exchange",
                   "ep_comm": "ep all-to-all", "moe_host": "MoE host wait", "pp_comm": "pp receive (blocking)",
                   "dp_comm": "dp communication (exposed)", "dp hidden": "dp communication (hidden under backward)",
                   "grad_accumulation": "gradient accumulation", "optimizer": "optimizer step",
                   "offload": "offload transfers"}
#: rows of one pipeline rank in the timeline figure: (tracks drawn on it, height, offset below the rank's top)
TIMELINE_ROWS = (("compute", 0.46, 0.0), ("comm", 0.2, 0.5), ("dp", 0.14, 0.74))


def _timeline_kind(s) -> str:
    """The colour key of a slice: compute's phase, the hidden dp part, else its category."""
    if s.track == "compute" and s.category in ("compute",):
        return {"F": "forward", "B": "backward", "W": "weight-grad"}.get(s.name[:1], "forward")
    if s.category == "dp_comm" and s.exposed_s <= 0:
        return "dp hidden"
    return s.category


def _timeline_row(s) -> str:
    if s.track == "compute":
        return "compute"
    return "dp" if s.track in ("dp", "offload") else "comm"


def timeline_figure(timeline, title: str | None = None) -> Figure:
    """Gantt chart of a predicted step (:func:`paraplan.reports.timeline.build_timeline`): one band per
    pipeline rank, its compute on top (forward, backward, weight gradient, recomputation, the bubble in
    grey), its per-micro-batch communication below (tp, cp, ep, the MoE host wait, pipeline transfer
    waits), then the data-parallel communication (hidden part pale) and the offload transfers. The rank
    marked ★ sets the pace: its bars add up to the estimate's terms."""
    p = timeline.ranks
    title = title or f"{timeline.title}\n{timeline.plan_line}"
    fig = _figure(12, 2.4 + 0.75 * p, title)
    ax = fig.add_subplot(1, 1, 1)
    bars: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for s in timeline.slices:
        bars.setdefault((s.rank, _timeline_row(s), _timeline_kind(s)), []).append((s.start_s * 1e3, s.dur_s * 1e3))
    rows = {name: (h, off) for name, h, off in TIMELINE_ROWS}
    dense = max((len(v) for v in bars.values()), default=0) > 150
    for (rank, row, kind), spans in bars.items():
        h, off = rows[row]
        y = rank * 1.0 + off
        ax.broken_barh(spans, (y, h), facecolors=TIMELINE_COLORS.get(kind, "#999999"),
                       edgecolor="none" if dense else "white", linewidth=0 if dense else 0.4,
                       hatch="///" if kind == "pp_bubble" else None)
    if not dense:                      # micro-batch numbers on the pace rank's forwards and backwards
        for s in timeline.slices:
            if (s.rank == timeline.pace_rank or p <= 8) and s.track == "compute" and s.category == "compute" \
                    and s.dur_s >= timeline.step_time_s / 60:
                ax.text((s.start_s + s.dur_s / 2) * 1e3, s.rank + 0.23, s.name, ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_ylim(p - 0.05, -0.1)
    ax.set_yticks([r + 0.23 for r in range(p)])
    ax.set_yticklabels([f"{'★ ' if r == timeline.pace_rank and p > 1 else ''}rank {r}" for r in range(p)])
    ax.set_xlim(0, timeline.step_time_s * 1e3)
    ax.set_xlabel("time in the step (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    kinds = [k for k in TIMELINE_COLORS if any(key[2] == k for key in bars)]
    labels = dict(TIMELINE_LABELS, **({"backward": "backward (input gradient)"} if "weight-grad" in kinds else {}))
    handles = [Patch(facecolor=TIMELINE_COLORS[k], edgecolor="#999999" if k == "pp_bubble" else "none",
                     hatch="///" if k == "pp_bubble" else None, label=labels[k]) for k in kinds]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncol=min(5, len(handles)), frameon=False)
    sub = (f"{timeline.schedule}{' schedule' if p > 1 else ''}, {timeline.micro_batches} micro-batches"
           + (f" × {timeline.chunks_per_rank} chunks per rank" if timeline.chunks_per_rank > 1 else "")
           + (f"; ★ rank {timeline.pace_rank} sets the pace: its bars add up to the estimate's terms" if p > 1 else "")
           + "\nper rank: compute, then its communication, then data-parallel and offload")
    ax.set_title(sub, fontsize=8, color="#555555")
    fig.suptitle(title, fontsize=11)
    return fig
