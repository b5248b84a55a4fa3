"""Held-out accuracy: Korthikanti et al. 2022 (arXiv:2205.05198), Selene A100-80GB, measured step
times (Table 5) and activation memory (Fig. 1). None of these rows was used to calibrate
curves.yaml. Configurations and figures: ``paraplan.calibration.KORTHIKANTI_*`` (from calculon's
validation set, calculon-ai/calculon validation/seqsel/*.json; shapes from Korthikanti Table 3).
"""
import pytest

from paraplan.calibration import (KORTHIKANTI_FIG1_ACTIVATIONS_GIB, KORTHIKANTI_SETUPS, KORTHIKANTI_TABLE5_STEP_S,
                                  korthikanti_estimate)
from paraplan.costmodels.estimate import estimate

GIB = 2**30


@pytest.mark.parametrize("name", list(KORTHIKANTI_SETUPS))
def test_table5_step_times(name):
    """Full recomputation, and sequence parallelism with selective recomputation: within 15 % each
    (benchmarks/accuracy.py prints the table). 12 % and MAPE 4.0 % held while the A100 GEMM level was
    calibrated on SC21 and llm-foundry A100-80GB only; calibrated on every A100 source it sits
    lower, and NVIDIA's own Megatron runs on Selene, these among them, come out pessimistic (+2..+14 %,
    full recomputation the most): the sources disagree by that much at one level."""
    full, seqsel = KORTHIKANTI_TABLE5_STEP_S[name]
    assert korthikanti_estimate(name, estimate, recompute="full").step_time_s == pytest.approx(full, rel=0.15)
    assert korthikanti_estimate(name, estimate, recompute="selective", sp=True).step_time_s == \
        pytest.approx(seqsel, rel=0.15)


def test_table5_step_time_mape_within_10_percent():
    """The eight Table 5 step times together: MAPE 7.7 % at the calibration of every A100 source."""
    errors = [korthikanti_estimate(name, estimate, **kw).step_time_s / measured - 1
              for name, (full, seqsel) in KORTHIKANTI_TABLE5_STEP_S.items()
              for kw, measured in (({"recompute": "full"}, full), ({"recompute": "selective", "sp": True}, seqsel))]
    assert len(errors) == 8
    assert sum(abs(e) for e in errors) / len(errors) <= 0.10


@pytest.mark.parametrize("name", list(KORTHIKANTI_SETUPS))
def test_fig1_activation_memory(name):
    """Activation memory of the first stage without recomputation and with SP + selective: within 10%."""
    none, seqsel = KORTHIKANTI_FIG1_ACTIVATIONS_GIB[name]
    assert korthikanti_estimate(name, estimate).memory_bytes_per_gpu["activations"] / GIB == \
        pytest.approx(none, rel=0.10)
    assert korthikanti_estimate(name, estimate, recompute="selective", sp=True).memory_bytes_per_gpu[
        "activations"] / GIB == pytest.approx(seqsel, rel=0.10)
