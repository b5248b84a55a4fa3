"""``paraplan estimate``: one plan -> step time, throughput and memory with their breakdowns."""
from __future__ import annotations

import json
import sys

from paraplan.cli.common import (wrap_lines, add_plan_args, add_scenario_args, check_out_path, plan_change_flags,
                                 plan_from_args, scenario_defaults_from_plan_file, scenario_from_args, topology_from_args,
                                 writing)
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.planner.nearest import fastest_fitting_plan, nearest_fitting_plans
from paraplan.planner.search import with_topology
from paraplan.reports.text import render_estimate


def cmd_estimate(args) -> int:
    """Estimate the plan the flags (or --plan FILE) describe and print it as a table or JSON; with --trace,
    also write the predicted step as a Chrome / Perfetto trace."""
    if args.trace is not None:
        check_out_path("--trace", args.trace, folder=False)
    if not (args.model and args.cluster):
        scenario_defaults_from_plan_file(args)
    if not args.model or not args.cluster:
        raise ConfigError("--model/--cluster", "both are required (or --plan FILE that names them)")
    sc = scenario_from_args(args)
    plan = plan_from_args(args)
    topology = topology_from_args(args, sc.cluster.num_gpus)
    cluster = with_topology(sc.cluster, plan.with_dp_for(sc.cluster.num_gpus), topology) if topology else sc.cluster
    job = sc.job(plan)
    e = estimate(sc.model, job, cluster, plan)
    # the changed plans are placed on the fabric each by its own groups: from the cluster before placement
    fits_with = [] if e.feasible else nearest_fitting_plans(sc.model, job, sc.cluster, plan, topology=topology)
    searched = None if e.feasible or fits_with else fastest_fitting_plan(sc.model, job, sc.cluster, plan, topology)
    if args.trace is not None:      # the file first: a reader that closes the pipe early (| head) loses nothing
        from paraplan.reports.chrome_trace import write_trace, wrote_trace_line
        with writing("--trace", args.trace):
            events = write_trace(args.trace, e)
        print(wrote_trace_line(args.trace, events), file=sys.stderr)
    if args.format == "json":
        doc = e.to_dict()
        if not e.feasible:
            doc["fits_with"] = [change_doc(f) for f in fits_with]
            if searched is not None:
                doc["fastest_fitting"] = change_doc(searched)
        print(json.dumps(doc, indent=2))
    else:
        print(wrap_lines(render_estimate(e) + fitting_lines(e, fits_with, searched)))
    return 0


def change_doc(f) -> dict:
    """One fitting change (planner.nearest.FittingChange) as JSON: the fields, the flags, step time and memory."""
    return {"change": dict(f.change), "flags": plan_change_flags(f.change), "step_time_s": f.step_time_s,
            "memory_bytes_per_gpu": f.memory_bytes}


def fitting_lines(e, fits_with, searched=None) -> str:
    """The text block under an estimate that does not fit: the nearest plans that do (planner.nearest), each as
    the flags that make it, its memory and step time against the plan's; where none of the changes tried fits,
    the fastest plan of the engine that fits on these GPUs (``searched``), or that none does."""
    if e.feasible:
        return ""
    if not fits_with:
        tried = ("\n\n  fits with: no single or paired change tried fits (recomputation, micro-batch, ZeRO stage, "
                 "memory switches, layout on the same GPUs, offload)")
        if searched is None:
            return (tried + f"; no {e.plan.engine} {e.plan.dtype} plan fits on these {e.num_gpus} GPUs "
                    "(`paraplan plan` with the same flags suggests more GPUs, offload or a shorter sequence)")
        return (tried + f"; the fastest {e.plan.engine} {e.plan.dtype} plan that fits on these GPUs "
                f"(`paraplan plan`): {plan_change_flags(searched.change)}  {searched.memory_bytes / 2**30:.1f} GiB  "
                f"{searched.step_time_s:.3g} s/step")
    width = max(len(plan_change_flags(f.change)) for f in fits_with)
    rows = [f"    {plan_change_flags(f.change):<{width}}  {f.memory_bytes / 2**30:6.1f} GiB  {f.step_time_s:.3g} s/step "
            f"({100 * (f.step_time_s / e.step_time_s - 1):+.1f} %)" for f in fits_with]
    return "\n\n  fits with (the nearest plans that fit, fastest first; each the plan with these flags):\n" + "\n".join(rows)


def register(sub) -> None:
    """Add ``estimate`` to the subparsers."""
    est = sub.add_parser("estimate", help="predict step time, throughput and memory of one plan")
    add_scenario_args(est, require=False)
    add_plan_args(est)
    est.add_argument("--format", choices=("table", "json"), default="table",
                     help="table: the breakdown as text (default); json: the estimate as one JSON document")
    est.add_argument("--trace", metavar="FILE.json", default=None,
                     help="also write the predicted step as a Chrome trace (Trace Event Format JSON): per pipeline "
                          "rank the forward, backward and recomputation of every micro-batch in the schedule's order, "
                          "the bubble, and a track per communication kind; opens in ui.perfetto.dev and "
                          "chrome://tracing beside a torch.profiler trace")
    est.set_defaults(func=cmd_estimate)
