"""Measure, on this CPU with torch, what the CF cost model needs; store and load it as JSON.

Measured (each a median of a few repetitions; about 16 s in all on the 2-core development VM).
A training step writes megabytes between two visits to the same table rows and between two runs
of each of its ops, so most figures are taken after X bytes of other writes (an untimed copy),
and the cost model reads them at the step's own traffic (``cf.step_traffic_bytes``):

* row-gather and ``index_add_`` per row over (rows per call ``GATHER_ROWS``) × (table bytes W,
  16 KiB .. ``max_ws_bytes``: the curve that shows L1/L2/L3/DRAM) × (X in ``TRAFFIC_GRID``),
  fresh random ids every call;
* ``bmm`` seconds per FLOP of the three product forms over (X in ``BMM_TRAFFIC_GRID``) × (rows m)
  × (tile columns N1), on the same tensors call after call, as the kernel's are;
* elementwise ``mul``, row ``norm``, ``zeros`` and compare-and-cast per byte, 16 KiB .. 64 MiB,
  after X in ``EW_TRAFFIC_GRID``;
* the negatives' indexed scalars (gather + scatter_add) over cosine-block sizes;
* the tiled and baseline kernels' fixed cost per step at tiny sizes, after X in ``TRAFFIC_GRID``;
* page faults of fresh memory, ``randperm`` and ``randint`` per element, the cost of a tiny op,
  the ``bmm`` FLOP/s of one shape and the streaming bandwidth of two sizes.

The JSON file goes where the user says; the main project may later keep profiles in SQLite.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from paraplan.cf.model import CFModel
from paraplan.errors import ConfigError
from paraplan.hardware.model import CacheLevel, Cpu
from paraplan.io import read_json, write_atomic

PROFILE_VERSION = 3
GATHER_ROWS = (512, 16384)   # rows per measured gather / index_add_ call: a batch, a large tile
TRAFFIC_GRID = (0, 2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20)  # bytes copied between two calls


@dataclass(frozen=True)
class CpuProfile:
    """Measured rates of this machine at ``threads`` torch threads (SI units)."""
    threads: int
    row_bytes: int
    ws_bytes: tuple
    row_time_s: tuple
    flops_per_s: float
    stream_sizes_bytes: tuple
    stream_bytes_per_s: tuple
    op_overhead_s: float
    rng_s_per_element: float
    tiled_step_fixed_s: float
    baseline_step_fixed_s: float
    index_s_per_element: float
    # v2: elementwise op time per output byte vs size (into mapped memory; page faults of fresh
    # memory are a separate measured rate, fault_s_per_byte); bmm time per FLOP over a (rows m,
    # columns N1) grid at k = d for the three product forms of the tiled kernel; index_add_ time
    # per row vs table size (same sizes as the gather curve)
    ew_sizes_bytes: tuple = ()
    ew_s_per_byte: tuple = ()
    red_s_per_byte: tuple = ()     # row-wise reduction (norm over d) per input byte, same sizes
    zeros_s_per_byte: tuple = ()   # torch.zeros (allocate + zero-fill, as zeros_like) per byte, same sizes
    bmm_m: tuple = ()
    bmm_n: tuple = ()
    bmm_s_per_flop: dict = None    # form -> [traffic][m][N1] (v3; v2 had no traffic axis)
    index_add_row_time_s: tuple = ()
    fault_s_per_byte: float = 0.0   # first touch of memory fresh from the OS (page faults), per byte
    perm_s_per_element: float = 0.0  # torch.randperm (the epoch's shuffle), per element
    # v3: the gather and index_add_ per-row times over gather_call_rows × ws_bytes × traffic_bytes
    # (row_time_s and index_add_row_time_s are their first-call-size, traffic-0 column), the fixed step costs over traffic_bytes
    # (the scalars above are their traffic-0 entries); bool_s_per_byte: ``(x > c).to(float)``
    # (a comparison and a cast, two passes with a 1-byte intermediate) per output byte, ew sizes
    traffic_bytes: tuple = ()
    bmm_traffic_bytes: tuple = ()
    gather_call_rows: tuple = ()
    row_time_traffic_s: tuple = ()             # [rows per call][W][X]
    index_add_row_time_traffic_s: tuple = ()   # [rows per call][W][X]
    bool_s_per_byte: tuple = ()
    tiled_step_fixed_traffic_s: tuple = ()     # tiled_step_fixed_s over traffic_bytes
    baseline_step_fixed_traffic_s: tuple = ()  # baseline_step_fixed_s over traffic_bytes
    index_block_bytes: tuple = ()              # bytes of the cosine block S the scalars index
    index_s_per_element_by_block: tuple = ()   # index_s_per_element over index_block_bytes
    ew_traffic_bytes: tuple = ()
    ew_traffic_s_per_byte: dict = None         # op (mul, norm, zeros, bool) -> [traffic][ew size]
    host: str = ""
    version: int = PROFILE_VERSION

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


BMM_FORMS = ("u_xT", "dS_x", "dST_u")  # S = U·Xᵀ (m×d·d×N1); dU = dS·X (m×N1·N1×d); dX = dSᵀ·U (N1×m·m×d)
BMM_M_GRID = (8, 32, 128, 512)
BMM_N_GRID = (8, 32, 128, 512, 2048, 8192)
BMM_TRAFFIC_GRID = (0, 16 * 2**20)   # bytes copied before each timed product
EW_TRAFFIC_GRID = (0, 4 * 2**20, 64 * 2**20)   # bytes copied before each timed elementwise op
EW_OPS = ("mul", "norm", "zeros", "bool")


class _Traffic:
    """Writes X bytes of other data (untimed) between timed calls, as a training step writes its
    other tensors between two visits to the same memory: ``write(X)`` copies X bytes from one
    buffer to another (one pair of buffers of the grid's largest X, made once)."""

    def __init__(self, grid):
        import torch
        n = max(max(grid) // 4, 1)
        self.src, self.dst, self._mul = torch.ones(n), torch.empty(n), torch.mul

    def write(self, nbytes: int) -> None:
        n = nbytes // 4
        if n:
            self._mul(self.src[:n], 1.0, out=self.dst[:n])


def _bmm_grid(dim: int, reps: int, g, rounds: int = 3) -> dict:
    """Seconds per FLOP of each bmm form over (traffic X, rows m, columns N1), k = d, with enough
    groups G that one call does at least ~8 MFLOP (the kernel batches G = B/m groups).

    As in the kernel: the operands and the output are the same tensors call after call (the
    operands were just written by the op before; the output reuses the chunk the allocator
    freed a step ago), and before each call X bytes of other data are copied (untimed): the
    step's traffic between two visits. On the development VM a 512×64·64×1024 product took
    343 us with nothing in between, 394 us after 16 MiB, 385 us inside the kernel, and 677 us
    when the output rotated over 14 cold buffers (what v2 of this profile measured). The grid
    is measured ``rounds`` times, round-robin, and the elementwise median kept, so that a burst
    of load from another process spikes one round of one point, not the result."""
    import torch
    shape = (rounds, len(BMM_TRAFFIC_GRID), len(BMM_M_GRID), len(BMM_N_GRID))
    res = {f: np.zeros(shape) for f in BMM_FORMS}
    other = _Traffic(BMM_TRAFFIC_GRID)
    for r in range(rounds):
        for i, m in enumerate(BMM_M_GRID):
            for j, n in enumerate(BMM_N_GRID):
                G = max(1, min(512, (1 << 22) // (m * n * dim) + 1))
                U, X, dS = torch.randn(G, m, dim), torch.randn(G, n, dim), torch.randn(G, m, n)
                oS, oU, oX = torch.empty(G, m, n), torch.empty(G, m, dim), torch.empty(G, n, dim)
                fl = 2.0 * G * m * n * dim
                calls = (lambda: torch.bmm(U, X.transpose(1, 2), out=oS), lambda: torch.bmm(dS, X, out=oU),
                         lambda: torch.bmm(dS.transpose(1, 2), U, out=oX))
                for x, traffic in enumerate(BMM_TRAFFIC_GRID):
                    for f, fn in zip(BMM_FORMS, calls):
                        res[f][r, x, i, j] = _median_time(fn, reps, lambda: other.write(traffic)) / fl
    return {f: np.median(res[f], axis=0).tolist() for f in BMM_FORMS}


def _fault_rate(reps: int) -> float:
    """Seconds per byte of first-touching memory fresh from the OS: ``torch.empty(64 MiB).fill_``
    (above glibc's largest dynamic mmap threshold, 32 MiB, so every allocation is a new mmap)
    minus ``fill_`` of memory already mapped."""
    import torch
    n = 64 * 2**20 // 4
    warm = torch.empty(n)
    t_fresh = _median_time(lambda: torch.empty(n).fill_(1.0), reps)
    t_warm = _median_time(lambda: warm.fill_(1.0), reps)
    return max(t_fresh - t_warm, 0.0) / (4.0 * n)


def _elementwise_curve(reps: int, dim: int):
    """Seconds per byte, at 16 KiB .. 64 MiB and after X bytes of other writes (X in
    ``EW_TRAFFIC_GRID``; the input rewritten just before, untimed, as the op before it in a step
    leaves it): ``torch.mul(x, y, out=z)`` per output byte (the output already mapped: fresh
    memory is the page-fault term's), row-wise ``norm`` over d per input byte, ``torch.zeros``
    per byte, and ``(x > c).to(float)`` per output byte. Returns (sizes, {op: [X][size]}).

    On the development VM a 16 MiB ``torch.zeros`` took 0.6 ms back to back and 1.9 ms after a
    64 MiB copy; a step writes tens of MiB between two runs of the same op."""
    import torch
    other = _Traffic(EW_TRAFFIC_GRID)
    sizes = []
    out = {op: [[] for _ in EW_TRAFFIC_GRID] for op in EW_OPS}
    nbytes = 16 * 1024
    while nbytes <= 64 * 2**20:
        x = torch.randn(nbytes // 4)
        y = torch.randn(nbytes // 4)
        z = torch.empty_like(x)
        xv = x.view(-1, dim) if x.numel() % dim == 0 else x.view(-1, 1)
        keep = [torch.randn(nbytes // 4) for _ in range(2)]  # other live tensors, as in a step
        calls = {"mul": lambda: torch.mul(x, y, out=z), "norm": lambda: xv.norm(dim=-1, keepdim=True),
                 "zeros": lambda: torch.zeros(nbytes // 4), "bool": lambda: (x > 0.4).to(torch.float32)}
        sizes.append(float(nbytes))
        for i, traffic in enumerate(EW_TRAFFIC_GRID):

            def prep():
                other.write(traffic)
                x.mul_(1.0)
            for op in EW_OPS:
                out[op][i].append(_median_time(calls[op], reps, prep) / nbytes)
        del keep
        nbytes *= 4
    return tuple(sizes), out


def _row_curves(dim: int, max_ws_bytes: int, reps: int, g):
    """Seconds per row of ``table[idx]`` and of ``table.index_add_(0, idx, rows)`` for a table
    of W bytes (16 KiB, ×4, .. ``max_ws_bytes``), R fresh random ids per call (R in
    ``GATHER_ROWS``), after copying X bytes of other data (X in ``TRAFFIC_GRID``, untimed).
    Returns (W list, gather[R][W][X], index_add[R][W][X]); the median over the calls per point.

    Why batches of fresh ids after traffic: on the development VM (2 cores, 2 MiB L2 each) 512
    fresh rows from a 12 MiB table took 84 ns/row with nothing in between and 259 ns/row after
    4 MiB of copying (the kernels' own steps, measured line by line, showed ~250 ns/row), while
    32768 rows at the same ids over and over (the profile before v3) took 78 ns/row. Why two
    call sizes: after the copy the first lines a gather brings in evict dirty ones; a large call
    pays that once for many rows (4.9 MiB table after 64 MiB: 356 ns/row at 512 rows, 82 at
    32768)."""
    import torch
    row = 4 * dim
    other = _Traffic(TRAFFIC_GRID)
    ws_sizes = []
    ws = 16 * 1024
    while ws <= max_ws_bytes:
        ws_sizes.append(ws)
        ws *= 4
    gather = [[[0.0] * len(TRAFFIC_GRID) for _ in ws_sizes] for _ in GATHER_ROWS]
    index_add = [[[0.0] * len(TRAFFIC_GRID) for _ in ws_sizes] for _ in GATHER_ROWS]
    ws_list = []
    for w, ws in enumerate(ws_sizes):
        rows = max(ws // row, 1)
        table = torch.randn(rows, dim)
        ws_list.append(float(rows * row))
        for r, n_rows in enumerate(GATHER_ROWS):
            upd = torch.randn(n_rows, dim) * 1e-9
            calls = reps if n_rows <= 1024 else max(3, reps // 2)
            for x, traffic in enumerate(TRAFFIC_GRID):
                tg, ti = [], []
                for c in range(2 * calls + 2):
                    idx = torch.randint(0, rows, (n_rows,), generator=g)
                    other.write(traffic)
                    t0 = time.perf_counter()
                    if c % 2 == 0:
                        table[idx]
                        tg.append(time.perf_counter() - t0)
                    else:
                        table.index_add_(0, idx, upd, alpha=-1.0)
                        ti.append(time.perf_counter() - t0)
                gather[r][w][x] = float(np.median(tg[1:])) / n_rows
                index_add[r][w][x] = float(np.median(ti[1:])) / n_rows
        del table
    return ws_list, gather, index_add


INDEX_BLOCK_COLUMNS = (512, 4096, 32768)   # N1 of the measured cosine blocks (T × 256 × N1)


def _index_curve(threads: int, reps: int, g) -> tuple[tuple, tuple]:
    """Seconds per scalar of the negatives' cosines, ``S.gather(2, ix)`` plus
    ``dS.scatter_add_(2, ix, src)`` with 128 random columns per row, over cosine blocks S of
    T × 256 × N1 (N1 in ``INDEX_BLOCK_COLUMNS``), S and dS written just before each call
    (untimed), as the kernel's bmm and zeros_like leave them. Returns (block bytes, s/element).
    A block larger than the caches makes every scalar a miss: on the development VM the kernel's
    gather from a 16 MiB block took 431 us for 65536 scalars where the 512 KiB block of the
    profile before v3 predicted 60 us."""
    import torch
    blocks, rates = [], []
    for n1 in INDEX_BLOCK_COLUMNS:
        S, dS = torch.randn(threads, 256, n1), torch.zeros(threads, 256, n1)
        ix = torch.randint(0, n1, (threads, 256, 128), generator=g)
        src = torch.randn(threads, 256, 128)

        def prep():
            S.mul_(1.0)
            dS.zero_()
        t = _median_time(lambda: (S.gather(2, ix), dS.scatter_add_(2, ix, src)), reps, prep)
        blocks.append(4.0 * S.numel())
        rates.append(t / (2 * ix.numel()))
    return tuple(blocks), tuple(rates)


def _median_time(fn, reps: int, prepare=None) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one untimed call; ``prepare()``, when
    given, runs untimed before every call."""
    fn()
    ts = []
    for _ in range(reps):
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    # the median, the same statistic the validation takes of the kernels' step times; a low
    # quantile here (as before) made every rate optimistic on a shared machine
    return float(np.median(ts))


def measure(threads: int = 1, dim: int = 64, max_ws_bytes: int = 128 * 2**20, reps: int = 7,
            seed: int = 0) -> CpuProfile:
    """Profile this CPU with torch at ``threads`` threads; rows of 4·dim bytes."""
    import torch
    if threads < 1 or dim < 1 or max_ws_bytes < 2**16:
        raise ConfigError("profile", f"threads {threads}, dim {dim}, max_ws_bytes {max_ws_bytes} out of range")
    from paraplan.cf.kernels import warm_allocator
    torch.set_num_threads(threads)
    warm_allocator()  # the allocator state the kernels run in (see warm_allocator)
    g = torch.Generator().manual_seed(seed)
    row = 4 * dim
    warm = torch.randn(1 << 20)
    for _ in range(20):  # wake the thread pool and the clock before the first timing
        warm.mul_(1.0)
    ws_list, gather, index_add = _row_curves(dim, max_ws_bytes, reps, g)
    t_list = [r[0] for r in gather[0]]
    ia_list = [r[0] for r in index_add[0]]
    b, d, n1 = 256, dim, 512
    A = torch.randn(threads, b, d)
    Bm = torch.randn(threads, d, n1)
    t = _median_time(lambda: torch.bmm(A, Bm), reps)
    flops = 2.0 * threads * b * d * n1 / t
    sizes, bws = [], []
    for nbytes in (256 * 1024, 64 * 2**20):
        x = torch.randn(nbytes // 4)
        y = torch.randn(nbytes // 4)
        z = torch.empty_like(x)
        t = _median_time(lambda: torch.mul(x, y, out=z), reps)
        sizes.append(float(nbytes))
        bws.append(3.0 * nbytes / t)
    one = torch.ones(4)
    k = 2000

    def tiny():
        for _ in range(k):
            torch.add(one, one)
    op = _median_time(tiny, reps) / k
    n_rng = 1 << 18
    rng = (_median_time(lambda: torch.randint(0, 1 << 20, (n_rng,), generator=g), reps) - op) / n_rng
    tiled_fixed, base_fixed = _fixed_step_costs(threads, reps)
    index_blocks, index_rates = _index_curve(threads, reps, g)
    idx_el = index_rates[0]
    ew_sizes, ew = _elementwise_curve(reps, dim)
    ew_rates, red_rates, zero_rates, bool_rates = (tuple(ew[op][0]) for op in EW_OPS)
    return CpuProfile(threads, row, tuple(ws_list), tuple(t_list), flops, tuple(sizes), tuple(bws), op,
                      max(rng, 0.0), tiled_fixed[0], base_fixed[0], idx_el, ew_sizes, ew_rates, red_rates, zero_rates,
                      BMM_M_GRID, BMM_N_GRID, _bmm_grid(dim, reps, g), tuple(ia_list), _fault_rate(reps),
                      _median_time(lambda: torch.randperm(1 << 19, generator=g), reps) / (1 << 19),
                      TRAFFIC_GRID, BMM_TRAFFIC_GRID, GATHER_ROWS, gather, index_add,
                      bool_rates, tuple(tiled_fixed), tuple(base_fixed), index_blocks, index_rates,
                      EW_TRAFFIC_GRID, ew, host=platform.node())


def _fixed_step_costs(threads: int, reps: int) -> tuple[list[float], list[float]]:
    """Seconds per step of the tiled and baseline kernels at tiny sizes (B = 8·T, n = 1, d = 8,
    N1 = 8): the implementation's fixed cost (torch dispatch, Python, allocation) per step, with
    X bytes of other data copied (untimed) before every step, X in ``TRAFFIC_GRID``.

    Why the traffic: a real step writes megabytes between two runs of each of its ops, and what
    it evicts includes the code and data of those ops' own paths. On the development VM a
    512-element ``relu(1 − x)`` took 3.4 us back to back, 23 us after a 4 MiB copy and 81 us
    after 64 MiB, and the same line inside the kernel at B = 512 took 19 us the first time in a
    step and 4 us run again right after."""
    import torch
    from paraplan.cf.kernels import (TileSampler, baseline_step, init_params,
                                                make_baseline_optimizer, tiled_step)
    m = CFModel(users=64, items=64, interactions=1024, dim=8, negatives=1, batch=8 * threads, threads=threads)
    g = torch.Generator().manual_seed(0)
    users = torch.randint(0, 64, (m.batch,), generator=g)
    pos = torch.randint(0, 64, (m.batch,), generator=g)
    p = init_params(m)
    sampler = TileSampler(64, threads, 8, 8, m.per_thread_batch, g)
    q = init_params(m)
    opt = make_baseline_optimizer(q, m)
    other = _Traffic(TRAFFIC_GRID)

    def tiled():
        tiles, local = sampler.next(1)
        tiled_step(p, users[torch.randperm(m.batch)], pos, None, tiles, local, m)

    def base():
        negs = torch.randint(0, 64, (m.batch, 1), generator=g)
        baseline_step(q, opt, users[torch.randperm(m.batch)], pos, negs, None, m)
    out_t, out_b = [], []
    for x in TRAFFIC_GRID:
        steps = 100 if x == 0 else 20

        def timed(fn):
            def loop():
                total = 0.0
                for _ in range(steps):
                    other.write(x)
                    t0 = time.perf_counter()
                    fn()
                    total += time.perf_counter() - t0
                return total
            loop()
            return float(np.median([loop() for _ in range(max(3, reps // 2))])) / steps
        out_t.append(timed(tiled))
        out_b.append(timed(base))
    return out_t, out_b


def save(profile: CpuProfile, path: str | Path) -> Path:
    """Write atomically (whole or not at all)."""
    path = Path(path)
    write_atomic(path, json.dumps(profile.to_json(), indent=1))
    return path


def _check_numbers(value, key: str, source: str, depth: int = 0) -> None:
    """A profile value: a finite non-negative number, or (nested) lists of them / a mapping of them."""
    if isinstance(value, bool) or depth > 6:
        raise ConfigError(key, f"expected numbers, got {value!r}"[:120], source=source)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0 or value > 1e18:
            raise ConfigError(key, f"expected a finite number >= 0, got {value!r}"[:120], source=source)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_numbers(v, key, source, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, f"{key}.{k}", source, depth + 1)
    else:
        raise ConfigError(key, f"expected numbers, got {value!r}"[:120], source=source)


def load(path: str | Path) -> CpuProfile:
    """Read a profile written by :func:`save`; ConfigError naming the key if missing or malformed."""
    path = Path(path)
    data = read_json(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError("profile", "expected a JSON object written by `paraplan cf profile`", source=str(path))
    fields = CpuProfile.__dataclass_fields__
    missing = [k for k in fields if k not in data and k not in ("host", "version")]
    if missing:
        raise ConfigError(missing[0], f"missing fields {', '.join(missing)}", source=str(path))
    if data.get("version") != PROFILE_VERSION:
        raise ConfigError("profile", f"version {str(data.get('version'))[:40]} is not {PROFILE_VERSION}; "
                          "re-run cf profile", source=str(path))
    for k in fields:
        if k in ("host", "version") or data.get(k) is None and fields[k].default is None:
            continue
        _check_numbers(data[k], k, str(path))
    for k in ("threads", "row_bytes"):
        if not isinstance(data[k], int) or not 1 <= data[k] <= 1 << 20:
            raise ConfigError(k, f"expected a positive integer, got {data[k]!r}"[:120], source=str(path))
    vals = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
    if not isinstance(vals["ws_bytes"], tuple) or not isinstance(vals["row_time_s"], tuple) or \
            len(vals["ws_bytes"]) != len(vals["row_time_s"]) or len(vals["ws_bytes"]) < 2:
        raise ConfigError("ws_bytes", "ws_bytes and row_time_s must be equal-length lists of 2+ points",
                          source=str(path))
    return CpuProfile(**vals)


def _cpu_count_in(lst: str) -> int:
    n = 0
    for part in lst.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


def local_cpu(threads: int | None = None):
    """A :class:`~paraplan.hardware.model.Cpu` for this machine from Linux sysfs (cache sizes, who
    shares them, line size) and /proc/cpuinfo (clock). Latencies, per-cycle bandwidths and DRAM
    figures are not exposed by the OS: typical values are used (estimates; the profiled rates
    replace them in predictions)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    typical = {1: (4, 64), 2: (14, 32), 3: (50, 16)}
    caches = []
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level = int((idx / "level").read_text())
            size = (idx / "size").read_text().strip()
            mult = {"K": 1024, "M": 2**20, "G": 2**30}.get(size[-1], 1)
            size_b = int(size.rstrip("KMG")) * mult
            shared = _cpu_count_in((idx / "shared_cpu_list").read_text())
            line = int((idx / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        lat, bw = typical.get(level, (80, 8))
        caches.append(CacheLevel(level, size_b, max(shared, 1), lat, bw, line))
    if not caches:
        caches = [CacheLevel(1, 32 * 1024, 1, 4, 64), CacheLevel(2, 1 << 20, 1, 14, 32)]
    freq = 2.5e9
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                freq = float(line.split(":")[1]) * 1e6
                break
    except (OSError, ValueError):
        pass
    cores = os.cpu_count() or 1
    return Cpu(name="local", vendor="local", model=platform.processor() or "this machine", cores=cores,
               threads_per_core=1, frequency_hz=freq, simd_bits=256, fma_units_per_core=2,
               caches=tuple(sorted(caches, key=lambda c: c.level)),
               memory_bandwidth_bytes_per_s=20e9 * cores, memory_latency_s=100e-9, memory_channels=1,
               sources={"caches": "Linux sysfs", "latencies": "typical values (estimate)"})
