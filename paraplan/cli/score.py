"""`paraplan score RUNS.csv [--rows] [--format table|json] [--out FILE]`: measured runs against the
estimates (paraplan/reports/score.py)."""
from __future__ import annotations

import json
import math
import sys

import pandas as pd

from paraplan.cli.common import check_out_path, writing
from paraplan.io import write_atomic

SCHEMA = "paraplan.score/1"


def _number(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def _json(scored, by_source, by_generation) -> str:
    def table(df):
        return {str(k): {c: _number(float(v)) for c, v in row.items()} for k, row in df.iterrows()}
    rows = [{k: (_number(v) if isinstance(v, float) else v) for k, v in r.items()}
            for r in scored.rows.to_dict("records")]
    doc = {"schema": SCHEMA, "rows": rows,
           "skipped": [{"row": i, "source": s, "reason": reason} for i, s, reason in scored.skipped],
           "by_source": table(by_source), "by_generation": table(by_generation)}
    return json.dumps(doc, indent=1) + "\n"


def _text(scored, by_source, by_generation, show_rows: bool) -> str:
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        return _text_lines(scored, by_source, by_generation, show_rows)


def _text_lines(scored, by_source, by_generation, show_rows: bool) -> str:
    lines = [f"{len(scored.rows)} rows scored, {len(scored.skipped)} skipped "
             "(throughput error > 0: paraplan predicted faster than measured)"]
    if show_rows and len(scored.rows):
        cols = ["row", "source", "case", "measured_step_s", "predicted_step_s", "throughput_error_%", "in_interval",
                "fits"]
        lines += ["", scored.rows[cols].round(3).to_string(index=False)]
    if len(scored.rows):
        lines += ["", "by source", by_source.round(1).to_string(),
                  "", "by hardware generation", by_generation.round(1).to_string()]
    if scored.skipped:
        lines += ["", "skipped"] + [f"  row {i} ({s}): {reason}" for i, s, reason in scored.skipped]
    return "\n".join(lines) + "\n"


def cmd_score(args) -> int:
    from paraplan.reports.score import score_runs, summary      # pandas-heavy: loaded for this command only
    if args.out is not None:
        check_out_path("--out", args.out, folder=False)
    scored = score_runs(args.runs)
    by_source, by_generation = summary(scored.rows, "source"), summary(scored.rows, "generation")
    text = (_json(scored, by_source, by_generation) if args.format == "json"
            else _text(scored, by_source, by_generation, args.rows))
    if args.out:
        with writing("--out", args.out):
            write_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


def register(subparsers) -> None:
    """Add ``score`` to the subparsers."""
    sc = subparsers.add_parser(
        "score", help="compare measured runs (a CSV in the published-run schema) with paraplan's estimates",
        description="Read measured training runs (the columns of the published-run files paraplan ships, "
                    "described in docs/reference/README.md; "
                    "architecture may be left blank for a preset model), estimate each, and report the throughput "
                    "error per row, per source and per hardware generation, and how many fall in the 90%% interval.")
    sc.add_argument("runs", metavar="RUNS.csv", help="measured runs, one per row")
    sc.add_argument("--rows", action="store_true", help="print every row (table format)")
    sc.add_argument("--format", choices=("table", "json"), default="table")
    sc.add_argument("--out", metavar="FILE", help="write to this file (atomically) instead of stdout")
    sc.set_defaults(func=cmd_score)
