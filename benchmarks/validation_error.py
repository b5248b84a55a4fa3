"""Prediction error of ``estimate --cluster local`` against real torch runs on this machine.

Runs a sweep of parallel layouts (world sizes 1, 2 and 4: tp, sp, cp, pp, dp with ZeRO 0-3,
recomputation, micro-batch; and a mixture of experts with ep) through the validation harness (``launch_worker_batch``: one torchrun
launch per world size, gloo on CPU, one intra-op thread per rank), predicts each with
:func:`paraplan.validation.predict.predict_run` on this machine's latest profile (``paraplan
profile``; with ``--profile`` a quick profile runs before every repeat and predicts that repeat,
since the load of a shared machine drifts; profiled too when the database has none), and prints per layout the
measured and predicted step time and memory per rank with their relative errors, then the median
and worst absolute errors and the Spearman rank correlation of predicted vs measured step time.

Measured step time: per rank the median over the timed steps, then the slowest rank; ``--repeats``
launches the whole sweep several times and takes the median per layout of the measured and of the
predicted values. Nothing here is fitted to
the sweep: the prediction uses only the profile's micro-benchmarks.

Usage: ``python benchmarks/validation_error.py [--db FILE] [--profile] [--repeats N] [--json OUT]``
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

import numpy as np

from paraplan.plan import Plan
from paraplan.validation.config import RunOptions, run_spec, world_size
from paraplan.validation.launch import LaunchOptions, launch_worker_batch
from paraplan.validation.model import GPTConfig
from paraplan.validation.predict import predict_run

CFG = GPTConfig(vocab_size=1024, seq_len=64, hidden=128, heads=4, layers=4, seed=0)
#: steady state: on this machine the first ~20 forward/backward passes of a fresh process run up to
#: 30 % slower (the allocator and caches settle), so 6 untimed steps precede the 8 timed ones
RUN = dict(steps=8, warmup=6, profile_ops=False)

#: name -> Plan fields (and the global batch); grouped by world size (one torchrun launch each)
LAYOUTS = {
    1: {"single_mb2": dict(micro_batch=2, global_batch=4),
        "single_mb1": dict(micro_batch=1, global_batch=4),
        "single_full_rc": dict(micro_batch=2, global_batch=4, recompute="full"),
        "single_selective_rc": dict(micro_batch=2, global_batch=4, recompute="selective")},
    2: {"tp2": dict(tp=2, micro_batch=2, global_batch=4),
        "tp2_sp": dict(tp=2, micro_batch=2, global_batch=4, sp=True),
        "pp2": dict(pp=2, micro_batch=1, global_batch=4),
        "dp2_z0": dict(dp=2, zero=0, micro_batch=2, global_batch=4),
        "dp2_z1": dict(dp=2, zero=1, micro_batch=2, global_batch=4),
        "dp2_z2": dict(dp=2, zero=2, micro_batch=1, global_batch=4),
        "dp2_z3": dict(dp=2, zero=3, micro_batch=2, global_batch=4),
        "cp2": dict(cp=2, micro_batch=2, global_batch=4),
        "cp2_gqa": dict(cp=2, micro_batch=2, global_batch=4, kv_heads=2),
        "tp2_sp_opsac": dict(tp=2, micro_batch=2, global_batch=4, sp=True, recompute="op-sac",
                             attention="sdpa")},
    4: {"tp2_dp2_z1": dict(tp=2, dp=2, zero=1, micro_batch=1, global_batch=4),
        "pp2_dp2": dict(pp=2, dp=2, micro_batch=1, global_batch=8),
        "tp4": dict(tp=4, micro_batch=2, global_batch=4),
        "dp4_z2_full_rc": dict(dp=4, zero=2, micro_batch=1, global_batch=4, recompute="full"),
        "tp2_cp2_sp": dict(tp=2, cp=2, micro_batch=1, global_batch=4, sp=True),
        # a dropless mixture of 8 experts, top-2, in every block (validation.apply_ep)
        "moe_dp4_ep4": dict(dp=4, ep=4, micro_batch=1, global_batch=4, experts=8),
        "moe_dp4_ep2_z1": dict(dp=4, ep=2, zero=1, micro_batch=1, global_batch=4, experts=8)},
}
#: layout keys that describe the model (CFG's fields), not the run plan
MODEL_KEYS = ("experts", "top_k", "attention", "kv_heads")


def model_and_plan(fields: dict, world: int):
    """(GPTConfig, Plan, RunOptions) of a LAYOUTS entry of ``world`` ranks: CFG with the model keys it names,
    the plan (dp what the ranks leave where it names none), its global batch with RUN."""
    from dataclasses import replace
    plan = dict(fields)
    model = replace(CFG, **{k: plan.pop(k) for k in MODEL_KEYS if k in plan})
    options = RunOptions(global_batch=plan.pop("global_batch"), **RUN)
    return model, Plan(**plan).with_dp_for(world), options


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):
            idx = v == val
            r[idx] = r[idx].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def measure(results: list[dict]) -> dict:
    """Slowest rank's median step time, largest rank's memory, the slowest rank's breakdown."""
    per_rank = [(statistics.median(r["step_times_s"]), r) for r in results]
    step, slow = max(per_rank, key=lambda x: x[0])
    mem = max(r["memory_bytes"]["total"] for r in results)
    return {"step_time_s": step, "memory_bytes": mem, "breakdown": dict(slow["time_breakdown_s"])}


def run_sweep(out_dir: str, worlds) -> dict:
    measured = {}
    for world in worlds:
        specs = [run_spec(*model_and_plan(f, world), name=n) for n, f in LAYOUTS[world].items()]
        res = launch_worker_batch(specs, os.path.join(out_dir, f"world{world}"),
                                  LaunchOptions(nproc_per_node=world, timeout_s=1200))
        measured.update({n: measure(r) for n, r in res.items()})
    return measured


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None, help="profile database (default $PARAPLAN_PROFILE_DB or the cache)")
    ap.add_argument("--profile", action="store_true", help="run `paraplan profile --quick` before each repeat")
    ap.add_argument("--repeats", type=int, default=1, help="launch the sweep N times, median per layout")
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--warmup", type=int, default=RUN["warmup"], help="untimed steps per layout")
    ap.add_argument("--steps", type=int, default=RUN["steps"], help="timed steps per layout")
    args = ap.parse_args(argv)
    RUN.update(warmup=args.warmup, steps=args.steps)
    layouts = {n: model_and_plan(f, w) for w in args.worlds for n, f in LAYOUTS[w].items()}
    plans = {n: p for n, (_, p, _) in layouts.items()}
    profile_worlds = tuple(w for w in (2, 4) if w in args.worlds) or (2,)
    t0 = time.time()
    reps, preds = [], []
    with tempfile.TemporaryDirectory(prefix="paraplan-valerr-") as d:
        for i in range(args.repeats):
            if args.profile:   # profiled right before the runs it predicts (the load of a shared machine drifts)
                from dataclasses import replace

                from paraplan.validation.profile import ProfileOptions, run_profile
                run_profile(replace(ProfileOptions.quick(), world_sizes=profile_worlds), db=args.db)
            if args.profile or i == 0:
                preds.append({n: predict_run(layouts[n][0], plan, layouts[n][2], args.db)[0]
                              for n, plan in plans.items()})
            reps.append(run_sweep(os.path.join(d, f"rep{i}"), args.worlds))
    rows = []
    for n, plan in plans.items():
        ms = statistics.median(r[n]["step_time_s"] for r in reps)
        mm = statistics.median(r[n]["memory_bytes"] for r in reps)
        bd = {k: statistics.median(r[n]["breakdown"][k] for r in reps) for k in reps[0][n]["breakdown"]}
        ps = statistics.median(q[n]["step_time_s"] for q in preds)
        pm = statistics.median(q[n]["memory_bytes_per_rank"] for q in preds)
        pb = {k: statistics.median(q[n]["time_breakdown_s"][k] for q in preds)
              for k in preds[0][n]["time_breakdown_s"]}
        rows.append({"layout": n, "world": world_size(plan), "measured_step_s": ms,
                     "predicted_step_s": ps, "step_err": ps / ms - 1,
                     "measured_mem_bytes": mm, "predicted_mem_bytes": pm, "mem_err": pm / mm - 1,
                     "measured_breakdown_s": bd, "predicted_breakdown_s": pb})
    print(f"model: {asdict(CFG)}; {RUN['steps']} timed steps after {RUN['warmup']} warm-up, "
          f"{args.repeats} repeat(s){' each profiled first' if args.profile else ''}, "
          f"{time.time() - t0:.0f} s; medians over repeats")
    hdr = (f"{'layout':<20}{'n':>2} {'meas ms':>9} {'pred ms':>9} {'err':>7}  {'meas MiB':>9} "
           f"{'pred MiB':>9} {'err':>7}   compute/tp/cp/ep/pp/dp/opt ms measured | predicted")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        mb, pb = r["measured_breakdown_s"], r["predicted_breakdown_s"]
        keys = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "optimizer")
        bm = "/".join(f"{1e3 * mb.get(k, 0):.1f}" for k in keys)
        bp = "/".join(f"{1e3 * pb.get(k, 0):.1f}" for k in keys)
        print(f"{r['layout']:<20}{r['world']:>2} {1e3 * r['measured_step_s']:9.2f} "
              f"{1e3 * r['predicted_step_s']:9.2f} {100 * r['step_err']:+6.1f}%  "
              f"{r['measured_mem_bytes'] / 2**20:9.2f} {r['predicted_mem_bytes'] / 2**20:9.2f} "
              f"{100 * r['mem_err']:+6.1f}%   {bm} | {bp}")
    se = [abs(r["step_err"]) for r in rows]
    me = [abs(r["mem_err"]) for r in rows]
    rho = spearman([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows])
    summary = {"layouts": len(rows), "step_median_abs_err": statistics.median(se), "step_worst_abs_err": max(se),
               "mem_median_abs_err": statistics.median(me), "mem_worst_abs_err": max(me),
               "spearman_step": rho}
    print(f"\nstep time: median |err| {100 * summary['step_median_abs_err']:.1f}%, worst "
          f"{100 * summary['step_worst_abs_err']:.1f}%   (target median <= 15%: "
          f"{'holds' if summary['step_median_abs_err'] <= 0.15 else 'MISSED'})")
    print(f"memory:    median |err| {100 * summary['mem_median_abs_err']:.1f}%, worst "
          f"{100 * summary['mem_worst_abs_err']:.1f}%   (target <= 10%: "
          f"{'holds' if summary['mem_worst_abs_err'] <= 0.10 else 'holds for the median only' if summary['mem_median_abs_err'] <= 0.10 else 'MISSED'})")
    print(f"Spearman(predicted, measured step time) = {rho:.3f}   (target >= 0.8: "
          f"{'holds' if rho >= 0.8 else 'MISSED'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": asdict(CFG), "run": RUN, "rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
