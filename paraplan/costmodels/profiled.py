"""Measured efficiency curves: the tables of ``paraplan profile`` behind the AnalyticalCurves interface.

Built from :func:`paraplan.profiles.store.measured_tables` (plain lists; this module does
not import torch). Same methods and attributes as
:class:`paraplan.costmodels.efficiency.AnalyticalCurves`, over numpy arrays as well as scalars:

* kernel overhead ``t0``: the measured time of a 1-element op (``launch`` rows); for older
  profiles without it, the intercept of the line through the two smallest GEMMs
  (``t = t0 + F/R``), clamped to ``[0, t_smallest / 2]``.
* GEMM ``t = t0 + F / R(F)``, F = 2mnk, from the training-layout GEMMs of a Linear (forward
  x·Wᵀ, input gradient g·W, weight gradient gᵀ·x: ``gemm_linear``) when the profile has them,
  else from square ``a @ b``: the measured time minus ``t0`` is interpolated
  linearly in log-log over the FLOPs per op (shapes with equal FLOPs averaged, a running
  maximum keeps it non-decreasing), so the curve is exact at the measured points; outside
  the measured range the rate ``R`` is held at the nearest end's (clamped). A dtype without
  measurements uses the nearest measured one (listed in ``describe()['dtype_fallbacks']``).
* memory-bound kernels ``t = kernels · t0 + bytes / BW``: BW the rate eager elementwise kernels
  (GELU, LayerNorm, scale-mask-softmax, cross-entropy, forward + backward) achieve in the
  estimator's byte accounting, from the time difference of two sizes (:func:`elementwise_bandwidth`),
  capped by the measured device copy bandwidth; profiles without those rows use the copy
  bandwidth. On a CPU core the erf and exp make these kernels compute-bound, several times below
  the copy bandwidth.
* attention ``t = kernels · t0 + F / R_sdpa(F)``, R_sdpa interpolated over the measured causal
  SDPA forwards the same way (their FLOPs count the causal half, as the estimator does).
* what a *training step* pays per kernel (profiles with ``training`` rows, :func:`training_rows
  <paraplan.validation.profile.training_rows>`): ``kernel_overhead_s`` becomes the median
  per-kernel cost of tiny ops run forward + backward under autograd (eager dispatch, graph
  recording, the autograd engine), the launch figure stays ``launch_overhead_s`` (the GEMM curves
  are measured without autograd, so their excess is taken over it). Measured at the world size
  of the cluster (nearest measured one; all ranks running at once): the per-kernel cost, the
  AdamW step and ``compute_slowdown`` = the reference (a transformer block forward + backward)
  time with n ranks busy / alone (≥ 1),
  which scales every GEMM, attention and memory-bound time (n ranks sharing the cores).
* the reference block itself (``reference_block``: its shape and time at that world size): the
  estimator solves ``composition_factor``, the factor on every kernel's measured work with which
  its composed layer equals the measured one (:func:`paraplan.costmodels.efficiency.with_reference_block`;
  CPU profiles only, bounded), and charges it with the slowdown (:attr:`ProfiledCurves.work_factor`).
* AdamW step: ``adam_step_time(params, tensors) = tensors · a + params · b(e)`` with a and b solved
  from the two measured steps of small tensors (64 tensors of 64 elements, 16 of 2^16), when
  measured; otherwise the estimator's memory-bound formula with curves.yaml's bytes per parameter.
  Profiles that also stepped one flat tensor of 2^21 elements (a ZeRO-1/2 shard's shape, whose
  parameter, gradient and states outgrow the caches) give the per-element cost there too, and
  b(e) runs log-linearly in the elements per tensor e = params / tensors from b at 2^16 to that
  figure at 2^21 (flat outside).
* recomputation overhead (profiles with ``checkpoint`` rows): what non-reentrant
  ``torch.utils.checkpoint`` adds to a recomputed region beyond re-running its forward (saved-tensor
  hooks, region bookkeeping, the replay), ``region + kernels · per_kernel`` from two measured
  regions (the attention core and a whole block, :func:`checkpoint_overhead_fit`); on this 2-core
  machine about 0.34 ms per region and 18 µs per kernel, several times a kernel's own cost.
* op-level SAC's machinery (in profiles that carry a ``sac`` row per region): the same regions under
  a selective-checkpoint policy that keeps every output, less plain forward + backward: what its
  TorchDispatchMode costs (every op through Python in the forward, every op replayed from its cache in
  the backward), ``region + kernels · per_kernel`` (:func:`sac_overhead_fit`); measured 0.14 ms per
  region and 0.26 ms per kernel, 4.2 ms for a block against plain checkpointing's 0.84. Older
  profiles charge plain checkpointing's figure.
* FSDP2 (profiles with ``fsdp`` rows, world > 1): its own cost per wrapped unit and micro-batch
  beyond compute and collectives (``fsdp_unit_overhead_s``, measured on a stack of blocks each
  ``fully_shard``-ed under a root unit, divided by the units), and per parameter tensor in the
  optimizer step (``fsdp_adam_tensor_overhead_s``: AdamW on the stack's DTensor shards minus AdamW on
  plain tensors of the same shapes), both charged by the estimator under ZeRO-3 only.
* the tensor-parallel wrappers (profiles with ``tp`` rows): the host cost of one call of the
  autograd functions around the harness's tp collectives, forward + backward, beyond the collective
  (``tp_call_overhead_s``, :func:`tp_wrapper_call_fit`), charged per layer call under tp > 1
  (:func:`paraplan.costmodels.tpcomm.tp_wrapper_host_time`); 10-15 us on this 2-core machine, ranks alone.
* CPU-Adam efficiency and Adam bytes per parameter are not measured: curves.yaml's defaults.
* a calibrated profile (``paraplan calibrate``, :mod:`paraplan.validation.calibrate`) carries
  ``calibration`` = {knob: factor} fitted to measured runs: ``gemm`` multiplies the GEMMs' work,
  ``attention`` fused attention's, ``memory`` the memory-bound kernels' (bytes / rate), ``kernel`` the
  per-kernel cost (and the launch cost), ``optimizer`` the measured AdamW step; each multiplies what
  the profile's measurement gives, after the reference block's composition factor, which is solved on
  the uncalibrated curves (:meth:`ProfiledCurves.uncalibrated`).
  The collective knobs ride on the cluster's link (:func:`paraplan.profiles.cluster.calibrated_link`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from paraplan.costmodels.curvefile import curve_table
from paraplan.errors import ConfigError

#: torch dtype names in the profile -> the estimator's names
DTYPE_NAMES = {"float32": "fp32", "tfloat32": "tf32", "bfloat16": "bf16", "float16": "fp16",
               "fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}
#: nearest dtype first (same width, then the other 16-bit one, then wider/narrower)
NEAREST = {"bf16": ("fp16", "fp32", "tf32"), "fp16": ("bf16", "fp32", "tf32"),
           "fp32": ("tf32", "bf16", "fp16"), "tf32": ("fp32", "bf16", "fp16"),
           "fp8": ("bf16", "fp16", "fp32", "tf32"), "fp4": ("fp8", "bf16", "fp16", "fp32", "tf32")}


@dataclass(frozen=True)
class LogLogCurve:
    """Excess time ``t - t0`` over FLOPs, piecewise linear in log-log; constant rate outside."""
    flops: tuple[float, ...]          # increasing
    excess_s: tuple[float, ...]       # non-decreasing, > 0

    @classmethod
    def from_points(cls, points, t0: float) -> "LogLogCurve":
        """``points`` = [(flops, time_s)]; equal FLOPs averaged, then made non-decreasing."""
        by_f: dict[float, list[float]] = {}
        for f, t in points:
            if f and t and f > 0 and t > 0:
                by_f.setdefault(float(f), []).append(float(t))
        if not by_f:
            raise ConfigError("profile", "no usable measurements for a curve")
        fs = sorted(by_f)
        ts = np.maximum.accumulate([float(np.mean(by_f[f])) for f in fs])
        floor = 1e-3 * ts  # t0 may exceed a point's time by noise: keep a positive excess
        excess = np.maximum(ts - t0, floor)
        excess = np.maximum.accumulate(excess)
        return cls(tuple(fs), tuple(float(x) for x in excess))

    def __call__(self, flops):
        f = np.maximum(np.asarray(flops, dtype=float), 1e-30)
        lf, le = np.log(self.flops), np.log(self.excess_s)
        x = np.log(f)
        inside = np.exp(np.interp(x, lf, le))
        below = f * (self.excess_s[0] / self.flops[0])
        above = f * (self.excess_s[-1] / self.flops[-1])
        out = np.where(x < lf[0], below, np.where(x > lf[-1], above, inside))
        return np.where(np.asarray(flops, dtype=float) > 0, out, 0.0)

    def rate_at(self, flops) -> np.ndarray:
        f = np.asarray(flops, dtype=float)
        return f / self(f)


def _kernel_overhead(tables: dict, device: str, gemm_points) -> tuple[float, str]:
    launch = (tables.get("launch") or {}).get(device)
    if launch:
        return float(launch), "measured: 1-element add"
    pts = sorted({float(f): float(t) for f, t in gemm_points}.items())
    if len(pts) >= 2:
        (f1, t1), (f2, t2) = pts[:2]
        t0 = t1 - f1 * (t2 - t1) / (f2 - f1)
        return float(min(max(t0, 0.0), t1 / 2)), "derived: intercept of the two smallest GEMMs"
    return 0.0, "not measured (0)"


def _device_entry(by_device: dict, device: str):
    """``by_device[device]``; for a CUDA device whose index differs, any CUDA device's entry."""
    return by_device.get(device) or next((v for d, v in by_device.items()
                                          if d.startswith("cuda") and device.startswith("cuda")), None)


def elementwise_bandwidth(tables: dict, device: str) -> float | None:
    """Bytes per second eager elementwise kernels achieve, in the estimator's byte accounting:
    per kernel (GELU, LayerNorm, scale-mask-softmax, cross-entropy; forward + backward) the bytes
    difference over the time difference of its two measured sizes (fixed per-call costs cancel),
    then the median over kernels. None when not measured or when no difference is positive."""
    per_op = _device_entry(tables.get("elementwise") or {}, device)
    rates = []
    for pts in (per_op or {}).values():
        pts = sorted(pts)
        if len(pts) >= 2:
            (_, b1, t1), (_, b2, t2) = pts[0], pts[-1]
            if t2 > t1 and b2 > b1:
                rates.append((b2 - b1) / (t2 - t1))
    return float(np.median(rates)) if rates else None


def _region_fit(pts) -> tuple[float, float] | None:
    """(seconds per region, seconds per op) solving ``overhead(n) = region + n · op`` through the
    smallest and largest of the measured ``(n, overhead)`` regions (both clamped at 0); None without
    two region sizes."""
    pts = sorted(pts)
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return None
    (n1, o1), (n2, o2) = pts[0], pts[-1]
    per_op = max(0.0, (o2 - o1) / (n2 - n1))
    return max(0.0, o1 - n1 * per_op), per_op


def tp_wrapper_call_fit(rows: Mapping) -> float | None:
    """Host seconds per call of the validation harness's tensor-parallel autograd wrappers, from the
    profile's ``tp`` rows ({"wrapped": (seconds, calls), "plain": (seconds, 0)}: a tiny op forward +
    backward with and without ``calls`` wrappers chained after it, :func:`paraplan.validation.profile.
    _tp_wrapper_cases`): ``(wrapped - plain) / calls``, at least 0; None where not measured."""
    wrapped, plain = rows.get("wrapped"), rows.get("plain")
    if not wrapped or not plain or not wrapped[1]:
        return None
    return max(0.0, float(wrapped[0]) - float(plain[0])) / float(wrapped[1])


def checkpoint_overhead_fit(regions: Mapping) -> tuple[float, float] | None:
    """(seconds per checkpointed region, seconds per op in it) that recomputation costs beyond
    re-running the forward: ``overhead(n) = checkpointed − plain − forward`` of the two measured
    regions of n ops (``{n: {"plain", "forward", "checkpointed": seconds}}``), solved as
    ``region + n · op`` (both clamped at 0); None without two complete regions."""
    return _region_fit((int(n), v["checkpointed"] - v["plain"] - v["forward"]) for n, v in regions.items()
                       if all(v.get(k) for k in ("plain", "forward", "checkpointed")))


def sac_overhead_fit(regions: Mapping) -> tuple[float, float] | None:
    """(seconds per region, seconds per op in it) that op-level SAC's selective-checkpoint machinery
    costs a region with nothing recomputed: ``sac − plain`` of the two measured regions of n ops
    (``{n: {"plain", "sac": seconds}}``), solved as ``region + n · op`` (both clamped at 0); None
    without two (a profile older than its ``sac`` rows)."""
    return _region_fit((int(n), v["sac"] - v["plain"]) for n, v in regions.items() if v.get("sac") and v.get("plain"))


def training_measurements(tables: dict, device: str, world_size: int | None = None) -> dict:
    """Per-kernel autograd cost, compute slowdown and AdamW fit at the nearest measured world size
    (``{}`` for profiles without training rows); see the module docstring."""
    per_dev = _device_entry(tables.get("training") or {}, device)
    if not per_dev:
        return {}
    worlds = sorted(int(w) for w in per_dev)
    want = int(world_size or 1)
    world = min(worlds, key=lambda w: (abs(np.log(w / want)), -w))
    m = per_dev[world] if world in per_dev else per_dev[str(world)]
    out = {"world": world}
    per_kernel = [t / k for t, k in m.get("autograd", {}).values() if t and k]
    if per_kernel:
        out["kernel_s"] = float(np.median(per_kernel))
    alone = (per_dev.get(1) or per_dev.get("1") or {}).get("contention_s")
    if alone and m.get("contention_s"):
        out["slowdown"] = max(1.0, float(m["contention_s"]) / float(alone))
    if m.get("block"):
        out["block"] = m["block"]
    if m.get("fsdp_unit_s") is not None:
        out["fsdp_unit_s"] = float(m["fsdp_unit_s"])
    if m.get("fsdp_adam_tensor_s") is not None:
        out["fsdp_adam_tensor_s"] = float(m["fsdp_adam_tensor_s"])
    tp_call = tp_wrapper_call_fit(m.get("tp_wrapper") or {})
    if tp_call is not None:
        out["tp_call_s"] = tp_call
    routed = m.get("routed") or {}
    if (routed.get("routed") or {}).get("time_s") and (routed.get("dense") or {}).get("time_s"):
        out["routed_factor"] = max(1.0, float(routed["routed"]["time_s"]) / float(routed["dense"]["time_s"]))
        out["routed_tokens"] = int(routed["routed"]["shape"].get("tokens") or 0)
    ck = checkpoint_overhead_fit(m.get("checkpoint") or {})
    if ck:
        out["checkpoint_region_s"], out["checkpoint_kernel_s"] = ck
    sac = sac_overhead_fit(m.get("checkpoint") or {})
    if sac:
        out["sac_region_s"], out["sac_kernel_s"] = sac
    adam = sorted(m.get("adamw", []), key=lambda r: r[1])   # by elements per tensor
    if len(adam) >= 2:
        small = [r for r in adam if r[0] > 1] or adam      # the many-tensor cases fix a and b
        flat = [r for r in adam if r[0] == 1 and r[1] > small[-1][1]]
        (n1, e1, t1), (n2, e2, t2) = small[0], small[-1]
        if len(small) < 2 or e1 == e2:
            (n1, e1, t1), (n2, e2, t2) = adam[0], adam[-1]
            flat = []
        a = np.array([[n1, n1 * e1], [n2, n2 * e2]], dtype=float)
        per_tensor, per_param = np.linalg.solve(a, [t1, t2])
        out["adam_tensor_s"] = float(max(per_tensor, 0.0))
        out["adam_param_s"] = float(max(per_param, 0.0))
        if flat:
            n3, e3, t3 = flat[-1]
            out["adam_flat_numel"], out["adam_small_numel"] = int(e3), int(e2)
            out["adam_flat_param_s"] = float(max(t3 - n3 * out["adam_tensor_s"], 0.0)) / (n3 * e3)
    return out


def measured_device(tables: dict) -> str:
    """The device a profile measured: its CUDA device when it has one, else the CPU."""
    devs = {g["device"] for g in tables.get("gemm", [])}
    for d in sorted(devs):
        if d.startswith("cuda"):
            return d
    if "cpu" in devs:
        return "cpu"
    raise ConfigError("profile", f"profile run {tables.get('run_id')} has no GEMM measurements",
                      accepted="run `paraplan profile --quick` first")


@dataclass
class ProfiledCurves:
    """Efficiency curves from a measured profile (see the module docstring)."""
    name: str
    device: str
    kernel_overhead_s: float
    gemm: Mapping[str, LogLogCurve]
    sdpa: LogLogCurve | None
    memory_bandwidth_bytes_per_s: float
    cpu_adam_memory_efficiency: float
    gpu_adam_bytes_per_param: float
    sources: Mapping[str, str] = field(default_factory=dict)
    run_id: int | None = None
    fingerprint: str | None = None
    launch_overhead_s: float | None = None
    compute_slowdown: float = 1.0
    #: the measured transformer block at this world size, ``{"shape": {hidden, heads, seq, batch},
    #: "time_s"}`` (None: not measured), and the factor on the kernels' measured work that makes the
    #: estimator reproduce it (:func:`paraplan.costmodels.efficiency.with_reference_block`; None: not
    #: solved yet, counts as 1)
    reference_block: Mapping | None = None
    composition_factor: float | None = None
    adam_time_per_tensor_s: float | None = None
    adam_time_per_param_s: float | None = None
    #: AdamW's cost per element in one flat tensor of ``adam_flat_numel`` elements (None: not measured)
    adam_time_per_param_flat_s: float | None = None
    adam_flat_numel: int = 0
    adam_small_numel: int = 0
    world_size: int | None = None
    elementwise_bandwidth_bytes_per_s: float | None = None
    checkpoint_region_s: float = 0.0
    checkpoint_kernel_s: float = 0.0
    #: op-level SAC's machinery per region and per kernel (None: not measured, the checkpoint figures stand in)
    sac_region_s: float | None = None
    sac_kernel_s: float | None = None
    #: FSDP2's own cost per wrapped unit and micro-batch (hooks, DTensor bookkeeping, buffer copies)
    fsdp_unit_overhead_s: float = 0.0
    #: FSDP2's extra optimizer-step cost per (DTensor) parameter tensor, measured; 0 where not
    fsdp_adam_tensor_overhead_s: float = 0.0
    #: host seconds per call of the tensor-parallel collectives' autograd wrappers (``tp`` rows,
    #: :func:`tp_wrapper_call_fit`); 0 where not measured
    tp_call_overhead_s: float = 0.0
    #: routed experts' GEMMs: the measured time of experts run one after another over that of one MLP
    #: of their FLOPs, at ``routed_tokens`` tokens per expert (``routed`` rows); None where not measured
    routed_factor: float | None = None
    routed_tokens: int = 0
    #: fitted factors of a calibrated profile ({knob: factor}; empty: the measurements as they are)
    calibration: Mapping[str, float] = field(default_factory=dict, compare=False)

    kind = "profiled"

    def factor(self, knob: str) -> float:
        """The calibrated factor on ``knob`` (gemm, attention, memory, kernel, optimizer; 1 when not calibrated)."""
        return float(self.calibration.get(knob, 1.0))

    def uncalibrated(self) -> "ProfiledCurves":
        """These curves without their calibration factors (the measurements as they are)."""
        if not self.calibration:
            return self
        k = self.factor("kernel")
        return replace(self, calibration={}, kernel_overhead_s=self.kernel_overhead_s / k,
                       launch_overhead_s=None if self.launch_overhead_s is None else self.launch_overhead_s / k)

    @classmethod
    def from_tables(cls, tables: dict, name: str = "local", world_size: int | None = None) -> "ProfiledCurves":
        """Build from :func:`paraplan.profiles.store.measured_tables`; ``world_size`` picks the
        training-step measurements taken with that many ranks busy (nearest measured)."""
        dev = measured_device(tables)
        same = lambda d: d == dev or (d.startswith("cuda") and dev.startswith("cuda"))
        by_dtype: dict[str, list] = {}
        # the training layouts of a Linear (forward, input and weight gradients) when measured:
        # the rate a training step's GEMMs get; else square a @ b
        linear = [g for g in tables.get("gemm_linear", []) if same(g["device"]) and g.get("flops_per_s")]
        for g in linear or tables.get("gemm", []):
            if same(g["device"]):
                dt = DTYPE_NAMES.get(g["dtype"], g["dtype"])
                by_dtype.setdefault(dt, []).append((g["flops"], g["flops"] / g["flops_per_s"]))
        all_points = [p for pts in by_dtype.values() for p in pts]
        best = max(by_dtype, key=lambda d: max(f / t for f, t in by_dtype[d]))
        t0, t0_source = _kernel_overhead(tables, dev, by_dtype.get("fp32") or by_dtype[best] or all_points)
        gemm = {dt: LogLogCurve.from_points(pts, t0) for dt, pts in by_dtype.items()}
        sd = [(s["flops"], s["flops"] / s["flops_per_s"]) for s in tables.get("sdpa", [])
              if same(s["device"]) and s.get("flops_per_s")]
        bw = (tables.get("memory_bandwidth") or {}).get(dev)
        if not bw:
            bw = next(iter((tables.get("memory_bandwidth") or {}).values()), None)
        if not bw:
            raise ConfigError("profile", "the profile has no memory-bandwidth measurement",
                              accepted="run `paraplan profile --quick` first")
        default = curve_table()["default"]
        ew = elementwise_bandwidth(tables, dev)
        train = training_measurements(tables, dev, world_size)
        launch = t0
        sources_train = {}
        if train.get("kernel_s"):
            t0 = train["kernel_s"]
            sources_train = {"kernel_overhead_s": f"measured: median per-kernel cost of tiny ops forward + "
                             f"backward under autograd, {train['world']} rank(s) busy",
                             "launch_overhead_s": t0_source,
                             "compute_slowdown": f"measured: transformer block fwd+bwd with {train['world']} rank(s) busy / alone",
                             "adam": "measured: AdamW (foreach=False) steps of 64 x 64 and 16 x 2^16 elements"
                                     + (" and 1 x 2^21 (per element in large tensors)"
                                        if train.get("adam_flat_param_s") is not None else "")}
            if train.get("routed_factor"):
                sources_train["routed_experts"] = (
                    f"measured: routed experts one after another over one MLP of their FLOPs, "
                    f"{train['routed_factor']:.2f}x at {train['routed_tokens']} tokens per expert")
            if "checkpoint_kernel_s" in train:
                sources_train["recompute_overhead"] = (
                    "measured: regions of 4 and 16 tiny ops under non-reentrant torch.utils.checkpoint "
                    "minus plain forward + backward minus forward")
            if "tp_call_s" in train:
                sources_train["tp_call_overhead_s"] = (
                    "measured: the tensor-parallel autograd wrappers (reduce-from-tp, copy-to-tp) chained "
                    "after a tiny op, forward + backward, minus the op alone, per call")
            if "sac_kernel_s" in train:
                sources_train["op_sac_overhead"] = (
                    "measured: the same regions under a selective-checkpoint policy that keeps every output, "
                    "minus plain forward + backward")
        kernel = float((tables.get("calibration") or {}).get("kernel", 1.0))   # a calibrated profile's factor
        return cls(
            name=name, device=dev, kernel_overhead_s=t0 * kernel, gemm=gemm,
            launch_overhead_s=launch * kernel, compute_slowdown=train.get("slowdown", 1.0),
            reference_block=train.get("block"),
            adam_time_per_tensor_s=train.get("adam_tensor_s"), adam_time_per_param_s=train.get("adam_param_s"),
            adam_time_per_param_flat_s=train.get("adam_flat_param_s"),
            adam_flat_numel=train.get("adam_flat_numel", 0), adam_small_numel=train.get("adam_small_numel", 0),
            world_size=train.get("world"), elementwise_bandwidth_bytes_per_s=ew,
            checkpoint_region_s=train.get("checkpoint_region_s", 0.0),
            fsdp_unit_overhead_s=train.get("fsdp_unit_s", 0.0),
            fsdp_adam_tensor_overhead_s=train.get("fsdp_adam_tensor_s", 0.0),
            tp_call_overhead_s=train.get("tp_call_s", 0.0),
            checkpoint_kernel_s=train.get("checkpoint_kernel_s", 0.0),
            sac_region_s=train.get("sac_region_s"), sac_kernel_s=train.get("sac_kernel_s"),
            routed_factor=train.get("routed_factor"), routed_tokens=train.get("routed_tokens", 0),
            sdpa=LogLogCurve.from_points(sd, t0) if sd else None,
            memory_bandwidth_bytes_per_s=float(bw),
            cpu_adam_memory_efficiency=default["cpu_adam_memory_efficiency"],
            gpu_adam_bytes_per_param=default["gpu_adam_bytes_per_param"],
            sources={"kernel_overhead_s": t0_source,
                     "gemm": ("measured training-layout GEMMs (x Wt, g W, gt x)" if linear else "measured GEMM")
                     + " time per FLOPs, log-log interpolation, rate clamped at the ends",
                     "attention": "measured causal SDPA forward" if sd else
                     "no SDPA measurement: the GEMM curve of the dtype",
                     "memory": ("measured eager elementwise kernels (GELU, LayerNorm, scale-mask-softmax, "
                                "cross-entropy; forward + backward, the estimator's bytes per element), "
                                "capped by the device copy bandwidth") if ew else
                     "measured device copy bandwidth (read + write bytes)",
                     "cpu_adam_memory_efficiency": "curves.yaml default (not measured)",
                     "gpu_adam_bytes_per_param": "curves.yaml default (not measured)", **sources_train},
            run_id=tables.get("run_id"), fingerprint=tables.get("fingerprint"),
            calibration=dict(tables.get("calibration") or {}))

    # ------------------------------------------------------------------ lookups
    def resolve_dtype(self, dtype: str) -> str:
        """The measured dtype used for ``dtype`` (itself, or the nearest measured one)."""
        if dtype in self.gemm:
            return dtype
        for alt in NEAREST.get(dtype, ()):
            if alt in self.gemm:
                return alt
        return next(iter(self.gemm))

    def peak_flops(self, dtype: str) -> float:
        """Best achieved GEMM FLOP/s measured for ``dtype`` (t0 included, as measured)."""
        c = self.gemm[self.resolve_dtype(dtype)]
        f = np.asarray(c.flops)
        return float(np.max(f / (np.asarray(c.excess_s) + self.launch_s)))

    @property
    def launch_s(self) -> float:
        """Seconds to launch one op without autograd: the measured 1-element add, else the
        per-kernel cost."""
        return self.kernel_overhead_s if self.launch_overhead_s is None else self.launch_overhead_s

    # ------------------------------------------------------------------ AnalyticalCurves interface
    def gemm_time(self, m, n, k, dtype: str = "bf16", count=1):
        """Seconds for ``count`` GEMMs of shape (m x k) @ (k x n)."""
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        flops = 2.0 * m * n * k
        curve = self.gemm[self.resolve_dtype(dtype)]
        return count * (self.kernel_overhead_s + self.work_factor * self.factor("gemm") * curve(flops))

    @property
    def memory_bound_bytes_per_s(self) -> float:
        """The rate memory-bound kernels stream at: the measured elementwise rate when the profile
        has it, never above the copy bandwidth; else the copy bandwidth."""
        bw = self.memory_bandwidth_bytes_per_s
        ew = self.elementwise_bandwidth_bytes_per_s
        return min(bw, ew) if ew else bw

    def memory_time(self, nbytes, kernels=1):
        """Seconds for memory-bound kernels moving ``nbytes`` (the estimator's accounting) in
        ``kernels`` launches, at :attr:`memory_bound_bytes_per_s`."""
        return kernels * self.kernel_overhead_s + \
            self.work_factor * self.factor("memory") * np.asarray(nbytes, dtype=float) / self.memory_bound_bytes_per_s

    def streaming_time(self, nbytes, kernels=1):
        """Seconds for plain streaming kernels (an in-place add, a copy) moving ``nbytes``: the
        measured copy bandwidth and the 1-element op's launch cost per kernel (no autograd: what
        ``AccumulateGrad`` runs). Unlike :meth:`memory_time` they do no erf/exp work, which on a
        CPU core makes GELU, softmax and the norms several times slower per byte."""
        return kernels * self.launch_s + self.work_factor * np.asarray(nbytes, dtype=float) / self.memory_bandwidth_bytes_per_s

    def grouped_gemm_time(self, m, n, k, groups, dtype: str = "bf16"):
        """Seconds for the routed experts' GEMMs of one layer: ``groups`` GEMMs of m tokens, one per
        expert as the harness runs them (each its launch), their work slowed by the measured routed
        factor r (``routed`` rows: experts one after another against one MLP of their FLOPs, at m0
        tokens per expert): ``groups · (t0 + f(m) · W(2mnk))`` with f(m) = 1 + (r − 1) · min(1, m0/m),
        the excess treated as a cost per expert GEMM, which more tokens amortise. Without the rows
        (f = 1) this is ``gemm_time(count=groups)``."""
        m = np.asarray(m, dtype=float)
        base = self.gemm_time(m, n, k, dtype, count=groups)
        if not self.routed_factor or not self.routed_tokens:
            return base
        f = 1.0 + (self.routed_factor - 1.0) * np.minimum(1.0, self.routed_tokens / np.maximum(m, 1.0))
        overhead = np.asarray(groups, dtype=float) * self.kernel_overhead_s
        return overhead + f * (base - overhead)

    def flash_attention_time(self, flops, dtype: str = "bf16", kernels=1):
        """Seconds for fused attention executing ``flops`` (measured SDPA rate)."""
        curve = self.sdpa if self.sdpa is not None else self.gemm[self.resolve_dtype(dtype)]
        return kernels * self.kernel_overhead_s + self.work_factor * self.factor("attention") * curve(flops)

    @property
    def work_factor(self) -> float:
        """What multiplies every measured kernel's work (beyond its per-kernel cost): the contention
        slowdown of ranks sharing the device times the reference block's composition factor."""
        return self.compute_slowdown * (self.composition_factor or 1.0)

    def adam_step_time(self, params, tensors):
        """Seconds of an AdamW step over ``params`` elements in ``tensors`` tensors (measured);
        None when the profile has no optimizer measurement (the estimator's formula applies)."""
        if self.adam_time_per_tensor_s is None:
            return None
        tensors = np.asarray(tensors, dtype=float)
        params = np.asarray(params, dtype=float)
        return self.factor("optimizer") * (tensors * self.adam_time_per_tensor_s +
                                           params * self.adam_per_param_time(params / np.maximum(tensors, 1.0)))

    def adam_per_param_time(self, elements_per_tensor):
        """AdamW's seconds per element at ``elements_per_tensor``: the small-tensor fit, moving
        log-linearly to the flat-tensor figure between their sizes when that was measured."""
        b = self.adam_time_per_param_s
        if self.adam_time_per_param_flat_s is None or not self.adam_flat_numel > self.adam_small_numel > 0:
            return np.full(np.shape(elements_per_tensor), b, dtype=float)
        lo, hi = np.log(self.adam_small_numel), np.log(self.adam_flat_numel)
        w = np.clip((np.log(np.maximum(elements_per_tensor, 1.0)) - lo) / (hi - lo), 0.0, 1.0)
        return b + w * (self.adam_time_per_param_flat_s - b)

    def recompute_overhead_time(self, kernels):
        """Seconds activation checkpointing adds to one recomputed region of ``kernels`` forward
        kernels beyond re-running them (measured: per region + per kernel; 0 for profiles
        without checkpoint rows)."""
        return self.checkpoint_region_s + np.asarray(kernels, dtype=float) * self.checkpoint_kernel_s

    def op_sac_overhead_time(self, kernels):
        """Seconds op-level SAC's machinery adds to one checkpointed region of ``kernels`` forward
        kernels beyond recomputing what it does not keep: its dispatch mode runs every op through
        Python in the forward and replays every op from its cache in the backward (measured: per
        region + per kernel); profiles without the measurement charge plain checkpointing's."""
        if self.sac_region_s is None or self.sac_kernel_s is None:
            return self.recompute_overhead_time(kernels)
        return self.sac_region_s + np.asarray(kernels, dtype=float) * self.sac_kernel_s

    def describe(self) -> dict:
        fallbacks = {d: self.resolve_dtype(d) for d in ("fp32", "bf16", "fp16")
                     if self.resolve_dtype(d) != d}
        return {"kind": self.kind, "accelerator": self.name, "device": self.device,
                "profile_run": self.run_id, "fingerprint": self.fingerprint,
                "kernel_overhead_us": self.kernel_overhead_s * 1e6,
                "launch_overhead_us": None if self.launch_overhead_s is None else self.launch_overhead_s * 1e6,
                "compute_slowdown": self.compute_slowdown, "training_world_size": self.world_size,
                "composition_factor": self.composition_factor,
                "adam_us_per_tensor": None if self.adam_time_per_tensor_s is None
                else self.adam_time_per_tensor_s * 1e6,
                "adam_ns_per_param": None if self.adam_time_per_param_s is None
                else self.adam_time_per_param_s * 1e9,
                "adam_ns_per_param_flat": None if self.adam_time_per_param_flat_s is None
                else self.adam_time_per_param_flat_s * 1e9,
                "checkpoint_us_per_region": self.checkpoint_region_s * 1e6,
                "fsdp_us_per_unit": self.fsdp_unit_overhead_s * 1e6,
                "fsdp_adam_us_per_tensor": self.fsdp_adam_tensor_overhead_s * 1e6,
                "tp_wrapper_us_per_call": self.tp_call_overhead_s * 1e6,
                "checkpoint_us_per_kernel": self.checkpoint_kernel_s * 1e6,
                "op_sac_us_per_region": None if self.sac_region_s is None else self.sac_region_s * 1e6,
                "op_sac_us_per_kernel": None if self.sac_kernel_s is None else self.sac_kernel_s * 1e6,
                "gemm_dtypes_measured": sorted(self.gemm),
                "dtype_fallbacks": fallbacks,
                "gemm_best_gflops": {d: self.peak_flops(d) / 1e9 for d in sorted(self.gemm)},
                "memory_bandwidth_gb_per_s": self.memory_bandwidth_bytes_per_s / 1e9,
                "elementwise_gb_per_s": None if self.elementwise_bandwidth_bytes_per_s is None
                else self.elementwise_bandwidth_bytes_per_s / 1e9,
                "sdpa_measured": self.sdpa is not None,
                "calibration": dict(self.calibration),
                "cpu_adam_memory_efficiency": self.cpu_adam_memory_efficiency,
                "sources": dict(self.sources)}
