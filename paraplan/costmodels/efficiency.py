"""Efficiency curves: achieved time of GEMMs, memory-bound kernels and fused attention.

Formulas (each evaluated over numpy arrays as well as scalars):

* GEMM ``C[m,n] += A[m,k] B[k,n]``: ``t = t0 + 2mnk / (peak · η_plateau · f_sustained · η_wave)`` with
  η_plateau the best-shape benchmark (MAMF), f_sustained the fraction of it a training step sustains,
  ``η_wave = (C/S) / ceil(C/S)``, ``C = ceil(m/Tm)·ceil(n/Tn)`` output tiles over S SMs
  (NVIDIA Matrix Multiplication Background User's Guide §3). Where the
  accelerator's GEMM library splits the K loop across SMs (stream-K / split-K scheduling,
  ``gemm_split_k`` in curves.yaml: Hopper, measured), the units that fill the waves are the tiles'
  K iterations, ``C = ceil(m/Tm)·ceil(n/Tn)·ceil(k/Tk)`` (Osama et al. 2023, arXiv:2301.03598).
  A linear layer's GEMM takes at least the time to move its operands and output once
  (:meth:`AnalyticalCurves.gemm_memory_time`, a per-op roofline): it binds on thin projections only.
* memory-bound kernels: ``t = kernels · t0 + bytes / (BW_hbm · η_mem)``.
* fused attention (FlashAttention): ``t = t0 + F / (peak · η_flash)``, times
  :meth:`AnalyticalCurves.softmax_exp_time_factor` on a part whose softmax exponentials run faster than
  its generation's (Blackwell Ultra).

The curve parameters are data (``curves.yaml``), per accelerator; a profiled table measured by
``paraplan profile`` can stand in for them (same methods).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from paraplan.costmodels import compute as C
from paraplan.costmodels.curvefile import attention_table_for, curve_table
from paraplan.costmodels.kernels import GEMM_OPERAND_BYTES
from paraplan.costmodels.profiled import ProfiledCurves
from paraplan.hardware.model import Accelerator, MeasuredProfile
from paraplan.plan import Plan, gemm_dtype
from paraplan.workloads.transformer import TrainingJob, TransformerModel


@dataclass(frozen=True)
class AnalyticalCurves:
    """Efficiency parameters for one accelerator (see curves.yaml for their sources)."""
    accelerator: Accelerator
    kernel_overhead_s: float
    gemm_tile_m: int
    gemm_tile_n: int
    memory_efficiency: float
    flash_attention_efficiency: float
    cpu_adam_memory_efficiency: float
    gpu_adam_bytes_per_param: float
    gemm_sustained_fraction: float = 1.0
    #: share of MAMF that isolated GEMMs reached on a GPU of the generation measured here (a lent GPU's
    #: kernel reference profile); None where none was measured. Only comparisons with isolated kernel
    #: measurements use it (:func:`isolated_kernel_curves`); a training step sustains
    #: ``gemm_sustained_fraction`` of MAMF, calibrated on published runs
    gemm_isolated_fraction: float | None = None
    #: True where the part has no GEMM level of its own in curves.yaml and takes the default (A100's)
    gemm_level_borrowed: bool = field(default=False, compare=False)
    #: the GEMM library balances K iterations over the SMs (stream-K / split-K): waves count tiles x
    #: ceil(k / gemm_tile_k) work units instead of output tiles
    gemm_split_k: bool = False
    gemm_tile_k: int = 64
    fp8_recipe_gemm_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: share of the generation's fused-attention time (head dim 128) that is the softmax's exponentials
    #: (curves.yaml: derived from tensor FLOPs and SFU exponentials per clock per SM) and how many times
    #: faster this part runs them than its generation (Blackwell Ultra: 2)
    attention_exp_share: float = 0.0
    attention_exp_speedup: float = 1.0
    streaming_efficiency: float = 0.5
    fp8_cast_efficiency: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: measured fused-attention efficiency by kernel and sequence length (attention_kernels.yaml) for
    #: plans that name a kernel (``--attention-kernel``); None where the generation has no table
    attention_table: Mapping | None = field(default=None, compare=False)
    #: what the curves of this part leave unpriced, said with every estimate on it (curves.yaml ``caveat``)
    caveat: str | None = field(default=None, compare=False)
    #: factors `paraplan calibrate` fitted on a cluster of this part (the accelerator's ``calibration``):
    #: ``gemm`` multiplies the GEMMs' arithmetic time, ``attention`` fused attention's, ``memory`` the
    #: memory-bound kernels' byte time, ``optimizer`` the Adam step's; ``kernel`` is in ``kernel_overhead_s``
    calibration: Mapping[str, float] = field(default_factory=dict, compare=False)

    kind = "analytical"

    def factor(self, knob: str) -> float:
        """The calibration factor on ``knob`` (1 where none was fitted)."""
        return float(self.calibration.get(knob, 1.0))

    @property
    def gemm_wave_units(self) -> str:
        """What a GEMM's waves count (gemm_split_k): output tiles, or tiles x K iterations."""
        return "tiles x K iterations (split-K)" if self.gemm_split_k else "output tiles"

    def tensor_peak(self, dtype: str) -> float:
        """The dense peak that tensor-core work (GEMMs, fused attention) runs against on this part: the
        catalogue peak times the part's power-limited clock factor
        (:meth:`~paraplan.hardware.model.Accelerator.power_limited_clock_factor`, 1 unless the part runs
        below the power its plateau was measured at). MFU stays against the catalogue peak."""
        acc = self.accelerator
        return acc.peak(dtype) * acc.power_limited_clock_factor()

    def _tensor_core_time(self, m, n, k, dtype: str, groups=1.0):
        """Seconds of the arithmetic of one launch computing ``groups`` (m x k)·(k x n) products:
        2·g·m·n·k / (peak · plateau · sustained · η_wave), every group's output tiles (or, with
        ``gemm_split_k``, their K iterations) in the waves; peak is :meth:`tensor_peak`."""
        acc = self.accelerator
        flops = 2.0 * groups * m * n * k
        plateau = acc.plateau(dtype) * self.gemm_sustained_fraction
        return self.factor("gemm") * flops / (self.tensor_peak(dtype) * plateau * self.wave_efficiency(m, n, k, groups))

    def wave_efficiency(self, m, n, k, groups=1.0):
        """η_wave = (C/S) / ceil(C/S): the fill of the waves of C work units over S SMs, with C the
        output tiles of ``groups`` (m x k)·(k x n) products, times their K iterations with ``gemm_split_k``."""
        units = groups * np.ceil(m / self.gemm_tile_m) * np.ceil(n / self.gemm_tile_n)
        if self.gemm_split_k:
            units = units * np.ceil(np.asarray(k, dtype=float) / self.gemm_tile_k)
        waves = units / self.accelerator.streaming_multiprocessors
        return waves / np.ceil(waves)

    def gemm_time(self, m, n, k, dtype: str = "bf16", count=1):
        """Seconds for ``count`` GEMMs of shape (m x k) @ (k x n)."""
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        return count * (self.kernel_overhead_s + self._tensor_core_time(m, n, k, dtype))

    def gemm_memory_time(self, m, n, k, dtype: str = "bf16"):
        """Seconds one (m x k)·(k x n) GEMM needs at least to move its operands and its output through
        HBM once, at the streaming rate: (mk + kn)·w_in + mn·w_out bytes, w_in the format's width (fp8
        1, NVFP4 0.5625 with its block scales, 16-bit 2, fp32 4) and w_out 2 for fp8 and fp4 GEMMs (bf16
        output), else w_in. The memory side of a
        per-op roofline, max(compute, memory) (cli99/llm-analysis @ d841e40 analysis.py, per-op latency;
        calculon-ai/calculon @ caa4b11 calculon/system.py, ``roofline`` mode): it binds only on thin GEMMs, whose
        arithmetic intensity 2mnk / bytes falls below peak FLOP/s over HBM bandwidth (H100 bf16: ~200
        FLOP per byte at the curves' rates), e.g. a 128-wide key or value projection."""
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        w_in = GEMM_OPERAND_BYTES.get(dtype, 2.0)
        w_out = 2.0 if dtype in ("fp8", "fp4") else w_in
        return self.streaming_time((m * k + k * n) * w_in + m * n * w_out, kernels=0)

    def grouped_gemm_time(self, m, n, k, groups, dtype: str = "bf16"):
        """Seconds for one grouped GEMM: ``groups`` products (m x k)·(k x n) in a single launch (the
        routed experts of an MoE layer under Megatron-Core/Transformer Engine grouped GEMM or
        ``torch._grouped_mm``). All groups' output tiles share the waves, and with few tokens per
        group the weights must still be read once each, so

            t = t0 + max(2·g·m·n·k / (peak · plateau · η_wave(g·tiles)), g·(nk + mk + mn)·bytes / (BW · streaming)).

        Measured on the lent H100 (reference profile, ``moe``): DeepSeek-V3 experts at 128 tokens
        each, 32 per GPU, 1.07 ms grouped where per-expert GEMMs priced 3.6 ms; at 2048 tokens and
        more the two agree (0.9-1.05)."""
        m, n, k, g = (np.asarray(x, dtype=float) for x in (m, n, k, groups))
        compute = self._tensor_core_time(m, n, k, dtype, g)
        width = GEMM_OPERAND_BYTES.get(dtype, 2.0)
        stream = self.streaming_time(g * (n * k + m * k + m * n) * width, kernels=0)
        return self.kernel_overhead_s + np.maximum(compute, stream)

    def _hbm_time(self, nbytes, kernels, efficiency: float):
        """``kernels`` launches moving ``nbytes`` through HBM at ``efficiency`` of its bandwidth."""
        bw = self.accelerator.memory_bandwidth_bytes_per_s * efficiency
        return kernels * self.kernel_overhead_s + self.factor("memory") * np.asarray(nbytes, dtype=float) / bw

    def memory_time(self, nbytes, kernels=1):
        """Seconds to stream ``nbytes`` through HBM in ``kernels`` launches."""
        return self._hbm_time(nbytes, kernels, self.memory_efficiency)

    def streaming_time(self, nbytes, kernels=1):
        """Seconds for plain streaming kernels (an add, a copy, an fp8 cast: no transcendental work)
        moving exactly ``nbytes``: HBM at ``streaming_efficiency`` of its bandwidth."""
        return self._hbm_time(nbytes, kernels, self.streaming_efficiency)

    def fp8_cast_time(self, nbytes, kernels=1):
        """Seconds for fp8 quantization kernels (amax, scale-cast, cast-transpose) moving exactly
        ``nbytes``: HBM at ``fp8_cast_efficiency`` (measured on an H100: the cast-transpose writes
        its transposed copy with strided stores), else at the streaming rate."""
        eff = self.streaming_efficiency if self.fp8_cast_efficiency is None else self.fp8_cast_efficiency
        return self._hbm_time(nbytes, kernels, eff)

    def flash_attention_time(self, flops, dtype: str = "bf16", kernels=1):
        """Seconds for fused attention executing ``flops`` (against :meth:`tensor_peak`)."""
        peak = self.tensor_peak(dtype) * self.flash_attention_efficiency
        return kernels * self.kernel_overhead_s + self.factor("attention") * np.asarray(flops, dtype=float) / peak

    def softmax_exp_time_factor(self, head_dim) -> float:
        """Fused attention time on this part over its generation's, from its exponentials' speedup:
        with x the generation's exponential share of the kernel's ideal time at head dim 128
        (``attention_exp_share``), exponentials over tensor work at head dim d are
        r = x / (1 - x) · 128 / d (the tensor FLOPs per score grow with d, the exponentials do not),
        their share is r / (1 + r), and the time is (1 - share) + share / speedup. 1 where the part
        runs its generation's exponentials."""
        x, speedup = self.attention_exp_share, self.attention_exp_speedup
        if x <= 0 or speedup == 1:
            return 1.0
        r = x / (1 - x) * 128.0 / float(head_dim)
        share = r / (1 + r)
        return (1 - share) + share / speedup

    def recompute_overhead_time(self, kernels):
        """Seconds activation checkpointing adds per recomputed region beyond the recomputed
        kernels: 0 here. On a GPU the host-side bookkeeping of the replay overlaps the device's
        kernels (a CPU device pays it: the profiled curves measure it)."""
        return np.zeros_like(np.asarray(kernels, dtype=float))

    def op_sac_overhead_time(self, kernels):
        """Seconds op-level SAC's dispatch mode adds per checkpointed region: 0 here, host work a GPU's
        kernels hide (the profiled curves measure it on a CPU)."""
        return np.zeros_like(np.asarray(kernels, dtype=float))

    def describe(self) -> dict:
        acc = self.accelerator
        return {"kind": self.kind, "accelerator": acc.name,
                "gemm_plateau_efficiency": acc.gemm_plateau_efficiency,
                "gemm_sustained_fraction": self.gemm_sustained_fraction,
                **({"gemm_isolated_fraction": self.gemm_isolated_fraction}
                   if self.gemm_isolated_fraction is not None else {}),
                **({"caveat": self.caveat} if self.caveat else {}),
                **({"power_limit_w": acc.power_limit_w, "rated_power_w": acc.rated_power_w,
                    "power_limited_clock_factor": acc.power_limited_clock_factor()}
                   if acc.power_limited_clock_factor() != 1.0 else {}),
                "gemm_wave_units": self.gemm_wave_units,
                **({"calibration": dict(self.calibration)} if self.calibration else {}),
                "kernel_overhead_us": self.kernel_overhead_s * 1e6,
                "memory_efficiency": self.memory_efficiency,
                "streaming_efficiency": self.streaming_efficiency,
                "fp8_cast_efficiency": self.fp8_cast_efficiency,
                "flash_attention_efficiency": self.flash_attention_efficiency,
                **({"attention_exp_share": self.attention_exp_share,
                    "attention_exp_speedup": self.attention_exp_speedup} if self.attention_exp_speedup != 1 else {}),
                "cpu_adam_memory_efficiency": self.cpu_adam_memory_efficiency,
                **({"attention_kernels_measured": {k: dict(zip(self.attention_table["seq"], v))
                                                   for k, v in self.attention_table["kernels"].items()}}
                   if self.attention_table else {}),
                **({"gemm_plateau_efficiency_fp8": acc.plateau("fp8"),
                    "fp8_recipe_gemm_efficiency": dict(self.fp8_recipe_gemm_efficiency)}
                   if "fp8" in acc.peak_flops else {})}


def analytical_curves(accelerator: Accelerator) -> AnalyticalCurves:
    """The analytical curves for an accelerator: its entry in curves.yaml over the default."""
    table = curve_table()
    entry = dict(table["default"])
    specific = table.get(accelerator.name) or {}
    sources = {**entry.pop("sources", {}), **specific.get("sources", {})}
    entry.update({k: v for k, v in specific.items() if k != "sources"})
    calibration = dict(getattr(accelerator, "calibration", None) or {})
    return AnalyticalCurves(
        accelerator=accelerator, calibration=calibration,
        kernel_overhead_s=entry["kernel_overhead_us"] * 1e-6 * float(calibration.get("kernel", 1.0)),
        gemm_tile_m=entry["gemm_tile_m"], gemm_tile_n=entry["gemm_tile_n"],
        memory_efficiency=entry["memory_efficiency"],
        flash_attention_efficiency=entry["flash_attention_efficiency"],
        cpu_adam_memory_efficiency=entry["cpu_adam_memory_efficiency"],
        gpu_adam_bytes_per_param=entry["gpu_adam_bytes_per_param"],
        gemm_sustained_fraction=entry.get("gemm_sustained_fraction", 1.0),
        gemm_isolated_fraction=entry.get("gemm_isolated_fraction"),
        gemm_level_borrowed="gemm_sustained_fraction" not in specific,
        gemm_split_k=bool(entry.get("gemm_split_k", False)), gemm_tile_k=int(entry.get("gemm_tile_k", 64)),
        fp8_recipe_gemm_efficiency=dict(entry.get("fp8_recipe_gemm_efficiency", {})),
        streaming_efficiency=entry.get("streaming_efficiency", entry["memory_efficiency"]),
        fp8_cast_efficiency=entry.get("fp8_cast_efficiency"), sources=sources,
        attention_table=attention_table_for(accelerator.name), caveat=entry.get("caveat"),
        attention_exp_share=float(entry.get("attention_exp_share", 0.0)),
        attention_exp_speedup=float(entry.get("attention_exp_speedup", 1.0)))


def isolated_kernel_curves(curves: AnalyticalCurves) -> AnalyticalCurves:
    """``curves`` at the GEMM rate isolated kernels reach (``gemm_isolated_fraction`` of MAMF, measured on
    a lent GPU), for comparisons with isolated kernel and layer measurements; unchanged where the
    generation has no such measurement."""
    if curves.gemm_isolated_fraction is None:
        return curves
    return replace(curves, gemm_sustained_fraction=curves.gemm_isolated_fraction)


def curves_for(cluster_or_accelerator):
    """The curves the estimator uses by default: those of the profile a measured device carries
    (:class:`~paraplan.hardware.model.MeasuredProfile`, attached by ``load_cluster('local' |
    'profile:NAME')``), else the analytical ones of curves.yaml. Given a cluster, a profile's curves
    come with their composition factor solved (:func:`with_reference_block`), so every caller
    (estimate, the search, the stage balancer) charges the same layer."""
    acc = getattr(cluster_or_accelerator, "accelerator", cluster_or_accelerator)
    measured = getattr(acc, "measured", None)
    if measured is None:
        return analytical_curves(acc)
    curves = measured_curves(measured)
    return with_reference_block(curves, cluster_or_accelerator) if acc is not cluster_or_accelerator else curves


@functools.lru_cache(maxsize=16)
def measured_curves(profile: MeasuredProfile) -> ProfiledCurves:
    """The efficiency curves of a measured profile (built once per profile object)."""
    return ProfiledCurves.from_tables(profile.tables, name=profile.name, world_size=profile.world_size)


#: the composition factor is kept within these bounds: beyond them the block or a kernel was
#: measured while something else ran, and the kernels' own figures are the better guess
COMPOSITION_FACTOR_BOUNDS = (0.8, 1.25)


def reference_block_model(shape: Mapping):
    """(model, job, plan) the estimator reads the profile's reference block as: one layer of the
    validation harness's GPT (LayerNorm, GELU MLP of 4 x hidden, biases, unfused attention, fp32),
    ``batch`` sequences of ``seq`` tokens, forward + backward on one rank."""
    h, seq = int(shape["hidden"]), int(shape["seq"])
    model = TransformerModel(name="reference-block", layers=1, hidden=h, heads=int(shape["heads"]), vocab=256,
                             ffn_hidden=4 * h, activation="gelu", tied_embeddings=False, norm="layernorm",
                             bias=True, learned_positions=True, max_positions=seq)
    batch = int(shape.get("batch", 1))
    return model, TrainingJob(seq, batch), Plan(micro_batch=batch, dtype="fp32", flash_attention=False)


def with_reference_block(curves, cluster):
    """``curves`` with ``composition_factor`` solved, where a profile of a CPU measured its reference
    block (a whole transformer layer, forward + backward, at the curves' world size, all ranks busy):
    the factor f on every kernel's measured work (what ``compute_slowdown`` scales, beyond the
    per-kernel costs) with which the estimator's layer equals the measured one,

        block = A + slowdown · f · B,   f = (block − A) / (slowdown · B),

    A the layer's per-kernel costs and B its work at slowdown 1, both from
    :func:`paraplan.costmodels.compute.layer_times`; bounded by COMPOSITION_FACTOR_BOUNDS. What it
    absorbs is what composing separately timed kernels misses in a real layer: the caches a layer's
    working set evicts between kernels, allocations, the moments each was timed at (2-core
    development machine, three profiles: the block measured 2-17 % above the composition, and
    validate's forward + backward 2-10 % above the prediction). Left at 1 on a GPU, where a layer of
    this size is launch-bound and says nothing about the kernels' work, and without the block."""
    block = getattr(curves, "reference_block", None)
    if getattr(curves, "composition_factor", 1.0) is not None:
        return curves
    if not block or not str(getattr(curves, "device", "")).startswith("cpu"):
        return replace(curves, composition_factor=1.0)
    model, job, plan = reference_block_model(block["shape"])

    def layer(slowdown):
        # on the measurements as they are: a calibrated profile's factors apply on top of the solved factor
        lt = C.layer_times(model, job, plan, replace(curves.uncalibrated(), compute_slowdown=slowdown,
                                                     composition_factor=1.0), cluster)
        return float(lt["forward"] + lt["backward"])
    per_kernel = layer(0.0)
    work = layer(1.0) - per_kernel
    if not work > 0:
        return replace(curves, composition_factor=1.0)
    f = (float(block["time_s"]) - per_kernel) / (curves.compute_slowdown * work)
    lo, hi = COMPOSITION_FACTOR_BOUNDS
    return replace(curves, composition_factor=float(min(max(f, lo), hi)))


def calibration_assumption(curves, cluster=None, **_) -> tuple[str, ...]:
    """The factors `paraplan calibrate` fitted that a calibrated cluster file carries (its ``calibration``):
    those on the analytical curves' compute times and those on the collectives' α and β, said with every
    estimate on it."""
    factors = dict(getattr(curves, "calibration", None) or {}) if getattr(curves, "kind", "") == "analytical" else {}
    system = getattr(cluster, "system", None)
    links = dict(getattr(getattr(system, "intra_node", None), "calibration", None) or {})
    for op, (fa, fb) in links.items():
        factors.update({f"{op}.latency": fa} if fa != 1.0 else {})
        factors.update({f"{op}.bandwidth": fb} if fb != 1.0 else {})
    if not factors:
        return ()
    shown = ", ".join(f"{k} x{v:.3g}" for k, v in sorted(factors.items()))
    return (f"calibrated to measured runs (paraplan calibrate): {shown} on the time of that work (a collective's "
            f"latency factor on its α, its bandwidth factor on its β = 1/B)",)


def gemm_level_assumption(plan, curves, **_) -> tuple[str, ...]:
    """The GEMM rate the estimate charges and where it comes from (analytical curves only; a measured
    profile's tables speak for themselves): the part's MAMF plateau of the plan's GEMM dtype, times the
    share of it a training step sustains (curves.yaml, calibrated per generation on published runs),
    less wave quantization."""
    if getattr(curves, "kind", "") != "analytical":
        return ()
    acc = curves.accelerator
    dtype = gemm_dtype(plan.dtype)
    basis = str(curves.sources.get("gemm_sustained_fraction", "")).split(":")[0] or "curves.yaml"
    if curves.gemm_level_borrowed:
        basis += "; assumed for this part, which has no calibration of its own"
    caveat = f"; {curves.caveat}" if curves.caveat else ""
    factor = acc.power_limited_clock_factor()
    power = (f", and GEMMs and fused attention at {factor:.3f} of the rated clock (a {acc.power_limit_w:g} W power "
             f"limit against the {acc.rated_power_w:g} W the plateau was measured at: (limit / rated)^(1/3), an "
             f"estimate from dynamic power ~ V^2 f)" if factor != 1.0 else "")
    return (f"GEMMs: {acc.plateau(dtype):.3f} of the {dtype} peak at best shape (MAMF) x "
            f"{curves.gemm_sustained_fraction:g} sustained in a training step ({basis}), less wave quantization "
            f"of {curves.gemm_wave_units} over {acc.streaming_multiprocessors} SMs{power}{caveat}",)
