"""The efficiency-curve parameters of ``curves.yaml`` (per accelerator, over a default), read once.
Both the analytical curves and the measured ones (for what a profile does not measure) start here."""
from __future__ import annotations

import functools
from pathlib import Path

from paraplan.constants import load_data_yaml

CURVES_FILE = Path(__file__).parent / "curves.yaml"


@functools.lru_cache(maxsize=1)
def curve_table() -> dict:
    """``curves.yaml`` as a mapping: ``default`` and one entry per accelerator name."""
    return load_data_yaml(CURVES_FILE.read_text())


ATTENTION_FILE = Path(__file__).parent / "attention_kernels.yaml"


@functools.lru_cache(maxsize=1)
def attention_kernel_tables() -> dict:
    """``attention_kernels.yaml``: measured fused-attention efficiency per generation and kernel."""
    return load_data_yaml(ATTENTION_FILE.read_text())


def attention_table_for(accelerator_name: str) -> dict | None:
    """The measured attention table of the generation an accelerator belongs to, or None."""
    for entry in attention_kernel_tables().values():
        if accelerator_name in entry.get("accelerators", ()):
            return entry
    return None
