"""Attention kernels as a plan choice, priced from the efficiency measured on an H100 by kernel,
sequence length and heads per GPU (attention_kernels.yaml, paraplan/profiles/reference/h100-sxm.json)."""

import numpy as np
import pytest

from paraplan.costmodels.attention import attention_core_times, attention_occupancy, measured_attention_efficiency
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import plan_document
from paraplan.planner.export import export
from paraplan.profiles import reference as R
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel

H100 = load_cluster("dgx-h100", 8)
CURVES = analytical_curves(H100.accelerator)
KERNEL_OF = {"cudnn": "cudnn", "flash": "flash2", "efficient": "efficient"}


def _model(heads, head_dim=128):
    return TransformerModel(name="attn", layers=1, hidden=heads * head_dim, heads=heads, vocab=32000)


def test_table_reproduces_every_measured_shape():
    """Each of the 63 fused-kernel measurements (3 kernels, 1k-64k tokens, head dim 64 and 128,
    4-64 heads) from the table and the occupancy model: median within 3 %, all within 30 % (the worst,
    +27 %: FlashAttention-2 with 8 heads at 4k tokens, whose causal tail the n/4 rule underrates)."""
    errors = []
    for r in R.attention_efficiency():
        if r["backend"] == "math":
            continue
        plan = Plan(micro_batch=r["batch"], attention_kernel=KERNEL_OF[r["backend"]])
        eff = measured_attention_efficiency(_model(r["heads"], r["head_dim"]), plan, CURVES, r["seq"],
                                              r["batch"] * r["heads"])
        errors.append(float(eff) / r["efficiency"] - 1)
    assert len(errors) == 63
    assert np.median(np.abs(errors)) <= 0.03
    assert np.max(np.abs(errors)) <= 0.30


def test_occupancy_falls_with_few_heads_and_short_sequences():
    occ = attention_occupancy(4096, np.array([4, 8, 16, 64, 512]), 132)
    assert np.all(np.diff(occ) > 0) and occ[-1] > 0.97 and occ[0] < 0.6
    assert attention_occupancy(65536, 4, 132) > 0.9


def test_named_kernels_order_the_estimate_and_auto_is_unchanged():
    model, job = load_model("llama3-8b"), TrainingJob(8192, 64)
    step = {k: estimate(model, job, H100, Plan(tp=1, micro_batch=1, attention_kernel=k)).step_time_s
            for k in ("auto", "cudnn", "flash2", "efficient")}
    assert step["cudnn"] < step["auto"] < step["flash2"] < step["efficient"]
    # auto keeps the generation's calibrated efficiency: the attention core at 0.40 of peak
    f, b = attention_core_times(model, job, Plan(tp=1, micro_batch=1), CURVES)
    flops = 4.0 * 8192 * 8192 * model.hidden / 2
    assert float(f) == pytest.approx(CURVES.kernel_overhead_s + flops / (989e12 * 0.40), rel=1e-9)


def test_a_generation_without_a_table_says_so_and_prices_auto():
    a100 = load_cluster("dgx-a100-80g", 8)
    model, job = load_model("llama3-8b"), TrainingJob(8192, 64)
    named = estimate(model, job, a100, Plan(tp=1, micro_batch=1, attention_kernel="cudnn"))
    auto = estimate(model, job, a100, Plan(tp=1, micro_batch=1))
    assert named.step_time_s == auto.step_time_s
    assert "no measured cudnn table" in named.assumptions[-1]
    h = estimate(model, job, H100, Plan(tp=1, micro_batch=1, attention_kernel="cudnn"))
    assert "cudnn at 0.49" in h.assumptions[-1] or "cudnn at 0.50" in h.assumptions[-1]


def test_megatron_auto_runs_transformer_engines_cudnn_attention_on_hopper():
    """Left to auto, a Megatron-LM plan runs Transformer Engine's attention, which prefers cuDNN fused
    attention on Hopper: priced as the plan that names cudnn, and said; other engines, and a generation
    without a measured table (A100), keep the calibrated auto figure."""
    model, job = load_model("llama3-8b"), TrainingJob(32768, 16)
    def step(cluster, **plan):
        return estimate(model, job, cluster, Plan(tp=1, micro_batch=1, **plan))
    auto, cudnn = step(H100, engine="megatron"), step(H100, engine="megatron", attention_kernel="cudnn")
    assert auto.step_time_s == cudnn.step_time_s
    assert any("auto on Megatron-LM runs Transformer Engine's cuDNN" in a for a in auto.assumptions)
    generic = step(H100)
    assert generic.step_time_s > auto.step_time_s * 1.05       # 0.40 against cuDNN's ~0.57 at 32k tokens
    assert not any("Transformer Engine's cuDNN" in a for a in generic.assumptions)
    a100 = analytical_curves(load_cluster("dgx-a100-80g", 8).accelerator)
    f_meg = attention_core_times(model, job, Plan(tp=1, micro_batch=1, engine="megatron"), a100)
    f_gen = attention_core_times(model, job, Plan(tp=1, micro_batch=1), a100)
    assert float(f_meg[0]) == float(f_gen[0])


def test_torchtitan_auto_runs_sdpa_with_cudnn_first_and_its_2025_rows_ran_flash2():
    """torchtitan's SDPA wrapper sets cuDNN first (set_priority=True): left to auto, a torchtitan plan on
    Hopper is priced as the plan that names cudnn, and says so. The June 2025 Grand Teton rows ran
    before that, on a torch that tried cuDNN last: the calibration reader gives them FlashAttention-2."""
    model, job = load_model("llama3-8b"), TrainingJob(32768, 16)
    def step(**plan):
        return estimate(model, job, H100, Plan(tp=1, micro_batch=1, engine="torchtitan", zero=3, **plan))
    auto, cudnn, flash2 = step(), step(attention_kernel="cudnn"), step(attention_kernel="flash2")
    assert auto.step_time_s == cudnn.step_time_s < flash2.step_time_s / 1.05
    assert any("auto on torchtitan runs torch SDPA's cuDNN backend" in a for a in auto.assumptions)
    from paraplan.calibration import load_h100_cases
    titan = [c for c in load_h100_cases()[0] if "torchtitan" in c.source]
    assert len(titan) == 12
    assert all(c.plan.attention_kernel == "flash2" and any("pytorch/pytorch#138522" in a for a in c.assumed)
               for c in titan)
    others = [c for c in load_h100_cases()[0] if "torchtitan" not in c.source]
    assert others and all(c.plan.attention_kernel == "auto" for c in others)


def test_kernel_needs_flash_attention_and_megatron_export_maps_it():
    with pytest.raises(ConfigError) as e:
        Plan(attention_kernel="flash2", flash_attention=False)
    assert e.value.field == "attention_kernel"
    with pytest.raises(ConfigError, match="accepted: auto, cudnn, flash2, efficient"):
        Plan(attention_kernel="fa3")
    model, job = load_model("llama3-8b"), TrainingJob(8192, 64)
    for kernel, flag in (("cudnn", "--attention-backend fused"), ("flash2", "--attention-backend flash"),
                         ("auto", "--use-flash-attn")):
        est = estimate(model, job, H100, Plan(tp=1, micro_batch=1, zero=3, attention_kernel=kernel))
        assert flag in export(plan_document(est, "llama3-8b", "dgx-h100"), "megatron").text
    # Transformer Engine has no memory-efficient kernel: the nearest plan Megatron-LM runs is its own (auto)
    est = estimate(model, job, H100, Plan(tp=1, micro_batch=1, zero=3, attention_kernel="efficient"))
    out = export(plan_document(est, "llama3-8b", "dgx-h100"), "megatron")
    assert out.plan.attention_kernel == "auto" and "--use-flash-attn" in out.text
    assert "its own attention kernel for efficient" in out.summary


def test_cli_names_the_kernel_and_refuses_bad_values(capsys):
    from paraplan.cli import main
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "64", "--tp", "1", "--micro-batch", "1"]
    assert main(base + ["--attention-kernel", "flash2", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"attention_kernel": "flash2"' in out and "flash2 at 0." in out
    assert main(base + ["--attention-kernel", "fa3"]) == 2
    err = capsys.readouterr().err
    assert "--attention-kernel" in err and "auto, cudnn, flash2, efficient" in err and "Traceback" not in err
    assert main(base + ["--attention-kernel", "cudnn", "--no-flash-attention"]) == 2
    assert capsys.readouterr().err.startswith("paraplan: error: --attention-kernel: ")


def test_torchtitan_and_deepspeed_exports_say_how_to_pin_the_kernel():
    model, job = load_model("llama3-8b"), TrainingJob(8192, 64)

    def doc(**kw):
        return plan_document(estimate(model, job, H100, Plan(tp=1, micro_batch=1, zero=3, **kw)), "llama3-8b", "dgx-h100")

    flash2 = doc(attention_kernel="flash2")
    assert any("SDPBackend.FLASH_ATTENTION" in n for n in export(flash2, "deepspeed").notes)
    # torchtitan 0.2.2 (TOML) runs torch SDPA inside its ScaledDotProductAttentionWrapper, cuDNN first
    titan = export(flash2, "torchtitan", torchtitan_format="toml").notes
    assert any("ScaledDotProductAttentionWrapper.sdpa_backends = [SDPBackend.FLASH_ATTENTION]" in n for n in titan)
    assert not any("SDPBackend" in n for n in export(doc(), "torchtitan", torchtitan_format="toml").notes)
    cudnn = doc(attention_kernel="cudnn")
    assert not any("SDPBackend" in n                                                   # what it runs first
                   for n in export(cudnn, "torchtitan", torchtitan_format="toml").notes)
    assert any("SDPBackend.CUDNN_ATTENTION" in n for n in export(cudnn, "deepspeed").notes)
    # torchtitan 0.3.0's language models run FlexAttention, not SDPA: no named kernel can be pinned, so
    # the export is the nearest plan, its own kernel (auto), re-estimated
    for kernel in ("flash2", "cudnn"):
        out = export(doc(attention_kernel=kernel), "torchtitan")
        assert out.plan.attention_kernel == "auto" and f"its own attention kernel for {kernel}" in out.summary
        assert not any("SDPBackend" in n for n in out.notes)


@pytest.mark.slow
def test_whatif_sweeps_the_attention_kernel(tmp_path, capsys):
    import pandas as pd
    from paraplan.cli import main
    out = tmp_path / "wk"
    # the generic engine: its auto is the unknown kernel (Megatron-LM's auto runs cuDNN, equal to cudnn)
    argv = ["whatif", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "8192", "--engine", "generic", "--sweep", "attention_kernel=auto,cudnn,flash2,efficient",
            "--out", str(out)]
    assert main(argv) == 0
    pts = pd.read_csv(out / "points.csv")
    col = "sweep_attention_kernel"
    rate = dict(zip(pts[col], pts.tokens_per_s))
    assert rate["cudnn"] > rate["auto"] > rate["flash2"] > rate["efficient"]
    capsys.readouterr()
    bad = argv[:-4] + ["--sweep", "attention_kernel=fa3", "--out", str(tmp_path / "bad")]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "--sweep attention_kernel" in err and "auto, cudnn, flash2, efficient" in err
    assert not (tmp_path / "bad").exists()
