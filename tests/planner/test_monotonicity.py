"""benchmarks/monotonicity.py end to end on four of its scenarios (a smaller sample): the checks the
README states as holding on every candidate hold, and dropping recomputation stays within 0.3 %."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "monotonicity", Path(__file__).resolve().parents[2] / "benchmarks" / "monotonicity.py")
monotonicity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(monotonicity)

# a faster GPU may leave a rare host-bound Megatron-FSDP MoE plan marginally slower: its forward window, under
# which the once-per-step parameter all-gather hides, shortens (README: 2 of 160,784 candidates, 0.01 %);
# dropping recomputation leaves this sample's one ZeRO-3 CPU-offload Mixtral plan 0.007 % slower; faster HBM
# leaves 3 of 3,000 Mixtral ZBV plans (full recomputation, NVMe offload) 0.003 % slower: ZBV's bubble,
# (p - 1)(F + B - 3W)/2, takes F, B and W as shares of the stage's time, and faster elementwise kernels shift
# those shares toward the backward's recomputation, which W does not cover
# turning TP overlap on leaves some host-bound Megatron MoE plans up to 0.14 % slower (benchmarks/monotonicity.py: 113
# of 99,252 candidates with the engine switches searched, 195 of 80,531 without): the GPU waits for the host either way (moe_host grows by what TP overlap saves), that wait
# widens the backward's data-parallel window only, and the forward's, under which ZeRO-1's parameter all-gather
# hides, loses the TP time it carried (tpcomm.tp_data_parallel_window_times)
NEAR = {"peak FLOP rate x2", "no recomputation: step time", "HBM bandwidth x2", "TP comm overlap on (tp > 1, sp)"}


@pytest.mark.parametrize("scenario", [monotonicity.SCENARIOS[i] for i in (2, 4, 6, 8)],
                         ids=lambda s: f"{s[0]}-{s[5]}")
@pytest.mark.slow
def test_estimator_moves_the_right_way(scenario):
    name, system, gpus, seq, global_batch, engine, dtype = scenario
    rows = monotonicity.check_scenario(name, system, gpus, seq, global_batch, sample=3000, seed=5,
                                       engine=engine, dtype=dtype)
    assert len(rows) >= 14
    for row in rows:
        assert row["candidates"] > 0 or row["change"].startswith(("expert", "TP comm", "global batch",
                                                                  "fp8 parameters")), row
        if row["change"].startswith("fp8 parameters") and engine == "megatron" and dtype == "fp8":
            assert row["candidates"] > 0, row
        if row["change"] in NEAR:
            assert row["worse"] == 0 or row["worst_ratio"] <= 1.003, row
        else:
            assert row["worse"] == 0, row
