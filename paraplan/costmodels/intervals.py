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

A generation with fewer than ``MIN_ROWS`` rows or fewer than ``MIN_SOURCES`` (3) sources borrows the residuals of all
generations pooled and says so; a generation with no rows at all gets no interval, and the estimate
says that its hardware has no calibration data. The stored file names its inputs and the date.

**Widening away from the evidence** (normalized split-conformal, Papadopoulos et al. 2002 /
Lei et al. 2018 "Distribution-free predictive inference for regression" sec. 5.2, on leave-one-source-out
residuals). A plan's *evidence distance* D is the L1 distance, over the features of
:class:`Evidence` (sequence length, GPU count, model size: log2 ratios over their scales; MoE or
dense, engine, fp8 or not, hardware generation: a mismatch costs its weight), to the nearest
calibration row. A calibration row's residual r (ln measured/predicted, predicted with the curves
refitted without its source: ``benchmarks/accuracy.py``) is scored s = r / (1 + k·D), D measured to
the *other* sources' rows; the quantiles above are taken of s, and a plan at distance D gets
``[low^(1+k·D), high^(1+k·D)]``. k is the smallest of a grid whose leave-one-source-out coverage
reaches the nominal level. The scales, k and the evidence rows live in
``paraplan/data/prediction_intervals.json`` with how they were fitted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paraplan.io import write_atomic
from paraplan.engines import Engine
from paraplan.modes import is_fp8

INTERVALS_JSON = Path(__file__).parents[1] / "data" / "prediction_intervals.json"
LEVEL = 0.9
MIN_ROWS = 8
#: sources a generation needs for intervals of its own: with two, nothing measures how far a third lies
MIN_SOURCES = 3
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
                    f"has too few of its own (fewer than {MIN_ROWS} rows, or fewer than {MIN_SOURCES} sources)")
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
    least MIN_ROWS from at least MIN_SOURCES sources, else every generation's rows pooled. Two sources
    are not enough: leaving one out (benchmarks/accuracy.py) left H100-class with two sources that agree
    and torchtitan's power-capped rows 8-25 % below their interval (41.7 % covered; 91.7 % pooled)."""
    own = list(residuals.get(generation, ()))
    if len(own) >= MIN_ROWS and (len({s for s, _ in own}) >= MIN_SOURCES or generation == MOE_REGIME):
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


def write_intervals(intervals: Mapping[str, Interval], inputs: Sequence[str], path: Path = INTERVALS_JSON,
                    widening: Mapping | None = None, evidence: Sequence["Evidence"] = (),
                    scales: Mapping[str, float] | None = None, p10: Mapping[str, float] | None = None) -> None:
    """Stores the intervals per group, the widening slope k with how it was fitted, the distance
    scales and the calibration rows' features (the evidence a plan's distance is measured to)."""
    doc = {"level": LEVEL, "inputs": list(inputs),
           "method": ("source-weighted quantiles of s = ln(measured/predicted throughput) / (1 + k * D) per generation "
                      "(MoE apart), predicted with the efficiency curves refitted without the row's source and D its "
                      "evidence distance to the other sources' rows, at the quantile level whose leave-one-source-out "
                      "coverage reaches the nominal level (benchmarks/accuracy.py --write-intervals)"),
           "distance": {"scales": dict(scales or DEFAULT_SCALES), "how": SCALES_HOW},
           "widening": dict(widening or {"k": 0.0}),
           "generations": {g: {"low": round(i.low, 4), "high": round(i.high, 4), "rows": i.rows,
                               "sources": list(i.sources), "pooled": i.pooled,
                               "quantile_level": i.quantile_level,
                               **({"p10": round(p10[g], 4)} if p10 and g in p10 else {})}
                           for g, i in sorted(intervals.items())},
           "evidence": {"columns": list(EVIDENCE_COLUMNS), "rows": "__ROWS__"}}
    rows = sorted({e.as_row() for e in evidence})
    text = json.dumps(doc, indent=1).replace('"__ROWS__"', "[\n" + ",\n".join(f"   {json.dumps(r)}" for r in rows) + "\n  ]")
    write_atomic(path, text + "\n")


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


def conformal_rank(n: int, level: float = LEVEL) -> int:
    """ceil(level·(n + 1)), the rank of the split-conformal bound among n residuals (rounded first:
    0.9·10 is 9.000000000000002 in floating point)."""
    return int(np.ceil(round(level * (n + 1), 9)))


#: calibration runs a calibrated cluster needs for an interval of its own: the split-conformal bound at LEVEL
#: is the ceil(LEVEL·(n + 1))-th smallest of n residuals, which exists from n = 9 on (Vovk et al. 2005; Lei et
#: al. 2018, "Distribution-free predictive inference for regression", sec. 2.2)
MIN_CALIBRATION_RUNS = next(n for n in range(1, 10_000) if conformal_rank(n) <= n)


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def conformal_multipliers(residuals: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, p10) throughput multipliers from a calibrated cluster's leave-one-run-out residuals
    r = ln(measured / predicted): split conformal on |r| (q the ceil(level·(n + 1))-th smallest; low e^-q,
    high e^q: a new run of the same kind falls inside with probability ≥ level, the runs exchangeable), and
    the 10 % quantile of r as the p10 multiplier. Needs MIN_CALIBRATION_RUNS residuals."""
    r = np.asarray(residuals, dtype=float)
    k = conformal_rank(len(r), level)
    if k > len(r):
        raise ValueError(f"{len(r)} residuals are too few for a {level:.0%} conformal bound")
    q = float(np.sort(np.abs(r))[k - 1])
    return float(np.exp(-q)), float(np.exp(q)), float(np.exp(np.quantile(r, 0.1)))


def describe_interval(accelerator_name: str, tokens_per_s: float, step_time_s: float, mfu: float,
                      moe: bool = False, evidence: "Evidence | None" = None,
                      calibration_residuals: Sequence[float] = ()) -> dict:
    """The interval block an estimate carries (printed and in JSON): the group's multipliers raised to
    1 + k·D (D: ``evidence``'s distance to the stored calibration rows), the distance and the plain
    extrapolation notes (:func:`extrapolation_notes`). On a cluster calibrated to the user's runs with
    MIN_CALIBRATION_RUNS of them or more (``calibration_residuals``), the interval is theirs instead
    (:func:`conformal_multipliers`): what those runs measured, not the published rows."""
    n_cal = len(calibration_residuals)
    dist, notes = None, []
    if n_cal >= MIN_CALIBRATION_RUNS:
        level = LEVEL
        low, high, p10 = conformal_multipliers(calibration_residuals)
        basis = (f"the {n_cal} runs this cluster was calibrated on (paraplan calibrate), each predicted "
                 f"leave-one-run-out: split conformal, the {_ordinal(conformal_rank(n_cal))} smallest of their "
                 f"|ln(measured / predicted)|; plans unlike those runs may fall outside it")
    else:
        iv = interval_for(accelerator_name, moe)
        if iv is None:
            gen = GENERATION.get(accelerator_name, accelerator_name)
            return {"level": LEVEL, "basis": f"no calibration data for {gen}: no prediction interval"}
        level, low, high, p10 = iv.level, iv.low, iv.high, _stored_p10(iv.generation)
        if evidence is not None:
            stored = stored_evidence()
            if stored:
                dist = evidence_distance(evidence, stored, stored_scales())
                widen = 1.0 + widening_k() * dist
                low, high, p10 = low ** widen, high ** widen, (p10 ** widen if p10 is not None else None)
                notes = extrapolation_notes(evidence, stored)
        basis = iv.basis()
        if n_cal:
            basis += (f" (this cluster was calibrated on {n_cal} run{'s' * (n_cal != 1)}: too few for an interval "
                      f"of their own, {MIN_CALIBRATION_RUNS} needed)")
    out = {"level": level, "tokens_per_s": [tokens_per_s * low, tokens_per_s * high],
           "step_time_s": [step_time_s / high, step_time_s / low], "mfu": [mfu * low, mfu * high],
           "basis": basis}
    if p10 is not None:
        out["tokens_per_s_p10"] = tokens_per_s * p10
    if dist is not None:
        out["evidence_distance"] = round(dist, 3)
        out["extrapolating"] = notes
    return out


# --- evidence: the features a plan's distance from the calibration rows is measured on ---------------

EVIDENCE_COLUMNS = ("source", "generation", "seq_len", "gpus", "params", "moe", "engine", "fp8", "pp", "cp", "ep")

#: log2 units per unit of distance (numeric features) and the cost of a mismatch (categorical)
DEFAULT_SCALES = {"seq_len": 1.0, "gpus": 2.0, "params": 2.0, "pp": 2.0, "cp": 1.0, "ep": 2.0, "moe": 1.0,
                  "engine": 0.5, "fp8": 0.5, "generation": 1.0}
NUMERIC = ("seq_len", "gpus", "params", "pp", "cp", "ep")
#: the engine-agnostic default (paraplan.modes.Engine.GENERIC): it matches every calibration row's engine
GENERIC_ENGINE = Engine.GENERIC.label
SCALES_HOW = ("chosen, not fitted: one unit of distance = a doubling of the sequence, 4x the GPUs or 4x the "
              "parameters, 4x the pipeline depth, a doubling of the context-parallel degree, 4x the expert-parallel degree, an MoE "
              "model against dense rows, another hardware generation; half a unit = another "
              "engine or another number format (fp8 against 16-bit). Only k (widening) is fitted on them")


@dataclass(frozen=True)
class Evidence:
    """The features of a run that its calibration evidence is judged on."""
    source: str
    generation: str
    seq_len: int
    gpus: int
    params: float
    moe: bool
    engine: str
    fp8: bool
    pp: int = 1
    cp: int = 1
    #: the expert-parallel degree (1 for a dense model): an MoE layer's all-to-all span, its local experts and
    #: their GEMM sizes move with it
    ep: int = 1

    def as_row(self) -> tuple:
        return (self.source, self.generation, int(self.seq_len), int(self.gpus), float(self.params),
                bool(self.moe), self.engine, bool(self.fp8), int(self.pp), int(self.cp), int(self.ep))


def features_of(model, job, cluster, plan, source: str = "") -> Evidence:
    """The evidence features of an estimate's inputs."""
    return Evidence(source, GENERATION.get(cluster.accelerator.name, cluster.accelerator.name), int(job.seq_len),
                    int(cluster.num_gpus), float(model.num_params), model.moe is not None, str(plan.engine),
                    bool(is_fp8(plan.dtype)), int(plan.pp), int(plan.cp), int(plan.ep) if model.moe is not None else 1)


def _arrays(rows: Sequence[Evidence]) -> dict:
    return {"generation": np.array([r.generation for r in rows]), "seq_len": np.log2([r.seq_len for r in rows]),
            "gpus": np.log2([r.gpus for r in rows]), "params": np.log2([r.params for r in rows]),
            "moe": np.array([r.moe for r in rows]), "engine": np.array([r.engine for r in rows]),
            "fp8": np.array([r.fp8 for r in rows]), "pp": np.log2([r.pp for r in rows]),
            "cp": np.log2([r.cp for r in rows]), "ep": np.log2([r.ep for r in rows])}


def distances_to(x: Evidence, rows: Sequence[Evidence], scales: Mapping[str, float] = DEFAULT_SCALES) -> np.ndarray:
    """D(x, row) per row: sum over numeric features of |log2(x / row)| / scale, plus each categorical
    feature's weight where x and the row differ."""
    a = _stored_arrays() if rows is stored_evidence() else _arrays(rows)
    d = np.zeros(len(rows))
    for f in NUMERIC:
        d += np.abs(a[f] - np.log2(getattr(x, f))) / scales[f]
    for f in ("moe", "fp8", "generation"):
        d += scales[f] * (a[f] != getattr(x, f))
    if x.engine != GENERIC_ENGINE:      # the engine-agnostic default is no engine of its own: no mismatch
        d += scales["engine"] * (a["engine"] != x.engine)
    return d


def evidence_distance(x: Evidence, rows: Sequence[Evidence], scales: Mapping[str, float] = DEFAULT_SCALES) -> float:
    """Distance to the nearest row (0: a calibration row has x's features); inf without rows."""
    return float(distances_to(x, rows, scales).min()) if len(rows) else float("inf")


def held_out_distances(rows: Sequence[Evidence], scales: Mapping[str, float] = DEFAULT_SCALES,
                       exclude: str | None = None) -> np.ndarray:
    """Each row's distance to the rows of the other sources (and not of ``exclude``): how far it
    lies from the evidence when its own source is held out."""
    src = np.array([r.source for r in rows])
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        keep = (src != r.source) & (src != exclude) if exclude is not None else src != r.source
        d = distances_to(r, rows, scales)[keep]
        out[i] = d.min() if d.size else np.inf
    return out


def _fmt_count(n: float) -> str:
    return f"{n / 1e12:.1f}T" if n >= 1e12 else f"{n / 1e9:.0f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def extrapolation_notes(x: Evidence, rows: Sequence[Evidence]) -> list[str]:
    """Plain notes where ``x`` lies outside the calibration rows of its hardware generation (all rows
    where the generation has none): a sequence, GPU count, model size, pipeline depth or context-parallel degree
    beyond their range, an MoE model's expert-parallel degree outside the range of the MoE rows, an MoE
    model, engine or number format none of them ran. Empty: within the evidence on every feature."""
    own = [r for r in rows if r.generation == x.generation]
    notes = [] if own else [f"extrapolating: no calibration row on {x.generation}"]
    pool = own or list(rows)
    where = f"{x.generation} calibration rows" if own else "calibration rows"
    for f, what, fmt in (("seq_len", "sequence", str), ("gpus", "GPUs", str), ("params", "model size", _fmt_count),
                         ("pp", "pipeline depth", str), ("cp", "context parallelism", str)):
        vals = [getattr(r, f) for r in pool]
        v = getattr(x, f)
        if v > max(vals) * 1.001:
            notes.append(f"extrapolating: {what} {fmt(v)}, {where} reach {fmt(max(vals))}")
        elif v < min(vals) * 0.999:
            notes.append(f"extrapolating: {what} {fmt(v)}, {where} start at {fmt(min(vals))}")
    same_kind = [r for r in pool if r.moe == x.moe]
    if x.moe and same_kind:
        eps = [r.ep for r in same_kind]
        if x.ep > max(eps):
            notes.append(f"extrapolating: expert parallelism {x.ep}, {where} of MoE models reach {max(eps)}")
        elif x.ep < min(eps):
            notes.append(f"extrapolating: expert parallelism {x.ep}, {where} of MoE models start at {min(eps)}")
    if not same_kind:
        notes.append(f"extrapolating: {'an MoE' if x.moe else 'a dense'} model, no {where} of one")
    if x.engine != GENERIC_ENGINE and not any(r.engine == x.engine for r in same_kind or pool):
        notes.append(f"extrapolating: engine {x.engine}, no {where} of {'MoE' if x.moe else 'dense'} models ran it")
    if not any(r.fp8 == x.fp8 for r in pool):
        notes.append(f"extrapolating: {'fp8' if x.fp8 else '16-bit'} GEMMs, no {where} ran them")
    return notes


@lru_cache(maxsize=1)
def stored_evidence() -> tuple[Evidence, ...]:
    return tuple(Evidence(*row) for row in _stored().get("evidence", {}).get("rows", ()))


@lru_cache(maxsize=1)
def _stored_arrays() -> dict:
    return _arrays(stored_evidence())


def stored_scales() -> dict:
    return {**DEFAULT_SCALES, **_stored().get("distance", {}).get("scales", {})}


def widening_k() -> float:
    return float(_stored().get("widening", {}).get("k", 0.0))


def _stored_p10(group: str) -> float | None:
    entry = _stored().get("generations", {}).get(group, {})
    return float(entry["p10"]) if "p10" in entry else None
