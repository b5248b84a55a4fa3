"""Issue 4: the seed papers' claims, each test citing its paper."""
import pytest

from paraplan.costmodels.cpcomm import ulysses_alltoall_time
from paraplan.costmodels.dataparallel import dp_exposed_time
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.planner.search import search
from paraplan.planner.space import SpaceOptions
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel

GPT_10B = TransformerModel("gpt-10b", 50, 4096, 32, 50257, tied_embeddings=True)   # 10.3B, GPT-2 layout


# --- ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840) --------------------------------------------
def test_zero_offload_10b_fits_one_v100_only_with_offload():
    """Abstract: "train models with over 13 billion parameters on a single GPU"; 10B trains on one
    V100-32GB with ZeRO-Offload, and not without (16 bytes/param of model states alone are 165 GB)."""
    v100 = load_cluster("dgx2-v100", 1)
    job = TrainingJob(1024, 16)
    assert search(GPT_10B, job, v100, options=SpaceOptions(fixed={"offload": "none"}), top=1).best is None
    best = search(GPT_10B, job, v100, options=SpaceOptions(fixed={"offload": "cpu", "offload_params": False}),
                  top=1).best
    assert best is not None and best.plan.offload == "cpu"


def test_zero_offload_largest_model_on_one_v100_is_about_13b():
    """The paper's largest single-V100 model is 13B (its Fig. 1/§6). We find 14.3B (fp16 weights on the
    GPU plus DeepSpeed's buckets and the runtime reserve): within 20% of the paper."""
    v100 = load_cluster("dgx2-v100", 1)
    largest = 0
    for layers in range(50, 90, 2):
        model = TransformerModel("x", layers, 4096, 32, 50257, tied_embeddings=True)
        r = search(model, TrainingJob(1024, 16), v100, options=SpaceOptions(fixed={"offload_params": False}), top=1)
        if r.best is None:
            break
        largest = model.num_params
    assert 11e9 <= largest <= 16e9, largest


def test_zero_offload_throughput_of_10b_on_one_v100():
    """The paper reports 40 TFLOP/s for 10B on one V100. Configuration assumed here (the paper's exact
    batch is not in our references): fp16, activation checkpointing, micro-batch 4 of 1024 tokens,
    4 micro-batches per step, ZeRO-2 with CPU-Adam on the DGX-2 host, DeepSpeed's buffers. Band: 30-45
    TFLOP/s. (Micro-batch 8 was assumed before the allocator reserve was modelled; with it, 8 x 1024
    tokens of unfused attention no longer fit the 32 GB.)"""
    v100 = load_cluster("dgx2-v100", 1)
    e = estimate(GPT_10B, TrainingJob(1024, 16), v100, Plan(zero=2, offload="cpu", recompute="full",
                                                             micro_batch=4, flash_attention=False, dtype="fp16",
                                                             engine="deepspeed"))
    assert e.feasible
    assert 30 <= e.model_tflops_per_gpu <= 45, e.model_tflops_per_gpu
    assert e.time_breakdown_s["optimizer"] > 0 and e.time_breakdown_s["offload"] > 0


# --- ZeRO-Infinity (Rajbhandari et al. 2021, arXiv:2104.07857) ------------------------------------
def test_zero_infinity_1t_on_one_dgx2_only_with_nvme():
    """§1/§8: fine-tune a 1T model on one DGX-2 node; host memory (1.5 TB) cannot hold its 16 TB of
    optimizer states, NVMe (30 TB) can."""
    dgx2 = load_cluster("dgx2-v100", 16)
    model, job = load_model("gpt-1t"), TrainingJob(2048, 64)
    for off in ("none", "cpu"):
        r = search(model, job, dgx2, options=SpaceOptions(fixed={"offload": off}), top=1)
        assert r.best is None
    assert "host memory" in search(model, job, dgx2, options=SpaceOptions(fixed={"offload": "cpu"}),
                                   top=1).closest_infeasible.infeasible_reason
    best = search(model, job, dgx2, top=1).best
    assert best is not None and best.plan.offload == "nvme" and best.plan.zero == 3


def test_zero_infinity_tens_of_trillions_on_512_v100():
    """Abstract: 32T parameters on 512 V100s (32 DGX-2). A 26T model fits with NVMe offload."""
    cluster = load_cluster("dgx2-v100", 512)
    model = TransformerModel("26t", 512, 65536, 512, 51200, tied_embeddings=True)
    assert model.num_params > 2.5e13
    r = search(model, TrainingJob(2048, 512), cluster,
               options=SpaceOptions(fixed={"offload": "nvme", "offload_params": True, "zero": 3}), top=1)
    assert r.best is not None


def test_planner_picks_nvme_only_when_host_memory_does_not_suffice():
    """ZeRO-Offload trains 70B on one DGX-2 with CPU offload (its abstract); 1T needs NVMe."""
    dgx2 = load_cluster("dgx2-v100", 16)
    job = TrainingJob(2048, 64)
    assert search(load_model("llama2-70b"), job, dgx2, top=1).best.plan.offload == "cpu"
    assert search(load_model("gpt-1t"), job, dgx2, top=1).best.plan.offload == "nvme"


# --- DeepSpeed-TED (Singh et al. 2023, arXiv:2303.06318) ------------------------------------------
TED_OPTIONS = {"zero": 1, "offload": "none", "pp": 1}   # DeepSpeed-MoE: ZeRO-1, no pipeline with MoE


def test_ted_40b_moe_fits_128_v100_with_tensor_expert_data():
    cluster, model, job = load_cluster("dgx2-v100", 128), load_model("ted-6.7b-16e"), TrainingJob(2048, 1024)
    pure_dp = search(model, job, cluster, options=SpaceOptions(fixed={**TED_OPTIONS, "tp": 1, "ep": 1}), top=1)
    assert pure_dp.best is None
    best = search(model, job, cluster, options=SpaceOptions(fixed=TED_OPTIONS), top=1).best
    assert best.plan.tp > 1 and best.plan.ep > 1 and best.plan.etp > 1


def test_einsum_dispatch_costs_gemms_quadratic_in_tokens():
    """DeepSpeed-MoE's MOELayer (microsoft/DeepSpeed deepspeed/moe/sharded_moe.py) dispatches with
    einsum("sec,sm->ecm") and combines with einsum("sec,ecm->sm"): 2·S·(E·C)·h FLOPs each with
    E·C = S·top_k·factor, so doubling the micro-batch quadruples the term; permute dispatch has none."""
    import dataclasses
    from paraplan.costmodels.moe import moe_einsum_dispatch_times
    cluster, job = load_cluster("dgx2-v100", 128), TrainingJob(2048, 1024)
    ted = load_model("ted-6.7b-16e")
    curves = analytical_curves(cluster.accelerator)
    f1, b1 = moe_einsum_dispatch_times(ted, job, Plan(tp=2, dp=64, ep=8, micro_batch=4, dtype="fp16"), curves)
    f2, b2 = moe_einsum_dispatch_times(ted, job, Plan(tp=2, dp=64, ep=8, micro_batch=8, dtype="fp16"), curves)
    assert 3.5 < f2 / f1 < 4.1 and b1 > f1
    S = 4 * 2048
    gemm_flops = 2 * 2 * S * S * ted.hidden          # dispatch + combine, top-1, factor 1
    assert f1 >= gemm_flops / cluster.accelerator.peak("fp16")
    permute = dataclasses.replace(ted, moe=dataclasses.replace(ted.moe, dispatch="permute"))
    assert moe_einsum_dispatch_times(permute, job, Plan(tp=2, dp=64, ep=8, micro_batch=4, dtype="fp16"), curves) == (0.0, 0.0)


@pytest.mark.xfail(strict=True, reason=(
    "not reproduced: the best TED layout on 128 V100-32GB of DGX-2 (seq 2048, batch 1024) is predicted at 43% of "
    "V100 fp16 peak (58% before V100's unfused attention and DeepSpeed-MoE's einsum dispatch were modelled; "
    "34% on DGX-1 V100-16GB nodes). What is still unknown: the paper's cluster, batch/sequence configuration and "
    "FLOP convention; only its abstract and introduction were reachable (ar5iv.labs.arxiv.org/html/2303.06318)"))
def test_ted_utilization_in_the_papers_band():
    """Singh et al. 2023 report 20-27% of V100 peak for the 40B MoE (6.7B base, 16 experts) on 128 V100s;
    this checks the planner's best ZeRO-1, no-pipeline layout's model-FLOP utilization (active parameters,
    no recomputation counted) against that band."""
    cluster, model, job = load_cluster("dgx2-v100", 128), load_model("ted-6.7b-16e"), TrainingJob(2048, 1024)
    best = search(model, job, cluster, options=SpaceOptions(fixed=TED_OPTIONS), top=1).best
    assert 0.20 <= best.mfu <= 0.27


# --- DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509) and ring attention -------------------
def test_ulysses_volume_per_gpu_is_constant_when_sequence_and_gpus_grow_together():
    """§3: all-to-all volume per link is 4Nh/P; with N and P scaled together it stays constant."""
    model = load_model("llama2-7b")
    cluster = load_cluster("dgx-h100", 64)
    bytes_per_gpu = []
    for p in (2, 4, 8):
        job = TrainingJob(16384 * p, 8)
        plan = Plan(cp=p, cp_mode="ulysses")
        tokens = plan.micro_batch * job.seq_len / p
        bytes_per_gpu.append(tokens * (2 * model.hidden + 2 * model.kv_hidden) * 2)
        assert float(ulysses_alltoall_time(model, job, plan, cluster)) > 0
    assert bytes_per_gpu[0] == bytes_per_gpu[1] == bytes_per_gpu[2]


def test_ring_attention_hides_communication_only_above_a_block_size():
    """Liu et al. 2023 (Ring Attention): a block's attention compute must outlast passing K/V on; with our
    curves the forward condition (cp−1)·t_kv(c) ≤ t_attn(c) gives c* = 2·(cp−1)/cp·(h_kv/h)·F/B tokens
    per rank (F achieved attention FLOP/s, B the link's achieved bandwidth). Below c* the ring is exposed,
    above it hidden, all but the last backward step's dK/dV chunk, which returns to its owner after the
    last attention kernel (Transformer Engine waits for it; cpcomm._ring_exposed)."""
    from paraplan.costmodels.attention import attention_core_times
    from paraplan.costmodels.cpcomm import cp_exposed_time, ring_attention_step_time
    model = load_model("llama2-7b")
    cluster = load_cluster("dgx-h100", 64)        # cp over 8 GPUs of one node, NVLink
    curves = analytical_curves(cluster.accelerator)
    cp = 8
    F = cluster.accelerator.peak("bf16") * curves.flash_attention_efficiency
    B = cluster.system.intra_node.effective_bandwidth_bytes_per_s
    c_star = 2 * (cp - 1) / cp * (model.kv_hidden / model.hidden) * F / B
    exposed, last_step = {}, {}
    for factor in (0.25, 4.0):
        s_local = int(c_star * factor) // 64 * 64 or 64
        job = TrainingJob(s_local * cp, 8)
        plan = Plan(cp=cp)
        f, b = attention_core_times(model, job, plan, curves)
        exposed[factor] = float(cp_exposed_time(model, job, plan, cluster, f, b))
        last_step[factor] = float(ring_attention_step_time(model, job, plan, cluster))
    assert exposed[0.25] > 2 * last_step[0.25] and exposed[4.0] == pytest.approx(last_step[4.0])


# --- 1-bit Adam (Tang et al. 2021, arXiv:2102.02888) -------------------------------------------------
def test_one_bit_adam_cuts_compressed_phase_volume_at_least_5x():
    """Abstract: "up to 5x less communication volume"; its compressed phase sends 1 bit per element."""
    cluster = load_cluster("a100-eth40", 64)
    plan_adam, plan_1bit = Plan(dp=64), Plan(dp=64, optimizer="onebit-adam")
    args = (cluster, 8, 0.0, 0.0)
    _, full = dp_exposed_time(1.7e9, plan_adam, *args)
    _, compressed = dp_exposed_time(1.7e9, plan_1bit, *args, volume_factor=1 / 16)
    assert float(compressed) <= float(full) / 5


def test_planner_prefers_compressed_adam_on_ethernet_not_on_infiniband():
    """§5: 1-bit Adam's 3.3x speed-up is on the 40 Gb/s Ethernet cluster; on InfiniBand the plain
    all-reduce hides under backward and the compression work only costs."""
    model, job = load_model("gpt-1.7b"), TrainingJob(2048, 512)
    opts = SpaceOptions(allow_offload=False)
    eth = search(model, job, load_cluster("a100-eth40", 64), options=opts, top=1).best
    ib = search(model, job, load_cluster("dgx-a100-80g", 64), options=opts, top=1).best
    assert eth.plan.optimizer != "adam"
    assert ib.plan.optimizer == "adam"
    assert eth.details["step_time_compressed_s"] < eth.details["step_time_warmup_s"]


# --- DeepSpeed-MoE (Rajbhandari et al. 2022, arXiv:2201.05596) ---------------------------------------
@pytest.mark.slow
def test_deepspeed_moe_processes_several_times_more_samples_than_the_dense_6_7b():
    """§4: 1.3B+MoE-128 matches the 6.7B dense model's quality at ~5x lower training cost. On 128 A100s
    we predict the MoE model's samples/s at 3.5x the dense model's (active parameters 1.3B vs 6.7B, less
    the all-to-all cost)."""
    cluster, job = load_cluster("dgx-a100-80g", 128), TrainingJob(2048, 512)
    dense = TransformerModel("gpt-6.7b", 32, 4096, 32, 50257, tied_embeddings=True, learned_positions=True,
                             max_positions=2048)
    d = search(dense, job, cluster, top=1).best
    m = search(load_model("ds-moe-1.3b-128"), job, cluster, top=1).best
    ratio = d.step_time_s / m.step_time_s
    assert 2.5 <= ratio <= 6, ratio
    assert m.time_breakdown_s["ep_comm"] > 0 and m.plan.ep > 1


def test_offload_moves_gradients_off_the_gpu_only_from_zero_2():
    """ZeRO-Offload builds on ZeRO-2 (Ren et al. 2021 §4): reduced gradient buckets stream to the host.
    ZeRO-1 accumulates whole 16-bit gradients on the GPU across micro-batches, so they stay there."""
    from paraplan.costmodels.memory import model_state_bytes
    psi = 1e9
    z1 = model_state_bytes(psi, Plan(dp=8, zero=1, offload="cpu"))
    z2 = model_state_bytes(psi, Plan(dp=8, zero=2, offload="cpu"))
    assert float(z1["gradients"]) == 2 * psi and float(z2["gradients"]) == 0
    assert float(z1["optimizer_states"]) == float(z2["optimizer_states"]) == 0


def test_delayed_update_is_opt_in_for_the_planner():
    """The one-step delayed update trains on one-step-stale weights (ZeRO-Offload §5 enables it after a
    warm-up): the planner considers it only when asked."""
    v100, job = load_cluster("dgx2-v100", 1), TrainingJob(1024, 16)
    default = search(GPT_10B, job, v100, options=SpaceOptions(fixed={"offload": "cpu"}), top=1).best
    allowed = search(GPT_10B, job, v100, options=SpaceOptions(fixed={"offload": "cpu"}, allow_delayed_update=True),
                     top=1).best
    assert not default.plan.delayed_update
    assert allowed.plan.delayed_update and allowed.step_time_s < default.step_time_s


def test_zero3_pays_each_collectives_latency_once_per_wrapped_unit():
    """ZeRO-3 gathers and reduces per wrapped unit (FSDP's per-block ``fully_shard``): u units move
    the same bytes as one message but pay 2 all-gathers' and 1 reduce-scatter's latency u times,
    (n - 1)·α each on one ring."""
    cluster = load_cluster("dgx-a100-80g", 8)
    plan = Plan(dp=8, zero=3, overlap_grad_reduce=False)
    args = (plan, cluster, 2, 0.0, 0.0)
    _, one = dp_exposed_time(1e9, *args)
    _, per_layer = dp_exposed_time(1e9, *args, units=33)
    intra, _ = cluster.links("dp")
    alpha_ag, _ = intra.alpha_beta("all_gather")
    alpha_rs, _ = intra.alpha_beta("reduce_scatter")
    extra = 2 * 32 * 7 * (2 * alpha_ag + alpha_rs)          # m = 2 micro-batches, 32 more units, n - 1 = 7
    assert float(per_layer) - float(one) == pytest.approx(extra, rel=1e-9)
    assert extra > 0
