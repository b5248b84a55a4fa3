"""``paraplan estimate``: one plan -> step time, throughput and memory with their breakdowns."""
from __future__ import annotations

import json

from paraplan.cli.common import (wrap_lines, add_plan_args, add_scenario_args, plan_from_args, scenario_defaults_from_plan_file,
                                 scenario_from_args, topology_from_args)
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.planner.search import with_topology
from paraplan.reports.text import render_estimate


def cmd_estimate(args) -> int:
    """Estimate the plan the flags (or --plan FILE) describe and print it as a table or JSON."""
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
    est.set_defaults(func=cmd_estimate)
