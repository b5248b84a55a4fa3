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
class CFPlan:
    choices: tuple       # ranked, best first
    rejected: dict       # reason -> count
    min_sampling_space: float
    baseline_epoch_s: float
    rates_name: str

    @property
    def best(self) -> TileChoice:
        return self.choices[0]


def default_min_sampling_space(model: CFModel) -> float:
    return max(model.iterations_per_epoch / 8.0, 4.0 * model.items)


def _pow2(lo: int, hi: int):
    v = 1
    while v <= hi:
        if v >= lo:
            yield v
        v *= 2


def plan_tiles(model: CFModel, cpu: Cpu, *, rates_for=None, threads: int | None = None,
               min_sampling_space: float | None = None, cache_level: str | None = None,
               max_tile_rows: int = 1 << 16, top: int | None = None,
               min_tile_per_negative: float = MIN_TILE_PER_NEGATIVE) -> CFPlan:
    """Rank feasible (N1, N2, T) by predicted epoch time.

    ``rates_for(model) -> rates`` supplies machine rates (default: analytical from ``cpu``);
    ``threads`` fixes T (default: ``model.threads``; pass 0 to let the planner choose);
    ``cache_level`` ('L1', 'L2', 'L3', ...) bounds the tile footprint (default: the last cache level).
    """
    rates_for = rates_for or (lambda m: AnalyticalRates(cpu, m.threads, m.row_bytes))
    smin = default_min_sampling_space(model) if min_sampling_space is None else float(min_sampling_space)
    if smin <= 0:
        raise ConfigError("min_sampling_space", f"must be positive, got {smin}")
    names = [f"L{c.level}" for c in cpu.caches]
    target = cache_level or names[-1]
    if target not in names:
        raise ConfigError("cache_level", f"{cpu.name} has no {target}", accepted=", ".join(names))
    if threads == 0:
        t_opts = [t for t in _pow2(1, cpu.cores) if model.batch % t == 0]
    else:
        t_opts = [threads or model.threads]
    rows, rejected = [], Counter()
    for T in t_opts:
        m = replace(model, threads=T)
        rates = rates_for(m)
        share = {lv.name: lv.share_bytes for lv in memory_levels(cpu, T, m.row_bytes)}[target]
        b = m.per_thread_batch
        n2s = [b >> j for j in range(1, 16) if (b >> j) >= MIN_REFRESH and b % (b >> j) == 0]
        n2s += [b * 2 ** j for j in range(0, 16) if b * 2 ** j <= max(m.iterations_per_epoch // T, b)]
        for N1 in _pow2(8, min(model.items, max_tile_rows)):
            for N2 in sorted(n2s):
                til = Tiling(N1, N2)
                if tile_footprint_bytes(m, til) > share:
                    rejected[f"tile exceeds {target} share"] += 1
                    continue
                if sampling_space(m, til) < smin:
                    rejected["sampling space below minimum"] += 1
                    continue
                if N1 < min_tile_per_negative * m.negatives:
                    rejected[f"tile below {min_tile_per_negative:g} rows per negative"] += 1
                    continue
                lv = tile_level(cpu, m, til)
                rows.append((epoch_time(m, til, rates).seconds, -sampling_space(m, til), N1, N2, T, lv))
    if not rows:
        raise InfeasiblePlan(
            f"no tile fits: {dict(rejected)}; the sampling-space minimum {smin:.0f} needs N1/N2 ≥ "
            f"{smin / model.iterations_per_epoch:.3g} and tiles need ≥ {min_tile_per_negative:g}·n = "
            f"{min_tile_per_negative * model.negatives:.0f} rows; try a larger cache level, fewer threads, "
            f"fewer negatives or a lower --min-sampling-space / --min-tile-per-negative")
    # strictly by predicted epoch time (fastest first); equal times go to the larger sampling space
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    if top:
        ordered = ordered[:top]
    choices = tuple(TileChoice(i + 1, N1, N2, T, t, -negs, tile_footprint_bytes(model, Tiling(N1, N2)), lv.name,
                               lv.regime) for i, (t, negs, N1, N2, T, lv) in enumerate(ordered))
    T0 = choices[0].threads
    m0 = replace(model, threads=T0)
    return CFPlan(choices, dict(rejected), smin, epoch_time(m0, None, rates_for(m0)).seconds, rates_for(m0).name)


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
