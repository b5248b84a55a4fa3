"""Step-time error of ``paraplan validate`` run as typed: its default model and run length.

For each layout (``tp2``, ``dp2`` = what ``--nproc-per-node 2`` runs with no other flag, ``dp2 --zero
1``, ``dp2 --zero 3``, ``pp2``, ``cp2``, ``dp2 --zero 1 --offload cpu``, ``dp2 --experts 8`` with ep 1 and 2, tp2 and dp2 with the Llama family's choices) the plan is built by the CLI's own parser from those flags
(:func:`paraplan.cli.validate.check_validate_args`, which sizes it:
:func:`paraplan.validation.sizing.size_run`), predicted with
:func:`paraplan.validation.predict.predict_run` on this machine's latest profile in ``--db``
(profiled first, quick mode, when it has none), and run through the harness (one torchrun launch
of world 2 per repeat holding every layout). Measured step time per repeat: the slowest rank's
median over the timed steps, as ``validate`` reports it; the table gives the median over repeats
and the spread (max - min) / median. Error = (predicted - measured) / measured.

Usage: ``python benchmarks/validate_defaults.py [--db FILE] [--repeats N] [--json OUT] [-- extra validate flags]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict

LLAMA = ["--activation", "swiglu", "--norm", "rmsnorm", "--no-bias", "--kv-heads", "2", "--rotary"]
#: name -> the flags typed after ``paraplan validate --nproc-per-node 2``
LAYOUTS = {"tp2": ["--tp", "2"], "dp2": [], "dp2_zero1": ["--zero", "1"],
           "dp2_zero3": ["--zero", "3"], "pp2": ["--pp", "2"], "cp2": ["--cp", "2"],
           "dp2_zero1_offload": ["--zero", "1", "--offload", "cpu"],
           # a dropless mixture of 8 experts, top-2, in every block: all on each rank, then split over ep 2
           "dp2_moe": ["--experts", "8"], "dp2_ep2_moe": ["--experts", "8", "--ep", "2"],
           # the Llama family's choices (SwiGLU, RMSNorm, no biases, 2 kv heads, rotary)
           "tp2_llama": ["--tp", "2", *LLAMA], "dp2_llama": LLAMA}


def plans_as_typed(extra: list[str]):
    """({name: GPTConfig}, {name: Plan}, {name: RunOptions}) that ``validate --nproc-per-node 2 <flags> <extra>``
    runs."""
    from paraplan.cli.validate import check_validate_args, main_parser
    ap = main_parser()
    plans, cfgs, options = {}, {}, {}
    for name, flags in LAYOUTS.items():
        sized = check_validate_args(ap.parse_args(["validate", "--nproc-per-node", "2", *flags, *extra,
                                                   "--out", tempfile.gettempdir()]))
        cfgs[name], plans[name], options[name] = sized.model, sized.plan, sized.options
    return cfgs, plans, options


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None, help="profile database (default $PARAPLAN_PROFILE_DB or the cache)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("extra", nargs="*", help="more validate flags (after --)")
    args = ap.parse_args(argv)
    from paraplan.validation.compare import summarize_measured
    from paraplan.validation.launch import LaunchOptions, launch_worker_batch
    from paraplan.validation.predict import predict_run
    from paraplan.validation.config import run_spec
    cfgs, plans, options = plans_as_typed(args.extra)
    t0 = time.time()
    predicted = {n: predict_run(cfgs[n], p, options[n], args.db)[0] for n, p in plans.items()}
    measured = {n: [] for n in plans}
    breakdowns = {n: [] for n in plans}
    steps = {n: [] for n in plans}          # every rank's timed steps, per repeat
    rank_breakdowns = {n: [] for n in plans}  # every rank's breakdown, per repeat
    loads = {n: [] for n in plans}            # MoE: the busiest ep rank's routed load, per repeat
    with tempfile.TemporaryDirectory(prefix="paraplan-defaults-") as d:
        for i in range(args.repeats):
            specs = [run_spec(cfgs[n], p, options[n], name=n) for n, p in plans.items()]
            res = launch_worker_batch(specs, os.path.join(d, f"rep{i}"), LaunchOptions(nproc_per_node=2,
                                                                                       timeout_s=1800))
            for n, rs in res.items():
                summary = summarize_measured(rs)     # the slowest rank's median step, as validate reports it
                measured[n].append(summary["step_time_s"])
                breakdowns[n].append(summary["time_breakdown_s"])
                steps[n].append({r["rank"]: r["step_times_s"] for r in rs})
                rank_breakdowns[n].append({r["rank"]: r["time_breakdown_s"] for r in rs})
                if summary.get("expert_load_busiest") is not None:
                    loads[n].append(summary["expert_load_busiest"])
    print(f"model {asdict(cfgs['tp2'])} (the moe layouts: --experts 8; llama: {' '.join(LLAMA)}); run: {options['tp2'].warmup} warm-up + {options['tp2'].steps} timed steps; "
          f"{args.repeats} repeats, {time.time() - t0:.0f} s")
    print(f"{'plan':<11} {'predicted ms':>12} {'measured ms':>12} {'spread':>7} {'error':>7}   "
          f"compute/tp/cp/ep/pp/dp/opt ms: predicted | measured")
    rows = []
    for n in plans:
        m = statistics.median(measured[n])
        p = predicted[n]["step_time_s"]
        spread = (max(measured[n]) - min(measured[n])) / m
        bd = predicted[n]["time_breakdown_s"]
        mb = {k: statistics.median(b[k] for b in breakdowns[n]) for k in breakdowns[n][0]}
        rows.append({"plan": n, "predicted_s": p, "measured_s": m, "measured_repeats_s": measured[n],
                     "spread": spread, "error": p / m - 1, "predicted_breakdown_s": bd,
                     "measured_breakdown_s": mb, "step_times_s": steps[n],
                     "rank_breakdowns_s": rank_breakdowns[n]})
        keys = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "optimizer")
        terms = ("/".join(f"{1e3 * bd.get(k, 0):.1f}" for k in keys) + " | "
                 + "/".join(f"{1e3 * mb.get(k, 0):.1f}" for k in keys))
        print(f"{n:<11} {1e3 * p:12.1f} {1e3 * m:12.1f} {100 * spread:6.1f}% {100 * (p / m - 1):+6.1f}%   {terms}")
        if loads[n]:   # predicted again with the load the router gave the busiest ep rank (--moe-imbalance)
            load = statistics.median(loads[n])
            q = predict_run(cfgs[n], plans[n], options[n], args.db, moe_imbalance=load)[0]
            rows[-1].update(expert_load_busiest=load, predicted_at_load_s=q["step_time_s"],
                            error_at_load=q["step_time_s"] / m - 1, predicted_at_load_breakdown_s=q["time_breakdown_s"])
            qb = q["time_breakdown_s"]
            print(f"{'':<11} {1e3 * q['step_time_s']:12.1f} {'':>12} {'':>7} {100 * (q['step_time_s'] / m - 1):+6.1f}%   "
                  f"at --moe-imbalance {load:.2f} (the busiest ep rank's measured load): "
                  + "/".join(f"{1e3 * qb.get(k, 0):.1f}" for k in keys))
    worst = max(abs(r["error"]) for r in rows)
    print(f"worst |error| {100 * worst:.1f}% (target <= 20 %: {'holds' if worst <= 0.20 else 'MISSED'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"models": {n: asdict(c) for n, c in cfgs.items()}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
