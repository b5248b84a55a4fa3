"""The rotary embedding fused or eager (Plan.rope_fusion, Megatron-LM's --no-rope-fusion).

Megatron-LM's command line fuses it by default; Megatron-Core's TransformerConfig does not
(apply_rope_fusion=False), which is what a Megatron-Bridge model provider that leaves it unset runs
(GPT-OSS). Eager, q·cos + rotate_half(q)·sin streams 20 bytes per q/k element in 5 kernels against the
fused kernel's 4 in 1."""
from __future__ import annotations

import dataclasses
import io
import json
from contextlib import redirect_stdout

import pytest

from paraplan.cli import main
from paraplan.costmodels import compute as C
from paraplan.calibration import load_h100_cases
from paraplan.costmodels.efficiency import curves_for, with_reference_block
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

LLAMA = load_model("llama3-8b")
JOB = TrainingJob(seq_len=8192, global_batch=128)
PLAN = Plan(tp=2, sp=True, dp=4, micro_batch=1, engine="megatron")
CLUSTER = load_cluster("dgx-h100", 8)
CURVES = with_reference_block(curves_for(CLUSTER), CLUSTER)


def elementwise(model, plan):
    return float(C.elementwise_forward_time(model, JOB, plan, CURVES))


def test_eager_rope_streams_sixteen_more_bytes_per_q_k_element_in_four_more_kernels_each():
    eager = dataclasses.replace(PLAN, rope_fusion=False)
    T = JOB.seq_len * PLAN.micro_batch
    extra_bytes = T * (C.EAGER_ROPE_BYTES_PER_ELEMENT - C.FUSED_ROPE_BYTES_PER_ELEMENT) * LLAMA.rope_hidden / PLAN.tp
    extra_kernels = C.EAGER_ROPE_KERNELS - C.FUSED_ROPE_KERNELS
    want = float(CURVES.memory_time(extra_bytes, kernels=extra_kernels))
    assert elementwise(LLAMA, eager) - elementwise(LLAMA, PLAN) == pytest.approx(want)
    # the same as what --no-fused-elementwise charges the rotary embedding: no second count there
    unfused = dataclasses.replace(PLAN, fused_elementwise=False)
    assert elementwise(LLAMA, unfused) == pytest.approx(elementwise(LLAMA, dataclasses.replace(unfused, rope_fusion=False)))


def test_a_model_without_rotary_embeddings_does_not_move():
    gpt = load_model("gpt3-175b")
    assert not gpt.rotary
    assert elementwise(gpt, dataclasses.replace(PLAN, rope_fusion=False)) == elementwise(gpt, PLAN)


def test_plan_files_and_flags_carry_it():
    eager = dataclasses.replace(PLAN, rope_fusion=False)
    assert Plan.from_dict(eager.to_dict()) == eager
    old_file = {k: v for k, v in PLAN.to_dict().items() if k != "rope_fusion"}
    assert Plan.from_dict(old_file).rope_fusion is True      # plan files written before the field
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({**PLAN.to_dict(), "rope_fusion": "no"})
    assert "rope_fusion" in str(e.value)


SCENARIO = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "seq_len": 8192, "global_batch": 128}


def run(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_estimate_flag_and_megatron_export(tmp_path):
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "128", "--tp", "2", "--sp", "--zero", "1", "--engine", "megatron", "--format", "json"]
    code, fused = run(base)
    assert code == 0
    code, eager = run(base + ["--no-rope-fusion"])
    assert code == 0
    fused, eager = json.loads(fused), json.loads(eager)
    assert eager["plan"]["rope_fusion"] is False and fused["plan"]["rope_fusion"] is True
    assert eager["step_time_s"] > fused["step_time_s"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"schema": "paraplan.plan/1", "scenario": SCENARIO, "plan": eager["plan"]}))
    code, script = run(["export", str(plan_file), "--to", "megatron"])
    assert code == 0 and "--no-rope-fusion" in script
    plan_file.write_text(json.dumps({"schema": "paraplan.plan/1", "scenario": SCENARIO, "plan": fused["plan"]}))
    code, script = run(["export", str(plan_file), "--to", "megatron"])
    assert code == 0 and "--no-rope-fusion" not in script


def test_calibration_runs_gpt_oss_and_deepseek_eager_and_the_llama_and_qwen_rows_fused():
    cases, _ = load_h100_cases()
    eager = [c for c in cases if "GPT OSS" in c.label or "DeepSeekV3" in c.label]
    fused = [c for c in cases if ("Llama 3" in c.label or "Qwen3" in c.label) and "Megatron-Bridge" in c.source]
    assert len(eager) == 11 and len(fused) > 10
    assert all(not c.plan.rope_fusion for c in eager)
    assert all(any("rotary embedding unfused" in a for a in c.assumed) for c in eager)
    assert all(c.plan.rope_fusion for c in fused)
