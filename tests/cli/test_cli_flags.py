"""The command line's flag set (issue 13): frozen per command, one meaning per flag, no torch for --help.

``tests/data/cli_flags.json`` is the frozen snapshot: every command and subcommand with the sorted
option strings it accepts, except the flags generated from the Plan fields (issue 63): a command that
has one for every field records PLAN_FLAGS_ENTRY instead, so a new plan field changes no snapshot;
``test_every_plan_field_has_its_flag_with_help`` checks those flags. A flag added, renamed or dropped
fails ``test_flag_set_is_frozen``; update the snapshot on purpose with
``python tests/cli/test_cli_flags.py --write``.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd

from paraplan.cli import build_parser, main
from paraplan.cli.common import (ENGINE_DEFAULT_HELP, PLAN_FIELDS_WITHOUT_FLAG, PLAN_FLAGS, ParaplanArgumentParser, add_plan_args,
                                 add_plan_flag, plan_flag_kwargs)
from paraplan.cli.whatif import scenario_from_cli
from paraplan.plan import PLAN_FIELD_SPECS, Plan, attribute_docstrings
from paraplan.reports.sweep import resolve_points, run_points

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "cli_flags.json"

# Flags spelt the same on commands of different domains, with a different meaning; kept for
# compatibility. A flag missing here must have the same dest, type, choices and action everywhere.
DIFFERENT_MEANINGS = {
    "--format": "plan can also write csv; estimate and cf plan write table or json",
    "--optimizer": "the LLM's optimizer on estimate/whatif; SGD or Adam of the CF embedding model on cf plan",
    "--sweep": "VAR=VALUES on whatif; the number of tile sizes to measure on cf validate",
}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for the top-level parser and every command and subcommand below it."""
    yield " ".join(path) or "paraplan", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))


def _options(parser: argparse.ArgumentParser):
    """The parser's optional arguments (its own, not its subcommands')."""
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._SubParsersAction)]


#: what the snapshot records for a command that has a flag for every Plan field (add_plan_args)
PLAN_FLAGS_ENTRY = "(a flag per Plan field: add_plan_args)"
#: the commands every one of whose flags must have help text (issue 63: plan, estimate, validate)
COMMANDS_WITH_HELP = ("paraplan", "plan", "estimate", "whatif", "validate", "list", "export", "profile", "cf",
                      "calibrate")
_GENERATED = {name: plan_flag_kwargs(f)[0] for f in fields(Plan) if (name := f.name) in PLAN_FLAGS}


def _is_plan_flag(action: argparse.Action) -> bool:
    """Whether ``action`` is a Plan field's flag as add_plan_args generates it (its dest and spelling)."""
    return _GENERATED.get(action.dest) in action.option_strings and len(action.option_strings) == 1


def _recorded_options(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's option strings, with PLAN_FLAGS_ENTRY for a complete set of generated plan flags."""
    options = _options(parser)
    plan_flags = [a for a in options if _is_plan_flag(a)]
    if {a.dest for a in plan_flags} == set(PLAN_FLAGS):
        return sorted([o for a in options if a not in plan_flags for o in a.option_strings] + [PLAN_FLAGS_ENTRY])
    return sorted(o for a in options for o in a.option_strings)


def flag_table() -> dict[str, list[str]]:
    """Command path -> sorted option strings: what the snapshot holds."""
    return {name: _recorded_options(p) for name, p in _commands(build_parser())}


def _signature(action: argparse.Action) -> tuple:
    """What must agree wherever a flag appears: dest, action kind, value type and choices."""
    kind = getattr(action.type, "__qualname__", repr(action.type)) if action.type else None
    return action.dest, type(action).__name__, kind, tuple(action.choices) if action.choices else None


def test_flag_set_is_frozen():
    assert flag_table() == json.loads(SNAPSHOT.read_text())


def test_a_shared_flag_has_one_meaning():
    seen: dict[str, dict[tuple, list[str]]] = {}
    for name, parser in _commands(build_parser()):
        for action in _options(parser):
            for option in action.option_strings:
                seen.setdefault(option, {}).setdefault(_signature(action), []).append(name)
    differing = {option: sigs for option, sigs in seen.items() if len(sigs) > 1}
    assert set(differing) == set(DIFFERENT_MEANINGS), differing


def test_plan_flags_are_the_plan_fields():
    names = [f.name for f in fields(Plan)]
    assert list(PLAN_FLAGS) == [n for n in names if n not in PLAN_FIELDS_WITHOUT_FLAG]
    est = dict(_commands(build_parser()))["estimate"]
    dests = {a.dest for a in _options(est)}
    assert set(PLAN_FLAGS) <= dests
    spelled = {o for a in _options(est) for o in a.option_strings}
    for old in ("--tp", "--micro-batch", "--zero", "--sp", "--sp-mode", "--plan", "--no-flash-attention",
                "--no-overlap-grad-reduce", "--no-grad-accumulation-fusion", "--offload-params", "--delayed-update"):
        assert old in spelled


def _help(action: argparse.Action) -> str:
    return (action.help or "").strip() if action.help != argparse.SUPPRESS else ""


def test_every_plan_field_has_its_flag_with_help():
    """Each command that takes a whole plan (the snapshot's PLAN_FLAGS_ENTRY) has every Plan field's
    flag, or the recorded alias of a field without one (cp_mode: --sp-mode), each with help; a plan
    flag's help is its field's docstring."""
    docs = attribute_docstrings(Plan)
    assert set(docs) == set(PLAN_FIELD_SPECS), "every Plan field has a docstring"
    whole = [name for name, options in json.loads(SNAPSHOT.read_text()).items() if PLAN_FLAGS_ENTRY in options]
    assert {"estimate", "whatif"} <= set(whole)
    parsers = dict(_commands(build_parser()))
    for name in whole:
        by_option = {o: a for a in _options(parsers[name]) for o in a.option_strings}
        for f in fields(Plan):
            flag = PLAN_FIELDS_WITHOUT_FLAG.get(f.name) or _GENERATED[f.name]
            assert flag in by_option, f"{name}: no {flag} for Plan.{f.name}"
            action = by_option[flag]
            assert _help(action), f"{name} {flag}: no help"
            if f.name in PLAN_FLAGS:
                assert action.dest == f.name
                assert " ".join(docs[f.name].split()) in action.help.replace("%%", "%")


def test_add_plan_args_and_add_plan_flag_give_the_field_docstring_as_help():
    """What any command (validate too) gets from the shared plan flags: the field's docstring on one
    line; a flag that turns off what is on by default says so."""
    ap = ParaplanArgumentParser(prog="x")
    add_plan_args(ap)
    one = ParaplanArgumentParser(prog="y")
    for name in ("tp", "zero", "flash_attention"):
        add_plan_flag(one, name)
    docs = attribute_docstrings(Plan)
    for parser in (ap, one):
        for action in _options(parser):
            if action.dest in PLAN_FLAGS:
                doc = " ".join(docs[action.dest].split())
                suffix = " On by default; this flag turns it off." if action.option_strings[0].startswith("--no-") else ""
                suffix += ENGINE_DEFAULT_HELP if action.dest == "engine" else ""   # the commands' default engine
                assert action.help.replace("%%", "%") == doc + suffix
    helps = {a.option_strings[0]: a.help for a in _options(one)}
    assert set(helps) == {"-h", "--tp", "--zero", "--no-flash-attention"}
    assert helps["--tp"].startswith("Tensor-parallel degree") and "ZeRO stage" in helps["--zero"]
    assert helps["--no-flash-attention"].endswith("this flag turns it off.")


def test_every_flag_has_help():
    """Every --flag of plan, estimate, validate (and the other commands listed) says what it does."""
    parsers = dict(_commands(build_parser()))
    missing = {name: [a.option_strings[0] for a in _options(parsers[name]) if not _help(a)]
               for name in COMMANDS_WITH_HELP}
    assert not any(missing.values()), missing


def _flags_without_help_text(help_text: str) -> list[str]:
    """The option entries of a rendered ``--help`` with no text: argparse prints an entry's help after
    two spaces on its line, or on the next line indented under the help column; an entry without help
    is followed by the next entry, a group heading or nothing."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        m = re.match(r"  (-\S.*?)(?:\s{2,}(\S.*))?$", line)
        if not m:
            continue
        after = lines[i + 1] if i + 1 < len(lines) else ""
        if not m.group(2) and not re.match(r" {3,}\S", after):
            bare.append(m.group(1))
    return bare


def test_help_output_shows_text_for_every_flag():
    """``paraplan plan|estimate|validate --help`` as printed: no flag without text. The check itself
    catches a flag without help."""
    parsers = dict(_commands(build_parser()))
    for name in ("plan", "estimate", "validate"):
        assert _flags_without_help_text(parsers[name].format_help()) == [], name
    ap = ParaplanArgumentParser(prog="x")
    ap.add_argument("--quiet-one", action="store_true")
    ap.add_argument("--a-rather-long-flag-name", choices=("first", "second"))
    ap.add_argument("--said", help="has help")
    assert _flags_without_help_text(ap.format_help()) == ["--quiet-one", "--a-rather-long-flag-name {first,second}"]


def test_plan_flag_parsing():
    ap = build_parser()
    args = ap.parse_args(["estimate", "--zero", "3", "--no-flash-attention", "--offload-params", "--tp", "2"])
    assert (args.zero, args.flash_attention, args.offload_params, args.tp) == (3, False, True, 2)
    assert args.grad_accumulation_fusion is None and args.pp is None        # not given: None
    for bad in (["--tp", "0"], ["--zero", "4"], ["--schedule", "nope"], ["--sp-mode", "x"]):
        try:
            ap.parse_args(["estimate", *bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{bad} was accepted")


def test_plan_no_grad_accumulation_fusion_searches_unfused_plans(capsys):
    rc = main(["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--global-batch", "64", "--top", "3",
               "--no-stage-ilp", "--no-grad-accumulation-fusion", "--format", "json"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert rc == 0 and plans
    assert all(p["plan"]["grad_accumulation_fusion"] is False for p in plans)


WHATIF = ["whatif", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--sweep", "gpus=8,16", "--seq-len",
          "2048", "--global-batch", "64", "--no-grad-accumulation-fusion", "--quiet"]


def test_whatif_no_grad_accumulation_fusion_keeps_the_search(tmp_path):
    """The bug: the flag alone made whatif re-estimate a default plan (tp1 pp1 ...) at every point."""
    args = build_parser().parse_args(WHATIF + ["--out", str(tmp_path / "r")])
    scenario = scenario_from_cli(args)
    assert scenario.plan is None and scenario.replans and scenario.grad_accumulation_fusion is False
    results = run_points(resolve_points(scenario), scenario)
    assert [r.point.values["gpus"] for r in results] == [8, 16]
    for r in results:
        assert r.feasible, r.reason
        assert r.estimate.plan.grad_accumulation_fusion is False
        assert r.candidates > 1                                  # searched, not one fixed plan


def test_whatif_no_grad_accumulation_fusion_report(tmp_path):
    out = tmp_path / "r"
    assert main(WHATIF + ["--no-heatmap", "--out", str(out)]) == 0
    df = pd.read_csv(out / "points.csv")
    assert list(df["feasible"]) == [True, True]
    again = scenario_from_cli(build_parser().parse_args(["whatif", "--scenario", str(out / "scenario.yaml"),
                                                         "--out", str(tmp_path / "again")]))
    assert again.grad_accumulation_fusion is False and again.plan is None


def test_whatif_other_plan_flags_still_fix_the_plan(tmp_path):
    args = build_parser().parse_args(WHATIF + ["--tp", "2", "--out", str(tmp_path / "r")])
    scenario = scenario_from_cli(args)
    assert scenario.plan["tp"] == 2 and scenario.plan["grad_accumulation_fusion"] is False


def test_whatif_flag_unfuses_a_plan_from_the_scenario_file(tmp_path):
    (tmp_path / "s.yaml").write_text("model: gpt-1.7b\ncluster: dgx-a100-80g\nsweep: {gpus: '8,16'}\n"
                                     "plan: {tp: 2}\n")
    args = build_parser().parse_args(["whatif", "--scenario", str(tmp_path / "s.yaml"),
                                      "--no-grad-accumulation-fusion", "--out", str(tmp_path / "r")])
    scenario = scenario_from_cli(args)
    # the commands' default engine where the file names none (as plan and estimate have it)
    assert scenario.plan == {"tp": 2, "grad_accumulation_fusion": False, "engine": "megatron"}


NO_HEAVY_IMPORTS = """
import sys
import paraplan.cli
assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'import paraplan.cli'
from paraplan.cli import main
try:
    main(['--help'])
except SystemExit:
    pass
assert main(['estimate', '--model', 'gpt-1.7b', '--cluster', 'dgx-a100-80g', '--format', 'json']) == 0
assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'paraplan estimate'
"""


def test_cli_imports_neither_torch_nor_matplotlib():
    r = subprocess.run([sys.executable, "-c", NO_HEAVY_IMPORTS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


if __name__ == "__main__":
    if "--write" in sys.argv:
        SNAPSHOT.write_text(json.dumps(flag_table(), indent=1) + "\n")
        print(f"wrote {SNAPSHOT}")
