"""Search the plan space: score every candidate with the cost formulas over numpy arrays, drop
what does not fit, rank, and re-score the best exactly with ``estimate``.

The vectorized stage and ``estimate`` share one implementation (``costmodels.estimate.step_terms``).
Ranking is deterministic: step time, then peak memory, then the candidate's position in the
composed space (whose order depends only on the inputs); plans tied with the fastest (within the
estimator's resolution, TIE_SHARE) rank simplest first (``paraplan.planner.simplicity``).
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import Estimate, TIME_TERMS, estimate_legal, memory_terms, step_terms
from paraplan.costmodels.memory import planner_memory_limit
from paraplan.engines import spec_named
from paraplan.plan import PLAN_FIELDS, PlanBatch, is_fp8
from paraplan.planner.simplicity import TIE_SHARE, prefer_simpler, tie_limit, ties_first_simplest
from paraplan.planner.space import SpaceOptions, compose_candidates, normalize_fix, searched_switches
from paraplan.workloads.transformer import TrainingJob

CHUNK = 200_000


@dataclass(frozen=True)
class SearchResult:
    """Ranked plans (best first) and what the search did."""
    candidates_composed: int
    candidates_evaluated: int
    rejected_by_reason: dict
    search_time_s: float
    vectorized_rate_per_s: float
    plans: tuple[Estimate, ...]
    closest_infeasible: Estimate | None = None
    fastest: Estimate | None = None      # the fastest plan re-scored (ties rank the simpler first: plans[0])
    #: the best plan of each pipeline schedule that has one that fits (schedule label -> its estimate), in
    #: step-time order: the schedules side by side (``paraplan plan`` prints them with pp > 1)
    by_schedule: dict = field(default_factory=dict)

    @property
    def best(self) -> Estimate | None:
        return self.plans[0] if self.plans else None


class _Progress:
    """A progress bar on stderr, shown only once the search has run for a second."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.start, self.shown = total, enabled, time.perf_counter(), False

    def update(self, done: int) -> None:
        if not self.enabled or time.perf_counter() - self.start < 1.0:
            return
        self.shown = True
        frac = done / max(self.total, 1)
        sys.stderr.write(f"\rscoring {done:>10,}/{self.total:,} [{'#' * int(30 * frac):<30}]")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def memory_limits(terms, cluster, max_memory_fraction: float, batch=None):
    """(GPU bytes, over GPU memory, over host memory, over NVMe) per candidate, from ``terms`` (a
    :class:`~paraplan.costmodels.estimate.MemoryTerms` or ``StepTerms``). With the candidates' ``batch``
    the GPU limit is :func:`~paraplan.costmodels.memory.planner_memory_limit` (ZeRO-3 / FSDP plans keep
    the allocator-pressure headroom free besides the fraction)."""
    g = cluster.gpus_per_node
    mem = np.asarray(terms.memory["total"], float)
    limit = cluster.accelerator.memory_bytes * max_memory_fraction if batch is None else \
        planner_memory_limit(batch, cluster, max_memory_fraction)
    over_gpu = mem > limit
    over_host = np.asarray(terms.host_per_gpu * g > cluster.node_system.host_memory_bytes)
    over_nvme = np.asarray(terms.nvme_per_gpu * g > cluster.node_system.nvme_capacity_bytes)
    return mem, over_gpu, over_host, over_nvme


def score_batch(model, job, cluster, batch: PlanBatch, curves, max_memory_fraction: float):
    """Vectorized step time, memory and feasibility reasons for every candidate."""
    terms = step_terms(model, job, cluster, batch, curves)
    return (np.asarray(terms.step, float), *memory_limits(terms, cluster, max_memory_fraction, batch))


def score_fitting(model, job, cluster, batch: PlanBatch, curves, max_memory_fraction: float):
    """:func:`score_batch` with the step time priced only where the candidate fits (+inf elsewhere):
    memory first (:func:`~paraplan.costmodels.estimate.memory_terms`, a third of the cost), then the
    time terms of those that fit. Most of a large space does not fit (DeepSeek-V3 on 1024 H100: 83 %),
    so this halves the vectorized stage there; elementwise numpy gives the same step times on a subset."""
    held = memory_terms(model, job, cluster, batch)
    mem, over_gpu, over_host, over_nvme = memory_limits(held, cluster, max_memory_fraction, batch)
    step = np.full(len(batch), np.inf)
    fit = np.nonzero(~(over_gpu | over_host | over_nvme))[0]
    if fit.size:
        step[fit] = np.asarray(step_terms(model, job, cluster, batch.take(fit), curves,
                                          mem=held.take(fit, len(batch))).step, float)
    return step, mem, over_gpu, over_host, over_nvme


def with_topology(cluster, plan, topology: dict):
    """The cluster with the links each axis's groups get from the networkx placement
    (:func:`paraplan.hardware.topology.links_for_plan`)."""
    from paraplan.hardware.topology import links_for_plan   # networkx: imported only where a fabric is modelled
    links = links_for_plan(cluster, plan.tp, plan.cp, plan.dp, plan.pp, **topology)
    axis_links = {axis: (tl.intra_node, tl.inter_node) for axis, tl in links.items()}
    axis_links.setdefault("ep", axis_links.get("dp"))
    return replace(cluster, axis_links=axis_links)


def search(model, job, cluster, *, options: SpaceOptions | None = None, top: int = 10,
           max_memory_fraction: float = 1.0, curves=None, progress: bool = False,
           rescore: Callable | None = None, topology: dict | None = None) -> SearchResult:
    """Best plans for the model, job and cluster. ``rescore(plan) -> Estimate`` re-scores survivors
    (default: ``estimate_legal`` with the same curves: the candidates passed the rules already). With ``topology`` (``rail_optimized``,
    ``oversubscription``) the re-score places each plan's groups on the networkx fabric."""
    t0 = time.perf_counter()
    curves = curves or curves_for(cluster)
    batch, rejected, composed = compose_candidates(model, job, cluster, options)   # columns built per chunk
    n = len(batch)
    step = np.empty(n)
    mem = np.empty(n)
    over_gpu = np.empty(n, bool)
    over_host = np.empty(n, bool)
    over_nvme = np.empty(n, bool)
    bar = _Progress(n, progress)
    t_vec = time.perf_counter()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        step[lo:hi], mem[lo:hi], over_gpu[lo:hi], over_host[lo:hi], over_nvme[lo:hi] = score_fitting(
            model, job, cluster, batch.take(slice(lo, hi)), curves, max_memory_fraction)
        bar.update(hi)
    bar.close()
    vec_time = time.perf_counter() - t_vec
    rejected = Counter(rejected)
    for reason, mask in (("GPU memory exceeded", over_gpu), ("host memory exceeded", over_host & ~over_gpu),
                         ("NVMe capacity exceeded", over_nvme & ~over_gpu & ~over_host)):
        if mask.any():
            rejected[reason] += int(mask.sum())
    feasible = ~(over_gpu | over_host | over_nvme)
    fit = np.flatnonzero(feasible)          # sorting only what fits: the same order (DeepSeek-V3: a sixth of the sort)
    by_step = fit[np.lexsort((fit, mem[fit], step[fit]))]
    ranked = ties_first_simplest(by_step, step, batch)   # ties: the simpler layout first
    if rescore is None:
        def rescore(plan):
            c = with_topology(cluster, plan.with_dp_for(cluster.num_gpus), topology) if topology else cluster
            return estimate_legal(model, job, c, plan.with_dp_for(cluster.num_gpus), curves=curves,
                                  max_memory_fraction=max_memory_fraction)
    picks = ranked[:rescored_count(top)]
    if len(by_step) and by_step[0] not in picks:       # the fastest, which a tie may have moved down
        picks = np.append(picks, by_step[0])
    survivors = [rescore(batch.plan(int(i))) for i in picks]
    survivors = [e for e in survivors if e.feasible]
    survivors.sort(key=lambda e: (e.step_time_s, e.memory_bytes_per_gpu["total"]))
    fastest = survivors[0] if survivors else None
    survivors = prefer_simpler(survivors + fewer_switches(survivors[:top], rescore, options))
    survivors, moot = _collapse_moot_zero(survivors)
    if moot:
        rejected[MOOT_ZERO] += moot
    by_schedule = best_by_schedule(batch, ranked, rescore)
    closest = None
    if not survivors and n:
        closest = rescore(batch.plan(_least_overflow(model, job, cluster, batch, curves, mem, step,
                                                     cluster.accelerator.memory_bytes * max_memory_fraction)))
    return SearchResult(candidates_composed=composed, candidates_evaluated=n, rejected_by_reason=dict(
        sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))), search_time_s=time.perf_counter() - t0,
        vectorized_rate_per_s=n / vec_time if vec_time > 0 else float("inf"), plans=tuple(survivors[:top]),
        closest_infeasible=closest, fastest=fastest, by_schedule=by_schedule)


def fewer_switches(ranked: list, rescore: Callable, options: SpaceOptions | None) -> list:
    """The plans tied with the fastest of ``ranked`` (re-scored, fastest first) again with fewer of the engine
    switches the search turned on (every proper subset of those it used, :func:`searched_switches`), re-scored,
    those that fit. The vectorized stage tries each candidate with no switch and with every switch on where it
    runs; a switch that buys nothing there (tp overlap where TP communication hides anyway) would otherwise ride
    along, and the tie rule (simplicity.SWITCH_FIELDS) then picks the plan that uses only what pays."""
    if not ranked:
        return []
    options = options or SpaceOptions()
    fixed = normalize_fix(options.fixed)
    limit = tie_limit(ranked[0].step_time_s)
    out = []
    for e in ranked:
        if e.step_time_s >= limit:
            break
        on = [c for c in searched_switches(fixed, options, e.plan.engine_code, e.plan.dtype) if getattr(e.plan, c)]
        for mask in range(1, 2 ** len(on)):          # each non-empty set of switches turned off again
            off = {c: False for i, c in enumerate(on) if mask >> i & 1}
            variant = rescore(replace(e.plan, **off))
            if variant.feasible:
                out.append(variant)
    return out


def best_by_schedule(batch, ranked: np.ndarray, rescore: Callable) -> dict:
    """The fastest fitting candidate of each pipeline schedule (first of its schedule in ``ranked``, re-scored),
    fastest first: what the search chose between. Only where some plan pipelines (pp > 1)."""
    if len(ranked) == 0 or not np.any(np.asarray(batch.take(ranked).pp) > 1):
        return {}
    codes = np.asarray(batch.take(ranked).schedule_code)
    found = []
    for code in np.unique(codes):
        e = rescore(batch.plan(int(ranked[int(np.argmax(codes == code))])))
        if e.feasible:
            found.append(e)
    found.sort(key=lambda e: (e.step_time_s, e.memory_bytes_per_gpu["total"]))
    return {e.plan.schedule: e for e in found}


def _least_overflow(model, job, cluster, batch, curves, mem, step, cap: float) -> int:
    """The candidate closest to fitting: least memory / cap, then fastest, then first composed. Step
    times missing for candidates that did not fit (:func:`score_fitting`) are priced for the ties on
    the least ratio only."""
    ratio = mem / cap
    tied = np.nonzero(ratio == np.min(ratio))[0]
    if not tied.size:                     # NaN memory: every candidate
        tied = np.arange(len(batch))
    missing = tied[~np.isfinite(step[tied])]
    if missing.size:
        step = step.copy()
        step[missing] = np.asarray(step_terms(model, job, cluster, batch.take(missing), curves).step, float)
    return int(tied[np.lexsort((tied, step[tied]))[0]])


MOOT_ZERO = "ZeRO stage moot without data parallelism (same plan as a higher-ranked one)"
#: candidates re-scored beyond the ``top`` asked for, at most (the re-score can reorder the vectorized ranking)
RESCORE_MARGIN = 60


def rescored_count(top: int) -> int:
    """How many of the vectorized ranking's best are re-scored one by one for ``top`` plans: three times
    ``top`` (re-ranking room), but never more than RESCORE_MARGIN beyond it: a scalar estimate costs
    7-14 ms, so ``--top 1000`` re-scored 3000 plans (20-40 s) for a table whose order past the first
    hundred moves little; now 1060."""
    return top + min(2 * top, RESCORE_MARGIN)


def same_plan_key(plan) -> tuple:
    """The plan's fields, with the ZeRO stage left out where it shards over nothing.

    ZeRO partitions model states over the data-parallel group, dp·cp ranks (ZeRO paper §5; the
    generic engine's N = dp·cp): with one rank every stage keeps the whole states, so ZeRO-1, 2 and
    3 run the same layout (offload still needs a stage >= 1, kept apart by its own fields)."""
    key = {f: getattr(plan, f) for f in PLAN_FIELDS}
    if plan.dp * plan.cp == 1 and plan.zero >= 1:
        key["zero"] = "moot"
    return tuple(key.items())


def _collapse_moot_zero(ranked: list) -> tuple[list, int]:
    """Keep the first (fastest, then smallest) of plans that differ only in a moot ZeRO stage."""
    seen, out = set(), []
    for e in ranked:
        k = same_plan_key(e.plan)
        if k not in seen:
            seen.add(k)
            out.append(e)
    return out, len(ranked) - len(out)


def plan_field_changes(a, b) -> list[tuple[str, object, object]]:
    """(field, a's value, b's value) for every plan field that differs (cp_mode only where cp > 1: with
    cp = 1 it changes nothing)."""
    return [(f, getattr(a, f), getattr(b, f)) for f in PLAN_FIELDS
            if getattr(a, f) != getattr(b, f) and not (f == "cp_mode" and a.cp == 1 and b.cp == 1)]


def plan_differences(a, b) -> list[str]:
    """'field: a vs b' for every plan field that differs (:func:`plan_field_changes`)."""
    return [f"{f}: {va} vs {vb}" for f, va, vb in plan_field_changes(a, b)]


def what_step_time_does_not_show(best: Estimate, runner_up: Estimate) -> list[str]:
    """Where two plans of about equal step time differ otherwise: GPU memory held (0.5 GiB or more) and
    host memory per node (what CPU offload needs besides its PCIe / C2C traffic)."""
    gib = 2 ** 30
    out = []
    gpu = (best.memory_bytes_per_gpu["total"] - runner_up.memory_bytes_per_gpu["total"]) / gib
    if abs(gpu) >= 0.5:
        out.append(f"the {'runner-up' if gpu > 0 else 'best'} holds {abs(gpu):.1f} GiB less per GPU")
    host_best, host_next = best.host_memory_bytes_per_node / gib, runner_up.host_memory_bytes_per_node / gib
    if abs(host_best - host_next) >= 1.0:
        who = "runner-up" if host_next < host_best else "best"
        out.append(f"the {who} offloads nothing to host memory" if min(host_best, host_next) < 1.0 else
                   f"the {who} keeps {abs(host_best - host_next):.0f} GiB less in host memory per node")
    return out


def why_best_beats_runner_up(best: Estimate, runner_up: Estimate) -> str:
    """Which time terms move most between the two plans, and whether the gap is a tie (TIE_SHARE)."""
    diffs = {k: runner_up.time_breakdown_s[k] - best.time_breakdown_s[k] for k in TIME_TERMS}
    gap = runner_up.step_time_s - best.step_time_s
    share = gap / runner_up.step_time_s
    moved = sorted(((v, k) for k, v in diffs.items() if abs(v) > 1e-9), key=lambda x: -abs(x[0]))[:3]
    parts = [f"{k} {'+' if v > 0 else '−'}{abs(v):.3g} s" for v, k in moved]
    changed = plan_differences(best.plan, runner_up.plan)
    other = what_step_time_does_not_show(best, runner_up)
    tie = (f"; under {100 * TIE_SHARE:g} %, a tie at the estimator's resolution between two layouts: choose "
           "between them on what the step time does not show" + (f" ({'; '.join(other)})" if other else "")
           if share < TIE_SHARE else "")
    return (f"best is {gap:.3g} s ({100 * share:.1f}%) faster than the runner-up "
            f"({'; '.join(changed) or 'same plan'}); the runner-up pays {', '.join(parts) or 'nothing more'}{tie}")


def suggest_feasible(model, job, cluster, options: SpaceOptions | None, max_memory_fraction: float) -> list[str]:
    """The smallest changes that make the request fit: Megatron-LM's fp8 parameters where the search is
    Megatron in fp8 and did not try them (--fix fp8_param_gather=false, --no-engine-switches), more GPUs (2x-32x, counts the system accepts: whole nodes, or whole
    hosts where a node holds several), offload, shorter sequence."""
    out = []
    options = options or SpaceOptions()
    fixed = dict(options.fixed or {})
    tried = "fp8_param_gather" in searched_switches(normalize_fix(fixed), options, spec_named(fixed.get("engine")).code,
                                                    str(fixed.get("dtype", "bf16")))
    if (spec_named(fixed.get("engine")).offers("fp8_param_gather") and is_fp8(str(fixed.get("dtype", "")))
            and not fixed.get("fp8_param_gather") and not tried):
        r = search(model, job, cluster, options=replace(options, fixed={**fixed, "fp8_param_gather": True}), top=1,
                   max_memory_fraction=max_memory_fraction)
        if r.best:
            out.append(f"fp8 parameters (--fix fp8_param_gather=true, Megatron-LM's --fp8-param-gather): "
                       f"{r.best.plan.label()} ZeRO-{r.best.plan.zero} fits at {r.best.step_time_s:.3g} s/step")
    if not options.allow_offload:
        r = search(model, job, cluster, options=replace(options, allow_offload=True), top=1,
                   max_memory_fraction=max_memory_fraction)
        if r.best:
            out.append(f"allow offload: {r.best.plan.label()} ZeRO-{r.best.plan.zero} offload {r.best.plan.offload}"
                       f" fits at {r.best.step_time_s:.3g} s/step")
    for factor in (2, 4, 8, 16, 32):
        n = cluster.num_gpus * factor
        if not cluster.system.accepts_gpus(n):
            continue
        bigger = replace(cluster, num_gpus=n)
        r = search(model, job, bigger, options=options, top=1, max_memory_fraction=max_memory_fraction)
        if r.best:
            out.append(f"more GPUs: {n} ({factor}x) fits, e.g. {r.best.plan.label()} at {r.best.step_time_s:.3g} s/step")
            break
    s = job.seq_len // 2
    while s >= 256:
        shorter = TrainingJob(seq_len=s, global_batch=job.global_batch)
        r = search(model, shorter, cluster, options=options, top=1, max_memory_fraction=max_memory_fraction)
        if r.best:
            out.append(f"shorter sequence: seq_len {s} fits, e.g. {r.best.plan.label()}")
            break
        s //= 2
    return out


def explain_infeasible(result: SearchResult, cluster) -> str:
    e = result.closest_infeasible
    if e is None:
        return "no legal plan: every candidate broke a rule (" + ", ".join(result.rejected_by_reason) + ")"
    return (f"nothing fits; the closest candidate ({e.plan.label()}, ZeRO-{e.plan.zero}, recompute "
            f"{e.plan.recompute}, offload {e.plan.offload}) overflows — {e.infeasible_reason}")
