"""Regimes 3 and 4 of issue 64: which calibration rows reach them, the terms of their estimates, and the
kernel and collective checks behind those terms (none of them an end-to-end throughput).

Regime 3, fine-grained MoE with expert parallelism across nodes. Printed:
  * the calibration rows whose expert-parallel group spans nodes (benchmarks/loso.py's predicate) with their
    terms, and for each the estimate with the EP all-to-all overlap and the DeepEP dispatch switched off, and
    under a trained router's imbalance (the rows ran with Megatron-Bridge's router forced to balance);
  * the routed experts' grouped GEMMs against the H100 measurements of paraplan/profiles/reference/h100-sxm.json
    (section 'moe': DeepSeek-V3, Mixtral, Qwen3-30B-A3B expert shapes, 128-8192 tokens per expert);
  * the DeepEP dispatch priced by moe.flex_dispatch_time against DeepEP's published normal-kernel table
    (deepseek-ai/DeepEP docs/legacy.md, "Normal kernels with NVLink and RDMA forwarding": H800, CX7 400 Gb/s,
    4096 tokens, hidden 7168, top-4 groups, top-8 experts): bottleneck RDMA bandwidth 43 / 58 / 51 GB/s at
    EP 16 / 32 / 64, the logical bytes a GPU sends to other nodes over the time;
  * NCCL's all-to-all across nodes priced by comm.collective_time against one nccl-tests point (NVIDIA/nccl
    issue 1531: alltoall_perf, 64 H800 on 8 nodes, 8 MiB per rank: 337.8 us out of place, 295.6 us in place).
Regime 4, very large jobs with deep pipelines over FSDP: no calibration row has 8k GPUs or more; printed are
the terms of Llama 3 405B's published layout (tp 8, pp 16, dp 64 / 128 on 8,192 / 16,384 H100 at 8k: the
Llama 3 paper's Table 4 layout; its throughput is not used here) per engine, ZeRO stage and interleaving
depth, where the FSDP-under-pipeline pricing (dataparallel.fsdp_syncs_once_per_step) and the bubble show.

    python benchmarks/regime_terms.py          # about 30 s on 2 busy cores
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.calibration import load_h100_cases
from paraplan.costmodels.comm import ALL_TO_ALL, collective_time
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import TIME_TERMS, estimate
from paraplan.costmodels.moe import expert_holders_per_token, flex_dispatch_time
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

PROFILE = Path(__file__).resolve().parents[1] / "paraplan" / "profiles" / "reference" / "h100-sxm.json"
#: DeepEP V1 normal kernels, internode, H800 + CX7 (docs/legacy.md): EP -> (dispatch, combine) GB/s
DEEPEP_NORMAL_RDMA_GBPS = {16: (43, 43), 32: (58, 57), 64: (51, 50)}
#: NVIDIA/nccl issue 1531: alltoall_perf over 64 H800 (8 nodes), bytes per rank -> (out-of-place, in-place) s
NCCL_ALLTOALL_64_H800 = {8388608: (337.8e-6, 295.6e-6)}


def _terms(e) -> dict:
    return {k: round(float(e.time_breakdown_s[k]), 2) for k in TIME_TERMS if float(e.time_breakdown_s[k]) > 0.005}


def moe_rows() -> pd.DataFrame:
    """The calibration rows of regime 3 (expert-parallel group wider than a node) with their terms and two
    counterfactuals: the EP all-to-all overlap off, the DeepEP dispatch off; and the step time the same layout
    takes under a trained router (moe.routed_time_factor) over its forced-balance reading."""
    cases, _ = load_h100_cases()
    rows = []
    for c in cases:
        p = c.plan
        if c.model.moe is None or p.ep * max(p.etp, 1) <= c.cluster.gpus_per_node:
            continue
        e = estimate(c.model, c.job, c.cluster, p)
        row = {"row": c.row, "case": c.label[:58], "overlap": p.ep_comm_overlap, "deepep": p.moe_flex_dispatch,
               "measured_s": round(c.measured_step_time_s, 2), "predicted_s": round(e.step_time_s, 2),
               "error_%": round(100 * (c.measured_step_time_s / e.step_time_s - 1), 1), "terms": _terms(e)}
        for name, kw in (("no_overlap_%", {"ep_comm_overlap": False}), ("no_deepep_%", {"moe_flex_dispatch": False})):
            alt = estimate(c.model, c.job, c.cluster, replace(p, **kw))
            row[name] = round(100 * (c.measured_step_time_s / alt.step_time_s - 1), 1)
        # the same run under a trained router (the rows ran with the router forced to balance)
        learned = estimate(c.model, replace(c.job, moe_imbalance=None), c.cluster, p)
        row["trained_router_step_%"] = round(100 * (learned.step_time_s / e.step_time_s - 1), 1)
        rows.append(row)
    return pd.DataFrame(rows)


def grouped_gemm_check() -> pd.DataFrame:
    """Predicted against measured grouped-GEMM seconds of the routed experts on one H100 (bf16)."""
    curves = curves_for(load_cluster("dgx-h100", 8))
    rows = []
    for r in json.loads(PROFILE.read_text())["sections"]["moe"]:
        m, g, h, f = r["tokens_per_expert"], r["local_experts"], r["hidden"], r["ffn"]
        up = float(curves.grouped_gemm_time(m, 2 * f, h, g, "bf16"))
        down = float(curves.grouped_gemm_time(m, h, f, g, "bf16"))
        rows.append({"shape": r["label"], "experts": g, "tokens_per_expert": m,
                     "up_error_%": round(100 * (up / r["up_grouped_s"] - 1)),
                     "down_error_%": round(100 * (down / r["down_grouped_s"] - 1))})
    return pd.DataFrame(rows)


def deepep_check() -> pd.DataFrame:
    """The DeepEP dispatch of DeepEP's benchmark setting as paraplan prices it (one GPU's 4096 tokens, hidden
    7168, DeepSeek-V3's group-limited routing) on HGX H800, as the RDMA bandwidth DeepEP's table reports
    (logical bytes to other nodes over the dispatch time). paraplan adds the NVLink forwarding to the RDMA
    transfer in series where DeepEP pipelines them, and takes 0.9 of the NIC's 50 GB/s: it prices the
    dispatch at about half to two thirds of DeepEP's measured rate (pessimistic, not the optimism regime 3
    shows)."""
    model = load_model("deepseek-v3")
    rows = []
    for ep, (dispatch, combine) in DEEPEP_NORMAL_RDMA_GBPS.items():
        cluster = load_cluster("hgx-h800", max(ep, 8))
        plan = PlanBatch.from_plans([Plan(dp=ep, ep=ep, engine="megatron", dtype="fp8", micro_batch=1,
                                          moe_flex_dispatch=True)])
        job = TrainingJob(4096, ep)
        t = float(np.ravel(flex_dispatch_time(model, job, plan, cluster))[0])
        nodes, k_l = ep / 8, 8
        held = model.moe.experts * k_l / ep
        remote = float(np.ravel(expert_holders_per_token(model.moe, held))[0]) * (nodes - 1) / nodes
        # the bytes Megatron-Core's flex dispatcher sends (16-bit hidden states; DeepEP's table dispatched
        # fp8): a bandwidth, so comparable across element sizes at these megabyte transfers
        rdma_bytes = 4096 * model.hidden * 2.0 * remote
        rows.append({"ep": ep, "priced_GBps": round(rdma_bytes / t / 1e9, 1), "deepep_dispatch_GBps": dispatch,
                     "deepep_combine_GBps": combine, "remote_nodes_per_token": round(remote, 2)})
    return pd.DataFrame(rows)


def nccl_alltoall_check() -> pd.DataFrame:
    cluster = load_cluster("hgx-h800", 64)
    intra, inter = cluster.links("ep")
    rows = []
    for size, (oop, ip) in NCCL_ALLTOALL_64_H800.items():
        t = float(collective_time(ALL_TO_ALL, size, 64, 8, intra, inter))
        rows.append({"bytes_per_rank": size, "priced_us": round(t * 1e6), "measured_out_of_place_us": oop * 1e6,
                     "measured_in_place_us": ip * 1e6})
    return pd.DataFrame(rows)


def large_jobs() -> pd.DataFrame:
    """Llama 3 405B on 8,192 / 16,384 H100 in its published layout, per engine, ZeRO stage and virtual stages."""
    model = load_model("llama3-405b")
    rows = []
    for gpus, dp in ((8192, 64), (16384, 128)):
        cluster = load_cluster("dgx-h100", gpus)
        for engine, zero in (("megatron", 1), ("torchtitan", 2), ("torchtitan", 3), ("generic", 3)):
            for v in (1, 7):
                try:
                    plan = Plan(tp=8, pp=16, dp=dp, sp=True, vpp=v, schedule="interleaved" if v > 1 else "1f1b",
                                micro_batch=1, zero=zero, recompute="full", engine=engine)
                    e = estimate(model, TrainingJob(8192, 2048), cluster, plan)
                except ConfigError as err:
                    rows.append({"gpus": gpus, "engine": engine, "zero": zero, "vpp": v, "mfu_%": str(err)[:40]})
                    continue
                rows.append({"gpus": gpus, "engine": engine, "zero": zero, "vpp": v, "mfu_%": round(100 * e.mfu, 1),
                             "step_s": round(e.step_time_s, 2), "terms": _terms(e)})
    return pd.DataFrame(rows)


def main() -> None:
    with pd.option_context("display.width", 250, "display.max_colwidth", 140, "display.max_columns", 20):
        print("regime 3: calibration rows whose expert-parallel group spans nodes (error: measured/predicted - 1)")
        print(moe_rows().to_string(index=False))
        print("\nrouted experts' grouped GEMMs, predicted against measured on one H100 (bf16)")
        print(grouped_gemm_check().to_string(index=False))
        print("\nDeepEP normal dispatch across nodes (H800, CX7): priced RDMA bandwidth against DeepEP's table")
        print(deepep_check().to_string(index=False))
        print("\nNCCL all-to-all over 64 H800 (8 nodes) against nccl-tests")
        print(nccl_alltoall_check().to_string(index=False))
        print("\nregime 4: Llama 3 405B, tp 8 pp 16 at 8k tokens, 2048 sequences, full recomputation")
        print(large_jobs().to_string(index=False))


if __name__ == "__main__":
    main()
