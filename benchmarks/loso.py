"""Leave one source out of everything that is fitted on published throughput rows, then predict it.

What is refitted here, per held-out source (benchmarks/calibrate_curves.py's procedure, narrowed):
  * ``gemm_sustained_fraction`` of each generation (A100, H100-class, Blackwell): the value of the grid
    (calibrate_curves.GRIDS, a window of LOSO_WINDOW steps either side of the stored value) with the
    lowest source-averaged MAPE on the *other* sources' dense rows of the generation (MoE rows and the
    500 W H100-96GB rows left out as calibrate_curves leaves them out). A generation whose only source
    is held out takes the value refitted on the next older generation's other sources (FALLBACK: the
    curves.yaml level is a share of each part's own MAMF, so it carries); with none, it keeps its value
    and the output says so.
  * the prediction interval (paraplan.costmodels.intervals): quantile level, widening slope k and its
    quantiles, all refitted on the other sources' leave-one-source-out residuals.

What is NOT refitted (fitted by hand or read from rows, not refittable by a script today), so a held-out
source that fed them is predicted with them in place; said in the output (HAND_FITTED):
  * A100 ``flash_attention_efficiency`` (calibrate_curves fits it jointly with the GEMM level; held at
    its all-source value here: a second grid axis would cost 13x the estimates);
  * V100 ``gemm_sustained_fraction`` (0.925: an earlier A100 calibration, by hand, curves.yaml);
  * ``moe_host_seconds_per_layer`` (read from one Megatron-Bridge row, paraplan/data/fitted_constants.yaml);
  * ``planner_tie_share``, the allocator and memory constants (fitted on the sweep's fit / OOM outcomes:
    they move memory, not the throughput scored here).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from paraplan.costmodels import intervals as I
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate

LOSO_WINDOW = 6
FALLBACK = {"Blackwell": "H100-class", "H100-class": "A100"}
REFITTED = ("A100", "H100-class", "Blackwell")
HAND_FITTED = (
    "A100 flash_attention_efficiency: held at its all-source calibrate_curves value (not refitted per source)",
    "V100 gemm_sustained_fraction 0.925: set by hand (curves.yaml), not refittable",
    "moe_host_seconds_per_layer: read by hand from one Megatron-Bridge row (fitted_constants.yaml), not refitted",
    "memory constants (allocator, runtime reserve, plan memory fraction): fitted on fit/OOM outcomes, "
    "do not move the throughput scored here",
)


def _level(inputs) -> float:
    return float(analytical_curves(inputs[2].accelerator).gemm_sustained_fraction)


def _predict(inputs, value: float) -> float:
    model, job, cluster, plan = inputs
    curves = replace(analytical_curves(cluster.accelerator), gemm_sustained_fraction=value)
    return estimate(model, job, cluster, plan, curves=curves).step_time_s


def _source_mape(measured, pred, sources) -> float:
    err = pd.Series(np.abs(measured / pred - 1), index=sources)
    return float(err.groupby(level=0).mean().mean())


def loso_predictions(df: pd.DataFrame, report=print) -> np.ndarray:
    """Predicted step time of every row of ``df`` (columns source, generation, group, inputs,
    measured_s, predicted_s) with the GEMM level of its generation refitted without its source."""
    from calibrate_curves import GRIDS, LEFT_OUT_PARTS
    grid_all = GRIDS["gemm_sustained_fraction"]
    out = df.predicted_s.to_numpy(dtype=float).copy()
    scans, calib = {}, {}
    for gen in REFITTED:
        idx = np.flatnonzero((df.generation == gen).to_numpy())
        if not len(idx):
            continue
        base = _level(df.inputs.iloc[idx[0]])
        at = int(np.argmin(np.abs(grid_all - base)))
        grid = grid_all[max(0, at - LOSO_WINDOW): at + LOSO_WINDOW + 1]
        scans[gen] = (idx, {float(v): np.array([_predict(df.inputs.iloc[i], float(v)) for i in idx]) for v in grid})
        part = df.iloc[idx]
        calib[gen] = ((part.group != I.MOE_REGIME)
                      & ~part.inputs.map(lambda x: x[2].accelerator.name in LEFT_OUT_PARTS)).to_numpy()

    def refit(gen, held):
        idx, scan = scans[gen]
        part = df.iloc[idx]
        keep = calib[gen] & (part.source != held).to_numpy()
        if not keep.any():
            return None
        meas, src = part.measured_s.to_numpy()[keep], part.source.to_numpy()[keep]
        return min(scan, key=lambda v: _source_mape(meas, scan[v][keep], src))

    for held in sorted(df.source.unique()):
        for gen in sorted(set(df.generation[df.source == held])):
            if gen not in scans:
                report(f"  LOSO {held} on {gen}: level not refittable (kept)")
                continue
            v, used = refit(gen, held), gen
            while v is None and used in FALLBACK and FALLBACK[used] in scans:
                used = FALLBACK[used]
                v = refit(used, held)
            if v is None:
                report(f"  LOSO {held} on {gen}: no other source to refit on (kept)")
                continue
            idx, scan = scans[gen]
            v = min(scan, key=lambda g: abs(g - v))          # the fallback's value on this generation's grid
            mask = (df.source.iloc[idx] == held).to_numpy()
            out[idx[mask]] = scan[v][mask]
            edge = v in (min(scan), max(scan))
            report(f"  LOSO {held} on {gen}: gemm_sustained_fraction {v:.4f} (stored {_level(df.inputs.iloc[idx[0]]):.4f})"
                   f"{f', refitted on {used} rows' if used != gen else ''}{' AT THE GRID EDGE' if edge else ''}")
    return out


# --- regimes of issue 64 -------------------------------------------------------------------------------

def regimes(df: pd.DataFrame) -> pd.DataFrame:
    """Boolean columns per regime of issue 64 for each row."""
    def row(inputs):
        model, job, cluster, plan = inputs
        moe = model.moe is not None
        return {"seq >= 32k": job.seq_len >= 32768,
                "dense 1-13B FSDP/ZeRO-3": (not moe) and 1e9 <= model.num_params <= 13.5e9 and plan.zero == 3,
                "MoE EP across nodes": moe and plan.ep * max(plan.etp, 1) > cluster.gpus_per_node,
                ">= 8k GPUs": cluster.num_gpus >= 8192}
    return pd.DataFrame([row(x) for x in df.inputs], index=df.index)


def mape_table(df: pd.DataFrame, loso_s: np.ndarray) -> pd.DataFrame:
    """In-sample and leave-one-source-out throughput MAPE and bias per source, regime and overall."""
    e_in = df.measured_s / df.predicted_s - 1
    e_lo = df.measured_s / loso_s - 1
    out = []

    def add(name, mask):
        if mask.any():
            out.append({"rows of": name, "rows": int(mask.sum()), "in-sample MAPE %": 100 * e_in[mask].abs().mean(),
                        "LOSO MAPE %": 100 * e_lo[mask].abs().mean(), "LOSO bias %": 100 * e_lo[mask].mean()})
    for src in sorted(df.source.unique()):
        add(src, df.source == src)
    reg = regimes(df)
    for name in reg:
        add(f"[regime] {name}", reg[name])
    add("OVERALL", pd.Series(True, index=df.index))
    t = pd.DataFrame(out)
    per_source = t[~t["rows of"].str.startswith(("[", "OVERALL"))]
    t.loc[len(t)] = {"rows of": "mean over sources", "rows": int(per_source.rows.sum()),
                     "in-sample MAPE %": per_source["in-sample MAPE %"].mean(),
                     "LOSO MAPE %": per_source["LOSO MAPE %"].mean(), "LOSO bias %": per_source["LOSO bias %"].mean()}
    return t


# --- intervals widened with the evidence distance -------------------------------------------------------

K_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0)


def _fit(ev, r, src, groups, k, exclude=None, dist=None):
    """fit_intervals on the scores r / (1 + k D) of the rows not of ``exclude``, with their p10 multipliers."""
    keep = src != exclude
    d = dist if dist is not None else I.held_out_distances(list(np.asarray(ev, dtype=object)[keep]))
    s = r[keep] / (1 + k * d)
    residuals = {}
    for g, so, x in zip(groups[keep], src[keep], s):
        residuals.setdefault(g, []).append((so, float(x)))
    fitted = I.fit_intervals(residuals, generations=sorted(set(groups)))
    p10 = {g: I.quantile_interval([x for _, x in rows], 0.8, I.source_weights([s for s, _ in rows]))[0]
           for g, rows in ((g, I._basis(residuals, g)[0]) for g in sorted(set(groups)))}
    return fitted, p10


def loso_interval_table(df: pd.DataFrame, log_ratio: np.ndarray, k: float, cache: dict | None = None) -> pd.DataFrame:
    """Each row judged against the interval fitted on the other sources' rows with widening slope k:
    multipliers low^(1+kD), high^(1+kD), D its distance to the other sources' rows."""
    ev = list(df.evidence)
    src, groups = df.source.to_numpy(), df.group.to_numpy()
    d_all = I.held_out_distances(ev)
    cache = {} if cache is None else cache
    rows = []
    for held in sorted(set(src)):
        if held not in cache:
            keep = src != held
            cache[held] = I.held_out_distances([e for e, k_ in zip(ev, keep) if k_])
        fitted, p10 = _fit(ev, log_ratio, src, groups, k, exclude=held, dist=cache[held])
        for i in np.flatnonzero(src == held):
            iv, w = fitted[groups[i]], 1 + k * d_all[i]
            lo, hi, p = iv.low ** w, iv.high ** w, p10[groups[i]] ** w
            ratio = float(np.exp(log_ratio[i]))
            rows.append({"source": held, "group": groups[i], "distance": d_all[i], "low": lo, "high": hi, "p10": p,
                         "covered": lo <= ratio <= hi, "half_width": (hi - lo) / 2})
    return pd.DataFrame(rows, index=df.index[np.concatenate([np.flatnonzero(src == h) for h in sorted(set(src))])]
                        ).loc[df.index]


def choose_k(df, log_ratio, level=I.LEVEL, report=print) -> tuple[float, pd.DataFrame]:
    """The k of K_GRID with the highest leave-one-source-out coverage averaged over sources (each source
    once: the sweep's 263 rows would otherwise carry a source whose runs all fall outside), the smaller k
    on a tie; among those whose coverage of all rows reaches ``level`` when any does."""
    cache: dict = {}
    tables = {}
    for k in K_GRID:
        t = loso_interval_table(df, log_ratio, k, cache)
        tables[k] = (t.covered.mean(), t.groupby("source").covered.mean().mean(), t)
        report(f"  k {k:.2f}: LOSO coverage {100 * tables[k][0]:.1f} % of rows "
               f"(mean over sources {100 * tables[k][1]:.1f} %), median half-width {100 * t.half_width.median():.1f} %")
    ok = [k for k in K_GRID if tables[k][0] >= level] or list(K_GRID)
    best = max(ok, key=lambda k: (round(tables[k][1], 6), -k))
    return best, tables[best][2]


def coverage_table(df: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    out = []
    reg = regimes(df)

    def add(name, mask):
        if mask.any():
            t = table[mask]
            out.append({"rows of": name, "rows": int(mask.sum()), "covered %": 100 * t.covered.mean(),
                        "median half-width %": 100 * t.half_width.median(), "median distance": t.distance.median()})
    for src in sorted(df.source.unique()):
        add(src, df.source == src)
    for name in reg:
        add(f"[regime] {name}", reg[name])
    add("OVERALL", pd.Series(True, index=df.index))
    return pd.DataFrame(out)


def rank_by_comparison(df: pd.DataFrame, loso_s: np.ndarray, table: pd.DataFrame) -> pd.DataFrame:
    """The pick among the runs of one setup (source, model, GPUs, sequence; at least two runs) by the
    LOSO median throughput and by its p10 (the LOSO interval's): measured throughput of the pick over the
    setup's best measured run."""
    thr_m = 1 / df.measured_s.to_numpy()
    med = 1 / loso_s
    p10 = med * table.p10.to_numpy()
    key = [(s, x[0].name, x[2].num_gpus, x[1].seq_len, x[1].global_batch) for s, x in zip(df.source, df.inputs)]
    out = []
    for k in sorted(set(key), key=str):
        idx = np.array([i for i, kk in enumerate(key) if kk == k])
        if len(idx) < 2:
            continue
        best = thr_m[idx].max()
        out.append({"setup": f"{k[0]}: {k[1]} x{k[2]} seq {k[3]}", "runs": len(idx),
                    "median pick / best": thr_m[idx[np.argmax(med[idx])]] / best,
                    "p10 pick / best": thr_m[idx[np.argmax(p10[idx])]] / best})
    return pd.DataFrame(out)
