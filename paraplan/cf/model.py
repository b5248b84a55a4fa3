"""Collaborative-filtering workload: a SimpleX model trained with the cosine contrastive loss (CCL).

One *iteration* is one (user, positive item) training pair with ``negatives`` sampled negative
items, as in HEAT (ICS'23) §4; one *step* processes ``batch`` iterations; an epoch is one pass
over the training interactions.

Model (SimpleX, Mao et al. CIKM'21; HEAT, ICS'23, arXiv:2304.07334, Eq. 2-3; reczoo/RecZoo
matching/cf/SimpleX/src/SimpleX.py)::

    p_u  = g·e_u + (1 − g)·W·mean(e_h for h in history_u)        (g = 1: plain MF)
    L    = max(0, 1 − cos(p_u, e_i)) + (w/|N|)·Σ_{j∈N} max(0, cos(p_u, e_j) − m)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.errors import ConfigError

OPTIMIZERS = ("sgd", "adam")
FP32_BYTES = 4
DEFAULT_BATCH = 512   # iterations per step B when none is given (HEAT's OpenMP chunk: schedule(dynamic, 512))


def default_batch(threads: int, base: int = DEFAULT_BATCH) -> int:
    """The multiple of ``threads`` nearest to ``base`` (ties up, at least one per thread): every
    thread takes an equal share b = B/T of a step. 512 at 64 threads stays 512; 40 threads give 520,
    48 give 528, 96 give 480."""
    _positive_int("threads", threads)
    return max(threads, threads * int(base / threads + 0.5))


def _positive_int(field: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(field, f"must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class CFModel:
    """A SimpleX/CCL training job on a CPU, validated on construction.

    ``interactions`` counts the *training* interactions, i.e. the iterations of one epoch.
    ``negative_weight`` is w and ``margin`` is m of the CCL loss; ``history`` is the number of
    history items averaged by the behaviour aggregator and ``gate`` its g (history 0 needs g = 1).
    """
    users: int
    items: int
    interactions: int
    dim: int = 64
    negatives: int = 256
    margin: float = 0.4
    negative_weight: float = 150.0
    history: int = 0
    gate: float = 1.0
    optimizer: str = "sgd"
    learning_rate: float = 0.05
    batch: int = 512
    threads: int = 1

    def __post_init__(self):
        for name in ("users", "items", "interactions", "dim", "negatives", "batch", "threads"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 0:
            raise ConfigError("history", f"must be a non-negative integer, got {self.history!r}")
        for name in ("margin", "negative_weight", "gate", "learning_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(name, f"must be a finite number, got {v!r}")
        if not -1.0 <= self.margin <= 1.0:
            raise ConfigError("margin", f"is compared with a cosine, so must lie in [-1, 1], got {self.margin}")
        if self.negative_weight < 0:
            raise ConfigError("negative_weight", f"must not be negative, got {self.negative_weight}")
        if not 0.0 <= self.gate <= 1.0:
            raise ConfigError("gate", f"must lie in [0, 1], got {self.gate}")
        if self.history == 0 and self.gate != 1.0:
            raise ConfigError("gate", f"is {self.gate} but history is 0; without history the gate must be 1",
                              accepted="history >= 1, or gate = 1")
        if self.learning_rate <= 0:
            raise ConfigError("learning_rate", f"must be positive, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError("optimizer", f"unknown optimizer {self.optimizer!r}", accepted=", ".join(OPTIMIZERS))
        if self.batch % self.threads:
            raise ConfigError("batch", f"{self.batch} is not a multiple of threads ({self.threads}); each "
                              "thread takes an equal share of a batch", accepted="a multiple of threads")

    @property
    def row_bytes(self) -> int:
        """Bytes of one fp32 embedding row: 4·d."""
        return FP32_BYTES * self.dim

    @property
    def iterations_per_epoch(self) -> int:
        return self.interactions

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.interactions / self.batch)

    @property
    def per_thread_batch(self) -> int:
        """Iterations each thread handles per step (b = B/T)."""
        return self.batch // self.threads

    @property
    def uses_aggregation(self) -> bool:
        return self.history > 0 and self.gate < 1.0
