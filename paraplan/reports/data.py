"""The numbers behind each what-if figure, as pandas DataFrames (what the plots draw, and what
the tests check): the points table, the scaling curve, the breakdowns, the tp x pp heat-map,
the Pareto front and the cost to train.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import MEMORY_TERMS, TIME_TERMS, estimate
from paraplan.planner.search import score_fitting
from paraplan.plan import PLAN_FIELDS
from paraplan.planner.space import SpaceOptions, axis_choices, compose
from paraplan.reports.sweep import GIB, LABELS

#: the best plan's fields in the points table: the degrees and main modes first, then every other field
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "vpp", "sp", "micro_batch", "schedule", "zero", "recompute", "offload",
                "offload_params")
PLAN_COLUMNS += tuple(k for k in PLAN_FIELDS if k not in PLAN_COLUMNS)


def format_value(var: str, v) -> str:
    """Short label of a swept value (``8k``, ``80 GiB``, ``50 GB/s``)."""
    if var == "seq_len" and v % 1024 == 0:
        return f"{v // 1024}k"
    if var == "hbm":
        return f"{v:g} GiB"
    if var.endswith("bandwidth"):
        return f"{v:.3g} GB/s"
    if var == "power_limit":
        return f"{v:g} W"
    if var == "offload":
        return f"offload {v}"
    if var == "attention_kernel":
        return f"attention {v}"
    return str(v)


def points_table(results, scenario) -> pd.DataFrame:
    """One row per point: swept values, scenario, best plan's degrees, time/memory terms, cost.
    No wall-clock column: the same sweep gives the same table, byte for byte (timing goes to stderr)."""
    sweep_vars = [s.var for s in scenario.sweeps]
    rows = []
    for r in results:
        p = r.point
        c = p.cluster
        row = {"point": p.index}
        for var in sweep_vars:
            row[_col(var)] = p.values[var]
        row["label"] = " / ".join(format_value(var, p.values[var]) for var in sweep_vars)
        row.update({"model": p.model.name, "cluster": p.cluster_spec, "gpus": c.num_gpus, "seq_len": p.job.seq_len,
                    "global_batch": p.job.global_batch, "tokens_per_step": p.job.tokens_per_step,
                    "hbm_gib": c.accelerator.memory_bytes / GIB,
                    "inter_node_gb_per_s": c.system.inter_node.bandwidth_bytes_per_s / 1e9,
                    "intra_node_gb_per_s": c.system.intra_node.bandwidth_bytes_per_s / 1e9,
                    "feasible": r.feasible, "reason": r.reason or "", "candidates": r.candidates})
        e = r.estimate
        for k in PLAN_COLUMNS:
            row[k] = getattr(e.plan, k) if e is not None else None
        row["plan"] = e.plan.label() if e is not None else ""
        nan = float("nan")
        row.update({"step_time_s": e.step_time_s if e else nan, "tokens_per_s": e.tokens_per_s if e else nan,
                    "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu if e else nan, "mfu": e.mfu if e else nan,
                    "hfu": e.hfu if e else nan, "model_tflops_per_gpu": e.model_tflops_per_gpu if e else nan})
        # the 90 % prediction interval of the hardware generation (NaN where it has no calibration data)
        iv = (e.prediction_interval if e else {}) or {}
        lo, hi = iv.get("tokens_per_s", (nan, nan))
        row.update({"tokens_per_s_lo90": lo, "tokens_per_s_hi90": hi})
        for k in TIME_TERMS:
            row[f"time_{k}_s"] = e.time_breakdown_s[k] if e else nan
        for k in (*MEMORY_TERMS, "total"):
            row[f"mem_{k}_gib"] = e.memory_bytes_per_gpu[k] / GIB if e else nan
        tps = row["tokens_per_s"]
        row["gpu_hours_per_1b_tokens"] = c.num_gpus * 1e9 / tps / 3600 if e else nan
        if scenario.train_tokens:
            row["train_days"] = scenario.train_tokens / tps / 86400 if e else nan
            row["train_gpu_hours"] = c.num_gpus * scenario.train_tokens / tps / 3600 if e else nan
        if scenario.price_per_gpu_hour:
            row["usd_per_1b_tokens"] = row["gpu_hours_per_1b_tokens"] * scenario.price_per_gpu_hour
            if scenario.train_tokens:
                row["train_usd"] = row["train_gpu_hours"] * scenario.price_per_gpu_hour
        rows.append(row)
    return pd.DataFrame(rows)


def _groups(df: pd.DataFrame, scenario, x_var: str):
    """(group label, sub-frame) per value of the sweep that is not ``x_var`` (one group if none)."""
    others = [s.var for s in scenario.sweeps if s.var != x_var]
    if not others:
        yield "", df
        return
    var = others[0]
    for value in dict.fromkeys(df[_col(var)]):
        yield format_value(var, value), df[df[_col(var)] == value]


def _col(var: str) -> str:
    """Column of a swept value (``sweep_offload``: the plan's own ``offload`` column is separate)."""
    return f"sweep_{var}"


def scaling_data(df: pd.DataFrame, scenario) -> pd.DataFrame:
    """Tokens/s and MFU against GPUs, with ideal linear scaling from each series' first feasible point:
    ``ideal = tokens_per_s[first] * gpus / gpus[first]``."""
    out = []
    for group, g in _groups(df, scenario, "gpus"):
        g = g.sort_values("gpus")
        ok = g[g["feasible"]]
        if ok.empty:
            continue
        first = ok.iloc[0]
        for _, r in g.iterrows():
            ideal = first["tokens_per_s"] * r["gpus"] / first["gpus"]
            out.append({"series": group, "gpus": r["gpus"], "tokens_per_s": r["tokens_per_s"] if r["feasible"] else np.nan,
                        **_band(r),
                        "ideal_tokens_per_s": ideal, "mfu": r["mfu"] if r["feasible"] else np.nan,
                        "scaling_efficiency": r["tokens_per_s"] / ideal if r["feasible"] else np.nan,
                        "feasible": r["feasible"], "plan": r["plan"]})
    return pd.DataFrame(out)


def breakdown_data(df: pd.DataFrame) -> pd.DataFrame:
    """Step-time terms per point (seconds); the stacked bar heights, summing to the step time."""
    cols = ["point", "label", "feasible", "step_time_s"] + [f"time_{k}_s" for k in TIME_TERMS]
    return df[cols].rename(columns={f"time_{k}_s": k for k in TIME_TERMS}).reset_index(drop=True)


def memory_data(df: pd.DataFrame) -> pd.DataFrame:
    """Per-GPU memory terms per point (GiB), their total and the GPU's HBM."""
    cols = ["point", "label", "feasible", "hbm_gib", "mem_total_gib"] + [f"mem_{k}_gib" for k in MEMORY_TERMS]
    out = df[cols].rename(columns={f"mem_{k}_gib": k for k in MEMORY_TERMS}).rename(columns={"mem_total_gib": "total"})
    return out.reset_index(drop=True)


def throughput_data(df: pd.DataFrame, scenario) -> pd.DataFrame:
    """Tokens/s and MFU against the first swept variable, one series per value of the second."""
    var = scenario.sweeps[0].var
    out = []
    for group, g in _groups(df, scenario, var):
        for _, r in g.iterrows():
            out.append({"series": group, "x": r[_col(var)], "x_label": format_value(var, r[_col(var)]),
                        "tokens_per_s": r["tokens_per_s"] if r["feasible"] else np.nan, **_band(r),
                        "mfu": r["mfu"] if r["feasible"] else np.nan, "feasible": r["feasible"], "plan": r["plan"]})
    return pd.DataFrame(out)


def _band(r) -> dict:
    """The row's 90 % throughput interval (NaN for infeasible points or uncalibrated hardware)."""
    ok = bool(r["feasible"])
    return {"tokens_per_s_lo90": r.get("tokens_per_s_lo90", np.nan) if ok else np.nan,
            "tokens_per_s_hi90": r.get("tokens_per_s_hi90", np.nan) if ok else np.nan}


def pareto_flags(values: np.ndarray) -> np.ndarray:
    """True where a row (objectives to minimise, one per column) is dominated by no other row."""
    values = np.asarray(values, float)
    n = len(values)
    keep = np.ones(n, bool)
    for i in range(n):
        le = np.all(values <= values[i], axis=1)
        lt = np.any(values < values[i], axis=1)
        if np.any(le & lt):
            keep[i] = False
    return keep


def pareto_data(df: pd.DataFrame, scenario) -> pd.DataFrame:
    """Feasible points with time, cost and memory; ``pareto`` marks the non-dominated ones
    (minimising all three). Time and cost are to train ``train_tokens`` if given, else per 1B tokens."""
    ok = df[df["feasible"]].copy()
    if scenario.train_tokens:
        ok["time_h"] = ok["train_days"] * 24
        ok["gpu_hours"] = ok["train_gpu_hours"]
    else:
        ok["time_h"] = 1e9 / ok["tokens_per_s"] / 3600
        ok["gpu_hours"] = ok["gpu_hours_per_1b_tokens"]
    ok["usd"] = ok["gpu_hours"] * scenario.price_per_gpu_hour if scenario.price_per_gpu_hour else np.nan
    ok["memory_gib"] = ok["mem_total_gib"]
    out = ok[["point", "label", "gpus", "plan", "time_h", "gpu_hours", "usd", "memory_gib"]].reset_index(drop=True)
    out["pareto"] = pareto_flags(out[["time_h", "gpu_hours", "memory_gib"]].to_numpy()) if len(out) else []
    return out


def cost_data(df: pd.DataFrame, scenario) -> pd.DataFrame:
    """Days, GPU-hours and dollars to train ``train_tokens`` tokens, per feasible point."""
    T = scenario.train_tokens
    ok = df[df["feasible"]]
    out = pd.DataFrame({"point": ok["point"], "label": ok["label"], "gpus": ok["gpus"],
                        "tokens_per_s": ok["tokens_per_s"],
                        "days": T / ok["tokens_per_s"] / 86400,
                        "gpu_hours": ok["gpus"] * T / ok["tokens_per_s"] / 3600})
    out["usd"] = out["gpu_hours"] * scenario.price_per_gpu_hour if scenario.price_per_gpu_hour else np.nan
    return out.reset_index(drop=True)


def heatmap_data(point, scenario) -> pd.DataFrame:
    """Best predicted throughput for each (tp, pp) at one point, best over every other axis.

    Same ranking as ``search`` restricted to that (tp, pp): vectorized step time, then memory, then
    position; the three leaders re-scored with ``estimate``; the fastest that fits wins.
    ``status``: ``fits`` (a plan), ``does not fit`` (legal layouts, none in memory),
    ``no legal layout`` (no candidate with that tp and pp).
    """
    model, job, cluster = point.model, point.job, point.cluster
    fixed = {k: v for k, v in dict(point.fixed).items() if k not in ("tp", "pp", "dp")}
    options = SpaceOptions(fixed=fixed, allow_offload=point.allow_offload,
                           grad_accumulation_fusion=scenario.grad_accumulation_fusion)
    curves = analytical_curves(cluster.accelerator)
    choices = axis_choices(model, job, cluster, options)
    batch, _, _ = compose(model, job, cluster, options)
    frac = scenario.max_memory_fraction
    step, mem, over_gpu, over_host, over_nvme = score_fitting(model, job, cluster, batch, curves, frac)
    feasible = ~(over_gpu | over_host | over_nvme)
    index = np.arange(len(batch))
    order = np.lexsort((index, mem, step))
    rows = []
    for tp in choices["tp"]:
        for pp in choices["pp"]:
            sel = order[(batch.tp[order] == tp) & (batch.pp[order] == pp)]
            row = {"tp": int(tp), "pp": int(pp), "tokens_per_s": np.nan, "mfu": np.nan, "step_time_s": np.nan,
                   "mem_total_gib": np.nan, "plan": "", "candidates": int(sel.size)}
            if sel.size == 0:
                row["status"] = "no legal layout"
            else:
                leaders = sel[feasible[sel]][:3]
                ests = [estimate(model, job, cluster, batch.plan(int(i)), curves=curves, max_memory_fraction=frac)
                        for i in leaders]
                ests = sorted((e for e in ests if e.feasible), key=lambda e: (e.step_time_s, e.memory_bytes_per_gpu["total"]))
                if ests:
                    e = ests[0]
                    row.update(status="fits", tokens_per_s=e.tokens_per_s, mfu=e.mfu, step_time_s=e.step_time_s,
                               mem_total_gib=e.memory_bytes_per_gpu["total"] / GIB,
                               plan=f"{e.plan.label()} ZeRO-{e.plan.zero} {e.plan.recompute} offload {e.plan.offload}")
                else:
                    row["status"] = "does not fit"
            rows.append(row)
    out = pd.DataFrame(rows)
    if out["tokens_per_s"].notna().any():
        out["best"] = out["tokens_per_s"] == out["tokens_per_s"].max()
    else:
        out["best"] = False
    return out


def efficiency_data(curves_by_accelerator) -> pd.DataFrame:
    """The efficiency curves behind the compute times, per accelerator of the sweep: square bf16
    GEMMs n = 2^7 .. 2^15 (eighth octaves), ``achieved/peak = 2 n^3 / t(n) / peak``, and the
    fused-attention plateau. Accelerators whose curves are identical share one ``accelerator``
    label ("H100, H200") so that the figure draws one line, not two on top of each other."""
    n = 2.0 ** np.arange(7, 15.01, 0.125)
    curves_rows: list[tuple[list[str], np.ndarray, float]] = []
    for name, curves in curves_by_accelerator.items():
        t = curves.gemm_time(n, n, n)
        gemm = 100 * 2 * n**3 / t / curves.accelerator.peak("bf16")
        att = 100 * curves.flash_attention_efficiency
        for names, g, a in curves_rows:
            if np.allclose(g, gemm, rtol=1e-9) and a == att:
                names.append(name)
                break
        else:
            curves_rows.append(([name], gemm, att))
    return pd.concat([pd.DataFrame({"accelerator": ", ".join(names), "n": n, "gemm_percent_of_peak": g,
                                    "attention_percent_of_peak": a}) for names, g, a in curves_rows],
                     ignore_index=True)


def tokens(x: float) -> str:
    """300e9 -> '300B' tokens."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def describe_point(point) -> str:
    """One line naming a point: model, cluster, GPUs, sequence, batch, then any other swept value
    (HBM, bandwidth, offload) in brackets; the first four are not repeated there."""
    stated = ("gpus", "seq_len", "global_batch", "cluster")
    vals = ", ".join(f"{LABELS[k]} {format_value(k, v)}" for k, v in point.values.items() if k not in stated)
    return (f"{point.model.name} on {point.cluster_spec} x {point.cluster.num_gpus} GPUs, seq {point.job.seq_len}, "
            f"global batch {point.job.global_batch}" + (f" ({vals})" if vals else ""))


def si(x: float) -> str:
    """1234567 -> '1.23M'."""
    if x is None or not math.isfinite(x):
        return "–"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def timeline_data(timeline) -> pd.DataFrame:
    """The slices of a predicted step's timeline (:func:`paraplan.reports.timeline.build_timeline`), one row
    each: pipeline rank, track, name, the estimate's term, start and duration and the exposed seconds."""
    return pd.DataFrame([{"rank": s.rank, "track": s.track, "name": s.name, "term": s.category,
                          "start_s": s.start_s, "dur_s": s.dur_s, "exposed_s": s.exposed_s}
                         for s in timeline.slices],
                        columns=["rank", "track", "name", "term", "start_s", "dur_s", "exposed_s"])


def fastest_point(results):
    """The point whose plan fits with the most tokens/s (the first on a tie), or None."""
    best = None
    for pr in results:
        if pr.feasible and (best is None or pr.estimate.tokens_per_s > best.estimate.tokens_per_s):
            best = pr
    return best
