"""Hybrid Mamba-2 / attention models in the cost model: the Mamba-2 layer's activations, its tensor- and
context-parallel split, the SSD scan's pricing, the engines that run hybrids, the stage split by layer
cost and the plan command on Nemotron-H 56B."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.costmodels import compute as C
from paraplan.costmodels import memory as M
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.mamba import mamba_cp_alltoall_time, ssd_forward_bytes_per_token, ssd_scan_times
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner.stages import layer_costs
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

H8 = load_model("nemotron-h-8b")
JOB = TrainingJob(8192, 64)
H100 = load_cluster("dgx-h100", 8)


def _plan(**kw):
    return Plan(**{"engine": "megatron", "zero": 1, **kw}).with_dp_for(H100.num_gpus)


def test_mamba_layer_saved_bytes_by_hand():
    """Nemotron-H-8B, one sequence of 8192 tokens, tp 1, no recomputation: the pre-norm's and in_proj's
    inputs 2·4096 + 2·4096, in_proj's output 2·18560, the scan's output, the gated norm's and out_proj's
    inputs 3 x 2·8192, the gated norm's fp32 rstd 4·8 per token (mamba_ssm MambaSplitConv1dScanCombinedFn
    saves zxbcdt and out_x; the norm and the linears their inputs)."""
    kinds = M.hybrid_kind_activation_bytes(H8, JOB, _plan())
    per_token = 4 * 4096 + 2 * 18560 + 6 * 8192 + 4 * 8
    assert float(kinds["mamba"]) == 8192 * per_token == 8192 * 102_688
    # attention layer (GQA 32 x 128 queries, 8 KV heads, flash): inputs 4h, Q K V out 2·(4096 + 1024 + 1024 + 4096),
    # the softmax statistics 4 bytes per head and token
    assert float(kinds["attention"]) == 8192 * (4 * 4096 + 2 * (4096 + 1024 + 1024 + 4096) + 4 * 32)
    # MLP layer: inputs 4h, squared ReLU's input and output 4f
    assert float(kinds["mlp"]) == 8192 * (4 * 4096 + 4 * 21504)
    average = (24 * kinds["mamba"] + 4 * kinds["attention"] + 24 * kinds["mlp"]) / 52
    assert float(M.activation_bytes_per_layer(H8, JOB, _plan())) == pytest.approx(float(average))


def test_tensor_parallelism_splits_the_heads_sequence_parallelism_the_block_inputs():
    one = M.hybrid_kind_activation_bytes(H8, JOB, _plan())["mamba"]
    two = M.hybrid_kind_activation_bytes(H8, JOB, _plan(tp=2))["mamba"]
    two_sp = M.hybrid_kind_activation_bytes(H8, JOB, _plan(tp=2, sp=True))["mamba"]
    block = 8192 * 4 * 4096
    assert float(two) == pytest.approx(block + (float(one) - block) / 2)
    assert float(two_sp) == pytest.approx(float(one) / 2)
    full = M.hybrid_kind_activation_bytes(H8, JOB, _plan(recompute="full"))["mamba"]
    assert float(full) == 8192 * 2 * 4096


def test_ssd_scan_bytes_and_its_roofline():
    """12d + 16GN + 8GQ + 26H + 12·d·N/Q bytes per token (mamba_ssm chunk_scan_combined's kernels);
    memory-bound for Nemotron-H (FLOPs per byte ~30 against an H100's ~200 at the attention rate)."""
    m = H8.mamba
    assert ssd_forward_bytes_per_token(m) == 12 * 8192 + 16 * 8 * 128 + 8 * 8 * 128 + 26 * 128 + 12 * 8192 == 224_512
    assert m.scan_flops_per_token() / ssd_forward_bytes_per_token(m) < 40
    curves = curves_for(H100)
    fwd, bwd = ssd_scan_times(H8, JOB, _plan(), curves)
    assert float(fwd) == pytest.approx(float(curves.memory_time(8192 * 224_512, kernels=6)))
    assert float(bwd) == pytest.approx(2 * float(fwd), rel=1e-6)
    half, _ = ssd_scan_times(H8, JOB, _plan(tp=2), curves)
    assert float(half) < float(fwd)


def test_only_the_attention_layers_grow_faster_than_the_sequence():
    curves = curves_for(H100)
    short, long_ = (C.hybrid_kind_times(H8, TrainingJob(s, 64), _plan(), curves, H100) for s in (4096, 16384))
    mamba = float(long_["mamba"]["forward"]) / float(short["mamba"]["forward"])
    attention = float(long_["attention"]["forward"]) / float(short["attention"]["forward"])
    assert 3.5 < mamba < 4.3          # linear in the tokens (kernel launches aside)
    assert attention > mamba + 0.5   # its score term is quadratic


def test_context_parallel_all_to_alls_of_the_mamba_layers():
    cp2 = _plan(cp=2)
    assert float(mamba_cp_alltoall_time(H8, JOB, _plan(), H100)) == 0.0
    assert float(mamba_cp_alltoall_time(H8, JOB, cp2, H100)) > 0.0
    kinds = C.hybrid_kind_times(H8, JOB, cp2, curves_for(H100), H100)
    assert float(kinds["mamba"]["cp_comm"]) > 0 and float(kinds["mlp"]["cp_comm"]) == 0


@pytest.mark.parametrize("engine", ["deepspeed", "torchtitan", "scaling"])
def test_engines_without_a_mamba_layer_refuse_hybrids_naming_the_field(engine):
    with pytest.raises(ConfigError) as e:
        estimate(H8, JOB, H100, Plan(engine=engine))
    assert e.value.field == "engine" and "Megatron-LM" in str(e.value)


def test_megatron_and_generic_run_hybrids():
    for engine in ("megatron", "generic"):
        assert estimate(H8, JOB, H100, Plan(engine=engine, tp=2, sp=True)).step_time_s > 0


def test_tp_must_divide_the_mamba_groups():
    odd = replace(H8, mamba=replace(H8.mamba, groups=2))
    with pytest.raises(ConfigError) as e:
        estimate(odd, JOB, H100, Plan(engine="megatron", tp=4, sp=True))
    assert "Mamba heads(128) and groups(2)" in str(e.value)


def test_model_flops_count_the_scan_but_no_attention_term_on_mamba_layers():
    e = estimate(H8, JOB, H100, _plan(tp=2, sp=True))
    assert e.mfu * e.step_time_s * 8 * H100.accelerator.peak("bf16") == pytest.approx(
        H8.model_flops_per_token(8192) * JOB.tokens_per_step, rel=1e-9)


def test_pipeline_stages_split_by_layer_cost():
    costs = layer_costs(H8, JOB, H100, _plan(pp=4, tp=2, sp=True))
    by_kind = {c.name.split("-")[0]: c for c in costs[1:-1]}
    assert [c.name for c in costs[1:5]] == ["mamba-0", "mlp-1", "mamba-2", "mlp-3"]
    assert len({by_kind[k].time_s for k in ("mamba", "attention", "mlp")}) == 3
    assert by_kind["attention"].weight_bytes < by_kind["mlp"].weight_bytes


@pytest.mark.slow
def test_plan_on_nemotron_h_56b_shows_the_layers_by_kind(capsys):
    assert main(["plan", "--model", "nemotron-h-56b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8k",
                 "--global-batch", "768", "--top", "3"]) == 0
    out = capsys.readouterr().out
    for word in ("Mamba-2      54 layers", "attention    10 layers", "MLP          54 layers", "Mamba-2 SSD scan"):
        assert word in out
    assert np.isfinite(float(out.split("step time")[1].split()[0]))


def test_megatron_export_runs_the_hybrid_with_pretrain_mamba(tmp_path):
    from paraplan.planfile import write_plan_file
    from paraplan.planner import export as ex
    e = estimate(H8, JOB, H100, Plan(engine="megatron", tp=2, sp=True, zero=1))
    f = tmp_path / "plan.json"
    write_plan_file(f, e, "nemotron-h-8b", "dgx-h100")
    import json
    script = ex.to_megatron(json.loads(f.read_text()))
    for flag in ("pretrain_mamba.py", "--hybrid-override-pattern 'M-M-M-M*-", "--mamba-num-heads 128",
                 "--mamba-head-dim 64", "--mamba-state-dim 128", "--mamba-num-groups 8", "--squared-relu",
                 "--position-embedding-type none"):
        assert flag in script
    assert "pretrain_gpt.py" not in script


def test_fp8_casts_of_each_kind():
    """fp8 (Nemotron-H 56B's recipe): each layer quantizes its two linears' inputs and weights forward and their
    output gradients backward; none in bf16."""
    curves = curves_for(H100)
    assert C.hybrid_fp8_cast_times(H8, JOB, _plan(), curves, "mamba") == (0.0, 0.0)
    fp8 = _plan(dtype="fp8")
    f, b = C.hybrid_fp8_cast_times(H8, JOB, fp8, curves, "mamba")
    m = 8  # micro-batches: 64 sequences over dp 8, Transformer Engine caches the weights' fp8 copy per step
    elements = 8192 * (4096 + 8192) + H8.kind_params("mamba") / m
    assert float(f) == pytest.approx(float(curves.fp8_cast_time(6 * elements, kernels=4)))
    assert float(b) == pytest.approx(float(curves.fp8_cast_time(6 * 8192 * (18560 + 4096), kernels=2)))


def test_megatron_splits_a_hybrid_evenly_without_interleaving():
    """Megatron-LM's MambaStack gives each pipeline rank num_layers // pp layers and asserts no virtual
    pipeline: 118 layers do not run on pp 4 there, nor interleaved; the generic engine prices them."""
    h56 = load_model("nemotron-h-56b")
    cluster = load_cluster("dgx-h100", 64)
    job = TrainingJob(8192, 768)
    for plan in (Plan(engine="megatron", tp=4, pp=4, sp=True), Plan(engine="megatron", tp=4, pp=2, vpp=2,
                                                                     schedule="interleaved", sp=True)):
        with pytest.raises(ConfigError) as e:
            estimate(h56, job, cluster, plan)
        assert e.value.field == "pp" and "mamba_block.py" in str(e.value)
    assert estimate(h56, job, cluster, Plan(engine="megatron", tp=4, pp=2, sp=True)).details["layers_per_stage"] == [59, 59]
    assert estimate(h56, job, cluster, Plan(engine="generic", tp=4, pp=4, sp=True)).step_time_s > 0
