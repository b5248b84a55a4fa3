"""``paraplan estimate``: one plan -> step time, throughput and memory with their breakdowns."""
from __future__ import annotations

import json
import sys

from paraplan.cli.common import (wrap_lines, add_plan_args, add_scenario_args, check_out_path, plan_from_args,
                                 scenario_defaults_from_plan_file, scenario_from_args, topology_from_args, writing)
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
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
    cluster = sc.cluster
    topology = topology_from_args(args, cluster.num_gpus)
    if topology:
        cluster = with_topology(cluster, plan.with_dp_for(cluster.num_gpus), topology)
    e = estimate(sc.model, sc.job(plan), cluster, plan)
    if args.trace is not None:      # the file first: a reader that closes the pipe early (| head) loses nothing
        from paraplan.reports.chrome_trace import write_trace, wrote_trace_line
        with writing("--trace", args.trace):
            events = write_trace(args.trace, e)
        print(wrote_trace_line(args.trace, events), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(e.to_dict(), indent=2))
    else:
        print(wrap_lines(render_estimate(e)))
    return 0


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
