"""What-if sweeps: a base scenario, one or two swept variables, one estimate per point.

A point is the base scenario with the swept variables set. At each point the planner searches
for the best plan (``search``) or, when the scenario fixes a whole plan, the plan is re-estimated
(``estimate``). Value syntaxes for ``--sweep VAR=VALUES`` (items separated by commas, mixed freely):

* a number: ``64``, ``8k`` (k = 1024, M = 1024², :func:`paraplan.io.parse_size`), ``0.5`` (bandwidths in GB/s per GPU, HBM in GiB);
* a range ``LO..HI``: LO, every power of two strictly between, HI (``2k..128k`` gives 2048 … 131072);
* a multiplier ``xF``: F times the base value (``x0.5,x1,x2``);
* a name for ``cluster`` (a system preset or cluster file) and ``offload`` (none, cpu, nvme, auto).
"""
from __future__ import annotations

import ctypes
import math
import multiprocessing as mp
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any, Mapping

from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError, shown
from paraplan.hardware.catalog import power_limited, rated_power
from paraplan.io import parse_size, read_yaml, spec_beside, spec_relative_to
from paraplan.plan import ATTENTION_KERNELS, Plan
from paraplan.progress import bar
from paraplan.planner.search import explain_infeasible, search
from paraplan.planner.space import SpaceOptions, normalize_fix, parse_fix
from paraplan.scenario import DEFAULT_MEMORY_FRACTION, DEFAULT_SEQ_LEN, default_global_batch, load_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

VARIABLES = ("gpus", "seq_len", "global_batch", "cluster", "inter_node_bandwidth", "intra_node_bandwidth", "hbm",
             "host_link_bandwidth", "power_limit", "offload", "attention_kernel")
INTEGER_VARS = ("gpus", "seq_len", "global_batch")
FLOAT_VARS = ("inter_node_bandwidth", "intra_node_bandwidth", "hbm", "host_link_bandwidth", "power_limit")
UNITS = {"gpus": "GPUs", "seq_len": "tokens", "global_batch": "sequences", "inter_node_bandwidth": "GB/s per GPU",
         "intra_node_bandwidth": "GB/s per GPU", "hbm": "GiB", "host_link_bandwidth": "GB/s per GPU",
         "power_limit": "W per GPU", "cluster": "", "offload": "", "attention_kernel": ""}
LABELS = {"gpus": "GPUs", "seq_len": "sequence length", "global_batch": "global batch",
          "cluster": "cluster", "inter_node_bandwidth": "inter-node bandwidth",
          "intra_node_bandwidth": "intra-node bandwidth", "hbm": "HBM per GPU",
          "host_link_bandwidth": "host-link bandwidth (offload)", "power_limit": "GPU power limit", "offload": "offload",
          "attention_kernel": "attention kernel"}
OFFLOAD_VALUES = ("none", "cpu", "nvme", "auto")
#: variables whose values are names from a fixed list
NAMED_VALUES = {"offload": OFFLOAD_VALUES, "attention_kernel": ATTENTION_KERNELS}
GIB = 2**30
MAX_VALUE = 1e12          # a swept number past this is a typo (bandwidths in GB/s, HBM in GiB, counts)
#: the smallest swept bandwidth (GB/s) or HBM (GiB): a kB/s link or a KiB of memory; below it, down
#: to denormals such as 1e-320, memory / capacity overflows in the planner (fuzz seed 25 found it)
MIN_FLOAT_VALUE = 1e-6
MAX_COUNT = 2**31 - 1     # GPUs, tokens, sequences: numpy and the planner count in C longs


def _number(text: str, field_name: str) -> float:
    try:
        v = parse_size(text)     # the size syntax of every count flag: 8k = 8192, 1M = 1024^2
    except (ValueError, OverflowError):
        raise ConfigError(field_name, f"not a number: {text!r}",
                          accepted="numbers (8k = 8192, 1M = 1024^2), ranges LO..HI, multipliers xF") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(field_name, f"must be positive, got {shown(text)}")
    if v > MAX_VALUE:
        raise ConfigError(field_name, f"must be at most {MAX_VALUE:g}, got {shown(text)}")
    return v


@dataclass(frozen=True)
class Sweep:
    """One swept variable: its name and the raw items, resolved against the base by ``values``."""
    var: str
    items: tuple

    @property
    def label(self) -> str:
        unit = UNITS[self.var]
        return LABELS[self.var] + (f" ({unit})" if unit and unit != LABELS[self.var] else "")


def parse_sweep(text: str) -> Sweep:
    """``VAR=VALUES`` → Sweep (values checked for syntax here, resolved against the base later)."""
    if "=" not in text:
        raise ConfigError("--sweep", f"expected VAR=VALUES, got {text!r}", accepted=", ".join(VARIABLES))
    var, values = text.split("=", 1)
    var = var.strip().replace("-", "_")
    if var not in VARIABLES:
        raise ConfigError("--sweep", f"unknown variable {var!r}", accepted=", ".join(VARIABLES))
    items = tuple(v.strip() for v in values.split(",") if v.strip())
    if not items:
        raise ConfigError(f"--sweep {var}", "no values given", accepted="e.g. 64,128,256 or 64..4096 or x0.5,x1,x2")
    sweep = Sweep(var, items)
    sweep_values(sweep, base=None)  # syntax check now; multipliers need the base later
    return sweep


def sweep_values(sweep: Sweep, base) -> list:
    """The values of a sweep; multipliers scale ``base`` (None: syntax check only)."""
    var, field_name = sweep.var, f"--sweep {sweep.var}"
    out: list = []
    for item in sweep.items:
        low = item.lower()
        if var == "cluster":
            if low.startswith("x") or ".." in low:
                raise ConfigError(field_name, f"{item!r}: clusters are named, not scaled or ranged",
                                  accepted="system presets (e.g. dgx-h100) or cluster YAML files")
            out.append(item)
            continue
        if var in NAMED_VALUES:
            if low not in NAMED_VALUES[var]:
                raise ConfigError(field_name, f"unknown value {item!r}", accepted=", ".join(NAMED_VALUES[var]))
            out.append(low)
            continue
        if low.startswith("x"):
            factor = _number(low[1:], field_name)
            if base is None:
                out.append(None)
                continue
            v = base * factor
        elif ".." in low:
            lo_s, hi_s = low.split("..", 1)
            lo, hi = _number(lo_s, field_name), _number(hi_s, field_name)
            if hi < lo:
                raise ConfigError(field_name, f"range {item!r} runs backwards")
            vals = [lo] + [2.0**e for e in range(math.floor(math.log2(lo)) + 1, math.ceil(math.log2(hi)))
                           if lo < 2.0**e < hi] + ([hi] if hi != lo else [])
            out.extend(_as_type(var, v, field_name, item) for v in vals)
            continue
        else:
            v = _number(low, field_name)
        out.append(_as_type(var, v, field_name, item))
    if base is not None:
        seen, unique = set(), []
        for v in out:
            if v not in seen:
                seen.add(v)
                unique.append(v)
        out = unique
    return out


def _as_type(var: str, v: float, field_name: str, item: str):
    if var in FLOAT_VARS and v < MIN_FLOAT_VALUE:
        raise ConfigError(field_name, f"{shown(item)} gives {v:g} {UNITS[var]}",
                          accepted=f"at least {MIN_FLOAT_VALUE:g} {UNITS[var]}")
    if var in INTEGER_VARS:
        if abs(v - round(v)) > 1e-9:
            raise ConfigError(field_name, f"{shown(item)} gives {v:g}, not a whole number")
        if v > MAX_COUNT:
            raise ConfigError(field_name, f"{shown(item)} gives {v:g}", accepted=f"at most {MAX_COUNT:,}")
        return int(round(v))
    return float(v)


#: the accepted price per GPU-hour (US$): from a cent per million GPU-hours (below it, down to
#: denormals such as 1e-320, the cost axis's inverse overflows) to 1e9
MIN_PRICE, MAX_PRICE = 1e-8, 1e9


@dataclass(frozen=True)
class Scenario:
    """Everything a what-if report needs; what ``--scenario FILE.yaml`` holds.

    ``fixed`` pins plan axes for the search (like ``paraplan plan --fix``); ``plan`` (a dict of
    Plan fields) fixes the whole plan, which is then re-estimated at each point instead of re-planned.
    """
    model: str
    cluster: str
    gpus: int | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    sweeps: tuple[Sweep, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    plan: Mapping[str, Any] | None = None
    allow_offload: bool = True
    grad_accumulation_fusion: bool = True   # False: search only unfused plans (no effect with ``plan``)
    max_memory_fraction: float = DEFAULT_MEMORY_FRACTION   # plan's margin (one default for both)
    price_per_gpu_hour: float | None = None
    train_tokens: float | None = None
    heatmap: bool = True

    def __post_init__(self):
        if not 1 <= len(self.sweeps) <= 2:
            raise ConfigError("--sweep", f"give one or two sweeps, got {len(self.sweeps)}")
        if len(self.sweeps) == 2 and self.sweeps[0].var == self.sweeps[1].var:
            raise ConfigError("--sweep", f"{self.sweeps[0].var} is swept twice")
        if self.price_per_gpu_hour is not None and not MIN_PRICE <= self.price_per_gpu_hour <= MAX_PRICE:
            raise ConfigError("--price-per-gpu-hour",
                              f"must be between {MIN_PRICE:g} and {MAX_PRICE:g} US$, got {self.price_per_gpu_hour}")
        if self.train_tokens is not None and not self.train_tokens > 0:
            raise ConfigError("--train-tokens", f"must be positive, got {self.train_tokens}")
        if not 0.01 <= self.max_memory_fraction <= 1:
            raise ConfigError("max_memory_fraction", f"must be in [0.01, 1], got {self.max_memory_fraction}")

    @property
    def replans(self) -> bool:
        return self.plan is None

    def to_dict(self) -> dict:
        d = {"model": self.model, "cluster": self.cluster, "gpus": self.gpus, "seq_len": self.seq_len,
             "global_batch": self.global_batch,
             "sweep": {s.var: ",".join(s.items) for s in self.sweeps}, "fix": dict(self.fixed),
             "plan": dict(self.plan) if self.plan is not None else None, "allow_offload": self.allow_offload,
             "grad_accumulation_fusion": None if self.grad_accumulation_fusion else False,
             "max_memory_fraction": self.max_memory_fraction, "price_per_gpu_hour": self.price_per_gpu_hour,
             "train_tokens": self.train_tokens, "heatmap": self.heatmap}
        return {k: v for k, v in d.items() if v is not None and v != {}}


SCENARIO_KEYS = ("model", "cluster", "gpus", "seq_len", "global_batch", "sweep", "fix", "plan", "allow_offload",
                 "grad_accumulation_fusion",
                 "max_memory_fraction", "price_per_gpu_hour", "train_tokens", "heatmap")


def scenario_from_mapping(data: Mapping[str, Any], source: str = "scenario") -> Scenario:
    """A Scenario from a YAML mapping (the keys of ``Scenario.to_dict``)."""
    if not isinstance(data, Mapping):
        raise ConfigError("scenario", "expected a mapping at the top level", source=source)
    unknown = sorted(set(data) - set(SCENARIO_KEYS))
    if unknown:
        raise ConfigError(unknown[0], "unknown scenario key", accepted=", ".join(SCENARIO_KEYS), source=source)
    for key in ("model", "cluster"):
        if not isinstance(data.get(key), str):
            raise ConfigError(key, "required (a preset name or a file)", source=source)
    raw = data.get("sweep") or {}
    if isinstance(raw, Mapping):
        texts = [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in raw.items()]
    elif isinstance(raw, (list, tuple)):
        texts = [str(x) for x in raw]
    else:
        raise ConfigError("sweep", "expected a mapping VAR: VALUES or a list of 'VAR=VALUES'", source=source)
    ints = {}
    for key in ("gpus", "seq_len", "global_batch"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT):
            raise ConfigError(key, f"must be a positive integer up to {MAX_COUNT:,}, got {shown(v)}", source=source)
        ints[key] = v
    fix = data.get("fix") or {}
    if isinstance(fix, (list, tuple)):
        fix = parse_fix([str(x) for x in fix])
    elif isinstance(fix, Mapping):
        fix = normalize_fix(fix)
    else:
        raise ConfigError("fix", "expected a mapping AXIS: VALUE or a list of 'AXIS=VALUE'", source=source)
    if not texts:
        raise ConfigError("sweep", "give one or two sweeps (VAR: VALUES)", source=source)
    mmf = data.get("max_memory_fraction", DEFAULT_MEMORY_FRACTION)
    if isinstance(mmf, bool) or not isinstance(mmf, (int, float)) or not 0.01 <= mmf <= 1:
        raise ConfigError("max_memory_fraction", f"expected a number in [0.01, 1], got {shown(mmf)}", source=source)
    plan = data.get("plan")
    if plan is not None:
        if not isinstance(plan, Mapping):
            raise ConfigError("plan", "expected a mapping of plan fields (tp, pp, zero, ...)", source=source)
        Plan.from_dict(plan, source=source)
    return Scenario(model=data["model"], cluster=data["cluster"], sweeps=tuple(parse_sweep(t) for t in texts),
                    fixed=dict(fix), plan=dict(plan) if plan is not None else None,
                    allow_offload=_opt_bool(data, "allow_offload", True, source),
                    grad_accumulation_fusion=_opt_bool(data, "grad_accumulation_fusion", True, source),
                    max_memory_fraction=float(mmf),
                    price_per_gpu_hour=_opt_float(data, "price_per_gpu_hour", source),
                    train_tokens=_opt_float(data, "train_tokens", source), heatmap=_opt_bool(data, "heatmap", True, source),
                    **ints)


def _opt_float(data, key, source):
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, str):            # YAML 1.1 reads 300e9 (no dot) as text
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= 1e30:
        raise ConfigError(key, f"expected a positive finite number, got {shown(v)}", source=source)
    return float(v)


def _opt_bool(data, key, default: bool, source) -> bool:
    v = data.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(key, f"expected true or false, got {shown(v)}", source=source)
    return v


def _map_file_specs(data: Mapping, to) -> dict:
    """``data`` (a scenario mapping) with ``to`` applied to each spec that may name a file: model, cluster
    and the swept clusters (comma-separated); other values, and values of the wrong type (left for
    :func:`scenario_from_mapping` to refuse), as they are."""
    out = dict(data)
    for key in ("model", "cluster"):
        if isinstance(out.get(key), str):
            out[key] = to(out[key])
    sweep = out.get("sweep")
    if isinstance(sweep, Mapping) and isinstance(sweep.get("cluster"), str):
        out["sweep"] = {**sweep, "cluster": ",".join(to(c.strip()) for c in sweep["cluster"].split(","))}
    return out


def with_specs_relative_to(doc: dict, folder) -> dict:
    """A scenario mapping (``Scenario.to_dict``) whose model, cluster and swept clusters that are files
    are named relative to ``folder``, where the scenario file is written (paraplan.io.spec_relative_to)."""
    return _map_file_specs(doc, lambda spec: spec_relative_to(spec, folder))


def load_scenario(path) -> Scenario:
    """A scenario file: its model, cluster and swept clusters that name files are found beside it first
    (as :func:`with_specs_relative_to` writes them), then from the working directory."""
    data = read_yaml(Path(path), "--scenario")
    if isinstance(data, Mapping):
        data = _map_file_specs(data, lambda spec: spec_beside(spec, Path(path).parent))
    return scenario_from_mapping(data, source=str(path))


# --- points ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One resolved point: the swept values and the model/job/cluster/search options it means."""
    index: int
    values: Mapping[str, Any]
    model: Any
    job: Any
    cluster: Any
    cluster_spec: str
    fixed: Mapping[str, Any]
    allow_offload: bool


@dataclass(frozen=True)
class PointResult:
    point: Point
    estimate: Any            # Estimate or None (nothing fits / plan does not apply)
    reason: str | None       # why there is no feasible estimate
    candidates: int
    seconds: float

    @property
    def feasible(self) -> bool:
        return self.estimate is not None and self.estimate.feasible


def base_values(scenario: Scenario) -> dict:
    """Base value of every variable (before multipliers): flags, else defaults."""
    cluster = load_cluster(scenario.cluster, scenario.gpus)
    return {"gpus": cluster.num_gpus, "seq_len": scenario.seq_len or DEFAULT_SEQ_LEN, "global_batch": scenario.global_batch,
            "cluster": scenario.cluster,
            "inter_node_bandwidth": cluster.system.inter_node.bandwidth_bytes_per_s / 1e9,
            "intra_node_bandwidth": cluster.system.intra_node.bandwidth_bytes_per_s / 1e9,
            "hbm": cluster.accelerator.memory_bytes / GIB,
            "host_link_bandwidth": cluster.system.host_link_bytes_per_s / 1e9,
            "power_limit": cluster.accelerator.power_limit_w or cluster.accelerator.rated_power_w,
            "offload": str((scenario.fixed or {}).get("offload") or (scenario.plan or {}).get("offload") or "auto"),
            "attention_kernel": str((scenario.fixed or {}).get("attention_kernel")
                                    or (scenario.plan or {}).get("attention_kernel") or "auto")}


def resolve_points(scenario: Scenario) -> list[Point]:
    """Every point of the sweep grid (first sweep outer), built and checked before anything runs."""
    model = load_model(scenario.model)
    base = base_values(scenario)
    axes = []
    for s in scenario.sweeps:
        b = base[s.var]
        if s.var == "power_limit" and b is None:      # the part states no rating: refused, saying which do
            rated_power(load_cluster(scenario.cluster, scenario.gpus).accelerator, "--sweep power_limit")
        if b is None and any(i.lower().startswith("x") for i in s.items):
            raise ConfigError(f"--sweep {s.var}", "a multiplier needs a base value", accepted=f"--{s.var.replace('_', '-')} N")
        if (s.var in FLOAT_VARS and any(i.lower().startswith("x") for i in s.items)
                and any(o.var == "cluster" for o in scenario.sweeps)):
            raise ConfigError(f"--sweep {s.var}", "multipliers are ambiguous when the cluster is swept too",
                              accepted="absolute values (GB/s per GPU, or GiB for hbm)")
        axes.append(sweep_values(s, b))
    points = []
    for i, combo in enumerate(product(*axes)):
        values = dict(zip((s.var for s in scenario.sweeps), combo))
        points.append(_point(i, scenario, model, base, values))
    return points


def _point(index, scenario, model, base, values) -> Point:
    v = {**base, **values}
    spec = v["cluster"]
    gpus = v["gpus"] if ("gpus" in values or spec == scenario.cluster) else (scenario.gpus or None)
    try:
        cluster = load_cluster(spec, gpus)
    except ConfigError as e:
        where = ", ".join(f"{k}={x}" for k, x in values.items())
        raise ConfigError(e.field, f"at sweep point {where}: {e.problem}", accepted=e.accepted) from None
    sysv = cluster.system
    if "inter_node_bandwidth" in values:
        cluster = cluster.with_system(inter_node=replace(sysv.inter_node,
                                                         bandwidth_bytes_per_s=v["inter_node_bandwidth"] * 1e9))
    if "intra_node_bandwidth" in values:
        cluster = cluster.with_system(intra_node=replace(cluster.system.intra_node,
                                                         bandwidth_bytes_per_s=v["intra_node_bandwidth"] * 1e9))
    if "hbm" in values:
        cluster = cluster.with_system(accelerator=replace(cluster.accelerator, memory_bytes=v["hbm"] * GIB))
    if "host_link_bandwidth" in values:        # the GPU's link to host memory (System.host_link_bytes_per_s)
        cluster = cluster.with_system(host_link_bandwidth_bytes_per_s=v["host_link_bandwidth"] * 1e9)
    if "power_limit" in values:
        cluster = cluster.with_system(accelerator=power_limited(cluster.accelerator, v["power_limit"],
                                                                "--sweep power_limit"))
    fixed = dict(scenario.fixed or {})
    allow_offload = scenario.allow_offload
    if "offload" in values:
        fixed.pop("offload", None)
        if values["offload"] != "auto":
            fixed["offload"] = values["offload"]
        allow_offload = True
    if "attention_kernel" in values:
        fixed["attention_kernel"] = values["attention_kernel"]
    gbs = v["global_batch"]
    if gbs is None:
        gbs = default_global_batch(cluster, Plan.from_dict(_plan_fields(scenario.plan)) if scenario.plan else None)
    job = TrainingJob(int(v["seq_len"]), int(gbs))
    return Point(index=index, values=dict(values), model=model, job=job, cluster=cluster, cluster_spec=spec,
                 fixed=fixed, allow_offload=allow_offload)


def _plan_fields(plan: Mapping) -> dict:
    d = {k: v for k, v in plan.items() if k != "dp"}
    if d.get("vpp", 1) > 1 and "schedule" not in d:
        d["schedule"] = "interleaved"
    return d


def evaluate_point(point: Point, scenario: Scenario, curves_cache: dict | None = None) -> PointResult:
    """Best plan (search) or the fixed plan re-estimated, for one point."""
    t0 = time.perf_counter()
    curves = analytical_curves(point.cluster.accelerator)
    if scenario.plan is not None:
        fields_ = _plan_fields(scenario.plan)
        if "offload" in point.values and point.values["offload"] != "auto":
            fields_["offload"] = point.values["offload"]
            if fields_["offload"] == "none":
                fields_.pop("offload_params", None)
        if "attention_kernel" in point.values:
            fields_["attention_kernel"] = point.values["attention_kernel"]
        try:
            e = estimate(point.model, point.job, point.cluster, Plan.from_dict(fields_), curves=curves,
                         max_memory_fraction=scenario.max_memory_fraction)
        except ConfigError as err:
            return PointResult(point, None, f"plan does not apply: {err}", 0, time.perf_counter() - t0)
        return PointResult(point, e, e.infeasible_reason, 1, time.perf_counter() - t0)
    options = SpaceOptions(fixed=dict(point.fixed), allow_offload=point.allow_offload,
                           grad_accumulation_fusion=scenario.grad_accumulation_fusion)
    r = search(point.model, point.job, point.cluster, options=options, top=1,
               max_memory_fraction=scenario.max_memory_fraction, curves=curves)
    reason = None if r.best else explain_infeasible(r, point.cluster)
    return PointResult(point, r.best, reason, r.candidates_evaluated, time.perf_counter() - t0)


def run_points(points, scenario: Scenario, progress: bool = False, jobs: int | None = None) -> list[PointResult]:
    """Evaluate every point; with ``progress``, a bar on stderr (``paraplan.progress``).

    The points are independent searches, so they run in ``jobs`` worker processes (default: one per core
    this process may use, at most one per point). Each point's result does not depend on where or in
    which order it ran, and the results come back in the points' order, so the report is the same
    byte for byte as one process would write it (tests compare them). Workers are forked where the
    platform can (Linux), which hands them the points without pickling; elsewhere, or with one job,
    the points run here one after the other. An error raised at a point is raised again here, the
    first in the points' order, as one process would have raised it."""
    jobs = min(len(points), default_jobs() if jobs is None else max(1, int(jobs)))
    if jobs > 1 and _FORK in mp.get_all_start_methods():
        return _run_parallel(points, scenario, progress, jobs)
    if not progress:
        return [evaluate_point(p, scenario) for p in points]
    with bar(total=len(points), desc="what-if", unit="point") as b:
        out = []
        for p in points:
            b.set_postfix_str(_point_label(p), refresh=False)
            out.append(evaluate_point(p, scenario))
            b.update(1)
    return out


_FORK = "fork"


def default_jobs() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                                     # not Linux
        return max(1, os.cpu_count() or 1)


def _point_label(p: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.values.items())


#: what a worker process evaluates: (points, scenario), set by :func:`_start_worker` (inherited by fork)
_WORK: tuple | None = None


def _start_worker(points, scenario, parent_pid: int) -> None:
    """A worker's set-up: its points; Ctrl-C is the parent's to handle; on Linux it is killed with its
    parent (prctl PR_SET_PDEATHSIG), so a killed ``whatif`` leaves no worker computing."""
    global _WORK
    _WORK = (points, scenario)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):                          # not Linux: the pool's own clean-up
        pass
    if os.getppid() != parent_pid:                             # the parent died before prctl
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _evaluate_in_worker(i: int):
    """(i, (estimate, reason, candidates, seconds)) or (i, (exception class, args, attributes)): the
    errors are sent as their parts, since ConfigError's constructor takes other arguments than its args."""
    points, scenario = _WORK
    try:
        r = evaluate_point(points[i], scenario)
        return i, True, (r.estimate, r.reason, r.candidates, r.seconds)
    except Exception as e:  # noqa: BLE001 - raised again in the parent, whatever it is
        return i, False, (type(e), e.args, dict(vars(e)))


def _raise_again(cls, args, attributes):
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(attributes)
    raise err


def _run_parallel(points, scenario: Scenario, progress: bool, jobs: int) -> list[PointResult]:
    """:func:`run_points` over ``jobs`` forked workers, started before the progress bar's thread exists."""
    pool = mp.get_context(_FORK).Pool(jobs, initializer=_start_worker, initargs=(points, scenario, os.getpid()))
    try:
        done: dict[int, tuple] = {}
        with bar(total=len(points), desc="what-if", unit="point") if progress else nullcontext() as b:
            for i, ok, outcome in pool.imap_unordered(_evaluate_in_worker, range(len(points))):
                done[i] = (ok, outcome)
                if b is not None:                   # the point just done; drawn now, results come in bursts
                    b.update(1)
                    b.set_postfix_str(_point_label(points[i]))
        out = []
        for i, p in enumerate(points):
            ok, outcome = done[i]
            if not ok:
                _raise_again(*outcome)
            out.append(PointResult(p, *outcome))
        return out
    finally:
        pool.terminate()
        pool.join()


def base_point(scenario: Scenario) -> Point:
    """The base scenario as a point: the flags' values; a swept variable the flags leave out
    (``--gpus``, ``--seq-len``, ``--global-batch``) takes its first swept value."""
    base = base_values(scenario)
    flags = {"gpus": scenario.gpus, "seq_len": scenario.seq_len, "global_batch": scenario.global_batch}
    values = {}
    for s in scenario.sweeps:
        if s.var in flags and flags[s.var] is None and not any(i.lower().startswith("x") for i in s.items):
            values[s.var] = sweep_values(s, base[s.var])[0]
    return _point(-1, scenario, load_model(scenario.model), base, values)
