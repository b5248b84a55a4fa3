"""The Mamba-2 (SSD) layer of a hybrid model: its projections, its chunked scan and what it keeps for
backward, on one GPU for one micro-batch (``model.mamba``; the pattern is ``model.layer_pattern``).

Megatron-Core's ``MambaLayer`` (NVIDIA/Megatron-LM @ 00bebb4, megatron/core/ssm/mamba_layer.py): a
pre-norm, the ``MambaMixer`` and a residual add. The mixer (megatron/core/ssm/mamba_mixer.py): in_proj,
a ColumnParallelLinear h -> (z, x, B, C, dt); the training path ``mamba_split_conv1d_scan_combined``
(state-spaces/mamba mamba_ssm/ops/triton/ssd_combined.py ``MambaSplitConv1dScanCombinedFn``): the causal
depthwise convolution over x, B, C and the SSD chunked scan (chunk cumsum, chunk states, state passing,
C·Bᵀ per chunk, chunk scan); the gated RMSNorm; out_proj, a RowParallelLinear d_inner -> h. Tensor
parallelism splits the heads, the groups and d_inner (the mixer asserts heads % tp == 0 and
groups % tp == 0): every width but h is divided by tp, and the layer runs one all-reduce equivalent
per pass, as an attention or MLP sub-layer does.

The scan kernel has no calibrated efficiency curve here. It is priced as a roofline of two kernel
classes the curves do calibrate (:data:`SSD_KERNEL_ASSUMPTION`): its bytes at the memory-bound
(elementwise) HBM rate and its FLOPs at the fused-attention rate; the bytes bind for every shape we
ship (FLOPs per byte ~ 30).
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.comm import ALL_TO_ALL, collective_time, ranks_per_node
from paraplan.costmodels.kernels import BYTES, element_bytes, linear_gemm_time, tokens_per_rank

#: kernels of the SSD forward in mamba_ssm's combined function: causal_conv1d_fwd, _chunk_cumsum_fwd,
#: _chunk_state_fwd, _state_passing_fwd, _bmm_chunk_fwd, _chunk_scan_fwd
SSD_FORWARD_KERNELS = 6
#: the backward (``MambaSplitConv1dScanCombinedFn.backward``: the convolution recomputed, then
#: _mamba_chunk_scan_combined_bwd's chunk-state, state-passing, bmm and chunk-scan backward kernels and the
#: convolution's backward) priced as twice the forward's bytes, FLOPs and launches, the convention this
#: package uses for memory-bound kernels (compute.layer_times: backward streams twice the bytes)
SSD_BACKWARD_FACTOR = 2.0

SSD_KERNEL_ASSUMPTION = (
    "Mamba-2 SSD scan: no calibrated kernel curve; priced as a roofline, its bytes (16-bit x, B, C, z, "
    "the convolution's output, fp32 chunk states) at the memory-bound elementwise HBM rate and its FLOPs "
    "(Dao & Gu 2024 sec. 6) at the fused-attention rate, backward 2 x forward; the projections are GEMMs "
    "on the GEMM curve")


def mamba_gemm_forward_times(model, job, plan, curves) -> tuple:
    """Forward times (in_proj, out_proj) of one Mamba layer's projections for one micro-batch: in_proj
    T x (2·d_inner + 2·G·N + H)/tp x h, out_proj T x h x d_inner/tp."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    (w_in, h, _), (_, d_inner, _) = model.mamba.gemms(model.hidden)
    return (linear_gemm_time(curves, T, w_in / t, h, plan), linear_gemm_time(curves, T, h, d_inner / t, plan))


def ssd_forward_bytes_per_token(spec) -> float:
    """Bytes the convolution and the SSD scan move per token forward, over all tp ranks (the caller
    divides by tp), from the kernels of ``mamba_chunk_scan_combined`` (16-bit activations, fp32 dt,
    cumsum, C·Bᵀ and chunk states, the passed states 16-bit):

      conv1d        read and write x|B|C                      4·(d + 2GN)
      chunk_cumsum  read dt, write dt and dA_cumsum (fp32)    10·H
      chunk_state   read x, B, dt, dA; write states (fp32)    2d + 2GN + 8H + 4·H·P·N/Q
      state_passing read fp32 states, write 16-bit            6·H·P·N/Q
      bmm_chunk     read B, C; write C·Bᵀ (fp32)              4GN + 4GQ
      chunk_scan    read C·Bᵀ, x, z, C, states, dt, dA; write y  4GQ + 6d + 2GN + 2·H·P·N/Q + 8H

    = 12d + 16GN + 8GQ + 26H + 12·d·N/Q with d = d_inner = H·P."""
    d, G, N, Q, H = spec.d_inner, spec.groups, spec.state, spec.chunk, spec.heads
    return 12.0 * d + 16.0 * G * N + 8.0 * G * Q + 26.0 * H + 12.0 * d * N / Q


def ssd_scan_times(model, job, plan, curves) -> tuple:
    """(forward, backward) seconds of one Mamba layer's convolution and SSD scan for one micro-batch on
    one GPU: max(bytes at the memory-bound rate, FLOPs at the fused-attention rate) over the rank's
    heads (:data:`SSD_KERNEL_ASSUMPTION`); fp32 activations double the 16-bit bytes."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    spec = model.mamba
    wide = element_bytes(plan) / BYTES
    nbytes = T * ssd_forward_bytes_per_token(spec) / t * wide
    flops = T * spec.scan_flops_per_token() / t
    fwd = np.maximum(curves.memory_time(nbytes, kernels=SSD_FORWARD_KERNELS),
                     curves.flash_attention_time(flops, kernels=SSD_FORWARD_KERNELS))
    bwd = np.maximum(curves.memory_time(SSD_BACKWARD_FACTOR * nbytes, kernels=SSD_BACKWARD_FACTOR * SSD_FORWARD_KERNELS),
                     curves.flash_attention_time(SSD_BACKWARD_FACTOR * flops,
                                                 kernels=SSD_BACKWARD_FACTOR * SSD_FORWARD_KERNELS))
    return fwd, bwd


def mamba_cp_alltoall_time(model, job, plan, cluster):
    """One pass's context-parallel all-to-alls of a Mamba layer for one micro-batch (Megatron-Core
    ``MambaContextParallel``, megatron/core/ssm/mamba_context_parallel.py, called by mamba_mixer.py as
    ``self.cp.pre_conv_ssm(zxBCdt)`` and ``self.cp.post_conv_ssm(y)``): before the convolution and scan
    the in_proj output goes from a sequence shard of all the rank's heads to the whole sequence of
    1/cp of them, T·(2d + 2GN + H)/tp elements, and the scan's output y (T·d/tp) comes back; the
    backward runs the two again (the caller counts the passes). On the critical path (no overlap).
    0 without context parallelism."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    c = np.asarray(plan.cp)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    intra, inter = cluster.links("cp")
    spec, e = model.mamba, element_bytes(plan)
    pre = collective_time(ALL_TO_ALL, T * spec.in_proj_width * e / t, plan.cp, k, intra, inter)
    post = collective_time(ALL_TO_ALL, T * spec.d_inner * e / t, plan.cp, k, intra, inter)
    return np.where(c > 1, pre + post, 0.0)


#: the gated RMSNorm (Megatron's ExtendedRMSNorm over d_inner in groups of d_inner / G): read y and z,
#: write the output, 16-bit, per d_inner channel
GATED_NORM_BYTES_PER_CHANNEL = 6


def mamba_saved_bytes_per_token(model) -> tuple:
    """(sharded, unsharded) 16-bit bytes one Mamba layer keeps for backward per token: sharded over tp
    (the caller divides by tp), and the block-wide ones (a sequence shard under sequence parallelism).
    What the autograd graph holds (Megatron-LM @ 00bebb4 mamba_layer.py and mamba_mixer.py; mamba_ssm
    ssd_combined.py ``MambaSplitConv1dScanCombinedFn.forward``: ``save_for_backward(zxbcdt, ..., out_x,
    ..., rstd, ...)``):

      unsharded  the pre-norm's input 2h, in_proj's input (the norm's output) 2h
      sharded    in_proj's output zxBCdt 2·(2d + 2GN + H), the scan's output out_x 2d, the gated norm's
                 input 2d (its fp32 rstd per group 4G), out_proj's input 2d

    The convolution's output is recomputed in backward (not kept); the residual add keeps nothing."""
    spec, h = model.mamba, model.hidden
    sharded = 2.0 * spec.in_proj_width + 6.0 * spec.d_inner + 4.0 * spec.groups
    return sharded, 4.0 * h


def ssd_kernel_assumption(model, **_) -> tuple[str, ...]:
    """Said with every estimate of a model with Mamba-2 layers: how the scan is priced."""
    if getattr(model, "mamba", None) is None:
        return ()
    m = model.mamba
    return (f"{SSD_KERNEL_ASSUMPTION}; {model.kind_count('mamba')} Mamba-2 layers of {m.heads} heads x {m.head_dim}, "
            f"state {m.state}, {m.groups} groups, chunk {m.chunk}, heads and groups split over tp",)
