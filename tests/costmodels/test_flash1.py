"""FlashAttention 1.x as a named attention kernel: FlashAttention-2's work at half its rate (Dao 2023,
arXiv:2307.08691, sec. 4.1), checked against the seed paper's sweep, which ran both kernels."""
import sys
from pathlib import Path

import numpy as np
import pytest

from paraplan.costmodels.attention import FLASH1_TIME_FACTOR, attention_core_times
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import plan_document
from paraplan.planner.export import export
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

A100 = load_cluster("dgx-a100-80g", 8)
H100 = load_cluster("dgx-h100", 8)
MODEL, JOB = load_model("llama1-13b"), TrainingJob(2048, 64)


@pytest.mark.parametrize("cluster, base", [(A100, "auto"), (H100, "flash2")])
def test_flash1_attention_core_takes_twice_its_base(cluster, base):
    """On a generation without a measured table (A100) the base is the calibrated fused-attention
    efficiency, with one (Hopper) the measured FlashAttention-2 curve; forward and backward alike."""
    curves = analytical_curves(cluster.accelerator)
    plan = Plan(tp=1, micro_batch=1)
    f1, b1 = attention_core_times(MODEL, JOB, Plan(tp=1, micro_batch=1, attention_kernel="flash1"), curves)
    f2, b2 = attention_core_times(MODEL, JOB, Plan(tp=1, micro_batch=1, attention_kernel=base), curves)
    assert float(f1) == pytest.approx(FLASH1_TIME_FACTOR * float(f2), rel=1e-12)
    assert float(b1) == pytest.approx(FLASH1_TIME_FACTOR * float(b2), rel=1e-12)
    # nothing else of the layer moves: the step grows by the attention it adds, and the memory is the same
    e1 = estimate(MODEL, JOB, cluster, Plan(tp=1, micro_batch=1, attention_kernel="flash1"))
    e2 = estimate(MODEL, JOB, cluster, Plan(tp=1, micro_batch=1, attention_kernel=base))
    assert e2.step_time_s < e1.step_time_s < 1.2 * e2.step_time_s
    assert e1.memory_bytes_per_gpu == e2.memory_bytes_per_gpu
    assert any("flash1 (FlashAttention 1.x) at 1/2" in a for a in e1.assumptions)
    assert not np.isclose(float(f1), float(attention_core_times(MODEL, JOB, plan, curves)[0]))


def test_flash1_needs_flash_attention():
    with pytest.raises(ConfigError) as e:
        Plan(attention_kernel="flash1", flash_attention=False)
    assert e.value.field == "attention_kernel"


def test_sweep_fa1_against_fa2_pairs_match_the_measured_ratio():
    """The seed paper's sweep ran FlashAttention 1.0.8 and FlashAttention-2 on otherwise equal layouts
    (73 pairs on A100 at 2k): with flash1 priced at the paper's 2x, the predicted step-time ratio's median
    error is within 1.5 % (it was -2.6 % with both kernels priced alike)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import accuracy
    from paraplan.calibration.sweep import SWEEP_SKIP_REASON, sweep_available
    if sweep_available() is None:
        pytest.skip(SWEEP_SKIP_REASON)
    sweep = accuracy.sweep_frame(sweep_available())
    pairs = accuracy.sweep_pairs(sweep).set_index("change")
    row = pairs.loc["FlashAttention 1.0.8 against FlashAttention-2"]
    assert row.pairs >= 70
    assert abs(row["median_error_%"]) <= 1.5
    assert row.predicted_ratio > 1.02          # the kernels are no longer priced alike


def test_exports_run_their_own_kernel_or_say_flash1():
    """Neither Megatron-LM (Transformer Engine needs flash-attn 2) nor torchtitan runs FlashAttention 1.x:
    their export is the nearest plan, their own kernel, re-estimated; DeepSpeed's model code may call it."""
    est = estimate(MODEL, JOB, H100, Plan(tp=1, micro_batch=1, zero=3, recompute="full", attention_kernel="flash1"))
    doc = plan_document(est, "llama1-13b", "dgx-h100")
    for engine in ("megatron", "torchtitan"):
        out = export(doc, engine)
        assert out.plan.attention_kernel == "auto" and "its own attention kernel for flash1" in out.summary
    notes = export(doc, "deepspeed").notes
    assert any("flash-attn 1.x" in n for n in notes)


def test_cli_estimates_flash1(capsys):
    from paraplan.cli import main
    argv = ["estimate", "--model", "llama1-13b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--tp", "1",
            "--micro-batch", "1", "--global-batch", "64"]
    assert main(argv + ["--attention-kernel", "flash1", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"attention_kernel": "flash1"' in out and "FlashAttention 1.x" in out
    assert main(argv + ["--attention-kernel", "flash3"]) == 2
    assert "flash1" in capsys.readouterr().err
