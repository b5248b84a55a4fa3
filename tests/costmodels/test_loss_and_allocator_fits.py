"""What a published performance run really holds where the memory model over-counted it (issue 64, "no
layout that ran judged not to fit"): Transformer Engine's fused cross-entropy (the logits' gradient written
over the 16-bit logits: 2 bytes per logit, not the native loss's 2 + 4) and PyTorch's allocator with
expandable segments (no fragmentation of the bytes that come and go, the constant reserve only)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.planner import export as ex
from paraplan.planner.readers import read_megatron_args
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob
from tests.planner.test_export import doc, parse_megatron

LLAMA8B = load_model("llama3-8b")
JOB = TrainingJob(8192, 64)
PLAN = Plan(tp=1, pp=1, dp=8, zero=1, engine="megatron", dtype="bf16", grad_reduce_bf16=True)
GIB = 2**30


def _acts(plan):
    return M.activation_bytes(LLAMA8B, JOB, PlanBatch.from_plans([plan]))


def test_te_cross_entropy_holds_two_bytes_per_logit_instead_of_six():
    native, te = _acts(PLAN), _acts(replace(PLAN, te_cross_entropy=True))
    # golden: (6 - 2) bytes x 8192 tokens x 128,256 logits (micro-batch 1, tp 1, pp 1: the loss on this stage)
    assert float(native["first"][0] - te["first"][0]) == 4 * 8192 * 128256 == 4_202_692_608
    assert M.TE_CROSS_ENTROPY_BYTES_PER_LOGIT == 2.0
    # vocabulary-parallel: the logits a rank holds are V / tp
    tp2 = replace(PLAN, tp=2, dp=4, sp=True)
    assert float(_acts(tp2)["first"][0] - _acts(replace(tp2, te_cross_entropy=True))["first"][0]) \
        == 4 * 8192 * 128256 / 2


def test_te_cross_entropy_moves_only_the_last_stage():
    pp2 = replace(PLAN, pp=2, dp=4)
    native, te = _acts(pp2), _acts(replace(pp2, te_cross_entropy=True))
    assert float(native["first"][0]) == float(te["first"][0])
    assert float(native["last"][0] - te["last"][0]) == 4 * 8192 * 128256


def test_te_cross_entropy_is_megatrons_option():
    with pytest.raises(ConfigError) as err:
        Plan(engine="torchtitan", zero=3, te_cross_entropy=True)
    assert err.value.field == "te_cross_entropy" and "--engine megatron" in err.value.accepted


def test_megatron_reads_and_writes_te_cross_entropy():
    flags = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "8192",
             "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16"]
    fused = flags + ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    assert read_megatron_args(fused).plan.te_cross_entropy is True
    assert read_megatron_args(flags + ["--cross-entropy-loss-fusion"]).plan.te_cross_entropy is False
    out = ex.export(doc("llama3-8b", "dgx-h100", 8, 2048, 64, tp=2, dp=4, sp=True, zero=1, engine="megatron",
                        te_cross_entropy=True), "megatron")
    _, args = parse_megatron(out.text)
    assert args["--cross-entropy-loss-fusion"] is True and args["--cross-entropy-fusion-impl"] == "te"


def test_expandable_segments_charge_the_constant_reserve_only():
    memory = {"parameters": 10 * GIB, "gradients": 5 * GIB, "optimizer_states": 20 * GIB,
              "activations": 40 * GIB, "buffers": 2 * GIB}
    for engine in ("megatron", "scaling", "generic"):
        plan = PlanBatch.from_plans([Plan(engine=engine, dp=8)])
        fragmented = float(M.allocator_bytes(memory, plan, True)[0])
        assert fragmented > M.ALLOCATOR_RESERVE_BYTES
        expandable = PlanBatch.from_plans([Plan(engine=engine, dp=8, expandable_segments=True)])
        # golden: 0.5 GiB (fitted_constants allocator_reserve), whatever churns
        assert float(M.allocator_bytes(memory, expandable, True)[0]) == M.ALLOCATOR_RESERVE_BYTES == 0.5 * GIB
        assert float(M.allocator_bytes(memory, expandable, False)[0]) == 0.0


def test_expandable_segments_lower_the_estimate_by_the_fragmentation_and_nothing_else():
    cluster = load_cluster("dgx-h100", 8)
    base = estimate(LLAMA8B, JOB, cluster, PLAN)
    exp = estimate(LLAMA8B, JOB, cluster, replace(PLAN, expandable_segments=True))
    churn = base.memory_bytes_per_gpu["activations"] + base.memory_bytes_per_gpu["buffers"]
    assert base.memory_bytes_per_gpu["allocator"] - exp.memory_bytes_per_gpu["allocator"] \
        == pytest.approx(M.allocator_fragmentation(PLAN) * churn, rel=1e-12)
    assert exp.step_time_s == base.step_time_s
    out = ex.export(doc("llama3-8b", "dgx-h100", 8, 2048, 64, tp=2, dp=4, sp=True, zero=1, engine="megatron",
                        expandable_segments=True), "megatron")
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out.text


def test_cli_flags(capsys):
    import json
    from paraplan.cli import main
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "64", "--tp", "2", "--sp", "--format", "json"]
    totals = {}
    for extra in ((), ("--te-cross-entropy",), ("--expandable-segments",)):
        assert main([*base, "--engine", "megatron", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        totals[extra] = out["memory_bytes_per_gpu"]
    assert totals[("--te-cross-entropy",)]["activations"] < totals[()]["activations"]
    assert totals[("--expandable-segments",)]["allocator"] == 0.5 * GIB < totals[()]["allocator"]
    assert main([*base, "--engine", "torchtitan", "--zero", "3", "--te-cross-entropy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paraplan: error: --te-cross-entropy") and len(err.strip().splitlines()) == 1
