"""Long sequences (issue 64, regime 1): the estimate's terms for Llama 3 8B / 70B at 32k-128k tokens on
DGX H100 under ring context parallelism, beside two checks that do not use any end-to-end throughput.

1. The attention core against measurement: paraplan's per-layer forward + backward time of a Llama 3 8B
   layer (tp 1, batch 1) at 8k and 32k tokens against the same layer measured on an H100 80GB SXM
   (paraplan/profiles/reference/h100-sxm.json, section 'layers': benchmarks/gpu_kernels.py, torch 2.11,
   cuDNN 9.19 attention). Within a few percent at both lengths: the attention kernel's efficiency at long
   length is not what makes long-sequence runs look 40-140 % slower than predicted.
2. What a published TFLOP/s or MFU figure becomes under the two counts of causal attention: F_whole /
   F_halved (paraplan/data/flop_conventions.yaml). A source that counts causal attention halved
   (Megatron-Bridge; MaxText since July 2025) read with paraplan's whole count looks that much slower than
   it ran: 1.36x at 32k, 1.70x at 128k for Llama 3 8B, independent of cp.

Each plan row: step time, its terms (compute, recompute, tp / cp comm, dp exposed), the attention core
per layer and micro-batch (forward + backward, the measured cuDNN efficiency at the rank's s/cp queries),
ring attention's merge kernels and exposed K/V exchange per layer, MFU under both counts.

    python benchmarks/long_sequence_terms.py
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paraplan.costmodels.attention import attention_core_times, measured_attention_efficiency, ring_attention_merge_times
from paraplan.costmodels.cpcomm import cp_exposed_time
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import tokens_per_rank
from paraplan.costmodels.compute import layer_times
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, PlanBatch
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

PROFILE = Path(__file__).resolve().parents[1] / "paraplan" / "profiles" / "reference" / "h100-sxm.json"
PLANS = [("llama3-8b", 1, 128), ("llama3-70b", 8, 256)]          # (model, tp, GPUs)
SEQS = (32768, 65536, 131072)
CPS = (1, 2, 4, 8, 16)


def layer_check() -> list[dict]:
    """Predicted against measured forward + backward seconds of one Llama 3 8B layer (tp 1, batch 1)."""
    measured = {x["seq"]: x for x in json.loads(PROFILE.read_text())["sections"]["layers"]
                if x["label"].startswith("llama3-8b tp1")}
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 8)
    curves = curves_for(cluster)
    rows = []
    for seq, m in sorted(measured.items()):
        plan = PlanBatch.from_plans([Plan(dp=8, engine="torchtitan", micro_batch=1)])
        t = layer_times(model, TrainingJob(seq, 8), plan, curves, cluster)
        predicted = float(np.ravel(t["forward"] + t["backward"])[0])
        f, b = attention_core_times(model, TrainingJob(seq, 8), plan, curves)
        rows.append({"seq": seq, "measured_ms": m["fwd_bwd_s"] * 1e3, "predicted_ms": predicted * 1e3,
                     "error_%": 100 * (predicted / m["fwd_bwd_s"] - 1),
                     "attention_measured_ms": m["device_time_by_class_s"]["attention"] * 1e3,
                     "attention_predicted_ms": float(np.ravel(f + b)[0]) * 1e3})
    return rows


def plan_rows() -> list[dict]:
    rows = []
    for name, tp, gpus in PLANS:
        model = load_model(name)
        for seq in SEQS:
            ratio = model.model_flops_per_token(seq) / model.model_flops_per_token(seq, True)
            for cp in CPS:
                cluster = load_cluster("dgx-h100", gpus)
                try:
                    plan = Plan(tp=tp, cp=cp, dp=gpus // (tp * cp), sp=tp > 1, engine="megatron", zero=1,
                                recompute="full", micro_batch=1)
                    job = TrainingJob(seq, plan.dp * 4)
                    e = estimate(model, job, cluster, plan)
                except ConfigError as err:
                    rows.append({"model": name, "seq": seq, "tp": tp, "cp": cp, "note": str(err)[:60]})
                    continue
                curves = curves_for(cluster)
                batch = PlanBatch.from_plans([plan])
                f, b = attention_core_times(model, job, batch, curves)
                mf, mb = ring_attention_merge_times(model, job, batch, curves)
                cpx = cp_exposed_time(model, job, batch, cluster, f, b)
                s_l = float(np.ravel(tokens_per_rank(job, batch))[0])
                eff = measured_attention_efficiency(model, batch, curves, s_l, model.heads / tp)
                t = e.time_breakdown_s
                rows.append({
                    "model": name, "seq": seq, "tp": tp, "cp": cp, "fits": bool(e.feasible),
                    "step_s": e.step_time_s, "compute_s": t["compute"], "recompute_s": t["recompute"],
                    "tp_s": t["tp_comm"], "cp_s": t["cp_comm"], "dp_s": t["dp_comm"],
                    "attn_ms/layer": 1e3 * float(np.ravel(f + b)[0]), "attn_eff": float(np.ravel(eff)[0]),
                    "merge_ms": 1e3 * float(np.ravel(mf + mb)[0]), "cp_exp_ms": 1e3 * float(np.ravel(cpx)[0]),
                    "mfu_whole": e.mfu, "mfu_halved": e.mfu / ratio, "whole/halved": ratio})
    return rows


def _print(rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print("  ".join(f"{k:>12}" for k in keys))
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k, "")
            cells.append(f"{v:>12.4g}" if isinstance(v, float) else f"{str(v):>12}")
        print("  ".join(cells))


def main() -> int:
    print("1. one Llama 3 8B layer (tp 1, batch 1), forward + backward, against the H100 reference profile")
    _print(layer_check())
    print("\n2. long-sequence plans on DGX H100 (megatron, ZeRO-1, full recompute, micro-batch 1, ring cp; 8B on 128 GPUs, 70B on 256)")
    _print(plan_rows())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
