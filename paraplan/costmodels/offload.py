"""Optimizer step and offload transfers (ZeRO-Offload, ZeRO-Infinity).

* GPU Adam: memory-bound, ~28 bytes touched per parameter of the local optimizer shard
  (shared/reference §1.6) at the HBM's achieved bandwidth.
* CPU-Adam (ZeRO-Offload, Ren et al. 2021 §4): the host runs the update for all GPUs of the node,
  memory-bound on host DRAM at the curve's CPU-Adam efficiency.
* PCIe (ZeRO-Offload): 16-bit gradients GPU→host (2Ψ/N_d, overlapped with the last backward) and
  updated 16-bit parameters host→GPU (2Ψ/N_d, exposed): 4Ψ/N_d per GPU per step.
* NVMe (ZeRO-Infinity, Rajbhandari et al. 2021): optimizer states read and written every step
  (12Ψ/N_d each way per GPU, shared by the node's drives), not overlapped.
* Offloaded parameters (ZeRO-Infinity, bandwidth-centric partitioning): each GPU fetches its own
  shard forward and backward every micro-batch over its PCIe link (and the node's drives for NVMe),
  prefetched under the micro-batch's compute.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.compute import BYTES
from paraplan.costmodels.memory import OFFLOAD_CPU, OFFLOAD_NONE, OFFLOAD_NVME, OPTIMIZER_BYTES_PER_PARAM


def optimizer_time(params, plan, cluster, curves):
    """Seconds of the optimizer step on the GPU or on the host CPUs."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp
    shard = np.where(np.asarray(plan.zero) >= 1, params / n, params)
    bytes_touched = curves.gpu_adam_bytes_per_param * shard
    gpu = curves.memory_time(bytes_touched, kernels=4)
    sysm = cluster.system
    host_bw = sysm.host_cpu.memory_bandwidth_bytes_per_s * sysm.host_cpu_sockets * curves.cpu_adam_memory_efficiency
    cpu = bytes_touched * cluster.gpus_per_node / host_bw
    return np.where(np.asarray(plan.offload_code) == OFFLOAD_NONE, gpu, cpu)


def offload_exposed_time(params, plan, cluster, m, t_micro_fwd, t_micro_bwd):
    """Exposed seconds of PCIe and NVMe traffic per step under offload (0 without)."""
    n = np.asarray(plan.dp, dtype=float) * plan.cp
    shard = params / n
    sysm = cluster.system
    g = cluster.gpus_per_node
    pcie = sysm.pcie_bandwidth_bytes_per_s
    oc = np.asarray(plan.offload_code)
    grads_down = BYTES * shard / pcie
    params_up = BYTES * shard / pcie
    optimizer_pcie = np.maximum(0.0, grads_down - t_micro_bwd) + params_up
    nvme_states = OPTIMIZER_BYTES_PER_PARAM * shard * g * (1 / sysm.nvme_read_bytes_per_s
                                                           + 1 / sysm.nvme_write_bytes_per_s)
    fetch_pcie = 2 * BYTES * shard / pcie
    fetch_nvme = 2 * BYTES * shard * g / sysm.nvme_read_bytes_per_s
    fetch = np.where(oc == OFFLOAD_NVME, np.maximum(fetch_pcie, fetch_nvme), fetch_pcie)
    param_fetch = m * np.maximum(0.0, fetch - (t_micro_fwd + t_micro_bwd))
    total = (np.where(oc != OFFLOAD_NONE, optimizer_pcie, 0.0)
             + np.where(oc == OFFLOAD_NVME, nvme_states, 0.0)
             + np.where((oc != OFFLOAD_NONE) & np.asarray(plan.offload_params, dtype=bool), param_fetch, 0.0))
    return total
