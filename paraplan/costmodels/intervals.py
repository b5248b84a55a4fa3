"""Prediction intervals for step time and throughput, from calibration residuals per hardware generation.

For each generation (A100, H100-class, Blackwell, ...) ``benchmarks/accuracy.py --write-intervals``
scores the estimator on the published runs of that generation and stores the empirical quantiles of
the log throughput ratio r = ln(measured / predicted): an estimate T then carries the interval
[T·e^q_lo, T·e^q_hi] with q_lo, q_hi the (1 − level)/2 and (1 + level)/2 quantiles of r (level 0.9).
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

#: generation of each accelerator preset (a measured CPU profile has none)
GENERATION = {"a100-40g": "A100", "a100-80g": "A100", "v100-16g": "V100", "v100-32g": "V100",
              "h100-sxm": "H100-class", "h200": "H100-class", "h800-sxm": "H100-class", "gh200": "H100-class",
              "gh200-144g": "H100-class", "b200": "Blackwell", "gb200": "Blackwell", "gb300": "Blackwell",
              "mi300x": "MI300X"}


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

    def basis(self) -> str:
        own = f"{self.rows} calibration rows of {self.generation} from {len(self.sources)} sources"
        return own + (" (too few of its own: all generations pooled)" if self.pooled else "")


def quantile_interval(log_ratios: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) throughput multipliers: exp of the empirical (1 ∓ level)/2 quantiles of ln(measured/predicted)."""
    r = np.asarray(log_ratios, dtype=float)
    lo, hi = np.quantile(r, [(1 - level) / 2, (1 + level) / 2])
    return float(np.exp(lo)), float(np.exp(hi))


def fit_intervals(residuals: Mapping[str, Sequence[tuple[str, float]]], level: float = LEVEL) -> dict[str, Interval]:
    """Intervals per generation from ``{generation: [(source, ln(measured/predicted)), ...]}``."""
    pooled = [r for rows in residuals.values() for _, r in rows]
    pooled_sources = tuple(sorted({s for rows in residuals.values() for s, _ in rows}))
    out = {}
    for gen, rows in residuals.items():
        sources = tuple(sorted({s for s, _ in rows}))
        own = len(rows) >= MIN_ROWS and len(sources) >= 2
        lo, hi = quantile_interval([r for _, r in rows] if own else pooled, level)
        out[gen] = Interval(gen, level, lo, hi, len(rows) if own else len(pooled),
                            sources if own else pooled_sources, pooled=not own)
    return out


def write_intervals(intervals: Mapping[str, Interval], inputs: Sequence[str], path: Path = INTERVALS_JSON) -> None:
    doc = {"level": LEVEL, "inputs": list(inputs),
           "method": "empirical quantiles of ln(measured/predicted throughput) per generation (benchmarks/accuracy.py)",
           "generations": {g: {"low": round(i.low, 4), "high": round(i.high, 4), "rows": i.rows,
                               "sources": list(i.sources), "pooled": i.pooled} for g, i in sorted(intervals.items())}}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


@lru_cache(maxsize=1)
def _stored() -> dict:
    try:
        return json.loads(INTERVALS_JSON.read_text())
    except (OSError, ValueError):
        return {}


def interval_for(accelerator_name: str) -> Interval | None:
    """The stored interval of the accelerator's generation, or None (no calibration data)."""
    gen = GENERATION.get(accelerator_name)
    stored = _stored()
    entry = stored.get("generations", {}).get(gen) if gen else None
    if entry is None:
        return None
    return Interval(gen, float(stored.get("level", LEVEL)), float(entry["low"]), float(entry["high"]),
                    int(entry["rows"]), tuple(entry["sources"]), bool(entry["pooled"]))


def describe_interval(accelerator_name: str, tokens_per_s: float, step_time_s: float, mfu: float) -> dict:
    """The interval block an estimate carries (printed and in JSON)."""
    iv = interval_for(accelerator_name)
    if iv is None:
        gen = GENERATION.get(accelerator_name, accelerator_name)
        return {"level": LEVEL, "basis": f"no calibration data for {gen}: no prediction interval"}
    return {"level": iv.level, "tokens_per_s": [tokens_per_s * iv.low, tokens_per_s * iv.high],
            "step_time_s": [step_time_s / iv.high, step_time_s / iv.low], "mfu": [mfu * iv.low, mfu * iv.high],
            "basis": iv.basis()}
