"""Score the estimator against published runs (shared/reference/published_runs_calibration.csv).

Prints per-row predicted vs measured step time and, per source and overall, the mean absolute
percentage error. One set of hardware-level efficiency curves (paraplan/costmodels/curves.yaml);
no per-row constants.

    python benchmarks/accuracy.py [--csv PATH] [--rows]
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from paraplan.costmodels.calibration import DEFAULT_CSV, korthikanti_table, load_cases, mape_by_source, score
from paraplan.costmodels.estimate import estimate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args(argv)
    cases, skipped = load_cases(args.csv)
    df = score(cases, estimate)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    if args.rows:
        print(df.assign(error=(100 * df.error).round(1)).to_string(index=False))
        print()
    print(f"{len(cases)} rows scored, {len(skipped)} skipped")
    for reason, n in pd.Series([f"{s}: {r}" for _, s, r in skipped]).value_counts().items():
        print(f"  skipped {n:3d}  {reason}")
    print()
    print(mape_by_source(df).round(1).to_string())
    print()
    k = korthikanti_table()
    print("held out: Korthikanti et al. 2022, Table 5 step time and Fig. 1 activation memory")
    print(k.round(2).to_string(index=False))
    print(f"step time MAPE {k['step_error_%'].abs().mean():.1f}% over {k['step_error_%'].notna().sum()} rows; "
          f"activation memory MAPE {k['act_error_%'].abs().mean():.1f}% over {k['act_error_%'].notna().sum()} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
