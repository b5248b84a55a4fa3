"""The recipe sidecar of a published-run file: the facts a row's columns leave out, each with its source.

A sidecar (``data/<file>.recipes.yaml``) sits beside its CSV and holds, as data:
  * ``sources``: how a source column is named in tables, and what its runs used that the columns do not
    say (an engine, a cluster, no gradient-reduce overlap, held out);
  * ``engines``: the engine a source's runs trained with, and ``engine_defaults``: how a row read on that
    engine fills its blank cells (ZeRO stage, sequence-parallel TP, recipe defaults);
  * ``gpus`` and ``models``: the system preset a GPU column names, the model preset a model column names;
  * ``facts``: recipe facts of single runs (expert all-to-all overlap, DeepEP dispatch, recomputed
    modules, pipeline stage layers, offloaded activations, an unfused rotary embedding, the attention
    kernel, the precision-aware optimizer's moments), each matched to rows by explicit column values
    (:meth:`Recipes.fact`).
The format is described in docs/reference/README.md; the loader refuses unknown keys and facts without
a source (ConfigError naming the file and the entry).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from paraplan.calibration.cells import blank, int_cell
from paraplan.errors import ConfigError
from paraplan.io import read_yaml

DATA = Path(__file__).parent / "data"

#: the kinds of recipe fact a sidecar may state, and the type of each one's value
FACT_KINDS = {"ep_comm_overlap": bool, "moe_flex_dispatch": bool, "overlap_grad_reduce": bool,
              "recompute_modules": str, "pipeline_layout": str, "activation_offload_layers": int,
              "rope_fusion": bool, "attention_kernel": str, "moe_capacity_factor": float, "dropout": bool,
              "expandable_segments": bool, "micro_batch": int, "ep": int, "optimizer_state_dtype": str,
              "precision_aware_optimizer": bool}
#: the columns a fact may match as integers (a blank vpp counts as 1)
NUMERIC_MATCH = ("num_gpus", "tp", "pp", "dp", "vpp", "ep", "micro_batch", "global_batch", "seq_len")
#: the other keys a fact may match on (see :meth:`RecipeFact.matches`)
TEXT_MATCH = ("model", "gpu", "precision", "source_contains", "model_contains", "engine", "preset")


@dataclass(frozen=True)
class SourceEntry:
    """What a source's runs used that their columns do not say."""
    name: str | None = None                   # the short name in tables (None: the source as written)
    words: tuple[str, ...] = ()               # all of these occur in the lower-cased source
    starts_with: str | None = None            # or the source as written begins with this
    cite: str = ""
    engine: str | None = None                 # the engine its runs trained with (else the engines table's)
    engine_note: str = ""
    engine_source: str = ""
    systems: Mapping[str, str] = field(default_factory=dict)   # system preset -> the cluster it really ran on
    system_note: str = ""
    system_source: str = ""
    megatron_gpt: bool = False                # its GPT models are Megatron-LM's (learned positions, biases)
    overlap_grad_reduce: bool | None = None   # False: gradients reduced after the backward
    overlap_note: str = ""
    held_out: str | None = None               # the reason its rows are scored elsewhere
    fp8_param_gather_dtypes: tuple[str, ...] = ()
    fp8_param_gather_source: str = ""
    te_cross_entropy: bool = False            # its recipes run Transformer Engine's fused cross-entropy
    te_cross_entropy_source: str = ""
    #: the dtypes whose runs used Megatron-Core's precision-aware optimizer (fp32 moments unless an
    #: optimizer_state_dtype fact names others); with a source, its other runs are stated to run without
    precision_aware_optimizer_dtypes: tuple[str, ...] = ()
    precision_aware_optimizer_source: str = ""
    #: its dropless MoE runs route with a router forced to balance (Megatron-Core's
    #: moe_router_force_load_balancing: random logits), so they carry no routing imbalance
    forced_balanced_routing: bool = False
    forced_balanced_routing_source: str = ""

    def matches(self, source: str) -> bool:
        if self.starts_with is not None:
            return source.startswith(self.starts_with)
        s = source.lower()
        return all(w in s for w in self.words)


@dataclass(frozen=True)
class EngineDefaults:
    """How a row read on one engine fills what its columns leave blank."""
    zero: int
    zero_note: str
    source: str
    megatron_fsdp: bool = False               # ZeRO-2/3 are Megatron-LM's own sharded data parallelism
    performance_recipe: bool = False          # NeMo / Megatron-Bridge performance recipes' defaults
    tp_is_sequence_parallel: bool = False
    tp_overlap: str = "none"                  # none | recipe (with sequence parallelism) | async_tp_in_notes
    tp_overlap_note: str = ""
    grad_accumulation_fusion: bool = True
    grad_reduce_bf16: bool = False
    grad_reduce_bf16_note: str = ""
    fill_from_notes: bool = False             # blank sequence length and global batch from notes and defaults
    #: what a row's 'selective' recompute cell runs as on this engine (torchtitan's is per-op SAC), and why
    selective_recompute: str = "selective"
    selective_recompute_note: str = ""
    #: precisions the engine trains with a recipe paraplan does not model: dtype -> what the engine runs
    #: (a row in one is skipped with that reason, not refused as an unexpressible layout)
    unmodelled_precisions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeFact:
    """One fact of one run's recipe, and the rows it applies to."""
    kind: str
    value: Any
    match: Mapping[str, Any]
    source: str
    note: str = ""

    def matches(self, row, read_on: str | None = None, preset: str | None = None) -> bool:
        """Whether every key of ``match`` equals the row's (the sidecar's header): ``read_on`` is the
        engine the row is read on, ``preset`` the model preset it is read as."""
        for k, want in self.match.items():
            if k in NUMERIC_MATCH:
                cell = row[k]
                got = 1 if k == "vpp" and blank(cell) else (None if blank(cell) else int_cell(cell, k))
                if got != want:
                    return False
            elif k == "model":
                if str(row["model"]).strip().lower() != str(want).strip().lower():
                    return False
            elif k == "gpu":
                if str(row["gpu"]) != want:
                    return False
            elif k == "precision":
                if str(row["precision"]).strip().upper() != str(want).strip().upper():
                    return False
            elif k == "source_contains":
                if str(want) not in str(row["source"]):
                    return False
            elif k == "model_contains":
                if str(want) not in str(row["model"]).lower():
                    return False
            elif k == "engine":
                if read_on != want:
                    return False
            elif preset != want:                # "preset"
                return False
        return True


@dataclass(frozen=True)
class Recipes:
    """A published-run file's sidecar (module docstring)."""
    path: Path
    csv: Path
    sources: tuple[SourceEntry, ...]
    engine_rules: tuple[tuple[tuple[str, ...], str], ...]
    default_engine: str
    default_engine_note: str
    optimizer_offload_engine: str
    optimizer_offload_note: str
    engine_defaults: Mapping[str, EngineDefaults]
    gpu_systems: Mapping[str, str]
    model_presets: Mapping[str, str]
    blank_vocab: int
    blank_vocab_note: str
    facts: tuple[RecipeFact, ...]

    def source_entry(self, source) -> SourceEntry | None:
        """The first source entry the source column matches, or None."""
        s = str(source)
        return next((e for e in self.sources if e.matches(s)), None)

    def source_name(self, source) -> str:
        """How a source is named in tables: its entry's name, else the source as written."""
        entry = self.source_entry(source)
        return entry.name if entry is not None and entry.name else str(source)

    def engine_of(self, source) -> str | None:
        """The engine a source's runs trained with: its entry's, else the engines table's first rule
        whose words occur in the lower-cased source; None when neither names one (the default engine)."""
        entry = self.source_entry(source)
        if entry is not None and entry.engine:
            return entry.engine
        s = str(source).lower()
        return next((name for words, name in self.engine_rules if all(w in s for w in words)), None)

    def optimizer_offload_switch(self, read_on: str) -> str | None:
        """The engine a row read on ``read_on`` is read on instead when it offloads its optimizer states
        (the one engine whose offload paraplan prices), or None when it is that engine already."""
        return None if read_on == self.optimizer_offload_engine else self.optimizer_offload_engine

    def system_of_gpu(self, gpu) -> str | None:
        """The system preset the file's own table gives a GPU column, or None."""
        return self.gpu_systems.get(gpu)

    def preset_of_model(self, model) -> str | None:
        """The model preset the file's own table gives a model column (lower-cased), or None."""
        return self.model_presets.get(str(model).strip().lower())

    def fact(self, kind: str, row, read_on: str | None = None, preset: str | None = None) -> RecipeFact | None:
        """The first fact of ``kind`` that applies to ``row`` (read on engine ``read_on`` as ``preset``),
        or None."""
        return next((f for f in self.facts if f.kind == kind and f.matches(row, read_on, preset)), None)


# --- reading and checking a sidecar ------------------------------------------------------------------

def _keys(where: str, entry, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """``entry`` as a dict, refusing missing required keys, unknown keys and empty sources."""
    if not isinstance(entry, dict):
        raise ConfigError(where, f"must be a mapping, got {type(entry).__name__}")
    missing = [k for k in required if k not in entry]
    unknown = [k for k in entry if k not in required + optional]
    if missing:
        raise ConfigError(where, "missing " + ", ".join(missing))
    if unknown:
        raise ConfigError(where, "unknown key" + "s" * (len(unknown) > 1) + " " + ", ".join(map(str, unknown))
                          + "; accepted: " + ", ".join(required + optional))
    for k in ("source", "cite"):
        if k in entry and not (isinstance(entry[k], str) and entry[k].strip()):
            raise ConfigError(f"{where}.{k}", "must name where the fact was read")
    return entry


def _source_entry(where: str, d) -> SourceEntry:
    d = _keys(where, d, (), tuple(SourceEntry.__dataclass_fields__))
    if bool(d.get("words")) == ("starts_with" in d):
        raise ConfigError(where, "needs either words or starts_with")
    if d.get("name") and not d.get("cite"):
        raise ConfigError(where, "a named source needs cite: where its runs were published")
    return SourceEntry(**{**d, "words": tuple(str(w).lower() for w in d.get("words", ())),
                          "systems": dict(d.get("systems", {})),
                          "fp8_param_gather_dtypes": tuple(d.get("fp8_param_gather_dtypes", ())),
                          "precision_aware_optimizer_dtypes": tuple(d.get("precision_aware_optimizer_dtypes", ()))})


def _fact(where: str, d) -> RecipeFact:
    d = _keys(where, d, ("fact", "value", "match", "source"), ("note",))
    kind = d["fact"]
    if kind not in FACT_KINDS:
        raise ConfigError(f"{where}.fact", f"{kind!r} is not one of " + ", ".join(FACT_KINDS))
    value, want = d["value"], FACT_KINDS[kind]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{where}.value", f"{kind} takes a {want.__name__}, got {value!r}")
    match = d["match"]
    if not isinstance(match, dict) or not match:
        raise ConfigError(f"{where}.match", "must map columns to values")
    unknown = [k for k in match if k not in NUMERIC_MATCH + TEXT_MATCH]
    if unknown:
        raise ConfigError(f"{where}.match", "unknown column " + ", ".join(map(str, unknown)) + "; accepted: "
                          + ", ".join(NUMERIC_MATCH + TEXT_MATCH))
    return RecipeFact(kind, value, dict(match), d["source"], d.get("note", ""))


@lru_cache(maxsize=None)
def load_recipes(path: Path | str) -> Recipes:
    """A sidecar read and checked (module docstring). Raises ConfigError naming the file and entry."""
    path = Path(path)
    doc = _keys(str(path), read_yaml(path), ("file", "sources", "engines", "gpus", "models", "blank_vocab", "facts"),
                ("engine_defaults", "layouts"))
    engines = _keys(f"{path}: engines", doc["engines"], ("source", "rules", "otherwise", "optimizer_offload"),
                    ("otherwise_note", "optimizer_offload_note"))
    rules = []
    for i, r in enumerate(engines["rules"]):
        r = _keys(f"{path}: engines.rules[{i}]", r, ("words", "engine"))
        rules.append((tuple(str(w).lower() for w in r["words"]), r["engine"]))
    defaults = {name: EngineDefaults(**_keys(f"{path}: engine_defaults.{name}", d, ("zero", "zero_note", "source"),
                                             tuple(EngineDefaults.__dataclass_fields__)))
                for name, d in (doc.get("engine_defaults") or {}).items()}
    gpus = _keys(f"{path}: gpus", doc["gpus"], ("source", "systems"))
    models = _keys(f"{path}: models", doc["models"], ("source", "presets"))
    vocab = _keys(f"{path}: blank_vocab", doc["blank_vocab"], ("value", "note", "source"))
    return Recipes(
        path=path, csv=path.parent / doc["file"],
        sources=tuple(_source_entry(f"{path}: sources[{i}]", e) for i, e in enumerate(doc["sources"])),
        engine_rules=tuple(rules), default_engine=engines["otherwise"],
        default_engine_note=engines.get("otherwise_note", ""),
        optimizer_offload_engine=engines["optimizer_offload"],
        optimizer_offload_note=engines.get("optimizer_offload_note", ""),
        engine_defaults=defaults, gpu_systems=dict(gpus["systems"]),
        model_presets={str(k).strip().lower(): v for k, v in (models["presets"] or {}).items()},
        blank_vocab=int(vocab["value"]), blank_vocab_note=vocab["note"],
        facts=tuple(_fact(f"{path}: facts[{i}]", f) for i, f in enumerate(doc["facts"])))


#: the A100 / V100 file and the H100-class / Blackwell file, with their sidecars
A100_RECIPES = DATA / "published_runs_calibration.recipes.yaml"
H100_RECIPES = DATA / "published_runs_calibration_h100.recipes.yaml"


def a100_recipes() -> Recipes:
    return load_recipes(A100_RECIPES)


def h100_recipes() -> Recipes:
    return load_recipes(H100_RECIPES)
