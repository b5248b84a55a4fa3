"""One exception family for everything a user can get wrong.

``ParaplanError`` is the root; the CLI prints any of them as one line and exits 2.
"""
from __future__ import annotations

import difflib
import unicodedata
from typing import Iterable


def shown(value, limit: int = 40) -> str:
    """A value as an error message quotes it: its repr cut to about ``limit`` characters (a
    5000-digit number or a 300-byte name must not fill the screen)."""
    try:
        r = repr(value)
    except ValueError:                       # an int past Python's int -> str digit limit
        return "a number with thousands of digits"
    return r if len(r) <= limit else f"{r[:limit - 4]}... ({len(r)} characters)"


def printable(text: str) -> str:
    """``text`` safe to print on one terminal line: control and format characters (newlines, escape
    sequences, a bidi override, NUL), line and paragraph separators and lone surrogates (a file name's
    bytes that are not UTF-8) written as escapes (``\\x1b``, ``\\u202e``, ``\\udc80``); the rest as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else
                   (repr(ch)[1:-1] if unicodedata.category(ch) != "Cs" else f"\\u{ord(ch):04x}") for ch in text)


class ParaplanError(Exception):
    """Base class: a problem the user can fix, printed without a traceback, on one line
    (:func:`printable`: a value's newlines, escape sequences or undecodable bytes are shown escaped)."""

    def __str__(self) -> str:
        return printable(super().__str__())


class ConfigError(ParaplanError):
    """Bad input: names the field, the value, where it came from and what is accepted."""

    def __init__(self, field: str, problem: str, *, accepted: str | None = None,
                 source: str | None = None):
        self.field = field
        self.problem = problem
        self.accepted = accepted
        self.source = source
        where = f" in {source}" if source else ""
        tail = f" (accepted: {accepted})" if accepted else ""
        super().__init__(f"{field}{where}: {problem}{tail}")


class InfeasiblePlan(ParaplanError):
    """A request that cannot fit: says what overflows and by how much."""


#: the optional extras (pyproject.toml's [project.optional-dependencies]) by the module each provides
EXTRAS = {"torch": "torch"}


class MissingExtra(ParaplanError):
    """A command that needs an optional extra (torch) run without it: names the extra, what needs it and
    the command that installs it."""

    def __init__(self, module: str, needed_by: str, *, alternative: str | None = None):
        self.module = module
        self.extra = EXTRAS.get(module, module)
        self.needed_by = needed_by
        other = f"; or {alternative}" if alternative else ""
        super().__init__(f"{needed_by} needs {module}, which is not installed: pip install 'paraplan[{self.extra}]' "
                         f"(from a clone: pip install -e '.[{self.extra}]'){other}")


def missing_extra_of(error: ImportError, needed_by: str) -> MissingExtra | None:
    """The MissingExtra an ImportError stands for (a module of an extra, or one of its submodules, not
    importable), or None when it is about something else (a bug to show as one)."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    return MissingExtra(name, needed_by) if name in EXTRAS else None


def require_extra(module: str, needed_by: str, *, alternative: str | None = None):
    """Import ``module`` (an optional extra's, e.g. ``torch``) and return it; MissingExtra naming
    ``needed_by`` (a command, a flag) and the install command when it cannot be imported. A broken
    install (torch present but failing to load: a missing shared library) says why."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = missing_extra_of(e, needed_by)
        if missing is not None and missing.module == module:
            raise MissingExtra(module, needed_by, alternative=alternative) from None
        raise MissingExtra(module, f"{needed_by} (importing {module} failed: {str(e)[:160]})",
                           alternative=alternative) from None
    except OSError as e:            # torch found but one of its libraries is not (libcudart, libgomp ...)
        raise MissingExtra(module, f"{needed_by} ({module} is installed but does not load: {str(e)[:160]})",
                           alternative=alternative) from None


def unknown_name(field: str, value: str, known: Iterable[str], *, source: str | None = None) -> ConfigError:
    """A ConfigError for an unknown preset name, suggesting close matches."""
    known = sorted(known)
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.5) if len(value) <= 200 else []
    hint = f"unknown name {value!r}" if len(value) <= 80 else f"unknown name {value[:60]!r}... ({len(value)} characters)"
    if close:
        hint += f"; did you mean {', '.join(repr(c) for c in close)}?"
    return ConfigError(field, hint, accepted=", ".join(known), source=source)
