"""Plan files: a plan with its scenario (and the estimate it had), schema-versioned JSON.

Written atomically (temporary file in the same folder, then ``os.replace``) so a reader never
sees half a file.
"""
from __future__ import annotations

import json
import os
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


def spec_for_plan_file(spec: str, plan_path) -> str:
    """A model or cluster spec as a plan file keeps it: a preset name as given; a file (model YAML, HF
    config, cluster YAML) by its path relative to the plan file's folder, so the plan file can be read
    from any working directory and moved together with it."""
    if not Path(spec).is_file():
        return spec
    return os.path.relpath(Path(spec).resolve(), Path(plan_path).resolve().parent)


def write_plan_file(path, estimate, model_spec: str, cluster_spec: str) -> None:
    doc = plan_document(estimate, spec_for_plan_file(model_spec, path), spec_for_plan_file(cluster_spec, path))
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


SCENARIO_TEXT_KEYS = ("model", "cluster")
SCENARIO_COUNT_KEYS = ("gpus", "seq_len", "global_batch")


def read_plan_file(path, field: str = "--plan") -> dict[str, Any]:
    """A plan file's document, its ``scenario`` checked (model and cluster as text; gpus, seq_len and
    global_batch positive integers or null) and a model or cluster file it names found beside the plan
    file (:func:`spec_for_plan_file`); the plan's own fields are checked by ``Plan.from_dict``.
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
        spec = data["scenario"][key]
        beside = p.parent / spec
        if not Path(spec).is_absolute() and beside.is_file():
            data["scenario"][key] = str(beside)
    return data
