"""Gradient accumulation across a step's micro-batches (``grad_accumulation``), where it is not fused
into the weight-gradient GEMMs: :func:`grad_accumulation_time`.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.kernels import element_bytes
from paraplan.costmodels.memory import deepspeed_bf16_optimizer
from paraplan.costmodels.offload import stage_param_tensors

# DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, the optimizer of bf16 runs with
# ZeRO <= 1; Megatron-DeepSpeed trained BLOOM on it) keeps fp32 gradients and, after every
# micro-batch's backward (PipelineEngine._exec_backward_pass: clear_lp_grads() before,
# update_hp_grads() after), adds each 16-bit gradient into them per parameter tensor as
# ``hp.grad.add_(lp.grad.to(fp32))``: the cast reads 2 and writes 4 bytes, the add reads 4 + 4 and
# writes 4, two kernels per tensor.
DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM = (2 + 4) + (4 + 4 + 4)
DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR = 2


def grad_accumulation_time(model, plan, curves, m, params):
    """Unfused gradient accumulation (``plan.grad_accumulation_fusion`` False): every micro-batch
    after the first adds its gradients into the accumulated ones, one elementwise kernel per
    parameter tensor reading two and writing one gradient:
    (m − 1) · streaming_time(3 · G · bytes, kernels = tensors), G the gradients a rank accumulates
    (its stage's ``params``; under ZeRO-3 its 1/(dp·cp) shard, FSDP reduce-scattering every
    micro-batch). Fused (Megatron-LM's wgrad GEMM with beta = 1): 0. Measured on the CPU
    validation model (1.06 M fp32 parameters in 53 tensors): 1.0 ms per extra micro-batch.
    DeepSpeed's BF16_Optimizer (:func:`paraplan.costmodels.memory.deepspeed_bf16_optimizer`) accumulates into fp32 after every
    micro-batch, the first too, whatever the flag:
    m · streaming_time(18 · G, kernels = 2 · tensors) (DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM)."""
    n_dp = np.asarray(plan.dp, dtype=float) * plan.cp
    fused = np.asarray(plan.grad_accumulation_fusion, dtype=bool)
    z3 = np.asarray(plan.zero) == 3
    grads = np.where(z3, params / n_dp, params)
    tensors = stage_param_tensors(model, plan)
    t = curves.streaming_time(3.0 * grads * element_bytes(plan), kernels=tensors)
    unfused = np.where(fused, 0.0, np.maximum(np.asarray(m, dtype=float) - 1.0, 0.0) * t)
    ds_bf16 = deepspeed_bf16_optimizer(plan)
    if not np.any(ds_bf16):
        return unfused
    t_ds = curves.streaming_time(DEEPSPEED_BF16_ACCUMULATION_BYTES_PER_PARAM * grads,
                                 kernels=DEEPSPEED_BF16_ACCUMULATION_KERNELS_PER_TENSOR * tensors)
    return np.where(ds_bf16, np.asarray(m, dtype=float) * t_ds, unfused)
