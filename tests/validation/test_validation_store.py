"""Profile store: concurrent writers, fingerprints, and a real (tiny) profile run."""
import pytest

import multiprocessing as mp
import sqlite3

from paraplan.profiles.store import measured_tables
from paraplan.validation.profile import ProfileOptions, run_profile
from paraplan.profiles.store import ProfileStore, default_db_path, machine_fingerprint

pytestmark = pytest.mark.torch

RUNS, ROWS = 25, 20


def _writer(path, who):
    store = ProfileStore(path)
    fp = machine_fingerprint()
    for i in range(RUNS):
        rows = [{"kind": "gemm", "op": f"w{who}", "device": "cpu", "dtype": "float32",
                 "world_size": 1, "shape": {"i": i, "j": j}, "bytes": j, "flops": 1.0,
                 "time_s": 1.0, "flops_per_s": 1.0} for j in range(ROWS)]
        store.add_run(fp, "test", rows)


def test_two_concurrent_writers_lose_no_rows(tmp_path):
    path = str(tmp_path / "p.sqlite")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = ProfileStore(path)
    assert store.count("runs") == 2 * RUNS
    assert store.count("measurements") == 2 * RUNS * ROWS
    assert store.count("machines") == 1
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # every run's rows landed together
        counts = con.execute("SELECT COUNT(*) FROM measurements GROUP BY run_id").fetchall()
    assert {c for (c,) in counts} == {ROWS}


def test_default_path_is_under_cache_dir_and_overridable(monkeypatch, tmp_path):
    monkeypatch.delenv("PARAPLAN_PROFILE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_db_path() == str(tmp_path / "paraplan" / "profiles.sqlite")
    monkeypatch.setenv("PARAPLAN_PROFILE_DB", str(tmp_path / "x.sqlite"))
    assert default_db_path() == str(tmp_path / "x.sqlite")


def test_fingerprint_is_stable():
    a, b = machine_fingerprint(), machine_fingerprint()
    assert a == b and len(a["id"]) == 16
    assert {"hostname", "cpu_model", "cpu_cores", "torch_version", "gpus"} <= set(a)


@pytest.mark.slow
def test_tiny_profile_run_yields_tables(tmp_path):
    db = str(tmp_path / "p.sqlite")
    opts = ProfileOptions(gemm_shapes=((64, 64, 64), (128, 128, 128)), gemm_dtypes=("float32",),
                          sdpa_shapes=((1, 2, 64, 32),), copy_bytes=1 << 20, world_sizes=(2,),
                          collective_bytes=(1 << 10, 1 << 14), min_time_s=0.02, mode="test")
    run_id, rows = run_profile(opts, db=db)
    t = measured_tables(db)
    assert t["run_id"] == run_id
    assert len(t["gemm"]) == 2 and all(g["flops_per_s"] > 0 for g in t["gemm"])
    assert t["sdpa"][0]["flops_per_s"] > 0
    assert t["memory_bandwidth"]["cpu"] > 0
    assert set(t["collectives"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                     "send_recv"}
    assert set(t["collectives_in_step"]) == set(t["collectives"])
    for per_world in (*t["collectives"].values(), *t["collectives_in_step"].values()):
        sizes = [b for b, bw, _ in per_world[2]]
        assert sizes == sorted(sizes) and len(sizes) == 2
        assert all(bw > 0 for _, bw, _ in per_world[2])
