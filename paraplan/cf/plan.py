"""Choose HEAT's tile size N1, refresh interval N2 (and threads where free) for a CF job.

Exact enumeration (the space is small: powers of two)::

    minimize    epoch_time(model, N1, N2, T)                     (paraplan.cf.cost)
    subject to  tile footprint 8d·N1 ≤ per-thread share of the target cache level  [capacity]
                (M/N2)·N1 ≥ S_min                                 [sampling space, HEAT §4.2]
                N1 ≥ r_min·n                                      [negatives per tile, HEAT Table 6]
                N1 ≤ I ;  N2 = b·2^j, or N2 = b/2^j ≥ MIN_REFRESH when N2 < b (then each
                thread's b iterations per step are b/N2 windows with their own tile)
    over        N1 ∈ {2^k}, T ∈ {given} or powers of two ≤ cores

Default S_min = max(M/8, 4·I): HEAT's accuracy-safe points keep N2/N1 ≤ 8 (Table 6, recall@20
within 0.001), and their chosen tiles give spaces of 4.9-6.5·I (Gowalla 810k·512/2048 ≈ 4.9·I,
AmazonBooks 2.38M·1024/4096 ≈ 6.5·I). On our synthetic validation set a space of 1.5·I lost 13%
of recall@20 while 6·I lost 4%, hence the 4·I floor.
Default r_min = 8: a tile must hold at least 8 rows per negative drawn from it, HEAT's smallest
accuracy-safe ratio (Table 6: N1 = 512 with 64 negatives on Gowalla; the others are 1024/64 = 16).
Without it the sampling-space bound alone admits tiles of a few rows at N2 ≈ N1 (space ≈ M), where
each iteration's n negatives repeat a handful of items; on our synthetic set N1 = 8 with n = 128
lost 4 points of recall@20 (0.071 vs 0.113), which is how we found the gap; the value 8 is the
paper's, not fitted to that run.

When no candidate meets every bound, the planner still returns its best plan and says which bound
it relaxed and by how much (:class:`Relaxation`). The tile's cache capacity is the point of tiling,
so it is kept while any tile fits it; the two quality bounds are relaxed as little as possible::

    q_s(c) = S_min / space(c),   q_r(c) = r_min·n / N1(c)      (> 1: bound violated by that factor)
    f*  = min_c max(q_s, q_r, 1)                                   smallest uniform relaxation
    f_r = max(1, min{q_r(c) : q_s(c) ≤ f*})                        rows per negative, as little as needed
    f_s = max(1, min{q_s(c) : q_r(c) ≤ f_r})                       then the sampling space
    admitted = {c : q_r(c) ≤ f_r and q_s(c) ≤ f_s}, ranked by predicted epoch time

(so a bound that was not in the way stays as set). Only when no tile fits the target cache level at
all (huge d) is capacity relaxed too: the tiles closest to fitting, footprint/share minimal.

Plans are ranked strictly by predicted epoch time (rank 1 = fastest); only exact ties go to the
larger sampling space. (An earlier version put plans within 1% of the best in order of sampling
space, which showed a slower plan above a faster one.)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from paraplan.cf.cost import (AnalyticalRates, Tiling, epoch_time, memory_levels, sampling_space,
                                    tile_footprint_bytes, tile_level)
from paraplan.errors import ConfigError, InfeasiblePlan
from paraplan.hardware.model import Cpu
from paraplan.cf.model import CFModel

MIN_REFRESH = 8   # smallest refresh interval N2 considered (iterations per tile)
MIN_TILE_PER_NEGATIVE = 8   # N1 ≥ 8·n (HEAT Table 6: 512/64 is the smallest accuracy-safe ratio)
MIN_TILE_ROWS = 8   # smallest tile considered
_EPS = 1e-9


@dataclass(frozen=True)
class TileChoice:
    rank: int
    tile_rows: int
    refresh_iterations: int
    threads: int
    predicted_epoch_s: float
    sampling_space: float
    footprint_bytes: float
    tile_level: str
    regime: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Relaxation:
    """A bound the planner had to loosen to return a plan: as set, as used, and the flag that sets it.

    ``factor`` = how far the best plan is from the bound (set/used for a minimum, used/set for the
    capacity maximum), always > 1."""
    bound: str          # "min_sampling_space", "min_rows_per_negative" or "cache_capacity"
    required: float     # the bound as set
    used: float         # the best plan's value
    flag: str           # the CLI flag that sets the bound ("" if none)
    hint: str = ""      # what would meet the bound instead

    @property
    def factor(self) -> float:
        return self.used / self.required if self.bound == "cache_capacity" else self.required / self.used

    def describe(self) -> str:
        """One line: which bound, as set and as used, by how much, and how to choose it yourself."""
        what = {"min_sampling_space": "sampling space (M/N2)·N1", "min_rows_per_negative": "tile rows per negative",
                "cache_capacity": "tile footprint (bytes) within the cache share"}[self.bound]
        rel = "above" if self.bound == "cache_capacity" else "below"
        line = (f"relaxed {what}: bound {self.required:.4g}, best plan {self.used:.4g} "
                f"({self.factor:.2f}x {rel} the bound)")
        if self.hint:
            line += f"; {self.hint}"
        if self.flag:
            line += f"; set the bound with {self.flag}"
        return line

    def as_dict(self) -> dict:
        return {"bound": self.bound, "required": self.required, "used": self.used,
                "factor": self.factor, "flag": self.flag, "hint": self.hint}


@dataclass(frozen=True)
class CFPlan:
    choices: tuple       # ranked, best first
    rejected: dict       # reason -> count
    min_sampling_space: float
    baseline_epoch_s: float
    rates_name: str
    min_rows_per_negative: float = MIN_TILE_PER_NEGATIVE
    relaxed: tuple = ()  # Relaxation, empty when every bound was met

    @property
    def best(self) -> TileChoice:
        return self.choices[0]


@dataclass(frozen=True)
class _Candidate:
    """One (N1, N2, T) with what the bounds need: footprint and cache share, sampling space."""
    tile_rows: int
    refresh_iterations: int
    threads: int
    footprint_bytes: float
    share_bytes: float
    sampling_space: float

    def shortfalls(self, smin: float, rows_needed: float) -> tuple[float, float]:
        """(q_s, q_r): factor by which the sampling-space and rows-per-negative bounds are missed (≤ 1: met)."""
        return smin / self.sampling_space, rows_needed / self.tile_rows


def default_min_sampling_space(model: CFModel) -> float:
    return max(model.iterations_per_epoch / 8.0, 4.0 * model.items)


def _pow2(lo: int, hi: int):
    v = 1
    while v <= hi:
        if v >= lo:
            yield v
        v *= 2


def _refresh_options(m: CFModel) -> list[int]:
    """N2 = b/2^j ≥ MIN_REFRESH dividing b, or b·2^j up to an epoch's iterations per thread."""
    b = m.per_thread_batch
    n2s = [b >> j for j in range(1, 16) if (b >> j) >= MIN_REFRESH and b % (b >> j) == 0]
    n2s += [b * 2 ** j for j in range(0, 16) if b * 2 ** j <= max(m.iterations_per_epoch // m.threads, b)]
    return sorted(n2s)


def _admit(cands: list[_Candidate], smin: float, rows_needed: float) -> tuple[list[_Candidate], float, float]:
    """The candidates within the least relaxation of the two quality bounds (module docstring):
    (admitted, f_s, f_r), f = 1 for a bound that was met."""
    q = [c.shortfalls(smin, rows_needed) for c in cands]
    f_all = min(max(qs, qr, 1.0) for qs, qr in q)
    f_r = max(1.0, min(qr for qs, qr in q if qs <= f_all * (1 + _EPS)))
    f_s = max(1.0, min(qs for qs, qr in q if qr <= f_r * (1 + _EPS)))
    keep = [c for c, (qs, qr) in zip(cands, q) if qs <= f_s * (1 + _EPS) and qr <= f_r * (1 + _EPS)]
    return keep, f_s, f_r


def plan_tiles(model: CFModel, cpu: Cpu, *, rates_for=None, threads: int | None = None,
               min_sampling_space: float | None = None, cache_level: str | None = None,
               max_tile_rows: int = 1 << 16, top: int | None = None,
               min_tile_per_negative: float = MIN_TILE_PER_NEGATIVE) -> CFPlan:
    """Rank (N1, N2, T) by predicted epoch time, relaxing bounds only when nothing meets them all.

    ``rates_for(model) -> rates`` supplies machine rates (default: analytical from ``cpu``);
    ``threads`` fixes T (default: ``model.threads``; pass 0 to let the planner choose);
    ``cache_level`` ('L1', 'L2', 'L3', ...) bounds the tile footprint (default: the last cache level).
    The result's ``relaxed`` names each bound it had to loosen (empty when all were met).
    """
    rates_for = rates_for or (lambda m: AnalyticalRates(cpu, m.threads, m.row_bytes))
    smin = default_min_sampling_space(model) if min_sampling_space is None else float(min_sampling_space)
    if not smin > 0:
        raise ConfigError("min_sampling_space", f"must be positive, got {smin}")
    if not min_tile_per_negative >= 0:
        raise ConfigError("min_rows_per_negative", f"must not be negative, got {min_tile_per_negative}")
    names = [f"L{c.level}" for c in cpu.caches]
    target = cache_level or names[-1]
    if target not in names:
        raise ConfigError("cache_level", f"{cpu.name} has no {target}", accepted=", ".join(names))
    if model.items < MIN_TILE_ROWS:
        raise ConfigError("items", f"{model.items} items cannot fill the smallest tile ({MIN_TILE_ROWS} rows)",
                          accepted=f"at least {MIN_TILE_ROWS} items")
    if threads == 0:
        t_opts = [t for t in _pow2(1, cpu.cores) if model.batch % t == 0]
    else:
        t_opts = [threads or model.threads]
    rows_needed = min_tile_per_negative * model.negatives
    cands, rejected = [], Counter()
    for T in t_opts:
        m = replace(model, threads=T)
        share = {lv.name: lv.share_bytes for lv in memory_levels(cpu, T, m.row_bytes)}[target]
        for N1 in _pow2(MIN_TILE_ROWS, min(model.items, max_tile_rows)):
            for N2 in _refresh_options(m):
                til = Tiling(N1, N2)
                c = _Candidate(N1, N2, T, tile_footprint_bytes(m, til), share, sampling_space(m, til))
                cands.append(c)
                if c.footprint_bytes > share:
                    rejected[f"tile exceeds {target} share"] += 1
                elif c.sampling_space < smin:
                    rejected["sampling space below minimum"] += 1
                elif N1 < rows_needed:
                    rejected[f"tile below {min_tile_per_negative:g} rows per negative"] += 1
    relaxed = []
    pool = [c for c in cands if c.footprint_bytes <= c.share_bytes]
    if not pool:   # no tile fits the cache level at all: the ones closest to fitting
        over = min(c.footprint_bytes / c.share_bytes for c in cands)
        pool = [c for c in cands if c.footprint_bytes / c.share_bytes <= over * (1 + _EPS)]
    admitted, f_s, f_r = _admit(pool, smin, rows_needed)
    rows = []
    for c in admitted:
        m = replace(model, threads=c.threads)
        til = Tiling(c.tile_rows, c.refresh_iterations)
        rows.append((epoch_time(m, til, rates_for(m)).seconds, -c.sampling_space, c, tile_level(cpu, m, til)))
    # strictly by predicted epoch time (fastest first); equal times go to the larger sampling space
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    best = ordered[0][2]
    if best.footprint_bytes > best.share_bytes:
        relaxed.append(Relaxation("cache_capacity", best.share_bytes, best.footprint_bytes, "--cache-level",
                                  f"one tile of {MIN_TILE_ROWS} rows does not fit the {target} share"))
    if f_r > 1.0:
        fit = max(c.tile_rows for c in pool)
        relaxed.append(Relaxation(
            "min_rows_per_negative", min_tile_per_negative, best.tile_rows / model.negatives, "--min-rows-per-negative",
            f"the largest tile within the {target} share holds {fit} rows, {int(fit // min_tile_per_negative)} "
            f"negatives or fewer would meet it"))
    if f_s > 1.0:
        relaxed.append(Relaxation("min_sampling_space", smin, best.sampling_space, "--min-sampling-space"))
    if top:
        ordered = ordered[:top]
    choices = tuple(TileChoice(i + 1, c.tile_rows, c.refresh_iterations, c.threads, t, c.sampling_space,
                               c.footprint_bytes, lv.name, lv.regime)
                    for i, (t, _, c, lv) in enumerate(ordered))
    m0 = replace(model, threads=choices[0].threads)
    return CFPlan(choices, dict(rejected), smin, epoch_time(m0, None, rates_for(m0)).seconds, rates_for(m0).name,
                  min_rows_per_negative=min_tile_per_negative, relaxed=tuple(relaxed))




def heat_tile_rows(cpu: Cpu, threads: int, dim: int, level: int = 2) -> int:
    """HEAT's capacity rule for the tile size (ICS'23 Algorithm 1, N1 = f_a(s_l2, s_l3, T, d):
    "num_threads·N1 embeddings can be held in the L2 cache"): the largest power of two N1 with
    T·N1·4d ≤ the aggregate L2 of the cores the T threads run on.

    The aggregate is per-instance size × instances covering ``min(T, cores)`` cores (HEAT §5.1
    counts the EPYC 7742's L2 as "32 MB": 64 × 512 KiB). This is the paper's rule for its C++
    kernel, where per-iteration work does not grow with N1; :func:`plan_tiles` instead prices the
    torch kernel, whose similarity block does.
    """
    c = next((c for c in cpu.caches if c.level == level), None)
    if c is None:
        raise ConfigError("level", f"{cpu.name} has no L{level}")
    if threads < 1 or dim < 1:
        raise ConfigError("threads", f"threads {threads} and dim {dim} must be positive")
    cores = min(threads, cpu.cores)
    instances = -(-cores // max(c.shared_by_cores, 1))
    budget = c.size_bytes * instances / (threads * 4 * dim)
    if budget < 1:
        raise InfeasiblePlan(f"one row per thread does not fit the L{level} of {cpu.name}")
    n1 = 1
    while n1 * 2 <= budget:
        n1 *= 2
    return n1
