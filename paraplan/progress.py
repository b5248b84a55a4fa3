"""Feedback on long work: tqdm progress bars on stderr and a one-line summary when a step ends.

Every step that can take more than about two seconds goes through here, so the look is the same
everywhere and one switch turns it off. Bars are drawn only on a terminal (tqdm's ``disable=None``)
or when ``PARAPLAN_PROGRESS=1``; ``PARAPLAN_PROGRESS=0`` silences bars and summaries alike (tests,
scripts that parse stderr). Summaries ("profile: 160 measurements in 81.2 s") go to stderr so that
stdout stays the result.

tqdm is used rather than hand-written carriage-return printing: it handles terminal width, rate and
ETA estimation, nested bars and non-terminal output, and is a small pure-Python dependency.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")

#: Steps at least this long get a summary line even off a terminal.
LONG_S = 2.0


def _mode() -> str:
    """'off' (PARAPLAN_PROGRESS=0), 'on' (=1: bars even off a terminal) or 'auto' (bars on a terminal)."""
    v = os.environ.get("PARAPLAN_PROGRESS", "").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("1", "on", "true", "yes"):
        return "on"
    return "auto"


def bar(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None,
        unit: str = "it") -> "tqdm[T]":
    """A tqdm bar on stderr for ``iterable`` (or a manual one with ``total``; call ``.update(n)``)."""
    mode = _mode()
    disable = True if mode == "off" else (False if mode == "on" else None)
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, disable=disable,
                leave=False, dynamic_ncols=True)


def summary(message: str) -> None:
    """One line on stderr at the end of a long step (nothing when progress is off)."""
    if _mode() != "off":
        print(message, file=sys.stderr, flush=True)


@contextmanager
def step(desc: str) -> Iterator[None]:
    """A step with no natural count (a solver call): says it started on a terminal, then how long it took."""
    mode = _mode()
    shown = mode == "on" or (mode == "auto" and sys.stderr.isatty())
    if shown:
        print(f"{desc} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    yield
    elapsed = time.perf_counter() - t0
    if shown or elapsed >= LONG_S:
        summary(f"{desc}: done in {elapsed:.1f} s")
