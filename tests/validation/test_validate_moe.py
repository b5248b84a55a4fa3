"""``paraplan validate`` with a mixture of experts: flags checked before anything launches, plan files'
expert parallelism taken, the harness's model mapped onto the estimator's (no torchrun here: the runs are
in test_validation_parallel.py and test_profiled.py)."""
from __future__ import annotations

import pytest

from paraplan.cli.validate import main
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planfile import write_plan_file
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


@pytest.mark.parametrize("argv, flag, said", [
    (["--ep", "2", "--dp", "2"], "--ep", "needs a mixture-of-experts model"),
    (["--experts", "6", "--ep", "4", "--dp", "4"], "--ep", "accepted: 1, 2, 3, 6"),
    (["--experts", "4", "--ep", "4", "--nproc-per-node", "2"], "--ep", "dp(2) % ep(4) = 2, must be 0"),
    (["--experts", "4", "--ep", "2"], "--ep", "dp(1) % ep(2) = 1, must be 0"),
    (["--experts", "4", "--tp", "2", "--nproc-per-node", "2"], "--sp", "accepted: sp with tp > 1 and experts"),
    (["--etp", "2", "--tp", "2", "--sp"], "--etp", "needs a mixture-of-experts model"),
    (["--experts", "4", "--etp", "2"], "--etp", "must divide tp(1)"),
    (["--experts", "4", "--tp", "4", "--etp", "2", "--sp"], "--etp", "accepted: 1, 4"),
    (["--experts", "4", "--tp", "2", "--etp", "2", "--ep", "2", "--dp", "2", "--sp"], "--etp",
     "expert tensor parallelism with ep 1 only"),
    (["--experts", "4", "--tp", "2", "--etp", "2", "--expert-ffn", "15", "--sp"], "--expert-ffn",
     "accepted: a multiple of 2"),
    (["--experts", "4", "--ep", "2", "--dp", "2", "--zero", "3"], "--zero", "ZeRO-3 with ep(2) > 1"),
    (["--experts", "4", "--top-k", "5"], "--top-k", "accepted: 1..4"),
    (["--experts", "-1"], "--experts", ""),
    (["--moe-imbalance", "0.5"], "--moe-imbalance", ">= 1"),
])
@pytest.mark.torch
def test_bad_moe_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, flag, said):
    assert main(["validate", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]   # a ConfigError is one line; argparse's adds a "(see: ... --help)" line
    assert first.startswith(("paraplan: error: " + flag, "paraplan validate: error: " + flag)), err
    assert said in first and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _moe_plan_file(path, **fields):
    plan = Plan(**{"dp": 4, "ep": 2, "micro_batch": 1, **fields})
    e = estimate(load_model("qwen3-30b-a3b"), TrainingJob(4096, 8), load_cluster("dgx-h100", plan.tp * plan.pp *
                                                                                  plan.dp * plan.cp), plan)
    write_plan_file(path, e, "qwen3-30b-a3b", "dgx-h100")
    return path


def _sized(argv, tmp_path=None):
    """The run validate would launch for ``argv`` (sized and checked, nothing launched)."""
    from paraplan.cli import build_parser
    from paraplan.cli.validate import check_validate_args
    return check_validate_args(build_parser().parse_args(["validate", *argv, "--out", str(tmp_path or "unused")]))


def test_a_plan_files_expert_parallelism_and_experts_are_taken(tmp_path):
    """ep and etp come from the file, and the plan's mixture of experts becomes the harness's: a few
    experts (a multiple of ep) with the model's share of them per token and its expert width ratio
    (Qwen3-30B-A3B: 8 of 128, 768 wide on hidden 2048), said in a note; --experts and --top-k given
    win. (A plan file's MoE model used to run dense unless --experts was given.)"""
    path = _moe_plan_file(tmp_path / "p.json")
    sized = _sized(["--plan", str(path)])
    assert (sized.plan.ep, sized.plan.dp, sized.plan.etp) == (2, 4, 1)
    assert any("runs on the harness's mixture of experts" in n for n in sized.notes)
    m = sized.model
    assert (m.experts, m.top_k, m.expert_ffn) == (8, 1, 96)
    assert any("routes each token to 8 of 128 experts" in n and "harness runs 1 of 8 experts 96 wide" in n
               for n in sized.notes), sized.notes
    m = _sized(["--plan", str(path), "--experts", "4", "--top-k", "2"]).model
    assert (m.experts, m.top_k, m.expert_ffn) == (4, 2, 0)
    tp2 = _moe_plan_file(tmp_path / "tp2.json", tp=2, sp=True, dp=2, ep=1, etp=2)
    sized = _sized(["--plan", str(tp2)])
    assert (sized.plan.tp, sized.plan.etp, sized.plan.sp, sized.model.experts, sized.model.expert_ffn) == \
        (2, 2, True, 8, 96)


@pytest.mark.parametrize("experts, top_k, ratio, ep, etp, expected", [
    (128, 8, 0.375, 1, 1, (8, 1, 96)),       # Qwen3-30B-A3B on the harness's hidden 256
    (128, 8, 0.375, 16, 1, (16, 1, 96)),     # a multiple of ep
    (8, 2, 3.5, 2, 1, (8, 2, 896)),          # Mixtral 8x7B: its own 8 experts, top-2
    (256, 8, 2048 / 7168, 1, 2, (8, 1, 80)),  # DeepSeek-V3, expert width a multiple of 8·etp
    (6, 2, 1.0, 4, 1, (8, 3, 256)),          # ep 4 does not divide 6: 8 experts, 2/6 of them a token
])
def test_harness_experts_keep_the_models_shares(experts, top_k, ratio, ep, etp, expected):
    from paraplan.validation.sizing import harness_experts
    assert harness_experts(experts, top_k, ratio, ep, 256, etp) == expected


@pytest.mark.torch
def test_the_estimator_is_told_the_harness_experts():
    from paraplan.validation.config import RunOptions
    from paraplan.validation.model import GPTConfig, param_specs
    from paraplan.validation.predict import TERM_MAP, estimator_model, estimator_plan, to_predicted
    cfg = GPTConfig(vocab_size=256, seq_len=64, hidden=64, heads=4, layers=2, experts=8, top_k=2, expert_ffn=96)
    model = estimator_model(cfg)
    assert (model.moe.experts, model.moe.top_k, model.moe.expert_ffn_hidden) == (8, 2, 96)
    assert model.moe.capacity_factor is None and model.moe.dispatch == "permute"
    harness_params = sum(__import__("math").prod(s) for _, s, _, _ in param_specs(cfg))
    assert model.num_params == harness_params
    run = Plan(dp=4, ep=2)
    plan = estimator_plan(cfg, run, cpu=True)
    assert plan.ep == 2
    from paraplan.hardware.catalog import load_cluster as catalog_cluster
    e = estimate(model, TrainingJob(cfg.seq_len, RunOptions().for_plan(run).global_batch),
                 catalog_cluster("dgx-h100", 4), plan)
    assert "ep_comm" in to_predicted(e, ep=2)["time_breakdown_s"]
    assert "ep_comm" not in to_predicted(e, ep=1)["time_breakdown_s"]
    assert TERM_MAP["ep_comm"] == ("ep_comm",)
    assert GPTConfig(experts=0).expert_width == GPTConfig().ffn


# ------------------------------------------------------------------ the Llama family's architecture

@pytest.mark.parametrize("argv, flag, said", [
    (["--kv-heads", "3"], "--kv-heads", "accepted: 1, 2, 4"),
    (["--kv-heads", "1", "--tp", "2", "--nproc-per-node", "2"], "--kv-heads", "do not divide over tp(2)"),
    (["--rotary", "--hidden", "20", "--heads", "4"], "--rotary", "even head size"),
    (["--activation", "relu"], "--activation", "accepted: gelu, swiglu"),
    (["--recompute", "op-sac", "--attention", "math"], "--attention", "op-sac keeps the fused attention"),
    (["--tp", "2", "--vocab", "255", "--nproc-per-node", "2"], "--vocab", "the vocabulary is split over tp"),
    (["--recompute", "op-sac", "--experts", "4"], "--recompute", "dense MLPs only"),
    (["--recompute", "op-sac", "--cp", "2", "--nproc-per-node", "2"], "--recompute", "without context parallelism"),
])
@pytest.mark.torch
def test_bad_architecture_flags_name_the_flag(tmp_path, capsys, argv, flag, said):
    assert main(["validate", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if "error:" in line)   # notes may come first
    assert first.startswith(("paraplan: error: " + flag, "paraplan validate: error: " + flag)), err
    assert said in first and "Traceback" not in err


@pytest.mark.torch
def test_the_estimator_is_told_the_harness_architecture():
    """SwiGLU, RMSNorm, no biases, grouped-query attention and rotary positions reach the estimator's
    model (its parameter count equals the harness's to the element), and eager norms/activations/rotary
    reach its plan as fused_elementwise off; the default GPT model keeps the fused default."""
    import math

    from paraplan.validation.model import GPTConfig, param_specs
    from paraplan.validation.predict import estimator_model, estimator_plan
    for kw in ({}, dict(activation="swiglu", norm="rmsnorm", bias=False, kv_heads=2, rotary=True),
               dict(norm="rmsnorm"), dict(activation="swiglu", bias=False, experts=4)):
        cfg = GPTConfig(vocab_size=256, seq_len=64, hidden=64, heads=4, layers=2, **kw)
        model = estimator_model(cfg)
        assert model.num_params == sum(math.prod(s) for _, s, _, _ in param_specs(cfg)), kw
        assert estimator_plan(cfg, Plan(dp=1)).fused_elementwise is (not kw or kw.get("norm") is None
                                                                    and kw.get("activation") is None)
    llama = estimator_model(GPTConfig(hidden=64, heads=4, kv_heads=2, rotary=True, activation="swiglu"))
    assert (llama.kv_heads, llama.rotary, llama.learned_positions, llama.mlp_matrices) == (2, True, False, 3)


def test_harness_kv_heads_come_nearest_the_models_ratio_among_those_that_run():
    from paraplan.validation.sizing import harness_kv_heads
    assert harness_kv_heads(4, 1, 4) == 1 and harness_kv_heads(8, 1, 8) == 1
    assert harness_kv_heads(4, 2, 4) == 2            # kv heads must divide over tp
    assert harness_kv_heads(4, 4, 8) == 4            # only multi-head attention runs at tp 4
    assert harness_kv_heads(8, 1, 3) == 2            # ratios 4 and 2 equally near 3: the larger
    assert harness_kv_heads(8, 1, 5) == 2            # ratio 4 nearer 5 than 8


def test_a_plan_files_model_gives_the_architecture(tmp_path):
    """A Llama plan runs SwiGLU, RMSNorm, no biases, rotary positions and the nearest grouped-query
    ratio the harness's heads and tp allow, each said; flags beside the file win."""
    plan = Plan(tp=2, micro_batch=1)
    e = estimate(load_model("llama3-8b"), TrainingJob(2048, 8), load_cluster("dgx-h100", 2), plan)
    write_plan_file(tmp_path / "p.json", e, "llama3-8b", "dgx-h100")
    path = str(tmp_path / "p.json")
    sized = _sized(["--plan", path], tmp_path)
    m = sized.model
    assert (m.activation, m.norm, m.bias, m.rotary) == ("swiglu", "rmsnorm", False, True)
    # llama3-8b's 4 query heads per kv head on the harness's 4 heads at the plan's tp 2: 2 kv heads
    # (one per tp rank), 2 queries each, and said so
    assert m.kv_heads == 2
    assert any("4 query heads per key/value head" in n and "run 2 (2 kv heads" in n for n in sized.notes), sized.notes
    sized = _sized(["--plan", path, "--tp", "1", "--kv-heads", "4"], tmp_path)
    assert sized.model.kv_heads == 4 and sized.plan.tp == 1
    sized = _sized(["--plan", path, "--tp", "1"], tmp_path)
    assert sized.model.kv_heads == 1 and any("heads run 4 (1 kv heads)" in n for n in sized.notes), sized.notes
    m = _sized(["--plan", path, "--norm", "layernorm"], tmp_path).model
    assert m.norm == "layernorm" and m.activation == "swiglu"
    m = _sized([], tmp_path).model
    assert (m.activation, m.norm, m.bias, m.rotary) == ("gelu", "layernorm", True, False)


def test_a_qwen3_plan_file_runs_its_qk_norm(tmp_path):
    """A Qwen3 plan's model normalizes its queries and keys (QK-norm): the harness runs it, says so, and
    the harness model's estimate counts it; a Llama plan does not, and --qk-norm asks for it by flag."""
    plan = Plan(tp=2, sp=True, micro_batch=1)
    for model, qk in (("qwen3-8b", True), ("llama3-8b", False)):
        e = estimate(load_model(model), TrainingJob(2048, 8), load_cluster("dgx-h100", 2), plan)
        write_plan_file(tmp_path / f"{model}.json", e, model, "dgx-h100")
        sized = _sized(["--plan", str(tmp_path / f"{model}.json")], tmp_path)
        assert sized.model.qk_norm is qk
        assert any(("QK-norm" in n) is qk for n in sized.notes if n.startswith("architecture")), sized.notes
    assert _sized(["--qk-norm"], tmp_path).model.qk_norm is True
