"""Prove a tile choice by running it: plan, sweep alternatives, compare measured with predicted.

Steps: profile this CPU (or load a profile), plan (N1, N2) with the profiled rates, time one
epoch of the chosen tiling and of a sweep of other tile sizes (each with the planner's best
refresh interval for that size), train tiled and untiled (baseline kernel, uniform negatives)
from the same initial parameters for a few epochs and compare recall@20 / NDCG@20 on the
held-out split. :func:`prepare_out_dir` checks the output folder before the run;
:func:`write_report` writes the PNG figure and ``report.json``, each whole or not at all, so a run
killed at any moment leaves the previous result or the new one. Progress goes through
:mod:`paraplan.progress` (a bar per timed sweep and training phase, a summary per phase).
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.cf import profile as cf_profile
from paraplan.cf.cost import AnalyticalRates, ProfiledRates, Tiling, epoch_time
from paraplan.cf.data import CFData, synthetic
from paraplan.cf.model import CFModel
from paraplan.cf.plan import plan_tiles
from paraplan.errors import ConfigError, InfeasiblePlan
from paraplan.hardware.catalog import load_part
from paraplan.io import write_atomic
from paraplan import progress


@dataclass(frozen=True)
class ValidateOptions:
    users: int = 4000
    items: int = 16000
    interactions: int = 160000
    dim: int = 64
    negatives: int = 64
    batch: int = 512
    threads: int = 1
    learning_rate: float = 40.0
    margin: float = 0.4
    negative_weight: float = 100.0
    epochs: int = 3
    sweep: int = 12
    repeats: int = 5
    seed: int = 0
    cpu: str = "local"
    profile_path: str | None = None
    min_sampling_space: float | None = None


def _time_epochs(params_fn, data, model, tilings, seed, repeats) -> tuple[list[float], list[float]]:
    """Per tiling: (median over ``repeats`` of the robust epoch time = median step × steps +
    shuffle, median wall time of the whole epoch). The profile's rates are medians of short
    intervals, so the robust time is the like-for-like comparison on a machine shared with other
    processes; the wall time is reported beside it. Repeats go round-robin over the tilings."""
    from paraplan.cf.kernels import train_epoch
    rob, wall = [[] for _ in tilings], [[] for _ in tilings]
    t0 = time.perf_counter()
    with progress.bar(desc="cf validate: timing tiles", total=repeats * len(tilings), unit="epoch") as bar:
        for r in range(repeats):
            for k, til in enumerate(tilings):
                p = params_fn()
                train_epoch(p, data, model, tiling=til, seed=seed + 100 + r, max_steps=5)  # warm-up
                res = train_epoch(p, data, model, tiling=til, seed=seed + r)
                rob[k].append(res.robust_seconds)
                wall[k].append(res.seconds)
                bar.update(1)
    progress.summary(f"cf validate: {len(tilings)} tiles x {repeats} timed epochs in {time.perf_counter() - t0:.1f} s")
    return [float(np.median(t)) for t in rob], [float(np.median(t)) for t in wall]


def run_validate(opts: ValidateOptions, data: CFData | None = None, log=print) -> dict:
    """Run the validation and return the report dictionary."""
    import torch
    from paraplan.cf.kernels import evaluate, init_params, train_epoch
    if opts.threads > (os.cpu_count() or 1):
        raise ConfigError("threads", f"{opts.threads} exceeds this machine's {os.cpu_count()} CPUs")
    if opts.epochs < 1 or opts.sweep < 1 or opts.repeats < 1:
        raise ConfigError("epochs/sweep/repeats", "must be positive integers")
    t_start = time.perf_counter()
    data = data or synthetic(opts.users, opts.items, opts.interactions, seed=opts.seed)
    model = CFModel(users=data.users, items=data.items, interactions=data.train_interactions, dim=opts.dim,
                    negatives=opts.negatives, batch=opts.batch, threads=opts.threads,
                    learning_rate=opts.learning_rate, margin=opts.margin, negative_weight=opts.negative_weight)
    torch.set_num_threads(opts.threads)
    if opts.profile_path and Path(opts.profile_path).exists():
        prof = cf_profile.load(opts.profile_path)
        if prof.threads != opts.threads:
            raise ConfigError("profile", f"was measured at {prof.threads} threads, validate runs {opts.threads}")
    else:
        with progress.step(f"cf validate: profiling this CPU at {opts.threads} threads"):
            prof = cf_profile.measure(threads=opts.threads, dim=opts.dim)
        if opts.profile_path:
            cf_profile.save(prof, opts.profile_path)
    if opts.cpu == "local":
        cpu = cf_profile.local_cpu()
        rates_for = lambda m: ProfiledRates(prof, m.row_bytes)  # noqa: E731
    else:
        cpu = load_part("cpus", opts.cpu)
        rates_for = None
    log(f"data {data.name}: {data.users} users, {data.items} items, {data.train_interactions} train")
    plan = plan_tiles(model, cpu, rates_for=rates_for, min_sampling_space=opts.min_sampling_space)
    for r in plan.relaxed:
        log(f"  note: {r.describe()}")
    chosen = plan.best
    # sweep: the chosen tile plus, per other tile size, the planner's best refresh interval. Tile
    # sizes below the rows-per-negative bound (small, L1-sized tiles) are timed too, to test the
    # time model across the cache levels; they are flagged and not candidates for "best".
    per_n1 = {}
    for c in plan.choices:
        per_n1.setdefault(c.tile_rows, c)
    feasible_n1 = set(per_n1)
    try:
        loose = plan_tiles(model, cpu, rates_for=rates_for, min_sampling_space=opts.min_sampling_space,
                           min_tile_per_negative=0)
        for c in loose.choices:
            per_n1.setdefault(c.tile_rows, c)
    except InfeasiblePlan:
        pass
    sizes = sorted(per_n1)
    others = [s for s in sizes if s != chosen.tile_rows]
    pick = [others[int(i)] for i in np.unique(np.linspace(0, len(others) - 1, max(opts.sweep - 1, 0)).round())] \
        if others and opts.sweep > 1 else []
    sweep = [chosen] + [per_n1[s] for s in pick]
    rates = rates_for(model) if rates_for else AnalyticalRates(cpu, model.threads, model.row_bytes)
    init = lambda: init_params(model, opts.seed)  # noqa: E731
    rows = []
    sweep = sorted(sweep, key=lambda c: c.tile_rows)
    measured, walls = _time_epochs(init, data, model, [(c.tile_rows, c.refresh_iterations) for c in sweep],
                                   opts.seed, opts.repeats)
    for c, meas, wall in zip(sweep, measured, walls):
        til = (c.tile_rows, c.refresh_iterations)
        pred = epoch_time(model, Tiling(*til), rates).seconds
        feas = c.tile_rows in feasible_n1
        rows.append({"tile_rows": c.tile_rows, "refresh_iterations": c.refresh_iterations,
                     "measured_epoch_s": meas, "measured_epoch_wall_s": wall, "predicted_epoch_s": pred,
                     "tile_level": c.tile_level,
                     "chosen": c is chosen, "feasible": feas})
        log(f"  tile N1={c.tile_rows:5d} N2={c.refresh_iterations:6d} {c.tile_level:>4}  measured {meas:7.3f} s  "
            f"predicted {pred:7.3f} s  {(pred - meas) / meas:+5.0%}{'' if feas else '  (below rows/negative bound)'}"
            f"{'  <- chosen' if c is chosen else ''}")
    cand = [r for r in rows if r["feasible"]]
    best = min(cand, key=lambda r: r["measured_epoch_s"])
    ch = next(r for r in rows if r["chosen"])
    ranked = sorted(cand, key=lambda r: r["measured_epoch_s"])

    def _mape(rs):
        return float(np.mean([abs(r["predicted_epoch_s"] - r["measured_epoch_s"]) / r["measured_epoch_s"] for r in rs]))
    mape = _mape(rows)
    mape_wall = float(np.mean([abs(r["predicted_epoch_s"] - r["measured_epoch_wall_s"]) / r["measured_epoch_wall_s"]
                               for r in rows]))
    # quality: tiled (chosen) vs untiled baseline, same init, same epochs
    quality = {}
    times = {}
    t0 = time.perf_counter()
    bar = progress.bar(desc="cf validate: training tiled and untiled", total=2 * opts.epochs, unit="epoch")
    for label, til in (("tiled", (chosen.tile_rows, chosen.refresh_iterations)), ("untiled", None)):
        p = init_params(model, opts.seed)
        res = []
        for e in range(opts.epochs):
            res.append(train_epoch(p, data, model, tiling=til, seed=opts.seed + e))
            bar.update(1)
        ts = [r.seconds for r in res]
        times[label] = [r.robust_seconds for r in res]
        quality[label] = evaluate(p, data, model)
        log(f"  {label:8s} epochs {', '.join(f'{t:.2f}' for t in ts)} s  recall@20 "
            f"{quality[label]['recall_at_20']:.4f}  ndcg@20 {quality[label]['ndcg_at_20']:.4f}")
    bar.close()
    progress.summary(f"cf validate: {opts.epochs} epochs tiled and untiled in {time.perf_counter() - t0:.1f} s")
    base_meas = float(np.median(times["untiled"]))      # robust epoch times (median step), as the sweep
    tiled_meas = float(np.median(times["tiled"]))
    base_pred = epoch_time(model, None, rates).seconds
    report = {
        "cpu": opts.cpu, "rates": rates.name, "threads": model.threads,
        "data": {"name": data.name, "users": data.users, "items": data.items,
                 "train_interactions": data.train_interactions, "test_users": len(data.test)},
        "model": {k: getattr(model, k) for k in ("dim", "negatives", "batch", "margin", "negative_weight",
                                                  "optimizer", "learning_rate")},
        "min_sampling_space": plan.min_sampling_space,
        "min_rows_per_negative": plan.min_rows_per_negative,
        "relaxed": [r.as_dict() for r in plan.relaxed],
        "chosen_tile": {"tile_rows": chosen.tile_rows, "refresh_iterations": chosen.refresh_iterations,
                        "predicted_epoch_s": chosen.predicted_epoch_s, "tile_level": chosen.tile_level},
        "best_measured_tile": {"tile_rows": best["tile_rows"], "refresh_iterations": best["refresh_iterations"],
                               "measured_epoch_s": best["measured_epoch_s"]},
        "chosen_measured_rank": ranked.index(ch) + 1,
        "tiles_measured": len(rows),
        "feasible_tiles_measured": len(cand),
        "epoch_time_mape_feasible": _mape(cand),
        "epoch_time_mape_wall": mape_wall,
        "predicted_best_is_measured_best": min(cand, key=lambda r: r["predicted_epoch_s"]) is best,
        "chosen_vs_best_time_ratio": ch["measured_epoch_s"] / best["measured_epoch_s"],
        "epoch_time_mape": mape,
        "sweep": rows,
        "baseline_epoch_s_measured": base_meas,
        "baseline_epoch_s_predicted": base_pred,
        "tiled_epoch_s_measured": tiled_meas,
        "speedup_vs_baseline": base_meas / tiled_meas,
        "speedup_vs_baseline_predicted": base_pred / chosen.predicted_epoch_s,
        "epochs_trained": opts.epochs,
        "recall_at_20_tiled": quality["tiled"]["recall_at_20"],
        "recall_at_20_untiled": quality["untiled"]["recall_at_20"],
        "ndcg_at_20_tiled": quality["tiled"]["ndcg_at_20"],
        "ndcg_at_20_untiled": quality["untiled"]["ndcg_at_20"],
        "profile": prof.to_json(),
        "wall_s": time.perf_counter() - t_start,
    }
    return report


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create the output folder and prove it writable before any work (ConfigError naming --out)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a folder", accepted="a folder (created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError("out", f"cannot write into {out}: {e.strerror or e}") from None
    return out


def _figure_png(report: dict) -> bytes:
    """The predicted and measured epoch time vs N1 as PNG bytes (rendered in memory)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted(report["sweep"], key=lambda r: r["tile_rows"])
    x = [r["tile_rows"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["measured_epoch_s"] for r in rows], "o-", label="measured")
    ax.plot(x, [r["predicted_epoch_s"] for r in rows], "s--", label="predicted")
    c = report["chosen_tile"]
    ax.axvline(c["tile_rows"], color="gray", lw=0.8, ls=":", label=f"chosen N1={c['tile_rows']}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tile rows per thread N1 (N2 = planner's best for that N1)")
    ax.set_ylabel("epoch time (s)")
    ax.set_title(f"SimpleX tiled epoch time, MAPE {report['epoch_time_mape']:.0%}")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def write_report(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write DIR/cf_tiles.png (predicted and measured vs N1), then DIR/report.json that names it,
    each whole or not at all (:func:`paraplan.io.write_atomic`)."""
    out = prepare_out_dir(out_dir)
    fig_path = out / "cf_tiles.png"
    write_atomic(fig_path, _figure_png(report))
    report = dict(report, figure=fig_path.name)
    write_atomic(out / "report.json", json.dumps(report, indent=1))
    return out / "report.json", fig_path
