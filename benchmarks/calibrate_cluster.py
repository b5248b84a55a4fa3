"""Calibrating a cluster of the catalogue to a user's runs, measured on published runs: what
`paraplan calibrate --cluster PRESET --runs-csv RUNS.csv --write-cluster OUT.yaml` does, per group of rows
that one source measured on one system (a user's runs on their cluster), leave-one-run-out.

Two bases per group:

* ``stock``: the system preset as the catalogue has it. Its curves were calibrated on these files among
  others, so there is little to fix: calibration should not make the held-out runs worse.
* ``offset``: the same preset in a cluster file that states a power limit of 60 % of the GPU's rated
  power (GEMMs and fused attention at (0.6)^(1/3) = 0.84 of the clock): a cluster that differs from the
  catalogue by a known amount, as a user's (power-capped, older kernels) may. Calibration should bring
  every held-out run back towards what the stock preset predicts.

Prints per group and base: rows, mean |error| before and after (leave-one-run-out), how many runs came
closer, and the fitted factors; then the totals. The model's own error is what remains.

``covered``: the 90 % interval an estimate on the calibrated cluster carries (split conformal on the
calibration runs' leave-one-run-out residuals, intervals.conformal_multipliers), checked on runs it was not
built from: each run held out, the cluster calibrated on the others with their own leave-one-run-out
residuals, and the held-out run predicted on those factors: inside the interval or not (groups with
MIN_CALIBRATION_RUNS + 1 runs or more).

    python benchmarks/calibrate_cluster.py [--min-rows 5]
"""
from __future__ import annotations

import argparse
import os
import tempfile
from collections import defaultdict

from paraplan.calibration.a100 import load_cases
from paraplan.calibration.h100 import load_h100_cases
from paraplan.hardware.catalog import preset_names
import numpy as np

from paraplan.costmodels.intervals import MIN_CALIBRATION_RUNS, conformal_multipliers
from paraplan.validation.calibrate import ClusterBase, calibrate, estimable, predict, row_runs

POWER_SHARE = 0.6


def groups(min_rows: int) -> dict:
    """{(source, system): [cases]} for the two calibration files, systems that are presets only."""
    out = defaultdict(list)
    presets = set(preset_names("systems"))
    for cases in (load_cases()[0], load_h100_cases()[0]):
        for c in cases:
            if c.cluster.system.name in presets:
                out[(c.source, c.cluster.system.name)].append(c)
    return {k: v for k, v in out.items() if len(v) >= min_rows}


def offset_file(system: str, folder: str) -> str:
    """A cluster file of ``system`` at POWER_SHARE of its GPU's rated power."""
    from paraplan.hardware.catalog import load_cluster
    rated = load_cluster(system).accelerator.rated_power_w
    path = os.path.join(folder, f"{system}-offset.yaml")
    with open(path, "w") as f:
        f.write(f"system: {system}\ngpu_power_limit_w: {POWER_SHARE * rated:g}\n")
    return path


def one(cases, spec: str) -> dict | None:
    base = ClusterBase(spec)
    runs, _ = estimable(row_runs(cases), base)
    if len(runs) < 3:
        return None
    cal = calibrate(runs, base, spec)
    before = [abs(x["err_before"]) for x in cal.loro]
    after = [abs(x["err_after"]) for x in cal.loro]
    return {"rows": len(runs), "before": 100 * sum(before) / len(before), "after": 100 * sum(after) / len(after),
            "closer": sum(a < b for a, b in zip(after, before)), "covered": covered(runs, base, spec),
            "factors": ", ".join(f"{k} {v:.2f}" for k, v in sorted(cal.fit.factors.items()) if abs(v - 1) > 0.005)}


def covered(runs, base, spec) -> tuple[int, int, list] | None:
    """(inside, held out, each interval's half-width as a share of the prediction): each run held out of a calibration on the others, whose own leave-one-run-out
    residuals give the conformal interval; the held-out run predicted on the others' factors."""
    if len(runs) - 1 < MIN_CALIBRATION_RUNS:
        return None
    inside, half = 0, []
    for r in runs:
        cal = calibrate([o for o in runs if o is not r], base, spec)
        low, high, _ = conformal_multipliers([np.log(x["measured_s"] / x["after_s"]) for x in cal.loro])
        ratio = r.measured_step_s / predict(r, base, cal.fit.factors)["step_time_s"]   # measured over predicted step
        inside += bool(low <= ratio <= high)     # a throughput multiplier m bounds 1 / step ratio alike: symmetric
        half.append((high - low) / 2)
    return inside, len(runs), half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-rows", type=int, default=5)
    args = ap.parse_args()
    totals = defaultdict(lambda: [0, 0.0, 0.0, 0, 0, 0])
    halves: dict = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'source (system)':<58} {'base':<7} {'rows':>4} {'before %':>9} {'after %':>8} {'closer':>7} "
              f"{'covered':>8}  factors")
        for (source, system), cases in sorted(groups(args.min_rows).items()):
            rated = cases[0].cluster.accelerator.rated_power_w
            for label, spec in (("stock", system), ("offset", offset_file(system, tmp) if rated else None)):
                if spec is None:
                    continue
                r = one(cases, spec)
                if r is None:
                    continue
                t = totals[label]
                t[0] += r["rows"]
                t[1] += r["before"] * r["rows"]
                t[2] += r["after"] * r["rows"]
                t[3] += r["closer"]
                cov = r["covered"]
                if cov:
                    t[4] += cov[0]
                    t[5] += cov[1]
                    halves[label] += cov[2]
                shown = f"{cov[0]}/{cov[1]}" if cov else "-"
                print(f"{(source[:44] + ' (' + system + ')'):<58} {label:<7} {r['rows']:>4} {r['before']:>9.1f} "
                      f"{r['after']:>8.1f} {r['closer']:>4}/{r['rows']:<2} {shown:>8}  {r['factors']}")
    print()
    for label, (n, b, a, closer, inside, held) in totals.items():
        cover = (f"; the calibrated interval held {inside} of {held} held-out runs ({100 * inside / held:.0f} %), "
                 f"median half-width {100 * float(np.median(halves[label])):.1f} %") if held else ""
        print(f"{label}: {n} runs, mean |error| {b / n:.1f} -> {a / n:.1f} % leave-one-run-out, {closer} of {n} "
              f"closer{cover}")


if __name__ == "__main__":
    main()
