"""Pipeline schedules: bubble and step time.

With per-micro-batch stage time t (forward + backward, communication and recomputation included)
and m micro-batches over p stages, a flush-based schedule takes (m + p − 1)·t when stages are
equal; the idle part, the bubble, is (p − 1)·t, i.e. a fraction (p − 1)/m of the ideal
(GPipe and 1F1B, Narayanan et al. 2021 §2.2.1). Interleaving v model chunks per GPU divides it by
v ((p − 1)/(v·m), §2.2.2). ZB-H1 (Qi et al. 2024, arXiv:2401.10241) defers weight gradients to
fill the drain and reaches (p − 1)/(3m) under its T_F = T_B = T_W assumption.
Unequal stages (the LM head on the last): the slowest stage sets the steady-state pace,
T = (m − 1)·t_max + Σ t_i, so extra work on the last stage is paid m times.
"""
from __future__ import annotations

import numpy as np

from paraplan.plan import Schedule


def bubble_factor(plan):
    """Multiplier on the (p − 1)·t bubble: 1 (GPipe, 1F1B), 1/v (interleaved), 1/3 (ZB-H1)."""
    sc = np.asarray(plan.schedule_code)
    v = np.asarray(plan.vpp, dtype=float)
    return np.where(sc == Schedule.INTERLEAVED, 1 / v, np.where(sc == Schedule.ZB_H1, 1 / 3, 1.0))


def bubble_fraction(plan, m):
    """Bubble ÷ ideal compute time: (p − 1)/m · factor."""
    return (np.asarray(plan.pp, dtype=float) - 1) / np.asarray(m, dtype=float) * bubble_factor(plan)


def p2p_messages_on_critical_path(plan, m):
    """Pipeline sends on the critical path per step: each micro-batch crosses every model-chunk
    boundary forward and backward; (p − 1) more in fill and drain. Zero without pipelining."""
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    return np.where(p > 1, 2 * (m * v + p - 1), 0.0)
