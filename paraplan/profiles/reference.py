"""Kernel reference profiles of real GPUs (``reference/*.json``, written by benchmarks/gpu_kernels.py)
set against the analytical curves of their generation.

A reference profile holds GEMMs by shape and layout (bf16, fp8 per-tensor and row-wise scaled),
causal attention by backend and sequence length, memory-bound kernels, AdamW, and whole transformer
layers (the per-rank shard of a tensor-parallel layer, forward + backward, bf16 and fp8), each timed
on the device with CUDA events. The functions here compare those measurements with what
:mod:`paraplan.costmodels.compute` (with :mod:`~paraplan.costmodels.kernels`,
:mod:`~paraplan.costmodels.attention` and :mod:`~paraplan.costmodels.fp8`) predicts for the same
shapes, so a change to a generation's curves shows at once how far it moves from the measured kernels
(``benchmarks/gpu_reference_check.py`` prints the tables; tests/profiles/test_gpu_reference.py holds the bounds).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from paraplan.costmodels import compute as C
from paraplan.costmodels.attention import attention_core_times
from paraplan.costmodels.efficiency import analytical_curves, isolated_kernel_curves
from paraplan.costmodels.fp8 import fp8_cast_times
from paraplan.costmodels.kernels import attention_gemm_forward_time, mlp_gemm_forward_time
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster, load_part
from paraplan.plan import Plan
from paraplan.workloads.transformer import TrainingJob, TransformerModel

REFERENCE_DIR = Path(__file__).parent / "reference"
#: the system preset whose accelerator each reference profile measured
SYSTEM_OF = {"h100-sxm": "dgx-h100"}


@functools.lru_cache(maxsize=4)
def load_reference(name: str = "h100-sxm") -> dict:
    path = REFERENCE_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in REFERENCE_DIR.glob("*.json")))
        raise ConfigError("reference", f"no kernel reference profile {name!r}", accepted=known)
    return json.loads(path.read_text())


def load_accelerator(name: str):
    return load_part("accelerators", name)


def curves_of(name: str):
    """The generation's curves at the rate isolated kernels reach (what a reference profile measured),
    not the rate a training step sustains (:func:`~paraplan.costmodels.efficiency.isolated_kernel_curves`)."""
    return isolated_kernel_curves(analytical_curves(load_accelerator(name)))


def gemm_ratios(name: str = "h100-sxm") -> list[dict]:
    """Every measured bf16 GEMM with the curves' time for it (dgrad ``dy W`` is an (m, k, n) GEMM,
    wgrad ``dyᵀ x`` an (n, k, m) one): ``ratio`` = measured / predicted."""
    ref, cv = load_reference(name), curves_of(name)
    out = []
    for r in ref["sections"]["gemm"]:
        m, n, k = r["m"], r["n"], r["k"]
        shape = {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}[r["layout"]]
        pred = float(cv.gemm_time(*shape, "bf16"))
        out.append({**r, "gflop": 2e-9 * m * n * k, "predicted_s": pred, "ratio": r["time_s"] / pred})
    return out


def fp8_gemm_ratios(name: str = "h100-sxm") -> list[dict]:
    """Every measured fp8 GEMM (forward layout) with the curves' per-tensor-scaled fp8 time."""
    ref, cv = load_reference(name), curves_of(name)
    out = []
    for r in ref["sections"].get("gemm_fp8", []):
        if "time_s" not in r:
            continue
        pred = float(cv.gemm_time(r["m"], r["n"], r["k"], "fp8"))
        out.append({**r, "gflop": 2e-9 * r["m"] * r["n"] * r["k"], "predicted_s": pred, "ratio": r["time_s"] / pred})
    return out


def measured_rowwise_efficiency(name: str = "h100-sxm", min_gflop: float = 100.0) -> float:
    """Median over GEMMs of at least ``min_gflop`` of (per-tensor time / row-wise time): the share of
    the per-tensor-scaled fp8 rate that row-wise scaling keeps."""
    rows = fp8_gemm_ratios(name)
    key = lambda r: (r["layer"], r["tp"], r["gemm"], r["m"])
    tensor = {key(r): r["time_s"] for r in rows if r["recipe"] == "tensorwise" and r["gflop"] >= min_gflop}
    ratios = [tensor[key(r)] / r["time_s"] for r in rows if r["recipe"] == "rowwise" and key(r) in tensor]
    return float(np.median(ratios))


def layer_model(r: dict) -> tuple[TransformerModel, TrainingJob]:
    """The whole model a measured layer shard belongs to (one layer; heads and widths times tp)."""
    tp, llama = r["tp"], r["norm"] == "rms"
    model = TransformerModel(name=r["label"], layers=1, hidden=r["hidden"], heads=r["heads"] * tp,
                             kv_heads=r["kv_heads"] * tp, vocab=32000, ffn_hidden=r["ffn"] * tp,
                             activation=r["act"], norm="rmsnorm" if llama else "layernorm", bias=False,
                             rotary=llama, dropout=False)
    return model, TrainingJob(seq_len=r["seq"], global_batch=r["batch"])


def predicted_layer(r: dict, name: str = "h100-sxm", dtype: str = "bf16", kernel: str = "auto") -> dict:
    """The estimator's forward + backward of one measured layer shard (no communication), by term:
    GEMMs, attention core, memory-bound kernels, fp8 casts."""
    cluster = load_cluster(SYSTEM_OF[name], 8)
    cv = isolated_kernel_curves(analytical_curves(cluster.accelerator))
    model, job = layer_model(r)
    plan = Plan(tp=r["tp"], dp=1, micro_batch=r["batch"], dtype=dtype, attention_kernel=kernel)
    lt = C.layer_times(model, job, plan, cv, cluster)
    gemm = 3 * float(attention_gemm_forward_time(model, job, plan, cv) + mlp_gemm_forward_time(model, job, plan, cv))
    attn = sum(float(x) for x in attention_core_times(model, job, plan, cv))
    cast = sum(float(x) for x in fp8_cast_times(model, job, plan, cv))
    total = float(lt["forward"] + lt["backward"])
    return {"total_s": total, "gemm_s": gemm, "attention_s": attn, "cast_s": cast,
            "elementwise_s": total - gemm - attn - cast}


#: the reference's whole-layer sections and the attention kernel each ran (torch 2.11's SDPA chose
#: cuDNN on the H100 for ``layers``; the other two pinned their kernel)
LAYER_SECTIONS = {"layers": "cudnn", "layers_flash2": "flash2", "layers_efficient": "efficient"}


def layer_comparison(name: str = "h100-sxm", section: str = "layers", kernel: str = "auto") -> list[dict]:
    """Measured against predicted per layer of one whole-layer section, the plan naming ``kernel``
    (``auto``: the generation's calibrated attention): bf16 (kernel classes from torch.profiler) and,
    where measured, fp8 with Transformer Engine-style cast-transpose kernels."""
    ref = load_reference(name)
    fp8 = {r["label"]: r for r in ref["sections"].get("layers_fp8", [])} if section == "layers" else {}
    out = []
    for r in ref["sections"][section]:
        p = predicted_layer(r, name, kernel=kernel)
        classes = r.get("device_time_by_class_s", {})
        row = {"label": r["label"], "measured_s": r["fwd_bwd_s"], "predicted_s": p["total_s"],
               "error": p["total_s"] / r["fwd_bwd_s"] - 1,
               "gemm_measured_s": classes.get("gemm"), "gemm_predicted_s": p["gemm_s"],
               "attention_measured_s": classes.get("attention"), "attention_predicted_s": p["attention_s"],
               "other_measured_s": classes.get("other"), "other_predicted_s": p["elementwise_s"]}
        f = fp8.get(r["label"])
        if f and "fp8_cast_transpose_fwd_bwd_s" in f:
            q = predicted_layer(r, name, "fp8", kernel=kernel)
            row.update(fp8_measured_s=f["fp8_cast_transpose_fwd_bwd_s"], fp8_predicted_s=q["total_s"],
                       fp8_error=q["total_s"] / f["fp8_cast_transpose_fwd_bwd_s"] - 1,
                       fp8_speedup_measured=f["bf16_fwd_bwd_s"] / f["fp8_cast_transpose_fwd_bwd_s"],
                       fp8_speedup_predicted=p["total_s"] / q["total_s"],
                       cast_measured_s=(f["fp8_cast_transpose_device_time_by_class_s"]["other"]
                                        - f["bf16_device_time_by_class_s"]["other"]),
                       cast_predicted_s=q["cast_s"])
        out.append(row)
    return out


def attention_efficiency(name: str = "h100-sxm") -> list[dict]:
    """Measured causal attention forward + backward FLOP rate over the dense bf16 peak, per backend,
    sequence length, heads and head dim (3.5 x the forward FLOPs, the estimator's convention)."""
    ref = load_reference(name)
    peak = load_accelerator(name).peak("bf16")
    return [{k: r[k] for k in ("backend", "batch", "heads", "seq", "head_dim")} |
            {"efficiency": r["fwd_bwd_tflops"] * 1e12 / peak}
            for r in ref["sections"]["attention"] if "fwd_bwd_tflops" in r]
