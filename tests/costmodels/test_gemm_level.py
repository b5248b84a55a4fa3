"""The GEMM level a training step sustains, per hardware generation (curves.yaml, calibrated by
benchmarks/calibrate_curves.py), is stated in every estimate, and the isolated-kernel level the lent
H100 measured is kept apart from it."""
import pytest

from paraplan.costmodels.efficiency import analytical_curves, isolated_kernel_curves
from paraplan.costmodels.efficiency import gemm_level_assumption
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster, load_part
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def _gemm_line(cluster, gpus, plan):
    e = estimate(load_model("llama3-8b"), TrainingJob(4096, 64), load_cluster(cluster, gpus), plan)
    lines = [a for a in e.assumptions if a.startswith("GEMMs:")]
    assert len(lines) == 1
    return lines[0], e


@pytest.mark.parametrize("cluster, generation", [("dgx-a100-80g", "A100"), ("dgx-h100", "Hopper"),
                                                 ("dgx-b200", "Blackwell")])
def test_each_generation_states_its_own_calibrated_level(cluster, generation):
    line, e = _gemm_line(cluster, 8, Plan(dp=8))
    level = e.efficiency_curves["gemm_sustained_fraction"]
    assert f"x {level:g} sustained" in line
    assert f"calibrated on {generation} by benchmarks/calibrate_curves.py" in line
    assert "assumed for this part" not in line


def test_generations_have_different_levels_and_a_part_without_one_says_it_borrows_a100s():
    levels = {name: analytical_curves(load_part("accelerators", name)).gemm_sustained_fraction
              for name in ("a100-80g", "h100-sxm", "h200", "b200", "gb200", "mi300x")}
    # Hopper's and Blackwell's own calibrations differ from A100's (they may land on one value: each is
    # its generation's own, as test_each_generation_states_its_own_calibrated_level checks by its source)
    assert levels["h100-sxm"] != levels["a100-80g"] and levels["b200"] != levels["a100-80g"]
    assert levels["h200"] == levels["h100-sxm"] and levels["gb200"] == levels["b200"]   # same silicon
    assert levels["mi300x"] == levels["a100-80g"]
    line, _ = _gemm_line("mi300x-x8", 8, Plan(dp=8))
    assert "assumed for this part, which has no calibration of its own" in line


def test_fp8_plans_state_the_fp8_plateau():
    line, _ = _gemm_line("dgx-h100", 8, Plan(dp=8, dtype="fp8"))
    plateau = load_part("accelerators", "h100-sxm").plateau("fp8")
    assert line.startswith(f"GEMMs: {plateau:.3f} of the fp8 peak")


def test_profiled_curves_state_no_analytical_level():
    class Measured:
        kind = "profiled"
        gemm_sustained_fraction = 1.0
    assert gemm_level_assumption(Plan(), Measured()) == ()


def test_isolated_kernels_run_faster_than_a_training_step_sustains_where_measured():
    """The lent H100's isolated GEMMs ran at 0.886 of MAMF; published H100 training steps at the
    calibrated level, below it. A generation with no kernel measurement has one level."""
    hopper = analytical_curves(load_part("accelerators", "h100-sxm"))
    isolated = isolated_kernel_curves(hopper)
    assert isolated.gemm_sustained_fraction == pytest.approx(0.886)
    assert hopper.gemm_sustained_fraction < isolated.gemm_sustained_fraction
    assert isolated.gemm_time(8192, 8192, 8192) < hopper.gemm_time(8192, 8192, 8192)
    a100 = analytical_curves(load_part("accelerators", "a100-80g"))
    assert a100.gemm_isolated_fraction is None and isolated_kernel_curves(a100) is a100
