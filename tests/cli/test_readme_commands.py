"""The README's commands, as typed, in the order a reader meets them: each runs and exits 0 in a fresh
folder, and what it says it writes is there. ``validate`` is left to tests/validation/test_validation_report.py
(the same flags on a smaller model: the README's default-model run profiles the machine first, ~90 s)."""
from __future__ import annotations

import pytest

import json
import re
import shlex
from pathlib import Path


from paraplan.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[list[str]]:
    """Every indented `paraplan ...` line of the README (continuations joined, comments dropped)."""
    commands, lines = [], README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^ {4}paraplan ", line):
            text = line.strip()
            while text.endswith("\\"):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            commands.append(shlex.split(text, comments=True)[1:])
        i += 1
    return commands


def test_the_readme_names_the_commands_this_test_runs():
    names = [c[0] for c in readme_commands()]
    assert names[:6] == ["plan", "plan", "export", "estimate", "whatif", "validate"]
    assert names.count("whatif") == 3


@pytest.mark.slow
def test_readme_commands_run_as_typed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in readme_commands():
        if argv[0] == "validate":
            continue
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        if "--out" in argv:
            target = Path(argv[argv.index("--out") + 1])
            assert target.exists(), (argv, target)
        if argv[0] == "estimate":
            assert json.loads(out)["plan"]["tp"] >= 1
    assert (tmp_path / "build/whatif/report.html").exists()
    assert "--tensor-model-parallel-size" in (tmp_path / "train.sh").read_text()
