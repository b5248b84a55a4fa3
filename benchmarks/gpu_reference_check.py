"""The analytical curves of a GPU generation against its kernel reference profile (measured on a real
GPU by benchmarks/gpu_kernels.py): prints GEMM, fp8, attention, memory and whole-layer tables.

    python benchmarks/gpu_reference_check.py [--reference h100-sxm]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from paraplan.profiles import reference as R


BINS = [0, 10, 50, 100, 1000, 1e6]
LABELS = ["<10", "10-50", "50-100", "100-1000", ">=1000"]


def host_paced_note(g: pd.DataFrame) -> str:
    """Which GEMM timings say nothing about the kernel. gpu_kernels.py records a CUDA event before
    and after each Python call; where the host's per-call work (the call, its dispatch, the two event
    records) outlasts the kernel, the GPU waits for the host between the events and the interval is
    the host's pace. The fastest call of the section bounds that pace from below; calls within twice
    of it are host-paced, and so are the bins whose predicted kernel times fall there."""
    floor = g.time_s.min()
    paced = g[g.time_s < 2 * floor]
    spans = paced.groupby("bin", observed=True).size()
    return (f"host-paced calls (measured < 2 x the fastest call, {1e6 * floor:.0f} us): {len(paced)} of {len(g)}, "
            + ", ".join(f"{b} GFLOP {n}" for b, n in spans.items())
            + f"; GEMMs whose kernel takes under ~{2e6 * floor:.0f} us (below ~50 GFLOP in bf16, ~100 in fp8) are timed "
            "at the host's launch pace, not the kernel's")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", default="h100-sxm")
    a = ap.parse_args(argv)
    ref = R.load_reference(a.reference)
    env = ref["environment"]
    print(f"{env['name']}, {env['sms']} SMs, torch {env['torch']}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}")
    pd.set_option("display.width", 200)

    g = pd.DataFrame(R.gemm_ratios(a.reference))
    g["bin"] = pd.cut(g.gflop, BINS, labels=LABELS)
    print("\nbf16 GEMMs: measured / predicted time (median), by GFLOP and layout")
    print(g.pivot_table(index="bin", columns="layout", values="ratio", aggfunc="median", observed=True).round(3))
    big = g[g.gflop >= 10]
    timed = g[g.gflop >= 50]
    print(f"FLOP-weighted over >= 10 GFLOP: {big.time_s.sum() / big.predicted_s.sum():.3f} ({len(big)} GEMMs); "
          f"over >= 50 GFLOP: {timed.time_s.sum() / timed.predicted_s.sum():.3f} ({len(timed)})")
    print(host_paced_note(g))

    f = pd.DataFrame(R.fp8_gemm_ratios(a.reference))
    if len(f):
        f["bin"] = pd.cut(f.gflop, BINS, labels=LABELS)
        print("\nfp8 GEMMs (torch._scaled_mm, forward layout): measured / predicted per-tensor time (median)")
        print(f.pivot_table(index="bin", columns="recipe", values="ratio", aggfunc="median", observed=True).round(3))
        print(f"row-wise keeps {R.measured_rowwise_efficiency(a.reference):.3f} of the per-tensor rate (>= 100 GFLOP)")

    at = pd.DataFrame(R.attention_efficiency(a.reference))
    full = at[(at.heads * at.batch * at.seq >= 16384 * 32) | (at.heads == 64)]
    print("\ncausal attention, forward + backward, share of dense bf16 peak (batch x heads filling the GPU)")
    print(full.pivot_table(index=["head_dim", "seq"], columns="backend", values="efficiency").round(3))
    few = at[at.batch == 1]
    print("\n... by heads per GPU at one sequence (batch 1, head dim 128)")
    print(few[few.head_dim == 128].pivot_table(index=["seq", "heads"], columns="backend", values="efficiency").round(3))

    mem = pd.DataFrame(ref["sections"]["memory"])
    print("\nmemory-bound kernels (GB/s on the fewest bytes each must move)")
    print(mem[["op", "gb_per_s", "fwd_gb_per_s", "bwd_gb_per_s"]].round(0).to_string(index=False))
    for r in ref["sections"].get("adamw", []):
        print(f"AdamW {r['impl']}: {r['ns_per_param']:.4f} ns/param ({r['gb_per_s_at_16B']:.0f} GB/s at 16 B/param)")

    lay = pd.DataFrame(R.layer_comparison(a.reference))
    ms = lambda c: (1e3 * lay[c]).round(2)
    print("\nwhole layers, forward + backward (ms): measured / predicted, and by kernel class")
    print(pd.DataFrame({"layer": lay.label, "measured": ms("measured_s"), "predicted": ms("predicted_s"),
                        "error_%": (100 * lay.error).round(1), "gemm m/p": ms("gemm_measured_s").astype(str) + " / " +
                        ms("gemm_predicted_s").astype(str), "attention m/p": ms("attention_measured_s").astype(str)
                        + " / " + ms("attention_predicted_s").astype(str), "other m/p": ms("other_measured_s").astype(str)
                        + " / " + ms("other_predicted_s").astype(str)}).to_string(index=False))
    if "fp8_measured_s" in lay:
        e = lay.dropna(subset=["fp8_measured_s"])
        print("\nfp8 layers (per-tensor current scaling, cast-transpose kernels) (ms)")
        print(pd.DataFrame({"layer": e.label, "fp8 measured": (1e3 * e.fp8_measured_s).round(2),
                            "fp8 predicted": (1e3 * e.fp8_predicted_s).round(2), "error_%": (100 * e.fp8_error).round(1),
                            "speedup measured": e.fp8_speedup_measured.round(2),
                            "speedup predicted": e.fp8_speedup_predicted.round(2),
                            "casts measured": (1e3 * e.cast_measured_s).round(2),
                            "casts predicted": (1e3 * e.cast_predicted_s).round(2)}).to_string(index=False))
    errs = np.abs(lay.error)
    print(f"\nlayers: median |error| {100 * np.median(errs):.1f} %, worst {100 * errs.max():.1f} %")
    rows = []
    for section, kernel in R.LAYER_SECTIONS.items():
        if section not in ref["sections"]:
            continue
        for named, auto in zip(R.layer_comparison(a.reference, section, kernel),
                               R.layer_comparison(a.reference, section, "auto")):
            rows.append({"kernel ran": kernel, "layer": named["label"], "measured ms": round(1e3 * named["measured_s"], 2),
                         "error, kernel named %": round(100 * named["error"], 1),
                         "error, auto %": round(100 * auto["error"], 1),
                         "attention m/p ms": f"{1e3 * named['attention_measured_s']:.2f} / "
                                             f"{1e3 * named['attention_predicted_s']:.2f}"})
    if rows:
        t = pd.DataFrame(rows)
        print("\nwhole layers by the attention kernel that ran, predicted with it named (--attention-kernel) and with auto")
        print(t.to_string(index=False))
        print(f"kernel named: worst |error| {t['error, kernel named %'].abs().max():.1f} %; "
              f"auto: {t['error, auto %'].abs().max():.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
