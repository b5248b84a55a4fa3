"""Fitted and measured constants, read from paraplan/data/fitted_constants.yaml.

Each entry of the file has a ``value``, its ``unit``, the ``source`` it was fitted to or read from and
``how`` (tests/test_fitted_constants.py holds every entry to that and every module constant that reads
one to the file). Modules name a constant once, at module level: ``ALLOCATOR_FRAGMENTATION =
fitted("allocator_fragmentation")``. At the bottom of the layering (it imports only ``errors``), so any
layer may read it.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from paraplan.errors import ConfigError

FITTED_CONSTANTS_FILE = Path(__file__).parent / "data" / "fitted_constants.yaml"
#: the keys every entry has (``used_by`` names the module constants that read it)
ENTRY_KEYS = ("value", "unit", "source", "how")
#: units whose value the loader converts, and the factor into SI (bytes)
UNIT_FACTORS = {"GiB": 2**30}
#: PyYAML's loader for the package's own data files: libyaml's parser where PyYAML was built with it
#: (``yaml.CSafeLoader``: the C scanner and parser under the same ``SafeConstructor``, so the same Python
#: objects; tests/test_fitted_constants.py compares every shipped file), else the pure-Python one. models.yaml,
#: curves.yaml and this file took 0.2-0.3 s of every command's start-up with the pure-Python parser.
DATA_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_data_yaml(stream):
    """A YAML document of the package's own data (text or an open file) with :data:`DATA_YAML_LOADER`.
    Files a user hands in go through ``paraplan.io.read_yaml`` (the pure-Python parser, whose error marks
    its messages quote)."""
    return yaml.load(stream, Loader=DATA_YAML_LOADER)


@lru_cache(maxsize=1)
def fitted_entries() -> dict[str, dict]:
    """Every entry of the file, by name (the file as written; values in their own unit)."""
    with open(FITTED_CONSTANTS_FILE, encoding="utf-8") as f:
        return load_data_yaml(f)


def fitted(name: str):
    """The constant ``name`` in SI units (a value in GiB as bytes: ``value * 2**30``). Raises
    ConfigError naming the known constants for an unknown name."""
    entries = fitted_entries()
    if name not in entries:
        raise ConfigError("fitted constant", f"{name!r} is not in {FITTED_CONSTANTS_FILE.name}; known: "
                          + ", ".join(sorted(entries)))
    entry = entries[name]
    unit = str(entry["unit"]).split()[0]
    return entry["value"] * UNIT_FACTORS[unit] if unit in UNIT_FACTORS else entry["value"]
