"""Profile noise: repeats and their spread, re-measuring, storing the spread, and the warning when a
noisy profile is used (real SQLite files; the timings are scripted where the rule is the subject)."""
import sqlite3

import pytest

from paraplan.profiles.cluster import noisy_profile_warning, warn_if_noisy
from paraplan.profiles.store import (NOISY_SPREAD, ProfileNoise, ProfileStore, measured_tables, profile_noise,
                                     row_label)

pytest.importorskip("torch")
from paraplan.validation.profile import REMEASURES, ROUNDS, repeated, spread_of, summarize  # noqa: E402

pytestmark = pytest.mark.torch

FP = {"id": "f00d", "hostname": "h", "cpu_model": "c", "cpu_cores": 2, "torch_version": "t", "gpus": []}


def row(kind="gemm", op="matmul", spread=0.01, world=1, shape=None, **kw):
    r = {"kind": kind, "op": op, "device": "cpu", "dtype": "float32", "world_size": world,
         "shape": shape or {"m": 64, "n": 64, "k": 64}, "bytes": None, "flops": 1e6, "time_s": 1e-4,
         "flops_per_s": 1e10, "bandwidth_bytes_per_s": None, "bus_bandwidth_bytes_per_s": None,
         "spread": spread}
    r.update(kw)
    return r


def test_spread_is_range_over_median_and_drops_extremes_from_five():
    assert spread_of([1.0, 1.0, 1.0]) == 0.0
    assert spread_of([1.0, 1.5, 2.0]) == pytest.approx(1.0 / 1.5)
    # 5 or more: one burst (the 9.0) does not count
    assert spread_of([1.0, 1.1, 1.0, 1.05, 9.0]) == pytest.approx(0.1 / 1.05)
    assert spread_of([2.0]) == 0.0


def test_noisy_case_is_remeasured_and_the_quietest_attempt_kept():
    # first attempt spreads 100 %, the second 2 %: two attempts, the second kept
    values = iter([1.0, 2.0, 1.0, 1.00, 1.02, 1.01, 5.0, 5.0, 5.0])
    calls = []

    def measure():
        calls.append(1)
        return next(values)
    t, sp = repeated(measure)
    assert len(calls) == 2 * ROUNDS
    assert t == pytest.approx(1.01) and sp == pytest.approx(0.02 / 1.01)
    # always noisy: 1 + REMEASURES attempts, the least noisy returned
    seq = iter([1, 3, 1, 1, 2, 1, 1, 4, 1] * 3)
    t, sp = repeated(lambda: float(next(seq)))
    assert sp == pytest.approx(1.0) and t == 1.0
    assert REMEASURES == 2


def test_noise_summary_counts_rows_above_threshold_and_names_the_worst():
    rows = [row(spread=0.01)] * 8 + [row("collective", "all_gather", 0.9, world=2,
                                         shape={"bytes": 65536, "after_compute_s": 0.001}),
                                     row(spread=NOISY_SPREAD + 0.01)]
    n = profile_noise(rows)
    assert (n.measured, n.noisy) == (10, 2) and n.is_noisy
    assert n.worst == ("all_gather 64 KiB n=2 (in step)", 0.9)
    assert "2 of 10 measurements above 25 %" in n.describe()
    assert not profile_noise([row(spread=0.01)] * 10).is_noisy
    old = profile_noise([row(spread=None)])
    assert old == ProfileNoise(0, 0, None, None) and not old.is_noisy and "older" in old.describe()
    assert row_label(row()) == "gemm matmul 64x64x64 float32"


def test_spread_is_stored_and_a_noisy_profile_warns_once_when_used(tmp_path, capsys):
    db = str(tmp_path / "p.sqlite")
    store = ProfileStore(db)
    store.add_run(FP, "quick", [row(spread=0.02)] * 9 + [row(spread=0.03)])
    t = measured_tables(db, "f00d")
    assert t["noise"].measured == 10 and not t["noise"].is_noisy
    assert noisy_profile_warning(t) is None
    store.add_run(FP, "quick", [row(spread=0.02)] * 7 + [row(spread=0.5)] * 3)
    t = measured_tables(db, "f00d")
    assert [r["spread"] for r in store.measurements(t["run_id"])][-1] == 0.5
    msg = noisy_profile_warning(t)
    assert msg.startswith("paraplan: warning: profile run 2") and "busy machine" in msg
    assert "3 of 10" in msg and "paraplan profile" in msg
    warn_if_noisy(t)
    warn_if_noisy(t)
    assert capsys.readouterr().err.count("paraplan: warning:") == 1


def test_database_from_before_the_spread_column_is_migrated(tmp_path):
    db = str(tmp_path / "old.sqlite")
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE machines (fingerprint TEXT PRIMARY KEY, hostname TEXT, cpu_model TEXT,
            cpu_cores INTEGER, torch_version TEXT, gpus TEXT, first_seen REAL);
        CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT NOT NULL,
            mode TEXT, started REAL, finished REAL);
        CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL,
            kind TEXT NOT NULL, op TEXT NOT NULL, device TEXT, dtype TEXT, world_size INTEGER,
            shape TEXT, bytes INTEGER, flops REAL, time_s REAL, flops_per_s REAL,
            bandwidth_bytes_per_s REAL, bus_bandwidth_bytes_per_s REAL);
        INSERT INTO machines VALUES ('f00d', 'h', 'c', 2, 't', '[]', 0);
        INSERT INTO runs VALUES (1, 'f00d', 'quick', 0, 0);
        INSERT INTO measurements (run_id, kind, op, device, dtype, world_size, shape, flops, time_s,
            flops_per_s) VALUES (1, 'gemm', 'matmul', 'cpu', 'float32', 1, '{"m": 8, "n": 8, "k": 8}',
            1024, 1e-6, 1.024e9);
    """)
    con.commit()
    con.close()
    t = measured_tables(db, "f00d")      # opens through ProfileStore: adds the column
    assert t["noise"].measured == 0 and noisy_profile_warning(t) is None
    ProfileStore(db).add_run(FP, "quick", [row(spread=0.1)])
    assert measured_tables(db, "f00d")["noise"].measured == 1


def test_summary_is_a_few_lines_not_every_row():
    rows = [row(flops_per_s=v * 1e9) for v in (10, 40)] + \
        [row("gemm_linear", "linear_fwd_bwd", flops_per_s=v * 1e9) for v in (20, 30)] + \
        [row("memcpy", "copy", flops=None, flops_per_s=None, bandwidth_bytes_per_s=12e9, shape={"bytes": 1})] + \
        [row("collective", "all_reduce", 0.05, world=2, bytes=b, time_s=t, flops=None, flops_per_s=None,
             bus_bandwidth_bytes_per_s=b / t, shape={"bytes": b, "after_compute_s": 0.001})
         for b, t in ((4096, 6e-4), (16 << 20, 0.02))]
    lines = summarize(rows * 20)
    assert len(lines) <= 6
    text = "\n".join(lines)
    assert "float32 40.0 GFLOP/s" in text and "20.0-30.0 GFLOP/s" in text and "copy 12.0 GB/s" in text
    assert "all-reduce at 2 ranks (in step): 0.60 ms for 4 KiB" in text and "at 16 MiB" in text
    assert text.splitlines()[-1].startswith("noise: median spread")
