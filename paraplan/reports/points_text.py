"""The what-if points as the terminal shows them: the best plan of each point with every plan choice
that differs between the points in a column of its own, and the choices they share on one line.

Before issue 67 the table showed only the degrees (``tp2 pp1 dp32 mb2 sp``), so two points whose best
plans differed in ZeRO stage, offload, schedule or recomputation looked alike.
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from paraplan.plan import PLAN_FIELD_SPECS, PLAN_FIELDS
from paraplan.reports.text import significant

#: the plan fields the label (``Plan.label()``) already shows
IN_LABEL = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "sp")
#: the choices the shared line always names (the ones a reader asks about first), in this order
SHARED_SHOWN = ("engine", "schedule", "zero", "recompute", "offload", "dtype", "optimizer")


def _value(v) -> str:
    if isinstance(v, bool):
        return "y" if v else "n"
    if isinstance(v, str) and not v:
        return "-"
    return str(v)


#: choices that mean nothing for some plans (shown '-' there): the field and the plan values it needs
RELEVANT_WHEN = {"cp_mode": lambda p: p["cp"] > 1, "schedule": lambda p: p["pp"] > 1, "etp": lambda p: p["ep"] > 1}


def shown_plan(plan: dict) -> dict:
    """A plan's fields as the table shows them: '-' for a choice that has no meaning in it (cp_mode without
    cp, schedule without pp, etp without ep), booleans as y/n."""
    return {k: _value(v) if RELEVANT_WHEN.get(k, lambda p: True)(plan) else "-" for k, v in plan.items()}


def differing_choices(plans: Sequence[dict]) -> list[str]:
    """The plan fields (outside the label's degrees) whose shown value (:func:`shown_plan`) is not the
    same in every plan, in Plan's field order."""
    return [k for k in PLAN_FIELDS if k not in IN_LABEL and len({p.get(k) for p in plans}) > 1]


def shared_choices(plans: Sequence[dict], differing: Sequence[str]) -> list[str]:
    """'zero 1', 'recompute selective', ...: SHARED_SHOWN's fields every plan agrees on, then any other
    field all plans hold away from its default."""
    if not plans:
        return []
    first = plans[0]
    named = [k for k in SHARED_SHOWN if k not in differing and first.get(k) not in (None, "-")]
    others = [k for k in PLAN_FIELDS if k not in IN_LABEL and k not in differing and k not in SHARED_SHOWN
              and first.get(k) not in (None, "-", _value(PLAN_FIELD_SPECS[k].default))]
    return [f"{k} {first[k]}" for k in (*named, *others)]


_fmt = significant      # three significant digits (the estimator's ~1.5 % resolution)


def render_points(results, table: pd.DataFrame) -> str:
    """The points table of ``paraplan whatif`` and the line of the choices every point shares.

    ``results``: the :class:`paraplan.reports.sweep.PointResult` list (their best plans); ``table``: the
    points table of the same results (:func:`paraplan.reports.data.points_table`). Step times and
    throughput carry three significant digits (the estimator resolves about 1.5 %)."""
    plans = [shown_plan(r.estimate.plan.to_dict()) if r.estimate is not None else None for r in results]
    have = [p for p in plans if p is not None]
    differing = differing_choices(have)
    rows = []
    for (_, t), plan in zip(table.iterrows(), plans):
        row = {"label": t["label"], "gpus": t["gpus"], "plan": t["plan"] or "-"}
        for k in differing:
            row[k] = plan[k] if plan is not None else "-"
        row.update({"step_s": _fmt(t["step_time_s"], 3), "tokens/s": _fmt(t["tokens_per_s"], 3),
                    "mfu_%": "-" if math.isnan(t["mfu"]) else f"{100 * t['mfu']:.1f}",
                    "mem_GiB": "-" if math.isnan(t["mem_total_gib"]) else f"{t['mem_total_gib']:.1f}",
                    "fits": "yes" if t["feasible"] else "no"})
        rows.append(row)
    lines = [pd.DataFrame(rows).to_string(index=False)]
    shared = shared_choices(have, differing)
    if shared:
        lines.append(f"{'every point' if len(have) == len(plans) else 'every point that fits'}: " + ", ".join(shared))
    return "\n".join(lines)
