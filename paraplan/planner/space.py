"""The plan space: legal choices per axis, composed flat into numpy arrays of candidates.

Per axis (each respects what it can see alone): tp divides heads and the GPU count (and KV heads
divide tp or tp divides them); pp divides the GPU count and is at most the layer count (layers
that pp does not divide are split unevenly, ``paraplan.plan.stage_layers``); cp divides the GPU count and leaves at least
``min_tokens_per_cp_rank`` tokens per rank; vpp splits the layers (with the embedding and loss counted as layers when that makes them divide: ``paraplan.plan.interleaved_split_accounts``); micro-batch divides the global
batch; schedule, sequence parallelism, ZeRO stage, recomputation and offload from their lists.
Composition is the flat Cartesian product; the cross-axis rules of ``paraplan.plan.RULES`` (degrees
multiply to the GPU count, batch divisible by dp·micro-batch, interleaving needs m % pp = 0, …)
remove candidates and each removal is counted under the rule's reason.

Axes pinned with ``--fix`` (:func:`parse_fix`, :func:`normalize_fix`) are validated like the plan
fields, and rejected at once when a rule decides them illegal on their own (``--fix tp=3`` for 32
heads).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Mapping

import numpy as np

from paraplan.engines import SPECS, spec_named
from paraplan.errors import ConfigError
from paraplan.plan import (MODES, PLAN_FIELD_SPECS, PLAN_FIELDS, RULES, STAGE_LAYER_FIELDS, CpMode, Dtype,
                           Offload, Optimizer, PlanBatch, Recompute, Scene, Schedule, failed_rules, is_fp8,
                           parse_field, recompute_modules_mask)

OFFLOAD_CHOICES = ((Offload.NONE, False), (Offload.CPU, False), (Offload.NVME, False), (Offload.CPU, True),
                   (Offload.NVME, True))
FIX_AXES = PLAN_FIELDS  # every plan field can be pinned by name


@dataclass(frozen=True)
class SpaceOptions:
    """What the search may choose. ``fixed`` pins axes (``{"tp": 8}``, ``{"optimizer": "adam"}``;
    see :func:`normalize_fix`); the rest are defaults."""
    fixed: Mapping[str, object] = None
    max_micro_batch: int = 64
    max_vpp: int = 8
    max_tp: int = 64
    min_tokens_per_cp_rank: int = 1024
    allow_offload: bool = True
    allow_compression: bool = True
    allow_delayed_update: bool = False     # changes training semantics (one-step-stale weights): opt-in
    grad_accumulation_fusion: bool = True  # False: the engine adds micro-batch gradients unfused
    engine_switches: bool = True
    """Try each of the engine's usual switches (ENGINE_SWITCHES: Megatron-LM's --tp-comm-overlap,
    --grad-reduce-in-bf16, --fp8-param-gather) both off and on wherever the plan can run it, and let the
    ranking choose (fastest that fits; a tie goes to the plan with fewer switches); False
    (--no-engine-switches): leave them off unless --fix turns one on; --fix NAME=false pins one off."""


def normalize_fix(fixed: Mapping | None) -> dict:
    """Pinned axes by plan field name, each value validated like the plan field (modes by name,
    positive integers, ZeRO 0-3, booleans as true/false/1/0); ConfigError naming ``--fix AXIS``."""
    out = {}
    for key, value in dict(fixed or {}).items():
        key = str(key).strip().replace("-", "_")
        if key not in FIX_AXES:
            raise ConfigError("--fix", f"unknown axis {key!r}", accepted=", ".join(sorted(FIX_AXES)))
        out[key] = parse_field(key, value, where=f"--fix {key}")
    return out


def parse_fix(items) -> dict:
    """``--fix AXIS=VALUE`` items as a validated dict (:func:`normalize_fix`)."""
    raw = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError("--fix", f"expected AXIS=VALUE, got {item!r}", accepted="e.g. --fix tp=8 --fix zero=1")
        key, value = item.split("=", 1)
        raw[key.strip().replace("-", "_")] = value.strip()
    return normalize_fix(raw)


def _fixed_view(fixed: Mapping) -> SimpleNamespace:
    """The pinned values as a one-plan view with ``PlanBatch`` attribute names (modes as codes)."""
    view = {}
    for key, value in fixed.items():
        if key == "dtype":
            view["dtype"] = value
        elif key in MODES:
            view[f"{key}_code"] = np.array([int(MODES[key].parse(value))])
        else:
            view[key] = np.array([value])
    return SimpleNamespace(**view)


def check_fixed(fixed: Mapping, model, job, cluster) -> None:
    """Reject pinned values that an illegal rule, reading only pinned axes, already rules out,
    with the rule's message (the same as :func:`paraplan.plan.check_plan` gives)."""
    if not fixed:
        return
    view = _fixed_view(fixed)
    if not hasattr(view, "engine_code"):          # one engine for the whole search: its default
        view.engine_code = np.array([spec_named(fixed.get("engine")).code])
    scene = Scene(model, job, cluster, fixed.get("dp") or None)
    failed = failed_rules(view, scene, available=vars(view))
    if failed:
        axes = sorted({a.removesuffix("_code") for r in failed for a in r.axes if a != "engine_code" or "engine" in fixed})
        raise ConfigError("--fix " + ", ".join(axes), "; ".join(r.explain(view, scene) for r in failed))


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of n >= 1 by trial division up to sqrt(n) (2^31 - 1: 46 341 trials, ~5 ms)."""
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1 in increasing order, built from its prime factorization (every product
    p1^e1 ... pk^ek with 0 <= ei <= the exponent of pi), not by trying every integer up to n."""
    out = [1]
    for p, e in prime_factors(n).items():
        out = [d * p**k for d in out for k in range(e + 1)]
    return sorted(out)


def _pin(choices: dict, fixed: Mapping) -> None:
    """Replace the choices of pinned axes by their pinned value. Pinned fields the search does not
    vary are left to the batch: dp is a rule of the search, the others one value for the whole batch
    (:func:`batch_wide_columns`)."""
    for key, value in fixed.items():
        if key == "etp":
            choices["etp_is_tp"] = [value != 1]
            if value != 1:
                if fixed.get("tp", value) != value:
                    raise ConfigError("--fix etp", f"the search places experts with etp 1 or etp = tp; etp({value}) "
                                      f"with tp({fixed['tp']}) is not in it", accepted=f"--fix etp=1 or etp={fixed['tp']}")
                choices["tp"] = [value]
        elif key == "offload_params":
            choices["offload"] = [i for i in choices["offload"] if OFFLOAD_CHOICES[i][1] == value]
        elif key == "offload":
            params = fixed.get("offload_params")
            choices["offload"] = [i for i, (o, p) in enumerate(OFFLOAD_CHOICES)
                                  if o.label == value and (params is None or p == params)]
        elif key not in choices:
            continue
        elif key in MODES:
            choices[key] = [int(MODES[key].parse(value))]
        else:
            choices[key] = [value]


def search_dtype(accelerator) -> str:
    """The number format the search trains in: bf16 where the accelerator has it, else fp16 (V100),
    else fp32 (a profiled CPU device, whose profile measures fp32 GEMMs only)."""
    for dtype in (Dtype.BF16, Dtype.FP16, Dtype.FP32):
        if dtype.label in accelerator.peak_flops:
            return dtype.label
    return Dtype.BF16.label


def axis_choices(model, job, cluster, options: SpaceOptions) -> dict[str, list]:
    """Legal values per axis, each judged on its own; pinned axes take their (checked) value."""
    fixed = normalize_fix(options.fixed)
    check_fixed(fixed, model, job, cluster)
    gpus = cluster.num_gpus
    tp = [t for t in divisors(gpus) if t <= options.max_tp and model.heads % t == 0
          and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]
    cp = [c for c in divisors(gpus) if job.seq_len % (2 * c) == 0 and job.seq_len // c >= options.min_tokens_per_cp_rank
          or c == 1]
    pp = [p for p in divisors(gpus) if p <= model.layers]
    vpp = [v for v in range(1, options.max_vpp + 1)]
    mb = [b for b in divisors(job.global_batch) if b <= options.max_micro_batch]
    ep = [e for e in divisors(gpus) if model.moe and model.moe.experts % e == 0] or [1]
    choices = {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "micro_batch": mb, "schedule": [int(s) for s in Schedule],
               "ep": ep, "cp_mode": [int(m) for m in CpMode] if len(cp) > 1 else [int(CpMode.RING)],
               "sp": [False, True], "zero": [0, 1, 2, 3], "recompute": [int(r) for r in Recompute],
               "offload": list(range(len(OFFLOAD_CHOICES) if options.allow_offload else 1)),
               "optimizer": [int(o) for o in Optimizer] if options.allow_compression else [int(Optimizer.ADAM)],
               "delayed_update": [False, True] if options.allow_offload and options.allow_delayed_update else [False],
               "etp_is_tp": [False, True] if model.moe else [False]}
    _pin(choices, fixed)
    choices["_dtype"] = fixed.get("dtype", search_dtype(cluster.accelerator))
    choices["_engine"] = spec_named(fixed.get("engine")).code
    return choices


def _grid(ch: dict, keys) -> dict:
    grids = np.meshgrid(*[np.asarray(ch[k]) for k in keys], indexing="ij")
    return {k: g.ravel() for k, g in zip(keys, grids)}


def _apply(rules, view, scene: Scene, keep, rejected: Counter, weight):
    """Remove candidates rule by rule (in table order); each removal counts ``weight`` full
    combinations (a number, or one weight per candidate) under the rule's reason."""
    for rule in rules:
        bad = rule.mask(view, scene)
        newly = keep & bad
        n = int(np.sum(np.where(newly, weight, 0)))
        if n:
            rejected[rule.reason] += n
        keep &= ~bad
    return keep


FIRST_AXES = ("tp", "pp", "cp", "vpp", "micro_batch", "schedule", "ep", "cp_mode")
SECOND_AXES = ("sp", "zero", "recompute", "offload", "optimizer", "delayed_update", "etp_is_tp")
# what each stage's view holds, by PlanBatch attribute name (dtype is one value for the batch)
# (dtype and engine_code: one value for the whole batch, in every view)
FIRST_VIEW = frozenset({"tp", "pp", "cp", "vpp", "micro_batch", "schedule_code", "ep", "cp_mode_code", "dp", "dtype",
                        "engine_code", "first_stage_layers", "last_stage_layers"})
SECOND_VIEW = frozenset({"sp", "zero", "recompute_code", "offload_code", "offload_params", "optimizer_code",
                         "delayed_update", "etp_is_tp", "dtype", "engine_code"})


def rule_stage(rule) -> int:
    """The earliest compose stage (1: degree axes, 2: categorical axes, 3: both) that has the rule's axes."""
    if rule.axes <= FIRST_VIEW:
        return 1
    if rule.axes <= SECOND_VIEW:
        return 2
    return 3


def _stage_rules(stage: int) -> list:
    return [r for r in RULES if rule_stage(r) == stage]


def _first_view(a: dict, dp, dtype, engine, fixed: Mapping) -> SimpleNamespace:
    """The degree axes' view; the stage-layer fields are not searched (0, the automatic split,
    unless pinned)."""
    n = a["tp"].size
    return SimpleNamespace(tp=a["tp"], pp=a["pp"], cp=a["cp"], vpp=a["vpp"], micro_batch=a["micro_batch"],
                           schedule_code=a["schedule"], ep=a["ep"], cp_mode_code=a["cp_mode"], dp=dp, dtype=dtype,
                           engine_code=engine, **{k: np.full(n, fixed.get(k, 0)) for k in STAGE_LAYER_FIELDS})


def _second_view(b: dict, dtype, engine) -> SimpleNamespace:
    off = np.array([int(o) for o, _ in OFFLOAD_CHOICES])[b["offload"]]
    par = np.array([p for _, p in OFFLOAD_CHOICES])[b["offload"]]
    return SimpleNamespace(sp=b["sp"], zero=b["zero"], recompute_code=b["recompute"], offload_code=off,
                           offload_params=par, optimizer_code=b["optimizer"], delayed_update=b["delayed_update"],
                           etp_is_tp=b["etp_is_tp"], dtype=dtype, engine_code=engine)


#: the Plan fields the search varies (its axes, with etp from etp_is_tp and offload_params from offload)
#: or derives (dp), and the stage-layer counts the first view pins; the others are batch-wide
#: (:func:`batch_wide_columns`)
SEARCHED_FIELDS = frozenset({"tp", "pp", "dp", "cp", "vpp", "micro_batch", "schedule", "ep", "cp_mode", "sp", "zero",
                             "recompute", "offload", "offload_params", "optimizer", "delayed_update", "etp",
                             *STAGE_LAYER_FIELDS})


def batch_wide_columns(fixed: Mapping, options: SpaceOptions, engine: int, flash_default: bool = True) -> dict:
    """The PlanBatch columns of the Plan fields the search does not vary (all but SEARCHED_FIELDS, the
    engine and dtype), by column: the value ``--fix`` pins, else the Plan default. Two defaults come
    from the scenario: flash attention (the accelerator's) and gradient-accumulation fusion (on only
    where ``options`` allow it and the engine is Megatron-LM, which fuses it into the weight-gradient
    GEMMs through main_grad, or generic). The engine, like dtype, is one value for the whole search,
    held by the views as a scalar."""
    fusion = options.grad_accumulation_fusion and SPECS[int(engine)].grad_accumulation_fusion
    defaults = {"flash_attention": flash_default, "grad_accumulation_fusion": fusion}
    return {s.column: s.encode(fixed.get(s.name, defaults.get(s.name, s.default)))
            for s in PLAN_FIELD_SPECS.values() if not s.per_batch and s.name not in SEARCHED_FIELDS | {"engine"}}


def _legal_with(both: SimpleNamespace, scene, column: str, values: np.ndarray, rules) -> np.ndarray:
    """Per candidate: whether ``rules`` allow it with ``column`` set to ``values``."""
    n = both.tp.size
    probe = SimpleNamespace(**{**vars(both), column: values})
    ok = np.ones(n, dtype=bool)
    for rule in rules:
        ok &= ~np.broadcast_to(np.asarray(rule.bad(probe, scene), dtype=bool), (n,))
    return ok


@dataclass(frozen=True)
class FixedWhereItRuns:
    """A switch that ``--fix`` turns on only on the candidates whose rules let them run it; the others
    keep ``off`` and stay in the search. ``pin_hint`` is the further ``--fix`` that leaves only
    candidates that run it (``paraplan plan`` names it when some listed plans run without)."""
    off: object
    pin_hint: str


#: every switch a ``--fix`` holds only where a plan can run it: the two opt-in MoE flags
#: (:func:`_opt_in_flag_where_it_runs`) and Megatron-Core's fine-grained recompute modules
#: (:func:`_recompute_modules_where_they_run`). A new such switch is added here once.
FIXED_WHERE_THEY_RUN = {"ep_comm_overlap": FixedWhereItRuns(False, "--fix ep=N (N > 1)"),
                        "moe_flex_dispatch": FixedWhereItRuns(False, "--fix ep=N (N > 1)"),
                        "tp_comm_overlap": FixedWhereItRuns(False, "--fix sp=true --fix tp=N (N > 1)"),
                        "grad_reduce_bf16": FixedWhereItRuns(False, "--fix engine=megatron"),
                        "fp8_param_gather": FixedWhereItRuns(False, "--fix zero=1 (or 2, 3)"),
                        "precision_aware_optimizer": FixedWhereItRuns(False, "--fix zero=1 --fix engine=megatron"),
                        "recompute_modules": FixedWhereItRuns("", "--fix recompute=selective")}

#: the engine switches the search tries both off and on (SpaceOptions.engine_switches): each saves memory
#: or time or both in the estimate where it runs (TP collectives hidden under the GEMMs; a 2-byte gradient
#: buffer and reduction; 1-byte parameters and gathers), and the Megatron-Bridge / NeMo performance
#: recipes set them (tp_comm_overlap, grad_reduce_in_fp32=False, fp8_param_gather under fp8)
ENGINE_SWITCHES = ("tp_comm_overlap", "grad_reduce_bf16", "fp8_param_gather")

#: the opt-in flags the search leaves off unless fixed, with the rules that say where each can run
OPT_IN_FLAG_RULES = {column: tuple(r for r in RULES if column in r.axes)
                     for column, switch in FIXED_WHERE_THEY_RUN.items() if switch.off is False}


def _opt_in_flag_where_it_runs(both: SimpleNamespace, scene, column: str, wanted: bool) -> np.ndarray:
    """An opt-in flag's column: off, or (``--fix column=true``) on for every candidate its rules
    (OPT_IN_FLAG_RULES) allow, off for the others, which stay in the search as they are.

    * ep_comm_overlap, Megatron-Core's combined 1F1B and DualPipe's paired chunks: ep > 1, pp 1, interleaved,
      dualpipe or dualpipev (torchtitan: dualpipev only), no full
      recomputation, an engine that has it;
    * moe_flex_dispatch, DeepEP / HybridEP: ep > 1, an engine with the flex dispatcher, permuting MoE;
      not searched by default since the SMs and buffers its kernels hold are not priced;
    * the ENGINE_SWITCHES: tp_comm_overlap (tp > 1 with sp), grad_reduce_bf16 (Megatron-LM),
      fp8_param_gather (Megatron-LM, an fp8 dtype, ZeRO >= 1)."""
    on = np.full(both.tp.size, wanted)
    if not wanted:
        return on
    return _legal_with(both, scene, column, on, OPT_IN_FLAG_RULES[column])


RECOMPUTE_MODULES_RULES = tuple(r for r in RULES if "recompute_modules_mask" in r.axes)


def _recompute_modules_where_they_run(both: SimpleNamespace, scene, modules: str) -> np.ndarray:
    """The recompute_modules_mask column: 0, or (``--fix recompute_modules=moe_act,layernorm``) those
    modules on every candidate that can recompute them (the rules of RECOMPUTE_MODULES_RULES: selective
    recomputation, an engine that has Megatron-Core's fine-grained recomputation, a model with those
    submodules), 0 for the others, which stay in the search as they are."""
    mask = np.full(both.tp.size, recompute_modules_mask(modules))
    if not modules:
        return mask
    return np.where(_legal_with(both, scene, "recompute_modules_mask", mask, RECOMPUTE_MODULES_RULES), mask, 0)


def searched_recompute_module_sets(model) -> tuple[str, ...]:
    """Module lists the search tries beside plain selective recomputation (the attention core), for
    the models Megatron-Core's MoE recipes name them on: the two output-discarding modules of an MoE
    layer's path (layernorm, moe_act: a norm and an activation run again, no GEMM), and with latent
    attention its up-projections too (mla_up_proj: DeepSeek-V3's recipes). Dense models: none."""
    sets = []
    if model.moe is not None:
        sets.append("layernorm,moe_act")
    if getattr(model, "mla", None) is not None:
        sets.append("layernorm,mla_up_proj" + (",moe_act" if model.moe is not None else ""))
    return tuple(sets)


def _with_recompute_module_sets(both: SimpleNamespace, sets: tuple[str, ...]) -> tuple[SimpleNamespace, int]:
    """``both`` with each selective candidate repeated once per module list of ``sets`` (its
    recompute_modules_mask set), and how many rows that added; the rules then drop the repeats an
    engine or a model cannot run."""
    n = both.tp.size
    sel = np.nonzero(np.asarray(both.recompute_code) == Recompute.SELECTIVE)[0]
    if not sets or sel.size == 0:
        return both, 0
    idx = np.concatenate([np.arange(n)] + [sel] * len(sets))
    rows = {k: (v[idx] if isinstance(v, np.ndarray) and v.shape == (n,) else v) for k, v in vars(both).items()}
    rows["recompute_modules_mask"] = np.concatenate(
        [np.asarray(both.recompute_modules_mask)] + [np.full(sel.size, recompute_modules_mask(m)) for m in sets])
    return SimpleNamespace(**rows), sel.size * len(sets)


def searched_switches(fixed: Mapping, options: SpaceOptions, engine: int, dtype: str = "bf16") -> tuple[str, ...]:
    """The ENGINE_SWITCHES the search tries both ways: those the engine offers and ``--fix`` does not pin,
    unless ``options.engine_switches`` is off. grad_reduce_bf16 only for a dtype Megatron-LM trains under
    --bf16 (bf16, and the fp8 / fp4 recipes over it): its arguments.py turns the option into
    accumulate_allreduce_grads_in_fp32=False inside the bf16 branch, so under fp16 or fp32 it is no switch."""
    if not options.engine_switches:
        return ()
    return tuple(c for c in ENGINE_SWITCHES if c not in fixed and SPECS[int(engine)].offers(c)
                 and (c != "grad_reduce_bf16" or dtype == Dtype.BF16.label or is_fp8(dtype)))


def _switch_variants(pairs: SimpleNamespace, scene, keep: np.ndarray, switches: tuple[str, ...]):
    """(the kept pairs on which turning ``switches`` on where they run changes something, their
    columns with those switches on): the one extra variant per pair, every switch on where its rules
    (OPT_IN_FLAG_RULES) let it run. The rules of the other stages do not read these columns, so a kept
    pair's variant is legal as well."""
    n = pairs.tp.size
    if not switches:
        return np.zeros(0, int), {}
    on = {c: _opt_in_flag_where_it_runs(pairs, scene, c, True) for c in switches}
    differs = keep & np.any([on[c] & ~np.asarray(getattr(pairs, c), bool) for c in switches], axis=0)
    which = np.flatnonzero(differs) if n else np.zeros(0, int)
    return which, {c: on[c][which] for c in switches}


def compose(model, job, cluster, options: SpaceOptions | None = None) -> tuple[PlanBatch, Counter, int]:
    """(legal candidates, rejected counts by reason, total composed): :func:`compose_candidates` with
    every candidate's columns built (the search builds them a chunk at a time instead)."""
    cands, rejected, composed = compose_candidates(model, job, cluster, options)
    return cands.take(slice(None)), rejected, composed


def compose_candidates(model, job, cluster, options: SpaceOptions | None = None) -> tuple[Candidates, Counter, int]:
    """(legal candidates, rejected counts by reason, total composed).

    Formed in steps with the same result as one flat product: the degree axes (tp, pp, cp, vpp,
    micro-batch, schedule, ep, cp mode) and the categorical axes (sp, ZeRO, recompute, offload,
    optimizer, delayed update, expert TP) are each filtered by their own rules, a rejection counting
    once per combination of the other group's axes; then the survivors are crossed and the rules
    that mix both groups applied. The rules are :data:`paraplan.plan.RULES`, in table order.

    The crossed rules read few columns (tp, pp, cp, dp, ep, schedule of the first group; sp, ZeRO,
    recompute, expert TP of the second), so they are applied once per distinct pair of those
    projections (:func:`_projection`), each pair counting for every candidate it stands for, and not
    per candidate (DeepSeek-V3 on 1024 GPUs: 7.3 million crossed candidates, some 10⁵ distinct pairs).
    The candidates come back in the order of the flat product: the crossed pairs row-major (degree
    tuple outer), then for each searched recompute-module list the selective ones again, then (with
    ``options.engine_switches``) every candidate on which an engine switch can run again, with each
    switch it can run on (:func:`searched_switches`, :func:`_switch_variants`).
    """
    options = options or SpaceOptions()
    fixed = normalize_fix(options.fixed)
    ch = axis_choices(model, job, cluster, options)
    dtype = ch.pop("_dtype")
    engine = ch.pop("_engine")
    gpus = cluster.num_gpus
    scene = Scene(model, job, cluster, fixed.get("dp") or None)
    a = _grid(ch, FIRST_AXES)
    b = _grid(ch, SECOND_AXES)
    n1, n2 = a["tp"].size, b["sp"].size
    rejected: Counter = Counter()
    mp = a["tp"] * a["pp"] * a["cp"]
    first = _first_view(a, np.where(gpus % mp == 0, gpus // np.maximum(mp, 1), 0), dtype, engine, fixed)
    keep1 = _apply(_stage_rules(1), first, scene, np.ones(n1, bool), rejected, n2)
    second = _second_view(b, dtype, engine)
    keep2 = _apply(_stage_rules(2), second, scene, np.ones(n2, bool), rejected, int(keep1.sum()))
    f = {k: v[keep1] for k, v in vars(first).items() if k not in ("dtype", "engine_code")}
    g = {k: v[keep2] for k, v in vars(second).items() if k not in ("dtype", "engine_code")}
    batch_wide = batch_wide_columns(fixed, options, engine, cluster.accelerator.flash_attention)
    sets = (searched_recompute_module_sets(model)
            if "recompute_modules" not in fixed and SPECS[int(engine)].offers("recompute_modules") else ())

    # the crossed rules on the distinct projections: pair (u, v) stands for count1[u]·count2[v] candidates
    keys1, keys2 = sorted(CROSSED.intersection(f)), sorted(CROSSED.intersection(g))
    rep1, inv1, count1 = _projection(f, keys1)
    rep2, inv2, count2 = _projection(g, keys2)
    u1, u2 = rep1.size, rep2.size
    pairs = SimpleNamespace(**{k: np.repeat(f[k][rep1], u2) for k in keys1},
                            **{k: np.tile(g[k][rep2], u1) for k in keys2}, dtype=dtype, engine_code=engine)
    pairs.etp = np.where(pairs.etp_is_tp, pairs.tp, 1)
    for k, v in batch_wide.items():
        setattr(pairs, k, np.full(u1 * u2, v))
    for column in OPT_IN_FLAG_RULES:
        setattr(pairs, column, _opt_in_flag_where_it_runs(pairs, scene, column, bool(fixed.get(column, False))))
    pairs.recompute_modules_mask = _recompute_modules_where_they_run(pairs, scene, fixed.get("recompute_modules", ""))
    weight = np.outer(count1, count2).ravel()
    pairs, _ = _with_recompute_module_sets(pairs, sets)
    sel_pairs = np.nonzero(np.asarray(pairs.recompute_code[:u1 * u2]) == Recompute.SELECTIVE)[0] if sets else \
        np.zeros(0, int)
    weight = np.concatenate([weight] + [weight[sel_pairs]] * len(sets))
    keep3 = _apply(_stage_rules(3), pairs, scene, np.ones(pairs.tp.size, bool), rejected, weight)
    varied, switched_on = _switch_variants(pairs, scene, keep3, searched_switches(fixed, options, engine, dtype))

    # back to candidates, in the flat product's order
    k2 = keep2.sum()
    sel2 = np.nonzero(g["recompute_code"] == Recompute.SELECTIVE)[0] if sets else np.zeros(0, int)
    extra = int(keep1.sum()) * sel2.size * len(sets)
    rows_f, rows_s, rows_p = [], [], []
    i, j = np.divmod(np.flatnonzero(keep3[:u1 * u2].reshape(u1, u2)[inv1][:, inv2]), max(k2, 1))
    rows_f.append(i), rows_s.append(j), rows_p.append(inv1[i] * u2 + inv2[j])
    slot = np.full(u1 * u2, -1)
    slot[sel_pairs] = np.arange(sel_pairs.size)
    for n in range(len(sets)):
        offset = u1 * u2 + n * sel_pairs.size
        kept = np.zeros(u1 * u2, bool)
        kept[sel_pairs] = keep3[offset:offset + sel_pairs.size]
        i, jj = np.divmod(np.flatnonzero(kept.reshape(u1, u2)[inv1][:, inv2[sel2]]), max(sel2.size, 1))
        j = sel2[jj]
        rows_f.append(i), rows_s.append(j), rows_p.append(offset + slot[inv1[i] * u2 + inv2[j]])
    per_pair = {k: np.asarray(getattr(pairs, k)) for k in (*OPT_IN_FLAG_RULES, "recompute_modules_mask")}
    if varied.size:         # the switch variants: again every candidate of a varied pair, pointing at its copy
        npairs = pairs.tp.size
        slot = np.full(npairs, -1)
        slot[varied] = np.arange(varied.size)
        all_f, all_s, all_p = (np.concatenate(r) for r in (rows_f, rows_s, rows_p))
        again = slot[all_p] >= 0
        rows_f.append(all_f[again]), rows_s.append(all_s[again]), rows_p.append(npairs + slot[all_p[again]])
        extra += int(again.sum())
        per_pair = {k: np.concatenate([v, switched_on[k] if k in switched_on else v[varied]])
                    for k, v in per_pair.items()}
    cands = Candidates(f, g, per_pair, {k: v for k, v in batch_wide.items() if k not in per_pair}, dtype, int(engine),
                       *(np.concatenate(r).astype(np.int32) for r in (rows_f, rows_s, rows_p)))
    return cands, rejected, n1 * n2 + extra


def _rule_columns(rules) -> frozenset:
    return frozenset().union(*(r.axes for r in rules))


#: the columns the crossed rules read (stage 3, and those that set the opt-in flags and the recompute
#: modules), with what etp is made of (tp, etp_is_tp) and recompute (a module list repeats the selective)
CROSSED = _rule_columns(_stage_rules(3) + list(RECOMPUTE_MODULES_RULES)
                        + [r for rules in OPT_IN_FLAG_RULES.values() for r in rules]) | {"tp", "etp_is_tp",
                                                                                         "recompute_code"}


def _projection(columns: dict, keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a representative row of each distinct value of ``keys``, each row's distinct value, rows per value)."""
    n = next(iter(columns.values())).size
    if not keys or n == 0:
        return np.zeros(min(n, 1), int), np.zeros(n, int), np.array([n] if n else [], dtype=np.int64)
    table = np.stack([np.asarray(columns[k], dtype=np.int64) for k in keys], axis=1)
    _, rep, inv, count = np.unique(table, axis=0, return_index=True, return_inverse=True, return_counts=True)
    return rep, inv.ravel(), count


@dataclass(frozen=True)
class Candidates:
    """The legal candidates of :func:`compose_candidates`, factored: candidate r is row ``rows_first[r]``
    of the degree group's columns ``first`` crossed with row ``rows_second[r]`` of the categorical
    group's ``second``, with the columns set per crossed pair (opt-in flags, recompute modules) at
    ``rows_pair[r]`` of ``per_pair``, and the batch-wide columns. ``take`` builds a :class:`PlanBatch`."""
    first: Mapping[str, np.ndarray]
    second: Mapping[str, np.ndarray]
    per_pair: Mapping[str, np.ndarray]
    batch_wide: Mapping[str, object]
    dtype: str
    engine_code: int
    rows_first: np.ndarray
    rows_second: np.ndarray
    rows_pair: np.ndarray

    def __len__(self) -> int:
        return self.rows_first.size

    def take(self, index) -> PlanBatch:
        """The candidates at ``index`` (a slice, an index array or a mask) as a PlanBatch."""
        i, j, p = self.rows_first[index], self.rows_second[index], self.rows_pair[index]
        n = i.size
        columns = {k: v[i] for k, v in self.first.items()}
        columns.update({k: v[j] for k, v in self.second.items() if k != "etp_is_tp"})
        columns["etp"] = np.where(self.second["etp_is_tp"][j], columns["tp"], 1)
        columns.update({k: v[p] for k, v in self.per_pair.items()})
        columns.update({k: np.full(n, v) for k, v in self.batch_wide.items()})
        return PlanBatch(**columns, engine_code=np.full(n, self.engine_code), dtype=self.dtype)

    def plan(self, i: int):
        """Candidate ``i`` as a Plan."""
        return self.take(np.array([i])).plan(0)
