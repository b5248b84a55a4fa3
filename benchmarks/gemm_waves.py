"""Wave quantization of GEMMs against the GEMMs measured on a lent H100 (the reference profile).

The analytical GEMM time divides the FLOPs by the plateau throughput and a wave efficiency: the work
units spread over the SMs in whole waves. Two counts of the units are compared side by side, on the
same measured GEMMs (paraplan/profiles/reference/h100-sxm.json, section ``gemm``: bf16, torch/cuBLAS):

* output tiles (128 x 256): the NVIDIA Matrix Multiplication Background guide's model
* output tiles x K iterations (k / 64): stream-K / split-K scheduling, where the library spreads the
  K loop of the tiles over the SMs (``gemm_split_k`` in curves.yaml)

It prints the error of each on all GEMMs, on those of >= 50 GFLOP, and on those >= 50 GFLOP whose
output tiles fill their waves to less than 0.85 (the shapes where the two counts disagree). Below
~50 GFLOP the profile's bf16 calls are paced by the host (each call is timed between CUDA events the
host records around it, and their kernels run shorter than the host's ~30-60 us per call: see
gpu_reference_check.py), so the "all" line mixes in launch pace; judge the curves on the others.

    python benchmarks/gemm_waves.py
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from paraplan.costmodels.efficiency import analytical_curves, isolated_kernel_curves
from paraplan.hardware.catalog import load_part

PROFILE = Path(__file__).resolve().parents[1] / "paraplan" / "profiles" / "reference" / "h100-sxm.json"


def main() -> int:
    gemms = json.loads(PROFILE.read_text())["sections"]["gemm"]
    m, n, k, measured = (np.array([g[key] for g in gemms], dtype=float) for key in ("m", "n", "k", "time_s"))
    flops = 2 * m * n * k
    # isolated GEMMs: the curves at the rate the lent H100's kernels reached, not a training step's
    split = isolated_kernel_curves(analytical_curves(load_part("accelerators", "h100-sxm")))
    tiles = replace(split, gemm_split_k=False)
    big = flops >= 50e9
    ragged = big & (tiles.wave_efficiency(m, n, k) < 0.85)
    print(f"{PROFILE.name}: {len(gemms)} measured bf16 GEMMs; error of the predicted time (+ = predicted slower)")
    print(f"{'waves of':32s} {'subset':44s} {'n':>5s} {'MAPE %':>7s} {'bias %':>7s}")
    for name, curves in (("output tiles", tiles), ("output tiles x K iterations", split)):
        err = curves.gemm_time(m, n, k) / measured - 1
        for label, mask in (("all", np.ones_like(big)), (">= 50 GFLOP", big),
                            (">= 50 GFLOP, tile waves filled < 0.85", ragged)):
            e = err[mask]
            print(f"{name:32s} {label:44s} {mask.sum():5d} {100 * np.abs(e).mean():7.1f} {100 * e.mean():+7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
