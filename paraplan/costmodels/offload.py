"""Optimizer step and offload transfers (ZeRO-Offload, ZeRO-Infinity).

All functions take ``shard``: the parameters whose optimizer states one GPU owns (Ψ/N_d under
ZeRO ≥ 1, Ψ otherwise; routed experts shard over N_d/ep).

* GPU Adam: memory-bound, ~28 bytes touched per parameter (read the fp32 weight, momentum and
  variance and the 16-bit gradient; write the three back and the 16-bit weight: a count) at the HBM's
  achieved bandwidth. Curves that measured the optimizer step (a profiled CPU device,
  ``curves.adam_step_time``) charge it per tensor and per parameter instead: PyTorch AdamW
  (``foreach=False``) loops over the parameter tensors, so on an eager CPU run the per-tensor
  cost dominates. Tensors per GPU (:func:`param_tensors`): the stage's weights, biases and norm
  parameters (Q, K, V and the output projection as 4 tensors), or one flat buffer under ZeRO-1/2
  (the harness and DeepSpeed flatten the shard). The 1-bit optimizers add their error-feedback pass (read and write an fp32
  error buffer, pack signs: ~12 bytes per parameter).
* CPU-Adam (ZeRO-Offload, Ren et al. 2021 §4): the host runs the update for all GPUs of the node,
  memory-bound on host DRAM at the curve's CPU-Adam efficiency.
* Host link (ZeRO-Offload; PCIe, or NVLink-C2C on a Grace superchip: ``System.host_link_bytes_per_s``):
  16-bit gradients GPU→host (2 bytes per shard parameter, overlapped with the
  last backward) and updated 16-bit parameters host→GPU (2 bytes, exposed): 4Ψ/N_d per GPU per step.
  With the one-step delayed parameter update (ZeRO-Offload §5, DPU) the CPU step and the upload run
  under the next step's forward and backward.
* NVMe (ZeRO-Infinity, Rajbhandari et al. 2021 §5-6): the optimizer step reads fp32 weights,
  momentum, variance and gradients (16 bytes per parameter) and writes back 12, through the node's
  drives, not overlapped (the SC21 slides: "Optimizer states: no overlap").
* Offloaded parameters (ZeRO-Infinity, bandwidth-centric partitioning): each GPU fetches its own
  shard forward and backward every micro-batch over its host link (and the node's drives for NVMe),
  prefetched under the micro-batch's compute.
* A profiled CPU device (the validation harness, :func:`device_is_host`): the host is the device. The
  offloaded AdamW is the one the profile measured on those cores, and the transfers are two copies in the
  same memory (the gradient shard down, the updated shard back, in the plan's element size, each read and
  written at the measured copy bandwidth), with nothing to hide under: the cores that copy are the
  cores that compute.
* Scaling (engine ``scaling``) passes over every 16-bit gradient in its ``optimizer.step()``
  (:func:`scaling_step_passes_time`).

:func:`optimizer_and_offload_times` puts them together for a step (``optimizer`` and ``offload``).
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.kernels import BYTES, device_is_host, element_bytes
from paraplan.costmodels.memory import OPTIMIZER_BYTES_PER_PARAM, optimizer_bytes_per_param, plain_adam_bytes_per_param
from paraplan.engines import engine_flag
from paraplan.plan import Offload, Optimizer, expert_data_parallel, model_stage_layers

ERROR_FEEDBACK_BYTES_PER_PARAM = 12


def stage_param_tensors(model, plan):
    """Parameter tensors of one GPU's largest pipeline stage (each stage's own layer count,
    ``paraplan.plan.stage_layers``): per layer the norms (2 with a
    LayerNorm bias), the fused QKV and output projections and the two MLP matrices (Megatron-LM's
    linear_qkv, linear_proj, linear_fc1 with a fused gate, linear_fc2), each with its bias when
    the model has biases; the token (and learned position) embedding on the first stage, final
    norm and untied head on the last."""
    p = np.asarray(plan.pp, dtype=float)
    bias = 2 if model.bias else 1
    norm = 2 if model.norm == "layernorm" else 1
    per_layer = 2 * norm + 4 * bias
    sl = model_stage_layers(model, plan)          # multi-token-prediction blocks on the last stage
    emb = 1 + (1 if model.learned_positions else 0)
    head = norm + (0 if model.tied_embeddings else 1)
    staged = np.maximum(np.maximum(sl.first * per_layer + emb, sl.last * per_layer + head), sl.middle * per_layer)
    return np.where(p > 1, staged, sl.first * per_layer + emb + head)


def param_tensors(model, plan):
    """Tensors the optimizer of one GPU loops over: :func:`stage_param_tensors`, or one flat
    tensor under ZeRO-1/2."""
    z = np.asarray(plan.zero)
    return np.where((z == 1) | (z == 2), 1.0, stage_param_tensors(model, plan))


def cpu_adam_time(shard, cluster, curves):
    """CPU-Adam for every GPU of the node, memory-bound on the host's DRAM (the node's CPU sockets:
    ``cluster.node_system``, an NVLink domain's share of them on a cluster cut into domains)."""
    sysm = cluster.node_system
    host_bw = sysm.host_cpu.memory_bandwidth_bytes_per_s * sysm.host_cpu_sockets * curves.cpu_adam_memory_efficiency
    return curves.gpu_adam_bytes_per_param * shard * cluster.gpus_per_node / host_bw


def precision_aware_step_saving(plan):
    """Bytes per parameter the GPU Adam step touches less under Megatron-Core's precision-aware optimizer:
    its states are read and written once each, so 2·(K₀ − K) for the optimizer bytes K
    (:func:`paraplan.costmodels.memory.optimizer_bytes_per_param`) against K₀ without it
    (:func:`paraplan.costmodels.memory.plain_adam_bytes_per_param`: 12; e.g. bf16
    moments with the master weight's remainders: 2·(12 − 6) = 12 of the 28). 0 for every other plan."""
    return 2.0 * (plain_adam_bytes_per_param(plan) - np.asarray(optimizer_bytes_per_param(plan), dtype=float))


def optimizer_time(shard, plan, cluster, curves, tensors=None):
    """Seconds of the optimizer step on the GPU or on the host CPUs (before any overlap);
    ``tensors`` (:func:`param_tensors`) is used only by curves that measured the step."""
    compressed = np.asarray(plan.optimizer_code) != Optimizer.ADAM
    per_param = (curves.gpu_adam_bytes_per_param - precision_aware_step_saving(plan)
                 + np.where(compressed, ERROR_FEEDBACK_BYTES_PER_PARAM, 0))
    gpu = curves.memory_time(per_param * shard, kernels=4)
    if getattr(curves, "kind", "") == "analytical":        # a calibrated cluster's optimizer factor
        gpu = gpu * curves.factor("optimizer")
    measured = getattr(curves, "adam_step_time", None)
    if measured is not None and tensors is not None:
        t = measured(shard, tensors)
        if t is not None:
            gpu = t + curves.memory_time(np.where(compressed, ERROR_FEEDBACK_BYTES_PER_PARAM, 0) * shard,
                                         kernels=0)
        # FSDP2 (ZeRO-3) on a device whose profile measured it: AdamW dispatches each elementwise op
        # of the update through DTensor, once per sharded parameter tensor
        fsdp_adam = float(getattr(curves, "fsdp_adam_tensor_overhead_s", 0.0) or 0.0)
        gpu = gpu + np.where(np.asarray(plan.zero) == 3, np.asarray(tensors, dtype=float) * fsdp_adam, 0.0)
    if device_is_host(cluster):          # the offloaded AdamW runs on the same, measured cores
        return gpu
    return np.where(np.asarray(plan.offload_code) == Offload.NONE, gpu, cpu_adam_time(shard, cluster, curves))


def offload_transfer_times(shard, plan, cluster, m, t_micro_fwd, t_micro_bwd, t_micro_wall=None) -> dict:
    """Exposed PCIe and NVMe seconds per step under offload, by stream (0 without offload); the
    node's drives are ``cluster.node_system``'s (an NVLink domain's share on a cluster cut into domains).

    The parameter fetch of ZeRO-3 offload (ZeRO-Infinity's prefetch) runs on PCIe and the drives, so
    it hides under the whole of a micro-batch's wall time ``t_micro_wall`` (default t_fwd + t_bwd):
    its compute and recomputation and the tensor/context/expert-parallel and ZeRO-3 collectives it
    exposes on the GPU's links: m · max(0, fetch − t_micro_wall). Hidden under the bare compute
    alone, the fetch and the exposed collectives would each claim the same window, and a faster GPU
    (a shorter window) would lengthen the step. The gradients' copy to the host hides under the last
    micro-batch's backward, beside that micro-batch's fetch on the other direction of the host link:
    of the two, only the part that outlasts the other's exposure is added,
    max(0, max(0, G − t_bwd) − max(0, fetch − t_micro_wall))."""
    sysm = cluster.node_system
    g = cluster.gpus_per_node
    pcie = sysm.host_link_bytes_per_s
    oc = np.asarray(plan.offload_code)
    off = oc != Offload.NONE
    if device_is_host(cluster):
        # two copies of the shard in the device's own memory, read and written at the copy bandwidth, exposed
        copy = 2.0 * element_bytes(plan) * shard / cluster.accelerator.memory_bandwidth_bytes_per_s
        zero = np.zeros_like(np.asarray(copy, dtype=float))
        return {"grads_to_host": np.where(off, copy, 0.0), "params_to_gpu": np.where(off, copy, 0.0),
                "nvme_optimizer_states": zero, "param_fetch": zero}
    grads_down = np.maximum(0.0, BYTES * shard / pcie - t_micro_bwd)
    params_up = BYTES * shard / pcie
    nvme_states = shard * g * ((OPTIMIZER_BYTES_PER_PARAM + 4) / sysm.nvme_read_bytes_per_s
                               + OPTIMIZER_BYTES_PER_PARAM / sysm.nvme_write_bytes_per_s)
    fetch_pcie = 2 * BYTES * shard / pcie
    fetch_nvme = 2 * BYTES * shard * g / sysm.nvme_read_bytes_per_s
    fetch = np.where(oc == Offload.NVME, np.maximum(fetch_pcie, fetch_nvme), fetch_pcie)
    wall = t_micro_fwd + t_micro_bwd if t_micro_wall is None else t_micro_wall
    fetch_exposed = np.where(off & np.asarray(plan.offload_params, dtype=bool), np.maximum(0.0, fetch - wall), 0.0)
    return {"grads_to_host": np.where(off, np.maximum(0.0, grads_down - fetch_exposed), 0.0),
            "params_to_gpu": np.where(off, params_up, 0.0),
            "nvme_optimizer_states": np.where(oc == Offload.NVME, nvme_states, 0.0),
            "param_fetch": m * fetch_exposed}


def activation_offload_time(offloaded_bytes, cluster, m, t_micro_fwd, t_micro_bwd):
    """Exposed seconds per step of activation offload (Megatron-LM --cpu-offloading, Transformer
    Engine's double-buffered cpu_offload): each micro-batch copies ``offloaded_bytes`` to the host
    during its forward and back during its backward over the GPU's host link, each direction hidden
    under that pass: m * (max(0, x - t_fwd) + max(0, x - t_bwd)), x = bytes / host-link bandwidth."""
    x = np.asarray(offloaded_bytes, dtype=float) / cluster.system.host_link_bytes_per_s
    return np.asarray(m, dtype=float) * (np.maximum(0.0, x - t_micro_fwd) + np.maximum(0.0, x - t_micro_bwd))


def optimizer_and_offload(shard, plan, cluster, curves, m, t_micro_fwd, t_micro_bwd, t_step_compute,
                          tensors=None, t_micro_wall=None):
    """(optimizer seconds, exposed offload seconds) per step, with the delayed update's overlap."""
    opt = optimizer_time(shard, plan, cluster, curves, tensors)
    streams = offload_transfer_times(shard, plan, cluster, m, t_micro_fwd, t_micro_bwd, t_micro_wall)
    delayed = np.asarray(plan.delayed_update, dtype=bool)
    # DPU: CPU step + parameter upload hide under the next step's compute
    hidden = np.maximum(0.0, opt + streams["params_to_gpu"] - t_step_compute)
    opt_exposed = np.where(delayed, hidden, opt)
    upload = np.where(delayed, 0.0, streams["params_to_gpu"])
    offload = streams["grads_to_host"] + upload + streams["nvme_optimizer_states"] + streams["param_fetch"]
    return opt_exposed, offload


def host_link_assumption(plan, cluster, **_) -> tuple[str, ...]:
    """The link an offloading plan's transfers take (priced on System.host_link_bytes_per_s)."""
    if plan.offload == "none" and not plan.offload_activation_layers:
        return ()
    s = cluster.system
    return (f"offload transfers take each GPU's host link, {s.host_link_name} at {s.host_link_bytes_per_s / 1e9:.0f} GB/s per "
            "direction (sustained), hidden under the passes where the timeline allows",)


# Scaling's optimizer.step() passes over every 16-bit gradient of the stage before its fp32 all-reduce
# and after it (core/optimizer/optimizer.py, allreduce.py, parameter_group.py at 01b9d21), bytes per
# parameter: loss-scale mul_ (2 + 2) and the global-norm read (2) per tensor; per bucket the flatten copy
# (2 + 2), the division by dp (2 + 2), the cast to fp32 (2 + 4), the copy back to 16 bit (4 + 2) and the
# copy into the gradient tensors (2 + 2).
SCALING_STEP_BYTES_PER_PARAM = (2 + 2) + 2 + (2 + 2) + (2 + 2) + (2 + 4) + (4 + 2) + (2 + 2)
SCALING_STEP_KERNELS_PER_TENSOR = 3          # mul_, norm and the unflattened copy back, per tensor


def scaling_step_passes_time(model, plan, curves, params):
    """Seconds of Scaling's gradient passes in ``optimizer.step()`` (engine scaling; 0 otherwise):
    streaming_time(SCALING_STEP_BYTES_PER_PARAM · Ψ_stage, kernels = 3 per parameter tensor), every
    step whatever the micro-batch count (the all-reduce they wrap is in
    :func:`paraplan.costmodels.dataparallel.dp_exposed_time`)."""
    scaling = engine_flag(plan, "reduces_in_optimizer_step")
    if not np.any(scaling):                     # priced only where a plan runs on Scaling
        return 0.0
    t = curves.streaming_time(SCALING_STEP_BYTES_PER_PARAM * params,
                              kernels=SCALING_STEP_KERNELS_PER_TENSOR * stage_param_tensors(model, plan))
    return np.where(scaling, t, 0.0)


def optimizer_shard(params, experts, plan):
    """The parameters whose optimizer states one GPU owns (``shard`` above): the stage's ``params`` and
    routed ``experts``, under ZeRO ≥ 1 sharded over dp·cp and over the expert-data-parallel group."""
    n_dp = np.asarray(plan.dp, dtype=float) * plan.cp
    n_edp = expert_data_parallel(plan)
    z1 = np.asarray(plan.zero) >= 1
    return np.where(z1, params / n_dp, params) + np.where(z1, experts / n_edp, experts)


def optimizer_and_offload_times(model, plan, cluster, curves, m, pace, shard, params, dp_exposed,
                                activations_offloaded):
    """(``optimizer``, ``offload``) seconds per step: :func:`optimizer_and_offload` of the ``shard``
    against the pace-setting stage ``pace`` (:class:`paraplan.costmodels.pipeline.StagePace`; the
    delayed update hides under its m micro-batches), plus Scaling's gradient passes
    (:func:`scaling_step_passes_time`) and the activations' offload (:func:`activation_offload_time`).
    A micro-batch's wall time on that stage is its layers with their exposed collectives, the head, and
    the ZeRO-3 gathers and reductions it exposes micro-batch by micro-batch (``dp_exposed`` / m);
    ZeRO-Infinity's parameter fetch hides under all of it (:func:`offload_transfer_times`)."""
    compute_step = m * (pace.layers_time + pace.head_compute + pace.head_tp)
    dp_per_micro = np.where(np.asarray(plan.zero) == 3, dp_exposed / np.maximum(np.asarray(m, dtype=float), 1.0), 0.0)
    micro_wall = pace.layers_time + pace.head_compute + pace.head_tp + dp_per_micro
    optimizer, offload = optimizer_and_offload(shard, plan, cluster, curves, m, pace.forward, pace.backward,
                                               compute_step, tensors=param_tensors(model, plan),
                                               t_micro_wall=micro_wall)
    offload = offload + activation_offload_time(activations_offloaded, cluster, m, pace.forward, pace.backward)
    return optimizer + scaling_step_passes_time(model, plan, curves, params), offload
