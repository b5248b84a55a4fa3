"""Plain-text rendering of estimates: a breakdown with bars, readable at a glance."""
from __future__ import annotations

import math

from paraplan.workloads.transformer import params_text

GIB = 2**30
TIME_LABELS = {"compute": "compute", "recompute": "recomputation",
               "grad_accumulation": "gradient accumulation (unfused)", "tp_comm": "tensor-parallel comm",
               "cp_comm": "context-parallel comm", "ep_comm": "expert-parallel all-to-all",
               "moe_host": "MoE host sync (host-bound layers)",
               "pp_comm": "pipeline p2p", "pp_bubble": "pipeline bubble",
               "dp_comm": "data-parallel comm (exposed)", "optimizer": "optimizer step",
               "offload": "offload transfers (exposed)"}
MEMORY_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
                 "activations": "activations", "buffers": "buffers & runtime",
                 "allocator": "allocator reserve"}


#: how the plan line names an engine (the engine's own name; generic says what it stands for)
ENGINE_TEXT = {"generic": "generic: the ZeRO paper's accounting, no engine's restrictions"}


def bar(fraction: float, width: int = 30) -> str:
    n = max(0, min(width, round(fraction * width)))
    return "█" * n + "·" * (width - n)


#: significant digits of a step time as printed (a display choice): the estimator resolves about 1.5 %
#: (planner_tie_share), so a fourth digit (0.4032 s, 12.345 s) claims more than it knows
STEP_DIGITS = 3


def significant(x, digits: int = STEP_DIGITS) -> str:
    """``x`` to ``digits`` significant digits, without an exponent from 1 to a trillion ('6,730', '0.403',
    '12.3'); '-' for None, NaN or inf."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    rounded = float(f"{x:.{digits}g}")
    return f"{rounded:,.0f}" if 10 ** (digits - 1) <= abs(rounded) < 1e12 else f"{rounded:g}"


def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:8.3f} s "
    if s >= 1e-3:
        return f"{s * 1e3:8.2f} ms"
    return f"{s * 1e6:8.1f} µs"


def fmt_stage_layers(counts) -> str:
    """Layers per stage with runs folded: [5, 6, 6, 6, 5] -> "5, 6 x 3, 5"."""
    runs: list[list[int]] = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return ", ".join(f"{c} x {n}" if n > 1 else f"{c}" for c, n in runs)


def interval_line(e) -> str:
    """The prediction interval of throughput and MFU, or why there is none."""
    iv = getattr(e, "prediction_interval", None) or {}
    if "tokens_per_s" not in iv:
        return f"  90% interval    none — {iv.get('basis', 'no calibration data')}"
    lo, hi = iv["tokens_per_s"]
    mlo, mhi = iv["mfu"]
    line = (f"  {100 * iv['level']:.0f}% interval    {lo / e.num_gpus:.0f}-{hi / e.num_gpus:.0f} tokens/s per GPU, "
            f"MFU {100 * mlo:.1f}-{100 * mhi:.1f}%  ({iv['basis']})")
    if "evidence_distance" in iv:
        line += (f"\n  evidence        distance {iv['evidence_distance']:.2f} from the nearest calibration row "
                 "(widens the interval)")
        line += "".join(f"\n                  {note}" for note in iv.get("extrapolating", ()))
    return line


HYBRID_KIND_LABELS = {"mamba": "Mamba-2", "attention": "attention", "mlp": "MLP", "moe": "MoE"}


def hybrid_layer_lines(kinds) -> list[str]:
    """A hybrid model's layers by kind (estimate details ``hybrid_layers``): count, one layer's forward
    and backward per micro-batch, and the kind's share of the layers' time."""
    if not kinds:
        return []
    lines = ["  layers by kind  (forward / backward of one layer, one micro-batch on one GPU; share of all layers' "
             "time with recompute and exposed tp/cp/ep comm)"]
    for k, v in kinds.items():
        lines.append(f"    {HYBRID_KIND_LABELS.get(k, k):10s} {v['layers']:4d} layers  {v['forward_ms']:8.2f} / "
                     f"{v['backward_ms']:8.2f} ms  {100 * v['share']:5.1f}%  {bar(v['share'])}")
    return lines


def render_estimate(e) -> str:
    p = e.plan
    size = f" ({params_text(e.model_params, e.model_active_params)})" if e.model_params else ""
    lines = [
        f"paraplan estimate — {e.model}{size} on {e.cluster} x {e.num_gpus} GPUs, seq {e.seq_len}, "
        f"global batch {e.global_batch}",
        f"plan ({ENGINE_TEXT.get(getattr(p, 'engine', 'generic'), getattr(p, 'engine', 'generic'))}): tp {p.tp} · pp {p.pp} · dp {p.dp} · cp {p.cp}{' · sp' if p.sp else ''}"
        f"{f' · vpp {p.vpp}' if p.vpp > 1 else ''} · micro-batch {p.micro_batch} · {p.schedule} · "
        f"ZeRO-{p.zero} · recompute {p.recompute} · offload {p.offload}"
        f"{' (+params)' if p.offload_params else ''}{' · delayed update' if p.delayed_update else ''}"
        f"{f' · activations of {p.offload_activation_layers} layers to host' if getattr(p, 'offload_activation_layers', 0) else ''}"
        f"{' · bf16 gradients' if getattr(p, 'grad_reduce_bf16', False) else ''} · {p.dtype}"
        f"{' (fp8 parameters)' if getattr(p, 'fp8_param_gather', False) else ''}"
        f"{f' · ep {p.ep}' if p.ep > 1 else ''}{f' · etp {p.etp}' if p.etp > 1 else ''}"
        f"{' · TP comm overlap' if getattr(p, 'tp_comm_overlap', False) else ''}"
        f"{' · EP comm overlap' if getattr(p, 'ep_comm_overlap', False) else ''}"
        f"{' · DeepEP dispatch' if getattr(p, 'moe_flex_dispatch', False) else ''}"
        f"{f' · recompute {p.recompute_modules}' if getattr(p, 'recompute_modules', '') else ''}"
        f"{f' · {p.cp_mode}' if p.cp > 1 else ''}{f' · {p.optimizer}' if p.optimizer != 'adam' else ''}",
        "",
    ]
    status = "fits" if e.feasible else f"DOES NOT FIT — {e.infeasible_reason}"
    lines += [
        f"  step time       {significant(e.step_time_s):>10} s      ({e.details['micro_batches_per_step']:.0f} micro-batches, "
        f"bubble {100 * e.details['bubble_fraction']:.1f}%)",
        f"  throughput      {e.tokens_per_s:10.0f} tokens/s  ({e.tokens_per_s_per_gpu:.1f} per GPU)",
        f"  model TFLOP/s   {e.model_tflops_per_gpu:10.1f} per GPU   MFU {100 * e.mfu:.1f}%   HFU {100 * e.hfu:.1f}%",
        interval_line(e),
        f"  memory          {e.memory_bytes_per_gpu['total'] / GIB:10.1f} GiB per GPU of "
        f"{e.details['gpu_memory_bytes'] / GIB:.0f} GiB — {status}",
    ]
    domains = e.details.get("nvlink_domains")
    if domains:
        lines.append(f"  NVLink domains  {domains['count']} x {domains['gpus_each']} GPUs, assumed: "
                     f"{domains['assumption']}")
    counts = e.details.get("layers_per_stage")
    if counts:
        even = len(set(counts)) == 1
        mtp = e.details.get("mtp_blocks_on_last_stage")
        lines.append(f"  layers/stage    {fmt_stage_layers(counts)}"
                     f"{' (even)' if even else ' (uneven: the largest stage sets the pace)'}"
                     f"{f'; + {mtp} multi-token-prediction block(s) and head pass(es) on the last' if mtp else ''}")
    lines += hybrid_layer_lines(e.details.get("hybrid_layers"))
    lines += [
        "",
        "  time per step",
    ]
    total = e.step_time_s
    for k, label in TIME_LABELS.items():
        v = e.time_breakdown_s[k]
        if v > 0:
            lines.append(f"    {label:30s} {fmt_time(v)} {100 * v / total:5.1f}%  {bar(v / total)}")
    lines += ["", f"  memory per GPU ({e.details['peak_memory_stage']} pipeline stage)"]
    mem_total = e.memory_bytes_per_gpu["total"]
    for k, label in MEMORY_LABELS.items():
        v = e.memory_bytes_per_gpu[k]
        lines.append(f"    {label:30s} {v / GIB:8.2f} GiB {100 * v / mem_total:5.1f}%  {bar(v / mem_total)}")
    if e.host_memory_bytes_per_node or e.nvme_bytes_per_node:
        lines.append(f"    host memory per node {e.host_memory_bytes_per_node / GIB:.0f} GiB, "
                     f"NVMe per node {e.nvme_bytes_per_node / 1e12:.2f} TB")
    if "step_time_warmup_s" in e.details:
        d = e.details
        lines += ["", f"  {p.optimizer}: warm-up ({100 * d['optimizer_warmup_share']:.0f}% of steps, uncompressed) "
                  f"{d['step_time_warmup_s']:.3f} s/step, compressed phase {d['step_time_compressed_s']:.3f} s/step "
                  f"(data-parallel comm {fmt_time(d['dp_comm_warmup_s']).strip()} -> "
                  f"{fmt_time(d['dp_comm_compressed_s']).strip()}); the step time above is their average"]
    lines += ["", "  assumptions"] + [f"    - {a}" for a in e.assumptions]
    lines += ["", "  FLOP convention: " + e.flop_convention]
    return "\n".join(lines)
