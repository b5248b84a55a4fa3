"""Measured against predicted: ``report.json``, a text table and a breakdown figure.

The measured side is summarised from the per-rank worker results: step time and time
breakdown are those of the slowest rank (the step ends when it does), each the median over the
timed steps (the mean is kept as ``step_time_mean_s``): the profile behind the prediction stores
medians too, and on a shared machine a burst of another process's load spoils a step, not the
figure (2-core development machine: one layout's steps inside one run read 123-205 ms). Memory is
the largest per-rank total with its categories. The predicted side is a plain dict (from the analytical
estimator, wired in by the caller) with ``step_time_s``, ``memory_bytes_per_rank`` and
``time_breakdown_s`` (optionally ``memory_breakdown_bytes``, compared per category too); without
one the report says so and has no errors rather than made-up
numbers. Relative error is ``(predicted - measured) / measured``.
"""
from __future__ import annotations

import io
import json
import math
import os
import statistics

from paraplan.errors import ConfigError
from paraplan.io import write_atomic

PREDICTED_KEYS = ("step_time_s", "memory_bytes_per_rank", "time_breakdown_s")


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize_measured(results: list[dict]) -> dict:
    """Step time, time breakdown and memory per rank of a run, from its rank results."""
    slowest = max(results, key=lambda r: _median(r["step_times_s"]))
    biggest = max(results, key=lambda r: r["memory_bytes"]["total"])
    cuda_peak = [r["cuda_max_memory_allocated"] for r in results
                 if r.get("cuda_max_memory_allocated") is not None]
    loads = [r["expert_load"] for r in results if r.get("expert_load")]
    moe = {} if not loads else {
        # the busiest ep rank's share of its layer's routed tokens over the balanced one, averaged over
        # the MoE calls, worst ep group (validation.apply_ep.expert_load): the estimator's --moe-imbalance
        "expert_load_busiest": max(x["busiest"] for x in loads),
        "expert_load_by_rank": [x["rank"] for x in loads]}
    return {
        **moe,
        "step_time_s": _median(slowest["step_times_s"]),
        "step_time_mean_s": _mean(slowest["step_times_s"]),
        "step_times_s": slowest["step_times_s"],
        "slowest_rank": slowest["rank"],
        "time_breakdown_s": dict(slowest["time_breakdown_s"]),
        "memory_bytes_per_rank": biggest["memory_bytes"]["total"],
        "memory_breakdown_bytes": {k: v for k, v in biggest["memory_bytes"].items() if k != "total"},
        "memory_rank": biggest["rank"],
        "cuda_max_memory_allocated": max(cuda_peak) if cuda_peak else None,
        "op_times_s": slowest.get("op_times_s", {}),
    }


def check_predicted(predicted: dict | None) -> dict | None:
    """Validate the predicted dict's shape (ConfigError naming the missing key)."""
    if predicted is None:
        return None
    for k in PREDICTED_KEYS:
        if k not in predicted:
            raise ConfigError(f"predicted.{k}", "missing", accepted=", ".join(PREDICTED_KEYS))
    if not isinstance(predicted["time_breakdown_s"], dict):
        raise ConfigError("predicted.time_breakdown_s", "must be a mapping term -> seconds")
    return predicted


def rel_err(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, None when either side is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0 or \
            (isinstance(measured, float) and math.isnan(measured)):
        return None
    return (predicted - measured) / measured


def comparison_rows(measured: dict, predicted: dict | None) -> list[dict]:
    """One row per term: step time, memory, then each time-breakdown term."""
    p = predicted or {}
    rows = [{"term": "step_time_s", "measured": measured["step_time_s"],
             "predicted": p.get("step_time_s")},
            {"term": "memory_bytes_per_rank", "measured": measured["memory_bytes_per_rank"],
             "predicted": p.get("memory_bytes_per_rank")}]
    pb = p.get("time_breakdown_s", {})
    for term in list(measured["time_breakdown_s"]) + [t for t in pb if t not in measured["time_breakdown_s"]]:
        rows.append({"term": f"time.{term}", "measured": measured["time_breakdown_s"].get(term),
                     "predicted": pb.get(term)})
    pm = p.get("memory_breakdown_bytes") or {}
    mm = measured.get("memory_breakdown_bytes") or {}
    for term in pm:
        rows.append({"term": f"memory.{term}", "measured": mm.get(term), "predicted": pm[term]})
    for r in rows:
        r["relative_error"] = rel_err(r["predicted"], r["measured"])
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table of measured vs predicted with the error per term."""
    def f(x):
        if x is None:
            return "n/a"
        return f"{x:.4g}"
    lines = [f"{'term':<24} {'measured':>12} {'predicted':>12} {'rel.error':>10}"]
    for r in rows:
        err = "n/a" if r["relative_error"] is None else f"{100 * r['relative_error']:+.1f}%"
        lines.append(f"{r['term']:<24} {f(r['measured']):>12} {f(r['predicted']):>12} {err:>10}")
    return "\n".join(lines) + "\n"


def _atomic_write_text(path: str, text: str) -> None:
    write_atomic(path, text)


def plot_breakdown(measured: dict, predicted: dict | None, path: str) -> None:
    """Grouped bars of the time breakdown, measured vs predicted (Agg backend, atomic write)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mb = measured["time_breakdown_s"]
    pb = (predicted or {}).get("time_breakdown_s", {})
    terms = list(mb) + [t for t in pb if t not in mb]
    xs = range(len(terms))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [1e3 * (mb.get(t) or 0) for t in terms], w, label="measured")
    if predicted is not None:
        ax.bar([x + w / 2 for x in xs], [1e3 * (pb.get(t) or 0) for t in terms], w,
               label="predicted")
    ax.set_xticks(list(xs), terms, rotation=20)
    ax.set_ylabel("time per step (ms)")
    title = "step time breakdown" + ("" if predicted is not None else " (no prediction)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def build_report(plan: dict, results: list[dict], out_dir: str, *,
                 predicted: dict | None = None, reference_check: dict | None = None,
                 model: dict | None = None, extra: dict | None = None) -> dict:
    """Write ``report.json``, ``report.txt`` and ``breakdown.png`` into ``out_dir``.

    Parameters
    ----------
    plan : dict
        The plan that ran (``Plan.to_dict()`` of the plan as the harness ran it).
    results : list of dict
        Per-rank worker results (:func:`paraplan.validation.launch.launch_worker`).
    predicted : dict or None
        ``{"step_time_s", "memory_bytes_per_rank", "time_breakdown_s": {term: s}}``.
    reference_check : dict or None
        From :func:`paraplan.validation.reference.compare_to_reference`.
    extra : dict or None
        More top-level keys (e.g. the machine fingerprint).

    Returns
    -------
    dict
        The report (also written to ``report.json``).
    """
    predicted = check_predicted(predicted)
    measured = summarize_measured(results)
    rows = comparison_rows(measured, predicted)
    report = {
        "plan": plan,
        "model": model if model is not None else results[0].get("model"),
        "world_size": results[0]["world_size"],
        "backend": results[0]["backend"],
        "device": results[0]["device"],
        "measured": measured,
        "predicted": predicted if predicted is not None else
        {k: None for k in PREDICTED_KEYS},
        "prediction_available": predicted is not None,
        "relative_error": {"step_time": rows[0]["relative_error"],
                           "memory": rows[1]["relative_error"],
                           "terms": {r["term"]: r["relative_error"] for r in rows}},
        "loss_matches_reference": None if reference_check is None
        else reference_check["matches"],
        "reference_check": reference_check,
        "losses": next((r["losses"] for r in results if r["is_last_stage"]), None),
        **(extra or {}),
    }
    os.makedirs(out_dir, exist_ok=True)
    # each file whole or not at all; report.json, the one tools read, last
    _atomic_write_text(os.path.join(out_dir, "report.txt"), format_table(rows))
    plot_breakdown(measured, predicted, os.path.join(out_dir, "breakdown.png"))
    _atomic_write_text(os.path.join(out_dir, "report.json"),
                       json.dumps(report, indent=1, default=float))
    return report
