"""``paraplan plan``: rank the fastest layouts that fit."""
from __future__ import annotations

import io
import json
import sys

import pandas as pd

from paraplan.cli.common import (add_plan_flag, check_out_path, positive_int, writing, add_scenario_args, add_search_args, scenario_from_args,
                                 topology_from_args)
from paraplan.errors import ConfigError
from paraplan.planfile import write_plan_file
from paraplan.planner.search import explain_infeasible, search, suggest_feasible, why_best_beats_runner_up
from paraplan.planner.space import SpaceOptions, parse_fix
from paraplan.planner.stages import describe_layout, stage_layout
from paraplan.reports.text import render_estimate

PLAN_SCHEMA_OUT = "paraplan.plan-search/1"


def table_rows(estimates) -> pd.DataFrame:
    """One row per ranked plan: degrees, schedule, memory and speed, for the table and CSV views."""
    rows = []
    for rank, e in enumerate(estimates, 1):
        p = e.plan
        mem = e.memory_bytes_per_gpu["total"]
        rows.append({"rank": rank, "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "sp": "y" if p.sp else "-",
                     "vpp": p.vpp, "mb": p.micro_batch, "schedule": p.schedule, "zero": p.zero,
                     "recompute": p.recompute, "offload": p.offload + ("+p" if p.offload_params else ""),
                     "step_s": round(e.step_time_s, 4), "tok/s/gpu": round(e.tokens_per_s_per_gpu, 1),
                     "mfu_%": round(100 * e.mfu, 1), "mem_GiB": round(mem / 2**30, 1),
                     "headroom_GiB": round((e.details["gpu_memory_bytes"] - mem) / 2**30, 1)})
    return pd.DataFrame(rows)


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
    if args.engine is not None:
        fixed["engine"] = args.engine
    options = SpaceOptions(fixed=fixed, allow_offload=not args.no_offload,
                           allow_delayed_update=args.allow_delayed_update,
                           grad_accumulation_fusion=args.grad_accumulation_fusion is not False)
    result = search(model, job, cluster, options=options, top=args.top,
                    max_memory_fraction=args.max_memory_fraction, progress=args.format != "json",
                    topology=topology_from_args(args, cluster.num_gpus))
    print(f"searched {result.candidates_evaluated:,} candidates in {result.search_time_s:.2f} s", file=sys.stderr)
    layout = None
    if result.best is not None and result.best.plan.pp > 1 and not args.no_stage_ilp:
        layout = stage_layout(model, job, cluster, result.best.plan, max_memory_fraction=args.max_memory_fraction)
    if args.format == "json":
        doc = {"schema": PLAN_SCHEMA_OUT, "candidates_evaluated": result.candidates_evaluated,
               "candidates_composed": result.candidates_composed, "rejected_by_reason": result.rejected_by_reason,
               "search_time_s": result.search_time_s, "plans": [e.to_dict() for e in result.plans],
               "best_stage_layout": layout.to_dict() if layout else None}
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
            print(table_rows(result.plans).to_string(index=False))
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
    add_search_args(ap, max_memory_fraction=1.0)
    ap.add_argument("--allow-delayed-update", action="store_true",
                    help="consider ZeRO-Offload's one-step delayed parameter update (weights one step stale)")
    add_plan_flag(ap, "grad_accumulation_fusion")
    add_plan_flag(ap, "engine")
    ap.add_argument("--no-stage-ilp", action="store_true",
                    help="skip the pulp stage-partition and per-stage recompute ILPs for the best plan")
    ap.add_argument("--format", choices=("table", "json", "csv"), default="table")
    ap.add_argument("--out", help="write the best plan to this plan file (JSON)")
    ap.set_defaults(func=cmd_plan)
