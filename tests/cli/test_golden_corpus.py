"""The golden corpus: ``estimate``, ``plan`` and ``cf plan`` JSON for 38 scenarios, recorded before
the package was reorganised (issue 13). Moving code must not move a number. The plans the outputs
echo are kept with only their fields off Plan's defaults (issue 63: ``record.off_defaults``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "golden"
_spec = importlib.util.spec_from_file_location("golden_record", HERE / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)


@pytest.mark.slow
@pytest.mark.parametrize("name,argv", record.corpus(), ids=[n for n, _ in record.corpus()])
def test_output_is_byte_identical(name, argv):
    _, text = record.run(argv)
    assert text == (HERE / "expected" / f"{name}.json").read_text()


def test_echoed_plans_keep_only_the_fields_off_their_defaults():
    """The golden files compare estimates and the plans chosen, not every echoed field: a new plan
    field with a default leaves them as they are."""
    from dataclasses import asdict

    from paraplan.plan import Plan
    plan = asdict(Plan(tp=4, sp=True, flash_attention=False, dp=2))
    doc = {"plan": plan, "plans": [{"plan": dict(plan, tp=1), "step_time_s": 1.0}], "details": {"tp": 4, "x": 1}}
    assert record.off_defaults(doc) == {
        "plan": {"tp": 4, "dp": 2, "sp": True, "flash_attention": False},
        "plans": [{"plan": {"dp": 2, "sp": True, "flash_attention": False}, "step_time_s": 1.0}],
        "details": {"tp": 4, "x": 1}}
    assert list(record.off_defaults(doc)["plan"]) == ["tp", "dp", "sp", "flash_attention"]     # Plan's order
    for name, _ in record.corpus():
        text = (HERE / "expected" / f"{name}.json").read_text()
        assert '"moe_flex_dispatch": false' not in text and '"recompute_modules": ""' not in text, name
