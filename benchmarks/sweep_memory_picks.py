"""False fits, false OOMs and the planner's pick per setup of the Hagemann et al. 2023 sweep (issue 64).

``python benchmarks/sweep_memory_picks.py [--csv SWEEP.csv] [--rows] [--by-kernel]``

The sweep is not in the repository (its spreadsheets are CC BY-NC-SA 4.0): ``--csv`` or PARAPLAN_SWEEP_CSV
names the CSV benchmarks/sweep_from_xlsx.py makes from them (paraplan.calibration.sweep).

**A setup** is what a user fixes before choosing a layout: the model, the number of GPUs, the sequence
length and the global batch, on one cluster. In the sweep that is one spreadsheet: Hagemann et al. 2023
(arXiv:2311.05610) sweep every layout of one model on one GPU count at 2,048 tokens and a 4M-token global
batch (13B on 64 GPUs, 30B on 256, 65B on 128, and the sequence-parallelism sheets 13B on 32, 30B on 64), all
on DGX A100-80GB, ZeRO-1, 1F1B, bf16, and report the best layout of each (their sec. 4 and Table 1). Within a
setup the layout varies over what the planner chooses: attention / norm kernels, recomputation (none or every
layer), micro-batch, tp, pp and sequence parallelism. ``--by-kernel`` also splits each setup by kernel (a user
who has only one of them): a stricter test that the sheet's author did not pose.

Printed, per setup and overall:
* **false fits**: runs that ran out of memory but are judged to fit (count, and % of the setup's OOM runs);
  **false OOMs**: runs that ran but are judged not to fit (count, % of the runs that ran). Judged twice: by
  ``paraplan estimate``'s verdict (the GPU's whole 80 GiB) and by the planner's (its default share of the
  GPU, ``plan_memory_fraction`` in paraplan/data/fitted_constants.yaml).
* **the planner's pick among the measured layouts**: the setup's runs that the planner judges to fit, ranked
  as ``paraplan plan`` ranks (by predicted step time, ties within ``planner_tie_share`` to the simpler
  layout, then for ``--rank-by p10`` by the 90 % interval's low end), its measured MFU over the best
  measured MFU of the setup (0 where the pick ran out of memory), for rank-by median and p10.
  The estimates are in-sample: the sweep is among the calibration rows of the A100 curves.

Figures, 2026-12-07 (sheets64; 522 runs, 259 OOM, 263 ran) -- see the module's NOTES below, printed too.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import pandas as pd

from memory_fit import CLUSTER, plan_of
from paraplan.calibration.sweep import HOW_TO_OBTAIN, sweep_csv
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import planner_memory_limit
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.planner.simplicity import prefer_simpler
from paraplan.scenario import DEFAULT_MEMORY_FRACTION
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

#: the columns that name a setup (one spreadsheet of the sweep)
SETUP = ("model", "gpus", "seq_len", "global_batch_tokens")
#: the pick is "within 5 %" when its measured MFU is at least this share of the setup's best
WITHIN = 0.95


@dataclass(frozen=True)
class Judged:
    """One run of the sweep with its estimate (None where the plan is refused)."""
    row: object
    estimate: object | None
    error: str | None
    cluster: object = None


def judge_runs(rows: pd.DataFrame) -> list[Judged]:
    """Every run estimated with the layout it ran (memory_fit.plan_of)."""
    out = []
    for row in rows.itertuples():
        model = load_model(row.model)
        cluster = load_cluster(CLUSTER, int(row.gpus))
        job = TrainingJob(int(row.seq_len), int(row.global_batch_tokens) // int(row.seq_len))
        try:
            out.append(Judged(row, estimate(model, job, cluster, plan_of(row)), None, cluster))
        except ConfigError as err:
            out.append(Judged(row, None, str(err), cluster))
    return out


def frame(judged: list[Judged], fraction: float = DEFAULT_MEMORY_FRACTION) -> pd.DataFrame:
    """One line per run: its setup, layout, outcome, predicted GiB, the two verdicts and throughputs."""
    recs = []
    for j in judged:
        r, e = j.row, j.estimate
        rec = {k: getattr(r, k) for k in SETUP + ("sheet", "trial", "kernel", "checkpointing", "micro_batch", "tp",
                                                  "pp", "sp")}
        rec.update(oom=bool(r.oom), measured_mfu=r.measured_mfu, error=j.error)
        if e is not None:
            total = e.memory_bytes_per_gpu["total"]
            iv = e.prediction_interval or {}
            rec.update(predicted_gib=total / 2**30, fits_estimate=bool(e.feasible), fits_planner=fits_planner(j, fraction),
                       predicted_mfu=e.mfu, step_s=e.step_time_s, tokens_p10=iv.get("tokens_per_s_p10", e.tokens_per_s))
        recs.append(rec)
    return pd.DataFrame(recs)


def fit_counts(g: pd.DataFrame, verdict: str) -> dict:
    """False fits / false OOMs of one group under ``verdict`` (a boolean column)."""
    ok = g[g.error.isna()]
    oom, ran = ok[ok.oom], ok[~ok.oom]
    ff, fo = int(oom[verdict].sum()), int((~ran[verdict].astype(bool)).sum())
    return {"runs": len(ok), "oom": len(oom), "ran": len(ran), "false_fits": ff,
            "false_fit_%": 100 * ff / len(oom) if len(oom) else float("nan"), "false_ooms": fo,
            "false_oom_%": 100 * fo / len(ran) if len(ran) else float("nan")}


def fit_table(df: pd.DataFrame, verdict: str, by=("sheet",)) -> pd.DataFrame:
    """fit_counts per group and over all runs."""
    rows = [{"setup": " ".join(str(x) for x in (k if isinstance(k, tuple) else (k,))), **fit_counts(g, verdict)}
            for k, g in df.groupby(list(by))]
    rows.append({"setup": "ALL", **fit_counts(df, verdict)})
    return pd.DataFrame(rows)


def fits_planner(j: Judged, fraction: float = DEFAULT_MEMORY_FRACTION) -> bool:
    """Whether the planner admits the run's layout: its predicted total within the planner's limit
    (paraplan.costmodels.memory.planner_memory_limit: ``fraction`` of the GPU, less the allocator-pressure
    headroom for ZeRO-3 / FSDP plans, which the sweep has none of)."""
    e = j.estimate
    return e is not None and e.memory_bytes_per_gpu["total"] <= float(planner_memory_limit(e.plan, j.cluster, fraction))


def ranked(judged: list[Judged], rank_by: str, fraction: float = DEFAULT_MEMORY_FRACTION) -> list[Judged]:
    """The runs the planner judges to fit (within ``fraction`` of the GPU), in the order ``paraplan plan``
    gives them: by step time with ties within planner_tie_share to the simpler layout
    (paraplan.planner.simplicity.prefer_simpler), then, for p10, stably by the interval's low end."""
    fits = [j for j in judged if fits_planner(j, fraction)]
    by_est = {id(j.estimate): j for j in fits}
    order = [by_est[id(e)] for e in prefer_simpler(sorted((j.estimate for j in fits), key=lambda e: e.step_time_s))]
    if rank_by == "p10":
        order.sort(key=lambda j: -(j.estimate.prediction_interval or {}).get("tokens_per_s_p10", j.estimate.tokens_per_s))
    return order


def layout(row) -> str:
    return (f"{row.kernel}, {'full' if row.checkpointing == 'every_layer' else 'none'}, mb{row.micro_batch} "
            f"tp{row.tp} pp{row.pp}{' sp' if row.sp and row.tp > 1 else ''}")


def picks(judged: list[Judged], by=SETUP, fraction: float = DEFAULT_MEMORY_FRACTION) -> pd.DataFrame:
    """Per group: the best measured run, and for rank-by median and p10 the planner's pick among the
    group's runs, its measured MFU over the best (0 for a pick that ran out of memory)."""
    groups: dict = {}
    for j in judged:
        groups.setdefault(tuple(getattr(j.row, k) for k in by), []).append(j)
    out = []
    for key, js in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ran = [j for j in js if not j.row.oom]
        if len(ran) < 2:
            continue
        best = max(ran, key=lambda j: j.row.measured_mfu)
        rec = {"setup": " ".join(str(x) for x in key), "runs": len(js), "ran": len(ran),
               "best": layout(best.row), "best_mfu_%": 100 * best.row.measured_mfu}
        for rank_by in ("median", "p10"):
            order = ranked(js, rank_by, fraction)
            if not order:
                rec.update({f"{rank_by}_pick": "none judged to fit", f"{rank_by}/best": 0.0})
                continue
            p = order[0].row
            rec.update({f"{rank_by}_pick": layout(p) + (" (OOM)" if p.oom else ""),
                        f"{rank_by}/best": 0.0 if p.oom else p.measured_mfu / best.row.measured_mfu})
        out.append(rec)
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="the sweep's CSV (default: the file PARAPLAN_SWEEP_CSV names)")
    ap.add_argument("--rows", action="store_true", help="print every run that is misjudged")
    ap.add_argument("--by-kernel", action="store_true", help="also split each setup by its kernel")
    args = ap.parse_args(argv)
    path = sweep_csv(args.csv)
    if path is None or not path.is_file():
        print(f"sweep_memory_picks.py: {HOW_TO_OBTAIN}", file=sys.stderr)
        return 2
    judged = judge_runs(pd.read_csv(path))
    df = frame(judged)
    pd.set_option("display.width", 250)
    fmt = {"float_format": lambda x: f"{x:.3f}" if abs(x) < 2 else f"{x:.1f}", "index": False}
    print(f"setup = {' x '.join(SETUP)} (one sheet of the sweep); {len(df)} runs, "
          f"{int(df.oom.sum())} OOM, {int((~df.oom).sum())} ran")
    for verdict, what in (("fits_estimate", "paraplan estimate's verdict (80 GiB)"),
                          ("fits_planner", f"the planner's verdict ({DEFAULT_MEMORY_FRACTION:g} of 80 GiB)")):
        print(f"\nfalse fits / false OOMs by {what}:")
        print(fit_table(df, verdict).to_string(**fmt))
    print("\nthe planner's pick among each setup's measured layouts (measured MFU of the pick / best measured):")
    p = picks(judged)
    print(p.to_string(**fmt))
    for rank_by in ("median", "p10"):
        r = p[f"{rank_by}/best"]
        print(f"  rank-by {rank_by}: within 5 % in {int((r >= WITHIN).sum())} of {len(r)} setups, mean {r.mean():.3f}")
    if args.by_kernel:
        print("\nstricter: each setup split by kernel")
        pk = picks(judged, by=SETUP + ("kernel",))
        print(pk.to_string(**fmt))
        for rank_by in ("median", "p10"):
            r = pk[f"{rank_by}/best"]
            print(f"  rank-by {rank_by}: within 5 % in {int((r >= WITHIN).sum())} of {len(r)}, mean {r.mean():.3f}")
    if args.rows:
        bad = df[df.error.isna() & (df.oom == df.fits_estimate.astype(bool))]
        print("\nmisjudged runs (estimate's verdict):")
        print(bad.drop(columns=["error", "model", "seq_len", "global_batch_tokens"]).sort_values(
            ["sheet", "oom", "predicted_gib"]).to_string(**fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
