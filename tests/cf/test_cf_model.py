"""CFModel validation, data generator and LightGCN reader, cost model properties, planner constraints."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from paraplan.cf.cost import (AnalyticalRates, Tiling, bytes_per_iteration, epoch_time, flops_per_iteration,
                                    hit_fractions, memory_levels, sampling_space, step_time, tile_footprint_bytes)
from paraplan.errors import ConfigError, InfeasiblePlan
from paraplan.hardware.catalog import load_part
from paraplan.hardware.model import CacheLevel, Cpu
from paraplan.cf.plan import heat_tile_rows, plan_tiles
from paraplan.cf.model import CFModel
from paraplan.cf.data import load_lightgcn, read_lightgcn, synthetic, write_lightgcn

EPYC = load_part("cpus", "epyc-7742")
A64FX = Cpu(name="a64fx", vendor="Fujitsu", model="A64FX", cores=48, threads_per_core=1, frequency_hz=2.0e9,
            simd_bits=512, fma_units_per_core=2,
            caches=(CacheLevel(1, 64 * 1024, 1, 5, 128, 256), CacheLevel(2, 8 * 2**20, 12, 37, 64, 256)),
            memory_bandwidth_bytes_per_s=1024e9, memory_latency_s=130e-9, memory_channels=4)
AMAZON = dict(users=52643, items=91599, interactions=2380730)


def model(**kw):
    base = dict(AMAZON, dim=128, negatives=64, batch=4096, threads=64)
    base.update(kw)
    return CFModel(**base)


@pytest.mark.parametrize("kw,field", [({"dim": 0}, "dim"), ({"gate": 0.5}, "gate"), ({"optimizer": "lamb"}, "optimizer"),
                                      ({"margin": 2.0}, "margin"), ({"batch": 100, "threads": 64}, "batch")])
def test_model_rejects_bad_fields(kw, field):
    with pytest.raises(ConfigError) as e:
        model(**kw)
    assert e.value.field == field


def test_synthetic_is_seeded_power_law_and_splits_every_user():
    a = synthetic(500, 2000, 12000, seed=3)
    b = synthetic(500, 2000, 12000, seed=3)
    assert np.array_equal(a.train_items, b.train_items)
    total = a.train_interactions + sum(len(v) for v in a.test.values())
    assert abs(total - 12000) <= 12000 * 0.05
    assert len(a.test) == 500  # every user has held-out items
    deg = np.sort(np.bincount(a.train_items, minlength=a.items))[::-1]
    top10 = deg[: a.items // 10].sum() / deg.sum()
    assert 0.25 < top10 < 0.7  # the LightGCN test splits: top 10% of items carry ≈ 0.42-0.44
    # no pair is in both train and test
    pairs = set(zip(a.train_users.tolist(), a.train_items.tolist()))
    assert not any((u, i) in pairs for u, its in a.test.items() for i in its.tolist())


def test_lightgcn_round_trip(tmp_path):
    lists = {0: np.array([3, 1, 4]), 2: np.array([1, 5]), 7: np.array([9])}
    p = tmp_path / "train.txt"
    write_lightgcn(p, lists)
    back = read_lightgcn(p)
    assert back.keys() == lists.keys()
    assert all(np.array_equal(back[u], lists[u]) for u in lists)
    d = load_lightgcn(p, seed=0)
    assert d.users == 8 and d.items == 10


@pytest.mark.parametrize("text,needle", [("0 1 2\n1 x 3\n", "line 2"), ("0 1\n0 2\n", "line 2"),
                                         ("0 -4\n", "negative"), ("\n\n", "no interaction")])
def test_lightgcn_rejects_bad_lines(tmp_path, text, needle):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_lightgcn(p)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_heat_formulas_per_iteration():
    m = model()
    assert bytes_per_iteration(m) == 4 * 128 * 4 * 66
    assert flops_per_iteration(m) == 128 * (21 * 64 + 12)
    assert bytes_per_iteration(model(dim=256)) > bytes_per_iteration(m)


def test_zen_l3_is_per_ccx_and_a64fx_has_no_l3():
    lv = {l.name: l for l in memory_levels(EPYC, 64, 512)}
    assert lv["L2"].share_bytes == 512 * 1024          # private
    assert lv["L3"].share_bytes == 16 * 2**20 / 4      # one CCX shared by 4 threads
    names = [l.name for l in memory_levels(A64FX, 48, 512)]
    assert names == ["L1", "L2", "DRAM"]


@pytest.mark.parametrize("cpu", [EPYC, A64FX])
def test_tile_in_l2_is_cheaper_per_row_than_tile_in_dram(cpu):
    r = AnalyticalRates(cpu, 4, 512)
    assert r.row_time_s(64 * 1024, shared=False) < r.row_time_s(1 << 30, shared=False)


@settings(max_examples=30, deadline=None)
@given(st.floats(1e3, 1e10), st.floats(1.01, 100))
def test_row_time_monotone_in_footprint(f, k):
    r = AnalyticalRates(EPYC, 8, 256)
    assert r.row_time_s(f, False) <= r.row_time_s(f * k, False) + 1e-18
    fr = hit_fractions(r.levels(), f, False)
    assert math.isclose(sum(fr), 1.0) and min(fr) >= 0


def test_bigger_dim_more_time_and_bytes():
    r1 = AnalyticalRates(EPYC, 64, 256)
    r2 = AnalyticalRates(EPYC, 64, 512)
    t = Tiling(256, 1024)
    assert step_time(model(dim=128), t, r2).seconds > step_time(model(dim=64), t, r1).seconds
    assert tile_footprint_bytes(model(dim=128), t) == 2 * tile_footprint_bytes(model(dim=64), t)


def test_tiled_predicted_faster_than_baseline():
    m = model()
    r = AnalyticalRates(EPYC, 64, m.row_bytes)
    assert epoch_time(m, Tiling(256, 1024), r).seconds < epoch_time(m, None, r).seconds


@pytest.mark.parametrize("cpu,threads", [(EPYC, 64), (EPYC, 8), (A64FX, 48)])
def test_planner_respects_capacity_and_sampling_space(cpu, threads):
    m = model(threads=threads, batch=4096 if threads != 48 else 4800)
    pl = plan_tiles(m, cpu, min_sampling_space=500_000)
    last = memory_levels(cpu, threads, m.row_bytes)[-2]  # last cache level
    for c in pl.choices:
        assert c.footprint_bytes <= last.share_bytes
        assert sampling_space(m, Tiling(c.tile_rows, c.refresh_iterations)) >= 500_000
        b, N2 = m.per_thread_batch, c.refresh_iterations
        assert N2 >= 8 and (N2 % b == 0 if N2 >= b else b % N2 == 0)  # whole refresh windows per step
    times = [c.predicted_epoch_s for c in pl.choices]
    assert times == sorted(times)  # rank 1 is the fastest; no slower plan above a faster one


def test_unmeetable_bound_is_relaxed_and_named_not_an_error():
    strict = plan_tiles(model(), EPYC)
    assert strict.relaxed == ()
    pl = plan_tiles(model(), EPYC, min_sampling_space=1e12)
    (r,) = pl.relaxed
    assert r.bound == "min_sampling_space" and r.flag == "--min-sampling-space"
    assert r.used == pl.best.sampling_space and r.factor == pytest.approx(1e12 / pl.best.sampling_space) and r.factor > 1
    # the least relaxation: no admitted plan has a smaller sampling-space shortfall than the best one's
    assert pl.best.sampling_space == max(c.sampling_space for c in pl.choices)
    assert "relaxed sampling space" in r.describe() and f"{r.factor:.2f}x below" in r.describe()
    with pytest.raises(ConfigError):
        plan_tiles(model(), EPYC, cache_level="L4")
    with pytest.raises(InfeasiblePlan):   # HEAT's rule has no tile to relax to
        heat_tile_rows(EPYC, 64, 1 << 20)


def test_rows_per_negative_relaxed_only_as_far_as_needed_and_sampling_space_kept():
    m = model(negatives=1000, batch=512)   # HEAT's d = 128 with SimpleX's 1000 negatives, 64 threads
    pl = plan_tiles(m, EPYC)
    assert [r.bound for r in pl.relaxed] == ["min_rows_per_negative"]
    share = memory_levels(EPYC, 64, m.row_bytes)[-2].share_bytes
    largest = max(c for c in (2 ** k for k in range(20)) if 8 * m.dim * c <= share)
    assert {c.tile_rows for c in pl.choices} == {largest}          # the largest tile in the L3 share
    assert all(c.sampling_space >= pl.min_sampling_space for c in pl.choices)  # not relaxed on the way
    assert pl.relaxed[0].used == largest / 1000 and pl.relaxed[0].required == 8


def test_tile_larger_than_every_cache_share_relaxes_capacity():
    m = model(dim=1 << 18, negatives=1)
    pl = plan_tiles(m, EPYC, top=3)
    assert [r.bound for r in pl.relaxed] == ["cache_capacity"]
    assert pl.best.tile_rows == 8 and pl.best.tile_level == "DRAM" and pl.relaxed[0].factor > 1


def test_planner_l2_bound_gives_smaller_tiles_than_l3_bound():
    m = model()
    l2 = plan_tiles(m, EPYC, cache_level="L2")
    assert max(c.footprint_bytes for c in l2.choices) <= 512 * 1024
