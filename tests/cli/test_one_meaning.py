"""One meaning everywhere (issue 67): the commands share one default engine (a real one), one memory margin,
one name per mode, one size syntax; ``plan --out`` says what it wrote and writes it whatever happens to stdout."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paraplan.cli import build_parser, main
from paraplan.cli.common import plan_from_args
from paraplan.cli.whatif import scenario_from_cli
from paraplan.engines import spec_named
from paraplan.plan import Plan
from paraplan.scenario import DEFAULT_ENGINE, DEFAULT_MEMORY_FRACTION

EST = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64"]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64", "--top", "3", "--no-stage-ilp"]
WHATIF = ["whatif", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--sweep", "gpus=8,16"]


def _json(capsys, argv) -> dict:
    assert main(argv) == 0, argv
    return json.loads(capsys.readouterr().out)


# --- one default engine, a real one ---------------------------------------------------------------------
def test_the_commands_default_to_a_real_engine():
    assert spec_named(DEFAULT_ENGINE).codebase is not None and DEFAULT_ENGINE == "megatron"
    assert Plan().engine == "generic"     # Python's Plan() keeps the papers' accounting


def test_estimate_and_plan_use_the_default_engine(capsys):
    assert _json(capsys, EST + ["--tp", "2", "--format", "json"])["plan"]["engine"] == DEFAULT_ENGINE
    doc = _json(capsys, PLAN + ["--format", "json"])
    assert {p["plan"]["engine"] for p in doc["plans"]} == {DEFAULT_ENGINE}


def test_plan_proposes_only_what_the_default_engine_runs(capsys):
    """Before issue 67 the default (generic) search put CPU offload and op-level SAC in the top plans; Megatron-LM
    runs neither."""
    doc = _json(capsys, ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8k",
                         "--global-batch", "512", "--top", "10", "--no-stage-ilp", "--format", "json"])
    spec = spec_named(DEFAULT_ENGINE)
    for p in doc["plans"]:
        assert p["plan"]["offload"] == "none" and p["plan"]["recompute"] in spec.recompute


def test_estimate_of_a_plan_file_keeps_the_files_engine(capsys, tmp_path):
    for engine in ("deepspeed", "generic"):
        out = tmp_path / f"{engine}.json"
        assert main(PLAN + ["--engine", engine, "--out", str(out)]) == 0
        capsys.readouterr()
        assert json.loads(out.read_text())["plan"]["engine"] == engine
        assert _json(capsys, ["estimate", "--plan", str(out), "--format", "json"])["plan"]["engine"] == engine


def test_validate_prices_the_generic_engine_its_harness_runs():
    args = build_parser().parse_args(["validate", "--nproc-per-node", "2", "--tp", "2", "--out", "x"])
    assert plan_from_args(args, default_engine=None).engine == "generic"


def test_generic_says_what_it_is(capsys):
    assert main(PLAN + ["--engine", "generic"]) == 0
    out = capsys.readouterr().out
    assert "engine generic: the ZeRO paper's accounting with no engine's restrictions" in out
    assert "plan (generic: the ZeRO paper's accounting" in out
    assert main(PLAN) == 0
    assert f"engine {DEFAULT_ENGINE} (Megatron-LM, the default" in capsys.readouterr().out


def test_whatif_searches_and_fixes_plans_for_the_default_engine(tmp_path):
    search = scenario_from_cli(build_parser().parse_args(WHATIF + ["--out", str(tmp_path / "a")]))
    assert search.plan is None and search.fixed["engine"] == DEFAULT_ENGINE
    fixed = scenario_from_cli(build_parser().parse_args(WHATIF + ["--tp", "2", "--out", str(tmp_path / "b")]))
    assert fixed.plan["engine"] == DEFAULT_ENGINE
    named = scenario_from_cli(build_parser().parse_args(WHATIF + ["--engine", "deepspeed", "--out", str(tmp_path / "c")]))
    assert named.fixed["engine"] == "deepspeed"


# --- one memory margin ----------------------------------------------------------------------------------
def test_plan_and_whatif_share_one_memory_margin(tmp_path):
    """Before: plan 0.95, whatif 1.0 (the README's H200 point filled 140.8 of 141 GiB)."""
    plan = build_parser().parse_args(PLAN)
    whatif = scenario_from_cli(build_parser().parse_args(WHATIF + ["--out", str(tmp_path / "r")]))
    assert plan.max_memory_fraction == whatif.max_memory_fraction == DEFAULT_MEMORY_FRACTION == 1.0
    (tmp_path / "s.yaml").write_text("model: gpt-1.7b\ncluster: dgx-a100-80g\nsweep: {gpus: '8,16'}\n")
    from_file = scenario_from_cli(build_parser().parse_args(["whatif", "--scenario", str(tmp_path / "s.yaml"),
                                                             "--out", str(tmp_path / "r")]))
    assert from_file.max_memory_fraction == DEFAULT_MEMORY_FRACTION
    given = scenario_from_cli(build_parser().parse_args(WHATIF + ["--max-memory-fraction", "0.9", "--out", "r"]))
    assert given.max_memory_fraction == 0.9


# --- one name per mode ----------------------------------------------------------------------------------
def test_cp_mode_has_one_flag_on_every_command(capsys):
    """Before: --fix cp_mode on plan, --sp-mode on estimate, no --cp-mode anywhere."""
    est = _json(capsys, EST + ["--tp", "2", "--cp", "2", "--cp-mode", "ulysses", "--format", "json"])
    assert est["plan"]["cp_mode"] == "ulysses"
    doc = _json(capsys, PLAN + ["--fix", "cp_mode=ulysses", "--fix", "cp=2", "--format", "json"])
    assert {p["plan"]["cp_mode"] for p in doc["plans"]} == {"ulysses"}
    for command in ("estimate", "whatif", "validate"):
        parser = dict(build_parser()._subparsers._group_actions[0].choices)[command]
        assert "--cp-mode" in {o for a in parser._actions for o in a.option_strings}, command


def test_sp_mode_is_a_deprecated_alias_that_says_so(capsys):
    est = EST + ["--tp", "2", "--cp", "2", "--format", "json"]
    assert main(est + ["--sp-mode", "ulysses"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["plan"]["cp_mode"] == "ulysses"
    assert "--sp-mode is deprecated; use --cp-mode ulysses" in err
    assert main(est + ["--sp-mode", "megatron"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["plan"]["sp"] is True and "use --sp" in err
    assert main(est + ["--sp-mode", "ring", "--cp-mode", "ulysses"]) == 2
    assert "--sp-mode: ring contradicts --cp-mode ulysses" in capsys.readouterr().err


# --- sizes with suffixes --------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, text, value", [("--seq-len", "8k", 8192), ("--seq-len", "128K", 131072),
                                               ("--seq-len", "1M", 2**20), ("--global-batch", "1k", 1024),
                                               ("--gpus", "1k", 1024), ("--global-batch", "1.5k", 1536)])
def test_sizes_take_suffixes_on_every_command(flag, text, value):
    """Before: --seq-len 8k worked on whatif's --sweep only."""
    parser = build_parser()
    for argv in (PLAN, EST, WHATIF + ["--out", "r"]):
        args = parser.parse_args(argv + [flag, text])
        assert getattr(args, flag[2:].replace("-", "_")) == value, argv[0]
    if flag != "--gpus" and value <= 10**6:     # validate's harness takes sizes up to 1,000,000
        v = parser.parse_args(["validate", "--nproc-per-node", "2", "--out", "x", flag, text])
        assert getattr(v, flag[2:].replace("-", "_")) == value


@pytest.mark.parametrize("text", ["8kk", "k", "1.5", "0.3k", "8x", "nan", "inf", "0"])
def test_bad_sizes_are_refused_in_one_line(capsys, text):
    assert main(EST + ["--seq-len", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan estimate: error: --seq-len must be a positive integer (k = 1024, M = 1024^2")
    assert "Traceback" not in err


def test_the_sweep_reads_sizes_with_the_same_parser():
    from paraplan.reports.sweep import parse_sweep, sweep_values
    assert sweep_values(parse_sweep("seq_len=8k,1M"), None) == [8192, 2**20]


# --- plan --out says what it wrote, and writes it first -------------------------------------------------
def test_plan_out_says_what_it_wrote(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(PLAN + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    p = Plan.from_dict(json.loads(out.read_text())["plan"])
    assert f"paraplan: wrote {out} (plan file: {p.label()}, {p.schedule}, ZeRO-{p.zero}, {p.engine}; " in err
    assert f"paraplan export {out} --to {p.engine} launches it" in err


@pytest.mark.slow
def test_plan_out_is_written_when_the_reader_closes_the_pipe(tmp_path):
    """``plan ... --out plan.json | head -1``: head closes the pipe after one line; before issue 67 the file was
    written after the table, and the BrokenPipeError ended the command first."""
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "paraplan.cli", *PLAN, "--out", str(out)]
    r = subprocess.run(f"{subprocess.list2cmdline(cmd)} | head -1", shell=True, capture_output=True, text=True,
                       timeout=300)
    assert r.stdout.startswith("paraplan plan — llama3-8b") and len(r.stdout.splitlines()) == 1
    assert json.loads(out.read_text())["schema"] == "paraplan.plan/1"
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr


def test_a_fix_the_default_engine_refuses_names_the_fix_and_the_default(capsys):
    assert main(PLAN + ["--fix", "offload=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --fix offload: --engine megatron does not offload optimizer states")
    assert "(megatron is the default engine; --engine picks another)" in err
