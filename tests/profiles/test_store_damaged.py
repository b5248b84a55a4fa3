"""A profile database that is not one, is damaged, another program's or an older paraplan's, locked or
read-only: `--cluster profile:NAME` / `local`, `profile` and `validate` name `--db` in one line and say
what is wrong, without waiting a minute on a lock or writing to a database they only read (issue 67: a
`--db` that is not a database or has an old schema ended in a traceback; a locked one waited 60 s).

The databases are made by the fuzzer's own builder (benchmarks/fuzz_cli.py), the rows of a valid one are
a small made-up CPU profile stored with paraplan's schema."""
from __future__ import annotations

import importlib.util
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import ConfigError
from paraplan.profiles.store import ProfileStore

_spec = importlib.util.spec_from_file_location("fuzz_cli", Path(__file__).parents[2] / "benchmarks" / "fuzz_cli.py")
fuzz = sys.modules.get("fuzz_cli") or importlib.util.module_from_spec(_spec)
if "fuzz_cli" not in sys.modules:
    sys.modules["fuzz_cli"] = fuzz
    _spec.loader.exec_module(fuzz)

ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "profile:fz-host", "--tp", "1", "--format", "json"]


@pytest.fixture
def db(tmp_path):
    held = []

    def make(kind):
        p = tmp_path / ("ro" if kind.startswith("readonly") else "") / "profiles.sqlite"
        p.parent.mkdir(exist_ok=True)
        held.extend(fuzz._make_db(p, kind))
        if kind.startswith("readonly"):
            held.extend(fuzz._read_only(p.parent))
        return p
    yield make
    for h in held:
        h.close()


def _run(capsys, argv):
    t0 = time.perf_counter()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, [ln for ln in err.splitlines() if ln.strip()], time.perf_counter() - t0


@pytest.mark.parametrize("kind, needle", [
    ("text", "is not an SQLite database"), ("truncated", "damaged"), ("corrupt", "damaged"),
    ("foreign", "another program's database"), ("missing-tables", "is not a paraplan profile database"),
    ("old-schema", "an older paraplan's store: run `paraplan profile` to bring it up to date"), ("bad-rows", "--db"), ("future-columns", "--db"), ("null-shapes", "--db"),
    ("locked", "is locked by another process"), ("dir", "is a folder"),
])
def test_a_damaged_database_is_named_in_one_line(capsys, db, kind, needle):
    path = db(kind)
    rc, out, lines, seconds = _run(capsys, [*ESTIMATE, "--db", str(path)])
    assert rc == 2 and out == "" and len(lines) == 1, lines
    assert lines[0].startswith("paraplan: error: --db: ") and needle in lines[0], lines[0]
    assert seconds < 20                                        # a lock is waited on for 5 s, not 60


def test_an_empty_database_holds_no_profile(capsys, db):
    rc, _, lines, _ = _run(capsys, [*ESTIMATE, "--db", str(db("empty"))])
    assert rc == 2 and len(lines) == 1 and "no profile named 'fz-host'" in lines[0] and "profiles: none" in lines[0]


@pytest.mark.parametrize("kind", ["valid", "valid-wal", "locked-wal", "readonly", "readonly-wal"])
def test_a_valid_database_is_read_without_being_written(capsys, db, kind):
    """Read, even locked by a writer (WAL lets readers through) or in a folder it cannot write to; and
    never written: a rollback-journal database stays one (the reader once switched it to WAL)."""
    path = db(kind)
    before = path.read_bytes()
    rc, out, lines, _ = _run(capsys, [*ESTIMATE, "--db", str(path)])
    assert rc == 0 and '"step_time_s"' in out, lines
    if not kind.startswith("locked"):
        assert path.read_bytes() == before
    # the file header's read/write versions (bytes 18, 19): 2 in WAL mode, 1 with a rollback journal
    assert path.read_bytes()[18] == (2 if "wal" in kind else 1)


def test_profile_and_validate_name_a_bad_database_before_they_start(db, tmp_path):
    from paraplan.cli import build_parser
    from paraplan.cli.validate import check_profile_args, check_validate_args
    ap = build_parser()
    for kind in ("text", "foreign", "locked", "corrupt", "old-schema"):
        path = str(db(kind))
        with pytest.raises(ConfigError, match="--db") as e:
            check_validate_args(ap.parse_args(["validate", "--db", path, "--out", str(tmp_path / "v")]))
        assert e.value.field == "--db", kind
        if kind == "old-schema":         # profile brings an older store up to date
            check_profile_args(ap.parse_args(["profile", "--db", path]))
            assert {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(measurements)")} >= {"spread", "bytes"}
        else:
            with pytest.raises(ConfigError) as e:
                check_profile_args(ap.parse_args(["profile", "--db", path]))
            assert e.value.field == "--db", kind
        Path(path).unlink()


def test_the_environment_variable_is_named_when_it_chose_the_database(capsys, db, monkeypatch):
    monkeypatch.setenv("PARAPLAN_PROFILE_DB", str(db("text")))
    rc, _, lines, _ = _run(capsys, ESTIMATE)
    assert rc == 2 and lines[0].startswith("paraplan: error: PARAPLAN_PROFILE_DB: ")


def test_a_new_store_is_created_where_it_is_named(tmp_path):
    store = ProfileStore(str(tmp_path / "new" / "p.sqlite"))
    assert store.count() == 0 and store.machines() == [] and ProfileStore(store.path, readonly=True).machines() == []
    (tmp_path / "empty.sqlite").write_bytes(b"")
    assert ProfileStore(str(tmp_path / "empty.sqlite"), readonly=True).empty
