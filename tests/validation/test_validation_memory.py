"""Memory and time accounting of the validation worker (single process, no torchrun needed)."""
import pytest

from paraplan.errors import ConfigError
from paraplan.validation.apply_pp import interleaved_1f1b, one_f_one_b, stage_layers
from paraplan.plan import Plan
from paraplan.validation.config import RunOptions
from paraplan.validation.model import GPTConfig
from paraplan.validation.worker import run_training

pytestmark = pytest.mark.torch

CFG = GPTConfig(layers=2, hidden=64, heads=4, seq_len=64)


def _mem(recompute):
    return run_training(CFG, Plan(dp=1, micro_batch=2, recompute=recompute),
                        RunOptions(global_batch=2, steps=1, warmup=0, profile_ops=False))


def test_full_recompute_saves_fewer_activation_bytes_than_none():
    none, sel, full = (_mem(r) for r in ("none", "selective", "full"))
    a = {k: r["memory_bytes"]["activations_peak"] for k, r in
         (("none", none), ("selective", sel), ("full", full))}
    assert a["full"] < a["selective"] < a["none"]  # math attention: selective drops s^2 terms
    assert a["full"] < 0.5 * a["none"]
    # recomputation changes memory, never the numbers
    assert none["losses"] == full["losses"] == sel["losses"]


def _layer_bytes(cfg, recompute):
    """Saved-activation bytes one more layer adds (3 layers less 2), micro-batch 2."""
    from dataclasses import replace
    plan, options = Plan(dp=1, micro_batch=2, recompute=recompute), RunOptions(global_batch=2, steps=1, warmup=0,
                                                                                profile_ops=False)
    peak = [run_training(replace(cfg, layers=n), plan, options)["memory_bytes"]["activations_peak"] for n in (2, 3)]
    return peak[1] - peak[0]


@pytest.mark.parametrize("arch", [{}, dict(activation="swiglu", kv_heads=2, rotary=True, bias=False, norm="rmsnorm"),
                                  dict(activation="swiglu", kv_heads=2, rotary=True, bias=False, norm="rmsnorm",
                                       qk_norm=True)])
@pytest.mark.slow
def test_op_sac_keeps_every_other_matmul_and_the_attention_output(arch):
    """torchtitan's op-level SAC on the harness: a layer keeps its input, wq's and wv's outputs, the fused
    attention's output (and its fp32 log-sum-exp), w1's and (SwiGLU) w2's outputs, the estimator's
    memory.op_sac_saved_bytes_per_token in fp32, and matches the run without recomputation. A QK-norm
    keeps nothing more: its ops are recomputed in the backward, like the rotary positions."""
    from dataclasses import replace
    cfg = replace(CFG, attention="sdpa", **arch)
    T, h, heads = 2 * cfg.seq_len, cfg.hidden, cfg.heads
    q, kv = h, h // heads * cfg.n_kv
    kept = h + q + kv + q + (cfg.ffn + h if arch else cfg.ffn)
    assert _layer_bytes(cfg, "op-sac") == 4 * T * kept + 4 * T * heads
    none = run_training(cfg, Plan(dp=1, micro_batch=2), RunOptions(global_batch=2, steps=2, warmup=0, profile_ops=False))
    sac = run_training(cfg, Plan(dp=1, micro_batch=2, recompute="op-sac"),
                       RunOptions(global_batch=2, steps=2, warmup=0, profile_ops=False))
    # the first step's forward is the same arithmetic (to a few ulps: the checkpointed region may
    # dispatch other CPU kernels; AMD EPYC: 2 ulps); the second step's loss tests the recomputed backward
    assert sac["losses"][0] == pytest.approx(none["losses"][0], rel=1e-6)
    assert abs(sac["losses"][1] - none["losses"][1]) <= 1e-5 * abs(none["losses"][1])


def test_op_sac_needs_the_fused_attention_a_dense_mlp_and_no_ring():
    from dataclasses import replace
    plan, options = Plan(dp=1, micro_batch=1, recompute="op-sac"), RunOptions(global_batch=1, steps=1, warmup=0,
                                                                               profile_ops=False)
    for cfg, said in ((CFG, "math attention"), (replace(CFG, attention="sdpa", experts=4), "dense MLPs")):
        with pytest.raises(ConfigError, match=said):
            run_training(cfg, plan, options)


def test_activation_bytes_scale_with_micro_batch():
    small = _mem("none")["memory_bytes"]["activations_peak"]
    big = run_training(CFG, Plan(dp=1, micro_batch=4), RunOptions(global_batch=4, steps=1, warmup=0,
                                                                  profile_ops=False))["memory_bytes"]["activations_peak"]
    assert 1.8 < big / small < 2.2


def test_model_state_bytes_single_process():
    r = _mem("none")
    m = r["memory_bytes"]
    n_params = m["parameters"] // 4
    assert m["gradients"] == m["parameters"]
    # AdamW: exp_avg + exp_avg_sq per parameter (+ a scalar step per tensor)
    assert 2 * 4 * n_params <= m["optimizer_states"] < 2 * 4 * n_params + 1024
    assert m["total"] == sum(v for k, v in m.items() if k != "total")


@pytest.mark.slow
def test_results_carry_times_and_op_profile():
    r = run_training(CFG, Plan(dp=1, micro_batch=2), RunOptions(global_batch=2, steps=2, warmup=1, profile_ops=True))
    assert len(r["step_times_s"]) == 2 and all(t > 0 for t in r["step_times_s"])
    assert len(r["losses"]) == 3
    assert set(r["time_breakdown_s"]) == {"compute", "tp_comm", "pp_comm", "dp_comm",
                                          "optimizer", "other"}
    assert any(k.startswith("aten::") for k in r["op_times_s"])


def test_schedules_run_every_forward_before_its_backward():
    for p, m, v in [(2, 4, 1), (4, 8, 1), (2, 4, 2), (4, 8, 2), (2, 2, 3)]:
        for rank in range(p):
            acts = interleaved_1f1b(rank, p, m, v)
            assert len(acts) == 2 * m * v
            seen = set()
            for a in acts:
                if a.kind == "F":
                    seen.add((a.chunk, a.micro))
                else:
                    assert (a.chunk, a.micro) in seen
    assert one_f_one_b(0, 4, 8)[:4] == interleaved_1f1b(0, 4, 8, 1)[:4]


def test_bad_plans_raise_config_errors():
    from paraplan.validation.support import check_runs
    with pytest.raises(ConfigError, match="zero"):
        Plan(dp=1, zero=4)
    with pytest.raises(ConfigError, match="global_batch"):
        check_runs(Plan(dp=2, micro_batch=2), CFG, RunOptions(global_batch=6))
    with pytest.raises(ConfigError, match="recompute"):
        Plan(dp=1, recompute="some")
    with pytest.raises(ConfigError, match="steps"):
        RunOptions(steps=0)
    with pytest.raises(ConfigError, match="not divisible"):
        stage_layers(4, 3)
    with pytest.raises(ConfigError, match="interleaved"):
        interleaved_1f1b(0, 2, 3, 2)


def test_torchrun_command_passes_multinode_flags():
    from paraplan.validation.launch import LaunchOptions, torchrun_command
    cmd = torchrun_command(LaunchOptions(nproc_per_node=8, nnodes=2, node_rank=1,
                                         rdzv_endpoint="node0:29500"), "m", ["a"])
    assert "--nproc-per-node=8" in cmd and "--nnodes=2" in cmd and "--node-rank=1" in cmd
    assert "--rdzv-endpoint=node0:29500" in cmd and cmd[-3:] == ["-m", "m", "a"]
    with pytest.raises(ConfigError, match="rdzv"):
        LaunchOptions(nproc_per_node=8, nnodes=2)


@pytest.mark.parametrize("arch", [dict(norm="rmsnorm"), dict(kv_heads=2), dict(rotary=True),
                                  dict(activation="swiglu", norm="rmsnorm", bias=False, kv_heads=2, rotary=True),
                                  dict(activation="swiglu", norm="rmsnorm", bias=False, kv_heads=2, rotary=True,
                                       qk_norm=True), dict(qk_norm=True)])
@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_kept_activations_of_the_llama_choices_match_the_estimate(arch, recompute):
    """One process, math attention: the saved-for-backward bytes against the estimator's kept
    activations within 3 %. Before the fixes below the Llama choices read -13 % (none) and -15 % (selective):
    eager RMSNorm's fp32 normalized output was not counted, the harness's q, k, v were views of the
    fused QKV output (one kept alive all of it once rotary positions or the grouped-query reshape had
    copied the others), every block kept its own rotary table, and an unfused core's K and V repeated
    to every query head were not counted. Qwen3's QK-norm: its input, q and k before the
    norm, and eager RMSNorm's normalized output; uncounted, the RMSNorm model with it read -16 %."""
    from dataclasses import replace
    from paraplan.validation.predict import estimator_model, estimator_plan, kept_activation_bytes_by_stage
    from paraplan.workloads.transformer import TrainingJob
    cfg = replace(GPTConfig(vocab_size=256, seq_len=32, hidden=64, heads=4, layers=4, seed=3), **arch)
    plan = Plan(dp=1, micro_batch=1, recompute=recompute)
    measured = run_training(cfg, plan, RunOptions(global_batch=1, steps=1, warmup=0, profile_ops=False))[
        "memory_bytes"]["activations_peak"]
    predicted = kept_activation_bytes_by_stage(estimator_model(cfg), TrainingJob(cfg.seq_len, 1),
                                               estimator_plan(cfg, plan, True))["first"]
    assert predicted == pytest.approx(measured, rel=0.03)
