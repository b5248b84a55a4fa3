"""Record (or check) the golden corpus: ``python tests/golden/record.py [--check]``.

Each corpus line runs ``paraplan.cli.main`` in this process; stdout is kept as
``expected/NAME.json`` with the search time (the only field that varies between runs) removed, and
every plan it echoes (``"plan": {...}`` of an estimate) cut to the fields whose values differ from
``Plan``'s defaults: the files compare the estimates and the plans chosen, and a new plan field with a
default rewrites none of them (issue 63).
"""
from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOLATILE = ("search_time_s",)


def off_defaults(doc):
    """``doc`` with each echoed plan (a dict under a "plan" key whose keys are Plan fields) cut to the
    fields whose values differ from Plan's defaults, in Plan's order."""
    from paraplan.plan import PLAN_FIELD_SPECS
    if isinstance(doc, list):
        return [off_defaults(v) for v in doc]
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key == "plan" and isinstance(value, dict) and value and set(value) <= set(PLAN_FIELD_SPECS):
            defaults = {name: spec.default for name, spec in PLAN_FIELD_SPECS.items()}
            out[key] = {k: v for k, v in value.items()
                        if not (type(v) is type(defaults[k]) and v == defaults[k])}
        else:
            out[key] = off_defaults(value)
    return out


def corpus() -> list[tuple[str, list[str]]]:
    rows = []
    for line in (HERE / "corpus.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, argv = (part.strip() for part in line.split("|", 1))
        rows.append((name, shlex.split(argv)))
    return rows


def run(argv: list[str]) -> tuple[int, str]:
    """(exit code, stdout with the volatile fields removed, as indented JSON)."""
    from paraplan.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    try:
        doc = json.loads(out.getvalue())
    except json.JSONDecodeError:
        doc = out.getvalue()
    if isinstance(doc, dict):
        for key in VOLATILE:
            doc.pop(key, None)
    record = {"exit_code": code, "output": off_defaults(doc)}
    if code == 2:  # a user error: its one-line message is part of the behaviour
        record["error"] = err.getvalue()
    return code, json.dumps(record, indent=1) + "\n"


def main() -> int:
    check = "--check" in sys.argv
    (HERE / "expected").mkdir(exist_ok=True)
    bad = 0
    for name, argv in corpus():
        _, text = run(argv)
        path = HERE / "expected" / f"{name}.json"
        if check:
            if path.read_text() != text:
                print(f"DIFFERS: {name}")
                bad += 1
        else:
            path.write_text(text)
            print(f"recorded {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
