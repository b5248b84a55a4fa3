"""NVFP4 (and MXFP4) training as a dtype (issue 66): the linear GEMMs at the part's fp4 peak with the
recipe's bf16 layers, the recipe's casts and quantized copies in bytes from its format, the refusal where
the tensor cores lack the format, the search in that precision and the Megatron-LM export."""
import dataclasses

import pytest

from paraplan.cli import main
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.fp8 import FP8_CAST_BYTES_PER_ELEMENT, fp8_cast_times
from paraplan.costmodels.kernels import FP4_BF16_LINEAR_SHARE, GEMM_OPERAND_BYTES, mlp_gemm_forward_times
from paraplan.costmodels.memory import fp8_weight_copy_bytes
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.modes import gemm_dtype, is_fp4, is_fp8, quantized_bytes
from paraplan.plan import Plan, check_plan
from paraplan.planner import export as ex
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

from tests.planner.test_export import doc, parse_megatron

MODEL = load_model("llama3-70b")
JOB = TrainingJob(8192, 128)
GB300 = load_cluster("gb300-nvl72", 8)
H100 = load_cluster("dgx-h100", 8)
BASE = Plan(tp=8, dp=1, micro_batch=1, zero=1, sp=True, engine="megatron", recompute="full")


def plan(dtype, **kw):
    return dataclasses.replace(BASE, dtype=dtype, **kw)


def test_nvfp4_format_bytes_are_the_recipes():
    """NVFP4: 4-bit E2M1 + one E4M3 scale per 16 elements (the fp32 tensor scale is negligible); MXFP4:
    one E8M0 scale per 32 (Transformer Engine NVFP4 docs; OCP MX v1.0)."""
    assert quantized_bytes("nvfp4") == 0.5625 and quantized_bytes("mxfp4") == 0.53125
    assert quantized_bytes("fp8") == quantized_bytes("mxfp8") == 1.0
    assert GEMM_OPERAND_BYTES["fp4"] == 0.5625
    assert gemm_dtype("nvfp4") == gemm_dtype("mxfp4") == "fp4" and gemm_dtype("mxfp8") == "fp8"
    assert is_fp4("nvfp4") and is_fp8("nvfp4") and not is_fp4("mxfp8")
    # amax pass 2 + row-wise cast 2.5625 + RHT column-wise cast for wgrad 2.5625
    assert FP8_CAST_BYTES_PER_ELEMENT["nvfp4"] == pytest.approx(7.125)


def test_fp4_linear_gemms_run_at_the_fp4_peak_with_the_recipes_bf16_share():
    """On GB300 the fp4 peak is 3x fp8's and both take the fp8 MAMF plateau: an MLP GEMM under nvfp4
    is 0.84 of the fp8 time / 3 plus 0.16 of the bf16 time (same shapes, same waves)."""
    curves = analytical_curves(GB300.accelerator)
    t = {d: sum(mlp_gemm_forward_times(MODEL, JOB, plan(d), curves)) for d in ("bf16", "fp8", "nvfp4")}
    fp4_alone = t["fp8"] * 5000 / 15000
    expected = (1 - FP4_BF16_LINEAR_SHARE) * fp4_alone + FP4_BF16_LINEAR_SHARE * t["bf16"]
    assert FP4_BF16_LINEAR_SHARE == 0.16
    assert t["nvfp4"] == pytest.approx(expected, rel=0.03)
    # the bf16 share costs about as much as the fp4 GEMMs: 0.84/3 + 0.16 x (bf16 / fp8 ~ 2) ~ 0.6 of fp8
    assert 0.5 * t["fp8"] < t["nvfp4"] < 0.65 * t["fp8"]


def test_nvfp4_weight_copies_and_casts_in_bytes_of_the_format():
    curves = analytical_curves(GB300.accelerator)
    params = 1e9
    fp8, fp4 = (fp8_weight_copy_bytes(MODEL, params, plan(d)) for d in ("fp8", "nvfp4"))
    assert float(fp8) == pytest.approx(2 * params) and float(fp4) == pytest.approx(1.125 * params)
    # per-tensor fp8 casts 6 bytes per element, and both cast the gathered tensors on their sequence shard:
    # same elements, the recipe's bytes
    f8, f4 = (fp8_cast_times(MODEL, JOB, plan(d), curves)[0] for d in ("fp8", "nvfp4"))
    assert f4 / f8 == pytest.approx(7.125 / 6, rel=0.05)


def test_nvfp4_estimate_on_gb300_is_faster_and_smaller_than_fp8_and_says_its_recipe():
    e = {d: estimate(MODEL, JOB, GB300, plan(d)) for d in ("bf16", "mxfp8", "nvfp4")}
    assert e["nvfp4"].step_time_s < e["mxfp8"].step_time_s < e["bf16"].step_time_s
    assert e["nvfp4"].memory_bytes_per_gpu["total"] < e["mxfp8"].memory_bytes_per_gpu["total"]
    said = " ".join(e["nvfp4"].assumptions)
    assert "arXiv:2509.25149" in said and "7.125 bytes" in said and "fp4 peak" in said
    # MFU stays against the bf16 peak, as for fp8
    assert e["nvfp4"].mfu / e["bf16"].mfu == pytest.approx(e["bf16"].step_time_s / e["nvfp4"].step_time_s, rel=1e-6)


@pytest.mark.parametrize("cluster, dtype, says", [
    ("dgx-h100", "nvfp4", "h100-sxm cannot train in nvfp4: it has no fp4 tensor cores"),
    ("dgx-a100-80g", "mxfp4", "a100-80g cannot train in mxfp4"),
    ("mi355x-x8", "nvfp4", "mi355x cannot train in nvfp4: its fp4 tensor cores take mxfp4"),
    ("mi300x-x8", "mxfp4", "mi300x cannot train in mxfp4")])
def test_fp4_refused_where_the_tensor_cores_lack_the_format(cluster, dtype, says):
    with pytest.raises(ConfigError) as e:
        check_plan(plan(dtype, engine="generic"), MODEL, JOB, load_cluster(cluster, 8))
    assert e.value.field == "dtype" and says in str(e.value) and "accepted here: bf16" in str(e.value)


def test_cli_refuses_nvfp4_on_hopper_in_one_line(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--dtype", "nvfp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("paraplan: error: dtype:") and "Traceback" not in err
    assert "accepted here: bf16, fp16, fp8" in err and "mxfp8" not in err.split("accepted here:")[1]


def test_mxfp4_runs_on_mi355x_but_megatron_has_no_mxfp4_recipe():
    mi355x = load_cluster("mi355x-x8", 8)
    assert estimate(MODEL, JOB, mi355x, plan("mxfp4", engine="generic")).step_time_s > 0
    with pytest.raises(ConfigError) as e:
        check_plan(plan("mxfp4"), MODEL, JOB, mi355x)
    assert "megatron has no mxfp4 recipe" in str(e.value) and "nvfp4" in str(e.value)


def test_plan_searches_nvfp4_on_gb300(capsys):
    argv = ["plan", "--model", "llama3-8b", "--cluster", "gb300-nvl72", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--format", "json", "--top", "1"]
    import json
    assert main([*argv, "--dtype", "nvfp4"]) == 0
    fp4 = json.loads(capsys.readouterr().out)
    assert main([*argv, "--dtype", "mxfp8"]) == 0
    fp8 = json.loads(capsys.readouterr().out)
    best4, best8 = fp4["plans"][0], fp8["plans"][0]
    assert best4["plan"]["dtype"] == "nvfp4" and best4["step_time_s"] < best8["step_time_s"]


def test_megatron_export_writes_the_fp4_flags():
    """NVIDIA/Megatron-LM @ 307dcf3 megatron/training/arguments.py: --fp4-format {e2m1}, --fp4-recipe
    {nvfp4}, --fp4-param-gather, --first-last-layers-bf16 with --num-layers-at-{start,end}-in-bf16."""
    kw = dict(tp=8, zero=1, engine="megatron", recompute="full", dtype="nvfp4", sp=True)
    _, flags = parse_megatron(ex.to_megatron(doc("llama3-70b", "gb300-nvl72", 8, 4096, 64, fp8_param_gather=True, **kw)))
    assert flags["--fp4-format"] == "e2m1" and flags["--fp4-recipe"] == "nvfp4"
    assert flags["--first-last-layers-bf16"] is True and flags["--num-layers-at-start-in-bf16"] == "0"
    assert flags["--num-layers-at-end-in-bf16"] == str(round(0.16 * 80))
    assert flags["--fp4-param-gather"] is True and "--fp8-recipe" not in flags and "--fp8-param-gather" not in flags


@pytest.mark.parametrize("cell, dtype", [("NVFP4", "nvfp4"), ("nvfp4", "nvfp4"), ("FP4", "nvfp4"), ("MXFP4", "mxfp4"),
                                         ("FP8-MX", "mxfp8"), ("BF16", "bf16")])
def test_published_precision_cells_read_nvfp4_and_mxfp4(cell, dtype):
    """Published runs name the recipe as Megatron-Bridge's tables do ("NVFP4"): read, not refused."""
    from paraplan.calibration.cells import dtype_of_precision
    assumed = []
    assert dtype_of_precision(cell, assumed) == dtype
    assert bool(assumed) == (cell == "FP4")


def test_sequence_parallel_gathers_carry_nvfp4_under_transformer_engine():
    """TE quantizes the sequence-parallel input and gradient after an amax reduction and gathers them in
    NVFP4: 0.5625 of a byte per element against bf16's 2; torchtitan has no nvfp4 recipe at all."""
    from paraplan.costmodels.tpcomm import tp_gathered_bytes
    b, f4 = (tp_gathered_bytes(MODEL, JOB, plan(d)) for d in ("bf16", "nvfp4"))
    assert float(f4 / b) == pytest.approx(0.5625 / 2)
    assert float(tp_gathered_bytes(MODEL, JOB, plan("nvfp4", sp=False))) == pytest.approx(float(b))
