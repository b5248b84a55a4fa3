"""Plan files: a plan with its scenario (and the estimate it had), schema-versioned JSON.

Written atomically (temporary file in the same folder, then ``os.replace``) so a reader never
sees half a file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paraplan.errors import ConfigError
from paraplan.io import FieldReader, read_json, spec_beside, spec_relative_to, write_atomic

PLAN_SCHEMA = "paraplan.plan/1"


def plan_document(estimate, model_spec: str, cluster_spec: str) -> dict[str, Any]:
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": model_spec, "cluster": cluster_spec, "gpus": estimate.num_gpus,
                         "seq_len": estimate.seq_len, "global_batch": estimate.global_batch},
            "plan": estimate.plan.to_dict(), "estimate": estimate.to_dict()}


def write_plan_file(path, estimate, model_spec: str, cluster_spec: str) -> None:
    folder = Path(path).resolve().parent      # files the plan names, relative to the plan file
    doc = plan_document(estimate, spec_relative_to(model_spec, folder), spec_relative_to(cluster_spec, folder))
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


SCENARIO_TEXT_KEYS = ("model", "cluster")
SCENARIO_COUNT_KEYS = ("gpus", "seq_len", "global_batch")


def read_plan_file(path, field: str = "--plan") -> dict[str, Any]:
    """A plan file's document, its ``scenario`` checked (model and cluster as text; gpus, seq_len and
    global_batch positive integers or null) and a model or cluster file it names found beside the plan
    file (:func:`paraplan.io.spec_relative_to`); the plan's own fields are checked by ``Plan.from_dict``.
    ConfigError naming ``field`` for the file, or the key (``scenario.gpus``) for a bad value."""
    p = Path(path)
    data = read_json(p, field)
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise ConfigError("schema", f"not a paraplan plan file (expected schema {PLAN_SCHEMA!r})", source=str(p))
    for key in ("scenario", "plan"):
        if not isinstance(data.get(key), dict):
            raise ConfigError(key, "missing or not a mapping", source=str(p))
    f = FieldReader(data["scenario"], str(p), "scenario.")
    for key in SCENARIO_TEXT_KEYS:
        f.string(key)
    for key in SCENARIO_COUNT_KEYS:
        if f.has(key):
            f.integer(key)
    for key in SCENARIO_TEXT_KEYS:   # a file the plan names, relative to the plan file's folder
        data["scenario"][key] = spec_beside(data["scenario"][key], p.parent)
    return data
