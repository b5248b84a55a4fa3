"""On-disk SQLite store of profiling results, keyed by a machine fingerprint.

One database file (default ``~/.cache/paraplan/profiles.sqlite``, or ``$PARAPLAN_PROFILE_DB``,
or ``$XDG_CACHE_HOME/paraplan/profiles.sqlite``). Safe for concurrent writers: WAL journal, a
busy timeout, and each profiling run is written in one ``BEGIN IMMEDIATE`` transaction so a
run's rows land all together or not at all.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import socket
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass

from paraplan.errors import ConfigError, require_extra, shown
from paraplan.io import path_problem

SCHEMA = """
CREATE TABLE IF NOT EXISTS machines (
    fingerprint   TEXT PRIMARY KEY,
    hostname      TEXT, cpu_model TEXT, cpu_cores INTEGER, torch_version TEXT, gpus TEXT,
    first_seen    REAL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint   TEXT NOT NULL REFERENCES machines(fingerprint),
    mode          TEXT, started REAL, finished REAL
);
CREATE TABLE IF NOT EXISTS measurements (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id        INTEGER NOT NULL REFERENCES runs(run_id),
    kind          TEXT NOT NULL,      -- gemm, sdpa, memcpy, h2d, d2h, collective
    op            TEXT NOT NULL,      -- e.g. matmul, all_reduce
    device        TEXT, dtype TEXT, world_size INTEGER,
    shape         TEXT,               -- JSON of the sizes that define the case
    bytes         INTEGER, flops REAL, time_s REAL,
    flops_per_s   REAL, bandwidth_bytes_per_s REAL, bus_bandwidth_bytes_per_s REAL,
    spread        REAL                -- (max - min) / median over the repeats; NULL: not repeated
);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id, kind);
"""

COLUMNS = ("kind", "op", "device", "dtype", "world_size", "shape", "bytes", "flops", "time_s",
           "flops_per_s", "bandwidth_bytes_per_s", "bus_bandwidth_bytes_per_s", "spread")

#: a measurement whose repeats spread more than this, (max - min) / median, is noisy
NOISY_SPREAD = 0.25
#: a profile with more than this share of noisy measurements is noisy (warned about when used)
NOISY_SHARE = 0.10


@dataclass(frozen=True)
class ProfileNoise:
    """How repeatable a profile run's measurements were.

    ``measured``: rows with a spread (older profiles have none); ``noisy``: rows whose spread
    exceeds NOISY_SPREAD; ``median_spread``; ``worst``: (label, spread) of the widest row."""

    measured: int
    noisy: int
    median_spread: float | None
    worst: tuple[str, float] | None

    @property
    def is_noisy(self) -> bool:
        """More than NOISY_SHARE of the measurements spread over NOISY_SPREAD."""
        return self.measured > 0 and self.noisy > NOISY_SHARE * self.measured

    def describe(self) -> str:
        """'160 measurements repeated 3x: median spread 4.1 %, 7 above 25 % (worst: ...)'."""
        if not self.measured:
            return "spread not measured (profile from an older paraplan)"
        worst = f" (worst: {self.worst[0]}, {100 * self.worst[1]:.0f} %)" if self.noisy else ""
        return (f"median spread between repeats {100 * self.median_spread:.1f} %, {self.noisy} of "
                f"{self.measured} measurements above {100 * NOISY_SPREAD:.0f} %{worst}")


def row_label(r: dict) -> str:
    """A short human name of a measurement row: 'all_reduce 64 KiB n=2 (in step)'."""
    shape = r.get("shape") or {}
    parts = [r["op"] if r["kind"] in ("collective", "autograd", "optimizer", "checkpoint", "fsdp",
                                      "contention", "elementwise") else f"{r['kind']} {r['op']}"]
    if r["kind"] == "collective":
        parts.append(_size(shape.get("bytes", 0)))
    elif {"m", "n", "k"} <= set(shape):
        parts.append(f"{shape['m']}x{shape['k']}x{shape['n']} {r.get('dtype')}")
    if (r.get("world_size") or 1) > 1:
        parts.append(f"n={r['world_size']}")
    if "after_compute_s" in shape:
        parts.append("(in step)")
    return " ".join(parts)


def _size(nbytes: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def profile_noise(rows: list[dict]) -> ProfileNoise:
    """The noise summary of a run's rows (those with a ``spread``)."""
    import statistics
    spread = [(r["spread"], r) for r in rows if r.get("spread") is not None]
    if not spread:
        return ProfileNoise(0, 0, None, None)
    worst = max(spread, key=lambda x: x[0])
    return ProfileNoise(len(spread), sum(1 for s, _ in spread if s > NOISY_SPREAD),
                        statistics.median(s for s, _ in spread), (row_label(worst[1]), worst[0]))


def default_db_path() -> str:
    """``$PARAPLAN_PROFILE_DB``, else ``<cache dir>/paraplan/profiles.sqlite``."""
    if os.environ.get("PARAPLAN_PROFILE_DB"):
        return os.environ["PARAPLAN_PROFILE_DB"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "paraplan", "profiles.sqlite")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_fingerprint(needed_by: str = "--cluster local (this machine's profile)") -> dict:
    """Hostname, CPU model, core count, torch version and GPU names, plus a short hash ``id``; MissingExtra
    naming ``needed_by`` without torch (the fingerprint holds its version and the GPUs it sees)."""
    torch = require_extra("torch", needed_by, alternative="name a stored profile: --cluster profile:HOSTNAME")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    fp = {"hostname": socket.gethostname(), "cpu_model": _cpu_model(),
          "cpu_cores": os.cpu_count() or 1, "torch_version": torch.__version__, "gpus": gpus}
    fp["id"] = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return fp


#: the columns of each table that make it paraplan's (a table without them is another program's)
KEY_COLUMNS = {"machines": ("fingerprint",), "runs": ("run_id", "fingerprint"), "measurements": ("run_id", "kind")}
#: the columns a reader needs (``spread`` may be missing: profiles from before the repeats were stored)
REQUIRED_COLUMNS = {"machines": ("fingerprint", "hostname"), "runs": ("run_id", "fingerprint"),
                    "measurements": ("run_id", *(c for c in COLUMNS if c != "spread"))}
#: every column of each table and its type, from SCHEMA: what `paraplan profile` adds to an older store
ALL_COLUMNS = {"machines": (("hostname", "TEXT"), ("cpu_model", "TEXT"), ("cpu_cores", "INTEGER"),
                            ("torch_version", "TEXT"), ("gpus", "TEXT"), ("first_seen", "REAL")),
               "runs": (("mode", "TEXT"), ("started", "REAL"), ("finished", "REAL")),
               "measurements": tuple((c, "TEXT" if c in ("kind", "op", "device", "dtype", "shape") else
                                      "INTEGER" if c in ("world_size", "bytes") else "REAL") for c in COLUMNS)}
#: how long a reader waits for another process's write lock before saying the database is locked
READ_TIMEOUT_S = 5.0
STORE_HINT = "a profile database written by `paraplan profile` (or a new file name)"


def db_field(path: str | None) -> str:
    """What names the database in an error: --db, or the environment variable that chose it."""
    return "PARAPLAN_PROFILE_DB" if path is None and os.environ.get("PARAPLAN_PROFILE_DB") else "--db"


def describe_sqlite_error(e: Exception, timeout_s: float) -> str:
    """What an SQLite error means for a profile database, in a user's words."""
    text = str(e)
    low = text.lower()
    if "not a database" in low or "file is encrypted" in low:
        return "is not an SQLite database (a text file, another format, or damaged from its first page)"
    if "malformed" in low or "corrupt" in low:
        return f"is damaged ({text})"
    if "locked" in low or "busy" in low:
        return f"is locked by another process (waited {timeout_s:g} s)"
    if "readonly" in low or "read-only" in low:
        return "cannot be written (a read-only file or folder)"
    if "unable to open" in low:
        return "cannot be opened (a folder, or a path whose folders are missing or unreadable)"
    if "no such table" in low or "no such column" in low or "has no column" in low:
        return f"is not a paraplan profile database, or one from an older paraplan ({text})"
    return f"cannot be read ({type(e).__name__}: {text[:120]})"


def _guarded(method):
    """A ProfileStore method whose SQLite errors (and rows that do not decode) become the store's ConfigError."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._errors():
            return method(self, *args, **kwargs)
    return run


class ProfileStore:
    """The profile database at ``path``: created with its schema on first use, or, ``readonly``, opened
    without writing anything (no schema, no journal switch; a short lock timeout) as `estimate --cluster
    local` reads it. Every problem with the file is a ConfigError naming ``--db`` (or PARAPLAN_PROFILE_DB):
    not a database, damaged, locked, read-only, another program's tables or an older paraplan's."""

    def __init__(self, path: str | None = None, timeout_s: float = 60.0, *, readonly: bool = False):
        self.field = db_field(path)
        self.path = path or default_db_path()
        self.readonly = readonly
        self.timeout_s = min(timeout_s, READ_TIMEOUT_S) if readonly else timeout_s
        problem = path_problem(self.path)
        if problem:
            raise ConfigError(self.field, problem)
        if os.path.isdir(self.path):
            raise ConfigError(self.field, f"{shown(self.path, 80)} is a folder", accepted=STORE_HINT)
        if readonly:
            if not os.path.exists(self.path):
                raise ConfigError(self.field, f"no profile database at {shown(self.path, 80)}",
                                  accepted="run `paraplan profile --quick` first")
            with self._errors():
                con = self._connect()
                try:
                    self.empty = not self._check_schema(con)
                    self._check_pages(con)
                finally:
                    con.close()
            return
        d = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise ConfigError(self.field, f"cannot create the folder of {shown(self.path, 80)}: {e.strerror or e}") \
                from None
        with self._errors():
            con = self._connect()
            try:
                self._check_pages(con)
                con.executescript(SCHEMA)
                self._check_schema(con, KEY_COLUMNS)
                self._add_missing_columns(con)
            finally:
                con.close()

    @staticmethod
    def _check_pages(con: sqlite3.Connection) -> None:
        """SQLite's quick check of every page (milliseconds for a profile): a damaged file is said when it
        is opened, not read as holding fewer rows."""
        problem = con.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")

    @staticmethod
    def _add_missing_columns(con: sqlite3.Connection) -> None:
        """An older store gains the columns later versions write (``spread``: the repeats' spread, ...)."""
        for table, columns in ALL_COLUMNS.items():
            have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name in have:
                    continue
                try:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
                except sqlite3.OperationalError as e:   # another process added it meanwhile
                    if "duplicate column" not in str(e):
                        raise

    @contextlib.contextmanager
    def _errors(self):
        """SQLite's errors (and rows that are not what `paraplan profile` writes) as a ConfigError naming
        the database."""
        try:
            yield
        except sqlite3.Error as e:
            raise ConfigError(self.field, f"{shown(self.path, 80)} {describe_sqlite_error(e, self.timeout_s)}",
                              accepted=STORE_HINT) from None
        except (ValueError, TypeError) as e:      # a row's shape that is not JSON, a count that is not a number
            raise ConfigError(self.field, f"{shown(self.path, 80)} holds a row paraplan did not write "
                              f"({type(e).__name__}: {str(e)[:120]})", accepted=STORE_HINT) from None
        except OSError as e:
            raise ConfigError(self.field, f"cannot read {shown(self.path, 80)}: {e.strerror or e}") from None

    #: a database without tables (a new or empty file): nothing stored
    empty = False

    def _check_schema(self, con: sqlite3.Connection, required=REQUIRED_COLUMNS) -> bool:
        """ConfigError when the file holds tables but not paraplan's (another program's), or paraplan's
        without the ``required`` columns (a reader's: an older store, which `paraplan profile` brings up to
        date); an empty database passes (False: nothing stored)."""
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return False
        for table, needed in required.items():
            if table not in tables:
                raise ConfigError(self.field, f"{shown(self.path, 80)} is not a paraplan profile database: it has "
                                  f"no table {table} (tables: {', '.join(sorted(tables))[:120]})", accepted=STORE_HINT)
            cols = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
            missing = [c for c in needed if c not in cols]
            if missing:
                old = table not in KEY_COLUMNS or all(c in cols for c in KEY_COLUMNS[table])
                raise ConfigError(self.field, f"{shown(self.path, 80)}: table {table} has no column "
                                  f"{', '.join(missing)[:160]} ("
                                  + ("an older paraplan's store: run `paraplan profile` to bring it up to date)" if old
                                     else "another program's database)"), accepted=STORE_HINT)
        return True

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            uri = "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(self.path))) + "?mode=ro"
            con = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None)
            try:
                con.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
                con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.OperationalError as e:
                if "unable to open" not in str(e):
                    raise
                # a WAL database in a folder this process cannot write to: SQLite cannot make the shared-memory
                # file beside it; the file alone is read as it is (what the last writer checkpointed)
                con.close()
                con = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=self.timeout_s, isolation_level=None)
            con.row_factory = sqlite3.Row
            return con
        con = sqlite3.connect(os.fsencode(self.path), timeout=self.timeout_s, isolation_level=None)
        con.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
        if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._switch_to_wal(con)
        con.row_factory = sqlite3.Row
        return con

    def _switch_to_wal(self, con: sqlite3.Connection) -> None:
        """Put the file in WAL mode (persistent, so once per database).

        The switch needs the file to itself and SQLite answers ``database is locked`` at once,
        without its busy handler, while another connection holds it (two first profiles at the same
        moment): retry until ``timeout_s``.
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                con.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @_guarded
    def add_run(self, fingerprint: dict, mode: str, rows: list[dict],
                started: float | None = None) -> int:
        """Insert one profiling run and its measurement rows atomically; returns ``run_id``."""
        now = time.time()
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT OR IGNORE INTO machines VALUES (?,?,?,?,?,?,?)",
                        (fingerprint["id"], fingerprint["hostname"], fingerprint["cpu_model"],
                         fingerprint["cpu_cores"], fingerprint["torch_version"],
                         json.dumps(fingerprint["gpus"]), now))
            cur = con.execute("INSERT INTO runs (fingerprint, mode, started, finished) "
                              "VALUES (?,?,?,?)", (fingerprint["id"], mode, started or now, now))
            run_id = cur.lastrowid
            con.executemany(
                f"INSERT INTO measurements (run_id, {', '.join(COLUMNS)}) "
                f"VALUES (?, {', '.join('?' * len(COLUMNS))})",
                [(run_id, *[json.dumps(r[c]) if c == "shape" else r.get(c) for c in COLUMNS])
                 for r in rows])
            con.execute("COMMIT")
            return run_id
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        finally:
            con.close()

    @_guarded
    def latest_run(self, fingerprint_id: str, kind: str | None = None) -> int | None:
        """Newest run id for a machine (that has rows of ``kind`` if given)."""
        if self.empty:
            return None
        con = self._connect()
        try:
            q = ("SELECT MAX(r.run_id) FROM runs r JOIN measurements m ON m.run_id = r.run_id "
                 "WHERE r.fingerprint = ?" + (" AND m.kind = ?" if kind else ""))
            row = con.execute(q, (fingerprint_id, kind) if kind else (fingerprint_id,)).fetchone()
            return row[0]
        finally:
            con.close()

    @_guarded
    def machines(self) -> list[dict]:
        """Every machine with a stored run: fingerprint, hostname, cpu_model, gpus, runs."""
        if self.empty:
            return []
        con = self._connect()
        try:
            cols = {r[1] for r in con.execute("PRAGMA table_info(machines)")}
            q = ("SELECT m.fingerprint, m.hostname, " + ("m.cpu_model, m.gpus, " if {"cpu_model", "gpus"} <= cols
                                                         else "NULL AS cpu_model, NULL AS gpus, ") +
                 "COUNT(r.run_id) AS runs "
                 "FROM machines m JOIN runs r ON r.fingerprint = m.fingerprint GROUP BY m.fingerprint")
            return [dict(r) for r in con.execute(q)]
        finally:
            con.close()

    def resolve(self, name: str) -> list[str]:
        """Fingerprint ids matching ``name``: an id, a unique id prefix, or a hostname."""
        ms = self.machines()
        exact = [m["fingerprint"] for m in ms if m["fingerprint"] == name]
        if exact:
            return exact
        return [m["fingerprint"] for m in ms
                if m["fingerprint"].startswith(name) or m["hostname"] == name]

    @_guarded
    def measurements(self, run_id: int | None = None, kind: str | None = None) -> list[dict]:
        """Rows as dicts (``shape`` decoded), optionally for one run and/or kind."""
        where, args = [], []
        if run_id is not None:
            where.append("run_id = ?")
            args.append(run_id)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        q = "SELECT * FROM measurements" + (" WHERE " + " AND ".join(where) if where else "")
        if self.empty:
            return []
        con = self._connect()
        try:
            out = [dict(r) for r in con.execute(q + " ORDER BY id", args)]
        finally:
            con.close()
        for r in out:
            for c in COLUMNS:            # an older store's missing columns read as blank
                r.setdefault(c, None)
            r["shape"] = json.loads(r["shape"]) if r["shape"] else None
        return out

    @_guarded
    def count(self, table: str = "measurements") -> int:
        if table not in ("machines", "runs", "measurements"):
            raise ValueError(table)
        con = self._connect()
        try:
            return con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        finally:
            con.close()


def measured_tables(db: str | None = None, fingerprint_id: str | None = None) -> dict:
    """The latest profile of a machine (default: this one) as plain lists for the estimator.

    Returns
    -------
    dict
        ``fingerprint``, ``run_id`` and per kind: ``gemm`` = [{device, dtype, m, n, k, flops,
        flops_per_s}], ``gemm_linear`` the same for the training-layout GEMMs (absent in older profiles), ``sdpa`` = [{device, dtype, flops, flops_per_s, shape}],
        ``memory_bandwidth`` = {device: bytes/s}, ``launch`` = {device: seconds per tiny op}
        and ``device_memory`` = {device: bytes} (both absent in older profiles), ``h2d`` / ``d2h`` = bytes/s or None,
        ``noise`` = :class:`ProfileNoise` of the run, ``training`` = {device: {world_size: {"autograd": {op: (seconds, kernels)}, "contention_s": seconds of
        the reference GEMM, "adamw": [(tensors, numel, seconds)], "checkpoint": {ops: {"plain" |
        "forward" | "checkpointed": seconds}}}}} (absent in older profiles),
        ``collectives`` = {op: {world_size: [(bytes, bus_bandwidth_bytes_per_s, time_s)]}} timed back to
        back, ``collectives_in_step`` the same issued after IN_STEP_COMPUTE_S of compute (absent in
        older profiles).
    """
    store = ProfileStore(db, readonly=True)
    fid = fingerprint_id or machine_fingerprint()["id"]
    run_id = store.latest_run(fid)
    if run_id is None:
        raise ConfigError("profile", f"no profile stored for machine {fid} in {store.path}",
                          accepted="run `paraplan profile` first")
    rows = store.measurements(run_id)
    out = {"fingerprint": fid, "run_id": run_id, "noise": profile_noise(rows), "gemm": [], "gemm_linear": [], "sdpa": [],
           "memory_bandwidth": {}, "launch": {}, "elementwise": {}, "device_memory": {}, "h2d": None, "d2h": None, "collectives": {}, "collectives_in_step": {},
           "training": {}, "calibration": {}}
    for r in rows:
        k = r["kind"]
        if k == "calibration":      # a calibrated profile's fitted factor (paraplan calibrate)
            out["calibration"][r["op"]] = float((r["shape"] or {})["factor"])
            continue
        if k == "gemm_linear":
            out["gemm_linear"].append({"device": r["device"], "dtype": r["dtype"], **r["shape"],
                                       "flops": r["flops"], "flops_per_s": r["flops_per_s"]})
        elif k == "gemm":
            out["gemm"].append({"device": r["device"], "dtype": r["dtype"], **r["shape"],
                                "flops": r["flops"], "flops_per_s": r["flops_per_s"]})
        elif k == "sdpa":
            out["sdpa"].append({"device": r["device"], "dtype": r["dtype"], "shape": r["shape"],
                                "flops": r["flops"], "flops_per_s": r["flops_per_s"]})
        elif k == "memcpy":
            out["memory_bandwidth"][r["device"]] = r["bandwidth_bytes_per_s"]
        elif k == "device":
            out["device_memory"][r["device"]] = r["bytes"]
        elif k == "launch":
            out["launch"][r["device"]] = r["time_s"]
        elif k == "elementwise":
            out["elementwise"].setdefault(r["device"], {}).setdefault(r["op"], []).append(
                (r["shape"]["numel"], r["bytes"], r["time_s"]))
        elif k in ("h2d", "d2h"):
            out[k] = r["bandwidth_bytes_per_s"]
        elif k in ("autograd", "contention", "optimizer", "checkpoint", "fsdp", "routed", "tp"):
            w = out["training"].setdefault(r["device"], {}).setdefault(
                int(r["world_size"]), {"autograd": {}, "contention_s": None, "adamw": [], "checkpoint": {}})
            if k == "checkpoint":
                w["checkpoint"].setdefault(int(r["shape"]["ops"]), {})[r["op"]] = r["time_s"]
            elif k == "routed":       # routed experts and the one MLP of their FLOPs, and their shape
                w.setdefault("routed", {})[r["op"]] = {"time_s": r["time_s"], "shape": dict(r["shape"] or {})}
            elif k == "autograd":
                w["autograd"][r["op"]] = (r["time_s"], r["shape"]["kernels"])
            elif k == "tp":           # the tensor-parallel wrappers' host cost: chained calls and none
                w.setdefault("tp_wrapper", {})[r["op"]] = (r["time_s"], int((r["shape"] or {}).get("calls", 0)))
            elif k == "fsdp" and r["op"] == "adam_tensor":   # FSDP2's optimizer step, per tensor
                w["fsdp_adam_tensor_s"] = r["time_s"]
            elif k == "fsdp":         # FSDP2's own cost per unit and micro-batch (world > 1)
                w["fsdp_unit_s"] = r["time_s"]
            elif k == "contention":   # the block when measured (older profiles: the GEMM)
                if r["op"] == "block" or w["contention_s"] is None:
                    w["contention_s"] = r["time_s"]
                if r["op"] == "block":        # a whole transformer layer: its shape travels with it
                    w["block"] = {"shape": dict(r["shape"] or {}), "time_s": r["time_s"]}
            else:
                w["adamw"].append((r["shape"]["tensors"], r["shape"]["numel"], r["time_s"]))
        elif k == "collective":
            key = "collectives_in_step" if "after_compute_s" in (r["shape"] or {}) else "collectives"
            per = out[key].setdefault(r["op"], {}).setdefault(r["world_size"], [])
            per.append((r["bytes"], r["bus_bandwidth_bytes_per_s"], r["time_s"]))
    for per_op in (*out["collectives"].values(), *out["collectives_in_step"].values()):
        for lst in per_op.values():
            lst.sort()
    return out
