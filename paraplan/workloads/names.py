"""Model names as published tables and users write them ("Llama 3.1 70B", "meta-llama/Llama-3.1-8B",
"GPT-3 175B", "DeepSeekV3 (w/ MTP)") read into model presets (workloads/catalog/models.yaml).

:func:`paraplan.workloads.presets.load_model` falls back to it when a spec is neither a preset nor a
file; the calibration readers (paraplan/calibration/) when a row's model is not in their tables.
"""
from __future__ import annotations

import re
from collections.abc import Iterable


def _canonical(text: str) -> str:
    """Lower case without punctuation; a decimal point stays as 'p' (gpt-1.7b is not gpt-17b)."""
    return re.sub(r"[^a-z0-9]", "", re.sub(r"(?<=\d)\.(?=\d)", "p", text.lower()))


# words that qualify a name without changing the model, and a context length ("Nemotron-H-8B-Base-8K": 8K)
_QUALIFIERS = re.compile(r"\b(?:meta|nvidia|hf|base|instruct|chat|pretrain(?:ing)?|model|dense|\d+k)\b")
_LLAMA = re.compile(r"llama[\s_-]*(?:(\d)(?:\.\d+)?[\s_-]+)?(\d+)\s*b\b")


def _ends_in_number(key: str) -> bool:
    """Whether a canonical preset name ends in a number or a size ('gpt3175b', 'qwen38b'): a digit after
    it would make another number ('llama4scout' may be followed by '17b16e')."""
    return key[-1].isdigit() or (key[-1] == "b" and key[-2:-1].isdigit())


def model_preset_for_name(name: str, presets: Iterable[str] | None = None) -> str | None:
    """The model preset (of ``presets``, default all of models.yaml) a model name denotes, or None.

    Llama names are read as family, version and size ("Llama 3.1 405B" -> llama3-405b: the point
    releases 3.1-3.3 share an architecture per size; "LLaMA-65B" -> llama1-65b). Other names match a
    preset when, lower-cased and stripped of punctuation, parenthesised notes and words such as "base"
    or "instruct", they equal it or begin with it (a preset ending in a number or a size not followed by
    a digit) ("GPT-3 175B" -> gpt3-175b,
    "Mixtral-8x7B" -> mixtral-8x7b, "DeepSeek-V3" -> deepseek-v3; "(w/ MTP)" picks the MTP preset)."""
    raw = str(name).strip().lower()
    mtp = re.search(r"\bw/\s*mtp\b|\bwith mtp\b", raw) is not None
    text = _QUALIFIERS.sub(" ", re.sub(r"\(.*?\)|\[.*?\]", " ", raw).split("/")[-1])
    if presets is None:
        from paraplan.workloads.presets import model_names     # presets imports this module
        presets = model_names()
    presets = list(presets)
    m = _LLAMA.search(text)
    if m:
        preset = f"llama{m.group(1) or '1'}-{m.group(2)}b"
        return preset if preset in presets else None
    key = _canonical(text)
    if not key:
        return None
    canon = {_canonical(p): p for p in presets}
    if mtp and key + "mtp" in canon:
        return canon[key + "mtp"]
    if key in canon:
        return canon[key]
    prefixes = [c for c in canon if key.startswith(c) and not (key[len(c)].isdigit() and _ends_in_number(c))]
    if prefixes:
        return canon[max(prefixes, key=len)]
    return None
