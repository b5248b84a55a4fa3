"""Guard against the planner's optimism: the MFU the planner promises for its top plan next to the best
MFU published runs reached at that model size, scale and hardware generation.

For each gap it says why, in MFU points: the estimator's own error on the published run and the
difference of the two layouts as the estimator sees it (recomputation, pipeline bubble, exposed
communication shares of each step).

A planner exploits its model's errors: if the estimator flatters some layouts, the top plan's
predicted MFU sits above anything measured. For each scenario of SCENARIOS (issue 64's list: the README's
example, Llama 3 405B on 8,192 H100 at 8k, GPT 1T on 3072 A100, DeepSeek-V3 on 2,048 H800, 128k-context
jobs, a small FSDP job, MoE, fp8, Blackwell, MI300X; with ``--calibration-setups`` also every calibration
setup, a few minutes more) this prints the top plan's predicted MFU, its 90 % interval, its evidence
distance and where it extrapolates, and the best
measured MFU among the published runs of the same generation with parameters within 1.5x and GPU
count within 2x, in the same number format family (fp8 or 16-bit), dense against dense and MoE against MoE (measured MFU in paraplan's FLOP convention: the model FLOPs of the run over its
measured step time and the bf16 dense peak). Korthikanti et al. 2022's Table 5 runs (sequence parallel +
selective recomputation; held out of calibration) ran at data-parallel size 1: their layout replicates to
any larger GPU count, so they count for every scenario with at least as many GPUs (an upper bound there:
replicas add the gradient all-reduce). Only the runs of paraplan/calibration count; where none is
comparable the row says "no comparable calibration run". The sequence length is not a criterion: the
published run's sequence is printed beside it (the 128k jobs are judged against 8k runs).

    python benchmarks/planner_optimism.py            # 14 scenarios, about 50 s on 2 busy cores

Measured 2026-12-07 on main (the commands' default engine, Megatron-LM, and memory margin 0.95; top plan by
median, MFU %, gap in MFU points; 18 s on 2 cores):

    scenario                               top plan                              MFU   90 %       dist  best pub.  gap
    README: Llama 3 70B, 64 H100, 8k       tp2 pp8 cp4 1f1b                      50.2  37.4-59.6  2.0   none       -
    README: Llama 3 70B fp8, 64 H100       tp4 pp4 dp2 cp2 1f1b                  70.0  55.9-79.9  0.0   81.0 MB    -11.0
    GPT-3 175B, 1024 A100                  tp4 pp8 dp16 cp2 v6 mb3 interleaved   61.3  48.8-71.5  1.9   51.4 K22   +9.9
    Llama 3 405B, 8192 H100, 8k            tp4 pp32 dp16 cp4 v3 interleaved      48.7  34.0-60.3  4.0   none       -
    GPT 1T, 3072 A100                      tp8 pp32 dp12 v3 interleaved          60.7  49.5-69.7  1.0   56.3 K22   +4.4
    DeepSeek-V3 fp8, 2048 H800, 4k         tp2 pp32 dp32 ep8 1f1b selective      34.8  17.2-40.4  1.5   36.9 MB    -2.1
    128k: Llama 3 8B, 64 H100              tp4 dp4 cp4                           77.0  49.9-99.3  6.1   28.2 TT    +48.8
    128k: Llama 3 70B, 512 H100            tp8 dp8 cp8                           65.0  39.6-87.1  8.0   31.8 TT    +33.2
    Llama 3 8B FSDP (ZeRO-3), 64 H100      tp1 pp1 dp64                          54.0  42.4-62.3  0.5   28.2 TT    +25.8
    Mixtral 8x7B, 64 H100, 4k              tp1 pp2 dp32 v3 ep8 interleaved       50.3  25.7-58.0  1.2   none       -
    Qwen3-235B-A22B fp8, 256 H100          tp4 pp16 dp4 v4 mb2 ep8 interleaved   34.1  18.4-38.8  0.5   26.6 MB    +7.5
    Llama 3 70B fp8, 256 B200              tp2 pp4 dp32 v5 interleaved           74.3  55.0-86.2  2.0   none       -
    Llama 3 405B fp8, 576 GB200 NVL72      tp4 pp12 dp6 cp2 v3 interleaved       80.1  61.6-91.1  0.9   none       -
    Llama 3 70B, 64 MI300X                 tp2 pp4 dp8 v4 interleaved            39.1  -          -     none       -

    (MB: Megatron-Bridge; K22: Korthikanti et al. 2022 Table 5, replicated; TT: torchtitan async-TP on Grand
    Teton 500 W, tp8, sequence 8192.) 8 of 14 with a comparable run: median gap +8.7, worst +48.8 (the 128k 8B
    job against an 8k run). Terms of the positive gaps: 175B +9.9 = model error -2.6, kernels +4.5
    (FlashAttention, bf16), layout +7.9 (compute +3.9, exposed comm +2.9); 1T +4.4 = -4.0, +2.0, layout +6.4
    (bubble +4.1, compute +2.0); 128k 8B +48.8 = +2.2, +2.0, layout +44.6 (compute +24.1, exposed comm +13.9);
    128k 70B +33.2 = +0.2, +1.7, layout +31.3 (compute +14.9, recompute +13.7); FSDP 8B +25.8 = +2.2, +2.0,
    layout +21.6 (exposed comm +9.0, compute +8.0); Qwen3-235B +7.5 = +2.7, layout +4.8 (exposed comm +8.3).
    The 128k rows are the optimism to distrust: their compute term is causal attention at a long-sequence
    kernel efficiency no calibration row reaches (they stop at 8k), and MFU counts causal attention whole
    (paraplan's FLOP convention), so the intervals (49.9-99.3, 39.6-87.1) and the extrapolation notes say
    so. (Under the generic engine, which runs every schedule, 10 of 14 top plans were zero-bubble schedules
    priced at a bubble of 0; the default engine proposes only 1F1B and interleaved on Megatron-LM.)

    The table above is with ``--no-engine-switches`` (as it was measured). Since the search tries the engine's
    switches (TP overlap, bf16 gradients, fp8 parameters; docs/planner.md "Engine switches"), the top plans use
    them and the median gap is +14.3 (worst +52.2): README 70B 55.1 % (tpov+bf16g), 70B fp8 80.1 % (gap -0.9),
    175B 64.8 (+13.4), 405B 52.8, 1T 65.5 (+9.2), DeepSeek-V3 41.1 (+4.3), 128k 8B 80.4 (+52.2), 128k 70B 71.4
    (+39.7), FSDP 8B 54.9 (+26.7), Mixtral 51.4, Qwen3-235B 41.9 (+15.3, ep 1 with fp8 parameters), B200 83.8,
    GB200 90.4, MI300X 41.6. The ``pub. switches`` column says which switches the published run is read with (its
    recipe facts): the Megatron-Bridge runs used all of them, Korthikanti et al. 2022 none, torchtitan async TP.
"""
from __future__ import annotations

import sys

from dataclasses import replace

import pandas as pd

from paraplan.calibration import (KORTHIKANTI_SETUPS, KORTHIKANTI_TABLE5_STEP_S, korthikanti_estimate,
                                             load_cases, load_h100_cases)
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.intervals import GENERATION
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.cli.plan import switch_text
from paraplan.plan import is_fp8
from paraplan.planner.search import search
from paraplan.planner.space import SpaceOptions
from paraplan.scenario import DEFAULT_ENGINE, DEFAULT_MEMORY_FRACTION
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

#: the user-facing scenarios (issue 64's list): (label, model, cluster, gpus, seq, global batch, fixed axes).
#: The README's example first; then the scales the issue names (Llama 3 405B on 8,192 H100 at 8k, GPT 1T on
#: 3072 A100, DeepSeek-V3 on 2,048 H800, a 128k-context job) and one of each other regime a user meets.
SCENARIOS = [
    ("README: Llama 3 70B, 64 H100, 8k", "llama3-70b", "dgx-h100", 64, 8192, 512, {}),
    ("README: Llama 3 70B fp8, 64 H100, 8k", "llama3-70b", "dgx-h100", 64, 8192, 512, {"dtype": "fp8"}),
    ("GPT-3 175B, 1024 A100", "gpt3-175b", "dgx-a100-80g", 1024, 2048, 1536, {}),
    ("Llama 3 405B, 8192 H100, 8k", "llama3-405b", "dgx-h100", 8192, 8192, 2048, {}),
    ("GPT 1T, 3072 A100", "gpt-1t", "dgx-a100-80g", 3072, 2048, 3072, {}),
    ("DeepSeek-V3 fp8, 2048 H800, 4k", "deepseek-v3", "hgx-h800", 2048, 4096, 15360, {"dtype": "fp8"}),
    ("128k context: Llama 3 8B, 64 H100", "llama3-8b", "dgx-h100", 64, 131072, 64, {}),
    ("128k context: Llama 3 70B, 512 H100", "llama3-70b", "dgx-h100", 512, 131072, 64, {}),
    ("Llama 3 8B FSDP (ZeRO-3, tp1 pp1), 64 H100", "llama3-8b", "dgx-h100", 64, 8192, 512,
     {"zero": 3, "tp": 1, "pp": 1}),
    ("Mixtral 8x7B, 64 H100, 4k", "mixtral-8x7b", "dgx-h100", 64, 4096, 512, {}),
    ("Qwen3-235B-A22B fp8, 256 H100, 4k", "qwen3-235b-a22b", "dgx-h100", 256, 4096, 1024, {"dtype": "fp8"}),
    ("Llama 3 70B fp8, 256 B200, 8k", "llama3-70b", "dgx-b200", 256, 8192, 512, {"dtype": "fp8"}),
    ("Llama 3 405B fp8, 576 GB200 NVL72, 8k", "llama3-405b", "gb200-nvl72", 576, 8192, 576, {"dtype": "fp8"}),
    ("Llama 3 70B, 64 MI300X, 8k", "llama3-70b", "mi300x-x8", 64, 8192, 512, {}),
]

#: the scenarios issue 64 names by scale, as (model, cluster, gpus, seq) a test checks SCENARIOS for
NAMED = (("llama3-70b", "dgx-h100", 64, 8192), ("llama3-405b", "dgx-h100", 8192, 8192),
         ("gpt-1t", "dgx-a100-80g", 3072, 2048), ("deepseek-v3", "hgx-h800", 2048, 4096),
         ("llama3-8b", "dgx-h100", 64, 131072))

NO_RUN = "no comparable calibration run"


def published_mfus() -> pd.DataFrame:
    """Every scored published run with its measured MFU (paraplan's FLOP convention, bf16 peak)."""
    rows = []
    for loader in (load_cases, load_h100_cases):
        cases, _ = loader()
        for c in cases:
            e = estimate(c.model, c.job, c.cluster, c.plan)
            rows.append({"source": c.source, "run": c.label, "params": c.model.num_params, "gpus": c.cluster.num_gpus, "seq": c.job.seq_len,
                         "generation": GENERATION[c.cluster.accelerator.name], "fp8": is_fp8(c.plan.dtype),
                         "moe": c.model.moe is not None,
                         "measured_mfu": e.mfu * e.step_time_s / c.measured_step_time_s,
                         "predicted_mfu": e.mfu, "shares": step_shares(e), "replicable": False,
                         "inputs": (c.model, c.job, c.cluster, c.plan)})
    for name in KORTHIKANTI_SETUPS:   # held out of calibration, but measured: Table 5, SP + selective
        inputs, e = korthikanti_estimate(name, lambda *a: (a, estimate(*a)), recompute="selective", sp=True)
        measured_s = KORTHIKANTI_TABLE5_STEP_S[name][1]
        rows.append({"source": "Megatron-LM 2022 (Korthikanti) Table 5", "run": f"GPT {name} {e.plan.label()} "
                     f"x{e.num_gpus} SP + selective", "params": e.details["model_params"], "gpus": e.num_gpus, "seq": inputs[1].seq_len,
                     "generation": "A100", "fp8": False, "moe": False, "measured_mfu": e.mfu * e.step_time_s / measured_s,
                     "predicted_mfu": e.mfu, "shares": step_shares(e), "replicable": True, "inputs": inputs})
    return pd.DataFrame(rows)


#: the step's terms as the explanation names them: (label, breakdown keys)
TERMS = (("recompute", ("recompute",)), ("bubble", ("pp_bubble",)),
         ("exposed comm", ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")),
         ("offload", ("offload",)), ("optimizer", ("optimizer",)))


def step_shares(e) -> dict:
    """Each term's share of the predicted step: the overheads of TERMS and compute, the rest."""
    b = e.time_breakdown_s
    shares = {label: sum(b.get(k, 0.0) for k in keys) / e.step_time_s for label, keys in TERMS}
    return {"compute": 1.0 - sum(shares.values()), **shares}


def term_points(mfu_from, shares_from, mfu_to, shares_to) -> dict:
    """The MFU difference (points, to - from) split exactly over the step's terms. With u_k a term's
    time per model FLOP (times peak), MFU = 1 / sum(u_k) and u_k = share_k / MFU, so
    MFU_to - MFU_from = sum_k MFU_to·MFU_from·(u_k,from - u_k,to) = sum_k (MFU_to·s_k,from - MFU_from·s_k,to)."""
    return {k: 100 * (mfu_to * shares_from[k] - mfu_from * shares_to[k]) for k in shares_from}


#: the plan fields that pick kernels rather than a layout: a published run that predates a kernel (the
#: 2022 Megatron-LM runs had no FlashAttention) differs from a plan of today in these as well
KERNEL_FIELDS = ("flash_attention", "attention_kernel", "fused_elementwise", "fused_softmax", "dtype")


def with_kernels_of(plan, other):
    """``plan`` with ``other``'s kernel choices (KERNEL_FIELDS), or None where that combination is not a
    legal plan."""
    try:
        return replace(plan, **{f: getattr(other, f) for f in KERNEL_FIELDS})
    except ConfigError:
        return None


def kernel_changes(plan, other) -> str:
    """The kernel fields that differ, as 'field a->b'."""
    return ", ".join(f"{f} {getattr(plan, f)}->{getattr(other, f)}" for f in KERNEL_FIELDS
                     if getattr(plan, f) != getattr(other, f))


def explain_gap(best, ref) -> str:
    """Why the top plan's MFU differs from the best published run's, in three parts that add up to the
    gap: the estimator's own error on that run (predicted - measured MFU); the kernels (the published
    layout estimated with the top plan's kernel choices, KERNEL_FIELDS, against it as published); the
    layout (the top plan against the published layout on the same kernels), with the two step terms
    (compute, recompute, bubble, exposed comm, offload, optimizer) that carry most of it
    (:func:`term_points`)."""
    model_error = 100 * (ref.predicted_mfu - ref.measured_mfu)
    model, job, cluster, plan = ref.inputs
    swapped = with_kernels_of(plan, best.plan)
    changes = kernel_changes(plan, best.plan)
    on_kernels = estimate(model, job, cluster, swapped) if (swapped is not None and changes) else None
    base_mfu, base_shares = (on_kernels.mfu, step_shares(on_kernels)) if on_kernels else (ref.predicted_mfu, ref.shares)
    kernels = 100 * (base_mfu - ref.predicted_mfu)
    layout = 100 * (best.mfu - base_mfu)
    points = term_points(base_mfu, base_shares, best.mfu, step_shares(best))
    moved = sorted(points, key=lambda k: -abs(points[k]))[:2]
    terms = ", ".join(f"{k} {points[k]:+.1f}" for k in moved)
    kernel_part = f"; kernels {kernels:+.1f} ({changes})" if on_kernels else ""
    return f"model error on that run {model_error:+.1f}{kernel_part}; layout {layout:+.1f} (of which {terms})"


def top_plan(model_name, cluster_name, gpus, seq, gbs, fixed, engine_switches: bool = True):
    model, cluster = load_model(model_name), load_cluster(cluster_name, gpus)
    # what a user gets: the commands' default engine (Megatron-LM) unless the scenario names one, and the
    # commands' memory margin
    fixed = {"engine": DEFAULT_ENGINE, **fixed}
    result = search(model, TrainingJob(seq, gbs), cluster, options=SpaceOptions(fixed=fixed,
                                                                            engine_switches=engine_switches), top=1,
                    max_memory_fraction=DEFAULT_MEMORY_FRACTION)
    return model, cluster, result.best


def comparable(pub: pd.DataFrame, model, gpus: int, dtype: str, gen: str) -> pd.DataFrame:
    """The published runs a scenario is judged against: same generation, number format family and
    dense/MoE, parameters within 1.5x, GPUs within 2x (or a replicable run at no more GPUs)."""
    return pub[(pub.generation == gen) & (pub.fp8 == is_fp8(dtype)) & (pub.moe == (model.moe is not None))
               & (pub.params.between(model.num_params / 1.5, model.num_params * 1.5))
               & (pub.gpus.between(gpus / 2, gpus * 2) | (pub.replicable & (pub.gpus <= gpus)))]


def scenario_row(label: str, model, fixed: dict, best, ref, why: str | None = None) -> dict:
    """One row of the table: the top plan (``best``: a scored plan or None where none fits), its MFU,
    90 % interval and extrapolation notes, the best comparable published run (``ref``: a row of
    :func:`published_mfus` or None, then NO_RUN) and the gap with its explanation (``why``)."""
    iv = best.prediction_interval if best is not None else {}
    band = iv.get("mfu") if iv else None
    notes = "; ".join(n.removeprefix("extrapolating: ") for n in (iv or {}).get("extrapolating", []))
    moe = model.moe is not None
    return {"scenario": label + (f" {fixed['dtype']}" if "dtype" in fixed and fixed["dtype"] not in label else ""),
            "moe": moe, "top_ep": best.plan.ep if (best is not None and moe) else None,
            "top plan": (best.plan.label() + (f" ep{best.plan.ep} etp{best.plan.etp}" if moe else "")
                         + (f" {best.plan.schedule}" if best.plan.pp > 1 else "")
                         + f" {best.plan.recompute} {switch_text(best.plan)}") if best is not None else "none fits",
            "mfu_%": 100 * best.mfu if best is not None else None,
            "90%_interval": f"{100 * band[0]:.1f}-{100 * band[1]:.1f}" if band else "-",
            "distance": iv.get("evidence_distance") if iv else None,
            "extrapolating": notes or "-",
            "best_published_%": 100 * ref.measured_mfu if ref is not None else None,
            "published run": f"{ref.source}: {ref.run} seq {ref.seq}" if ref is not None else NO_RUN,
            # the switches the published run is read with (its recipe facts: *.recipes.yaml)
            "pub. switches": switch_text(ref.inputs[3]) if ref is not None else "-",
            "gap_points": 100 * (best.mfu - ref.measured_mfu) if (best is not None and ref is not None) else None,
            "why (points)": why if (best is not None and ref is not None and why) else "-"}


def calibration_scenarios() -> list:
    """Every calibration setup as a scenario (``--calibration-setups``; minutes more)."""
    out = []
    for loader in (load_cases, load_h100_cases):
        seen = set()
        for c in loader()[0]:
            key = (c.model.name, c.cluster.name, c.cluster.num_gpus, c.job.seq_len, c.job.global_batch)
            if key not in seen and c.model.name in _PRESET_OF:
                seen.add(key)
                out.append((f"calibration: {c.model.name} {c.cluster.system.name} x{c.cluster.num_gpus} "
                            f"s{c.job.seq_len} gb{c.job.global_batch}", _PRESET_OF[c.model.name],
                            c.cluster.system.name, c.cluster.num_gpus, c.job.seq_len, c.job.global_batch,
                            {"dtype": c.plan.dtype}))
    return out


def print_table(df: pd.DataFrame) -> None:
    """The table in two parts (the plan and its interval; the published run and the gap), then the summary."""
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 120)
    print(df[["scenario", "top plan", "mfu_%", "90%_interval", "distance", "extrapolating"]]
          .round(1).to_string(index=False))
    print()
    print(df[["scenario", "mfu_%", "best_published_%", "gap_points", "pub. switches", "published run"]].round(1).to_string(index=False))
    print()
    for _, r in df.iterrows():
        if pd.notna(r["gap_points"]):
            print(f"{r['scenario']}: gap {r['gap_points']:+.1f} = {r['why (points)']}")
    have = df.dropna(subset=["gap_points"])
    print("\nwhy: the gap = the estimator's error on the published run (its predicted - measured MFU) + the "
          "kernels, where they differ (the published layout on the top plan's kernels - as published) + the "
          "layout difference as the estimator sees it (top plan's predicted MFU - the published layout's on the "
          "same kernels), with the two step terms that carry most of it (points; compute: the rate at which "
          "the GPUs run the model's FLOPs, e.g. GEMM shapes after tp)")
    if len(have):
        print(f"\n{len(have)} of {len(df)} scenarios with a comparable calibration run: median gap "
              f"{have.gap_points.median():+.1f} MFU points, worst {have.gap_points.max():+.1f}; "
              f"{(have.gap_points.abs() <= 5).sum()} within 5 points; {len(df) - len(have)} with {NO_RUN}")
    moe = have[have.moe]
    if len(moe):
        print(f"{len(moe)} of them MoE: median gap {moe.gap_points.median():+.1f} points "
              f"({moe.gap_points.min():+.1f} to {moe.gap_points.max():+.1f}); "
              f"{int((moe.top_ep == 1).sum())} of {len(moe)} top plans at ep 1")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pub = published_mfus()
    scenarios = list(SCENARIOS) + (calibration_scenarios() if "--calibration-setups" in argv else [])
    rows = []
    for label, name, cl, gpus, seq, gbs, fixed in scenarios:
        model, cluster, best = top_plan(name, cl, gpus, seq, gbs, fixed,
                                        engine_switches="--no-engine-switches" not in argv)
        near = comparable(pub, model, gpus, fixed.get("dtype", "bf16"), GENERATION[cluster.accelerator.name])
        ref = near.loc[near.measured_mfu.idxmax()] if len(near) else None
        why = explain_gap(best, ref) if (best is not None and ref is not None) else None
        rows.append(scenario_row(label, model, fixed, best, ref, why))
    print_table(pd.DataFrame(rows))
    return 0


_PRESET_OF = {"llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "gpt3-175b": "gpt3-175b",
              "llama2-7b": "llama2-7b", "llama2-13b": "llama2-13b", "llama2-70b": "llama2-70b",
              # MoE setups (Megatron-Bridge rows): the planner's MoE promises against MoE runs only
              "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
              "gpt-oss-120b": "gpt-oss-120b", "deepseek-v3": "deepseek-v3"}

if __name__ == "__main__":
    sys.exit(main())
