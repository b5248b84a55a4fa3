"""HEAT-style tiled SimpleX step vs the PyTorch baseline on one synthetic set, in one run, and the
thread scaling of both from 1 to 2 (or more) threads; optionally a tile sweep, measured vs predicted.

    python benchmarks/cf_speed.py [--users 50000 --items 20000 --interactions 600000]
                                  [--dim 64 --negatives 128 --batch 512] [--threads 1,2]
                                  [--steps 10 --repeats 5] [--sweep [--one-profile]] [--json FILE]

Timing: the median step time of ``train_epoch(max_steps=...)`` after a 2-step warm-up, the
kernels interleaved round-robin ``--repeats`` times so that load from other processes on a shared
machine spreads over all of them; the median over the repeats is reported (min and max beside it).
Medians of short intervals are what the profile's rates are too, so predicted and measured compare
like for like on a machine shared with other processes. The sweep re-profiles the CPU before each
round and predicts that round from it (``--one-profile``: from the start's profile only): on the
shared development VM the same kernel ran 1.7x slower in one run than in the next, minutes apart. Epoch-equivalent times
are per-step × ⌈M/B⌉. The tile is the planner's choice from a profile of this CPU measured at 1
thread (the same N1, N2 are used at every thread count, so only T changes).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from paraplan.cf import profile as cf_profile
from paraplan.cf.cost import ProfiledRates, Tiling, step_time
from paraplan.cf.plan import plan_tiles
from paraplan.cf.kernels import init_params, train_epoch
from paraplan.cf.model import CFModel
from paraplan.cf.data import synthetic


def _model(data, a, threads):
    return CFModel(users=data.users, items=data.items, interactions=data.train_interactions, dim=a.dim,
                   negatives=a.negatives, batch=a.batch, threads=threads, learning_rate=40.0,
                   negative_weight=100.0)


def time_kernels(data, cases, steps, repeats, seed=0, before_round=None):
    """cases: {label: (model, tiling or None)} -> {label: [seconds per step, one per repeat]};
    ``before_round(r)`` runs before each round (a fresh profile, say)."""
    out = {k: [] for k in cases}
    for r in range(repeats):
        if before_round is not None:
            before_round(r)
        for label, (model, til) in cases.items():
            torch.set_num_threads(model.threads)
            p = init_params(model, seed)
            train_epoch(p, data, model, tiling=til, seed=seed + 100 + r, max_steps=2)
            res = train_epoch(p, data, model, tiling=til, seed=seed + r, max_steps=steps)
            out[label].append(float(np.median(res.step_times)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=50000)
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--interactions", type=int, default=600000, help="before the 80/20 per-user split")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=128)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="also time every tile size the planner ranks (1 thread)")
    ap.add_argument("--json", help="write the figures to this JSON file")
    ap.add_argument("--one-profile", dest="profile_each_round", action="store_false",
                    help="predict the sweep from the start's profile only (default: re-profile before each round)")
    a = ap.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    t0 = time.perf_counter()
    data = synthetic(a.users, a.items, a.interactions, seed=0)
    m1 = _model(data, a, 1)
    torch.set_num_threads(1)
    prof = cf_profile.measure(threads=1, dim=a.dim)
    rates = ProfiledRates(prof, m1.row_bytes)
    plan = plan_tiles(m1, cf_profile.local_cpu(), rates_for=lambda m: ProfiledRates(prof, m.row_bytes))
    ch = plan.best
    til = (ch.tile_rows, ch.refresh_iterations)
    print(f"data: {data.users} users, {data.items} items, {data.train_interactions} training interactions; "
          f"d={a.dim}, n={a.negatives}, B={a.batch}; setup+profile {time.perf_counter() - t0:.1f} s")
    print(f"planner's tile (profiled, 1 thread): N1={til[0]} N2={til[1]} "
          f"(sampling space {ch.sampling_space:.0f}, footprint {ch.footprint_bytes / 1024:.0f} KiB, {ch.tile_level})")
    cases = {}
    for T in threads:
        mT = _model(data, a, T)
        cases[f"baseline T={T}"] = (mT, None)
        cases[f"tiled T={T}"] = (mT, til)
    meas = time_kernels(data, cases, a.steps, a.repeats)
    med = {k: float(np.median(v)) for k, v in meas.items()}
    steps_epoch = m1.steps_per_epoch
    print(f"\n{'kernel':<16}{'ms/step (median)':>18}{'min':>8}{'max':>8}{'epoch s':>9}{'predicted ms':>14}")
    for label, (mT, t) in cases.items():
        pred = step_time(m1, Tiling(*t) if t else None, rates).seconds * 1e3 if mT.threads == 1 else float("nan")
        print(f"{label:<16}{med[label] * 1e3:>18.2f}{min(meas[label]) * 1e3:>8.2f}{max(meas[label]) * 1e3:>8.2f}"
              f"{med[label] * steps_epoch:>9.2f}{pred:>14.2f}")
    res = {"users": data.users, "items": data.items, "train_interactions": data.train_interactions,
           "tile": {"tile_rows": til[0], "refresh_iterations": til[1]}, "ms_per_step": {k: v * 1e3 for k, v in med.items()},
           "speedup": {}, "thread_scaling": {}}
    print()
    for T in threads:
        s = med[f"baseline T={T}"] / med[f"tiled T={T}"]
        res["speedup"][T] = s
        print(f"speedup tiled vs baseline at T={T}: {s:.1f}x")
    if len(threads) > 1:
        t_lo, t_hi = threads[0], threads[-1]
        for k in ("baseline", "tiled"):
            sc = med[f"{k} T={t_lo}"] / med[f"{k} T={t_hi}"]
            sc_min = min(meas[f"{k} T={t_lo}"]) / min(meas[f"{k} T={t_hi}"])
            res["thread_scaling"][k] = sc
            res["thread_scaling"][f"{k} (fastest repeats)"] = sc_min
            print(f"thread scaling {k} {t_lo}->{t_hi}: {sc:.2f}x median (parallel efficiency "
                  f"{sc / (t_hi / t_lo):.0%}), {sc_min:.2f}x between the fastest repeats; with other "
                  f"processes on the cores, T={t_hi} waits on a preempted thread at every barrier")
    if a.sweep:
        # every tile size with its best N2, including those below the planner's rows-per-negative
        # quality bound (L1-sized tiles), to test the time model across cache levels
        per = {}
        for c in plan.choices:
            per.setdefault(c.tile_rows, c)
        feasible = set(per)
        for c in plan_tiles(m1, cf_profile.local_cpu(), rates_for=lambda m: ProfiledRates(prof, m.row_bytes),
                            min_tile_per_negative=0).choices:
            per.setdefault(c.tile_rows, c)
        tils = [(n1, per[n1].refresh_iterations) for n1 in sorted(per)]
        # the machine's speed drifts by tens of percent over minutes when it is shared (a VM's
        # neighbours): each round of the sweep is predicted from a profile taken right before it,
        # and measured and predicted are both the median over the rounds
        preds = {t: [] for t in tils}

        def reprofile(r):
            pr = ProfiledRates(cf_profile.measure(threads=1, dim=a.dim), m1.row_bytes)
            for t in tils:
                preds[t].append(step_time(m1, Tiling(*t), pr).seconds)
        sw = time_kernels(data, {t: (m1, t) for t in tils}, a.steps, a.repeats,
                          before_round=reprofile if a.profile_each_round else None)
        rows, errs = [], []
        print(f"\n{'N1':>6}{'N2':>6}{'measured ms':>13}{'predicted ms':>14}{'error':>8}"
              f"   ({'each round predicted from a profile taken just before it' if a.profile_each_round else 'one profile, taken at the start'})")
        for t in tils:
            mm = float(np.median(sw[t]))
            p = float(np.median(preds[t])) if a.profile_each_round else step_time(m1, Tiling(*t), rates).seconds
            errs.append(abs(p - mm) / mm)
            rows.append({"tile_rows": t[0], "refresh_iterations": t[1], "measured_ms": mm * 1e3, "predicted_ms": p * 1e3,
                         "feasible": t[0] in feasible, "level": per[t[0]].tile_level})
            print(f"{t[0]:>6}{t[1]:>6}{mm * 1e3:>13.2f}{p * 1e3:>14.2f}{(p - mm) / mm:>8.0%}  {per[t[0]].tile_level}"
                  f"{'' if t[0] in feasible else '  (below rows/negative bound)'}")
        best = min((r for r in rows if r["feasible"]), key=lambda r: r["measured_ms"])
        chosen = next(r for r in rows if (r["tile_rows"], r["refresh_iterations"]) == til)
        res.update(sweep=rows, sweep_mape=float(np.mean(errs)), profile_each_round=a.profile_each_round,
                   chosen_vs_best=chosen["measured_ms"] / best["measured_ms"])
        print(f"MAPE {np.mean(errs):.1%} over {len(rows)} tiles; chosen N1={til[0]} is "
              f"{chosen['measured_ms'] / best['measured_ms']:.2f}x the best measured feasible tile "
              f"(N1={best['tile_rows']})")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
