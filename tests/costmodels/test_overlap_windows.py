"""Streams that hide under the same compute window share it.

A planner exploits its cost model's kinks: if two overlapped streams each claimed a micro-batch's
whole compute, a faster GPU (a shorter window) would expose both and could lengthen the step. Here
the offload parameter fetch hides under the micro-batch's whole wall time (its exposed ZeRO-3
collectives included), and a stage's dense and expert reductions hide under one shared window, so
doubling the GPU's peak never lengthens such a step."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels.dataparallel import (DP_WINDOWS, OVERLAP_CONTENTION, add_traffic, dp_exposed,
                                              hidden_under)
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate, step_terms
from paraplan.plan import Plan
from paraplan.planner.space import SpaceOptions, compose
from paraplan.scenario import load_scenario


def _twice_the_flops(cluster):
    acc = cluster.accelerator
    return cluster.with_system(accelerator=replace(acc, peak_flops={k: 2 * v for k, v in acc.peak_flops.items()}))


def _slow_and_fast(sc, plan):
    """The plan's estimate on the scenario's cluster and on one with twice its FLOP rate."""
    return (estimate(sc.model, sc.job(plan), sc.cluster, plan),
            estimate(sc.model, sc.job(plan), _twice_the_flops(sc.cluster), plan))


def _compute_saved(slow, fast):
    """Compute and recomputation seconds the faster GPU saves."""
    s, f = slow.time_breakdown_s, fast.time_breakdown_s
    return (s["compute"] + s["recompute"]) - (f["compute"] + f["recompute"])


def _steps(scenario, cluster, batch):
    job = scenario.job()
    return np.asarray(step_terms(scenario.model, job, cluster, batch, curves_for(cluster)).step, dtype=float)


@pytest.mark.parametrize("model, system, gpus, seq, batch_size", [
    ("llama3-70b", "dgx-h100", 64, 8192, 512),
    ("gpt3-175b", "dgx-a100-80g", 256, 2048, 1536),
])
def test_twice_the_flops_never_slows_a_zero3_offload_plan(model, system, gpus, seq, batch_size):
    """Every legal ZeRO-3 plan that fetches offloaded parameters (a sample of 4,000), with the GPU's
    peak doubled: no step gets longer by more than 0.1 %. When the fetch hid under the bare compute
    while the exposed ZeRO-3 collectives did too, such plans got up to 19 % slower."""
    sc = load_scenario(model, system, gpus=gpus, seq_len=seq, global_batch=batch_size)
    # the engine switches searched (TP overlap among them): test_tp_overlap_and_zero3_gathers_share_one_window
    candidates, _, _ = compose(sc.model, sc.job(), sc.cluster, SpaceOptions())
    fetching = np.flatnonzero((np.asarray(candidates.zero) == 3) & np.asarray(candidates.offload_params, dtype=bool))
    assert fetching.size > 1000
    pick = np.sort(np.random.default_rng(7).choice(fetching, size=min(4000, fetching.size), replace=False))
    batch = candidates.take(pick)
    ratio = _steps(sc, _twice_the_flops(sc.cluster), batch) / _steps(sc, sc.cluster, batch)
    worst = int(np.argmax(ratio))
    assert ratio[worst] <= 1.001, (ratio[worst], batch.plan(worst))
    assert np.median(ratio) < 0.9          # and the faster GPU does help most of them


def test_tp_overlap_and_zero3_gathers_share_one_window():
    """Llama 3 70B on 64 H100, ZeRO-3 with CPU-offloaded parameters and full recomputation: with twice the peak,
    compute and recomputation save ~33.5 s while exposed TP communication grows. When the ZeRO-3 gathers hid
    under the compute alone, as the TP collectives did, the data-parallel term grew with them: tp16 cp2 with TP
    overlap went 165.5 -> 184.6 s. TP overlap across two nodes is illegal now (rule
    tp-comm-overlap-within-nvlink), so the overlapped case is tp8 cp8 (592.4 -> 587.4 s before the fix,
    585.9 -> 580.7 s after); tp16 cp2 without overlap, its group holding the inter-node links, 218.3 -> 212.0 s."""
    sc = load_scenario("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=512)
    for tp, cp, dp, overlap in ((8, 8, 1, True), (16, 2, 2, False)):
        plan = Plan(tp=tp, pp=1, dp=dp, cp=cp, sp=True, micro_batch=1, zero=3, recompute="full", offload="cpu",
                    offload_params=True, tp_comm_overlap=overlap)
        slow, fast = _slow_and_fast(sc, plan)
        s, f = slow.time_breakdown_s, fast.time_breakdown_s
        saved = _compute_saved(slow, fast)
        exposed_more = (f["tp_comm"] + f["dp_comm"]) - (s["tp_comm"] + s["dp_comm"])
        assert saved > 30.0
        assert exposed_more <= saved
        assert fast.step_time_s <= slow.step_time_s * 1.001
        if overlap:
            assert f["tp_comm"] > s["tp_comm"] + 1.0     # the faster GPU exposes more TP communication


def test_exposed_tp_time_is_part_of_the_data_parallel_window():
    """tp8 inside a node, data parallelism across nodes: the gathers run on the inter-node links while the
    compute waits for NVLink, so the exposed TP time widens their window (the plan without TP overlap gains
    most); the tp16 group across two nodes holds those links, and tp2 with its data-parallel group inside one
    node shares NVLink with it, so the TP collectives' whole duration leaves the window: with TP overlap it is
    narrower than the compute alone."""
    from paraplan.costmodels import compute as C
    from paraplan.costmodels.tpcomm import tp_data_parallel_window_times, tp_exposed_by_pass, tp_exposed_time
    sc = load_scenario("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=512)
    curves = curves_for(sc.cluster)
    window = {}
    for tp, dp in ((8, 4), (16, 2)):
        for overlap in (True, False):
            plan = Plan(tp=tp, pp=1, dp=dp, cp=2, sp=True, micro_batch=1, zero=3, recompute="full",
                        tp_comm_overlap=overlap)
            lt = C.layer_times(sc.model, sc.job(plan), plan, curves, sc.cluster)
            window[tp, overlap] = (float(lt["tp_dp_window_forward"]), float(lt["tp_dp_window_backward"]))
    assert all(w > 0 for w in window[8, True] + window[8, False])
    assert sum(window[8, False]) > sum(window[8, True])
    assert all(w < 0 for w in window[16, True])
    sc8 = load_scenario("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=64)
    inside = Plan(tp=2, pp=1, dp=4, sp=True, zero=3, tp_comm_overlap=True)
    lt = C.layer_times(sc8.model, sc8.job(inside), inside, curves_for(sc8.cluster), sc8.cluster)
    assert lt["tp_dp_window_forward"] < 0 and lt["tp_dp_window_backward"] < 0
    # the split by pass sums to the exposed time, and a pass's share follows its GEMMs
    plan = Plan(tp=8, pp=1, dp=8, sp=True, tp_comm_overlap=True)
    comm, gemm = np.array([1.0, 3.0, 6.0]), np.array([1.0, 1.0, 1.0])
    f, b = tp_exposed_by_pass(comm, gemm, np.array([False, False, True]), plan)
    assert np.allclose(f + b, tp_exposed_time(comm, gemm, np.array([False, False, True]), plan))
    assert np.allclose(f, (f + b) / np.array([3, 3, 4]))
    gain = tp_data_parallel_window_times((f, b), (comm / 2, comm / 2), np.array([False, True, True]))
    assert gain[0][0] == f[0] and gain[0][1] == pytest.approx(f[1] - 1.5)


def test_fetch_hides_under_the_exposed_zero3_collectives():
    """One plan whose ZeRO-3 gathers outlast its compute on the faster GPU: what the faster GPU
    exposes more of (gathers and offload together) is no more than the compute it saves; before, the
    step went from 110.1 s to 131.2 s."""
    sc = load_scenario("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=512)
    plan = Plan(tp=1, pp=2, dp=4, cp=8, micro_batch=2, schedule="gpipe", zero=3, recompute="full",
                offload="nvme", offload_params=True, cp_mode="ulysses")
    slow, fast = _slow_and_fast(sc, plan)
    s, f = slow.time_breakdown_s, fast.time_breakdown_s
    saved = _compute_saved(slow, fast)
    exposed_more = (f["dp_comm"] + f["offload"]) - (s["dp_comm"] + s["offload"])
    assert saved > 20.0
    assert f["dp_comm"] > s["dp_comm"]            # the gathers no longer hide under the shorter compute
    assert exposed_more <= saved * (1 + 1e-9)    # equal here: the fetch paces every micro-batch
    assert fast.step_time_s <= slow.step_time_s * 1.001


def test_dense_and_expert_reductions_share_one_window():
    """Two reductions under one backward: hidden together, the excess over the window is exposed
    once; hidden one by one, each would claim the whole window."""
    zero = {key: 0.0 for key in DP_WINDOWS}
    dense = dict(zero, last_backward=3.0)
    expert = dict(zero, last_backward=2.0)
    plan = Plan(tp=1, pp=1, dp=8, zero=1)
    window = 4.0
    together, total = dp_exposed(add_traffic(dense, expert), plan, 1, 1.0, window)
    apart = dp_exposed(dense, plan, 1, 1.0, window)[0] + dp_exposed(expert, plan, 1, 1.0, window)[0]
    assert total == pytest.approx(5.0)
    assert together == pytest.approx((5.0 - window) + OVERLAP_CONTENTION * window)
    assert together == pytest.approx(hidden_under(5.0, window))
    assert apart == pytest.approx(OVERLAP_CONTENTION * 5.0)
    assert together > apart
    no_overlap = replace(plan, overlap_grad_reduce=False)
    assert dp_exposed(add_traffic(dense, expert), no_overlap, 1, 1.0, window)[0] == pytest.approx(5.0)


def test_ring_exchange_across_nodes_holds_the_links_the_gathers_need():
    """A ring-attention exchange between nodes, hidden under the attention core, keeps the
    data-parallel collectives on the same links from hiding there too; a ring inside one node
    (tp 2 x cp 4 on 8 GPUs) or Ulysses holds none. With it, twice the HBM bandwidth (a shorter
    attention core) no longer lengthens the plan that was 0.46 % slower before."""
    from paraplan.costmodels import compute as C
    from paraplan.costmodels.efficiency import curves_for as curves_of
    sc = load_scenario("llama3-70b", "dgx-h100", gpus=64, seq_len=8192, global_batch=512)
    curves = curves_of(sc.cluster)
    across = Plan(tp=4, pp=2, dp=1, cp=8, vpp=2, micro_batch=4, sp=True, schedule="interleaved", zero=3,
                  offload="nvme")
    inside = Plan(tp=2, pp=8, dp=1, cp=4, micro_batch=1, sp=True, zero=1)
    ulysses = replace(across, cp_mode="ulysses")
    held = {}
    for name, plan in (("across", across), ("inside", inside), ("ulysses", ulysses)):
        lt = C.layer_times(sc.model, sc.job(plan), plan, curves, sc.cluster)
        held[name] = (float(lt["cp_hidden_forward"]), float(lt["cp_hidden_backward"]))
    assert held["across"][0] > 0 and held["across"][1] > held["across"][0]
    assert held["inside"] == (0.0, 0.0) and held["ulysses"] == (0.0, 0.0)
    acc = sc.cluster.accelerator
    faster_hbm = sc.cluster.with_system(accelerator=replace(
        acc, memory_bandwidth_bytes_per_s=2 * acc.memory_bandwidth_bytes_per_s))
    slow = estimate(sc.model, sc.job(across), sc.cluster, across)
    fast = estimate(sc.model, sc.job(across), faster_hbm, across)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-9)


def test_host_bound_moe_layer_waits_for_the_host_whatever_the_gpu_does():
    """Megatron's dropless MoE layer costs at least the host's time to issue it
    (moe.MOE_HOST_SECONDS_PER_LAYER). That floor covers the layer's whole GPU time, its exposed
    ring-attention exchange included, and while the GPU waits the data-parallel reduction runs: a GPU
    with twice the FLOP rate no longer lengthens such a step (before: +3.2 % for this layout at
    micro-batch 4, the ring exchange growing outside the floor; at micro-batch 4 the layer's GPU time has
    exceeded the floor since the experts' fp32 gradient accumulation is priced, so micro-batch 2 here)."""
    sc = load_scenario("mixtral-8x7b", "dgx-h100", gpus=32, seq_len=4096, global_batch=256)
    plan = Plan(tp=4, pp=1, dp=2, cp=4, micro_batch=2, sp=True, zero=1, recompute="full", ep=2, engine="megatron")
    slow, fast = _slow_and_fast(sc, plan)
    assert slow.time_breakdown_s["moe_host"] > 0          # host-bound on the H100 already
    assert fast.time_breakdown_s["moe_host"] > slow.time_breakdown_s["moe_host"]
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-9)
