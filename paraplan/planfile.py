"""Plan files: a plan with its scenario (and the estimate it had), schema-versioned JSON.

Written atomically (temporary file in the same folder, then ``os.replace``) so a reader never
sees half a file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paraplan.errors import ConfigError
from paraplan.io import read_json, write_atomic

PLAN_SCHEMA = "paraplan.plan/1"


def plan_document(estimate, model_spec: str, cluster_spec: str) -> dict[str, Any]:
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": model_spec, "cluster": cluster_spec, "gpus": estimate.num_gpus,
                         "seq_len": estimate.seq_len, "global_batch": estimate.global_batch},
            "plan": estimate.plan.to_dict(), "estimate": estimate.to_dict()}


def write_plan_file(path, estimate, model_spec: str, cluster_spec: str) -> None:
    write_atomic(path, json.dumps(plan_document(estimate, model_spec, cluster_spec), indent=2) + "\n")


def read_plan_file(path) -> dict[str, Any]:
    p = Path(path)
    data = read_json(p, "--plan")
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise ConfigError("schema", f"not a paraplan plan file (expected schema {PLAN_SCHEMA!r})", source=str(p))
    for key in ("scenario", "plan"):
        if not isinstance(data.get(key), dict):
            raise ConfigError(key, "missing or not a mapping", source=str(p))
    return data
