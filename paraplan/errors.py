"""One exception family for everything a user can get wrong.

``ParaplanError`` is the root; the CLI prints any of them as one line and exits 2.
"""
from __future__ import annotations

import difflib
from typing import Iterable


def shown(value, limit: int = 40) -> str:
    """A value as an error message quotes it: its repr cut to about ``limit`` characters (a
    5000-digit number or a 300-byte name must not fill the screen)."""
    try:
        r = repr(value)
    except ValueError:                       # an int past Python's int -> str digit limit
        return "a number with thousands of digits"
    return r if len(r) <= limit else f"{r[:limit - 4]}... ({len(r)} characters)"


class ParaplanError(Exception):
    """Base class: a problem the user can fix, printed without a traceback."""


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


def unknown_name(field: str, value: str, known: Iterable[str], *, source: str | None = None) -> ConfigError:
    """A ConfigError for an unknown preset name, suggesting close matches."""
    known = sorted(known)
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.5) if len(value) <= 200 else []
    hint = f"unknown name {value!r}" if len(value) <= 80 else f"unknown name {value[:60]!r}... ({len(value)} characters)"
    if close:
        hint += f"; did you mean {', '.join(repr(c) for c in close)}?"
    return ConfigError(field, hint, accepted=", ".join(known), source=source)
