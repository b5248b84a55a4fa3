"""Calibrate the analytical efficiency curves per hardware generation on the calibration files, and
show how well each calibrated value carries to a source it was not calibrated on.

Parameters (curves.yaml; the rest of the curves are measured or derived, see their sources there):
  gemm_sustained_fraction     share of the best-shape GEMM benchmark (MAMF) a training step sustains
                              (every generation; V100's result is printed but not taken, curves.yaml says why)
  flash_attention_efficiency  fused-attention throughput as a share of dense peak, where the plan leaves
                              the kernel to ``auto`` (A100 only: the other generations' rows do not pin it)
memory_efficiency (the achieved HBM share of memory-bound kernels) is not calibrated by default: the
level rows barely pin it (``--free memory_efficiency`` moves it to 0.60 on A100 for a 0.07-point better
objective), and the sweep's one-axis pairs that isolate memory-bound kernels (eager softmax, fused
RMSNorm) pull apart when it moves.

Rows: every dense-model row of ``published_runs_calibration.csv``, ``published_runs_calibration_h100.csv``
and the Hagemann et al. 2023 sweep (when PARAPLAN_SWEEP_CSV names its CSV) that accuracy.py scores, grouped
by generation (A100, Hopper, Blackwell).
Left out of the calibration, and said so: MoE rows (their error is the MoE model's: grouped GEMMs, the
router's host syncs, all-to-all; a GEMM level must not absorb it) and the torchtitan rows of the 500 W
H100-96GB HBM2e (its power limit is priced by an estimate, Accelerator.power_limited_clock_factor, which
those rows test: a level calibrated on them would absorb that estimate's error).

Objective: the mean over sources of each source's throughput MAPE, so a source counts once however many
rows it has (the sweep's 263 runs would otherwise outvote five papers). A MAPE's optimum sits near the
median error, so a few runs that lost seconds to something paraplan does not model pull it little.

Reported: the calibrated values, each source's bias under them, and leave-one-source-out: for each
source, the value calibrated without it and that source's bias under that value (how far a calibrated
level carries to a source it never saw).

The chosen values are written into paraplan/costmodels/curves.yaml by hand, this script named as their
source; rerun it to check them (about 3 minutes on 2 cores).

    python benchmarks/calibrate_curves.py [--generation A100] [--free memory_efficiency]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from accuracy import SWEEP_SOURCE, sweep_runs   # noqa: E402  the benchmarks' reading of the sweep
from paraplan.calibration.sweep import sweep_csv   # noqa: E402

from paraplan.calibration import load_cases, load_h100_cases   # noqa: E402
from paraplan.costmodels.efficiency import analytical_curves   # noqa: E402
from paraplan.costmodels.estimate import estimate   # noqa: E402
from paraplan.costmodels.intervals import GENERATION   # noqa: E402

#: a part whose rows are left out of its generation's calibration, and why
LEFT_OUT_PARTS = {"h100-96g-hbm2e": "500 W power limit: priced by an estimate these rows test"}
GRIDS = {
    "gemm_sustained_fraction": np.round(np.arange(0.70, 1.0001, 0.0125), 4),
    "memory_efficiency": np.round(np.arange(0.40, 0.7001, 0.05), 3),
    "flash_attention_efficiency": np.round(np.arange(0.25, 0.5001, 0.025), 3),
}
#: which parameters each generation calibrates (the others keep their curves.yaml values)
PARAMETERS = {"A100": ("gemm_sustained_fraction", "flash_attention_efficiency"),
              "H100-class": ("gemm_sustained_fraction",), "Blackwell": ("gemm_sustained_fraction",),
              "V100": ("gemm_sustained_fraction",)}


def calibration_rows() -> pd.DataFrame:
    """One row per dense run: source, generation, accelerator, the (model, job, cluster, plan) to
    estimate and the measured step time."""
    rows = []
    for loader in (load_cases, load_h100_cases):
        cases, _ = loader()
        for c in cases:
            rows.append({"source": c.source, "accelerator": c.cluster.accelerator.name,
                         "generation": GENERATION[c.cluster.accelerator.name], "moe": c.model.moe is not None,
                         "inputs": (c.model, c.job, c.cluster, c.plan), "measured_s": c.measured_step_time_s})
    sweep = sweep_csv()
    if sweep is not None and sweep.exists():
        for r, inputs in sweep_runs(sweep):
            rows.append({"source": SWEEP_SOURCE, "accelerator": inputs[2].accelerator.name, "generation": "A100",
                         "moe": False, "inputs": inputs, "measured_s": float(r.measured_step_s)})
    df = pd.DataFrame(rows)
    df["left_out"] = np.where(df.moe, "MoE", df.accelerator.map(LEFT_OUT_PARTS).fillna(""))
    return df


def predicted(rows: pd.DataFrame, params: dict) -> np.ndarray:
    """Predicted step times of ``rows`` with ``params`` replacing their curves' values."""
    out = []
    for model, job, cluster, plan in rows.inputs:
        curves = replace(analytical_curves(cluster.accelerator), **params)
        out.append(estimate(model, job, cluster, plan, curves=curves).step_time_s)
    return np.array(out)


def throughput_error(rows, pred):
    """measured step / predicted step - 1: > 0 where paraplan predicts faster than measured."""
    return rows.measured_s.to_numpy() / pred - 1


def source_mape(rows, pred, sources=None) -> float:
    """Mean over sources of each source's throughput MAPE (``sources``: the ones to count)."""
    err = pd.Series(np.abs(throughput_error(rows, pred)), index=rows.index)
    per = err.groupby(rows.source).mean()
    return float(per.loc[list(sources)].mean() if sources is not None else per.mean())


def scan(rows, base: dict, name: str) -> dict:
    """Predicted step times of every row for each value of ``name``'s grid, the others at ``base``."""
    return {v: predicted(rows, {**base, name: float(v)}) for v in GRIDS[name]}


def calibrate(rows: pd.DataFrame, names, report) -> tuple[dict, dict]:
    """Coordinate descent over ``names`` (two passes) on the source-averaged MAPE; returns the values and
    the last pass's scans (value -> predictions), kept for the leave-one-source-out check."""
    curves = analytical_curves(rows.inputs.iloc[0][2].accelerator)
    params = {n: float(getattr(curves, n)) for n in names}
    scans = {}
    for _ in range(2):
        for n in names:
            scans[n] = scan(rows, params, n)
            params[n] = float(min(scans[n], key=lambda v: source_mape(rows, scans[n][v])))
            report(f"    {n} -> {params[n]:.4f}  (source-averaged MAPE "
                   f"{100 * source_mape(rows, scans[n][params[n]]):.2f} %)")
    return params, scans


def leave_one_source_out(rows, scans, name) -> pd.DataFrame:
    """For each source: ``name`` calibrated on the other sources (the rest held at the pooled values)
    and the held-out source's bias and MAPE under it."""
    out = []
    sources = sorted(rows.source.unique())
    for held in sources:
        others = [s for s in sources if s != held]
        if not others:
            continue
        v = min(scans[name], key=lambda v: source_mape(rows, scans[name][v], others))
        mask = (rows.source == held).to_numpy()
        err = throughput_error(rows[mask], scans[name][v][mask])
        out.append({"held out": held, "rows": int(mask.sum()), name: v,
                    "bias_%": 100 * err.mean(), "mape_%": 100 * np.abs(err).mean()})
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generation", choices=sorted(PARAMETERS), action="append",
                    help="calibrate only this generation (repeatable; default all)")
    ap.add_argument("--free", choices=sorted(GRIDS), action="append", default=[],
                    help="calibrate this parameter too, on every generation (repeatable)")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    everything = calibration_rows()
    for why, n in everything[everything.left_out != ""].groupby(["generation", "left_out"]).size().items():
        print(f"left out: {n:3d} {why[0]} rows ({why[1]})")
    for gen in args.generation or PARAMETERS:
        rows = everything[(everything.generation == gen) & (everything.left_out == "")].reset_index(drop=True)
        if rows.empty:
            continue
        names = PARAMETERS[gen] + tuple(n for n in args.free if n not in PARAMETERS[gen])
        print(f"\n{gen}: {len(rows)} rows from {rows.source.nunique()} sources")
        params, scans = calibrate(rows, names, print)
        pred = scans[names[-1]][params[names[-1]]]
        err = pd.Series(throughput_error(rows, pred))
        per = err.groupby(rows.source).agg(rows="size", mape=lambda e: 100 * e.abs().mean(),
                                           bias=lambda e: 100 * e.mean())
        print("  calibrated: " + ", ".join(f"{k} {v:.4f}" for k, v in params.items()))
        print(per.round(1).to_string())
        print(f"  all {len(rows)} rows: MAPE {100 * err.abs().mean():.1f} %, bias {100 * err.mean():+.1f} %")
        if rows.source.nunique() > 1:
            # the gemm fraction's scan is rerun at the final values of the others
            first = scan(rows, params, "gemm_sustained_fraction") if names[-1] != "gemm_sustained_fraction" \
                else scans["gemm_sustained_fraction"]
            print("  leave-one-source-out (gemm_sustained_fraction calibrated without the held-out source):")
            print(leave_one_source_out(rows, {"gemm_sustained_fraction": first},
                                       "gemm_sustained_fraction").round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
