"""Reading and writing files: YAML/JSON mappings with errors that name the field and the file,
typed field access, and whole-or-nothing writes."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from paraplan.errors import ConfigError, shown  # noqa: F401 (shown: re-exported for readers)


# Files a user hands in are small; a larger one is not what the flag expects (and parsing it would
# take long). Nesting deeper than this is not a config, and Python's parsers recurse on it.
MAX_INPUT_BYTES = 64 * 2**20
MAX_NESTING = 200


def path_problem(path) -> str | None:
    """Why ``path`` cannot name a file at all, or None: a NUL character (no OS takes one), or a character
    no file name holds (a lone surrogate other than \\udc80-\\udcff, which stand for bytes that are not
    UTF-8 and name real files)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        return "the path holds a NUL character" if b"\x00" in text else None
    if "\x00" in text:
        return "the path holds a NUL character"
    try:
        os.fsencode(text)
    except UnicodeEncodeError as e:
        return f"the path holds {shown(e.object[e.start:e.end])}, which no file name can hold (a lone surrogate)"
    return None


def read_text(path: Path | str, field: str = "file") -> str:
    """A file's text as UTF-8; ConfigError naming ``field`` if it cannot be read, is a folder, is
    too large or is not UTF-8 text."""
    problem = path_problem(path)
    if problem:
        raise ConfigError(field, f"{shown(str(path), 80)}: {problem}")
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(field, f"{path} is a folder", accepted="a file")
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise ConfigError(field, f"{path} is {path.stat().st_size:,} bytes", accepted=f"files up to {MAX_INPUT_BYTES:,} bytes")
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(field, f"cannot read {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, f"not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})", source=str(path)) from None


def _nesting(text: str) -> int:
    """Deepest bracket nesting of a YAML/JSON text (brackets in strings counted too: an upper bound)."""
    depth = worst = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            worst = max(worst, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return worst


def _parse(text: str, parse, path: Path, field: str):
    """Run a parser, turning what it cannot represent (deep nesting, 5000-digit integers) into ConfigErrors."""
    if _nesting(text) > MAX_NESTING:
        raise ConfigError(field, f"nested more than {MAX_NESTING} levels deep", source=str(path))
    try:
        return parse(text)
    except RecursionError:
        raise ConfigError(field, f"nested more than {MAX_NESTING} levels deep", source=str(path)) from None
    except ValueError as e:
        if "integer string conversion" in str(e) or "digits" in str(e):
            raise ConfigError(field, "a number with more than 4300 digits", source=str(path)) from None
        raise


def read_yaml(path: Path | str, field: str = "file") -> dict:
    """Read a YAML/JSON mapping, turning every failure into a ConfigError that names the file."""
    path = Path(path)
    text = read_text(path, field)
    try:
        data = _parse(text, yaml.safe_load, path, field)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(field, f"malformed YAML/JSON{where}: {getattr(e, 'problem', e)}",
                          source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(field, "expected a mapping of keys to values at the top level", source=str(path))
    return data


def read_json(path: Path | str, field: str = "file") -> Any:
    """Read a JSON document, turning a file that cannot be read or parsed into a ConfigError naming
    ``field`` and the file (line and column of a syntax error). The top-level type is the caller's to check."""
    path = Path(path)
    text = read_text(path, field)
    try:
        return _parse(text, json.loads, path, field)
    except json.JSONDecodeError as e:
        raise ConfigError(field, f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                          source=str(path)) from None


# Numbers in input files: anything beyond this is a typo (or a 5000-digit fuzz) and overflows numpy.
MAX_NUMBER = 1e18
MAX_INTEGER = 2**31 - 1


class FieldReader:
    """Typed access to a mapping's fields with errors that name the field and the file."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = ""):
        self.data, self.source, self.prefix = data, source, prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ConfigError(self._name(key), "missing required field", source=self.source)
            return default
        return self.data[key]

    def string(self, key: str, default: Any = ...) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise ConfigError(self._name(key), f"expected text, got {shown(v)}", source=self.source)
        return v

    def number(self, key: str, default: Any = ..., *, positive: bool = True, integer: bool = False,
               at_most: float | None = None) -> float:
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(self._name(key), f"expected a number, got {shown(v)}", source=self.source)
        if not math.isfinite(v) or abs(v) > MAX_NUMBER:
            raise ConfigError(self._name(key), f"expected a finite number of at most {MAX_NUMBER:.0e}, got {shown(v)}",
                              source=self.source)
        if integer and int(v) != v:
            raise ConfigError(self._name(key), f"expected an integer, got {v!r}", source=self.source)
        if positive and v <= 0:
            raise ConfigError(self._name(key), f"must be positive, got {v!r}", source=self.source)
        if not positive and v < 0:
            raise ConfigError(self._name(key), f"must not be negative, got {v!r}", source=self.source)
        if at_most is not None and v > at_most:
            raise ConfigError(self._name(key), f"must be at most {at_most}, got {v!r}", source=self.source)
        return int(v) if integer else float(v)

    def integer(self, key: str, default: Any = ..., *, positive: bool = True, at_most: int = MAX_INTEGER) -> int:
        return int(self.number(key, default, positive=positive, integer=True, at_most=at_most))

    def mapping(self, key: str, default: Any = ...) -> "FieldReader":
        v = self.raw(key, default)
        if not isinstance(v, dict):
            raise ConfigError(self._name(key), f"expected a mapping, got {shown(v)}", source=self.source)
        return FieldReader(v, self.source, f"{self._name(key)}.")

    def sources(self) -> Mapping[str, str]:
        s = self.data.get("sources") or {}
        if not isinstance(s, dict):
            raise ConfigError(self._name("sources"), "expected a mapping of field -> source", source=self.source)
        return MappingProxyType({str(k): str(v) for k, v in s.items()})


#: Size suffixes a count may carry, binary as sequence lengths are spoken (8k = 8192, 128k = 131072,
#: 1M = 1,048,576); the same on every flag and sweep that takes a size (--seq-len, --global-batch,
#: --gpus, whatif's --sweep seq_len=2k..128k).
SIZE_SUFFIXES = {"k": 2**10, "m": 2**20}
SIZE_SYNTAX = "a number, optionally with k (x1024) or M (x1024^2): 8k = 8192"


def parse_size(text: str) -> float:
    """A number with an optional size suffix (:data:`SIZE_SUFFIXES`, either case): ``8k`` -> 8192.0,
    ``1.5k`` -> 1536.0, ``1M`` -> 1048576.0, ``64`` -> 64.0. ValueError when it is not one."""
    t = str(text).strip().lower()
    scale = SIZE_SUFFIXES.get(t[-1:], 1)
    if scale != 1:
        t = t[:-1]
    if not t or t[-1:] in SIZE_SUFFIXES:
        raise ValueError(f"not a size: {text!r}")
    return float(t) * scale


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it (Linux ``/proc``),
    else by the set-and-restore idiom of ``os.umask``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(path: Path | str, executable: bool = False) -> int:
    """Permission bits a plain ``open(path, "w")`` would leave: an existing file keeps its own,
    a new one gets 0o666 & ~umask (0o777 & ~umask when ``executable``, as ``chmod +x`` under the umask)."""
    mask = current_umask()
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~mask
    return mode | (0o111 & ~mask) if executable else mode


def fsync_dir(path: Path | str) -> None:
    """Flush a folder's entries (a rename in it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files that a killed :func:`write_atomic` of ``path`` left beside it
    (``.NAME.PID.XXXX`` whose writing process is gone); a live writer's file is left alone."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


def write_atomic(path: Path | str, data: str | bytes, *, executable: bool = False) -> None:
    """Write text or bytes to path whole or not at all: a temporary file in the same folder, given
    the mode a plain write would leave (``file_mode``: the umask for a new file, the old file's own
    bits otherwise), written and fsynced, then ``os.replace``d over ``path``; the temporary file is
    removed if anything fails. A reader, or a process killed at any moment, sees the old file or the
    new one, never a part; the temporary a killed writer left (its name carries the writer's pid) is
    removed by the next write of the same file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = file_mode(path, executable)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)   # mkstemp creates 0600 whatever the umask
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


#: The hidden folder inside an ``--out`` folder that holds the published generations of a report.
STATE_DIR = ".paraplan"


def _link_target(name: str) -> str:
    return f"{STATE_DIR}/current/{name}"


def check_publish_dir(out_dir: Path | str, entries: tuple[str, ...], field: str = "--out") -> None:
    """Refuse, before any work, an ``--out`` folder that ``publish_folder`` could not write into
    without removing something it did not write: a file there, or one of ``entries`` taken by
    anything but the link a previous publish left."""
    out = Path(out_dir)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise ConfigError(field, f"{out} exists and is not a folder", accepted="a folder (created if missing)")
    for name in entries:
        p = out / name
        if os.path.lexists(p) and not (p.is_symlink() and os.readlink(p) == _link_target(name)):
            raise ConfigError(field, f"{p} is in the way: it was not written by this report layout (a report "
                                     f"from an older paraplan, or your own file), and it is left alone",
                              accepted="another folder, or move that entry away")
    state = out / STATE_DIR
    if os.path.lexists(state) and (state.is_symlink() or not state.is_dir()):
        raise ConfigError(field, f"{state} is in the way (expected paraplan's own folder)",
                          accepted="another folder, or move that entry away")


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under root (before it is published)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


def _discard(out: Path, entries: tuple[str, ...], gen: Path | None, created: bool) -> None:
    """Undo an unpublished run: its generation; and where nothing was ever published, the entry
    links, paraplan's folder and ``out`` itself if this run created it and it is empty."""
    import shutil
    if gen is not None:
        shutil.rmtree(gen, ignore_errors=True)
    state = out / STATE_DIR
    if (state / "current").is_symlink():
        return
    for name in entries:
        p = out / name
        if p.is_symlink() and os.readlink(p) == _link_target(name):
            p.unlink()
    for child in state.iterdir():
        if child.name == "lock" or child.name.startswith((".current-", "gen-")):
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() and not child.is_symlink() else child.unlink()
    if not any(state.iterdir()):
        state.rmdir()
    if created and not any(out.iterdir()):
        out.rmdir()


def publish_folder(out_dir: Path | str, entries: tuple[str, ...], build, field: str = "--out") -> Path:
    """Publish a set of files and folders (``entries``, built by ``build(folder)``) into ``out_dir``
    so that, whatever moment the process is killed at, ``out_dir`` shows the previous complete set
    or the new complete set, never a mix, never none once there was one; nothing else in ``out_dir``
    is touched.

    Layout: each entry ``out_dir/NAME`` is a fixed relative link ``.paraplan/current/NAME``;
    ``.paraplan/current`` links to one complete generation folder ``.paraplan/gen-XXXX``. A run
    builds a new generation (mode from the umask, every file fsynced), then makes the commit, one
    ``os.replace`` of the ``current`` link, and only then removes the previous generation. The
    entry links are created (dangling) before the commit, so the first publish also appears at
    once. Leftovers of a killed run (an unpublished generation) are removed by the next publish.
    An ``flock`` on ``.paraplan/lock`` keeps two publishes into one folder apart (POSIX).
    """
    import fcntl
    import shutil

    out = Path(out_dir)
    check_publish_dir(out, entries, field)
    created = not os.path.lexists(out)
    out.mkdir(parents=True, exist_ok=True)          # mode from the umask, as mkdir(1)
    state = out / STATE_DIR
    state.mkdir(exist_ok=True)
    lock = os.open(state / "lock", os.O_CREAT | os.O_RDWR, 0o666)
    current = state / "current"
    gen: Path | None = None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        check_publish_dir(out, entries, field)      # again, under the lock
        live = os.readlink(current) if current.is_symlink() else None
        for child in state.iterdir():               # what a killed run left: never the live generation
            if child.name != live and (child.name.startswith("gen-") or child.name.startswith(".current-")):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        gen = Path(tempfile.mkdtemp(prefix="gen-", dir=state))
        os.chmod(gen, 0o777 & ~current_umask())     # mkdtemp makes 0700
        build(gen)
        missing = [n for n in entries if not os.path.lexists(gen / n)]
        if missing:
            raise RuntimeError(f"publish_folder: build() did not write {missing}")
        _fsync_tree(gen)
        for name in entries:
            if not os.path.lexists(out / name):
                os.symlink(_link_target(name), out / name)
        tmp_link = state / f".current-{gen.name}"
        os.symlink(gen.name, tmp_link)
        os.replace(tmp_link, current)               # the commit
        fsync_dir(state)
        if live and live != gen.name:
            shutil.rmtree(state / live, ignore_errors=True)
    except BaseException:
        if not (gen is not None and current.is_symlink() and os.readlink(current) == gen.name):
            _discard(out, entries, gen, created)    # not committed: the previous state stays as it was
        raise
    finally:
        os.close(lock)
    return out


def _names_a_file(path) -> bool:
    """Whether ``path`` is an existing file; False for names no file can have (too long, NUL bytes)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def spec_relative_to(spec: str, folder) -> str:
    """A model or cluster spec as a file written into ``folder`` keeps it: a preset name as given; a
    file (model YAML, HF config, cluster YAML) by its path relative to ``folder``, so what names it can
    be read from any working directory and moved together with it."""
    if not _names_a_file(spec):
        return spec
    return os.path.relpath(Path(spec).resolve(), Path(folder).resolve())


def spec_beside(spec: str, folder) -> str:
    """The inverse on reading: a relative spec naming a file in ``folder`` (where the file that names it
    lives) is that file; anything else (a preset, an absolute path, a path from the working directory)
    as given."""
    beside = Path(folder) / spec
    return str(beside) if not Path(spec).is_absolute() and _names_a_file(beside) else spec

