"""The profiled CF rates: how a measured profile is read (traffic, call size, bmm traffic grid),
what a step writes between two visits to a table, and which tensors glibc re-faults every step."""
import math

import pytest

from paraplan.cf import profile as cf_profile
from paraplan.cf.cost import (GLIBC_MMAP_THRESHOLD_MAX, ProfiledRates, Tiling, fresh_bytes_per_step,
                                    step_time, step_traffic_bytes, step_work)
from paraplan.cf.model import CFModel

MiB = 2**20
WS = (16 * 1024.0, 1.0 * MiB, 64.0 * MiB)
TRAFFIC = (0, MiB, 16 * MiB)
CALLS = (512, 16384)


def _profile(**over) -> cf_profile.CpuProfile:
    """A hand-made profile: row time 10 ns at 16 KiB, 100 ns at 64 MiB; ×2 after 16 MiB of
    traffic (×1.5 after 1 MiB); ÷2 in calls of 16384 rows. Fixed step cost 100 us, 400 us after
    16 MiB of traffic. bmm: 1e-11 s/FLOP hot, 2e-11 after 16 MiB."""
    g = tuple(tuple(tuple(base * f / per_call for f in (1.0, 1.5, 2.0)) for base in (10e-9, 30e-9, 100e-9))
              for per_call in (1.0, 2.0))   # [call rows][W][traffic]
    bmm = {f: [[[1e-11] * 6] * 4, [[2e-11] * 6] * 4] for f in cf_profile.BMM_FORMS}
    ew_sizes = (16 * 1024.0, 64.0 * MiB)
    kw = dict(threads=1, row_bytes=256, ws_bytes=WS, row_time_s=tuple(w[0] for w in g[0]), flops_per_s=1e11,
              stream_sizes_bytes=ew_sizes, stream_bytes_per_s=(1e11, 1e10), op_overhead_s=1e-6,
              rng_s_per_element=1e-9, tiled_step_fixed_s=1e-4, baseline_step_fixed_s=2e-4,
              index_s_per_element=1e-9, ew_sizes_bytes=ew_sizes, ew_s_per_byte=(1e-10, 1e-10),
              red_s_per_byte=(1e-10, 1e-10), zeros_s_per_byte=(1e-10, 1e-10), bmm_m=cf_profile.BMM_M_GRID,
              bmm_n=cf_profile.BMM_N_GRID, bmm_s_per_flop=bmm, index_add_row_time_s=tuple(w[0] for w in g[0]),
              fault_s_per_byte=1e-10, perm_s_per_element=1e-9, traffic_bytes=TRAFFIC, bmm_traffic_bytes=(0, 16 * MiB),
              gather_call_rows=CALLS, row_time_traffic_s=g, index_add_row_time_traffic_s=g,
              bool_s_per_byte=(2e-10, 2e-10), tiled_step_fixed_traffic_s=(1e-4, 2e-4, 4e-4),
              baseline_step_fixed_traffic_s=(2e-4, 3e-4, 5e-4), index_block_bytes=(512 * 1024.0, 32.0 * MiB),
              index_s_per_element_by_block=(1e-9, 8e-9), ew_traffic_bytes=(0, 64 * MiB),
              ew_traffic_s_per_byte={op: [[1e-10, 1e-10], [3e-10, 3e-10]] for op in cf_profile.EW_OPS})
    kw.update(over)
    return cf_profile.CpuProfile(**kw)


def test_row_time_reads_the_traffic_and_call_size_axes():
    r = ProfiledRates(_profile(), 256)
    assert r.row_time_s(64 * MiB, True) == pytest.approx(100e-9)
    assert r.row_time_s(64 * MiB, True, traffic_bytes=16 * MiB) == pytest.approx(200e-9)
    assert r.row_time_s(64 * MiB, True, traffic_bytes=MiB) == pytest.approx(150e-9)
    # beyond the grid: clamped, not extrapolated
    assert r.row_time_s(64 * MiB, True, traffic_bytes=1e12) == pytest.approx(200e-9)
    assert r.row_time_s(64 * MiB, True, call_rows=16384) == pytest.approx(50e-9)
    # log-log halfway between 512 and 16384 rows: the geometric mean
    mid = math.sqrt(512 * 16384)
    assert r.row_time_s(64 * MiB, True, call_rows=mid) == pytest.approx(100e-9 / math.sqrt(2))
    # rows of twice the cache lines cost twice as much
    assert ProfiledRates(_profile(), 512).row_time_s(64 * MiB, True) == pytest.approx(200e-9)


def test_more_traffic_never_makes_a_row_cheaper():
    """A noisy profile where traffic 1 MiB read faster than traffic 0 is read as monotone."""
    g = (((20e-9, 10e-9, 30e-9),) * 3,) * 2
    r = ProfiledRates(_profile(row_time_traffic_s=g), 256)
    assert r.row_time_s(MiB, True, traffic_bytes=MiB) >= r.row_time_s(MiB, True, traffic_bytes=0)


def test_bmm_and_fixed_cost_interpolate_in_traffic():
    r = ProfiledRates(_profile(), 256)
    fl = 2.0 * 4 * 512 * 64 * 1024
    assert r.bmm_s("u_xT", 4, 512, 64, 1024) == pytest.approx(1e-11 * fl)
    assert r.bmm_s("u_xT", 4, 512, 64, 1024, traffic_bytes=16 * MiB) == pytest.approx(2e-11 * fl)
    assert r.fixed_step_s(True, 76, 0) == pytest.approx(1e-4)
    assert r.fixed_step_s(True, 76, MiB) == pytest.approx(2e-4)
    assert r.fixed_step_s(False, 106, 16 * MiB) == pytest.approx(5e-4)
    # elementwise: per byte, less the dispatch overhead (1 us) counted in the fixed cost
    nb = 64 * MiB
    assert r.ew_s(nb) == pytest.approx(1e-10 * nb - 1e-6)
    assert r.zeros_s(nb, traffic_bytes=64 * MiB) == pytest.approx(3e-10 * nb - 1e-6)
    # indexed scalars: log-log over the block size (8× the time over 64× the bytes: ×2 per ×4)
    assert r.index_s(2 * MiB) == pytest.approx(2e-9)
    assert r.index_s(1e12) == pytest.approx(8e-9)


def _m(**kw):
    base = dict(users=50000, items=20000, interactions=480000, dim=64, negatives=128, batch=512, threads=1)
    base.update(kw)
    return CFModel(**base)


def test_step_traffic_counts_what_the_step_writes():
    """Hand count for a tiled step, B = 512, n = 128, d = 64, N1 = 1024 resident (N2 ≥ b): the
    B×d and tile elementwise outputs, the B×n scalars and mask, zeros_like(S), the three bmm
    outputs and the gathered rows."""
    m, t = _m(), Tiling(1024, 4096)
    w = step_work(m, t)
    B, n, d, N1 = 512, 128, 64, 1024
    ew = 14 * 4 * B * d + 5 * 4 * N1 * d + 3 * 4 * B * n + 4 * (B + N1) * d
    expected = ew + 4 * B * N1 + 4 * B * n + 4 * (B * N1 + B * d + N1 * d) + (B + B + N1) * 4 * d
    assert step_traffic_bytes(w) == pytest.approx(expected)
    assert w.traffic_bytes == pytest.approx(expected)


def test_blocks_of_32_mib_are_faulted_every_step():
    """S and dS of B×N1 fp32: at B = 512, N1 = 16384 each is 32 MiB, above any mmap threshold glibc
    sets, so both are mapped and faulted in every step; the 4 MiB tile tensors stay in the heap."""
    big = _m(batch=512)
    assert 4 * 512 * 16384 == GLIBC_MMAP_THRESHOLD_MAX
    assert fresh_bytes_per_step(big, Tiling(16384, 512)) == pytest.approx(2 * GLIBC_MMAP_THRESHOLD_MAX)
    # half the tile: 16 MiB blocks, 2·16 + 4·2 MiB of heap below the 64 MiB kept free
    assert fresh_bytes_per_step(big, Tiling(8192, 512)) == 0.0


def test_profiled_step_charges_traffic():
    """The same step predicted from a profile whose rows, products and fixed cost get dearer
    with traffic is slower than from one where they do not."""
    flat = ((tuple((v, v, v) for v in (10e-9, 30e-9, 100e-9)),) * 2)
    hot = _profile(row_time_traffic_s=flat, index_add_row_time_traffic_s=flat,
                   bmm_s_per_flop={f: [[[1e-11] * 6] * 4] * 2 for f in cf_profile.BMM_FORMS},
                   tiled_step_fixed_traffic_s=(1e-4,) * 3)
    m, t = _m(), Tiling(1024, 4096)
    assert step_time(m, t, ProfiledRates(_profile(), 256)).seconds > step_time(m, t, ProfiledRates(hot, 256)).seconds


def test_profile_round_trip(tmp_path):
    p = _profile()
    back = cf_profile.load(cf_profile.save(p, tmp_path / "p.json"))
    r1, r2 = ProfiledRates(p, 256), ProfiledRates(back, 256)
    assert r2.row_time_s(MiB, True, MiB, 2048) == pytest.approx(r1.row_time_s(MiB, True, MiB, 2048))
    assert r2.bmm_s("dS_x", 2, 128, 512, 64, MiB) == pytest.approx(r1.bmm_s("dS_x", 2, 128, 512, 64, MiB))
