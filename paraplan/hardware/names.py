"""GPU names as published tables write them ("A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "DGX-GB300") read
into system presets (hardware/catalog/systems), or the reason there is none.

The cluster loader falls back to it when a spec is neither a preset nor a file, and the calibration
readers (paraplan/calibration/) when a row's GPU is not in their own tables. A name is read by its
parts (part number, memory size, form factor, system), never rounded to a preset of another part.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
@dataclass(frozen=True)
class Resolved:
    """A preset a name maps to, and the assumption made on the way (None when the name says it all)."""
    preset: str
    assumption: str | None = None


def _gpu_text(name: str) -> str:
    return " " + re.sub(r"[_/,()\[\]]", " ", str(name).lower()) + " "


def _memory_gb(text: str) -> int | None:
    """The memory size a GPU name states ("80GB", "80 GB", "-80g", "SXM4-40GB"), or None."""
    m = re.search(r"(\d{2,3})\s*g(?:b|ib)?\b", text)
    return int(m.group(1)) if m else None


def _names(text: str, *parts: str) -> bool:
    """Whether the text names one of the part numbers as a word of its own ("dgx-h100", "h100-sxm5"; not
    "dgx-h1000", and "gb200" is not "b200")."""
    return any(re.search(rf"(?<![0-9a-z]){p}(?![0-9])", text) for p in parts)


#: part numbers read before the H100, in this order (a name that states two parts takes the first here), and
#: the system preset each runs on, or the reason there is none (a string)
PARTS_BEFORE_H100 = (
    (("mi300x",), Resolved("mi300x-x8")),
    (("mi325x",), Resolved("mi325x-x8")),
    (("mi350x",), Resolved("mi350x-x8")),
    (("mi355x",), Resolved("mi355x-x8")),
    (("mi250x?", "mi325", "mi355"), "no preset for this AMD part (MI300X, MI325X, MI350X, MI355X are)"),
    (("gb300",), Resolved("gb300-nvl72")),
    (("gb200",), Resolved("gb200-nvl72")),
    (("b300",), Resolved("dgx-b300")),
    (("b200",), Resolved("dgx-b200")),
    (("gh200",), "no GH200 system preset (only the accelerator is catalogued)"),
    (("h800",), Resolved("hgx-h800")),
    (("h200",), Resolved("dgx-h200")),
)


def system_for_gpu(name: str) -> Resolved | str:
    """The system preset (hardware/catalog/systems) a published GPU name runs on, or why there is none.

    Read in this order: the AMD MI300X, MI325X, MI350X, MI355X (8-GPU platforms); NVIDIA Grace-Blackwell (GB300, GB200: NVL72 racks) before
    Blackwell Ultra B300 and Blackwell B200 (DGX/HGX 8-GPU); H800, H200, then H100 (an HBM2e / 96 GB / Grand Teton part is the
    500 W Grand Teton H100; PCIe and NVL cards have lower clocks and no preset); A100 by memory (40 or
    80 GB; PCIe has no preset); V100 by memory (16 GB: DGX-1, 32 GB: DGX-2). An A100 or V100 without a
    memory size takes the larger part and says so."""
    t = _gpu_text(name)
    mem = _memory_gb(t)
    pcie = "pcie" in t or re.search(r"\bnvl\b", t) is not None and "nvl72" not in t
    for parts, found in PARTS_BEFORE_H100:
        if _names(t, *parts):
            return found if isinstance(found, Resolved) else f"GPU {name!r}: {found}"
    if _names(t, "h100"):
        if "hbm2e" in t or mem == 96 or "grand teton" in t:
            return Resolved("grand-teton-h100")
        if pcie:
            return f"GPU {name!r}: no preset for the PCIe / NVL H100 (lower clocks and power than the SXM part)"
        return Resolved("dgx-h100")
    if _names(t, "a100"):
        if pcie:
            return f"GPU {name!r}: no preset for the PCIe A100 (lower power than the SXM part)"
        if mem == 40:
            return Resolved("dgx-a100-40g")
        if mem == 80:
            return Resolved("dgx-a100-80g")
        return Resolved("dgx-a100-80g", f"GPU {name!r}: memory not stated, the 80 GB A100 (SXM, DGX A100) taken")
    if _names(t, "v100"):
        if mem == 16:
            return Resolved("dgx1-v100")
        if mem == 32 or "dgx-2" in t or "dgx2" in t:
            return Resolved("dgx2-v100")
        return Resolved("dgx2-v100", f"GPU {name!r}: memory not stated, the 32 GB V100 (DGX-2) taken")
    return f"GPU {name!r} has no system preset (A100, V100, H100, H200, H800, B200, GB200, GB300, B300, MI300X, MI325X, MI350X, MI355X are)"
