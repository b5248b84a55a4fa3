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


def read_text(path: Path | str, field: str = "file") -> str:
    """A file's text as UTF-8; ConfigError naming ``field`` if it cannot be read, is a folder, is
    too large or is not UTF-8 text."""
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


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Write text or bytes to path whole or not at all (temporary file in the same folder, then
    ``os.replace``; the temporary file is removed if anything fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
