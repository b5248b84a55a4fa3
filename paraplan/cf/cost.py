"""Cost model of SimpleX/CCL training steps on a CPU: bytes, FLOPs, where reads hit, epoch time.

Pure functions. Two sources of machine rates share one step model:

* :class:`AnalyticalRates` from a :class:`~paraplan.hardware.model.Cpu` description only;
* :class:`ProfiledRates` from a measured :class:`~paraplan.cf.profile.CpuProfile`
  (row-gather time vs working-set size, bmm FLOP/s, streaming bandwidth, op overhead).

Step time is a non-overlapping sum (ECM-style: Treibig & Hager, arXiv:0905.0792, without overlap), op class by op
class as counted from the torch kernels with the profiler::

    t_step = Σ_reads rows·t_row(footprint, X)/T + Σ_bmm t_bmm(form, G, m, k, n) + Σ_ew ops·t_ew(bytes)
             + Σ_bool ops·t_bool(bytes) + Σ_red ops·t_red(bytes) + t_zeros(B·N1)
             + Σ_index_add rows·t_ia(table, X)/T
             + rng·t_rng + scalars·t_index + fresh_bytes·t_fault + t_fixed
    t_epoch = ⌈M/B⌉·t_step + M·t_randperm

X is the step's traffic (:func:`step_traffic_bytes`, the bytes it writes besides the tables): a
row the step gathers was last touched a step ago and is updated at the step's end, with X bytes
of other data through the caches in between, so row times are looked up at (footprint, X);
t_fixed = ops·t_op (analytical) or the kernel's measured time per step at tiny sizes (profiled);
t_bmm comes from a measured (m, N1) grid per product form, so the similarity block's FLOPs that
grow with N1 are priced at the rate of their shape; fresh_bytes are the page faults of memory
glibc hands back to the OS every step (:func:`fresh_bytes_per_step`). No term is fitted to the
kernels' own timings: every rate is a microbenchmark of one primitive on random tensors.

Where a random row read hits: for each cache level L the per-thread share S_L is
the level's size divided by the threads that share one instance (``min(shared_by_cores, T)``,
so Zen's 16 MB L3 is per 4-core CCX, not per socket). Data private to a thread (its tile) of
footprint F hits level L with probability min(1, S_L/F); data shared by all threads (the
embedding tables) is compared undivided with S_L·sharers (one instance's capacity) for shared
levels and with S_L for private ones. The per-row time is the hit-weighted sum of the level times.
Each level's row time is the larger of a latency bound ``lines·latency/MLP`` and a bandwidth bound
``row_bytes/bandwidth`` (rows gathered at random are usually latency- and MLP-bound).

Departures: positive and history reads are charged as uniform over the item table (Che's LRU
approximation for skewed popularity, Fricker, Robert and Roberts, arXiv:1202.3974, would make them
cheaper); the torch
implementation's elementwise passes and op counts were counted from ``validation/cf_kernels.py``
and the torch profiler, and are constants of that implementation, not of HEAT's C++.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from paraplan.constants import fitted
from paraplan.errors import ConfigError
from paraplan.hardware.model import Cpu
from paraplan.cf.model import CFModel

# Analytical figures a profile replaces (estimates, with their units: fitted_constants.yaml)
MLP_MISSES_PER_CORE = fitted("cf_misses_per_core")
ANALYTICAL_GEMM_EFFICIENCY = fitted("cf_small_gemm_efficiency")
ANALYTICAL_OP_OVERHEAD_S = fitted("cf_torch_op_overhead")
ANALYTICAL_RNG_S_PER_ELEMENT = fitted("cf_randint_time")
ANALYTICAL_INDEX_S_PER_ELEMENT = fitted("cf_index_time")
# Op counts per step by tensor-size class, counted with torch.profiler(record_shapes=True) on the
# kernels of validation/cf_kernels.py (top-level aten ops; views and transposes cost no data pass).
# They are constants of this torch implementation, not of HEAT's C++, and were counted, not fitted.
TILED_OPS_PER_STEP = 76         # top-level aten ops of one tiled step (profiler: 76.25 incl. batching)
BASELINE_OPS_PER_STEP = 106     # forward + autograd backward + optimizer (profiler: 106.25)
TILED_EW_OPS_TILE = 5           # on G×N1×d: div ×2, mul ×2, sub ×1 (normalize fwd and bwd)
TILED_RED_OPS_TILE = 2          # on G×N1×d: norm, sum
TILED_EW_OPS_BLOCK = 1          # on B×N1: zeros_like (the bmm outputs are in the bmm times)
TILED_EW_OPS_BN = 3             # on B×n: sub, relu, mul (gather/scatter_add are indexed scalars)
TILED_BOOL_OPS_BN = 1           # on B×n: gt then to(float), a comparison and a cast (profiled as one)
EW_OPS_BD_TILED = 14            # on B×d: mul ×7, div ×4, sub ×2, add ×1
EW_OPS_BD_BASELINE = 26         # on B×d: div ×10, mul ×7, neg ×2, masked_fill ×2, add_ ×2, add, ...
RED_OPS_BD = 5                  # on B×d: norm ×2, sum ×3
BASELINE_EW_OPS_BND = 10        # on B×n×d: div ×5, mul ×2, neg, masked_fill_, add_ (grad accumulation)
BASELINE_RED_OPS_BND = 4        # on B×n×d: norm, sum, 2 matrix-vector bmm (read the copy once each)
BASELINE_LIVE_BND = 7           # B×n×d tensors live at the step's peak, read off the autograd graph of
                                # baseline_step: the gathered copy and its normalized form (saved), the
                                # bmm's outer-product gradient, and in DivBackward grad/denom, −grad,
                                # −grad·x, and NormBackward's x·(grad/‖x‖) before the two are summed
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20  # mallopt(3): dynamic mmap threshold grows to the largest freed
                                       # chunk, at most 32 MiB on 64-bit; the trim threshold is twice it
GLIBC_MMAP_THRESHOLD_MIN = 128 * 1024
ANALYTICAL_FAULT_S_PER_BYTE = fitted("cf_page_fault_time") / 4096   # a 4 KiB page fault, per byte
BASELINE_EW_OPS_BN = 9          # on B×n: clamp_min, sub, relu, threshold_backward, ge, where, eq, ...


@dataclass(frozen=True)
class Tiling:
    """HEAT's tile: N1 item rows per thread, redrawn every N2 iterations of that thread."""
    tile_rows: int
    refresh_iterations: int

    def __post_init__(self):
        for name in ("tile_rows", "refresh_iterations"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(name, f"must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class Level:
    """One memory level as a thread sees it."""
    name: str
    share_bytes: float        # capacity per thread (private) or per instance (shared data)
    instance_bytes: float
    row_time_s: float
    regime: str               # "latency" or "bandwidth"
    stream_bytes_per_s: float  # all threads together


def _check_threads(cpu: Cpu, threads: int) -> None:
    if threads < 1 or threads > cpu.cores * cpu.threads_per_core:
        raise ConfigError("threads", f"{threads} is outside 1..{cpu.cores * cpu.threads_per_core} for {cpu.name}")


def memory_levels(cpu: Cpu, threads: int, row_bytes: int) -> list[Level]:
    """Cache levels then DRAM, with per-thread shares and per-row times.

    t_row(L) = max(⌈row/line⌉·latency_L/MLP, row/(bw_L per core)); DRAM: max(lines·t_mem/MLP,
    row·T/BW_mem) (a cache-aware roofline: Ilic, Pratas and Sousa, IEEE CAL 2014). Private levels (``shared_by_cores`` = 1) give each
    thread the whole size; a level shared by k cores gives size/min(k, T).
    """
    _check_threads(cpu, threads)
    f = cpu.frequency_hz
    out = []
    line = 64
    for c in cpu.caches:
        line = c.line_bytes
        sharers = 1 if c.shared_by_cores <= 1 else min(c.shared_by_cores, threads)
        lines = math.ceil(row_bytes / c.line_bytes)
        lat = lines * c.latency_cycles / f / MLP_MISSES_PER_CORE
        bw = row_bytes / (c.bandwidth_bytes_per_cycle_per_core * f)
        instances = max(1, math.ceil(threads / max(c.shared_by_cores, 1)))
        stream = c.bandwidth_bytes_per_cycle_per_core * f * threads
        out.append(Level(f"L{c.level}", c.size_bytes / sharers, c.size_bytes * min(instances, 1),
                         max(lat, bw), "latency" if lat >= bw else "bandwidth", stream))
    lines = math.ceil(row_bytes / line)
    lat = lines * cpu.memory_latency_s / MLP_MISSES_PER_CORE
    bw = row_bytes * threads / cpu.memory_bandwidth_bytes_per_s
    out.append(Level("DRAM", math.inf, math.inf, max(lat, bw), "latency" if lat >= bw else "bandwidth",
                     min(cpu.memory_bandwidth_bytes_per_s, out[-1].stream_bytes_per_s if out else math.inf)))
    return out


def hit_fractions(levels: list[Level], footprint_bytes: float, shared: bool,
                  traffic_per_thread_bytes: float = 0.0) -> list[float]:
    """Fraction of random reads served by each level: h_L − h_{L−1} with h_L = min(1, S_L/(F + x_L)).

    x_L is the other data that passes through the level between two visits to the footprint
    (reuse distance): each thread writes ``traffic_per_thread_bytes`` per step, and a level
    instance sees the traffic of every thread sharing it when the footprint is compared with the
    whole instance (shared data at a shared level)."""
    fr, prev = [], 0.0
    for lv in levels:
        cap = lv.share_bytes
        extra = traffic_per_thread_bytes
        if shared and lv.name != "DRAM" and lv.instance_bytes > cap:
            extra = traffic_per_thread_bytes * lv.instance_bytes / cap
            cap = lv.instance_bytes
        foot = footprint_bytes + extra
        h = 1.0 if foot <= 0 else min(1.0, cap / foot)
        h = max(h, prev)
        fr.append(h - prev)
        prev = h
    return fr


@dataclass(frozen=True)
class AnalyticalRates:
    """Rates derived from the CPU description alone."""
    cpu: Cpu
    threads: int
    row_bytes: int

    @property
    def name(self) -> str:
        return f"analytical:{self.cpu.name}"

    def levels(self) -> list[Level]:
        return memory_levels(self.cpu, self.threads, self.row_bytes)

    def row_time_s(self, footprint_bytes: float, shared: bool, traffic_bytes: float = 0.0,
                   call_rows: float = 512) -> float:
        """Hit-weighted row time; ``traffic_bytes``: what all threads write per step besides
        (the call size is not modelled analytically)."""
        lv = self.levels()
        fr = hit_fractions(lv, footprint_bytes, shared, traffic_bytes / self.threads)
        return float(sum(h * l.row_time_s for h, l in zip(fr, lv)))

    def stream_bytes_per_s(self, tensor_bytes: float) -> float:
        for lv in self.levels():
            if tensor_bytes / self.threads <= lv.share_bytes:
                return lv.stream_bytes_per_s
        return self.levels()[-1].stream_bytes_per_s

    @property
    def gemm_flops_per_s(self) -> float:
        return self.cpu.peak_fp32_flops * min(self.threads, self.cpu.cores) / self.cpu.cores * ANALYTICAL_GEMM_EFFICIENCY

    op_overhead_s: float = ANALYTICAL_OP_OVERHEAD_S
    rng_s_per_element: float = ANALYTICAL_RNG_S_PER_ELEMENT
    index_s_per_element: float = ANALYTICAL_INDEX_S_PER_ELEMENT
    fault_s_per_byte: float = ANALYTICAL_FAULT_S_PER_BYTE

    def index_s(self, block_bytes: float) -> float:
        """Seconds per indexed scalar (estimate; the block size is not modelled analytically)."""
        return self.index_s_per_element

    @property
    def perm_s_per_element(self) -> float:
        return 2.0 * self.rng_s_per_element

    def fixed_step_s(self, tiled: bool, ops: int, traffic_bytes: float = 0.0) -> float:
        """Per-step fixed cost: torch ops counted in the kernels × dispatch overhead (the
        traffic's effect on it is not modelled analytically)."""
        return ops * self.op_overhead_s

    def ew_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """One out-of-place elementwise op: read two operands, write one, at the streaming rate
        of the level that holds them (dispatch overhead is in :meth:`fixed_step_s`)."""
        return 3.0 * nbytes / self.stream_bytes_per_s(3.0 * nbytes)

    def red_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        return nbytes / self.stream_bytes_per_s(nbytes)

    def zeros_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        return nbytes / self.stream_bytes_per_s(nbytes)

    def bmm_s(self, form: str, G: int, m: int, k: int, n: int, traffic_bytes: float = 0.0) -> float:
        """G products m×k·k×n at the analytical GEMM rate, or at the streaming rate of their
        operands when that is slower (skinny products are memory-bound)."""
        nbytes = 4.0 * G * (m * k + k * n + m * n)
        return max(2.0 * G * m * k * n / self.gemm_flops_per_s, nbytes / self.stream_bytes_per_s(nbytes))

    def index_add_row_s(self, table_bytes: float, traffic_bytes: float = 0.0, call_rows: float = 512) -> float:
        """Read-modify-write of one random row: twice a row read."""
        return 2.0 * self.row_time_s(table_bytes, True, traffic_bytes)

    def bool_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """``(x > c).to(float)`` writing ``nbytes``: two passes (estimate: twice an elementwise op)."""
        return 2.0 * self.ew_s(nbytes)


def _traffic_axis(nbytes):
    """Where traffic X sits on the profile's traffic axes: log2(1 + X/MiB) (0 for none, then
    roughly log-spaced); interpolation over X is linear in this."""
    return np.log2(1.0 + np.maximum(np.asarray(nbytes, float), 0.0) / 2**20)


@dataclass(frozen=True)
class ProfiledRates:
    """Rates measured on this machine (see :mod:`paraplan.cf.profile`).

    The measured row-gather curve t(W) is for one table of W bytes shared by the profile's
    threads; a private footprint F per thread is looked up at W = F·T. Rows of another size are
    scaled by the ratio of cache lines.
    """
    profile: object
    row_bytes: int

    @property
    def threads(self) -> int:
        return self.profile.threads

    @property
    def name(self) -> str:
        return f"profiled:{self.profile.host or 'local'}"

    def _row_grid_time(self, grid, w: float, traffic_bytes: float, call_rows: float) -> float:
        """Per-row seconds from a measured (rows per call × table bytes × traffic bytes) grid:
        log-log in W and in rows per call (clamped), linear in log2(1 + X/MiB); each traffic
        column made non-increasing in W from the top (a gather over a working set is no slower
        than over any larger one: drops noise at the small end) and each W row non-decreasing in
        X (more traffic never warms a cache)."""
        p = self.profile
        ws = np.log(np.asarray(p.ws_bytes, float))
        xs, x = _traffic_axis(p.traffic_bytes), _traffic_axis(traffic_bytes)
        per_r = []
        for sl in grid:
            t = np.log(np.asarray(sl, float))                       # [W][X]
            t = np.minimum.accumulate(t[::-1], axis=0)[::-1]
            t = np.maximum.accumulate(t, axis=1)
            col = np.array([np.interp(x, xs, t[i]) for i in range(len(ws))])
            per_r.append(np.interp(math.log(max(w, 1.0)), ws, col))
        rs = np.log(np.asarray(p.gather_call_rows, float))
        lt = np.interp(math.log(max(call_rows, 1.0)), rs, per_r)
        scale = math.ceil(self.row_bytes / 64) / math.ceil(p.row_bytes / 64)
        # the profile measured all threads gathering together; per-row thread time is ×T
        return float(np.exp(lt)) * scale * p.threads

    def row_time_s(self, footprint_bytes: float, shared: bool, traffic_bytes: float = 0.0,
                   call_rows: float = 512) -> float:
        """Measured gather time per row at working set W (the table when shared; F·T for a
        footprint F private to each of T threads) after ``traffic_bytes`` of other writes, in
        calls of ``call_rows`` rows."""
        w = footprint_bytes if shared else footprint_bytes * self.profile.threads
        return self._row_grid_time(self.profile.row_time_traffic_s, w, traffic_bytes, call_rows)

    def stream_bytes_per_s(self, tensor_bytes: float) -> float:
        p = self.profile
        return float(np.exp(np.interp(math.log(max(tensor_bytes, 1.0)), np.log(p.stream_sizes_bytes),
                                      np.log(p.stream_bytes_per_s))))

    @property
    def gemm_flops_per_s(self) -> float:
        return self.profile.flops_per_s

    @property
    def op_overhead_s(self) -> float:
        return self.profile.op_overhead_s

    @property
    def rng_s_per_element(self) -> float:
        return self.profile.rng_s_per_element

    def index_s(self, block_bytes: float) -> float:
        """Seconds per scalar gathered from / scattered into a cosine block of ``block_bytes``
        (measured over block sizes, log-log, clamped at the ends)."""
        p = self.profile
        return float(np.exp(np.interp(math.log(max(block_bytes, 1.0)), np.log(p.index_block_bytes),
                                      np.log(p.index_s_per_element_by_block))))

    @property
    def fault_s_per_byte(self) -> float:
        return self.profile.fault_s_per_byte

    @property
    def perm_s_per_element(self) -> float:
        return self.profile.perm_s_per_element

    def fixed_step_s(self, tiled: bool, ops: int, traffic_bytes: float = 0.0) -> float:
        """Measured per-step cost of the kernel at tiny sizes (dispatch, Python, allocation) with
        ``traffic_bytes`` of other writes between steps (linear in log2(1 + X/MiB))."""
        p = self.profile
        ys = p.tiled_step_fixed_traffic_s if tiled else p.baseline_step_fixed_traffic_s
        ys = np.maximum.accumulate(np.asarray(ys, float))
        return float(np.interp(_traffic_axis(traffic_bytes), _traffic_axis(p.traffic_bytes), ys))

    def _curve(self, op: str, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """Seconds for ``nbytes`` of a measured elementwise op (``mul``, ``norm``, ``zeros``,
        ``bool``) after ``traffic_bytes`` of other writes, less the op dispatch overhead that
        :meth:`fixed_step_s` already counts: log-log in size, linear in log2(1 + X/MiB), clamped
        at the ends, non-decreasing in X."""
        p = self.profile
        sizes = np.asarray(p.ew_sizes_bytes, float)
        per_x = []
        for per_byte in p.ew_traffic_s_per_byte[op]:
            t = np.asarray(per_byte, float) * sizes - p.op_overhead_s
            t = np.maximum(t, 1e-3 * np.asarray(per_byte, float) * sizes)
            per_x.append(np.interp(math.log(max(nbytes, 1.0)), np.log(sizes), np.log(t / sizes)))
        per_x = np.maximum.accumulate(per_x)
        return float(np.exp(np.interp(_traffic_axis(traffic_bytes), _traffic_axis(p.ew_traffic_bytes), per_x))) * nbytes

    def ew_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """One elementwise op writing ``nbytes``: measured ``torch.mul`` time at that size (page
        faults of fresh output memory are :func:`fresh_bytes_per_step`'s)."""
        return self._curve("mul", nbytes, traffic_bytes)

    def zeros_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """``zeros_like`` of ``nbytes``: measured ``torch.zeros`` (allocation + zero fill)."""
        return self._curve("zeros", nbytes, traffic_bytes)

    def red_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """A row-wise reduction over ``nbytes``: measured ``norm(dim=-1)``."""
        return self._curve("norm", nbytes, traffic_bytes)

    def bmm_s(self, form: str, G: int, m: int, k: int, n: int, traffic_bytes: float = 0.0) -> float:
        """G products at the measured seconds per FLOP of that form, interpolated in (log2(1 +
        X/MiB), log m, log N1) over the profile's grid (N1 is n for U·Xᵀ, k for the two backward
        forms), clamped at the grid's edges; the grid was measured at k = d and is rescaled to
        other d by FLOPs. X: the step's traffic before the product."""
        p = self.profile
        mm, nn = (m, n) if form == "u_xT" else (m, k) if form == "dS_x" else (k, n)
        # for dST_u = (N1×m)·(m×d), the grid's (m, N1) is (k, m)
        if form == "dST_u":
            mm, nn = k, m
        grid = np.log(np.asarray(p.bmm_s_per_flop[form], float))   # [X][m][N1]
        lm, ln = np.log(np.asarray(p.bmm_m, float)), np.log(np.asarray(p.bmm_n, float))
        x, y = math.log(max(mm, 1)), math.log(max(nn, 1))
        per_x = [np.interp(x, lm, [np.interp(y, ln, g[i]) for i in range(len(lm))]) for g in grid]
        z = np.interp(_traffic_axis(traffic_bytes), _traffic_axis(p.bmm_traffic_bytes), per_x)
        return float(np.exp(z)) * 2.0 * G * m * k * n

    def index_add_row_s(self, table_bytes: float, traffic_bytes: float = 0.0, call_rows: float = 512) -> float:
        """index_add_ of one random row into a table of that size after ``traffic_bytes`` of
        other writes, in calls of ``call_rows`` rows (measured, same grid as the gather)."""
        return self._row_grid_time(self.profile.index_add_row_time_traffic_s, table_bytes, traffic_bytes,
                                   call_rows)

    def bool_s(self, nbytes: float, traffic_bytes: float = 0.0) -> float:
        """``(x > c).to(float)`` writing ``nbytes``: measured (comparison + cast)."""
        return self._curve("bool", nbytes, traffic_bytes)


# ---------------------------------------------------------------- work per step

@dataclass(frozen=True)
class StepWork:
    """What one step does, op class by op class (counted from the kernels with the torch
    profiler, ``record_shapes``; see the constants at the top of this module):

    reads: (name, rows, footprint bytes, shared?, rows per call) random row gathers;
    elementwise: (name, ops, output bytes) out-of-place elementwise ops;
    reductions: (name, ops, input bytes) row-wise reductions (norm, sum over d);
    bmms: (form, G, m, k, n) batched products of G groups, m×k·k×n;
    index_adds: (name, rows, table bytes, rows per call) row scatters into a table (sparse update);
    rng_elements, index_elements (scalar gather/scatter through an index), ops (top-level aten ops).
    """
    reads: tuple
    flops: float
    elementwise: tuple
    reductions: tuple
    bmms: tuple
    index_adds: tuple
    rng_elements: float
    ops: int
    index_elements: float = 0.0
    zeros: tuple = ()   # (name, ops, bytes) freshly allocated zero-filled tensors
    bools: tuple = ()   # (name, ops, bytes) comparison + cast to float, bytes of the float output
    row_bytes: int = 0  # bytes of one embedding row (the gathers' output per row)
    index_block_bytes: float = 0.0  # bytes of the block the indexed scalars are read from / added to

    @property
    def traffic_bytes(self) -> float:
        """Bytes the step writes besides the embedding tables: elementwise and zero-filled
        outputs, bmm outputs, the gathered rows (:func:`step_traffic_bytes`)."""
        return step_traffic_bytes(self)


def step_traffic_bytes(work: "StepWork") -> float:
    """X = Σ_ew ops·bytes + Σ_zeros + Σ_bool + Σ_bmm 4·G·m·n + Σ_reads rows·row: what passes
    through the caches between two visits of a step to the same table rows (the rows a step
    gathers at its start and updates at its end, and the next step's fresh rows). Reads of a
    tensor just written are cache hits and are not counted; row gathers count their output
    (``work.row_bytes`` per row)."""
    x = sum(ops * nb for _, ops, nb in work.elementwise)
    x += sum(ops * nb for _, ops, nb in work.zeros) + sum(ops * nb for _, ops, nb in work.bools)
    x += sum(4.0 * G * m * n for _, G, m, k, n in work.bmms)
    x += sum(r[1] for r in work.reads) * work.row_bytes
    return float(x)


def tile_footprint_bytes(model: CFModel, tiling: Tiling) -> float:
    """F = N1·(embedding row + gradient row) = N1·8d bytes (fp32 rows of d values)."""
    return 2.0 * tiling.tile_rows * model.row_bytes


def refresh_fraction(model: CFModel, tiling: Tiling) -> float:
    """Share of steps on which a thread's tile is redrawn: min(1, b/N2)."""
    return min(1.0, model.per_thread_batch / tiling.refresh_iterations)


def tile_groups(model: CFModel, tiling: Tiling) -> int:
    """Tiles used per step: T when N2 ≥ b; T·b/N2 when N2 < b (each thread's b iterations are
    b/N2 refresh windows, each with its own tile)."""
    b, N2 = model.per_thread_batch, tiling.refresh_iterations
    return model.threads * (b // N2 if N2 < b else 1)


def sampling_space(model: CFModel, tiling: Tiling) -> float:
    """HEAT §4.2 negative sampling space per epoch: (M/N2)·N1."""
    return model.iterations_per_epoch / tiling.refresh_iterations * tiling.tile_rows


def step_work(model: CFModel, tiling: Tiling | None) -> StepWork:
    """Work of one step of B iterations; ``tiling=None`` is the baseline kernel."""
    B, n, d, h, T = model.batch, model.negatives, model.dim, model.history, model.threads
    row = model.row_bytes
    user_tab, item_tab = model.users * row, model.items * row
    agg = model.uses_aggregation
    reads = [("user rows", B, user_tab, True, B), ("positive rows", B, item_tab, True, B)]
    ew = [("B×d user/positive vectors", EW_OPS_BD_TILED if tiling else EW_OPS_BD_BASELINE, 4.0 * B * d)]
    red = [("B×d norms/sums", RED_OPS_BD, 4.0 * B * d)]
    if agg:
        reads.append(("history rows", B * h, item_tab, True, B * h))
    flops = 6.0 * B * d * d if agg else 0.0
    rng = float(B * n)
    if tiling is None:
        E = 4.0 * B * n * d
        reads.append(("negative rows", B * n, item_tab, True, B * n))
        flops += 4.0 * B * n * d
        ew.append(("B×n×d negative copy", BASELINE_EW_OPS_BND, E))
        red.append(("B×n×d norm, sum, matrix-vector bmm", BASELINE_RED_OPS_BND, E))
        ew.append(("B×n scalars", BASELINE_EW_OPS_BN, 4.0 * B * n))
        opt = 2 if model.optimizer == "sgd" else 6   # zero + add_ (SGD); Adam: + moments, sqrt, div
        ew.append(("dense user grad + optimizer", opt, 4.0 * model.users * d))
        ew.append(("dense item grad + optimizer", opt, 4.0 * model.items * d))
        ia = (("user grad rows", B, user_tab, B),
              ("item grad rows (positives, negatives)", B * (n + 1), item_tab, B * (n + 1)))
        return StepWork(tuple(reads), flops, tuple(ew), tuple(red), (), ia, rng, BASELINE_OPS_PER_STEP,
                        row_bytes=row)
    N1 = tiling.tile_rows
    G = tile_groups(model, tiling)
    m = B // G
    Et = 4.0 * G * N1 * d
    if tiling.refresh_iterations < model.per_thread_batch:
        reads.append(("tile rows (fresh each step)", G * N1, item_tab, True, G * N1))
        fresh = G * N1
    else:
        fr = refresh_fraction(model, tiling)
        reads.append(("tile rows (resident)", T * N1 * (1 - fr), tile_footprint_bytes(model, tiling), False, G * N1))
        reads.append(("tile rows (refresh)", T * N1 * fr, item_tab, True, G * N1))
        fresh = T * N1 * fr
    rng += fresh
    flops += 6.0 * B * N1 * d
    ew.append(("G×N1×d tile normalize fwd/bwd", TILED_EW_OPS_TILE, Et))
    red.append(("G×N1×d tile norms", TILED_RED_OPS_TILE, Et))
    zeros = (("B×N1 cosine-gradient block (zeros_like)", TILED_EW_OPS_BLOCK, 4.0 * B * N1),)
    ew.append(("B×n scalars", TILED_EW_OPS_BN, 4.0 * B * n))
    red.append(("B×n sum", 1, 4.0 * B * n))
    ew.append(("cat of item gradient rows", 1, 4.0 * (B + G * N1) * d))
    bmms = (("u_xT", G, m, d, N1), ("dS_x", G, m, N1, d), ("dST_u", G, N1, m, d))
    ia = (("user rows", B, user_tab, B), ("item rows (positives, tile)", B + G * N1, item_tab, B + G * N1))
    ops = TILED_OPS_PER_STEP + (8 if model.optimizer == "adam" else 0)
    # the negatives' cosines: one gather and one scatter_add of B·n scalars through an index
    bools = (("B×n negative-margin mask", TILED_BOOL_OPS_BN, 4.0 * B * n),)
    return StepWork(tuple(reads), flops, tuple(ew), tuple(red), bmms, ia, rng, ops, 2.0 * B * n, zeros, bools, row,
                    4.0 * B * N1)


def fresh_bytes_per_step(model: CFModel, tiling: Tiling | None) -> float:
    """Bytes per step first-touched from the OS (page faults) because glibc returned them at the
    end of the previous step.

    glibc (mallopt(3)) serves a chunk above the mmap threshold by mmap; freeing one raises the
    threshold to its size, up to 32 MiB, and the heap-trim threshold to twice that. A long-running
    training process has freed such a chunk before its steady state (the harness makes sure:
    ``cf_kernels.warm_allocator`` before every epoch and the profile), so
    * a tensor of 32 MiB or more is above any threshold glibc will set: it is mmapped, faulted
      in and unmapped every step, all of it;
    * the rest come from the heap, which keeps up to 64 MiB free, so every step re-faults the part
      of their peak beyond it: max(0, peak − 64 MiB).
    Live tensors at the peak, counted from the kernels: baseline 5 B×n×d tensors
    (BASELINE_LIVE_BND) + the dense user and item gradients autograd allocates every step;
    tiled: S and dS (B×N1 each) + X, x̂, dx̂, dX (G×N1×d each).
    """
    B, n, d = model.batch, model.negatives, model.dim
    if tiling is None:
        E = 4.0 * B * n * d
        live = [E] * BASELINE_LIVE_BND + [4.0 * d * model.users, 4.0 * d * model.items]
    else:
        G, N1 = tile_groups(model, tiling), tiling.tile_rows
        blk, tile = 4.0 * B * N1, 4.0 * G * N1 * d
        live = [blk] * 2 + [tile] * 4
    if max(live) < GLIBC_MMAP_THRESHOLD_MIN:
        return 0.0
    mapped = sum(t for t in live if t >= GLIBC_MMAP_THRESHOLD_MAX)
    heap = sum(t for t in live if t < GLIBC_MMAP_THRESHOLD_MAX)
    return mapped + max(0.0, heap - 2.0 * GLIBC_MMAP_THRESHOLD_MAX)


@dataclass(frozen=True)
class StepTime:
    seconds: float
    breakdown: dict = field(hash=False)


def step_time(model: CFModel, tiling: Tiling | None, rates) -> StepTime:
    """Predicted seconds of one step: the sum at the top of this module, term by term."""
    w = step_work(model, tiling)
    T = model.threads
    X = w.traffic_bytes
    br = {}
    for name, rows, foot, shared, call in w.reads:
        br[name] = rows * rates.row_time_s(foot, shared, X, call) / T
    if w.bmms:
        for form, G, m, k, n in w.bmms:
            br[f"bmm {form}"] = rates.bmm_s(form, G, m, k, n, X)
    else:
        br["compute (bmm/matmul)"] = w.flops / rates.gemm_flops_per_s
    # a size class of k tensors per step has its memory recycled k times a step: each op of the
    # class finds its memory (and its input's) after X/k of other writes
    per_size = {}
    for _, ops, nbytes in w.elementwise + w.zeros + w.bools + w.reductions:
        per_size[nbytes] = per_size.get(nbytes, 0) + ops
    for name, ops, nbytes in w.elementwise:
        br[name] = br.get(name, 0.0) + ops * rates.ew_s(nbytes, X / per_size[nbytes])
    for name, ops, nbytes in w.zeros:
        br[name] = br.get(name, 0.0) + ops * rates.zeros_s(nbytes, X / per_size[nbytes])
    for name, ops, nbytes in w.bools:
        br[name] = br.get(name, 0.0) + ops * rates.bool_s(nbytes, X / per_size[nbytes])
    for name, ops, nbytes in w.reductions:
        br[name] = br.get(name, 0.0) + ops * rates.red_s(nbytes, X / per_size[nbytes])
    for name, rows, table, call in w.index_adds:
        br[f"index_add {name}"] = rows * rates.index_add_row_s(table, X, call) / T
    br["random numbers"] = w.rng_elements * rates.rng_s_per_element
    br["indexed scalars"] = w.index_elements * rates.index_s(w.index_block_bytes)
    br["page faults (memory fresh from the OS)"] = fresh_bytes_per_step(model, tiling) * rates.fault_s_per_byte
    br["fixed per-step overhead"] = rates.fixed_step_s(tiling is not None, w.ops, X)
    return StepTime(float(sum(br.values())), br)


@dataclass(frozen=True)
class EpochEstimate:
    seconds: float
    step_seconds: float
    steps: int
    breakdown: dict = field(hash=False)


def epoch_time(model: CFModel, tiling: Tiling | None, rates) -> EpochEstimate:
    """Epoch time = ⌈M/B⌉ · t_step + the epoch's shuffle (M · t_randperm)."""
    st = step_time(model, tiling, rates)
    steps = model.steps_per_epoch
    br = {k: v * steps for k, v in st.breakdown.items()}
    br["shuffle (per epoch)"] = model.iterations_per_epoch * rates.perm_s_per_element
    return EpochEstimate(st.seconds * steps + br["shuffle (per epoch)"], st.seconds, steps, br)


def bytes_per_iteration(model: CFModel) -> float:
    """Reference §3.1 (from HEAT's matrix_factorization.cpp): rows of embedding and gradient read
    and written for user, positive and n negatives, plus h history reads:
    B_iter = 4d·(4(n + 2) + h) bytes if nothing hits in cache."""
    return 4.0 * model.dim * (4 * (model.negatives + 2) + (model.history if model.uses_aggregation else 0))


def flops_per_iteration(model: CFModel) -> float:
    """Reference §3.1: d·(21n + 12) for CCL, plus 5d² + hd with the aggregation layer."""
    d, n = model.dim, model.negatives
    f = d * (21 * n + 12)
    if model.uses_aggregation:
        f += 5 * d * d + model.history * d
    return float(f)


def tile_level(cpu: Cpu, model: CFModel, tiling: Tiling) -> Level:
    """The smallest level whose per-thread share holds the tile footprint (DRAM if none)."""
    F = tile_footprint_bytes(model, tiling)
    for lv in memory_levels(cpu, model.threads, model.row_bytes):
        if F <= lv.share_bytes:
            return lv
    raise AssertionError("DRAM has infinite share")
