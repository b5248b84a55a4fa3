"""Golden numbers from the papers (not from our own code)."""
import pytest

from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate, step_terms
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.pipeline import bubble_fraction
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.transformer import TrainingJob

from conftest import gpt


@pytest.mark.parametrize("zero,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_model_states(zero, expected_gb):
    """Rajbhandari et al. 2019 (ZeRO, arXiv:1910.02054) Fig. 1 / Table 1: Ψ = 7.5B, N_d = 64, K = 12:
    baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.88 GB."""
    plan = Plan(dp=64, zero=zero)
    states = M.model_state_bytes(7.5e9, plan)
    assert sum(float(v) for v in states.values()) / 1e9 == pytest.approx(expected_gb, rel=0.01)


def korthikanti(s, b, h, a, t=1, sp=False, mode="none"):
    """Korthikanti et al. 2022 (arXiv:2205.05198) Table 2, bytes per layer."""
    if mode == "full":
        return 2 * s * b * h / (t if sp else 1)
    if mode == "selective":
        return 34 * s * b * h / t if sp else s * b * h * (10 + 24 / t)
    if sp:
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


@pytest.mark.parametrize("t,sp,mode", [(1, False, "none"), (8, False, "none"), (8, True, "none"),
                                       (8, False, "selective"), (8, True, "selective"), (1, False, "full"),
                                       (8, True, "full"), (4, False, "full")])
def test_korthikanti_activation_memory(t, sp, mode):
    s, b, h, a = 2048, 2, 12288, 96
    model = gpt(h=h, a=a)
    job = TrainingJob(seq_len=s, global_batch=64)
    plan = Plan(tp=t, sp=sp, micro_batch=b, recompute=mode, flash_attention=False)
    got = float(M.activation_bytes_per_layer(model, job, plan))
    assert got == pytest.approx(korthikanti(s, b, h, a, t, sp, mode), rel=1e-9)


def test_megatron_flops_per_iteration_with_full_recompute():
    """Narayanan et al. 2021 (arXiv:2104.04473) Eq. 3: F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
    with full activation recomputation; our hardware FLOPs (model + recomputed forward) must match."""
    B, s, L, h, V = 1536, 2048, 105, 20480, 51200
    model = gpt(h=h, a=128, L=L, V=V)
    job = TrainingJob(seq_len=s, global_batch=B)
    cluster = load_cluster("dgx-a100-80g", 2520)
    plan = Plan(tp=8, pp=35, dp=9, micro_batch=1, recompute="full", flash_attention=False)
    terms = step_terms(model, job, cluster, plan, analytical_curves(cluster.accelerator))
    expected = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert float(terms.flops_hardware) == pytest.approx(expected, rel=1e-12)
    # and model FLOPs (no recompute) are the k = 3 form, 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))
    assert float(terms.flops_model) == pytest.approx(72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)),
                                                        rel=1e-12)


@pytest.mark.parametrize("p,m,v,schedule,expected", [(8, 64, 1, "1f1b", 7 / 64), (8, 64, 1, "gpipe", 7 / 64),
                                                     (8, 64, 4, "interleaved", 7 / (4 * 64)),
                                                     (16, 32, 1, "zb-h1", 15 / (3 * 32))])
def test_pipeline_bubble_fractions(p, m, v, schedule, expected):
    """(p−1)/m for GPipe/1F1B and (p−1)/(v·m) interleaved (Narayanan et al. 2021 §2.2); ZB-H1 (p−1)/(3m)
    (Qi et al. 2024)."""
    plan = Plan(pp=p, vpp=v, schedule=schedule)
    assert float(bubble_fraction(plan, m)) == pytest.approx(expected)


def test_estimate_bubble_term_is_the_fraction_of_stage_time():
    """In a full estimate the bubble equals (p−1)/(v·m) of the per-micro-batch stage work × m."""
    model = gpt(h=4096, a=32, L=32, V=512)
    cluster = load_cluster("dgx-a100-80g", 16)
    job = TrainingJob(seq_len=2048, global_batch=64)
    e = estimate(model, job, cluster, Plan(tp=2, pp=4, dp=2, vpp=2, schedule="interleaved", micro_batch=1))
    t = e.time_breakdown_s
    stage_work = t["compute"] + t["recompute"] + t["tp_comm"] + t["cp_comm"]
    m = 64 / 2
    assert t["pp_bubble"] == pytest.approx((4 - 1) / (2 * m) * stage_work, rel=0.02)
