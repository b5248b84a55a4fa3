"""Plan files: a plan with its scenario (and the estimate it had), schema-versioned JSON.

Written atomically (temporary file in the same folder, then ``os.replace``) so a reader never
sees half a file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paraplan.errors import ConfigError
from paraplan.io import FieldReader, read_json, write_atomic

PLAN_SCHEMA = "paraplan.plan/1"


def plan_document(estimate, model_spec: str, cluster_spec: str) -> dict[str, Any]:
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": model_spec, "cluster": cluster_spec, "gpus": estimate.num_gpus,
                         "seq_len": estimate.seq_len, "global_batch": estimate.global_batch},
            "plan": estimate.plan.to_dict(), "estimate": estimate.to_dict()}


def write_plan_file(path, estimate, model_spec: str, cluster_spec: str) -> None:
    write_atomic(path, json.dumps(plan_document(estimate, model_spec, cluster_spec), indent=2) + "\n")


SCENARIO_TEXT_KEYS = ("model", "cluster")
SCENARIO_COUNT_KEYS = ("gpus", "seq_len", "global_batch")


def read_plan_file(path, field: str = "--plan") -> dict[str, Any]:
    """A plan file's document, its ``scenario`` checked (model and cluster as text; gpus, seq_len and
    global_batch positive integers or null); the plan's own fields are checked by ``Plan.from_dict``.
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
    return data
