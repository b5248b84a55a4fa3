"""The command line's flag set (issue 13): frozen per command, one meaning per flag, no torch for --help.

``tests/data/cli_flags.json`` is the frozen snapshot: every command and subcommand with the sorted
option strings it accepts. A flag added, renamed or dropped fails ``test_flag_set_is_frozen``; update
the snapshot on purpose with ``python tests/test_cli_flags.py --write``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pandas as pd

from paraplan.cli import build_parser, main
from paraplan.cli.common import PLAN_FIELDS_WITHOUT_FLAG, PLAN_FLAGS
from paraplan.cli.whatif import scenario_from_cli
from paraplan.plan import Plan
from paraplan.reports.sweep import resolve_points, run_points

SNAPSHOT = Path(__file__).parent / "data" / "cli_flags.json"

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


def flag_table() -> dict[str, list[str]]:
    """Command path -> sorted option strings: what the snapshot holds."""
    return {name: sorted(o for a in _options(p) for o in a.option_strings) for name, p in _commands(build_parser())}


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
    assert scenario.plan == {"tp": 2, "grad_accumulation_fusion": False}


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
