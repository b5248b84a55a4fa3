"""fp8 training as a dtype with its recipe: which GEMMs run in fp8, the cast kernels, fp8 weight
copies, the engines' recipes and the exports."""
import dataclasses
import json
import tomllib

import pytest

from paraplan.costmodels import compute as C
from paraplan.costmodels.attention import attention_core_times
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.fp8 import (ROWWISE_RESCALE_BYTES_PER_ELEMENT, fp8_backward_gemm_factor, fp8_cast_elements,
                                     fp8_cast_times, fp8_rowwise_rescale_time)
from paraplan.costmodels.kernels import fp8_recipe_gemm_efficiency, mlp_gemm_forward_time
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

MODEL = load_model("llama3-8b")
JOB = TrainingJob(8192, 128)
H100 = load_cluster("dgx-h100", 8)
BASE = Plan(tp=1, dp=8, micro_batch=1, zero=1, engine="megatron")


def est(dtype, cluster=H100, **kw):
    return estimate(MODEL, JOB, cluster, dataclasses.replace(BASE, dtype=dtype, **kw))


def test_fp8_linear_gemms_faster_but_attention_and_head_unchanged():
    curves = analytical_curves(H100.accelerator)
    bf16 = dataclasses.replace(BASE, dtype="bf16").with_dp_for(8)
    fp8 = dataclasses.replace(BASE, dtype="fp8").with_dp_for(8)
    mlp_b, mlp_f = (mlp_gemm_forward_time(MODEL, JOB, p, curves) for p in (bf16, fp8))
    # fp8 peak is 2x bf16; the fp8 MAMF plateau (0.709) is below bf16's (0.803)
    assert mlp_b / mlp_f == pytest.approx(2 * 0.709 / 0.803, rel=0.02)
    assert attention_core_times(MODEL, JOB, fp8, curves)[0] == attention_core_times(MODEL, JOB, bf16, curves)[0]
    assert C.head_times(MODEL, JOB, fp8, curves, H100)["head"] == C.head_times(MODEL, JOB, bf16, curves, H100)["head"]


def test_fp8_step_is_faster_than_bf16_and_mfu_is_against_the_bf16_peak():
    b, f = est("bf16"), est("fp8")
    assert 1.1 < b.step_time_s / f.step_time_s < 1.8      # attention, head, casts and comm stay
    # MFU against the bf16 peak for both: the ratio of MFUs is the ratio of throughputs
    assert f.mfu / b.mfu == pytest.approx(b.step_time_s / f.step_time_s, rel=1e-9)
    assert any("fp8" in a for a in f.assumptions) and not any(a.startswith("fp8") for a in b.assumptions)


def test_cast_bytes_follow_the_recipe():
    curves = analytical_curves(H100.accelerator)
    plans = {d: dataclasses.replace(BASE, dtype=d).with_dp_for(8) for d in ("fp8", "fp8-delayed", "bf16")}
    fwd = {d: fp8_cast_times(MODEL, JOB, p, curves)[0] for d, p in plans.items()}
    assert fwd["bf16"] == 0.0
    assert fwd["fp8-delayed"] < fwd["fp8"]                  # no separate amax pass
    elements, _ = fp8_cast_elements(MODEL, JOB, plans["fp8"])
    T, h, f = 8192, MODEL.hidden, MODEL.ffn_hidden
    m = 128 // 8    # micro-batches per step: Transformer Engine quantizes the weights once per step
    assert elements == pytest.approx(T * (3 * h + f) + MODEL.params_per_layer / m)
    titan = dataclasses.replace(plans["fp8"], engine="torchtitan", zero=3)   # torchao recasts every forward
    assert fp8_cast_elements(MODEL, JOB, titan)[0] == pytest.approx(T * (3 * h + f) + MODEL.params_per_layer)


def test_rowwise_is_slower_than_tensorwise():
    tt = dict(engine="torchtitan", zero=3)
    assert est("fp8-rowwise", **tt).step_time_s > est("fp8", **tt).step_time_s


def test_rowwise_backward_runs_per_tensor_gemms_and_rescales_their_outputs():
    """torchao's row-wise recipe: backward GEMMs at the per-tensor rate (its forward slowdown undone),
    plus one rescale pass per backward GEMM over the 16-bit output; torchtitan's separate wq/wk/wv and
    w1/w3 write five input gradients where a fused engine writes two."""
    curves = analytical_curves(H100.accelerator)
    eff = fp8_recipe_gemm_efficiency(curves, "fp8-rowwise")
    assert eff < 1 and fp8_backward_gemm_factor(curves, "fp8-rowwise") == eff
    assert fp8_backward_gemm_factor(curves, "fp8") == 1.0 == fp8_backward_gemm_factor(curves, "bf16")
    titan = dataclasses.replace(BASE, dtype="fp8-rowwise", engine="torchtitan", zero=3, tp=2, dp=4, sp=True)
    generic = dataclasses.replace(titan, engine="generic")
    assert fp8_rowwise_rescale_time(MODEL, JOB, dataclasses.replace(titan, dtype="fp8"), curves) == 0.0
    T, h, f = 8192, MODEL.hidden, MODEL.ffn_hidden
    attn_in = h + MODEL.q_hidden / 2                    # QKV reads h, the output projection q/tp
    per_token = {"torchtitan": attn_in + 2 * h + 2 * h + f / 2, "generic": attn_in + h + f / 2}
    for plan, name, kernels in ((titan, "torchtitan", 2 * 7), (generic, "generic", 2 * 4)):
        elements = T * per_token[name] + MODEL.params_per_layer / 2
        expected = curves.streaming_time(ROWWISE_RESCALE_BYTES_PER_ELEMENT * elements, kernels=kernels)
        assert fp8_rowwise_rescale_time(MODEL, JOB, plan, curves) == pytest.approx(expected)
    row = estimate(MODEL, JOB, H100, titan)
    assert any("rescales each output" in a for a in row.assumptions)
    assert not any("rescales" in a for a in est("fp8", engine="torchtitan", zero=3).assumptions)


def test_torchtitan_rowwise_llama3_8b_tp8_is_slower_than_bf16_as_measured():
    """torchtitan's June 2025 async-TP benchmark measured float8 rowwise at 0.85x (vanilla TP) and 0.81x
    (async TP) the bf16 throughput of Llama 3 8B at tp 8 on Grand Teton H100s
    (paraplan/calibration/data/published_runs_calibration_h100.csv); the estimate must put rowwise below bf16 there too (it
    priced it 1.03x before the rescale pass and per-tensor backward were modelled). That holds on the part at
    its rated power; at the runs' 500 W limit the GEMMs slow by the power-limited clock while the rescale pass,
    memory-bound, does not, so rowwise comes out at 0.99-1.0x the bf16 step there (still slower than
    tensorwise; the measured 0.81-0.85x is not reached: torchao's rowwise path of that time)."""
    from dataclasses import replace
    from paraplan.calibration import load_h100_cases
    cases = [c for c in load_h100_cases()[0] if "torchtitan" in c.source and c.model.layers == 32]
    assert cases and all(c.cluster.accelerator.power_limit_w == 500 for c in cases)

    def steps(rated: bool) -> dict:
        out = {}
        for c in cases:
            cluster = (c.cluster.with_system(accelerator=replace(c.cluster.accelerator, power_limit_w=None))
                       if rated else c.cluster)
            out[(c.plan.dtype, c.plan.tp_comm_overlap)] = estimate(c.model, c.job, cluster, c.plan).step_time_s
        return out
    at_rated, at_500w = steps(rated=True), steps(rated=False)
    for overlap in (False, True):
        assert at_rated[("fp8-rowwise", overlap)] > at_rated[("bf16", overlap)] > at_rated[("fp8", overlap)]
        assert at_500w[("fp8-rowwise", overlap)] > at_500w[("fp8", overlap)]
        assert 0.97 < at_500w[("fp8-rowwise", overlap)] / at_500w[("bf16", overlap)] < 1.01
        assert all(at_500w[k] > at_rated[k] for k in at_rated)


def test_megatron_keeps_fp8_weight_copies_torchtitan_only_the_layer_in_flight():
    mb, mf = est("bf16"), est("fp8")
    extra = mf.memory_bytes_per_gpu["parameters"] - mb.memory_bytes_per_gpu["parameters"]
    assert extra == pytest.approx(2 * MODEL.num_params, rel=0.001)   # pp = tp = 1: the whole model
    tb, tf = est("bf16", engine="torchtitan", zero=3), est("fp8", engine="torchtitan", zero=3)
    extra_tt = tf.memory_bytes_per_gpu["parameters"] - tb.memory_bytes_per_gpu["parameters"]
    assert extra_tt == pytest.approx(2 * MODEL.params_per_layer)


def test_torchtitan_gathers_fp8_weights_under_fsdp():
    tb, tf = est("bf16", engine="torchtitan", zero=3), est("fp8", engine="torchtitan", zero=3)
    assert tf.details["dp_comm_total_s"] < tb.details["dp_comm_total_s"]
    row_b = est("fp8-rowwise", engine="torchtitan", zero=3)
    assert row_b.details["dp_comm_total_s"] == pytest.approx(tb.details["dp_comm_total_s"])  # rowwise gathers bf16


@pytest.mark.parametrize("cluster, dtype, needle", [
    ("dgx-a100-80g", "fp8", "no fp8 tensor cores"),
    ("dgx-h100", "mxfp8", "microscaling"),
])
def test_hardware_without_the_format_is_refused_naming_dtype(cluster, dtype, needle):
    with pytest.raises(ConfigError) as e:
        est(dtype, cluster=load_cluster(cluster, 8))
    assert e.value.field == "dtype" and needle in str(e.value)


def test_mxfp8_runs_on_blackwell():
    e = est("mxfp8", cluster=load_cluster("dgx-b200", 8))
    assert e.step_time_s > 0


@pytest.mark.parametrize("engine, dtype", [("megatron", "fp8-rowwise"), ("torchtitan", "fp8-delayed"),
                                           ("torchtitan", "fp8-blockwise"), ("deepspeed", "fp8")])
def test_engines_offer_only_their_recipes(engine, dtype):
    with pytest.raises(ConfigError) as e:
        Plan(dtype=dtype, engine=engine)
    assert e.value.field == "dtype"


def _doc(dtype, engine, zero):
    return {"schema": PLAN_SCHEMA, "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8,
                                                "seq_len": 8192, "global_batch": 128},
            "plan": {"tp": 2, "dp": 4, "sp": True, "zero": zero, "dtype": dtype, "engine": engine, "recompute": "full"}, "estimate": {}}


@pytest.mark.parametrize("dtype, recipe", [("fp8", "tensorwise"), ("fp8-delayed", "delayed"),
                                           ("fp8-blockwise", "blockwise")])
def test_megatron_export_maps_the_recipe(dtype, recipe):
    script = ex.to_megatron(_doc(dtype, "megatron", 1))
    assert "--fp8-format hybrid" in script and f"--fp8-recipe {recipe}" in script and "--bf16" in script


def test_torchtitan_export_maps_the_converters():
    from tests.planner.test_export import module_literals
    # torchtitan 0.2.2 (TOML): [quantize.linear.float8], per-tensor scaling with the float8 FSDP all-gather
    tensorwise = tomllib.loads(ex.to_torchtitan(_doc("fp8", "torchtitan", 3), "toml"))
    assert tensorwise["model"]["converters"] == ["quantize.linear.float8"]
    float8 = tensorwise["quantize"]["linear"]["float8"]
    assert float8["recipe_name"] == "tensorwise" and float8["enable_fsdp_float8_all_gather"] is True
    rowwise = tomllib.loads(ex.to_torchtitan(_doc("fp8-rowwise", "torchtitan", 3), "toml"))
    assert rowwise["quantize"]["linear"]["float8"] == {"recipe_name": "rowwise"}
    # torchtitan 0.3.0: Float8LinearConverter has row-wise recipes only; a per-tensor plan runs row-wise
    assert module_literals(ex.to_torchtitan(_doc("fp8-rowwise", "torchtitan", 3)))["FP8"] == ["Float8LinearConverter", "rowwise"]
    out = ex.export(_doc("fp8", "torchtitan", 3), "torchtitan")
    assert out.plan.dtype == "fp8-rowwise" and "fp8-rowwise for fp8" in out.summary
    assert "Float8LinearConverter.Config(model_compile_enabled=True, recipe_name='rowwise')" in out.text


def test_deepspeed_export_runs_bf16_for_fp8():
    """DeepSpeed has no fp8 recipe of its own (its spec has none): the nearest plan it runs is bf16,
    re-estimated beside the fp8 plan's estimate."""
    doc = _doc("fp8", "generic", 3)
    doc["plan"].update(tp=1, dp=8, sp=False)
    out = ex.export(doc, "deepspeed")
    assert out.plan.dtype == "bf16" and json.loads(out.text)["bf16"] == {"enabled": True}
    assert "bf16 for fp8" in out.summary


def test_planner_searches_in_fp8_when_asked(capsys):
    from paraplan.cli import main
    rc = main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192",
               "--global-batch", "128", "--dtype", "fp8", "--top", "2", "--format", "json", "--no-stage-ilp"])
    out = capsys.readouterr().out
    assert rc == 0 and '"dtype": "fp8"' in out and '"dtype": "bf16"' not in out


# --- TP communication overlap (a plan choice) ------------------------------------------------------
def test_tp_comm_overlap_hides_tp_collectives_under_the_gemms():
    model, job = load_model("llama3-70b"), TrainingJob(8192, 128)
    cluster = load_cluster("dgx-h100", 64)
    base = Plan(tp=4, pp=8, dp=2, sp=True, vpp=5, schedule="interleaved", zero=1, engine="megatron", dtype="fp8")
    off = estimate(model, job, cluster, base)
    on = estimate(model, job, cluster, dataclasses.replace(base, tp_comm_overlap=True))
    assert on.time_breakdown_s["tp_comm"] < 0.5 * off.time_breakdown_s["tp_comm"]
    # contention: the hidden part still costs 15 % of itself
    assert on.time_breakdown_s["tp_comm"] >= 0.15 * off.time_breakdown_s["tp_comm"] * 0.99
    assert on.step_time_s < off.step_time_s


@pytest.mark.parametrize("kw, field", [(dict(tp=2, sp=False), "tp_comm_overlap"),
                                       (dict(tp=1), "tp_comm_overlap"),
                                       (dict(tp=2, sp=True, engine="deepspeed"), "tp_comm_overlap")])
def test_tp_comm_overlap_needs_sp_and_an_engine_that_has_it(kw, field):
    with pytest.raises(ConfigError) as e:
        Plan(tp_comm_overlap=True, **kw)
    assert e.value.field == field


def test_tp_comm_overlap_exports():
    doc = _doc("bf16", "megatron", 1)
    doc["plan"]["tp_comm_overlap"] = True
    assert "--tp-comm-overlap" in ex.to_megatron(doc)
    doc = _doc("bf16", "torchtitan", 3)
    doc["plan"]["tp_comm_overlap"] = True
    cfg = tomllib.loads(ex.to_torchtitan(doc, "toml"))                  # torchtitan 0.2.2
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True and cfg["compile"]["enable"] is True
    from tests.planner.test_export import module_literals              # torchtitan 0.3.0: under compile
    assert module_literals(ex.to_torchtitan(doc))["SETTINGS"]["compile"]["enable_async_tensor_parallel"] is True
