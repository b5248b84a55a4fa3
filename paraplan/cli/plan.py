"""``paraplan plan``: rank the fastest layouts that fit."""
from __future__ import annotations

import io
import json
import sys
from dataclasses import replace

import pandas as pd

from paraplan.cli.common import (add_plan_flag, check_out_path, positive_int, writing, add_scenario_args, add_search_args, scenario_from_args,
                                 topology_from_args)
from paraplan import progress
from paraplan.errors import ConfigError
from paraplan.plan import check_plan
from paraplan.planfile import write_plan_file
from paraplan.planner.search import explain_infeasible, search, suggest_feasible, why_best_beats_runner_up
from paraplan.planner.space import FIXED_WHERE_THEY_RUN, SpaceOptions, parse_fix
from paraplan.planner.stages import describe_layout, stage_layout
from paraplan.reports.text import render_estimate
from paraplan.scenario import DEFAULT_PLAN_MEMORY_FRACTION

PLAN_SCHEMA_OUT = "paraplan.plan-search/1"


#: Columns that tell plans apart beyond the degrees; the table view shows those that vary and
#: states the rest once under the table (CSV always has them all).
MODE_COLUMNS = ("ep", "cp_mode", "opt", "dtype")
COMPRESSED_NOTE = ("{opt} on the data-parallel axis: chosen because it cuts the exposed gradient all-reduce "
                   "(dp_comm) on this network; assumes it trains like Adam after its uncompressed warm-up "
                   "(1-bit Adam / 0/1 Adam report matching loss, DeepSpeed), which is worth checking on your model")


def table_rows(estimates) -> pd.DataFrame:
    """One row per ranked plan: degrees, schedule, modes, memory and speed, for the table and CSV views."""
    rows = []
    for rank, e in enumerate(estimates, 1):
        p = e.plan
        mem = e.memory_bytes_per_gpu["total"]
        rows.append({"rank": rank, "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "sp": "y" if p.sp else "-",
                     "vpp": p.vpp, "mb": p.micro_batch, "schedule": p.schedule, "zero": p.zero,
                     "recompute": p.recompute + (f"[{p.recompute_modules}]" if p.recompute_modules else ""), "offload": p.offload + ("+p" if p.offload_params else ""),
                     "ep": p.ep if p.etp == 1 else f"{p.ep}/etp{p.etp}",
                     "cp_mode": p.cp_mode if p.cp > 1 else "-", "opt": p.optimizer, "dtype": p.dtype,
                     "step_s": round(e.step_time_s, 4), "tok/s/gpu": round(e.tokens_per_s_per_gpu, 1),
                     "mfu_%": round(100 * e.mfu, 1), "mem_GiB": round(mem / 2**30, 1),
                     "headroom_GiB": round(e.headroom_bytes / 2**30, 1)})
    return pd.DataFrame(rows)


def render_table(df: pd.DataFrame) -> str:
    """The table with the mode columns that are the same in every row moved to one line below it."""
    same = [c for c in MODE_COLUMNS if c in df and df[c].nunique() == 1]
    text = df.drop(columns=same).to_string(index=False)
    if same:
        text += "\nevery plan above: " + ", ".join(f"{c} {df[c].iloc[0]}" for c in same)
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


def cmd_plan(args) -> int:
    """Search, print the ranked plans (table, JSON or CSV), write the best to --out; 3 if none fits."""
    if args.top < 1:
        raise ConfigError("--top", f"must be at least 1, got {args.top}")
    if not 0.01 <= args.max_memory_fraction <= 1:
        raise ConfigError("--max-memory-fraction", f"must be in [0.01, 1], got {args.max_memory_fraction}")
    if args.out is not None:
        check_out_path("--out", args.out, folder=False)
    sc = scenario_from_args(args)
    model, cluster, job = sc.model, sc.cluster, sc.job()
    seq_len, gbs = job.seq_len, job.global_batch
    fixed = parse_fix(args.fix)
    for key in ("engine", "dtype"):   # search constraints: the search proposes only plans with them
        if getattr(args, key) is not None:
            fixed[key] = getattr(args, key)
    options = SpaceOptions(fixed=fixed, allow_offload=not args.no_offload,
                           allow_delayed_update=args.allow_delayed_update,
                           allow_compression=args.allow_compressed_optimizers,
                           grad_accumulation_fusion=args.grad_accumulation_fusion is not False)
    result = search(model, job, cluster, options=options, top=args.top,
                    max_memory_fraction=args.max_memory_fraction, progress=args.format != "json",
                    topology=topology_from_args(args, cluster.num_gpus))
    print(f"searched {result.candidates_evaluated:,} candidates in {result.search_time_s:.2f} s", file=sys.stderr)
    notes = plan_notes(result.plans, options, compressed_alternative(result, model, job, cluster, options, args)) \
        + fixed_where_they_run_notes(result.plans, fixed, model, job, cluster)
    layout = None
    if result.best is not None and result.best.plan.pp > 1 and not args.no_stage_ilp:
        with progress.step(f"balancing {result.best.plan.pp} pipeline stages and per-stage recomputation"):
            layout = stage_layout(model, job, cluster, result.best.plan, max_memory_fraction=args.max_memory_fraction)
    if args.format == "json":
        doc = {"schema": PLAN_SCHEMA_OUT, "candidates_evaluated": result.candidates_evaluated,
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
        print(f"paraplan plan — {model.name} on {cluster.name} x {cluster.num_gpus}, seq {seq_len}, "
              f"global batch {gbs}: {result.candidates_evaluated:,} legal candidates of "
              f"{result.candidates_composed:,} composed")
        if result.plans:
            print(render_table(table_rows(result.plans)))
            for note in notes:
                print(f"note: {note}")
            print()
            print("best plan")
            print(render_estimate(result.best))
            if len(result.plans) > 1:
                print()
                print("why: " + why_best_beats_runner_up(result.plans[0], result.plans[1]))
            if layout:
                print()
                print(describe_layout(layout, len(layout.layer_names)))
        else:
            print(explain_infeasible(result, cluster))
            for s in suggest_feasible(model, job, cluster, options, args.max_memory_fraction):
                print("  would fit: " + s)
        print()
        print("rejected candidates: " + ", ".join(f"{k} {v:,}" for k, v in result.rejected_by_reason.items()))
    if args.out:
        if not result.plans:
            raise ConfigError("--out", "no plan fits, nothing to write")
        with writing("--out", args.out):
            write_plan_file(args.out, result.best, args.model, args.cluster)
    return 0 if result.plans else 3


def register(sub) -> None:
    """Add ``plan`` to the subparsers."""
    ap = sub.add_parser("plan", help="search the layout space for the fastest plans that fit")
    add_scenario_args(ap)
    ap.add_argument("--top", type=positive_int("--top", maximum=1000), default=10,
                    help="plans to rank and show (1-1000)")
    add_search_args(ap, max_memory_fraction=DEFAULT_PLAN_MEMORY_FRACTION)
    ap.add_argument("--allow-compressed-optimizers", action="store_true",
                    help="consider 1-bit Adam, 0/1 Adam and 1-bit LAMB (DeepSpeed; they compress the gradient "
                         "all-reduce and change the optimizer's numerics); --fix optimizer=NAME pins one")
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
    ap.set_defaults(func=cmd_plan)
