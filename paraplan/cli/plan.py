"""``paraplan plan``: rank the fastest layouts that fit."""
from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import replace

import pandas as pd

from paraplan.cli.common import (defaulted_engine_error, wrap_lines, add_plan_flag, check_out_path, positive_int, writing, add_scenario_args, add_search_args, scenario_from_args,
                                 topology_from_args)
from paraplan import progress
from paraplan.engines import spec_named
from paraplan.errors import ConfigError
from paraplan.plan import attribute_docstrings, check_plan
from paraplan.planfile import write_plan_file
from paraplan.planner.search import (TIE_SHARE, explain_infeasible, plan_differences, search, suggest_feasible,
                                     why_best_beats_runner_up)
from paraplan.planner.simplicity import complexity, describe_complexity
from paraplan.planner.space import FIXED_WHERE_THEY_RUN, SpaceOptions, parse_fix
from paraplan.planner.stages import describe_layout, stage_layout
from paraplan.reports.text import render_estimate
from paraplan.scenario import DEFAULT_ENGINE, DEFAULT_MEMORY_FRACTION
from paraplan.workloads.transformer import params_text

PLAN_SCHEMA_OUT = "paraplan.plan-search/1"


#: Columns that tell plans apart beyond the degrees; the table view shows those that vary and
#: states the rest once under the table (CSV always has them all).
MODE_COLUMNS = ("offload", "ep", "cp_mode", "opt", "dtype", "switches")
#: the engine switches a plan row names, and how (short: the table is held to 120 columns; SWITCH_LEGEND says them
#: under the table with Megatron-LM's flags)
SWITCH_NAMES = {"tp_comm_overlap": "tpov", "grad_reduce_bf16": "bf16g", "fp8_param_gather": "fp8p",
                "ep_comm_overlap": "epov", "moe_flex_dispatch": "flex", "precision_aware_optimizer": "pao"}
SWITCH_LEGEND = {"tp_comm_overlap": "TP comm overlap (--tp-comm-overlap)",
                 "grad_reduce_bf16": "bf16 gradient buffer and reduction (--grad-reduce-in-bf16)",
                 "fp8_param_gather": "fp8 parameters (--fp8-param-gather)",
                 "ep_comm_overlap": "EP all-to-all overlap (--overlap-moe-expert-parallel-comm)",
                 "moe_flex_dispatch": "DeepEP / HybridEP dispatch (--moe-token-dispatcher-type flex)",
                 "precision_aware_optimizer": "precision-aware optimizer (--use-precision-aware-optimizer; its moments "
                                              "in the dtype --optimizer-state-dtype names)"}


def switch_text(plan) -> str:
    """The engine switches the plan turns on, as 'tpov+bf16g', or 'none'."""
    return "+".join(name for field, name in SWITCH_NAMES.items() if getattr(plan, field)) or "none"


def switch_legend(plans) -> str | None:
    """'switches: tpov TP comm overlap (--tp-comm-overlap), ...' for the switches the listed plans use."""
    used = [f for f in SWITCH_NAMES if any(getattr(e.plan, f) for e in plans)]
    return ("switches: " + "; ".join(f"{SWITCH_NAMES[f]} {SWITCH_LEGEND[f]}" for f in used)) if used else None


COMPRESSED_NOTE = ("{opt} on the data-parallel axis: chosen because it cuts the exposed gradient all-reduce "
                   "(dp_comm) on this network; assumes it trains like Adam after its uncompressed warm-up "
                   "(1-bit Adam / 0/1 Adam report matching loss, DeepSpeed), which is worth checking on your model")


def table_rows(estimates) -> pd.DataFrame:
    """One row per ranked plan: degrees, schedule, modes, memory and speed with the step time's 90 %
    interval and the plan's complexity (what ties are ranked by), for the table and CSV views."""
    rows = []
    for rank, e in enumerate(estimates, 1):
        p = e.plan
        mem = e.memory_bytes_per_gpu["total"]
        low, high = (e.prediction_interval or {}).get("step_time_s") or (float("nan"), float("nan"))
        rows.append({"rank": rank, "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "sp": "y" if p.sp else "-",
                     "vpp": p.vpp, "mb": p.micro_batch, "schedule": p.schedule, "zero": p.zero,
                     "recompute": p.recompute + (f"[{p.recompute_modules}]" if p.recompute_modules else ""), "offload": p.offload + ("+p" if p.offload_params else ""),
                     "ep": p.ep if p.etp == 1 else f"{p.ep}/etp{p.etp}",
                     "cp_mode": p.cp_mode if p.cp > 1 else "-", "opt": p.optimizer, "dtype": p.dtype,
                     "switches": switch_text(p),
                     "step_s": round(e.step_time_s, 4), "step_s_low": round(low, 4), "step_s_high": round(high, 4),
                     "tok/s/gpu": round(e.tokens_per_s_per_gpu, 1),
                     "mfu_%": round(100 * e.mfu, 1), "mem_GiB": round(mem / 2**30, 1),
                     "headroom_GiB": round(e.headroom_bytes / 2**30, 1), "complexity": int(complexity(p)),
                     **interval_columns(e)})
    return pd.DataFrame(rows)


def interval_columns(e) -> dict:
    """A plan row's 90 % interval of MFU, its p10 throughput per GPU and its evidence distance (NaN where
    the hardware has no calibration data)."""
    iv = getattr(e, "prediction_interval", None) or {}
    nan = float("nan")
    lo, hi = iv.get("mfu", (nan, nan))
    p10 = iv.get("tokens_per_s_p10", nan) / e.num_gpus
    return {"mfu_lo90_%": round(100 * lo, 1), "mfu_hi90_%": round(100 * hi, 1), "tok/s/gpu_p10": round(p10, 1),
            "evidence": round(iv.get("evidence_distance", nan), 2)}


#: what ``--rank-by`` orders the plans by (each estimate's throughput: its median, or the low end)
RANK_BY = ("median", "p10")
#: plans the search returns for ``--rank-by p10`` to re-rank, as a multiple of --top (the search ranks by median)
P10_RERANK_POOL = 3


def rank_plans(plans, rank_by: str):
    """The plans ordered by ``rank_by``: ``median`` keeps the search's order (predicted throughput);
    ``p10`` orders by the throughput the plan reaches with 90 % probability under its interval (plans
    without one keep their median), ties kept in the search's order."""
    if rank_by == "median":
        return tuple(plans)
    key = [(e.prediction_interval or {}).get("tokens_per_s_p10", e.tokens_per_s) for e in plans]
    order = sorted(range(len(plans)), key=lambda i: -key[i])
    return tuple(plans[i] for i in order)


def uncertainty_notes(plans) -> list[str]:
    """Notes on the ranking's uncertainty: the plans below rank 1 whose throughput lies inside rank 1's
    90 % interval (their order is within the model's error), and a rank 1 outside the calibration
    evidence while a plan inside it lies within rank 1's interval."""
    if len(plans) < 2:
        return []
    top = plans[0]
    iv = top.prediction_interval or {}
    if "tokens_per_s" not in iv:
        return []
    low, high = iv["tokens_per_s"]
    within = [r for r, e in enumerate(plans[1:], 2) if e.tokens_per_s >= low]
    notes = []
    if within:
        ranks = f"rank {within[0]}" if len(within) == 1 else f"ranks {within[0]}-{within[-1]}" \
            if within == list(range(within[0], within[-1] + 1)) else "ranks " + ", ".join(map(str, within))
        notes.append(f"{ranks} lie{'s' if len(within) == 1 else ''} within rank 1's 90% interval "
                     f"({low / top.num_gpus:.0f}-{high / top.num_gpus:.0f} tokens/s per GPU): the top plans differ by "
                     "less than the model's uncertainty")
    outside = iv.get("extrapolating") or []
    if outside:
        inside = [r for r, e in enumerate(plans[1:], 2) if e.tokens_per_s >= low
                  and not (e.prediction_interval or {}).get("extrapolating")]
        if inside:
            e = plans[inside[0] - 1]
            notes.append(f"rank 1 lies outside the calibration evidence ({'; '.join(n.removeprefix('extrapolating: ') for n in outside)}); "
                         f"rank {inside[0]} lies within it (evidence distance {e.prediction_interval.get('evidence_distance', 0):.2f} "
                         f"against {iv.get('evidence_distance', 0):.2f}) and within rank 1's 90% interval: the safer pick")
    return notes


#: Columns of the table view, in order (CSV has every column of table_rows), and the names they print under
TABLE_COLUMNS = {"rank": "rank", "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "sp": "sp", "vpp": "vpp", "mb": "mb",
                 "schedule": "schedule", "zero": "zero", "recompute": "recompute", "offload": "offload", "ep": "ep",
                 "cp_mode": "cp_mode", "opt": "opt", "dtype": "dtype", "switches": "switches", "step_s": "step_s",
                 "interval": "90%_range", "tok/s/gpu": "tok/s/gpu", "mfu_%": "mfu_%", "mem_GiB": "mem_GiB",
                 "evidence": "evid", "complexity": "cplx"}


def significant(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, without an exponent (65.22 -> 65.2, 0.4831 -> 0.483, 1234 ->
    1230): the estimator resolves 1.5 % (TIE_SHARE), so a fourth figure says nothing; '-' for NaN."""
    if not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, decimals):.{max(decimals, 0)}f}"


def format_columns(view: pd.DataFrame) -> str:
    """A DataFrame of strings and numbers as text: each column as wide as its longest cell, right-aligned,
    one space between (pandas' to_string pads every column two wide, which pushed the plan table past 120)."""
    cells = [[str(c) for c in view.columns]] + [[str(v) for v in row] for row in view.itertuples(index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(view.columns))]
    return "\n".join(" " + " ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def render_table(df: pd.DataFrame) -> str:
    """The table: step times to 3 significant figures with their 90 % interval, the mode columns that are
    the same in every row moved to one line below it, the headroom left to the CSV (the header states the
    memory limit)."""
    view = df.copy()
    for column in ("step_s", "step_s_low", "step_s_high"):
        if column in view:
            view[column] = [significant(v) for v in view[column]]
    if "step_s_low" in view:
        view["interval"] = [f"{lo}-{hi}" if lo != "-" else "-" for lo, hi in zip(view["step_s_low"], view["step_s_high"])]
    if "tok/s/gpu" in view:
        view["tok/s/gpu"] = [f"{v:.0f}" if v >= 100 else significant(v) for v in view["tok/s/gpu"]]
    if "evidence" in view:       # '-' where the hardware has no calibration data (no interval either)
        view["evidence"] = [f"{v:.2f}" if math.isfinite(v) else "-" for v in view["evidence"]]
    same = [c for c in MODE_COLUMNS if c in view and view[c].nunique() == 1]
    columns = [c for c in TABLE_COLUMNS if c in view and c not in same]
    text = format_columns(view[columns].rename(columns=TABLE_COLUMNS))
    if same:
        text += "\nevery plan above: " + ", ".join(f"{c} {view[c].iloc[0]}" for c in same)
    return text


def _dp_comm_share(e) -> float:
    """Exposed data-parallel communication as a share of the step."""
    return e.time_breakdown_s.get("dp_comm", 0.0) / e.step_time_s


def plan_notes(plans, options: SpaceOptions, compressed_best=None) -> list[str]:
    """Why a compressed optimizer was chosen (and what that assumes); or, where none was considered
    and the exposed gradient all-reduce is a large share of the step, what allowing them would give
    (``compressed_best``: the best plan of the same search with them allowed)."""
    notes = [COMPRESSED_NOTE.format(opt=opt) for opt in sorted({e.plan.optimizer for e in plans} - {"adam"})]
    if plans and compressed_best is not None and compressed_best.plan.optimizer != "adam":
        best = plans[0]
        notes.append(f"exposed dp_comm is {100 * _dp_comm_share(best):.0f}% of the best plan's step; compressed "
                     "optimizers were not considered because they change the optimizer's numerics; with "
                     f"--allow-compressed-optimizers the best plan would use {compressed_best.plan.optimizer} at "
                     f"{compressed_best.step_time_s:.4g} s/step ({best.step_time_s / compressed_best.step_time_s:.2f}x "
                     "faster)")
    return notes


def fixed_where_they_run_notes(plans, fixed, model, job, cluster) -> list[str]:
    """For each --fix of planner.space.FIXED_WHERE_THEY_RUN that some listed plans run without: which ranks, and the
    rule that keeps the first of them from it (check_plan's message), so a pinned switch the top plan
    does not use is said, not silently dropped."""
    notes = []
    for key, switch in FIXED_WHERE_THEY_RUN.items():
        off, pin = switch.off, switch.pin_hint
        if fixed.get(key) in (None, off):
            continue
        without = [i + 1 for i, e in enumerate(plans) if getattr(e.plan, key) == off]
        if not without:
            continue
        first = plans[without[0] - 1].plan
        try:
            check_plan(replace(first, **{key: fixed[key]}), model, job, cluster)
            reason = "it is legal there but was not kept"
        except ConfigError as err:
            reason = err.problem
        value = str(fixed[key]).lower() if isinstance(fixed[key], bool) else fixed[key]
        ranks = ", ".join(str(r) for r in without)
        notes.append(f"--fix {key}={value} holds only where a plan can run it; rank{'s' if len(without) > 1 else ''} "
                     f"{ranks} run{'' if len(without) > 1 else 's'} without it (rank {without[0]}: {reason}); add "
                     f"{pin} to rank only plans that run it")
    return notes


def compressed_alternative(result, model, job, cluster, options: SpaceOptions, args):
    """The best plan with compressed optimizers allowed, searched only where they could matter: they
    were neither allowed nor pinned, and the best plan's exposed dp_comm is at least 10% of its step."""
    if (result.best is None or options.allow_compression or "optimizer" in (options.fixed or {})
            or _dp_comm_share(result.best) < 0.10):
        return None
    return search(model, job, cluster, options=replace(options, allow_compression=True), top=1,
                  max_memory_fraction=args.max_memory_fraction, topology=topology_from_args(args)).best


#: reasons for rejected candidates the table view names (the rest are counted; JSON lists them all)
REJECTED_SHOWN = 4


def engine_line(engine: str) -> str:
    """What the engine a search ran for is: a real engine's name and codebase, or what generic stands for."""
    spec = spec_named(engine)
    if spec.codebase is None:
        return ("engine generic: the ZeRO paper's accounting with no engine's restrictions; no engine runs these plans "
                "as such (--engine megatron|deepspeed|torchtitan|scaling plans for one)")
    default = ", the default: --engine picks another" if engine == DEFAULT_ENGINE else ""
    return f"engine {engine} ({spec.title}{default}): only the layouts it runs are proposed"


def rejected_lines(rejected: dict) -> str:
    """The rejected candidates as a short ranked list: the REJECTED_SHOWN most common reasons, then how many
    reasons and candidates more (``--format json`` has every reason)."""
    items = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(v for _, v in items)
    lines = [f"rejected candidates: {total:,}, by reason"]
    lines += [f"  {v:>12,}  {k}" for k, v in items[:REJECTED_SHOWN]]
    rest = items[REJECTED_SHOWN:]
    if rest:
        lines.append(f"  {sum(v for _, v in rest):>12,}  for {len(rest)} more reason{'s' * (len(rest) > 1)} "
                     "(--format json lists each)")
    return "\n".join(lines)


def wrote_line(path: str, best) -> str:
    """The line --out prints: where the plan file is, what it holds and how to launch it."""
    p = best.plan
    target = p.engine if spec_named(p.engine).export else DEFAULT_ENGINE
    return (f"paraplan: wrote {path} (plan file: {p.label()}, {p.schedule}, ZeRO-{p.zero}, {p.engine}; "
            f"paraplan export {path} --to {target} launches it)")


def why_line(plans, fastest) -> str:
    """Why the first plan ranks first: it beats the runner-up (its time terms, or a tie at the estimator's
    resolution), or, where a faster plan is tied with it, it is the simpler of the two (TIE_SHARE,
    paraplan.planner.simplicity)."""
    best = plans[0]
    if fastest is None or fastest.step_time_s >= best.step_time_s:
        line = why_best_beats_runner_up(best, plans[1])
        if plans[1].step_time_s * (1 - TIE_SHARE) < best.step_time_s:
            line += (f"; ties rank the simpler first (best: {describe_complexity(best.plan)}; runner-up: "
                     f"{describe_complexity(plans[1].plan)})")
        return line
    gap = best.step_time_s - fastest.step_time_s
    where = f"rank {plans.index(fastest) + 1}" if fastest in plans else "not listed"
    saves = sorted(((best.time_breakdown_s[k] - fastest.time_breakdown_s[k], k) for k in best.time_breakdown_s
                    if abs(best.time_breakdown_s[k] - fastest.time_breakdown_s[k]) > 1e-9), key=lambda x: -abs(x[0]))[:3]
    return (f"best is {gap:.3g} s ({100 * gap / best.step_time_s:.1f}%) slower than the fastest plan ({where}: "
            f"{'; '.join(plan_differences(best.plan, fastest.plan)) or 'same plan'}; best pays "
            f"{', '.join(f'{k} {chr(43) if v > 0 else chr(8722)}{abs(v):.3g} s' for v, k in saves)}): under "
            f"{100 * TIE_SHARE:g} %, a tie at the estimator's resolution, which goes to the simpler layout (best: "
            f"{describe_complexity(best.plan)}; fastest: {describe_complexity(fastest.plan)}; ties order by complexity, "
            "then fewer vpp and cp, then step time)")


def schedule_lines(by_schedule: dict) -> list[str]:
    """The best plan of each pipeline schedule, fastest first: step time, its bubble, exposed expert
    all-to-all and pipeline transfers, memory, and the rest of the plan (``SearchResult.by_schedule``)."""
    if len(by_schedule) < 2:
        return []
    rows = [("schedule", "step_s", "bubble_s", "ep_a2a_s", "pp_p2p_s", "mem_GiB", "plan")]
    for label, e in by_schedule.items():
        t, p = e.time_breakdown_s, e.plan
        rest = (f"tp {p.tp} pp {p.pp} dp {p.dp}" + (f" cp {p.cp}" if p.cp > 1 else "") + (f" vpp {p.vpp}" if p.vpp > 1 else "")
                + (f" ep {p.ep}" if p.ep > 1 else "") + f" mb {p.micro_batch} ZeRO-{p.zero} {p.recompute}"
                + (f" {switch_text(p)}" if switch_text(p) != "none" else ""))
        rows.append((label, f"{e.step_time_s:.2f}", f"{t['pp_bubble']:.3f}", f"{t['ep_comm']:.3f}", f"{t['pp_comm']:.3f}",
                     f"{e.memory_bytes_per_gpu['total'] / 2**30:.1f}", rest))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return (["schedules side by side (the best plan of each that fits; --fix schedule=NAME ranks one):"]
            + ["  " + "  ".join(c.rjust(w) if 0 < i < 6 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
               for r in rows])


def cmd_plan(args) -> int:
    """Search, print the ranked plans (table, JSON or CSV), write the best to --out; 3 if none fits."""
    if args.top < 1:
        raise ConfigError("--top", f"must be at least 1, got {args.top}")
    if not 0.01 <= args.max_memory_fraction <= 1:
        raise ConfigError("--max-memory-fraction", f"must be in [0.01, 1], got {args.max_memory_fraction}")
    if args.out is not None:
        check_out_path("--out", args.out, folder=False)
    if args.trace is not None:
        check_out_path("--trace", args.trace, folder=False)
    sc = scenario_from_args(args)
    model, cluster, job = sc.model, sc.cluster, sc.job()
    seq_len, gbs = job.seq_len, job.global_batch
    fixed = parse_fix(args.fix)
    for key in ("engine", "dtype"):   # search constraints: the search proposes only plans with them
        if getattr(args, key) is not None:
            fixed[key] = getattr(args, key)
    engine_given = "engine" in fixed
    fixed.setdefault("engine", DEFAULT_ENGINE)   # the commands' engine: only what it runs is proposed
    options = SpaceOptions(fixed=fixed, allow_offload=not args.no_offload,
                           allow_delayed_update=args.allow_delayed_update,
                           allow_compression=args.allow_compressed_optimizers,
                           grad_accumulation_fusion=args.grad_accumulation_fusion is not False,
                           engine_switches=not args.no_engine_switches)
    rank_by = getattr(args, "rank_by", "median")
    pool = args.top if rank_by == "median" else min(1000, P10_RERANK_POOL * args.top)
    try:
        result = search(model, job, cluster, options=options, top=pool,
                        max_memory_fraction=args.max_memory_fraction, progress=args.format != "json",
                        topology=topology_from_args(args, cluster.num_gpus))
    except ConfigError as e:
        raise e if engine_given else defaulted_engine_error(e) from None
    result = replace(result, plans=rank_plans(result.plans, rank_by)[:args.top])
    print(f"searched {result.candidates_evaluated:,} candidates in {result.search_time_s:.2f} s", file=sys.stderr)
    notes = plan_notes(result.plans, options, compressed_alternative(result, model, job, cluster, options, args)) \
        + fixed_where_they_run_notes(result.plans, fixed, model, job, cluster) + uncertainty_notes(result.plans)
    layout = None
    if result.best is not None and result.best.plan.pp > 1 and not args.no_stage_ilp:
        with progress.step(f"balancing {result.best.plan.pp} pipeline stages and per-stage recomputation"):
            layout = stage_layout(model, job, cluster, result.best.plan, max_memory_fraction=args.max_memory_fraction)
    if args.out and result.plans:        # the file first: a reader that closes the pipe early (| head) loses nothing
        with writing("--out", args.out):
            write_plan_file(args.out, result.best, args.model, args.cluster)
        print(wrote_line(args.out, result.best), file=sys.stderr)
    if args.trace and result.plans:
        from paraplan.reports.chrome_trace import write_trace, wrote_trace_line
        with writing("--trace", args.trace):
            events = write_trace(args.trace, result.best)
        print(wrote_trace_line(args.trace, events), file=sys.stderr)
    if args.format == "json":
        doc = {"schema": PLAN_SCHEMA_OUT, "model": model.name, "model_params": model.num_params,
               "model_active_params": model.active_params, "model_approximated": list(model.approximated),
               "candidates_evaluated": result.candidates_evaluated,
               "candidates_composed": result.candidates_composed, "rejected_by_reason": result.rejected_by_reason,
               "search_time_s": result.search_time_s, "plans": [e.to_dict() for e in result.plans],
               "best_stage_layout": layout.to_dict() if layout else None,
               "notes": notes}
        if not result.plans:
            doc["infeasible_reason"] = explain_infeasible(result, cluster)
            doc["suggestions"] = suggest_feasible(model, job, cluster, options, args.max_memory_fraction)
        print(json.dumps(doc, indent=2))
    elif args.format == "csv":
        buf = io.StringIO()
        table_rows(result.plans).to_csv(buf, index=False)
        print(buf.getvalue(), end="")
    else:
        out = [f"paraplan plan — {model.name} ({params_text(model.num_params, model.active_params)}) on {cluster.name} "
               f"x {cluster.num_gpus}, seq {seq_len}, global batch {gbs}",
               engine_line(fixed["engine"]),
               f"{result.candidates_evaluated:,} legal candidates of {result.candidates_composed:,} composed; memory "
               f"limit {args.max_memory_fraction * cluster.accelerator.memory_bytes / 2**30:.1f} of "
               f"{cluster.accelerator.memory_bytes / 2**30:.0f} GiB per GPU (--max-memory-fraction "
               f"{args.max_memory_fraction:g})"]
        table = render_table(table_rows(result.plans)) if result.plans else None
        side = None
        if result.plans:
            legend = switch_legend(result.plans)
            out += [table] + ([legend] if legend else []) + [f"note: {note}" for note in notes]
            side = "\n".join(schedule_lines(result.by_schedule))
            out += ["", side] if side else []
            out += ["", "best plan", render_estimate(result.best)]
            if len(result.plans) > 1:
                out += ["", "why: " + why_line(result.plans, result.fastest)]
            if layout:
                out += ["", describe_layout(layout, len(layout.layer_names))]
        else:
            out.append(explain_infeasible(result, cluster))
            out += ["  would fit: " + s for s in suggest_feasible(model, job, cluster, options, args.max_memory_fraction)]
        out += ["", rejected_lines(result.rejected_by_reason)]
        print("\n".join(block if block is table or block is side else wrap_lines(block) for block in out))
    if args.out and not result.plans:
        raise ConfigError("--out", "no plan fits, nothing to write")
    return 0 if result.plans else 3


def register(sub) -> None:
    """Add ``plan`` to the subparsers."""
    ap = sub.add_parser("plan", help="search the layout space for the fastest plans that fit")
    add_scenario_args(ap)
    ap.add_argument("--top", type=positive_int("--top", maximum=1000), default=10,
                    help="plans to rank and show (1-1000)")
    ap.add_argument("--rank-by", choices=RANK_BY, default="median",
                    help="order the plans by their predicted throughput (median, default) or by the low end of "
                         "its uncertainty (p10: the throughput reached with 90%% probability under the plan's "
                         "interval, which widens away from the calibration evidence); benchmarks/loso.py measured "
                         "median's picks no less safe on held-out sources")
    add_search_args(ap, max_memory_fraction=DEFAULT_MEMORY_FRACTION)
    ap.add_argument("--allow-compressed-optimizers", action="store_true",
                    help="consider 1-bit Adam, 0/1 Adam and 1-bit LAMB (DeepSpeed; they compress the gradient "
                         "all-reduce and change the optimizer's numerics); --fix optimizer=NAME pins one")
    ap.add_argument("--no-engine-switches", action="store_true",
                    help=attribute_docstrings(SpaceOptions)["engine_switches"].replace("\n", " "))
    ap.add_argument("--allow-delayed-update", action="store_true",
                    help="consider ZeRO-Offload's one-step delayed parameter update (weights one step stale)")
    add_plan_flag(ap, "grad_accumulation_fusion")
    add_plan_flag(ap, "engine")
    add_plan_flag(ap, "dtype")
    ap.add_argument("--no-stage-ilp", action="store_true",
                    help="skip balancing the best plan's pipeline stages and per-stage recomputation")
    ap.add_argument("--format", choices=("table", "json", "csv"), default="table",
                    help="table: the ranked plans and the best one's breakdown (default); json: the search and "
                         "every plan's estimate as one JSON document; csv: one row per ranked plan")
    ap.add_argument("--out", help="write the best plan to this plan file (JSON)")
    ap.add_argument("--trace", metavar="FILE.json", default=None,
                    help="write the best plan's predicted step as a Chrome trace (as estimate --trace)")
    ap.set_defaults(func=cmd_plan)
