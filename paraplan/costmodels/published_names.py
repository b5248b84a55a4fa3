"""How the names in a published-run table map to paraplan's presets.

Papers, READMEs and performance pages name the same GPU and the same model many ways ("A100-SXM4-80GB",
"A100 80GB", "DGX-A100"; "Llama 3.1 70B", "LLAMA3-70B", "meta-llama/Llama-3.1-70B"). The calibration
loaders (calibration.py) first look a name up in their own exact tables, then ask this module, which
reads the name's parts: for a GPU its part number, memory size, form factor and system; for a model
its family, version and size. A name that maps to no preset gives the reason instead, so that a row
is skipped with a sentence that says what is missing, never guessed into a preset of another part.

Pure functions of strings; no file is read except the model preset table (workloads/catalog/models.yaml).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from paraplan.workloads.presets import model_names


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


def system_for_gpu(name: str) -> Resolved | str:
    """The system preset (hardware/catalog/systems) a published GPU name runs on, or why there is none.

    Read in this order: the AMD MI300X; NVIDIA Grace-Blackwell (GB300, GB200: NVL72 racks) before
    Blackwell B200 (DGX/HGX 8-GPU); H800, H200, then H100 (an HBM2e / 96 GB / Grand Teton part is the
    500 W Grand Teton H100; PCIe and NVL cards have lower clocks and no preset); A100 by memory (40 or
    80 GB; PCIe has no preset); V100 by memory (16 GB: DGX-1, 32 GB: DGX-2). An A100 or V100 without a
    memory size takes the larger part and says so."""
    t = _gpu_text(name)
    mem = _memory_gb(t)
    pcie = "pcie" in t or re.search(r"\bnvl\b", t) is not None and "nvl72" not in t
    if "mi300x" in t:
        return Resolved("mi300x-x8")
    if "mi250" in t or "mi325" in t or "mi355" in t:
        return f"GPU {name!r}: no preset for this AMD part (MI300X only)"
    if "gb300" in t:
        return Resolved("gb300-nvl72")
    if "gb200" in t:
        return Resolved("gb200-nvl72")
    if re.search(r"\bb300\b|\bhgx.?b300\b|dgx.?b300", t):
        return f"GPU {name!r}: no B300 preset (GB300 NVL72 and B200 are catalogued)"
    if "b200" in t:
        return Resolved("dgx-b200")
    if "gh200" in t:
        return f"GPU {name!r}: no GH200 system preset (only the accelerator is catalogued)"
    if "h800" in t:
        return Resolved("hgx-h800")
    if "h200" in t:
        return Resolved("dgx-h200")
    if "h100" in t or "dgx-h100" in t:
        if "hbm2e" in t or mem == 96 or "grand teton" in t:
            return Resolved("grand-teton-h100")
        if pcie:
            return f"GPU {name!r}: no preset for the PCIe / NVL H100 (lower clocks and power than the SXM part)"
        return Resolved("dgx-h100")
    if "a100" in t:
        if pcie:
            return f"GPU {name!r}: no preset for the PCIe A100 (lower power than the SXM part)"
        if mem == 40:
            return Resolved("dgx-a100-40g")
        if mem == 80:
            return Resolved("dgx-a100-80g")
        return Resolved("dgx-a100-80g", f"GPU {name!r}: memory not stated, the 80 GB A100 (SXM, DGX A100) taken")
    if "v100" in t:
        if mem == 16:
            return Resolved("dgx1-v100")
        if mem == 32 or "dgx-2" in t or "dgx2" in t:
            return Resolved("dgx2-v100")
        return Resolved("dgx2-v100", f"GPU {name!r}: memory not stated, the 32 GB V100 (DGX-2) taken")
    return f"GPU {name!r} has no system preset (A100, V100, H100, H200, H800, B200, GB200, GB300, MI300X are)"


def _canonical(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


_QUALIFIERS = re.compile(r"\b(?:meta|hf|base|instruct|chat|pretrain(?:ing)?|model|dense)\b")
_LLAMA = re.compile(r"llama[\s_-]*(?:(\d)(?:\.\d+)?[\s_-]+)?(\d+)\s*b\b")


def model_preset_for_name(name: str) -> Resolved | None:
    """The model preset (workloads/catalog/models.yaml) a published model name denotes, or None.

    Llama names are read as family, version and size ("Llama 3.1 405B" -> llama3-405b: the point
    releases 3.1-3.3 share an architecture per size; "LLaMA-65B" -> llama1-65b). Other names match a
    preset when, lower-cased and stripped of punctuation, parenthesised notes and words such as "base"
    or "instruct", they equal it or begin with it followed by a non-digit ("GPT-3 175B" -> gpt3-175b,
    "Mixtral-8x7B" -> mixtral-8x7b, "DeepSeek-V3" -> deepseek-v3; "(w/ MTP)" picks the MTP preset)."""
    raw = str(name).strip().lower()
    mtp = re.search(r"\bw/\s*mtp\b|\bwith mtp\b", raw) is not None
    text = _QUALIFIERS.sub(" ", re.sub(r"\(.*?\)|\[.*?\]", " ", raw).split("/")[-1])
    presets = model_names()
    m = _LLAMA.search(text)
    if m:
        preset = f"llama{m.group(1) or '1'}-{m.group(2)}b"
        return Resolved(preset) if preset in presets else None
    key = _canonical(text)
    if not key:
        return None
    canon = {_canonical(p): p for p in presets}
    if mtp and key + "mtp" in canon:
        return Resolved(canon[key + "mtp"])
    if key in canon:
        return Resolved(canon[key])
    prefixes = [c for c in canon if key.startswith(c) and not key[len(c)].isdigit()]
    if prefixes:
        return Resolved(canon[max(prefixes, key=len)])
    return None
