"""``paraplan calibrate``: fit this cluster's efficiency levels to measured runs.

Input: ``paraplan validate --out DIR`` folders (their ``report.json``: the plan, the harness model,
the measured step and its terms, the median over the timed steps of the slowest rank; and
``traces/trace_rank<N>.json``: each rank's profiled step, read by :mod:`paraplan.validation.trace`),
and the stored profile the estimate started from (``local`` or ``profile:NAME``).

What is fitted: one factor per *knob*, multiplying what the profile's measurement gives
(:class:`paraplan.costmodels.profiled.ProfiledCurves`, :func:`paraplan.profiles.cluster.calibrated_link`):

* ``gemm``: the GEMMs' work; ``attention``: fused attention's; ``memory``: the memory-bound kernels'
  (elementwise, norms, softmax: bytes over the rate); ``kernel``: the per-kernel cost (dispatch,
  autograd, launch); ``optimizer``: the AdamW step;
* two per collective kind (``all_reduce``, ``reduce_scatter``, ``all_gather``, ``all_to_all``,
  ``send_recv``): ``<kind>.latency`` on its α and ``<kind>.bandwidth`` on its β = 1/B, told apart
  where the runs' messages span sizes (a run's many small tensor-parallel all-reduces against one
  large gradient all-reduce), one factor otherwise.

The estimate is linear in each factor (each multiplies an additive part of a term; the pipeline
bubble follows the stage's compute), so a knob's *sensitivity* on a run is measured by running the
real estimator with that factor at 2 against 1: ``S[k][term] = pred_term(k = 2) − pred_term(k = 1)``,
the part of the term the knob multiplies. Each run gives one equation per harness term (compute,
tp/pp/dp communication, optimizer)

    Σ_k S[k][term] · (f_k − 1) = measured_term − predicted_term,

(a published-run row: one, on its step) and where the run has traces the compute equation splits
with the traces' shares of the compute operators' self time (over all ranks): ``S[gemm] · f_gemm =
s_gemm · measured compute``, attention likewise, and the rest (memory-bound work and per-kernel
costs together, :func:`compute_groups`). Rows are
divided by the run's measured step (each run weighs the same); least squares with a pull of each
factor towards 1, the profile's value: where runs were repeated in turn (:func:`pool_runs`) the
ridge is the square of their measured noise (:func:`measurement_noise`: a Gaussian prior of unit
spread on each factor against rows that scatter by the noise, so that one layout off from the
others by its run's load moves the factors only as far as the noise allows), else 1e-4 (for knobs
the runs barely separate); factors clamped to [0.2, 5]. A knob is *unconstrained*, not fitted and left at 1, when it moves no run's predicted
step by MIN_INFLUENCE: the table says why (e.g. no run had dp, tp or cp > 1: all_reduce.latency and .bandwidth not fitted).
Without traces the compute knobs are one factor (``compute``: only their sum is measured), and knobs
whose equations are collinear (|cos| > COLLINEAR: the runs cannot tell them apart) are fitted as one.

Spread: the factors refitted with each run left out (their range). Leave-one-run-out error: each
run predicted by the real estimator on the profile calibrated on the other runs, against the
uncalibrated profile's prediction.

A cluster of the catalogue or a cluster file (:class:`ClusterBase`) is calibrated the same way on
rows and logs: the knobs apply to the analytical curves and both interconnect tiers
(:func:`paraplan.hardware.model.calibrated_system`), rows and logs are weighed by ROW_RUN_NOISE with a
prior of ROW_RUN_FACTOR_PRIOR on each factor, and :func:`calibrated_cluster_yaml` writes the result as
a cluster file (``--write-cluster``).

The calibrated profile is stored under ``--name`` as a machine of its own in the profile database
(hostname NAME, fingerprint ``calibrated-NAME``): the base profile's rows copied, plus one
``calibration`` row per fitted knob (its factor, spread and the runs it came from in ``shape``), so
``--cluster profile:NAME`` estimates and plans with it.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np

from paraplan.constants import fitted
from paraplan.errors import ConfigError, shown
from paraplan.hardware.model import CALIBRATION_KNOBS
from paraplan.plan import Plan
from paraplan.profiles.cluster import STEPS, cluster_from_tables, is_profile_spec, resolve_profile
from paraplan.profiles.store import ProfileStore, measured_tables
from paraplan.validation.config import GPTConfig, RunOptions, world_size
from paraplan.validation.predict import predict_on_cluster
from paraplan.validation.trace import COMPUTE, StepTerms, compute_concurrency, read_trace

#: the knobs (hardware.model: the compute ones, then per collective kind its latency α and bandwidth β = 1/B)
KNOBS = CALIBRATION_KNOBS
#: harness terms the fit uses (``other``, the harness's gradient flattening, is no knob's); ``step``: a
#: published-run row's one measurement
TERMS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "optimizer", "step")
#: a knob that moves no run's predicted step by this share stays at 1: the runs do not constrain it
MIN_INFLUENCE = 0.02
RIDGE = 1e-4
BOUNDS = (0.2, 5.0)
#: which plan fields make each collective appear in a harness run (for the unconstrained message)
COMM_SOURCES = {"all_reduce": "dp, tp or cp > 1", "reduce_scatter": "ZeRO >= 1 with dp > 1 or sp",
                "all_gather": "ZeRO >= 1 with dp > 1 or sp", "all_to_all": "ep > 1",
                "send_recv": "pp > 1 or cp > 1"}
HINT = "a folder `paraplan validate --out DIR` wrote (report.json, traces/)"


@dataclass(frozen=True)
class Run:
    """One measured run: what ran and what it measured."""
    name: str
    path: str
    cfg: GPTConfig
    plan: Plan
    options: RunOptions
    measured_step_s: float
    measured_terms: dict
    traces: tuple = ()            # StepTerms per rank (mean over its profiled steps)
    step_times_s: tuple = ()      # the timed steps of the slowest rank
    repeats: int = 1              # validate runs of this configuration pooled (:func:`pool_runs`)
    concurrency: tuple = ()       # per rank, its compute's share under another rank's (trace.compute_concurrency)
    round_steps_s: tuple = ()     # each pooled repeat's measured step (its median), in the order run

    @property
    def world(self) -> int:
        return world_size(self.plan)

    def trace_shares(self) -> dict | None:
        """Share of gemm, attention and memory in the traces' compute operators (summed over ranks)."""
        if not self.traces:
            return None
        keys = [k for k in COMPUTE if any(k in t.compute_s for t in self.traces)]    # host: CPU traces only
        tot = {k: sum(t.compute_s.get(k, 0.0) for t in self.traces) for k in keys}
        s = sum(tot.values())
        return {k: v / s for k, v in tot.items()} if s > 0 else None


@dataclass(frozen=True)
class RowRun:
    """A measured run given as a row of the published-run CSV schema (``paraplan score``'s input, or the
    rows ``paraplan score --log ... --write-rows`` writes from an engine's log): its model, job and plan,
    estimated on the calibrated profile at its GPU count (one node of the profile), one equation on
    its step time."""
    name: str
    model: object
    job: object
    plan: Plan
    gpus: int
    measured_step_s: float
    traces: tuple = ()
    repeats: int = 1
    gpu: str = ""                 # the accelerator the row ran on (its cluster's), "" where not known

    @property
    def measured_terms(self) -> dict:
        return {"step": self.measured_step_s}

    @property
    def step_times_s(self) -> tuple:
        return (self.measured_step_s,)

    def trace_shares(self) -> None:
        return None


def row_runs(cases) -> list[RowRun]:
    """RowRuns of published-run cases (:class:`paraplan.calibration.cases.CalibrationCase`)."""
    return [RowRun(f"row{c.row}", c.model, c.job, c.plan, int(c.cluster.num_gpus), float(c.measured_step_time_s),
                   gpu=c.cluster.accelerator.name) for c in cases]


@dataclass(frozen=True)
class ClusterBase:
    """A cluster of the catalogue, or a cluster file, to calibrate instead of a measured profile: the
    runs are published-run rows or training logs (:class:`RowRun`), each estimated on it at its own GPU
    count with the factors applied by :func:`paraplan.hardware.model.calibrated_system` (on the
    analytical curves' compute times and on both interconnect tiers' collectives), multiplied into any
    the file carries. What a multi-node run needs (the network tier, NVLink domains) is the system's."""
    spec: str

    def cluster(self, gpus: int | None = None, factors: dict | None = None):
        """The cluster at ``gpus`` (1 when not given: each run has its own count) with ``factors`` applied."""
        from paraplan.hardware.catalog import load_cluster
        from paraplan.hardware.model import calibrated_system
        c = load_cluster(self.spec, 1 if gpus is None else gpus)
        return replace(c, system=calibrated_system(c.system, factors)) if factors else c


def estimable(runs: list, tables: dict | ClusterBase) -> tuple[list, list]:
    """(the runs the profile can estimate, [(name, reason)] for those it cannot: a row whose dtype the
    profile has no rate for, a plan the profile's one node cannot hold; on a cluster, a row that ran on
    another GPU than the cluster's)."""
    from paraplan.errors import ParaplanError
    ok, skipped = [], []
    accelerator = tables.cluster().accelerator.name if isinstance(tables, ClusterBase) else None
    for r in runs:
        if accelerator and getattr(r, "gpu", "") and r.gpu != accelerator:
            skipped.append((r.name, f"it ran on {r.gpu}, the cluster to calibrate has {accelerator}"))
            continue
        try:
            predict(r, tables)
        except (ParaplanError, KeyError, ValueError) as e:
            skipped.append((r.name, str(e).strip("'")[:160]))
            continue
        ok.append(r)
    return ok, skipped


def read_run(path: str) -> Run:
    """A validate output folder as a Run (ConfigError naming the folder and what is missing)."""
    if not os.path.isdir(path):
        raise ConfigError("runs", f"{path}: no such folder", accepted=HINT)
    rp = os.path.join(path, "report.json")
    if not os.path.isfile(rp):
        raise ConfigError("runs", f"{path}: no report.json", accepted=HINT)
    try:
        with open(rp, encoding="utf-8") as f:
            rep = json.load(f)
        model = dict(rep["model"])
        cfg = GPTConfig(**model)
        plan = Plan.from_dict(rep["plan"], source=rp)
        run = {k: v for k, v in rep.get("run", {}).items() if k in RunOptions.__dataclass_fields__}
        options = RunOptions(**run)
        measured = rep["measured"]
        step = float(measured["step_time_s"])
        terms = {k: float(v) for k, v in measured["time_breakdown_s"].items()}
        steps = tuple(float(x) for x in measured.get("step_times_s") or (step,))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as e:
        raise ConfigError("runs", f"{rp}: not a validate report ({type(e).__name__}: {str(e)[:80]})",
                          accepted=HINT) from None
    if not step > 0:
        raise ConfigError("runs", f"{rp}: measured step time {step!r} is not positive", accepted=HINT)
    listed = rep.get("traces") or []
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        raise ConfigError("runs", f"{rp}: 'traces' is {shown(repr(listed), 60)}, not a list of file names", accepted=HINT)
    files = [f for f in (os.path.join(path, t) for t in listed) if os.path.isfile(f)] or \
        sorted(glob.glob(os.path.join(path, "traces", "*.json")) + glob.glob(os.path.join(path, "traces", "*.json.gz")))
    traces = tuple(read_trace(f).mean() for f in files)
    concurrency = tuple(compute_concurrency(files)) if len(files) > 1 else ()
    return Run(os.path.basename(os.path.normpath(path)), path, cfg, plan, options, step, terms, traces, steps,
               concurrency=concurrency)


def _key(run) -> str:
    if isinstance(run, RowRun):
        return run.name
    return json.dumps([run.plan.to_dict(), run.cfg.__dict__, run.options.for_plan(run.plan).global_batch],
                      sort_keys=True, default=str)


def pool_runs(runs: list[Run]) -> list[Run]:
    """Runs of the same plan, model and batch pooled into one (in the order first seen): the step is
    the median of all their timed steps, each term the median of their terms, the traces all of
    theirs. On a machine whose load drifts, repeats taken in turn with the other plans' runs give each
    plan the same mix of quiet and busy moments; leave-one-run-out then leaves the whole plan out."""
    import statistics
    groups: dict = {}
    for r in runs:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        first = group[0]
        steps = tuple(x for r in group for x in r.step_times_s)
        terms = {k: statistics.median(r.measured_terms.get(k, 0.0) for r in group) for k in first.measured_terms}
        out.append(Run(first.name, first.path, first.cfg, first.plan, first.options, statistics.median(steps), terms,
                       tuple(t for r in group for t in r.traces), steps, len(group),
                       tuple(c for r in group for c in r.concurrency),
                       tuple(x for r in group for x in (r.round_steps_s or (r.measured_step_s,)))))
    return out


def measurement_noise(runs: list) -> float | None:
    """The relative noise of a measured step, from the runs repeated in turn (:func:`pool_runs`): the
    root mean square of each repeat's step over the mean of its run's repeats, less one,
    ``sqrt(Σ (x / mean − 1)² / Σ (n − 1))`` over the runs with two repeats or more; None without
    repeats. On a shared machine it is the load's drift between the rounds (10-30 % on the 2-core
    development machine under other jobs' load), which no factor can fit and :func:`fit` weighs
    the equations against."""
    num, den = 0.0, 0
    for r in runs:
        xs = [x for x in getattr(r, "round_steps_s", ()) if x > 0]
        if len(xs) < 2:
            continue
        mean = sum(xs) / len(xs)
        num += sum((x / mean - 1.0) ** 2 for x in xs)
        den += len(xs) - 1
    return (num / den) ** 0.5 if den else None


#: two-sided ~95 % of a normal: the band :func:`resolved_error` gives
NOISE_BAND_Z = 2.0


def resolved_error(noise: float | None, repeats: int, z: float = NOISE_BAND_Z) -> float:
    """The relative error a pooled mean of ``repeats`` measured steps shows from noise alone in about
    95 % of runs: ``z · noise / sqrt(repeats)`` (the mean of n draws of relative spread σ has spread
    σ/√n; z 2 is two-sided ~95 % for a normal). A prediction inside it cannot be told apart from the
    truth by these runs. With one σ (z 1) a layout that the profile already predicts exactly falls
    outside about one run in three: seen in CI, pp2-gb4 1.0 % before, 7.4 % after, σ/√2 6.6 %."""
    return z * (noise or 0.0) / max(1, repeats) ** 0.5


def improved_or_within_noise(before: float, after: float, resolved: float) -> bool:
    """The round trip's criterion for one layout's absolute relative errors: smaller after where the
    error before exceeds what the runs resolve (:func:`resolved_error`), within that where it did not."""
    return after < before if before > resolved else after <= resolved


def round_trip_holds(errors: list[tuple[str, float, float]], resolved: float) -> tuple[bool, str]:
    """The calibration round trip's criterion over ``(layout, |error before|, |error after|)``: the mean
    error after smaller than before where the mean before exceeds what the runs resolve, within that
    where it does not (:func:`improved_or_within_noise` on the means), and no layout worse after by more
    than twice what the runs resolve (a fit that buys the others' errors with one layout's). (ok, why).

    Per layout the strict form (each error smaller) is not asserted: a fresh profile of a shared CPU
    machine predicts some layouts within the noise, and the factors, fitted on the traces' terms, trade
    between layouts whose terms the model relates more tightly than they ran (on the quiet 2-core
    machine, noise 5.1 %: pp2 over two micro-batches' pipeline transfers 0.73 of the prediction, over four
    1.00, one send/recv factor for both; docs/calibrate.md)."""
    if not errors:
        return False, "no layouts"
    before = sum(b for _, b, _ in errors) / len(errors)
    after = sum(a for _, _, a in errors) / len(errors)
    worst = max(errors, key=lambda e: e[2] - e[1])
    if worst[2] - worst[1] > 2 * resolved:
        return False, (f"{worst[0]} {100 * worst[1]:.1f} -> {100 * worst[2]:.1f} %: worse by more than twice what the "
                       f"runs resolve ({100 * resolved:.1f} %)")
    if not improved_or_within_noise(before, after, resolved):
        return False, (f"mean error {100 * before:.1f} -> {100 * after:.1f} %, the runs resolve {100 * resolved:.1f} %")
    return True, f"mean error {100 * before:.1f} -> {100 * after:.1f} % (the runs resolve {100 * resolved:.1f} %)"


def predict(run, tables: dict, factors: dict | None = None) -> dict:
    """The harness's predicted dict of ``run`` on the profile ``tables`` with ``factors`` applied (for a
    RowRun: ``step_time_s`` and the one term ``step``)."""
    if isinstance(tables, ClusterBase):
        if not isinstance(run, RowRun):
            raise ConfigError("runs", f"{run.name}: a validate folder calibrates a measured profile (--cluster local "
                              f"or profile:NAME), not the cluster {shown(tables.spec, 60)}",
                              accepted="published-run rows (--runs-csv) or training logs (--log) with a cluster")
        from paraplan.costmodels.estimate import estimate
        e = estimate(run.model, run.job, tables.cluster(run.gpus, factors), run.plan)
        return {"step_time_s": e.step_time_s, "time_breakdown_s": {"step": e.step_time_s}}
    t = dict(tables, calibration={**(tables.get("calibration") or {}), **(factors or {})})
    if isinstance(run, RowRun):
        from paraplan.costmodels.estimate import estimate
        e = estimate(run.model, run.job, cluster_from_tables(t, run.gpus, "calibrating"), run.plan)
        return {"step_time_s": e.step_time_s, "time_breakdown_s": {"step": e.step_time_s}}
    cluster = cluster_from_tables(t, run.world, "calibrating")
    return predict_on_cluster(run.cfg, run.plan, run.options, cluster)[0]


def sensitivities(run: Run, tables: dict) -> tuple[dict, dict]:
    """(base predicted dict, {knob: {term: seconds the knob multiplies}}) on ``tables``."""
    base = predict(run, tables)
    out = {}
    for k in KNOBS:
        twice = predict(run, tables, {k: 2.0})
        out[k] = {t: twice["time_breakdown_s"].get(t, 0.0) - base["time_breakdown_s"].get(t, 0.0) for t in TERMS}
    return base, out


#: the compute knobs (tied into one ``compute`` factor when no run has a trace to split the compute term)
SPLIT = ("gemm", "attention", "memory", "kernel")
#: two knobs whose columns in the equations are this collinear share one factor
COLLINEAR = 0.995


def compute_groups(shares: dict, measured: float, predicted: float, sens: dict) -> list[tuple[tuple, float]]:
    """The compute term split by a run's trace shares: [(knobs, x-target)] with, per group,
    ``Σ_k S_k (f_k − 1) = share · measured − Σ_k S_k`` (the group's measured part less its predicted
    part). Groups: gemm, attention, and the rest, memory-bound work and per-kernel costs together: a
    trace cannot tell them apart (an ATen op's self time holds its dispatch as well as its work; the
    trace's ``host`` time, autograd nodes and Python, is only part of what the profile's per-kernel cost
    measures), the runs can where their kernels move different bytes (:func:`fit` ties the two when
    they do not). What no knob multiplies (the predicted compute less every knob's part) goes with the rest."""
    groups = [(("gemm",), ("gemm",)), (("attention",), ("attention",)), (("memory", "kernel"), ("memory", "host"))]
    unscaled = predicted - sum(sens[k]["compute"] for k in SPLIT)
    out = []
    for knobs, keys in groups:
        part = sum(sens[k]["compute"] for k in knobs) + (unscaled if "memory" in knobs else 0.0)
        share = sum(shares.get(key, 0.0) for key in keys)
        if part <= 0 and share <= 0:
            continue
        out.append((knobs, share * measured - part))
    return out


@dataclass(frozen=True)
class Fit:
    """Fitted factors of the knobs the runs constrain, and why the others were not fitted."""
    factors: dict
    unconstrained: dict
    runs: tuple
    tied: tuple = ()              # groups of knobs fitted as one factor (no traces, or runs that cannot separate them)
    clamped: tuple = field(default_factory=tuple)
    noise: float | None = None    # the measurement noise the fit weighed the equations with (:func:`measurement_noise`)
    noise_assumed: bool = False   # noise is ROW_RUN_NOISE (rows or logs, none repeated), not measured


def _influence(runs, sens, k: str) -> float:
    return max(sum(abs(v) for v in sens[r.name][k].values()) / r.measured_step_s for r in runs)


def _collinear_groups(a: np.ndarray, cols: list) -> list[tuple]:
    """``cols`` grouped where their columns of ``a`` are collinear (|cos| > COLLINEAR), in order."""
    norm = np.linalg.norm(a, axis=0)
    groups: list[list] = []
    for i, k in enumerate(cols):
        for g in groups:
            j = cols.index(g[0])
            if norm[i] > 0 and norm[j] > 0 and abs(a[:, i] @ a[:, j]) / (norm[i] * norm[j]) > COLLINEAR:
                g.append(k)
                break
        else:
            groups.append([k])
    return [tuple(g) for g in groups]


def _solve(a: np.ndarray, b: np.ndarray, noise: float | None, prior: float = 1.0) -> np.ndarray:
    """x of the equations ``a x = b`` (rows in shares of a run's step), each x pulled towards 0 (its
    factor towards 1, the profile's value): the maximum a posteriori x for rows whose noise is ``noise``
    and a Gaussian prior of spread ``prior`` on each factor around 1, i.e. least squares with the ridge
    ``(noise / prior)²``; RIDGE (a numerical pull only) where the noise is not measured. A layout off from the
    others by its run's load then moves the factors as much as the runs' own spread says a layout
    can be trusted, not as far as least squares alone would take them."""
    n = a.shape[1]
    ridge = RIDGE if noise is None else max((noise / prior) ** 2, RIDGE)
    return np.linalg.lstsq(np.vstack([a, np.sqrt(ridge) * np.eye(n)]), np.concatenate([b, np.zeros(n)]), rcond=None)[0]


def fit(runs: list[Run], base: dict, sens: dict, noise: float | None = None, prior: float = 1.0) -> Fit:
    """Factors (module docstring) from ``runs`` with their base predictions and sensitivities
    (:func:`sensitivities`, keyed by run name); ``noise``: the measured steps' relative noise
    (:func:`measurement_noise`, :func:`_solve`)."""
    if not runs:
        raise ConfigError("runs", "no runs to calibrate on", accepted=HINT)
    unconstrained = {}
    knobs = []
    for k in KNOBS:
        infl = _influence(runs, sens, k)
        if infl >= MIN_INFLUENCE:
            knobs.append(k)
            continue
        if k.split(".")[0] in COMM_SOURCES:
            why = (f"no run has it ({COMM_SOURCES[k.split('.')[0]]}) or it moves no step by "
                   f"{100 * MIN_INFLUENCE:.0f} % (at most {100 * infl:.1f} %)")
        elif k == "attention":
            why = "no run ran fused attention (--attention sdpa)"
        else:
            why = f"moves no run's step by {100 * MIN_INFLUENCE:.0f} % (at most {100 * infl:.1f} %)"
        unconstrained[k] = why
    traced = any(r.trace_shares() for r in runs)
    compute = () if traced else tuple(k for k in SPLIT if k in knobs)
    cols = [k for k in knobs if k not in compute] + (["compute"] if compute else [])

    def col(r, k, term):
        if k == "compute":
            return sum(sens[r.name][j][term] for j in compute)
        return sens[r.name][k][term]
    rows, rhs = [], []
    for r in runs:
        w = 1.0 / r.measured_step_s
        p = base[r.name]["time_breakdown_s"]
        shares = r.trace_shares() if traced else None
        for term in TERMS:
            if term not in r.measured_terms or term not in p:
                continue
            m, pt = r.measured_terms[term], p[term]
            if term == "compute" and shares:
                for knobs_g, target in compute_groups(shares, m, pt, sens[r.name]):
                    rows.append([w * (sens[r.name][j]["compute"] if j in knobs_g else 0.0) for j in cols])
                    rhs.append(w * target)
                continue
            rows.append([w * col(r, j, term) for j in cols])
            rhs.append(w * (m - pt))
    factors: dict = {}
    clamped = []
    a = np.array(rows, dtype=float).reshape(len(rows), len(cols))
    groups = _collinear_groups(a, cols)
    if len(groups) < len(cols):         # knobs the runs cannot tell apart: one factor on each group
        a = np.stack([a[:, [cols.index(k) for k in g]].sum(axis=1) for g in groups], axis=1)
        cols = [g[0] for g in groups]
    members = {g[0]: tuple(j for m in g for j in (compute if m == "compute" else (m,))) for g in groups}
    if cols:
        x = _solve(a, np.array(rhs, dtype=float), noise, prior)
        for k, xi in zip(cols, x):
            f = 1.0 + float(xi)
            lo, hi = BOUNDS
            if not lo <= f <= hi:
                clamped.append(k)
                f = min(max(f, lo), hi)
            for j in members[k]:
                factors[j] = f
    tied = tuple(g for g in members.values() if len(g) > 1)
    return Fit(factors, unconstrained, tuple(r.name for r in runs), tied, tuple(clamped), noise)


@dataclass(frozen=True)
class Calibration:
    """The fit on every run, its spread, and the leave-one-run-out table."""
    fit: Fit
    spread: dict                  # knob -> (min, max) over the leave-one-out fits
    loro: tuple                   # per run: {run, measured, before, after, err_before, err_after, factors}
    base_label: str
    repeats: int = 1              # the fewest repeats of a run (pool_runs), what resolved_error divides by

    @property
    def resolved(self) -> float | None:
        """The error the runs resolve (:func:`resolved_error`), None where no repeats measured the noise."""
        if self.fit.noise is None or self.fit.noise_assumed:
            return None
        return resolved_error(self.fit.noise, self.repeats)


#: the relative scatter a published-run row or a training log's step shows against the estimator that no
#: factor of its cluster explains (the settings and layouts a row does not state): the estimator's
#: leave-one-source-out throughput error on the published runs (fitted_constants.yaml). It weighs such runs
#: when none was repeated to measure the noise (:func:`_solve`), so that a knob one row barely moves is not
#: bent to explain that row's residual
ROW_RUN_NOISE = fitted("row_run_noise")
#: how far a factor fitted to rows and logs is expected to stray from 1 (the spread of its Gaussian prior,
#: fitted_constants.yaml; the validate runs' factors keep a prior of unit spread): the ridge is
#: (ROW_RUN_NOISE / ROW_RUN_FACTOR_PRIOR)², so that a few rows of mixed models cannot bend the collectives'
#: factors to their residuals while many rows that share an offset still move the factor it belongs to
ROW_RUN_FACTOR_PRIOR = fitted("row_run_factor_prior")


def _fit_runs(runs: list, tables: dict, cache: dict) -> Fit:
    """The fit (:func:`fit`) on ``runs``, weighed by their measurement noise (:func:`measurement_noise`;
    ROW_RUN_NOISE where they are all rows or logs and none was repeated); ``cache`` holds each run's base
    prediction and sensitivities."""
    base, sens = {}, {}
    for r in runs:
        if r.name not in cache:
            cache[r.name] = sensitivities(r, tables)
        base[r.name], sens[r.name] = cache[r.name]
    noise = measurement_noise(runs)
    if noise is None and runs and all(isinstance(r, RowRun) for r in runs):
        return replace(fit(runs, base, sens, ROW_RUN_NOISE, ROW_RUN_FACTOR_PRIOR), noise_assumed=True)
    return fit(runs, base, sens, noise)


def calibrate(runs: list[Run], tables: dict, base_label: str = "local") -> Calibration:
    """Fit on all ``runs``, the spread over leave-one-out fits, and each run's leave-one-run-out error
    before (``tables`` as they are) and after (calibrated on the other runs), predicted by the estimator."""
    if not runs:
        raise ConfigError("runs", "no runs to calibrate on", accepted=HINT)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        runs = [replace(r, name=f"{r.name}#{i}") for i, r in enumerate(runs)]
    cache: dict = {}
    whole = _fit_runs(runs, tables, cache)
    loro = []
    spread: dict = {}
    if len(runs) >= 2:
        for r in runs:
            others = [o for o in runs if o is not r]
            f = _fit_runs(others, tables, cache)
            for k, v in f.factors.items():
                lo, hi = spread.get(k, (v, v))
                spread[k] = (min(lo, v), max(hi, v))
            before = cache[r.name][0]["step_time_s"]
            after = predict(r, tables, f.factors)["step_time_s"]
            m = r.measured_step_s
            loro.append({"run": r.name, "measured_s": m, "before_s": before, "after_s": after,
                         "err_before": (before - m) / m, "err_after": (after - m) / m, "factors": f.factors,
                         "unfitted": sorted(f.unconstrained)})
    return Calibration(whole, spread, tuple(loro), base_label, min(getattr(r, "repeats", 1) for r in runs))


def base_tables(spec: str = "local", db: str | None = None) -> tuple[dict | ClusterBase, str]:
    """(tables, label) of the profile ``spec`` names (``local`` or ``profile:NAME``); for a system preset
    or a cluster file, a :class:`ClusterBase` (loaded once here, so that a bad name fails now)."""
    if not is_profile_spec(spec):
        base = ClusterBase(spec)
        base.cluster()
        return base, spec
    fid, label = resolve_profile(spec, db)
    return measured_tables(db, fid), label


def calibrated_cluster_yaml(cal: Calibration, base: ClusterBase, runs: list, when: str) -> str:
    """The cluster file `paraplan calibrate --write-cluster` writes: the base (a preset as ``system``, or
    the base file's fields) with ``calibration`` = the base's factors times the fitted ones, and the fit's
    provenance (runs, spread, leave-one-run-out errors) as comments. ``--cluster FILE`` reads it back."""
    import yaml
    from paraplan.hardware.catalog import load_cluster
    from paraplan.hardware.model import COLLECTIVE_KINDS
    from paraplan.io import read_yaml
    path = base.spec
    if path.endswith((".yaml", ".yml", ".json")) or os.path.isfile(path):
        data = dict(read_yaml(path, "--cluster"))
    else:
        data = {"system": load_cluster(path).system.name}
    held = {str(k): float(v) for k, v in (data.get("calibration") or {}).items()}
    for op in COLLECTIVE_KINDS:                 # an op's one factor is both of its parts
        if op in held:
            both = held.pop(op)
            held.setdefault(f"{op}.latency", both)
            held.setdefault(f"{op}.bandwidth", both)
    for k, v in cal.fit.factors.items():
        held[k] = held.get(k, 1.0) * float(v)
    data["calibration"] = {k: round(v, 4) for k, v in sorted(held.items())}
    # each run's leave-one-run-out ln(measured / predicted): the interval of estimates on this cluster
    # (intervals.describe_interval, from MIN_CALIBRATION_RUNS runs on); a re-calibration replaces them
    data["calibration_residuals"] = [round(float(np.log(x["measured_s"] / x["after_s"])), 4) for x in cal.loro]
    lines = [f"# paraplan calibrate, {when}: {base.spec} calibrated on {len(runs)} run(s): "
             + ", ".join(r.name for r in runs)[:400],
             "# factor (spread over the leave-one-out fits) per fitted knob:"]
    for k, v in sorted(cal.fit.factors.items()):
        lo, hi = cal.spread.get(k, (v, v))
        lines.append(f"#   {k}: {v:.4f} ({lo:.4f} - {hi:.4f})")
    for k, why in sorted(cal.fit.unconstrained.items()):
        lines.append(f"#   {k}: not fitted: {why}")
    if cal.loro:
        lines.append("# leave-one-run-out step-time error, before -> after:")
        lines += [f"#   {x['run']}: {100 * x['err_before']:+.1f} -> {100 * x['err_after']:+.1f} %" for x in cal.loro]
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)


def store_calibrated(name: str, cal: Calibration, tables: dict, db: str | None = None) -> tuple[str, int]:
    """Store the base profile's rows plus one ``calibration`` row per fitted knob as machine
    ``calibrated-NAME`` (hostname NAME); (fingerprint id, run id). ConfigError when NAME is another
    machine's hostname or id."""
    store = ProfileStore(db)
    fid = f"calibrated-{name}"
    clash = [m for m in store.machines() if m["fingerprint"] != fid and name in (m["hostname"], m["fingerprint"])]
    if clash:
        raise ConfigError("--name", f"{name!r} already names machine {clash[0]['fingerprint']} "
                          f"({clash[0]['hostname']}) in {store.path}", accepted="another name")
    rows = [r for r in store.measurements(tables["run_id"]) if r["kind"] != "calibration"]
    for k, v in sorted(cal.fit.factors.items()):
        lo, hi = cal.spread.get(k, (v, v))
        rows.append({"kind": "calibration", "op": k, "device": None, "dtype": None, "world_size": None,
                     "shape": {"factor": v, "spread": [lo, hi], "runs": list(cal.fit.runs),
                               "base": f"{tables.get('fingerprint')} run {tables.get('run_id')}"},
                     "bytes": None, "flops": None, "time_s": None, "flops_per_s": None,
                     "bandwidth_bytes_per_s": None, "bus_bandwidth_bytes_per_s": None, "spread": None})
    fp = {"id": fid, "hostname": name, "cpu_model": f"calibrated from {tables.get('fingerprint')}",
          "cpu_cores": None, "torch_version": None, "gpus": []}
    run_id = store.add_run(fp, f"calibrated from {tables.get('fingerprint')} run {tables.get('run_id')}", rows)
    return fid, run_id


def factors_table(cal: Calibration) -> str:
    """Fitted factors with their leave-one-out spread, and the knobs not fitted with why."""
    lines = [f"{'knob':<24} {'factor':>8} {'spread (leave one out)':>24}"]
    for k in KNOBS:
        if k in cal.fit.factors:
            v = cal.fit.factors[k]
            lo, hi = cal.spread.get(k, (v, v))
            group = next((g for g in cal.fit.tied if k in g), ())
            tied = " (one factor with " + ", ".join(j for j in group if j != k) + ")" if group else ""
            lines.append(f"{k:<24} {v:>8.3f} {f'{lo:.3f} - {hi:.3f}':>24}{tied}")
    for k, why in cal.fit.unconstrained.items():
        lines.append(f"{k:<24} {'-':>8}   not fitted: {why}")
    if cal.fit.clamped:
        lines.append(f"clamped to {BOUNDS}: {', '.join(cal.fit.clamped)}")
    if cal.fit.noise_assumed:
        lines.append(f"rows and logs, none repeated: each weighed as scattering by {100 * cal.fit.noise:.1f} % (the "
                     "estimator's leave-one-source-out error on published runs), each factor pulled towards 1 by a "
                     f"prior of {100 * ROW_RUN_FACTOR_PRIOR:.0f} % spread (ridge (noise / prior)²)")
    elif cal.fit.noise is not None:
        lines.append(f"measurement noise (the repeats' steps about their mean): {100 * cal.fit.noise:.1f} %; "
                     f"each factor pulled towards 1 with weight noise² (a prior of unit spread)")
    return "\n".join(lines) + "\n"


def loro_verdict(err_before: float, err_after: float, resolved: float | None) -> str:
    """One run's leave-one-run-out outcome: ``smaller`` (the error after is smaller), ``within noise`` (not
    smaller, but both inside what the repeats resolve: :func:`improved_or_within_noise`), ``worse``."""
    before, after = abs(err_before), abs(err_after)
    if after < before:
        return "smaller"
    return "within noise" if resolved is not None and improved_or_within_noise(before, after, resolved) else "worse"


def loro_table(cal: Calibration) -> str:
    """Each run: measured step, predicted before and after (calibrated on the others), the errors and
    the outcome (:func:`loro_verdict`); under it, what the repeats resolve."""
    if not cal.loro:
        return "leave-one-run-out: needs two runs at least\n"
    resolved = cal.resolved
    lines = [f"{'run':<14} {'measured ms':>11} {'before ms':>10} {'after ms':>9} {'err before':>11} {'err after':>10}"
             f"  outcome"]
    for r in cal.loro:
        lines.append(f"{r['run'][:14]:<14} {1e3 * r['measured_s']:>11.1f} {1e3 * r['before_s']:>10.1f} "
                     f"{1e3 * r['after_s']:>9.1f} {100 * r['err_before']:>+10.1f}% {100 * r['err_after']:>+9.1f}%"
                     f"  {loro_verdict(r['err_before'], r['err_after'], resolved)}")
    smaller = sum(abs(r["err_after"]) < abs(r["err_before"]) for r in cal.loro)
    lines.append(f"smaller after: {smaller} of {len(cal.loro)}; " + (
        f"the repeats ({cal.repeats} of each run, noise {100 * cal.fit.noise:.1f} %) resolve {100 * resolved:.1f} %: "
        "an error inside that cannot be told from the noise" if resolved is not None else
        "no repeats: the noise is not measured (validate each layout twice, in turn, to measure it)"
        if not cal.fit.noise_assumed else "rows and logs: their noise is not measured"))
    return "\n".join(lines) + "\n"


def charged_slowdown(run: Run, tables: dict) -> tuple[float, float] | None:
    """(slowdown with every rank busy, the one the estimate charges) for ``run`` on ``tables``: the
    estimate charges 1 + (s − 1)·c, c its expected share of a rank's compute under the others'
    (:func:`paraplan.costmodels.pipeline.effective_compute_slowdown`), which the traces measure
    (``Run.concurrency``). None where the profile has no slowdown (one rank, or a GPU)."""
    if isinstance(run, RowRun):
        return None
    _, e = predict_on_cluster(run.cfg, run.plan, run.options, cluster_from_tables(tables, run.world, "calibrating"))
    s = e.details.get("compute_slowdown")
    return (s["all_ranks_busy"], s["expected"]) if s else None


def trace_vs_estimate(run: Run, tables: dict) -> tuple[StepTerms | None, dict]:
    """The run's slowest traced rank's terms and the estimate's for the same names: gemm, attention,
    host (the per-kernel costs), memory (the rest of compute) (the parts the knobs multiply,
    :func:`sensitivities`), optimizer and ``comm.<kind>``."""
    base, sens = sensitivities(run, tables)
    pb = base["time_breakdown_s"]
    pred = {k: sens[k]["compute"] for k in ("gemm", "attention")}
    pred["host"] = sens["kernel"]["compute"]
    pred["memory"] = max(0.0, pb.get("compute", 0.0) - pred["gemm"] - pred["attention"] - pred["host"])
    pred["optimizer"] = pb.get("optimizer", 0.0)
    for op in STEPS:
        t = sum(sum(sens[f"{op}.{part}"].values()) for part in ("latency", "bandwidth"))
        if t > 0:
            pred[f"comm.{op}"] = t
    slowest = max(run.traces, key=lambda t: t.span_s) if run.traces else None
    return slowest, pred
