"""Memory fit against measured runs: which layouts of the Hagemann et al. 2023 sweep ran out of memory.

``python benchmarks/memory_fit.py [--csv SWEEP.csv] [--rows]``

The sweep is not in the repository (its spreadsheets are CC BY-NC-SA 4.0): ``--csv`` or the
PARAPLAN_SWEEP_CSV environment variable names the CSV benchmarks/sweep_from_xlsx.py makes from them.

Every run of the sweep's 2k-sequence sheets (Llama-1 13B/30B/65B on DGX A100-80GB, ZeRO-1, 1F1B,
4M-token global batch; measured MFU, or OOM) is estimated with the plan it ran, and the predicted fit
is compared with what happened:
* false fits: runs that ran out of memory but are predicted to fit (share of the OOM runs);
* false OOMs: runs that ran but are predicted not to fit (share of the runs that ran);
* per sheet (setup), the planner's pick restricted to the sweep's own axes (its kernels,
  recomputation, micro-batch, tp, pp, sp values): the fastest predicted plan among the sheet's
  runs predicted to fit; it should be a run that fit, within 5 % of the sheet's best measured MFU.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import pandas as pd

from paraplan.calibration import load_cases, load_h100_cases, short_source
from paraplan.calibration.sweep import HOW_TO_OBTAIN, sweep_csv
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

CLUSTER = "dgx-a100-80g"


def plan_of(row) -> Plan:
    """The layout a sweep row ran: ZeRO-1 (distributed optimizer), 1F1B, bf16 on the codebase the
    sweep ran on (engine ``scaling``: Aleph Alpha's Scaling); attention unfused for the `torch` (its
    softmax eager) and `fused` (Megatron's fused softmax) kernels, norms fused only with the RMS
    kernel (SwiGLU is eager in Scaling either way, and so is its rotary embedding); gradients
    accumulate unfused (one add per parameter tensor per micro-batch after the first, as Scaling's
    source does); FlashAttention 1.0.8 as the flash1 kernel, the other flash kernels (FlashAttention-2) at the
    generation's calibrated fused-attention efficiency."""
    dp = int(row.gpus) // (int(row.tp) * int(row.pp))
    kernel = str(row.kernel)
    return Plan(tp=int(row.tp), pp=int(row.pp), dp=dp, micro_batch=int(row.micro_batch), sp=bool(row.sp) and int(row.tp) > 1,  # sp is a no-op at tp 1
                zero=1, recompute="full" if row.checkpointing == "every_layer" else "none",
                flash_attention=kernel.startswith("flash"), fused_elementwise="RMS kernel" in kernel, engine="scaling",
                grad_accumulation_fusion=False, fused_softmax=kernel != "torch",
                attention_kernel="flash1" if kernel.startswith("flash_attentionv1") else "auto")


def judge(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row with its prediction: predicted_fit, predicted memory (GiB), predicted MFU, or the error."""
    out = []
    for row in rows.itertuples():
        model = load_model(row.model)
        cluster = load_cluster(CLUSTER, int(row.gpus))
        job = TrainingJob(int(row.seq_len), int(row.global_batch_tokens) // int(row.seq_len))
        rec = {"sheet": row.sheet, "trial": row.trial, "kernel": row.kernel, "checkpointing": row.checkpointing,
               "micro_batch": row.micro_batch, "tp": row.tp, "pp": row.pp, "sp": row.sp, "oom": bool(row.oom),
               "measured_mfu": row.measured_mfu}
        try:
            e = estimate(model, job, cluster, plan_of(row))
        except ConfigError as err:
            rec.update(error=str(err))
        else:
            rec.update(predicted_fit=e.feasible, predicted_gib=e.memory_bytes_per_gpu["total"] / 2**30,
                       predicted_mfu=e.mfu, error=None)
        out.append(rec)
    return pd.DataFrame(out)


def fit_scores(j: pd.DataFrame) -> dict:
    """False fits (of the OOM runs) and false OOMs (of the runs that ran), over the judged rows."""
    ok = j[j.error.isna()]
    oom, ran = ok[ok.oom], ok[~ok.oom]
    return {"runs": len(ok), "unjudged": int(j.error.notna().sum()),
            "false_fit_%": 100 * float(oom.predicted_fit.mean()) if len(oom) else float("nan"),
            "false_oom_%": 100 * float((~ran.predicted_fit.astype(bool)).mean()) if len(ran) else float("nan")}


def planner_picks(j: pd.DataFrame) -> pd.DataFrame:
    """Per sheet: the fastest predicted run among those predicted to fit, against the best measured."""
    rows = []
    for sheet, g in j[j.error.isna()].groupby("sheet"):
        best_measured = g.measured_mfu.max()
        fits = g[g.predicted_fit.astype(bool)]
        if fits.empty:
            rows.append({"sheet": sheet, "pick": "none predicted to fit", "pick_ran": False})
            continue
        pick = fits.loc[fits.predicted_mfu.idxmax()]
        rows.append({"sheet": sheet, "pick": f"{pick.kernel}, {pick.checkpointing}, mb{pick.micro_batch} "
                     f"tp{pick.tp} pp{pick.pp}{' sp' if pick.sp else ''}",
                     "pick_ran": not pick.oom, "pick_mfu_%": 100 * pick.measured_mfu,
                     "best_mfu_%": 100 * best_measured,
                     "within_5%": (not pick.oom) and pick.measured_mfu >= 0.95 * best_measured})
    return pd.DataFrame(rows)


def _fits_with_recompute(case, recompute: str) -> bool:
    """Whether the case's plan fits with ``recompute``; False where the plan cannot take it (Megatron's
    combined-1F1B expert overlap refuses full recomputation)."""
    try:
        plan = replace(case.plan, recompute=recompute)
    except ConfigError:
        return False
    return estimate(case.model, case.job, case.cluster, plan).feasible


def published_runs_fit(loader=load_cases) -> pd.DataFrame:
    """Every complete published run of a calibration file (it ran, so it fit; default
    paraplan/calibration/data/published_runs_calibration.csv, ``load_h100_cases`` for the H100/Blackwell
    file): the estimate's verdict, its memory per GPU, and whether the row states its recomputation
    (an unstated one is read as none, which the loader lists among its assumptions)."""
    cases, _ = loader()
    rows = []
    for c in cases:
        e = estimate(c.model, c.job, c.cluster, c.plan)
        stated = not any("recomputation (not stated)" in a for a in (c.assumed or ()))
        least = c.plan.recompute if e.feasible else None
        if not e.feasible and not stated:   # it ran, so with some recomputation: the least that fits
            least = next((rc for rc in ("selective", "full") if _fits_with_recompute(c, rc)), None)
        rows.append({"source": short_source(c.source), "run": c.label, "plan": c.plan.label(),
                     "predicted_gib": e.memory_bytes_per_gpu["total"] / 2**30,
                     "gpu_gib": c.cluster.accelerator.memory_bytes / 2**30, "judged_fit": e.feasible,
                     "recompute_stated": stated, "fits_with": least})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="the sweep's CSV (default: the file PARAPLAN_SWEEP_CSV names)")
    ap.add_argument("--rows", action="store_true", help="print every judged row")
    args = ap.parse_args(argv)
    path = sweep_csv(args.csv)
    if path is None:
        print(f"memory_fit.py: {HOW_TO_OBTAIN}", file=sys.stderr)
        return 2
    rows = pd.read_csv(path)
    j = judge(rows)
    pd.set_option("display.width", 200)
    if args.rows:
        print(j.to_string(index=False))
    scores = {sheet: fit_scores(g) for sheet, g in j.groupby("sheet")}
    scores["ALL"] = fit_scores(j)
    print(pd.DataFrame(scores).T.to_string(float_format=lambda x: f"{x:.1f}"))
    print()
    print(planner_picks(j).to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    print()
    for name, loader in (("published_runs_calibration.csv", load_cases),
                         ("published_runs_calibration_h100.csv", load_h100_cases)):
        pub = published_runs_fit(loader)
        some = pub.fits_with.notna()
        print(f"{name}: published runs that ran, judged to fit: {int(pub.judged_fit.sum())} of {len(pub)}"
              f" ({int((~pub.recompute_stated).sum())} rows do not state their recomputation: read as none); "
              f"with the least recomputation that fits where none is stated: {int(some.sum())} of {len(pub)} "
              f"({', '.join(f'{k} {v}' for k, v in pub[~pub.judged_fit & some].fits_with.value_counts().items()) or '-'})")
        bad = pub[~pub.judged_fit]
        if len(bad):
            print(bad.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
