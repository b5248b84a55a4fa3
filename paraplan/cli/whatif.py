"""``paraplan whatif``: sweep one or two scenario variables, write figures, CSV and an HTML report."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from paraplan.cli.common import (defaulted_engine_error, add_plan_args, check_out_path, writing, add_scenario_args, add_search_args, number, plan_flags_given,
                                 plan_from_args, scenario_defaults_from_plan_file)
from paraplan.planner.space import parse_fix
from paraplan.errors import ConfigError
from paraplan.reports.sweep import MAX_PRICE, MIN_PRICE, Scenario, load_scenario, parse_sweep
from paraplan.scenario import DEFAULT_ENGINE

EPILOG = """sweep variables: gpus, seq_len, global_batch, cluster, inter_node_bandwidth (GB/s per GPU),
intra_node_bandwidth (GB/s per GPU), hbm (GiB), host_link_bandwidth (GB/s per GPU and direction: what
offload moves over), power_limit (W per GPU, at most the part's rated power), offload (none, cpu, nvme,
auto), attention_kernel.
values: lists 64,128,256; ranges 2k..128k (the ends and every power of two between, k = 1024);
multipliers x0.5,x1,x2 (of the base value). Example:
  paraplan whatif --model gpt3-175b --cluster dgx-a100-80g --seq-len 2048 --global-batch 1536 \\
      --sweep gpus=64..4096 --price-per-gpu-hour 2 --train-tokens 300e9 --out report-gpt3"""


def scenario_from_cli(args):
    """The scenario the flags (or --scenario FILE) describe, with the commands' default engine where they name
    none (:func:`scenario_and_engine_default`)."""
    return scenario_and_engine_default(args)[0]


def scenario_and_engine_default(args) -> tuple[Scenario, bool]:
    """(the scenario with the default engine where it names none, whether it named none)."""
    scenario = _scenario_as_given(args)
    defaulted = "engine" not in (scenario.plan if scenario.plan is not None else scenario.fixed)
    return _default_engine(scenario), defaulted


def _scenario_as_given(args):
    """Scenario from --scenario FILE (flags given on the command line override its keys) or flags.

    Plan flags fix a whole plan, re-estimated at every point; ``--no-grad-accumulation-fusion`` alone
    keeps the search and restricts it to unfused plans (the flag's meaning on ``plan`` too).
    """
    plan = None
    if not args.scenario:     # a plan file alone names the scenario it was planned for
        scenario_defaults_from_plan_file(args)
    if plan_flags_given(args, search_constraints=False):
        plan = {k: v for k, v in plan_from_args(args).to_dict().items() if k != "dp"}
    overrides = {k: v for k, v in {
        "model": args.model, "cluster": args.cluster, "gpus": args.gpus, "seq_len": args.seq_len,
        "global_batch": args.global_batch, "price_per_gpu_hour": args.price_per_gpu_hour,
        "train_tokens": args.train_tokens}.items() if v is not None}
    if args.sweep:
        overrides["sweeps"] = tuple(parse_sweep(s) for s in args.sweep)
    if args.fix:
        overrides["fixed"] = parse_fix(args.fix)
    for key in ("engine", "dtype"):   # alone: the search proposes only plans with them
        if plan is None and getattr(args, key) is not None:
            overrides["fixed"] = {**overrides.get("fixed", {}), key: getattr(args, key)}
    if plan is not None:
        overrides["plan"] = plan
    if args.no_offload:
        overrides["allow_offload"] = False
    if args.grad_accumulation_fusion is False:
        overrides["grad_accumulation_fusion"] = False
    if args.no_heatmap:
        overrides["heatmap"] = False
    if args.max_memory_fraction is not None:
        overrides["max_memory_fraction"] = args.max_memory_fraction
    if args.scenario:
        return _unfused_plan(dataclasses.replace(load_scenario(args.scenario), **overrides))
    for key in ("model", "cluster"):
        if key not in overrides:
            raise ConfigError(f"--{key}", "required (or --scenario FILE.yaml, or --plan FILE that names it)")
    if "sweeps" not in overrides:
        raise ConfigError("--sweep", "give one or two --sweep VAR=VALUES (or --scenario FILE.yaml)")
    return Scenario(**overrides)


def _default_engine(scenario: Scenario) -> Scenario:
    """The scenario with the commands' engine (:data:`paraplan.scenario.DEFAULT_ENGINE`, as on ``plan`` and
    ``estimate``) where neither its fixed plan nor its search constraints name one; the report's
    scenario.yaml then records it."""
    if scenario.plan is not None:
        if "engine" in scenario.plan:
            return scenario
        return dataclasses.replace(scenario, plan={**scenario.plan, "engine": DEFAULT_ENGINE})
    if "engine" in scenario.fixed:
        return scenario
    return dataclasses.replace(scenario, fixed={**scenario.fixed, "engine": DEFAULT_ENGINE})


def _unfused_plan(scenario: Scenario) -> Scenario:
    """With --no-grad-accumulation-fusion and a whole plan from the scenario file, that plan is unfused too."""
    if scenario.grad_accumulation_fusion or scenario.plan is None:
        return scenario
    return dataclasses.replace(scenario, plan={**scenario.plan, "grad_accumulation_fusion": False})


def cmd_whatif(args) -> int:
    """Evaluate the sweep, write the report folder, print the points; 3 if no point fits."""
    from paraplan.reports.report import check_out_dir, whatif   # matplotlib: only when a report is written
    from paraplan.reports.html import clusters_text
    from paraplan.reports.points_text import render_points
    check_out_path("--out", args.out, folder=True)
    scenario, engine_defaulted = scenario_and_engine_default(args)
    check_out_dir(args.out)          # before the sweep: a folder it cannot write into fails at once
    try:
        r = whatif(scenario=scenario, progress=not args.quiet)
    except ConfigError as e:
        raise defaulted_engine_error(e) if engine_defaulted else e from None
    with writing("--out", args.out):
        out = r.write(args.out)
    df = r.table
    print(f"paraplan whatif: {len(df)} points in {r.seconds:.1f} s", file=sys.stderr)   # timing off stdout
    print(f"paraplan whatif — {scenario.model} on {clusters_text(scenario)}: {len(df)} points "
          f"({int(df['feasible'].sum())} fit)")
    print(render_points(r.points, df))
    print(f"figures: {', '.join(r.figures)}")
    for name, why in r.skipped.items():
        print(f"skipped {name}: {why}")
    print(f"wrote {out}/report.html, {out}/points.csv, {out}/figures/ (PNG + SVG), {out}/scenario.yaml")
    return 0 if df["feasible"].any() else 3


def register(sub) -> None:
    """Add ``whatif`` to the subparsers."""
    ap = sub.add_parser("whatif", help="sweep scenario variables: figures, CSV and an HTML report",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(ap, require=False)
    ap.add_argument("--scenario", help="a YAML file with the scenario and sweeps (flags override its keys)")
    ap.add_argument("--sweep", action="append", metavar="VAR=VALUES", help="a swept variable (once or twice)")
    add_search_args(ap, max_memory_fraction=None)   # None: the --scenario file's, else DEFAULT_MEMORY_FRACTION
    ap.add_argument("--price-per-gpu-hour", type=number("--price-per-gpu-hour", low=MIN_PRICE, high=MAX_PRICE, low_open=False),
                    help=f"US$ per GPU-hour ({MIN_PRICE:g} to {MAX_PRICE:g})")
    ap.add_argument("--train-tokens", type=number("--train-tokens", high=1e30), help="tokens to train, e.g. 300e9")
    ap.add_argument("--no-heatmap", action="store_true", help="skip the tp x pp heat-map")
    ap.add_argument("--out", required=True, help="report folder (written atomically)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_plan_args(ap)
    ap.set_defaults(func=cmd_whatif)
