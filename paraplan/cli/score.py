"""`paraplan score RUNS.csv [--rows] [--format table|json] [--out FILE]`: measured runs against the
estimates (paraplan/reports/score.py); `paraplan score --log FILE [FILE ...]`: real training logs
(Megatron-LM, torchtitan, DeepSpeed, MLPerf) read into runs (paraplan/planner/runlogs/) and scored,
``--write-rows OUT.csv`` keeping them as a runs file."""
from __future__ import annotations

import json
import math
import sys

import pandas as pd

from paraplan.cli.common import add_plan_flag, check_in_path, check_out_path, non_negative_int, positive_int, writing
from paraplan.errors import ConfigError
from paraplan.io import write_atomic

SCHEMA = "paraplan.score/1"


def _number(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def _log_doc(log) -> dict:
    """What was read from one log, for the JSON output."""
    m = log.measured
    return {"source": log.source, "kind": log.kind, "engine": log.engine, "gpu": log.gpu, "gpus": log.gpus,
            "model": log.model.name, "seq_len": log.seq_len, "global_batch": log.global_batch,
            "plan": {k: getattr(log.plan, k) for k in log.plan.__dataclass_fields__},
            "steps": list(m.steps), "skipped_warmup": list(m.skipped), "step_time_s": m.step_time_s,
            "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "tflops_per_gpu": m.tflops_per_gpu, "mfu_%": m.mfu_pct,
            "peak_memory_GiB": m.peak_memory_gib, "memory_kind": m.memory_kind or None, "notes": list(log.notes)}


def _log_lines(logs) -> list[str]:
    """The table output's lines for the logs read: kind, steps, what was measured."""
    lines = ["read from logs (median of the steps after the warm-up)"]
    for log in logs:
        m = log.measured
        got = [f"step {m.step_time_s:.4g} s"]
        for label, v, fmt in (("tokens/s/GPU", m.tokens_per_s_per_gpu, ",.0f"), ("TFLOP/s/GPU", m.tflops_per_gpu, ".1f"),
                              ("MFU", m.mfu_pct, ".2f"), ("peak GiB", m.peak_memory_gib, ".2f")):
            if v is not None:
                got.append(f"{label} {v:{fmt}}")
        lines.append(f"  {log.source} [{log.kind}]: steps {m.steps[0]}..{m.steps[-1]} ({len(m.steps)} kept"
                     + (f"; warm-up {', '.join(map(str, m.skipped))} skipped" if m.skipped else "") + "): "
                     + ", ".join(got))
        lines += [f"    assumed: {n}" for n in log.notes if "not stated by the source" in n]
    return lines + [""]


def _json(scored, by_source, by_generation, logs=()) -> str:
    def table(df):
        return {str(k): {c: _number(float(v)) for c, v in row.items()} for k, row in df.iterrows()}
    rows = [{k: (_number(v) if isinstance(v, float) else v) for k, v in r.items()}
            for r in scored.rows.to_dict("records")]
    doc = {"schema": SCHEMA, "rows": rows,
           "skipped": [{"row": i, "source": s, "reason": reason} for i, s, reason in scored.skipped],
           "by_source": table(by_source), "by_generation": table(by_generation)}
    if logs:
        doc["logs"] = [_log_doc(log) for log in logs]
    return json.dumps(doc, indent=1, default=str) + "\n"


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
    if len(scored.rows):
        lines += _doubtful_rows(scored.rows)
    if scored.skipped:
        lines += ["", "skipped"] + [f"  row {i} ({s}): {reason}" for i, s, reason in scored.skipped]
    return "\n".join(lines) + "\n"


def _doubtful_rows(rows) -> list[str]:
    """The runs judged not to fit (they ran: the memory model or the reading is wrong) with the estimate's
    reason, and the rows whose figures contradict each other with what the reader made of them."""
    lines = []
    unfit = rows[~rows["fits"].astype(bool)]
    if len(unfit):
        lines += ["", f"judged not to fit ({len(unfit)} of {len(rows)} runs, which ran)"]
        lines += [f"  row {r['row']} ({r['source']}, {r['case']}): {r['not_fit_reason']}" for _, r in unfit.iterrows()]
    contradicted = [(r, a) for _, r in rows.iterrows() for a in r["assumptions"] if "contradict" in a]
    if contradicted:
        lines += ["", "rows whose figures contradict each other"]
        lines += [f"  row {r['row']} ({r['source']}, {r['case']}): {a}" for r, a in contradicted]
    return lines


def _overrides(args):
    """What the flags state that a log may not: GPU, count, model, layout, job figures, warm-up."""
    from paraplan.planner.runlogs import LAYOUT_FIELDS, Overrides
    layout = {k: getattr(args, k) for k in LAYOUT_FIELDS if getattr(args, k, None) is not None}
    return Overrides(gpu=args.gpu, gpus=args.gpus, model=args.model, layout=layout, global_batch=args.global_batch,
                     seq_len=args.seq_len, warmup=args.warmup)


def read_logs(args) -> list:
    """Each --log read into a RunLog (paraplan.planner.runlogs); a log that cannot be read is one
    ConfigError naming the file."""
    from paraplan.planner.runlogs import read_run_log
    overrides = _overrides(args)
    logs = []
    for path in args.log:
        check_in_path("--log", path)
        try:
            logs.append(read_run_log(path, kind=args.log_kind, overrides=overrides))
        except ConfigError as e:
            raise ConfigError(f"--log {path}", e.problem if e.field == "--log" else f"{e.field}: {e.problem}",
                              accepted=e.accepted) from None
    return logs


#: the layout a log may not print (paraplan.planner.runlogs.LAYOUT_FIELDS, kept here so that the parser
#: is built without importing the readers)
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "zero", "dtype", "recompute", "schedule", "sp",
                 "tp_comm_overlap")
LOG_ONLY = ("log_kind", "gpu", "model", "gpus", "seq_len", "global_batch", "warmup", "write_rows") + LAYOUT_FIELDS


def cmd_score(args) -> int:
    from paraplan.reports.score import score_cases, score_runs, summary      # pandas-heavy: this command only
    if args.out is not None:
        check_out_path("--out", args.out, folder=False)
    if args.write_rows is not None:
        check_out_path("--write-rows", args.write_rows, folder=False)
    if (args.runs is None) == (not args.log):
        raise ConfigError("score", "give either RUNS.csv or --log FILE [FILE ...]" if args.runs is None
                          else "give RUNS.csv or --log, not both")
    logs = []
    if args.log:
        from paraplan.planner.runlogs import case_of
        logs = read_logs(args)
        scored = score_cases([case_of(log, i) for i, log in enumerate(logs)])
    else:
        given = [k for k in LOG_ONLY if getattr(args, k, None) is not None]
        if given:
            raise ConfigError("--" + given[0].replace("_", "-"), "applies to --log only (a runs file states its runs)")
        scored = score_runs(args.runs)
    by_source, by_generation = summary(scored.rows, "source"), summary(scored.rows, "generation")
    text = (_json(scored, by_source, by_generation, logs) if args.format == "json"
            else "\n".join(_log_lines(logs)) * bool(logs) + _text(scored, by_source, by_generation, args.rows or bool(logs)))
    if args.write_rows:
        with writing("--write-rows", args.write_rows):
            from paraplan.planner.runlogs import runs_csv
            write_atomic(args.write_rows, runs_csv(logs))
    if args.out:
        with writing("--out", args.out):
            write_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


def register(subparsers) -> None:
    """Add ``score`` to the subparsers."""
    sc = subparsers.add_parser(
        "score", help="compare measured runs (a CSV in the published-run schema, or training logs) with paraplan's "
                      "estimates",
        description="Read measured training runs (the columns of the published-run files paraplan ships, "
                    "described in docs/reference/README.md; "
                    "architecture may be left blank for a preset model), estimate each, and report the throughput "
                    "error per row, per source and per hardware generation, and how many fall in the 90%% interval.")
    sc.add_argument("runs", metavar="RUNS.csv", nargs="?", help="measured runs, one per row")
    sc.add_argument("--rows", action="store_true", help="print every row (table format)")
    lg = add_log_arguments(sc, "read real runs' logs instead of a runs file", "each scored as one run")
    lg.add_argument("--write-rows", metavar="OUT.csv", help="also write the runs read as a runs file (the "
                    "published-run columns: `paraplan score OUT.csv` reads it, and calibrate)")
    sc.add_argument("--format", choices=("table", "json"), default="table")
    sc.add_argument("--out", metavar="FILE", help="write to this file (atomically) instead of stdout")
    sc.set_defaults(func=cmd_score)


def add_log_arguments(parser, purpose: str, each: str):
    """The training-log flags ``score`` and ``calibrate`` share (--log and what a log may not state), as an
    argument group of ``parser``; returned for the command's own additions."""
    lg = parser.add_argument_group("training logs", f"{purpose}: Megatron-LM / NeMo / Megatron-Bridge, torchtitan, "
                                   "DeepSpeed, MLPerf Training result logs (docs/usage.md)")
    lg.add_argument("--log", nargs="+", metavar="FILE", help=f"training logs (.gz too), {each}")
    lg.add_argument("--log-kind", choices=("megatron", "torchtitan", "deepspeed", "mlperf"),
                    help="the log's kind (default: detected from its content)")
    lg.add_argument("--gpu", metavar="NAME", help="the GPU the run used, where the log does not say (H100-SXM, "
                    "A100-80GB, a system preset, or profile:NAME)")
    lg.add_argument("--gpus", type=positive_int("--gpus", sizes=True), help="GPU count, where the log does not say")
    lg.add_argument("--model", help="the model trained (preset or model file), where the log does not describe it; "
                    "checked against the shape the log prints")
    lg.add_argument("--seq-len", type=positive_int("--seq-len", sizes=True), help="tokens per sequence, where the "
                    "log does not say")
    lg.add_argument("--global-batch", type=positive_int("--global-batch", sizes=True),
                    help="sequences per step, where the log does not say")
    lg.add_argument("--warmup", type=non_negative_int("--warmup", zero_means="none"), metavar="N",
                    help="logged measurements to skip as warm-up (default per kind: 2 lines; 1 MLPerf block)")
    for name in LAYOUT_FIELDS:
        add_plan_flag(lg, name)
    return lg
