"""The golden corpus: ``estimate``, ``plan`` and ``cf plan`` JSON for 38 scenarios, recorded before
the package was reorganised (issue 13). Moving code must not move a number."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_record", HERE / "record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)


@pytest.mark.parametrize("name,argv", record.corpus(), ids=[n for n, _ in record.corpus()])
def test_output_is_byte_identical(name, argv):
    _, text = record.run(argv)
    assert text == (HERE / "expected" / f"{name}.json").read_text()
