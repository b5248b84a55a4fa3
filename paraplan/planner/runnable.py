"""The nearest plan an engine runs, re-estimated beside the plan it came from.

An export writes only what the engine runs. Where a plan holds a choice the target engine does not
run (an optimizer offload on Megatron-LM, a zero-bubble schedule on stock pipelines, op-level SAC
outside torchtitan, ...), the export is of the *nearest* plan it runs: each such choice replaced by
the engine's closest one (:func:`nearest_runnable`), the result checked against the model and the
cluster and estimated with the same ``estimate`` as the plan (:func:`as_engine_runs`). Both estimates
are shown; a nearest plan that does not fit in memory is refused with what overflows.

Where the recomputation policy had to change and the nearest policy does not fit, the next stronger
policy the engine runs is tried (selective, then full): recomputation is what the plan relied on to
fit, and the engine's stronger policy is the nearest plan that still does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from paraplan.costmodels.estimate import estimate
from paraplan.engines import SWITCHES, ExportMapping, spec_named
from paraplan.errors import ConfigError
from paraplan.plan import Plan, check_plan, is_fp8

GIB = 2**30
#: recomputation from weakest to strongest (the fallback order when a changed policy does not fit)
RECOMPUTE_STRENGTH = ("none", "selective", "op-sac", "full")


@dataclass(frozen=True)
class Change:
    """One plan choice the engine does not run: the field, the planned value, what it runs instead, and
    a short phrase for the summary ("1F1B for zb-h1")."""
    field: str
    planned: Any
    runs: Any
    phrase: str


def _switch_default(name: str) -> Any:
    return Plan.__dataclass_fields__[name].default


def nearest_runnable(plan: Plan, engine: str, fp8_recipes=None, expert_tp: bool | None = None,
                     attention_kernels=None) -> tuple[Plan, tuple[Change, ...]]:
    """The plan as ``engine`` runs it: every choice the engine's spec (and its export mapping) does not
    offer replaced by the nearest one it does, and the list of what changed. The engine field itself
    and gradient-accumulation fusion (Megatron-LM's only) follow the engine without counting as a
    change of the layout. ``fp8_recipes``: the fp8 dtypes the written format has (default: the spec's
    export mapping's); ``expert_tp``: whether the format has an expert-tensor-parallel degree (default:
    the spec's export mapping's; torchtitan 0.3.0 has none); ``attention_kernels``: the named kernels the written format can pin (default: the
    spec's export mapping's). Raises ConfigError where the result breaks a rule of ``Plan``."""
    spec = spec_named(engine)
    mapping = spec.export
    p, changes = plan, []
    new: dict[str, Any] = {"engine": engine,
                           "grad_accumulation_fusion": p.grad_accumulation_fusion and spec.grad_accumulation_fusion}

    def change(field: str, value: Any, phrase: str) -> None:
        if getattr(p, field) != value and new.get(field, getattr(p, field)) != value:
            changes.append(Change(field, getattr(p, field), value, phrase))
            new[field] = value

    schedules = tuple(mapping.schedules) if mapping is not None and mapping.schedules else ("1f1b", "interleaved")
    if p.pp > 1 and p.schedule not in schedules:
        change("schedule", "1f1b", f"1F1B for {p.schedule}")
        if p.vpp > 1:          # 1F1B runs one model chunk a stage (the interleaved schedule's chunks merged)
            change("vpp", 1, f"one model chunk per stage for vpp {p.vpp}")
    if p.recompute not in spec.recompute:
        runs = _nearest_recompute(p.recompute, spec.recompute)
        change("recompute", runs, f"{runs} recomputation for {p.recompute}")
    for sw in SWITCHES:                      # switches the engine does not have: off
        if not spec.offers(sw.field) and getattr(p, sw.field) != _switch_default(sw.field):
            change(sw.field, _switch_default(sw.field), _SWITCH_PHRASES.get(sw.field, f"no {sw.field}"))
    if not new.get("precision_aware_optimizer", p.precision_aware_optimizer):
        change("optimizer_state_dtype", "fp32", "fp32 moments")
    if new.get("offload", p.offload) == "none":
        change("offload_params", False, "no parameter offload")
        change("delayed_update", False, "no delayed update")
    if new.get("recompute", p.recompute) != "selective":
        change("recompute_modules", "", "no module list")
    if p.cp > 1 and spec.cp_modes and p.cp_mode not in spec.cp_modes:
        change("cp_mode", spec.cp_modes[0], f"{spec.cp_modes[0]} for {p.cp_mode} context parallelism")
    if p.zero not in spec.zero_stages:
        higher = [z for z in spec.zero_stages if z > p.zero]
        if higher:
            change("zero", higher[0], f"ZeRO-{higher[0]} for ZeRO-{p.zero}")
    recipes = fp8_recipes if fp8_recipes is not None else (mapping.fp8_recipes if mapping is not None else None)
    if is_fp8(p.dtype) and recipes is not None and p.dtype not in recipes:
        runs = next((d for d in ("fp8-rowwise", "fp8", "fp8-blockwise", "mxfp8") if d in recipes), "bf16")
        change("dtype", runs, f"{runs} for {p.dtype}")
    if not is_fp8(new.get("dtype", p.dtype)):
        change("fp8_param_gather", False, "16-bit parameters")
    optimizers = mapping.optimizers if mapping is not None and mapping.optimizers is not None else spec.optimizers
    if p.optimizer not in optimizers:
        change("optimizer", optimizers[0], f"{optimizers[0]} for {p.optimizer}")
    if mapping is not None and not mapping.delayed_update:
        change("delayed_update", False, "no delayed update")
    kernels = attention_kernels if attention_kernels is not None else (mapping.attention_kernels if mapping else None)
    if kernels is not None and p.flash_attention and p.attention_kernel not in kernels:
        change("attention_kernel", "auto", f"its own attention kernel for {p.attention_kernel}")
    m = mapping if mapping is not None else ExportMapping(format="", notes_in_text=False)
    if m.tp_shards_sequence and p.tp > 1 and not p.sp:
        change("sp", True, "sequence parallelism (its TP plan shards the sequence)")
    if m.attention_always_fused and not p.flash_attention:
        change("flash_attention", True, "its fused attention for unfused")
        change("fused_softmax", True, "fused softmax")
    eager = p.pp > 1 and new.get("schedule", p.schedule) in m.eager_schedules
    if eager:
        change("fused_elementwise", False, f"eager elementwise ops ({p.schedule} refuses compiled stages)")
    elif m.compiles_model and not p.fused_elementwise:
        change("fused_elementwise", True, "compiled elementwise ops")
    for name in m.switches_without_option:
        if getattr(p, name) != _switch_default(name):
            change(name, _switch_default(name), _SWITCH_PHRASES.get(name, f"no {name}") + f" (no option in {m.target})")
    if m.grad_reduce_always_overlapped and not p.overlap_grad_reduce:
        change("overlap_grad_reduce", True, "gradient reduction overlapped (FSDP2 always overlaps it)")
    if m.grad_reduce_always_overlapped and not p.overlap_param_gather:
        change("overlap_param_gather", True, "parameter all-gather overlapped (FSDP2 prefetches it)")
    if m.zero0_needs_pure_dp and new.get("zero", p.zero) == 0 and p.model_parallel > 1:
        change("zero", 2, "FSDP (ZeRO-2) for ZeRO-0 (its DDP is 1-D data parallelism only)")
    if expert_tp is None:
        expert_tp = m.expert_tensor_parallel
    if not expert_tp and p.etp > 1:
        change("etp", 1, "experts not split over tp")
    top = m.pipeline_max_zero
    if top is not None and p.pp > 1 and new.get("zero", p.zero) > top:
        change("zero", top, f"ZeRO-{top} for ZeRO-{p.zero} (its pipeline engine)")
    if new.get("zero", p.zero) < min(3, p.zero):       # the stage came down: what needed it goes with it
        change("offload_params", False, "no parameter offload (it needs ZeRO-3)")
    if new.get("offload", p.offload) == "nvme" and new.get("zero", p.zero) < m.nvme_offload_min_zero:
        change("offload", "cpu", f"CPU offload for NVMe (its NVMe offload needs ZeRO-{m.nvme_offload_min_zero})")
    try:
        return replace(p, **new), tuple(changes)
    except ConfigError as err:
        raise ConfigError(err.field, f"{spec.title} cannot run the plan: {err.problem}", accepted=err.accepted) from None


_SWITCH_PHRASES = {"offload": "no offload", "offload_activation_layers": "no activation offload",
                   "grad_reduce_bf16": "fp32 gradient reduction", "fp8_param_gather": "16-bit parameters", "te_cross_entropy": "its own cross-entropy",
                   "precision_aware_optimizer": "fp32 master weights",
                   "tp_comm_overlap": "no TP overlap", "ep_comm_overlap": "no EP overlap",
                   "moe_flex_dispatch": "all-to-all dispatch", "recompute_modules": "default selective modules"}


def _nearest_recompute(planned: str, offered: tuple) -> str:
    """The engine's recomputation nearest to ``planned``: op-level SAC and selective stand for each other,
    else the next stronger policy it has (full), else none."""
    for candidate in {"op-sac": ("selective", "full"), "selective": ("op-sac", "full")}.get(planned, ("full",)):
        if candidate in offered:
            return candidate
    return "none"


@dataclass(frozen=True)
class AsRun:
    """A plan and the plan ``engine`` runs for it, each with its estimate (``estimate``'s Estimate)."""
    engine: str
    planned: Plan
    runs: Plan
    changes: tuple[Change, ...]
    planned_estimate: Any
    runs_estimate: Any
    hbm_bytes: float

    @property
    def same(self) -> bool:
        """Whether the engine runs the plan's own layout (only the engine field, and with it the engine's
        model-state layout, may differ)."""
        return not self.changes

    def summary(self) -> str:
        """One line with both estimates: "planned: X s/step, M GiB; as megatron runs it (no offload, 1F1B
        for zb-h1): Y s/step, Z of H GiB"."""
        a, b = self.planned_estimate, self.runs_estimate
        parts = [", ".join(c.phrase for c in self.changes)]
        if self.runs.engine != self.planned.engine:
            parts.insert(0, "its own model states")
        if self.runs.grad_accumulation_fusion != self.planned.grad_accumulation_fusion:
            parts.append("gradient accumulation unfused")
        how = "; ".join(part for part in parts if part)
        return (f"planned (engine {self.planned.engine}): {a.step_time_s:.3f} s/step, {_gib(a):.1f} GiB per GPU; "
                f"as {self.engine} runs it{f' ({how})' if how else ''}: {b.step_time_s:.3f} s/step, "
                f"{_gib(b):.1f} of {self.hbm_bytes / GIB:.1f} GiB per GPU")


def _gib(est) -> float:
    return est.memory_bytes_per_gpu["total"] / GIB


def as_engine_runs(plan: Plan, engine: str, model, job, cluster, fp8_recipes=None, expert_tp: bool | None = None,
                   attention_kernels=None) -> AsRun:
    """The nearest plan ``engine`` runs (:func:`nearest_runnable`), checked against the model, the job and
    the cluster, and estimated beside ``plan``. Where recomputation had to change and the nearest policy
    does not fit, the engine's stronger policies are tried. ConfigError when the engine cannot run any
    nearest plan (a rule it breaks) or the nearest plan does not fit: what overflows and by how much."""
    runs, changes = nearest_runnable(plan, engine, fp8_recipes, expert_tp, attention_kernels)
    try:
        runs = check_plan(runs, model, job, cluster)
    except ConfigError as err:
        raise ConfigError(err.field, f"as {engine} runs it ({', '.join(c.phrase for c in changes) or 'the same layout'}) "
                          f"the plan breaks a rule: {err.problem}", accepted=err.accepted) from None
    planned_est = estimate(model, job, cluster, plan)
    runs_est = planned_est if runs == plan else estimate(model, job, cluster, runs)
    if not runs_est.feasible and any(c.field == "recompute" for c in changes):
        runs, changes, runs_est = _stronger_recompute(runs, changes, engine, model, job, cluster, runs_est)
    hbm = cluster.accelerator.memory_bytes
    result = AsRun(engine, plan, runs, changes, planned_est, runs_est, hbm)
    if not runs_est.feasible:
        raise ConfigError("plan", f"the nearest plan {engine} runs does not fit: {result.summary()}: "
                          f"{runs_est.infeasible_reason}",
                          accepted=f"a plan made for it: `paraplan plan --engine {engine}`")
    return result


#: module lists tried, in order, before full recomputation on an engine with Megatron-Core's
#: fine-grained recomputation: the cheap ones first (outputs discarded and recomputed), then the MLPs
SELECTIVE_MODULE_STEPS = ("core_attn,layernorm,mla_up_proj,moe_act", "core_attn,layernorm,mla_up_proj,mlp,moe_act,moe")


def _stronger_recompute(runs: Plan, changes, engine, model, job, cluster, runs_est):
    """The first stronger recomputation the engine runs under which the nearest plan fits (else the plan
    unchanged): its stronger policies in order, with wider module lists before full recomputation where
    it has them."""
    spec = spec_named(engine)
    at = RECOMPUTE_STRENGTH.index(runs.recompute)
    candidates = []
    for stronger in RECOMPUTE_STRENGTH[at:]:
        if stronger not in spec.recompute:
            continue
        if stronger == "selective" and spec.offers("recompute_modules"):
            candidates += [("selective", m) for m in SELECTIVE_MODULE_STEPS]
        elif stronger != runs.recompute:
            candidates.append((stronger, ""))
    for policy, modules in candidates:
        try:
            candidate = check_plan(replace(runs, recompute=policy, recompute_modules=modules), model, job, cluster)
        except ConfigError:
            continue
        est = estimate(model, job, cluster, candidate)
        if est.feasible:
            planned = next(c.planned for c in changes if c.field == "recompute")
            kept = tuple(c for c in changes if c.field not in ("recompute", "recompute_modules"))
            what = f"{policy} recomputation" + (f" of {modules}" if modules else "")
            return candidate, kept + (Change("recompute", planned, policy,
                                             f"{what} for {planned} (the nearest that fits)"),), est
    return runs, changes, runs_est
