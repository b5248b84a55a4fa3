"""Fuzz the command line and its input files: every case must end in exit code 0, 2 (or 3: no
plan fits) with no traceback, no warning spill, an error line that names the field, within 20 s.

``python benchmarks/fuzz_cli.py --cases 10000 [--seed 0] [--subprocess 20] [--show 5]``

A case is a valid base invocation of one command (plan, estimate, export, whatif, list, cf plan;
validate and profile up to their argument checks, never launching torchrun) with one mutation:
a flag's value replaced by a hostile one (0, negatives, NaN, inf, 5000 digits, 2^31, 2^63, empty,
text, 300-byte names, ``--out`` a folder / under a file / unwritable), a mistyped flag or choice, a
required flag dropped, or one of its input files (model YAML/JSON, Hugging Face config.json, cluster
YAML, plan file JSON, whatif scenario YAML, CF CPU profile JSON, profile SQLite database) changed:
one key set to a hostile value or removed, an unknown key, or the whole file made empty, non-UTF-8,
truncated, deeply nested, a list, a folder, or missing. Cases run in-process (``paraplan.cli.main``
with captured output; a case over 20 s of CPU time, or still running at 60 s, is a hang);
``--subprocess N`` also runs up to N of them as real processes (every cases/N-th, where a real command line can
carry its arguments and it runs paraplan.cli.main). ``--part K/N --json partK.json`` runs the K-th of
N slices of the same case list (so N parts, one after another or on other cores, are one whole run);
``--add part*.json`` adds their summaries up.
``tests/cli/test_fuzz.py`` runs a few hundred of the same cases in the suite.

Runs (``--cases 10000 --seed 0``, 2-core machine shared with other jobs, load average 7-12):

- before (branch rough67 at 703cfee, one process, 1,206 s): exit codes 2: 8,211, 0: 1,755, 3: 29, 1: 5;
  5 tracebacks (score: global_batch / num_gpus = 2**63 overflowed numpy in check_plan; whatif --out with
  bytes that are not UTF-8: 'wrote ...' raised UnicodeEncodeError on a strict stdout, 3 cases), 2 warning
  spills (a model named in fullwidth digits: matplotlib's missing-glyph UserWarning), 1 'unnamed' (validate
  --virtual-stages +5 named --vpp, the flag it spells: the judge's error); 0 hangs; slowest case 3.8 s CPU.
- after (7385d77; later commits change tests, this text and where one function stands; ``--part 1/2`` and
  ``--part 2/2`` side by side, 1,362 s wall, ``--add``): 10,000 cases
  (14 as real processes), exit codes 2: 8,211, 0: 1,760, 3: 29; 0 tracebacks, 0 hangs, 0 errors not naming
  their field, 0 over one line, 0 warning spills, 0 other exit codes; slowest case ``plan --top '1_000'``
  4.07 s CPU (42 s wall under that load; limits 20 s CPU, 60 s wall); median case 0.045 s wall.
- main at the end of 7 December (issues 64, 66 and 67 merged; parts side by side on an idle machine, 435 s of
  case time): 10,000 cases (14 real processes), exit codes 2: 8,209, 0: 1,762, 3: 29; 0 tracebacks, 0 hangs,
  0 errors not naming their field, 0 over one line, 0 warning spills; slowest ``plan --top '1_000'`` 4.54 s CPU.
- the new commands (score --log, calibrate, estimate/plan --trace; bases added 7 December, afternoon): of the
  1,362 such cases in ``make_cases(6000)`` for seeds 3 and 4, before the fixes of e23bd64 6 tracebacks (a log's
  ``--num-layers 0x10`` and a 2**63 value, a JSON config nested 50,000 deep, report.json's ``run``/``traces`` of
  another type) and 15 errors not naming the flag typed (``--gpu``, ``--seq-len``, ``--runs-csv``, ``--db``); after,
  1,499 cases (the same seeds with the --trace cases): 0 tracebacks, 0 hangs, 0 unnamed, exit codes 2: 1,079, 0: 420.
- main fab42d8 merged with 327d1b5 (a merge-tree, not committed; parts side by side, 1,085 s wall): 10,000
  cases, exit codes 2: 8,209, 0: 1,762, 3: 29; 0 tracebacks, 0 hangs, 0 unnamed, 0 multiline, 0 warnings;
  slowest ``plan --top '1_000'`` 4.4 s CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HANG_S = 20.0                 # a case may use at most this much CPU time ...
WALL_LIMIT_S = 60.0           # ... and this much wall time (on a shared, oversubscribed machine wall time
#                               runs several times the CPU time; a real hang exceeds both)
OK_CODES = (0, 2, 3)          # 3: plan/whatif found no plan that fits (a valid answer)

# --- hostile values ------------------------------------------------------------------------------
BIG_DIGITS = "9" * 5000
#: odd text: lone surrogates (a command-line byte that is not UTF-8 arrives as one of \udc80-\udcff; a JSON
#: "\ud800" escape gives any), NUL, a bidi override, a BOM, combining marks, emoji, line and paragraph
#: separators, terminal escapes, other scripts' letters and digits (int() reads Arabic-Indic and fullwidth digits)
ODD_TEXT = ("\udc80", "a\udcff.yaml", "\ud800", "x\x00y", "\u202eevil", "\ufeffllama3-8b", "e\u0301", "\U0001F600",
            "line\nbreak", "tab\there", "\u2028", "\u0085", "\x1b[31mred", "名前", "Ｌｌａｍａ", "\u0663", "\uff18", "\udcc3\udca9")
FLAG_VALUES = ("0", "-1", "-7", "nan", "NaN", "inf", "-inf", "1e309", "1e-320", BIG_DIGITS, "2147483648",
               "4294967297", "9223372036854775808", "18446744073709551617", "", " ", "abc", "1.5", "0x10",
               "1_000", "2**31", "x" * 300, "ü" * 130, "3", "7", "64", "1024", "1e3", "0.5", "-0",
               "1e308", "-0.0", "4.9e-324", "+5", " 5 ", "5\n", "1e-5", "0b11", "Infinity", "-1e309") + ODD_TEXT
# sentinels replaced in the dumped text (values yaml/json cannot dump or that must stay literal)
S_BIG, S_NAN, S_INF, S_NINF, S_DEEP = "@@BIG@@", "@@NAN@@", "@@INF@@", "@@NINF@@", "@@DEEP@@"
KEY_VALUES = (None, "", "abc", -1, 0, 1.5, 2**31, 2**63, 2**70, S_BIG, S_NAN, S_INF, S_NINF, S_DEEP, [], {},
              [1, 2], {"a": 1}, True, False, "8", "x" * 300, "ü" * 130, 3, 7, 1, 1e308, -0.0, 5e-324) + ODD_TEXT


def _literal(token: str, fmt: str) -> str:
    return {S_BIG: BIG_DIGITS, S_DEEP: "[" * 3000 + "]" * 3000,
            S_NAN: ".nan" if fmt == "yaml" else "NaN", S_INF: ".inf" if fmt == "yaml" else "Infinity",
            S_NINF: "-.inf" if fmt == "yaml" else "-Infinity"}[token]


def _csv_text(rows) -> str:
    """A published-run CSV of ``rows`` (dicts; a list of one or more, or one dict)."""
    import csv
    rows = rows if isinstance(rows, list) else [rows, GPT_ROW]
    rows = [r if isinstance(r, dict) else {"value": r} for r in rows]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=columns)
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if v is None else (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
    return out.getvalue()


def dump(data, fmt: str) -> str:
    """YAML, JSON or CSV text of ``data`` with the sentinels put in literally."""
    if fmt == "csv":
        text = _csv_text(data)
    else:
        text = json.dumps(data, indent=1) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    for s in (S_BIG, S_NAN, S_INF, S_NINF, S_DEEP):
        text = text.replace(json.dumps(s), _literal(s, fmt)).replace(f"'{s}'", _literal(s, fmt)).replace(
            s, _literal(s, fmt))
    return text


# --- valid base documents ------------------------------------------------------------------------
MODEL_DOC = {"name": "fz-model", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn_hidden": 2816,
             "vocab": 32000, "activation": "swiglu", "tied_embeddings": False, "norm": "rmsnorm",
             "max_positions": 4096}
MOE_MODEL_DOC = {**MODEL_DOC, "name": "fz-moe", "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1408,
                                                        "shared_experts": 1, "every": 2, "capacity_factor": 1.25}}
HF_LLAMA = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000, "hidden_act": "silu",
            "max_position_embeddings": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
HF_GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024,
           "vocab_size": 50257, "activation_function": "gelu_new", "n_inner": None, "layer_norm_epsilon": 1e-5,
           "architectures": ["GPT2LMHeadModel"]}
HF_MIXTRAL = {**HF_LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
#: a measured run as `paraplan score` reads it (the H100 file's columns; an H100 row scored by preset name)
RUN_ROW = {"source": "fuzz cluster", "model": "Llama 3.1 8B", "params_b": 8.0, "layers": None, "hidden": None,
           "heads": None, "ffn_hidden": None, "vocab": None, "seq_len": 8192, "moe_experts": None, "moe_topk": None,
           "gpu": "H100 SXM", "num_gpus": 16, "tp": 1, "pp": 1, "dp": 8, "cp_or_sp": "2 (ulysses)", "ep": None,
           "vpp": None, "zero_stage": "1 (distributed optimizer)", "offload": None, "recompute": None,
           "micro_batch": 1, "global_batch": 128, "precision": "bf16", "measured_metric": "tokens_per_sec_per_gpu",
           "measured_value": 8000.0, "measured_unit": "tokens/s/GPU", "notes": ""}
GPT_ROW = {**RUN_ROW, "model": "GPT 7.5B", "params_b": None, "layers": 36, "hidden": 4096, "heads": 32,
           "vocab": 51200, "seq_len": 2048, "gpu": "A100 80GB", "num_gpus": 128, "tp": 4, "dp": 32, "cp_or_sp": None,
           "zero_stage": None, "micro_batch": 16, "global_batch": 512, "precision": "fp16", "recompute": "full",
           "measured_metric": "tflops_per_gpu_incl_recompute", "measured_unit": "TFLOP/s/GPU", "measured_value": 150.0}
#: real inputs of `score --log` and `calibrate` (the test fixtures: a Megatron-DeepSpeed training log, three
#: `validate` run folders with their profiler traces and the profile they were predicted with)
DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
LOG_TEXT = (DATA / "logs" / "megatron_deepspeed_llama_tp2pp2.log").read_text(encoding="utf-8")
RUN_DIRS = ("dp2", "tp2", "pp2")


def _run_dir_files() -> dict:
    """The calibrate fixtures' run folders as case files (their traces as bytes)."""
    files: dict = {}
    for run in RUN_DIRS:
        for f in sorted((DATA / "traces" / run).rglob("*")):
            if f.is_file():
                rel = str(f.relative_to(DATA / "traces"))
                files[rel] = f.read_bytes() if f.suffix == ".gz" else f.read_text(encoding="utf-8")
    return files


CLUSTER_DOC = {"name": "fz-cluster", "system": "dgx-h100", "gpus": 16, "inter_node_oversubscription": 2}
SCENARIO_DOC = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "seq_len": 2048, "global_batch": 16,
                "sweep": {"gpus": "8,16"}, "fix": {"zero": 1}, "heatmap": False, "max_memory_fraction": 0.9}


def _plan_doc() -> dict:
    plan = {"tp": 2, "pp": 1, "dp": 4, "cp": 1, "sp": True, "vpp": 1, "micro_batch": 1, "schedule": "1f1b",
            "zero": 1, "recompute": "selective", "offload": "none", "offload_params": False, "dtype": "bf16",
            "flash_attention": True, "overlap_grad_reduce": True, "ep": 1, "etp": 1, "cp_mode": "ring",
            "optimizer": "adam", "delayed_update": False, "grad_accumulation_fusion": True,
            "fused_elementwise": True, "fused_softmax": True, "engine": "generic", "first_stage_layers": 0,
            "last_stage_layers": 0,
            "tp_comm_overlap": False, "grad_reduce_bf16": False, "fp8_param_gather": False,
            "offload_activation_layers": 0}
    return {"schema": "paraplan.plan/1",
            "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "seq_len": 2048,
                         "global_batch": 16},
            "plan": plan, "estimate": {}}


def _cpu_profile_doc() -> dict:
    """A CF CPU profile as `paraplan cf profile` writes it (made-up rates on its grids)."""
    from paraplan.cf import profile as cfp
    mib = 2**20
    ws, traffic, calls = [16384.0, 1.0 * mib, 64.0 * mib], [0, mib, 16 * mib], [512, 16384]
    rows = [[[t * f / c for f in (1.0, 1.4, 1.9)] for t in (8e-9, 25e-9, 90e-9)] for c in (1.0, 2.0)]
    ew = [16384.0, 64.0 * mib]
    doc = dict(threads=1, row_bytes=256, ws_bytes=ws, row_time_s=[r[0] for r in rows[0]], flops_per_s=8e10,
               stream_sizes_bytes=ew, stream_bytes_per_s=[9e10, 1.2e10], op_overhead_s=2e-6, rng_s_per_element=1e-9,
               tiled_step_fixed_s=1e-4, baseline_step_fixed_s=2e-4, index_s_per_element=1e-9, ew_sizes_bytes=ew,
               ew_s_per_byte=[1e-10, 2e-10], red_s_per_byte=[1e-10, 2e-10], zeros_s_per_byte=[1e-10, 1e-10],
               bmm_m=list(cfp.BMM_M_GRID), bmm_n=list(cfp.BMM_N_GRID),
               bmm_s_per_flop={f: [[[1.2e-11] * len(cfp.BMM_N_GRID)] * len(cfp.BMM_M_GRID),
                                   [[2.5e-11] * len(cfp.BMM_N_GRID)] * len(cfp.BMM_M_GRID)] for f in cfp.BMM_FORMS},
               index_add_row_time_s=[r[0] for r in rows[0]], fault_s_per_byte=1e-10, perm_s_per_element=1e-9,
               traffic_bytes=traffic, bmm_traffic_bytes=[0, 16 * mib], gather_call_rows=calls,
               row_time_traffic_s=rows, index_add_row_time_traffic_s=rows, bool_s_per_byte=[2e-10, 2e-10],
               tiled_step_fixed_traffic_s=[1e-4, 2e-4, 4e-4], baseline_step_fixed_traffic_s=[2e-4, 3e-4, 5e-4],
               index_block_bytes=[512 * 1024.0, 32.0 * mib], index_s_per_element_by_block=[1e-9, 8e-9],
               ew_traffic_bytes=[0, 64 * mib], ew_traffic_s_per_byte={op: [[1e-10, 1e-10], [3e-10, 3e-10]]
                                                                      for op in cfp.EW_OPS},
               host="fuzz", version=cfp.PROFILE_VERSION)
    return doc


@dataclass(frozen=True)
class FileSpec:
    """An input file a command reads: its name, format, valid document and the flag naming it."""
    name: str
    fmt: str                  # yaml | json | sqlite | text (a log: its lines are mutated)
    doc: dict | str | None
    flag: str                 # the flag or argument that names the file (what file-level errors name)
    field_names: tuple[str, ...] = ()     # what else an error about the whole file may be called


@dataclass
class Case:
    """One fuzz case: ``argv`` (``{d}`` stands for the case's folder), the files to create there,
    the names an error line may give the field by, and how to run it."""
    cause: str
    argv: list[str]
    files: dict[str, object] = field(default_factory=dict)    # name -> str | bytes | DIR | ("sqlite", kind)
    fields: tuple[str, ...] = ()
    mode: str = "main"        # main | validate-args | profile-args
    subprocess: bool = False


DIR = object()    # a file entry that is a folder
MISSING = object()    # a file entry that is not there (also when the base command has the file)


# --- the commands and their flags ----------------------------------------------------------------
def _bases():
    """(command, argv, value flags, files) for each base invocation."""
    model = FileSpec("model.yaml", "yaml", MODEL_DOC, "--model", ("model",))
    model_json = FileSpec("model.json", "json", MOE_MODEL_DOC, "--model", ("model",))
    hf = FileSpec("config.json", "json", HF_LLAMA, "--model", ("model",))
    gpt2 = FileSpec("gpt2/config.json", "json", HF_GPT2, "--model", ("model",))
    mixtral = FileSpec("mixtral/config.json", "json", HF_MIXTRAL, "--model", ("model",))
    cluster = FileSpec("cluster.yaml", "yaml", CLUSTER_DOC, "--cluster", ("cluster",))
    planf = FileSpec("plan.json", "json", _plan_doc(), "--plan", ("plan", "schema"))
    exportf = FileSpec("plan.json", "json", _plan_doc(), "PLAN.json", ("plan", "schema", "PLAN.json"))
    scen = FileSpec("scenario.yaml", "yaml", SCENARIO_DOC, "--scenario", ("scenario",))
    cpuprof = FileSpec("cpuprof.json", "json", _cpu_profile_doc(), "--profile", ("profile",))
    db = FileSpec("profiles.sqlite", "sqlite", None, "--db", ("db", "cluster"))
    runs = FileSpec("runs.csv", "csv", RUN_ROW, "RUNS.csv", ("runs.csv", "RUNS.csv", "cell", "column"))
    est = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
           "--global-batch", "16", "--tp", "2", "--micro-batch", "1", "--zero", "1", "--format", "json"]
    plan = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
            "--global-batch", "16", "--top", "3", "--no-stage-ilp", "--format", "json"]
    whatif = ["whatif", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--sweep", "gpus=8,16",
              "--no-heatmap", "--quiet", "--out", "{d}/report"]
    cfplan = ["cf", "plan", "--cpu", "epyc-7742", "--users", "5000", "--items", "20000", "--interactions",
              "200000", "--negatives", "64", "--dim", "64", "--threads", "4", "--top", "3", "--format", "json"]
    validate = ["validate", "--nproc-per-node", "2", "--tp", "2", "--layers", "2", "--hidden", "32", "--heads", "4",
                "--seq-len", "16", "--vocab", "64", "--steps", "1", "--warmup", "0", "--timeout", "60",
                "--out", "{d}/val"]
    profile = ["profile", "--quick", "--world-sizes", "2", "--db", "{d}/profiles.sqlite"]
    score = ["score", "{d}/runs.csv", "--format", "json"]
    log = FileSpec("run.log", "text", LOG_TEXT, "--log", ("log",))
    report = FileSpec("dp2/report.json", "json", json.loads((DATA / "traces" / "dp2" / "report.json").read_text()),
                      "RUN_DIR", ("report", "run", "dp2"))
    score_log = ["score", "--log", "{d}/run.log", "--gpu", "A100-80GB", "--format", "json"]
    calibrate = ["calibrate", "{d}/dp2", "{d}/tp2", "{d}/pp2", "--cluster", "profile:vm", "--db",
                 "{d}/profiles.sqlite", "--format", "json"]
    calibrate_cluster = ["calibrate", "--cluster", "{d}/cluster.yaml", "--runs-csv", "{d}/runs.csv",
                         "--write-cluster", "{d}/calibrated.yaml", "--format", "json"]
    cal_runs = FileSpec("runs.csv", "csv", RUN_ROW, "--runs-csv", ("runs-csv", "runs.csv", "RUNS.csv", "cell", "column"))
    return [
        ("estimate", est, ("--gpus", "--seq-len", "--global-batch", "--tp", "--pp", "--cp", "--vpp", "--micro-batch",
                           "--zero", "--dp", "--ep", "--etp", "--schedule", "--recompute", "--moe-imbalance",
                           "--oversubscription", "--first-stage-layers", "--last-stage-layers", "--engine",
                           "--offload-activation-layers", "--recompute-modules",
                           "--sp-mode", "--dtype", "--offload", "--model", "--cluster", "--format", "--trace"),
         (model, model_json, hf, gpt2, mixtral, cluster, planf, db)),
        ("plan", plan, ("--gpus", "--seq-len", "--global-batch", "--top", "--max-memory-fraction", "--fix",
                        "--moe-imbalance", "--oversubscription", "--engine", "--model", "--cluster", "--out",
                        "--format", "--network", "--trace"),
         (model, model_json, hf, gpt2, cluster, db)),
        ("export", ["export", "{d}/plan.json", "--to", "megatron"], ("--to", "--out", "PLAN.json"), (exportf,)),
        ("whatif", whatif, ("--gpus", "--seq-len", "--global-batch", "--sweep", "--price-per-gpu-hour",
                            "--train-tokens", "--max-memory-fraction", "--fix", "--out", "--tp", "--model",
                            "--cluster"),
         (scen, model, cluster)),
        ("list", ["list", "models"], (), ()),
        ("cf plan", cfplan, ("--cpu", "--users", "--items", "--interactions", "--negatives", "--dim", "--threads",
                             "--top", "--batch", "--margin", "--negative-weight", "--history", "--gate",
                             "--optimizer", "--min-sampling-space", "--cache-level", "--dataset", "--profile"),
         (cpuprof,)),
        ("validate", validate, ("--nproc-per-node", "--nnodes", "--node-rank", "--tp", "--pp", "--cp", "--dp", "--zero",
                                "--micro-batch", "--global-batch", "--virtual-stages", "--steps", "--warmup",
                                "--layers", "--hidden", "--heads", "--seq-len", "--vocab", "--timeout", "--out",
                                "--recompute", "--offload", "--attention", "--db", "--predicted", "--ep", "--etp", "--experts",
                                "--top-k", "--expert-ffn", "--moe-imbalance", "--activation", "--norm", "--kv-heads"), ()),
        ("profile", profile, ("--world-sizes", "--db"), (db,)),
        ("score", score, ("RUNS.csv", "--out", "--format"), (runs,)),
        ("score log", score_log, ("--gpu", "--gpus", "--model", "--tp", "--pp", "--vpp", "--micro-batch", "--dtype",
                                  "--warmup", "--log-kind", "--write-rows", "--seq-len", "--global-batch", "--format"),
         (log,)),
        ("calibrate", calibrate, ("--cluster", "--db", "--name", "--runs-csv", "--format"), (report,)),
        ("calibrate cluster", calibrate_cluster, ("--cluster", "--runs-csv", "--write-cluster", "--format"),
         (cluster, cal_runs)),
    ]


#: the flags of each command that take text (names, paths, expressions): odd unicode goes there
STRING_FLAGS = {
    "estimate": ("--model", "--cluster", "--db", "--plan", "--recompute-modules", "--sp-mode", "--engine", "--trace"),
    "plan": ("--model", "--cluster", "--db", "--out", "--fix", "--engine", "--dtype"),
    "export": ("PLAN.json", "--out", "--to"),
    "whatif": ("--model", "--cluster", "--out", "--scenario", "--sweep", "--fix", "--plan"),
    "list": ("WHAT",),
    "cf plan": ("--cpu", "--dataset", "--profile", "--optimizer"),
    "validate": ("--out", "--plan", "--db", "--predicted", "--rdzv-endpoint", "--recompute-modules"),
    "profile": ("--db",),
    "score": ("RUNS.csv", "--out"),
    "score log": ("--log", "--gpu", "--model", "--write-rows", "--log-kind"),
    "calibrate": ("RUN_DIR", "--cluster", "--db", "--name", "--runs-csv"),
    "calibrate cluster": ("--cluster", "--runs-csv", "--write-cluster"),
}


OUT_VALUES = ("{d}", "{d}/afile/x.json", "/proc/paraplan-fuzz/out", "{d}/" + "n" * 300, "{d}/ok-out", "")


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with ``flag``'s value replaced (or the flag added) — for the positionals PLAN.json, RUNS.csv and
    list's WHAT too."""
    argv = list(argv)
    if flag in ("PLAN.json", "RUNS.csv", "WHAT", "RUN_DIR"):
        argv[1] = value
        return argv
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def _typo(rng: random.Random, word: str) -> str:
    body = word.lstrip("-")
    prefix = word[:len(word) - len(body)]
    if len(body) < 3:
        return word + "x"
    i = rng.randrange(len(body))
    op = rng.choice(("drop", "swap", "add"))
    if op == "drop":
        body = body[:i] + body[i + 1:]
    elif op == "swap" and i < len(body) - 1:
        body = body[:i] + body[i + 1] + body[i] + body[i + 2:]
    else:
        body = body[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz") + body[i:]
    return prefix + body


#: what a profile database given to --db may be: not one (text, empty, a folder, missing, truncated, damaged
#: pages), another program's or an older paraplan's (foreign tables, tables or columns missing), one with
#: broken rows, one another process holds locked, one in a folder that cannot be written, and valid ones
#: (rollback journal or WAL) that the command reads to the end
DB_KINDS = ("text", "empty", "dir", "missing", "truncated", "foreign", "schema-only", "bad-rows", "old-schema",
            "missing-tables", "corrupt", "locked", "locked-wal", "readonly", "readonly-wal", "valid", "valid-wal",
            "future-columns", "null-shapes")


def _mode(command: str) -> str:
    return {"validate": "validate-args", "profile": "profile-args"}.get(command, "main")


def _file_case(rng: random.Random, command: str, argv: list[str], spec: FileSpec) -> Case:
    """The base command reading ``spec`` with one change to that file."""
    flag_value = "{d}/" + spec.name
    if spec.flag != "RUN_DIR":             # a run folder's report.json is read from the folder named
        argv = _set_flag(argv, spec.flag, flag_value)
    if spec.flag == "--profile" and "--threads" in argv:       # the profile's threads are used
        j = argv.index("--threads")
        argv = argv[:j] + argv[j + 2:]
    whole = (spec.flag, *spec.field_names)
    if spec.fmt == "sqlite":
        if "--cluster" in argv:
            argv = _set_flag(argv, "--cluster", rng.choice(("profile:fz-host", "profile:fz-host", "local",
                                                            "profile:fz0000", "profile:\udc80")))
        kind = rng.choice(DB_KINDS)
        name = f"ro/{spec.name}" if kind.startswith("readonly") else spec.name
        if name != spec.name:
            argv = _set_flag(argv, spec.flag, "{d}/" + name)
        return Case(f"file {spec.name}: {kind}", argv, {name: ("sqlite", kind)}, whole, _mode(command))
    if spec.fmt == "text":
        return _text_file_case(rng, command, argv, spec, whole)
    doc = json.loads(json.dumps(spec.doc))
    r = rng.random()
    if r < 0.3:
        kind = rng.choice(("empty", "non-utf8", "truncated", "deep", "list", "scalar", "dir", "missing", "binary",
                           "big-number", "anchors", "dup-keys"))
        text = dump(doc, spec.fmt)
        content: object = {
            "empty": "", "non-utf8": b"\xff\xfe\xfa" + text.encode()[:40] + b"\xc3\x28", "truncated": text[:len(text) // 2],
            "deep": "[" * 50000 + "]" * 50000, "list": dump([doc], spec.fmt), "scalar": "42", "dir": DIR,
            "missing": None, "binary": bytes(range(256)) * 4, "big-number": BIG_DIGITS,
            "anchors": "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n"
                       "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n",
            "dup-keys": text + ("\nname: again\n" if spec.fmt == "yaml" else "")}[kind]
        files = {spec.name: MISSING if content is None else content}
        return Case(f"file {spec.name}: {kind}", argv, files, whole, _mode(command))
    # one key: the top level, or one level down (plan file's plan/scenario, a model's moe block)
    holder, prefix = doc, ""
    nested = [k for k, v in doc.items() if isinstance(v, dict) and v]
    if nested and rng.random() < 0.6:
        sub = rng.choice(nested)
        holder, prefix = doc[sub], sub + "."
    key = rng.choice(sorted(holder))
    r = rng.random()
    if r < 0.15:
        del holder[key]
        what = "removed"
    elif r < 0.22:
        holder[_typo(rng, key)] = holder.pop(key)
        what = "misspelt"
    else:
        value = rng.choice(KEY_VALUES)
        holder[key] = value
        what = f"= {value!r}"[:40] if value not in (S_BIG, S_NAN, S_INF, S_NINF, S_DEEP) else f"= {value}"
    fields_ = (key, prefix + key, spec.flag, *spec.field_names, *_canonical_names(key))
    if what == "misspelt":        # the error may name the misspelt key or the one now missing
        fields_ = tuple(holder) + fields_
    return Case(f"file {spec.name}: key {prefix}{'*' if what == 'misspelt' else key} {what.split(' ')[0]}",
                argv, {spec.name: dump(doc, spec.fmt)}, fields_, _mode(command))


def _text_file_case(rng: random.Random, command: str, argv: list[str], spec: FileSpec, whole: tuple) -> Case:
    """A text input (a training log) damaged as a whole, or in its lines: a block of lines cut, a number in a
    line replaced by a hostile value, a line repeated many times, the lines shuffled."""
    text = str(spec.doc)
    lines = text.splitlines(keepends=True)
    r = rng.random()
    if r < 0.3:
        kind = rng.choice(("empty", "non-utf8", "truncated", "deep", "dir", "missing", "binary", "big-number", "crlf"))
        content: object = {"empty": "", "non-utf8": b"\xff\xfe\xfa" + text.encode()[:400] + b"\xc3\x28",
                           "truncated": text[:rng.randrange(1, len(text))], "deep": "[" * 50000 + "]" * 50000,
                           "dir": DIR, "missing": MISSING, "binary": bytes(range(256)) * 4, "big-number": BIG_DIGITS,
                           "crlf": text.replace("\n", "\r\n")}[kind]
        return Case(f"file {spec.name}: {kind}", argv, {spec.name: content}, whole, _mode(command))
    i = rng.randrange(len(lines))
    if r < 0.5:
        j = min(len(lines), i + rng.randint(1, 40))
        what, lines = "lines cut", lines[:i] + lines[j:]
    elif r < 0.85:
        numbered = [k for k, ln in enumerate(lines) if re.search(r"\d", ln)]
        k = rng.choice(numbered)
        value = str(rng.choice(FLAG_VALUES))
        what = f"number = {_value_class(value)}"
        lines[k] = re.sub(r"\d+(\.\d+)?", lambda m: value if rng.random() < 0.5 else m.group(0), lines[k], count=3)
    elif r < 0.93:
        what, lines = "line repeated", lines[:i] + [lines[i]] * 2000 + lines[i:]
    else:
        rng.shuffle(lines)
        what = "lines shuffled"
    return Case(f"file {spec.name}: {what}", argv, {spec.name: "".join(lines)}, whole, _mode(command))


def _canonical_names(key: str) -> tuple[str, ...]:
    """paraplan's own name for a Hugging Face config key (``n_head`` -> ``heads``): a rule that
    reads the model (heads % tp, say) names the field in paraplan's words."""
    from paraplan.workloads.presets import HF_KEYS
    return tuple(field + "(" for field, keys in HF_KEYS.items() if key in keys)


def make_cases(n: int, seed: int = 0, subprocess_every: int = 0) -> list[Case]:
    """``n`` cases from ``seed`` (the same list every time)."""
    rng = random.Random(seed)
    bases = _bases()
    weights = {"estimate": 5, "plan": 3, "export": 2, "whatif": 0.6, "list": 1, "cf plan": 2, "validate": 2,
               "profile": 1, "score": 1.5, "score log": 1.5, "calibrate": 0.8, "calibrate cluster": 0.8}
    calibrate_files = {**_run_dir_files(), "profiles.sqlite": ("sqlite", "fixture")}
    cases = []
    for i in range(n):
        command, argv, flags, files = rng.choices(bases, weights=[weights[b[0]] for b in bases])[0]
        argv = list(argv)
        base_files = {"export": {"plan.json": dump(_plan_doc(), "json")},
                      "score": {"runs.csv": dump(RUN_ROW, "csv")}, "score log": {"run.log": LOG_TEXT},
                      "calibrate": calibrate_files,
                      "calibrate cluster": {"runs.csv": dump(RUN_ROW, "csv"), "cluster.yaml": dump(CLUSTER_DOC, "yaml")},
                      }.get(command, {})
        r = rng.random()
        if files and r < 0.38:
            case = _file_case(rng, command, argv, rng.choice(files))
        elif r < 0.5:
            case = _string_case(rng, command, argv)
        elif flags and r < 0.85:
            flag = rng.choice(flags)
            value = rng.choice(OUT_VALUES if flag in ("--out", "--trace", "--write-rows", "--write-cluster")
                               and rng.random() < 0.7
                               else FLAG_VALUES)
            files_: dict = {}
            if "afile" in value:
                files_["afile"] = "a file, not a folder\n"
            if flag == "--fix":
                value = rng.choice(("tp", "zero", "schedule", "recompute", "pp", "cp", "bogus", "flash_attention",
                                    "recompute_modules")) + \
                    "=" + value
            if flag == "--sweep":
                value = rng.choice(("gpus", "seq_len", "hbm", "host_link_bandwidth", "cluster", "offload", "bogus")) + "=" + value
            case = Case(f"{command} {flag} {_value_class(value)}", _set_flag(argv, flag, value), files_,
                        _flag_names(flag), _mode(command))
        elif r < 0.93:
            i_flag = [j for j, a in enumerate(argv) if a.startswith("--") and len(a) > 5]
            if not i_flag:
                case = Case(f"{command} extra argument", argv + ["--bogus-flag"], {}, ("--bogus-flag",), _mode(command))
            else:
                j = rng.choice(i_flag)
                bad = _typo(rng, argv[j])
                argv[j] = bad
                case = Case(f"{command} mistyped flag", argv, {}, (bad, argv[j]), _mode(command))
        else:
            choice_flags = {"--format": "json", "--to": "megatron", "--schedule": "1f1b", "--recompute": "selective",
                            "--zero": "1", "--engine": "megatron", "--cpu": "epyc-7742", "--cluster": "dgx-h100",
                            "--model": "llama3-8b", "models": "models", "--attention": "math",
                            "--log-kind": "megatron"}
            present = [f for f in choice_flags if f in argv or f in flags]
            if not present:
                case = Case(f"{command} no arguments", argv[:1] if command != "cf plan" else argv[:2], {},
                            ("required", "--", "command", "cf_command"), _mode(command))
            else:
                flag = rng.choice(present)
                bad = _typo(rng, choice_flags[flag])
                if flag == "models":
                    argv[-1] = bad
                    case = Case(f"{command} mistyped choice", argv, {}, ("what", bad), _mode(command))
                else:
                    case = Case(f"{command} mistyped choice {flag}", _set_flag(argv, flag, bad), {},
                                (flag, flag.lstrip("-"), bad), _mode(command))
        case.files = {**base_files, **case.files}
        if subprocess_every and i % subprocess_every == 0 and case.mode == "main" and _passable(case.argv):
            case.subprocess = True
        cases.append(case)
    return cases


def _flag_names(flag: str) -> tuple[str, ...]:
    """What an error about ``flag`` may call it: the flag, its field name, and the flag it is another
    spelling of (validate's --virtual-stages is --vpp: its errors name --vpp)."""
    from paraplan.cli.common import OTHER_SPELLINGS
    names = (flag, *((OTHER_SPELLINGS[flag],) if flag in OTHER_SPELLINGS else ()))
    return tuple(n for f in names for n in (f, f.lstrip("-"), f.lstrip("-").replace("-", "_")))


def _passable(argv) -> bool:
    """Whether a real command line can carry ``argv`` (no NUL; lone surrogates only as undecodable bytes)."""
    try:
        return all("\x00" not in a and os.fsencode(a) is not None for a in argv)
    except UnicodeEncodeError:
        return False


def _string_case(rng: random.Random, command: str, argv: list[str]) -> Case:
    """A text flag of the command (a name, a path, an expression) set to odd unicode: alone, inside a
    name, as a file name in the case's folder, or after a key (--fix tp=..., --sweep gpus=...)."""
    flag = rng.choice(STRING_FLAGS[command])
    odd = rng.choice(ODD_TEXT)
    shape = rng.choice(("alone", "name", "path", "path", "yaml"))
    value = {"alone": odd, "name": f"llama3{odd}8b", "path": "{d}/" + odd, "yaml": "{d}/m" + odd + ".yaml"}[shape]
    if flag in ("--fix", "--sweep"):
        value = rng.choice(("tp", "gpus", "zero", odd)) + "=" + rng.choice((odd, "8", f"8,{odd}"))
    fields = (flag, flag.lstrip("-"), flag.lstrip("-").replace("-", "_"), "model", "cluster", "plan", "db", "out",
              "fix", "sweep", "RUNS.csv", "what", "cpu", "dataset", "profile", "scenario", "predicted", "to")
    return Case(f"{command} {flag} odd text {shape}", _set_flag(argv, flag, value), {}, fields, _mode(command))


def _value_class(value: str) -> str:
    """A short label of a hostile value (for counting by cause)."""
    v = value.split("=", 1)[-1]
    if len(v) > 100:
        return "5000 digits" if v.isdigit() else "long text"
    return repr(v)


# --- running -------------------------------------------------------------------------------------
class CaseTimeout(BaseException):
    """Raised by the alarm when a case runs past WALL_LIMIT_S."""


@dataclass
class Result:
    case: Case
    rc: int | None
    output: str
    seconds: float        # wall
    cpu_seconds: float    # CPU time of this process (in-process) or of the child (subprocess)
    verdict: str          # ok | traceback | hang | unnamed | warning | exit-code


def _encode(text: str) -> bytes:
    """UTF-8 bytes of a case file's text, lone surrogates kept as the bytes they stand for (\\udc80-\\udcff:
    bytes that are not UTF-8) or as surrogate code points encoded anyway (others): what a damaged file holds."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _make_files(case: Case, d: Path) -> list:
    """Create the case's files in ``d``; returns what must stay open, or be undone, after the case."""
    held = []
    for name, content in case.files.items():
        p = d / name
        if content is MISSING:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            p.mkdir()
        elif isinstance(content, tuple):
            held += _make_db(p, content[1])
            if content[1].startswith("readonly"):
                held += _read_only(p.parent)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_bytes(_encode(content))
    return held


class _Unmount:
    def __init__(self, folder: Path):
        self.folder = folder

    def close(self) -> None:
        subprocess.run(["umount", "--lazy", str(self.folder)], capture_output=True)


class _Writable:
    def __init__(self, folder: Path):
        self.folder = folder

    def close(self) -> None:
        for p in (self.folder, *self.folder.iterdir()):
            os.chmod(p, 0o755)


def _read_only(folder: Path) -> list:
    """Make ``folder`` and what is in it unwritable: permission bits (enough for a user), and for root,
    who writes through them, a read-only bind mount where the machine allows one."""
    for p in (*folder.iterdir(), folder):
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    held: list = [_Writable(folder)]
    if os.geteuid() == 0:
        ok = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
        if ok:
            held.insert(0, _Unmount(folder))
            subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True)
    return held


FINGERPRINT = "fz00000000000000"


def profile_rows() -> list[dict]:
    """Measurement rows of a small made-up CPU profile, as `paraplan profile` stores them (GEMMs, attention,
    memory copy, launch, device memory, collectives at 2 ranks): enough for --cluster profile:fz-host."""
    rows = []
    for dtype, slower in (("float32", 1.0), ("bfloat16", 0.7)):
        for n, t in ((64, 2e-5), (128, 8e-5), (256, 4e-4), (512, 3e-3)):
            rows.append({"kind": "gemm", "op": "matmul", "device": "cpu", "dtype": dtype, "world_size": 1,
                         "shape": {"m": n, "n": n, "k": n}, "flops": 2.0 * n ** 3, "time_s": t * slower,
                         "flops_per_s": 2.0 * n ** 3 / (t * slower)})
    for f, t in ((1e7, 1e-3), (1e8, 5e-3)):
        rows.append({"kind": "sdpa", "op": "sdpa", "device": "cpu", "dtype": "float32", "world_size": 1,
                     "shape": {"b": 1, "h": 4, "s": 64, "d": 16}, "flops": f, "time_s": t, "flops_per_s": f / t})
    rows += [{"kind": "memcpy", "op": "copy", "device": "cpu", "dtype": "float32", "world_size": 1, "shape": {},
              "bytes": 1 << 24, "time_s": 1e-3, "bandwidth_bytes_per_s": 2e10},
             {"kind": "launch", "op": "add", "device": "cpu", "world_size": 1, "shape": {}, "time_s": 2e-6},
             {"kind": "device", "op": "memory", "device": "cpu", "world_size": 1, "shape": {}, "bytes": 8 << 30}]
    for op, steps in (("all_reduce", 2), ("all_gather", 1), ("reduce_scatter", 1), ("all_to_all", 1),
                      ("send_recv", 1)):
        for size in (4096, 65536, 1 << 20):
            t = steps * 1e-4 + size / 1e9
            rows.append({"kind": "collective", "op": op, "device": "cpu", "dtype": "float32", "world_size": 2,
                         "shape": {"bytes": size}, "bytes": size, "time_s": t, "bus_bandwidth_bytes_per_s": size / t})
    return rows


def _store_profile(p: Path, wal: bool) -> None:
    """A valid profile database of machine ``fz-host`` (rollback journal, or WAL as `paraplan profile`
    leaves it), written with paraplan's own store."""
    from paraplan.profiles.store import COLUMNS, SCHEMA
    con = sqlite3.connect(p)
    con.executescript(SCHEMA)
    if wal:
        con.execute("PRAGMA journal_mode = WAL")
    con.execute("INSERT INTO machines VALUES (?,?,?,?,?,?,?)", (FINGERPRINT, "fz-host", "cpu", 2, "2.0", "[]", 0))
    con.execute("INSERT INTO runs (fingerprint, mode, started, finished) VALUES (?, 'quick', 0, 0)", (FINGERPRINT,))
    con.executemany(f"INSERT INTO measurements (run_id, {', '.join(COLUMNS)}) VALUES (1, {', '.join('?' * len(COLUMNS))})",
                    [[json.dumps(r[c]) if c == "shape" else r.get(c) for c in COLUMNS] for r in profile_rows()])
    con.commit()
    con.close()


def _make_db(p: Path, kind: str) -> list:
    """A profile database that is not one, is damaged, is another program's, an old paraplan's, locked,
    read-only, or valid. Returns what must stay open while the case runs (a connection holding a lock)."""
    kind = kind.removeprefix("readonly-") if kind.startswith("readonly-") else kind.replace("readonly", "valid")
    if kind == "missing":
        return []
    if kind == "dir":
        p.mkdir()
        return []
    if kind == "text":
        p.write_text("not a database\n" * 100)
        return []
    if kind == "empty":
        p.write_bytes(b"")
        return []
    if kind == "fixture":               # the profile the calibrate fixtures were predicted with
        from paraplan.profiles.store import ProfileStore
        prof = json.loads((DATA / "traces" / "profile.json").read_text())
        ProfileStore(str(p)).add_run(prof["machine"], "quick", prof["rows"])
        return []
    if kind in ("valid", "wal", "valid-wal", "locked", "locked-wal", "corrupt", "truncated"):
        _store_profile(p, wal=kind in ("wal", "valid-wal", "locked-wal"))
        if kind == "truncated":
            data = p.read_bytes()
            p.write_bytes(data[:len(data) // 3])
        if kind == "corrupt":           # every page after the first scribbled over: 'database disk image is malformed'
            data = bytearray(p.read_bytes())
            page = int.from_bytes(data[16:18], "big") or 65536
            for start in range(page, len(data), page):
                data[start:start + 64] = bytes((7 * i + 13) % 256 for i in range(64))
            p.write_bytes(bytes(data))
        if kind.startswith("locked"):    # another process in a write transaction (rollback journal: readers wait)
            con = sqlite3.connect(p, isolation_level=None)
            con.execute("BEGIN EXCLUSIVE")
            return [con]
        return []
    con = sqlite3.connect(p)
    if kind == "foreign":
        con.execute("CREATE TABLE measurements (x TEXT)")
        con.execute("CREATE TABLE machines (y INTEGER)")
        con.execute("INSERT INTO machines VALUES (1)")
    elif kind == "missing-tables":      # an older or half-made store: machines only
        con.execute("CREATE TABLE machines (fingerprint TEXT PRIMARY KEY, hostname TEXT)")
        con.execute("INSERT INTO machines VALUES (?, 'fz-host')", (FINGERPRINT,))
    elif kind == "old-schema":          # measurements without spread and the per-op columns of later versions
        con.executescript("""
            CREATE TABLE machines (fingerprint TEXT PRIMARY KEY, hostname TEXT, cpu_model TEXT, cpu_cores INTEGER,
                                   torch_version TEXT, gpus TEXT, first_seen REAL);
            CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT, mode TEXT, started REAL,
                               finished REAL);
            CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER, kind TEXT, op TEXT,
                                       device TEXT, dtype TEXT, shape TEXT, time_s REAL, flops_per_s REAL);""")
        con.execute("INSERT INTO machines VALUES (?,?,?,?,?,?,?)", (FINGERPRINT, "fz-host", "cpu", 2, "2.0", "[]", 0))
        con.execute("INSERT INTO runs (fingerprint, mode, started, finished) VALUES (?, 'q', 0, 0)", (FINGERPRINT,))
        con.execute("INSERT INTO measurements (run_id, kind, op, device, dtype, shape, time_s, flops_per_s) "
                    "VALUES (1, 'gemm', 'matmul', 'cpu', 'float32', '{\"m\": 64, \"n\": 64, \"k\": 64}', 1e-4, 5e9)")
    else:
        from paraplan.profiles.store import SCHEMA
        con.executescript(SCHEMA)
        if kind in ("bad-rows", "future-columns", "null-shapes"):
            con.execute("INSERT INTO machines VALUES (?,'fz-host','cpu',2,'2.0','[]',0)", (FINGERPRINT,))
            con.execute("INSERT INTO runs (fingerprint, mode, started, finished) VALUES (?,'q',0,0)", (FINGERPRINT,))
        if kind == "bad-rows":
            for kindname, shape in (("gemm", "{not json"), ("memcpy", "null"), ("collective", "[1,2]"),
                                    ("autograd", "{}"), ("elementwise", '{"numel": "x"}')):
                con.execute("INSERT INTO measurements (run_id, kind, op, device, dtype, world_size, shape, bytes, "
                            "flops, time_s) VALUES (1, ?, 'op', 'cpu', 'fp32', 'two', ?, -1, 'nan', 0)",
                            (kindname, shape))
        elif kind == "future-columns":  # a later paraplan's store: a column more, values of other types
            con.execute("ALTER TABLE measurements ADD COLUMN future BLOB")
            con.execute("INSERT INTO measurements (run_id, kind, op, device, dtype, world_size, shape, flops_per_s, "
                        "time_s, future) VALUES (1, 'gemm', 'matmul', 'cpu', 'float32', 1, "
                        "'{\"m\": 64, \"n\": 64, \"k\": 64}', X'00ff', 'fast', X'01')")
        elif kind == "null-shapes":
            for r in profile_rows():
                con.execute("INSERT INTO measurements (run_id, kind, op, device, dtype, world_size, shape, bytes, "
                            "time_s) VALUES (1, ?, ?, ?, NULL, NULL, NULL, NULL, NULL)", (r["kind"], r["op"], r["device"]))
    con.commit()
    con.close()
    return []


def _expand(argv: list[str], d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in argv]


def _in_process(case: Case, argv: list[str]) -> int:
    """Run the CLI in this process: ``paraplan.cli.main``, or for validate/profile the parser and the
    argument checks that run before anything is launched."""
    from paraplan.cli import build_parser, main
    if case.mode == "main":
        return main(argv)
    from paraplan.cli.common import run_command
    from paraplan.cli.validate import check_profile_args, check_validate_args
    args = build_parser().parse_args(argv)
    check = check_validate_args if case.mode == "validate-args" else check_profile_args
    return run_command(lambda a: (check(a), 0)[1], args)


def _alarm(signum, frame):
    raise CaseTimeout()


def run_case(case: Case) -> Result:
    """Run one case in a fresh folder and judge what came out."""
    d = Path(tempfile.mkdtemp(prefix="paraplan-fuzz-"))
    cwd = os.getcwd()
    held: list = []
    try:
        held = _make_files(case, d)
        argv = _expand(case.argv, d)
        os.chdir(d)                  # relative outputs land in the case's folder
        t0 = time.perf_counter()
        c0 = time.process_time()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if case.subprocess:
            try:
                # arguments as the bytes a shell passes (a lone \\udc80-\\udcff is a byte that is not UTF-8)
                p = subprocess.run([sys.executable, "-m", "paraplan.cli", *map(os.fsencode, argv)],
                                   capture_output=True, text=True, timeout=WALL_LIMIT_S,
                                   env={**os.environ, "PARAPLAN_PROGRESS": "0"}, cwd=d, errors="replace")
                rc, out = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired:
                rc, out = None, ""
            seconds = time.perf_counter() - t0
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (children.ru_utime - children0.ru_utime) + (children.ru_stime - children0.ru_stime)
        else:
            # streams as a process has them under a UTF-8 locale: stdout strict (a character it cannot
            # encode raises), stderr backslashreplace
            buf_out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
            buf_err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, WALL_LIMIT_S)
            rc = None
            try:
                with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
                    try:
                        rc = _in_process(case, argv)
                    except SystemExit as e:
                        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                    except CaseTimeout:
                        raise
                    except BaseException:   # noqa: B902 - a traceback is what the fuzz looks for
                        import traceback
                        traceback.print_exc(file=buf_err)
                        rc = 1
            except CaseTimeout:
                rc = None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            seconds = time.perf_counter() - t0
            cpu = time.process_time() - c0
            out = "".join(b.buffer.getvalue().decode("utf-8", "replace") for b in (buf_out, buf_err))
        return Result(case, rc, out, seconds, cpu, judge(case, rc, out, cpu))
    finally:
        os.chdir(cwd)
        for h in held:
            h.close()
        shutil.rmtree(d, ignore_errors=True)


INFEASIBLE = re.compile(r"^no tile fits|^one row per thread does not fit|cannot fill \d+ pipeline stages|"
                        r"^no recomputation fits")
ERROR_LINE = re.compile(r"^paraplan[\w -]*: error: (.*)$", re.M)


def judge(case: Case, rc: int | None, out: str, seconds: float) -> str:
    """ok, or what went wrong: hang (killed at WALL_LIMIT_S, or ``seconds`` of CPU > HANG_S), traceback,
    warning (spilled warnings), exit-code (not
    0/2/3), unnamed (exit 2 without one error line naming the field), multiline (the error went on past its line)."""
    if rc is None or seconds > HANG_S:
        return "hang"
    if "Traceback" in out:
        return "traceback"
    if re.search(r"\w*Warning\b", out):
        return "warning"
    if rc not in OK_CODES:
        return "exit-code"
    if rc == 2:
        lines = ERROR_LINE.findall(out)
        if len(lines) != 1:
            return "unnamed"
        after = out[ERROR_LINE.search(out).end():].splitlines()
        if any(ln.strip() and not ln.startswith("(see: ") for ln in after):
            return "multiline"          # the message went on past its line
        if INFEASIBLE.search(lines[0]):
            return "ok"           # a valid answer: nothing fits these (legal) inputs, and it says why
        low = lines[0].lower()
        if not any(f and f.lower() in low for f in case.fields):
            return "unnamed"
    return "ok"


def summarize(results: list[Result]) -> dict:
    verdicts = Counter(r.verdict for r in results)
    return {"cases": len(results), "subprocess_cases": sum(r.case.subprocess for r in results),
            "exit_codes": dict(Counter(str(r.rc) for r in results)),
            "tracebacks": verdicts["traceback"], "hangs": verdicts["hang"],
            "errors_not_naming_field": verdicts["unnamed"], "errors_over_one_line": verdicts["multiline"],
            "warning_spills": verdicts["warning"],
            "other_exit_codes": verdicts["exit-code"],
            "slowest_case_cpu_s": round(max((r.cpu_seconds for r in results), default=0.0), 2),
            "slowest_case": max(results, key=lambda r: r.cpu_seconds).case.cause if results else None,
            "slowest_case_wall_s": round(max((r.seconds for r in results), default=0.0), 2),
            "median_case_wall_s": round(sorted(r.seconds for r in results)[len(results) // 2], 3) if results else None,
            "by_cause": {f"{v}: {c}": n for (v, c), n in
                         Counter((r.verdict, r.case.cause) for r in results if r.verdict != "ok").most_common()}}


def add_summaries(parts: list[dict]) -> dict:
    """One summary of the parts of one run (``--part K/N`` for K = 1..N, same ``--cases`` and ``--seed``):
    counts added, the slowest case the slowest of the parts', seconds added (the wall time the parts took
    one after another); the median of the whole is not known from the parts' and is left out."""
    def add(key):
        out: Counter = Counter()
        for s in parts:
            out.update(s[key])
        return dict(out.most_common())
    slowest = max(parts, key=lambda s: s["slowest_case_cpu_s"])
    counts = ("cases", "subprocess_cases", "tracebacks", "hangs", "errors_not_naming_field", "errors_over_one_line",
              "warning_spills", "other_exit_codes", "seconds")
    total = {k: sum(s[k] for s in parts) for k in counts}
    total["seconds"] = round(total["seconds"], 1)
    ranges = sorted(tuple(s["range"]) for s in parts if "range" in s)
    return {**total, "exit_codes": add("exit_codes"), "slowest_case_cpu_s": slowest["slowest_case_cpu_s"],
            "slowest_case": slowest["slowest_case"],
            "slowest_case_wall_s": max(s["slowest_case_wall_s"] for s in parts), "by_cause": add("by_cause"),
            "parts": len(parts), "ranges": ranges,
            "whole": bool(ranges) and ranges[0][0] == 0 and ranges[-1][1] == total["cases"]
            and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))}     # the parts make up cases 0..n-1


def _part(text: str, n: int) -> tuple[int, int]:
    """The [start, stop) of part ``K/N`` of ``n`` cases."""
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--part must be K/N with 1 <= K <= N, got {text!r}")
    k, parts = int(m.group(1)), int(m.group(2))
    return n * (k - 1) // parts, n * k // parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subprocess", type=int, default=20, help="run this many of the cases as real processes")
    ap.add_argument("--show", type=int, default=3, help="print the output of this many failures")
    ap.add_argument("--json", help="also write the summary to this file")
    ap.add_argument("--part", help="run part K/N of the --cases cases (the same cases a whole run has at those "
                                   "places; run N parts, on other cores or one after another, and --add them)")
    ap.add_argument("--add", nargs="+", metavar="SUMMARY.json", help="print one summary of the parts' summaries "
                                                                    "(written by --part ... --json) and exit")
    args = ap.parse_args(argv)
    if args.add:
        s = add_summaries([json.loads(Path(f).read_text()) for f in args.add])
        print(json.dumps(s, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
        return 0 if s["cases"] == sum(s["exit_codes"].values()) and not s["by_cause"] else 1
    os.environ["PARAPLAN_PROGRESS"] = "0"
    every = max(1, args.cases // args.subprocess) if args.subprocess else 0
    cases = make_cases(args.cases, args.seed, every)
    try:
        start, stop = _part(args.part, len(cases)) if args.part else (0, len(cases))
    except ValueError as e:
        ap.error(str(e))
    cases = cases[start:stop]
    t0 = time.perf_counter()
    results, shown = [], set()
    for i, case in enumerate(cases, 1):
        r = run_case(case)
        results.append(r)
        if r.verdict != "ok" and len(shown) < args.show and r.case.cause not in shown:
            shown.add(r.case.cause)
            print(f"--- {r.verdict}: {r.case.cause}: {' '.join(r.case.argv)[:300]}\n{r.output[-1500:]}", file=sys.stderr)
        if i % 500 == 0:
            print(f"{i} cases, {time.perf_counter() - t0:.0f} s, failures "
                  f"{sum(x.verdict != 'ok' for x in results)}", file=sys.stderr)
    s = summarize(results)
    s["seconds"] = round(time.perf_counter() - t0, 1)
    s["range"] = [start, stop]
    print(json.dumps(s, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    return 0 if all(r.verdict == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
