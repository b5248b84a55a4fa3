"""Compare a parallel run with the single-process reference of the same model, seed and data.

Tolerances (fp32 throughout): the parallel layouts change only the order of floating-point
sums (row-parallel partial sums, sequence shards, micro-batch accumulation, dp averaging), so
losses agree to ~1e-6 relative; we accept ``LOSS_RTOL`` per step and ``GRAD_RTOL`` on the
first step's gradients, measured per tensor as max |g - g_ref| / max(max |g_ref|, floor), where
floor = ``GRAD_FLOOR`` times the largest reference gradient entry of the whole model (some
gradients are zero in exact arithmetic, e.g. the key bias, since softmax ignores a constant
shift, and are rounding noise in both runs).

A mixture of experts routes each token to its top-k experts, a discontinuous choice: once the
parameters have drifted apart by rounding, a token whose two best scores are within that drift can
go to another expert in one run than in the other, and the loss jumps by that token's share (on
the default validate model with 8 experts, dp2: ~1e-8 for nine steps, then 1.9e-6 at the tenth and
1.2e-5 by the thirteenth). Such runs are held to ``MOE_LOSS_RTOL`` per step; their first step, where
both start from the same parameters, keeps ``GRAD_RTOL``.
"""
from __future__ import annotations

import glob
import os

import torch

from paraplan.validation.model import GPTConfig
from paraplan.validation.worker import RunPlan, run_training

LOSS_RTOL = 1e-5
MOE_LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-4
GRAD_FLOOR = 1e-3


def reference_run(cfg: GPTConfig, plan: RunPlan, dump_grads: bool = True) -> dict:
    """Single-process run with the plan's batch, micro-batch, recompute and step count."""
    torch.manual_seed(cfg.seed)
    ref_plan = RunPlan(micro_batch=plan.micro_batch, global_batch=plan.global_batch,
                       recompute=plan.recompute, steps=plan.steps, warmup=plan.warmup,
                       lr=plan.lr, profile_ops=False)
    return run_training(cfg, ref_plan, None, "cpu", dump_grads)


def parallel_losses(results: list[dict]) -> list[float]:
    """Loss per step as reported by a last-stage rank."""
    for r in results:
        if r["is_last_stage"]:
            return r["losses"]
    raise ValueError("no last-stage rank in results")


def load_parallel_grads(out_dir: str) -> dict[str, torch.Tensor]:
    """Union of the first-step gradients dumped by each pipeline stage (tensors only:
    ``weights_only=True``, no pickled code runs)."""
    grads = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "grads_rank*.pt"))):
        grads.update(torch.load(path, weights_only=True))
    return grads


def loss_rtol_for(cfg: GPTConfig) -> float:
    """The per-step loss tolerance of a model: LOSS_RTOL, or MOE_LOSS_RTOL with routed experts."""
    return MOE_LOSS_RTOL if getattr(cfg, "experts", 0) else LOSS_RTOL


def compare_to_reference(results: list[dict], ref: dict, grads: dict | None = None,
                         loss_rtol: float = LOSS_RTOL) -> dict:
    """Errors of a parallel run against the reference; ``matches`` is the verdict.

    Returns ``loss_rel_err`` (max over steps), ``grad_rel_err`` (max over tensors, or None),
    ``missing_grads`` (names the parallel run did not report), tolerances and ``matches``.
    """
    par = parallel_losses(results)
    ref_losses = ref["losses"]
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(par, ref_losses))
    out = {"loss_rel_err": loss_err, "loss_rtol": loss_rtol, "grad_rtol": GRAD_RTOL,
           "parallel_losses": par, "reference_losses": ref_losses,
           "grad_rel_err": None, "missing_grads": []}
    ok = len(par) == len(ref_losses) and loss_err <= loss_rtol
    if grads is not None and ref.get("grads") is not None:
        errs = {}
        floor = GRAD_FLOOR * max(float(g.abs().max()) for g in ref["grads"].values())
        for name, g_ref in ref["grads"].items():
            g = grads.get(name)
            if g is None or g.shape != g_ref.shape:
                out["missing_grads"].append(name)
                continue
            errs[name] = float((g - g_ref).abs().max()) / max(float(g_ref.abs().max()), floor)
        out["grad_rel_err"] = max(errs.values()) if errs else None
        out["worst_grad"] = max(errs, key=errs.get) if errs else None
        ok = ok and not out["missing_grads"] and out["grad_rel_err"] <= GRAD_RTOL
    out["matches"] = bool(ok)
    return out
