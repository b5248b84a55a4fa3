"""Prediction intervals for step time and throughput, from calibration residuals per hardware generation.

For each generation (A100, H100-class, Blackwell, ...) ``benchmarks/accuracy.py --write-intervals``
scores the estimator on the published runs of that generation and stores quantiles of the log
throughput ratio r = ln(measured / predicted): an estimate T then carries the interval
[T·e^q_lo, T·e^q_hi].

Two things make the interval honest for a run from a source paraplan has not seen:

* **Sources weigh equally.** One source (the 263-run Hagemann et al. sweep) outnumbers the others
  many times over; each row is weighted 1 / (rows of its source), so the quantiles describe "a run
  from some source", not "a run from the sweep".
* **The quantile level is calibrated by leaving sources out** (split-conformal in spirit): the
  nominal 90 % interval uses the smallest quantile level q ≥ 0.90 (grid of 0.01) at which, leaving
  each source out in turn and fitting on the others, at least 90 % of the held-out rows fall
  inside. Between-source shifts (a codebase slower than the curves, a table measured differently)
  are what widen it. ``benchmarks/accuracy.py`` checks the result one level further out: each
  source is held out of the whole fit, level calibration included.

Mixture-of-Experts models are a regime of their own (``MOE_REGIME``): their residuals (fine-grained
experts: router, permutation, grouped GEMMs, all-to-all and host synchronisation per layer) are far
wider than a dense model's on the same hardware, so an MoE estimate carries the MoE rows' interval,
from every generation together, and a dense estimate its generation's dense rows' interval. The
regime uses its own rows from ``MIN_ROWS`` on even from a single source (it says how many).

A generation with fewer than ``MIN_ROWS`` rows or only one source borrows the residuals of all
generations pooled and says so; a generation with no rows at all gets no interval, and the estimate
says that its hardware has no calibration data. The stored file names its inputs and the date.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paraplan.io import write_atomic

INTERVALS_JSON = Path(__file__).parent / "data" / "prediction_intervals.json"
LEVEL = 0.9
MIN_ROWS = 8
#: residual group of every Mixture-of-Experts row, whatever its hardware generation
MOE_REGIME = "MoE"

#: generation of each accelerator preset (a measured CPU profile has none)
GENERATION = {"a100-40g": "A100", "a100-80g": "A100", "v100-16g": "V100", "v100-32g": "V100",
              "h100-sxm": "H100-class", "h200": "H100-class", "h800-sxm": "H100-class", "gh200": "H100-class",
              "gh200-144g": "H100-class", "h100-96g-hbm2e": "H100-class", "b200": "Blackwell", "gb200": "Blackwell", "gb300": "Blackwell",
              "b300": "Blackwell", "mi300x": "MI300X", "mi325x": "MI300X", "mi350x": "MI355X", "mi355x": "MI355X"}


@dataclass(frozen=True)
class Interval:
    """Multipliers on the predicted throughput bounding the measured one at ``level`` (low ≤ 1 ≤ high
    typically), and where they come from."""
    generation: str
    level: float
    low: float
    high: float
    rows: int
    sources: tuple[str, ...]
    pooled: bool = False
    quantile_level: float = LEVEL     # the residual quantiles it spans (calibrated: see the module doc)

    def basis(self) -> str:
        sources = f"{len(self.sources)} source{'s' * (len(self.sources) != 1)}"
        if self.pooled:
            return (f"{self.rows} calibration rows of all generations from {sources}, pooled: {self.generation} "
                    f"has too few of its own (fewer than {MIN_ROWS} rows, or one source)")
        what = "MoE models (all generations)" if self.generation == MOE_REGIME else self.generation
        return f"{self.rows} calibration rows of {what} from {sources}"


def quantile_interval(log_ratios: Sequence[float], level: float = LEVEL,
                      weights: Sequence[float] | None = None) -> tuple[float, float]:
    """(low, high) throughput multipliers: exp of the (1 ∓ level)/2 quantiles of ln(measured/predicted).

    Unweighted: numpy's linear quantiles. Weighted: the weighted empirical CDF with each point at the
    middle of its weight, F_i = (W_<i + w_i/2) / W, interpolated linearly (clamped at the ends)."""
    r = np.asarray(log_ratios, dtype=float)
    qs = [(1 - level) / 2, (1 + level) / 2]
    if weights is None:
        lo, hi = np.quantile(r, qs)
    else:
        order = np.argsort(r, kind="stable")
        r, w = r[order], np.asarray(weights, dtype=float)[order]
        cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
        lo, hi = np.interp(qs, cdf, r)
    return float(np.exp(lo)), float(np.exp(hi))


def source_weights(sources: Sequence[str]) -> np.ndarray:
    """1 / (rows of the row's source): every source weighs the same in total."""
    _, inverse, counts = np.unique(np.asarray(sources, dtype=str), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def _basis(residuals: Mapping[str, Sequence[tuple[str, float]]], generation: str):
    """(rows, pooled?) an interval for ``generation`` is fitted on: its own rows when they number at
    least MIN_ROWS from at least two sources, else every generation's rows pooled."""
    own = list(residuals.get(generation, ()))
    if len(own) >= MIN_ROWS and (len({s for s, _ in own}) >= 2 or generation == MOE_REGIME):
        return own, False
    return [row for rows in residuals.values() for row in rows], True


def _interval_on(rows, quantile_level: float) -> tuple[float, float]:
    sources = [s for s, _ in rows]
    return quantile_interval([r for _, r in rows], quantile_level, source_weights(sources))


#: quantile levels tried when calibrating a nominal level (0.90, 0.91, ..., 0.99)
QUANTILE_GRID = tuple(round(0.90 + 0.01 * i, 2) for i in range(10))


def held_out_coverage(residuals: Mapping[str, Sequence[tuple[str, float]]], quantile_level: float) -> float:
    """Share of all rows inside the interval fitted, at ``quantile_level``, on the other sources'
    rows (of the row's generation, or pooled as :func:`_basis` decides)."""
    sources = sorted({s for rows in residuals.values() for s, _ in rows})
    covered = total = 0
    for src in sources:
        rest = {g: [(s, r) for s, r in rows if s != src] for g, rows in residuals.items()}
        for gen, rows in residuals.items():
            held = np.exp([r for s, r in rows if s == src])
            if not len(held):
                continue
            lo, hi = _interval_on(_basis(rest, gen)[0], quantile_level)
            covered += int(((held >= lo) & (held <= hi)).sum())
            total += len(held)
    return covered / total if total else float("nan")


def calibrated_quantile_level(residuals: Mapping[str, Sequence[tuple[str, float]]], level: float = LEVEL) -> float:
    """The smallest quantile level of QUANTILE_GRID (≥ ``level``) whose leave-one-source-out coverage
    reaches ``level``; ``level`` itself with fewer than three sources (nothing to calibrate on), the
    top of the grid when none does."""
    if len({s for rows in residuals.values() for s, _ in rows}) < 3:
        return level
    for q in QUANTILE_GRID:
        if q >= level and held_out_coverage(residuals, q) >= level:
            return q
    return QUANTILE_GRID[-1]


def fit_intervals(residuals: Mapping[str, Sequence[tuple[str, float]]], level: float = LEVEL,
                  generations: Sequence[str] | None = None) -> dict[str, Interval]:
    """Intervals per generation from ``{generation: [(source, ln(measured/predicted)), ...]}``: source-
    weighted quantiles at the calibrated quantile level. ``generations`` (default: those in
    ``residuals``) may name generations without rows of their own: they get the pooled interval."""
    q = calibrated_quantile_level(residuals, level)
    out = {}
    for gen in (generations if generations is not None else list(residuals)):
        rows, pooled = _basis(residuals, gen)
        lo, hi = _interval_on(rows, q)
        out[gen] = Interval(gen, level, lo, hi, len(rows), tuple(sorted({s for s, _ in rows})),
                            pooled=pooled, quantile_level=q)
    return out


def write_intervals(intervals: Mapping[str, Interval], inputs: Sequence[str], path: Path = INTERVALS_JSON) -> None:
    doc = {"level": LEVEL, "inputs": list(inputs),
           "method": ("source-weighted quantiles of ln(measured/predicted throughput) per generation, at the quantile "
                      "level whose leave-one-source-out coverage reaches the nominal level (benchmarks/accuracy.py)"),
           "generations": {g: {"low": round(i.low, 4), "high": round(i.high, 4), "rows": i.rows,
                               "sources": list(i.sources), "pooled": i.pooled,
                               "quantile_level": i.quantile_level} for g, i in sorted(intervals.items())}}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


@lru_cache(maxsize=1)
def _stored() -> dict:
    try:
        return json.loads(INTERVALS_JSON.read_text())
    except (OSError, ValueError):
        return {}


def residual_group(generation: str, moe: bool) -> str:
    """The residual group a calibration row (or an estimate) belongs to: MOE_REGIME for an MoE model,
    else its hardware generation."""
    return MOE_REGIME if moe else generation


def interval_for(accelerator_name: str, moe: bool = False) -> Interval | None:
    """The stored interval of the accelerator's generation (of the MoE regime for an MoE model, when
    stored), or None (no calibration data for the generation)."""
    gen = GENERATION.get(accelerator_name)
    stored = _stored()
    groups = stored.get("generations", {})
    if gen in groups and moe and MOE_REGIME in groups:     # hardware without data stays without
        gen = MOE_REGIME
    entry = groups.get(gen) if gen else None
    if entry is None:
        return None
    return Interval(gen, float(stored.get("level", LEVEL)), float(entry["low"]), float(entry["high"]),
                    int(entry["rows"]), tuple(entry["sources"]), bool(entry["pooled"]),
                    float(entry.get("quantile_level", stored.get("level", LEVEL))))


def describe_interval(accelerator_name: str, tokens_per_s: float, step_time_s: float, mfu: float,
                      moe: bool = False) -> dict:
    """The interval block an estimate carries (printed and in JSON)."""
    iv = interval_for(accelerator_name, moe)
    if iv is None:
        gen = GENERATION.get(accelerator_name, accelerator_name)
        return {"level": LEVEL, "basis": f"no calibration data for {gen}: no prediction interval"}
    return {"level": iv.level, "tokens_per_s": [tokens_per_s * iv.low, tokens_per_s * iv.high],
            "step_time_s": [step_time_s / iv.high, step_time_s / iv.low], "mfu": [mfu * iv.low, mfu * iv.high],
            "basis": iv.basis()}
