"""Fitted constants are data (paraplan/data/fitted_constants.yaml): every entry has its value, unit,
source and how it was fitted; every module constant that is one reads it from the file; no module
keeps a fitted figure as a literal (the hardware catalogue's "every figure has a source", for the
models' own figures)."""
import ast
import importlib
import math
import re
from pathlib import Path

import pytest

import paraplan

from paraplan.constants import ENTRY_KEYS, fitted, fitted_entries
from paraplan.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "paraplan"

#: module constant -> (entry, what the module does with it)
MODULE_CONSTANTS = {
    ("paraplan.costmodels.memory", "ALLOCATOR_FRAGMENTATION"): ("allocator_fragmentation", 1),
    ("paraplan.costmodels.memory", "ALLOCATOR_RESERVE_BYTES"): ("allocator_reserve", 2**30),
    ("paraplan.costmodels.memory", "SCALING_ALLOCATOR_FRAGMENTATION"): ("scaling_allocator_fragmentation", 1),
    ("paraplan.costmodels.memory", "MEGATRON_ALLOCATOR_FRAGMENTATION"): ("megatron_allocator_fragmentation", 1),
    ("paraplan.costmodels.memory", "RUNTIME_RESERVED_BYTES"): ("runtime_reserved", 2**30),
    ("paraplan.costmodels.memory", "ALLOCATOR_PRESSURE_HEADROOM_BYTES"): ("allocator_pressure_headroom", 2**30),
    ("paraplan.costmodels.dataparallel", "OVERLAP_CONTENTION"): ("collective_overlap_slowdown", 1),
    ("paraplan.costmodels.tpcomm", "TP_OVERLAP_CONTENTION"): ("collective_overlap_slowdown", 1),
    ("paraplan.costmodels.moe", "EP_OVERLAP_CONTENTION"): ("collective_overlap_slowdown", 1),
    ("paraplan.costmodels.p2p", "P2P_OVERLAP_CONTENTION"): ("collective_overlap_slowdown", 1),
    ("paraplan.costmodels.moe", "MOE_HOST_SECONDS_PER_LAYER"): ("moe_host_seconds_per_layer", 1),
    ("paraplan.costmodels.moe", "ROUTED_RANK_IMBALANCE"): ("moe_routed_rank_imbalance", 1),
    ("paraplan.costmodels.attention", "FLASH1_TIME_FACTOR"): ("flash1_time_factor", 1),
    ("paraplan.scenario", "DEFAULT_MEMORY_FRACTION"): ("plan_memory_fraction", 1),
    ("paraplan.planner.simplicity", "TIE_SHARE"): ("planner_tie_share", 1),
    ("paraplan.hardware.topology", "SWITCH_HOP_LATENCY_S"): ("switch_hop_latency", 1),
    ("paraplan.costmodels.nccl", "CALL_OVERHEAD_S"): ("collective_call_overhead", 1),
    ("paraplan.validation.calibrate", "ROW_RUN_NOISE"): ("row_run_noise", 1),
    ("paraplan.validation.calibrate", "ROW_RUN_FACTOR_PRIOR"): ("row_run_factor_prior", 1),
    ("paraplan.cf.data", "ITEM_SLOPE"): ("cf_item_popularity_slope", 1),
    ("paraplan.cf.data", "USER_SLOPE"): ("cf_user_activity_slope", 1),
    ("paraplan.cf.cost", "MLP_MISSES_PER_CORE"): ("cf_misses_per_core", 1),
    ("paraplan.cf.cost", "ANALYTICAL_GEMM_EFFICIENCY"): ("cf_small_gemm_efficiency", 1),
    ("paraplan.cf.cost", "ANALYTICAL_OP_OVERHEAD_S"): ("cf_torch_op_overhead", 1),
    ("paraplan.cf.cost", "ANALYTICAL_RNG_S_PER_ELEMENT"): ("cf_randint_time", 1),
    ("paraplan.cf.cost", "ANALYTICAL_INDEX_S_PER_ELEMENT"): ("cf_index_time", 1),
    ("paraplan.cf.cost", "ANALYTICAL_FAULT_S_PER_BYTE"): ("cf_page_fault_time", 1 / 4096),
}

#: module-level numeric literals whose comments speak of measurement but which are no fitted figure
NOT_FITTED = {
    "paraplan/cf/cost.py:TILED_OPS_PER_STEP": "op counts of the torch kernels, counted with torch.profiler",
    "paraplan/cf/profile.py:GATHER_ROWS": "the sizes a profile measures at",
    "paraplan/cf/profile.py:INDEX_BLOCK_COLUMNS": "the sizes a profile measures at",
    "paraplan/costmodels/efficiency.py:COMPOSITION_FACTOR_BOUNDS": "a guard on measured ratios",
    "paraplan/costmodels/memory.py:EAGER_RMSNORM_SAVED_BYTES_PER_ELEMENT": "counted from the eager kernels' tensors",
    "paraplan/reports/figures.py:TITLE_INCH_PER_CHAR": "figure layout",
    "paraplan/validation/profile.py:NOISY_SPREAD": "a noise threshold for re-measuring",
}
#: words that mark a comment as describing a fitted or measured figure
FITTED_WORDS = re.compile(r"calibrat|fitted|\bfit\b|measured|estimate\b|read from|empirical|tuned", re.I)


@pytest.mark.parametrize("name", sorted(fitted_entries()))
def test_every_entry_has_value_unit_source_and_how(name):
    entry = fitted_entries()[name]
    missing = [k for k in ENTRY_KEYS if k not in entry]
    assert not missing, f"{name}: missing {missing}"
    value = entry["value"]
    assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), (name, value)
    for key in ("unit", "source", "how"):
        assert isinstance(entry[key], str) and len(entry[key].split()) >= 2, f"{name}.{key} says nothing"
    assert not set(entry) - set(ENTRY_KEYS) - {"used_by"}, f"{name}: unknown keys"


@pytest.mark.parametrize("module, attribute", sorted(MODULE_CONSTANTS))
def test_module_constant_reads_the_file(module, attribute):
    """The module's constant equals the file's value (in SI units), and its definition reads it."""
    name, factor = MODULE_CONSTANTS[(module, attribute)]
    entry = fitted_entries()[name]
    value = getattr(importlib.import_module(module), attribute)
    assert value == pytest.approx(entry["value"] * factor, rel=1e-15)
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    definition = next(line for line in path.read_text().splitlines() if line.startswith(f"{attribute} ="))
    assert "fitted(" in definition or definition.split("=", 1)[1].strip().isidentifier(), definition
    assert attribute in entry.get("used_by", ""), f"{name}.used_by omits {attribute}"


def _fitted_calls() -> dict[str, list[str]]:
    calls: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for m in re.finditer(r'fitted\("([a-z0-9_]+)"\)', path.read_text()):
            calls.setdefault(m.group(1), []).append(str(path.relative_to(PACKAGE.parent)))
    return calls


def test_every_entry_is_read_and_every_read_names_an_entry():
    calls, entries = _fitted_calls(), fitted_entries()
    assert not set(entries) - set(calls), f"entries nothing reads: {sorted(set(entries) - set(calls))}"
    assert not set(calls) - set(entries), f"reads of unknown entries: {sorted(set(calls) - set(entries))}"


def test_the_overlap_slowdown_is_defined_once():
    """Lee et al. 2025's 0.19 was written twice (data-parallel and tensor-parallel overlap): one entry,
    read by both, and no literal left."""
    from paraplan.costmodels.dataparallel import OVERLAP_CONTENTION
    from paraplan.costmodels.tpcomm import TP_OVERLAP_CONTENTION
    assert OVERLAP_CONTENTION == TP_OVERLAP_CONTENTION == fitted("collective_overlap_slowdown") == 0.19
    literal = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in PACKAGE.rglob("*.py")
               for i, line in enumerate(p.read_text().splitlines(), 1) if re.match(r"[A-Z_]+ = 0\.19\b", line)]
    assert not literal


def test_no_fitted_figure_is_left_as_a_literal():
    """A module-level constant that is a numeric literal and whose comment speaks of calibration,
    fitting or measurement must read the file (or be listed in NOT_FITTED with the reason)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.parse("\n".join(lines)).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            consts = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)]
            literal = all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple,
                                         ast.Load)) for n in ast.walk(node.value))
            if not names or not consts or not literal or not all(
                    isinstance(c.value, (int, float)) and not isinstance(c.value, bool) for c in consts):
                continue
            text = lines[node.lineno - 1:node.end_lineno]
            k = node.lineno - 2
            while k >= 0 and lines[k].lstrip().startswith("#"):
                text.insert(0, lines[k])
                k -= 1
            key = f"{path.relative_to(PACKAGE.parent)}:{names[0]}"
            if FITTED_WORDS.search("\n".join(text)) and key not in NOT_FITTED:
                found.append(key)
    assert not found, f"fitted figures kept as literals (move them to fitted_constants.yaml): {found}"


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="allocator_fragmentation"):
        fitted("allocator_fragmentaton")


def test_gib_entries_are_bytes():
    assert fitted("allocator_reserve") == 0.5 * 2**30
    assert fitted("allocator_pressure_headroom") == 2 * 2**30


def test_data_yaml_loader_reads_every_shipped_file_as_pyyamls_safe_loader_does():
    """The package's data files are read with libyaml's parser where PyYAML has it (start-up: models.yaml in
    3 ms instead of 120 ms); the objects must be those of ``yaml.safe_load``, types and key order included."""
    import yaml
    from paraplan.constants import DATA_YAML_LOADER, load_data_yaml

    def same(a, b):
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b or (a != a and b != b)        # NaN

    files = sorted(Path(paraplan.__file__).parent.rglob("*.yaml"))
    assert len(files) >= 40
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert same(load_data_yaml(text), yaml.safe_load(text)), path
    assert DATA_YAML_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
