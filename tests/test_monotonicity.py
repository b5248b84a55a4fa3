"""benchmarks/monotonicity.py end to end on two of its scenarios (a smaller sample): the checks the
README states as holding on every candidate hold, and dropping recomputation stays within 0.1 %."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "monotonicity", Path(__file__).resolve().parents[1] / "benchmarks" / "monotonicity.py")
monotonicity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(monotonicity)

# dropping recomputation may leave a rare offload plan marginally slower (README: at most 0.008 %)
NEAR = {"no recomputation: step time"}


@pytest.mark.parametrize("scenario", [monotonicity.SCENARIOS[2], monotonicity.SCENARIOS[3]], ids=lambda s: s[0])
def test_estimator_moves_the_right_way(scenario):
    rows = monotonicity.check_scenario(*scenario, sample=3000, seed=5)
    assert len(rows) >= 14
    for row in rows:
        assert row["candidates"] > 0 or row["change"].startswith("expert"), row
        if row["change"] in NEAR:
            assert row["worse"] == 0 or row["worst_ratio"] <= 1.001, row
        else:
            assert row["worse"] == 0, row
