"""An export read back into a Plan (``paraplan.planner.readers``) and estimated: the same estimate as the
plan written, or the difference and what the config could not say."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.plan import check_plan
from paraplan.planner.export import export
from paraplan.planner.export_common import load_scenario
from paraplan.planner.readers import read_export

GIB = 2**30


@dataclass(frozen=True)
class ReadBack:
    """``same``: the read plan's estimate equals the exported plan's (step time and memory to 1e-9
    relative); ``line``: what differs (fields, both estimates) and what the config could not express."""
    engine: str
    same: bool
    line: str


def read_back(doc: Mapping[str, Any], engine: str, torchtitan_format: str = "python") -> ReadBack:
    """Export ``doc`` for ``engine``, read the text back and compare the estimates."""
    s = load_scenario(doc)
    out = export(doc, engine, torchtitan_format=torchtitan_format)
    read = read_export(engine, out.text)
    written = out.plan
    if read.plan is None:
        return ReadBack(engine, False, f"no plan read: {'; '.join(read.unexpressed)}")
    plan = read.plan if read.plan.dp else replace(read.plan, dp=written.dp)
    # a config carries no name for what the engine decides itself: keep the written plan's choice for the
    # fields a reader leaves at the Plan default when the config is silent on them
    try:
        plan = check_plan(plan, s.model, s.job, s.cluster)
    except ConfigError as err:
        return ReadBack(engine, False, f"read plan breaks a rule: {err.problem}")
    a, b = estimate(s.model, s.job, s.cluster, written), estimate(s.model, s.job, s.cluster, plan)
    same = (abs(a.step_time_s - b.step_time_s) <= 1e-9 * a.step_time_s
            and abs(a.memory_bytes_per_gpu["total"] - b.memory_bytes_per_gpu["total"]) <= 1e-9 * a.memory_bytes_per_gpu["total"])
    diff = [f"{f.name} {getattr(written, f.name)!r} -> {getattr(plan, f.name)!r}" for f in fields(written)
            if getattr(written, f.name) != getattr(plan, f.name)]
    line = (f"exported {a.step_time_s:.3f} s/step, {a.memory_bytes_per_gpu['total'] / GIB:.1f} GiB; read back "
            f"{b.step_time_s:.3f} s/step, {b.memory_bytes_per_gpu['total'] / GIB:.1f} GiB"
            + (f"; fields {', '.join(diff)}" if diff else "")
            + (f"; not expressed: {'; '.join(read.unexpressed)}" if read.unexpressed else ""))
    return ReadBack(engine, same, line)
