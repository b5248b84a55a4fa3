"""The run ``paraplan validate`` launches, from a Plan and the model sizes asked for (no torch).

:func:`size_run` takes the Plan (flags over a plan file, as every command reads it), the harness
model's sizes the user gave (None where not given), the run options and the ranks, and returns the
:class:`SizedRun`: the plan as the harness runs it (dp filled; :func:`paraplan.validation.support.as_run`),
the harness's GPT (:class:`~paraplan.validation.config.GPTConfig`), the options and the notes on what
it took or fitted. The model is the harness's small GPT, sized for this machine (:data:`DEFAULT_MODEL`),
with, where a plan file names its model, that model's activation, norm, biases, positions, QK-norm,
the nearest grouped-query ratio the harness's heads allow and a mixture of experts' share of experts
per token and expert width on a few experts (flags given win); without a layer count, one layer per
pipeline chunk at least. Everything is checked here, before torch starts: a ConfigError names the field
(``tp``, ``kv_heads``, ``nproc_per_node``, ``model.hidden``; ``plan`` for a value a plan file set).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from paraplan.errors import ConfigError, ParaplanError
from paraplan.plan import Plan
from paraplan.validation.config import GPTConfig, RunOptions, world_size
from paraplan.validation.support import as_run, check_runs, check_supported, run_as_notes

# Sizes of the validation run: it runs on this machine, so a few thousand ranks or a model side of
# a million are far past anything it can launch; larger values are refused before torch starts.
MAX_RANKS = 4096
MAX_SIZE = 1_000_000
#: The model ``validate`` builds unless told otherwise: sized so that compute, not gloo's per-call
#: latency, makes the step on a CPU (about 3.7 M parameters; 256 tokens per micro-batch). With the
#: earlier default (hidden 64, sequence 32: 2.3 MB per rank) a step was ~10 ms, mostly collective
#: latency, and the step-time errors ran to -87 %. Measured errors: benchmarks/validate_defaults.py.
DEFAULT_MODEL = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 256, "vocab_size": 1024, "seed": 0}
#: warm-up steps before the timed ones: a fresh process's first passes run slower (allocator, caches)
DEFAULT_WARMUP = 3
#: timed steps: the step time is their median (validation.compare), so a few disturbed steps do not move it
DEFAULT_STEPS = 10
#: the harness model's architecture where neither the user nor a plan file's model gives it (the
#: attention is the harness's: sdpa under op-sac, :func:`size_model`)
ARCHITECTURE_DEFAULTS = {"activation": "gelu", "norm": "layernorm", "bias": True, "rotary": False, "qk_norm": False,
                         "attention": "math", "experts": 0, "top_k": 2, "kv_heads": 0, "expert_ffn": 0}
#: the harness model's keys a user may give (GPTConfig's fields but its fixed mlp_ratio)
MODEL_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab_size", "seed", *ARCHITECTURE_DEFAULTS)
#: the fewest routed experts the harness gives a plan file's mixture-of-experts model (a multiple of ep)
HARNESS_MIN_EXPERTS = 8


@dataclass(frozen=True)
class SizedRun:
    """One validation run, sized and checked: launch ``nproc_per_node`` ranks on each of ``nnodes``."""
    plan: Plan
    model: GPTConfig
    options: RunOptions
    nproc_per_node: int
    nnodes: int
    notes: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return world_size(self.plan)


def harness_layers(pp: int, vpp: int) -> int:
    """The harness's default layer count for a pipeline of ``pp`` stages of ``vpp`` chunks each:
    DEFAULT_MODEL's, or the smallest multiple of pp·vpp above it (each chunk runs whole layers, an
    equal number: validation.apply_pp.stage_layers)."""
    chunks = max(1, pp) * max(1, vpp)
    return -(-DEFAULT_MODEL["layers"] // chunks) * chunks


def harness_experts(experts: int, top_k: int, expert_width_ratio: float, ep: int, hidden: int,
                    etp: int) -> tuple[int, int, int]:
    """(experts, top-k, expert width) of the harness's small mixture of experts standing in for a model's
    ``experts`` routed experts, ``top_k`` per token, ``expert_width_ratio`` = expert width / hidden: the
    smallest multiple of ``ep`` from HARNESS_MIN_EXPERTS up (or the model's own count, if fewer, where
    ep divides it), the model's share of experts per token (k / E, at least one), and its width ratio on
    the harness's ``hidden``, rounded to a multiple of 8·etp (at least that: whole shards per rank)."""
    n = experts if experts <= HARNESS_MIN_EXPERTS and experts % ep == 0 else -(-max(HARNESS_MIN_EXPERTS, ep) // ep) * ep
    k = max(1, min(n, round(n * top_k / experts)))
    step = 8 * etp
    width = max(step, step * round(hidden * expert_width_ratio / step))
    return n, k, width


def harness_kv_heads(heads: int, tp: int, ratio: int) -> int:
    """Key/value heads for the harness's ``heads`` that come nearest a model's grouped-query ``ratio``
    (query heads per kv head) among those it can run: a divisor of ``heads`` and a multiple of ``tp``
    (whole kv heads per tp rank); of two equally near, the larger ratio. ``heads`` itself (multi-head
    attention) when nothing else qualifies."""
    options = [d for d in range(1, heads + 1) if heads % d == 0 and d % tp == 0] or [heads]
    return min(options, key=lambda d: (abs(heads / d - ratio), d))


def _plan_file_model(path):
    """The model preset a plan file was planned for, or None (none named, or it no longer reads)."""
    from paraplan.planfile import read_plan_file
    from paraplan.workloads.presets import load_model
    name = (read_plan_file(path).get("scenario") or {}).get("model")
    if not name:
        return None, None
    try:
        return name, load_model(name)
    except ParaplanError:   # a model file that is gone or no longer reads: the harness's defaults stay
        return name, None


def plan_model_experts(path) -> tuple[int, int, float] | None:
    """(routed experts, top-k, expert width / hidden) of a plan file's model where it names a
    mixture-of-experts preset; None for a dense one (or one that no longer reads)."""
    _, model = _plan_file_model(path)
    moe = None if model is None else model.moe
    return None if moe is None else (moe.experts, moe.top_k, moe.expert_ffn_hidden / model.hidden)


def plan_model_architecture(path) -> tuple[dict, list[str], int]:
    """(architecture, notes, grouped-query ratio) of a plan file's model where it names a preset:
    its activation, norm, biases, positions and QK-norm, which the harness's small model takes, and its
    query heads per key/value head (1 without grouped-query attention), which :func:`harness_kv_heads`
    fits to the harness's heads once the layout is known."""
    name, m = _plan_file_model(path)
    if m is None:
        return {}, [], 1
    arch = {"activation": m.activation if m.activation in ("gelu", "swiglu") else "gelu",
            "norm": m.norm, "bias": bool(m.bias), "rotary": bool(m.rotary), "qk_norm": bool(m.qk_norm)}
    notes = [f"architecture of {name}: {arch['activation']}, {arch['norm']}, "
             f"{'biases' if arch['bias'] else 'no biases'}, {'rotary' if arch['rotary'] else 'learned'} positions"
             + (", QK-norm" if arch["qk_norm"] else "")]
    if getattr(m, "layer_pattern", ""):
        notes.append(f"{name} is a hybrid Mamba-2 / attention model; the harness has no Mamba-2 layer and runs "
                     "transformer (attention + MLP) layers: it checks the plan's layout, not the Mamba-2 layer's cost")
    ratio = m.heads // m.kv_heads if m.kv_heads and m.heads % m.kv_heads == 0 else 1
    return arch, notes, ratio


def fill_dp(plan: Plan, nproc_per_node: int | None, nnodes: int = 1) -> tuple[Plan, int]:
    """(the plan with dp filled, ranks per node): dp = ranks / (tp·cp·pp) where the plan leaves it (0),
    1 when neither dp nor the ranks are given; the ranks tp·cp·pp·dp / nnodes where not given."""
    mp = plan.tp * plan.cp * plan.pp
    if nproc_per_node is not None:
        ranks = nproc_per_node * nnodes
        if not plan.dp and ranks % mp:
            raise ConfigError("nproc_per_node", f"{nproc_per_node} x nnodes {nnodes} = {ranks} ranks is not divisible "
                              f"by tp({plan.tp}) x cp({plan.cp}) x pp({plan.pp})", accepted=f"a multiple of {mp} ranks")
        if plan.dp and mp * plan.dp != ranks:
            raise ConfigError("nproc_per_node", f"{nproc_per_node} x nnodes {nnodes} ranks, but tp({plan.tp}) x "
                              f"cp({plan.cp}) x pp({plan.pp}) x dp({plan.dp}) = {mp * plan.dp}",
                              accepted=f"{mp * plan.dp} ranks in all")
    dp = plan.dp or (1 if nproc_per_node is None else nproc_per_node * nnodes // mp)
    if mp * dp > MAX_RANKS:
        raise ConfigError("tp/cp/pp/dp", f"{mp * dp} ranks in all, more than this harness launches",
                          accepted=f"at most {MAX_RANKS} ranks")
    if nproc_per_node is None:
        if mp * dp % nnodes:
            raise ConfigError("nnodes", f"world {mp * dp} not divisible by {nnodes}")
        nproc_per_node = mp * dp // nnodes
    return replace(plan, dp=dp), nproc_per_node


def size_model(plan: Plan, asked: Mapping[str, Any], plan_file: str | None = None) -> tuple[GPTConfig, list[str]]:
    """The harness's GPT for ``plan`` (dp filled): the sizes and architecture ``asked`` (MODEL_KEYS, None
    where not given), else a plan file's model's architecture, grouped-query ratio and experts, else the
    defaults; op-sac on the fused attention; without ``layers`` one layer per pipeline chunk at least.
    Returns it with the notes on what it took or fitted."""
    unknown = set(asked) - set(MODEL_KEYS)
    if unknown:
        raise ConfigError("model", f"unknown keys {sorted(unknown)}", accepted=", ".join(MODEL_KEYS))
    m = {k: v for k, v in asked.items() if v is not None}
    notes = []
    if plan_file:
        arch, arch_notes, ratio = plan_model_architecture(plan_file)
        notes += arch_notes
        for key, value in arch.items():
            m.setdefault(key, value)
        heads = m.get("heads", DEFAULT_MODEL["heads"])
        if ratio > 1 and "kv_heads" not in m and heads % plan.tp == 0:   # else the check names tp
            m["kv_heads"] = harness_kv_heads(heads, plan.tp, ratio)
            ran = heads // m["kv_heads"]
            notes.append(f"the plan's model has {ratio} query heads per key/value head; the harness's "
                         f"{heads} heads run {ran} ({m['kv_heads']} kv heads"
                         + (")" if ran == ratio else f": kv heads divide the {heads} heads and tp {plan.tp})"))
        found = plan_model_experts(plan_file) if "experts" not in m else None
        if found is not None:
            experts, top_k, ratio = found
            n, k, width = harness_experts(experts, top_k, ratio, plan.ep, m.get("hidden", DEFAULT_MODEL["hidden"]),
                                          plan.etp)
            m["experts"] = n
            m.setdefault("top_k", k)
            m.setdefault("expert_ffn", width)
            notes.append(f"the plan's model routes each token to {top_k} of {experts} experts {ratio:.3g} x hidden "
                         f"wide; the harness runs {m['top_k']} of {n} experts {m['expert_ffn']} wide (--experts, "
                         f"--top-k, --expert-ffn set them)")
    if "attention" not in m and plan.recompute == "op-sac":
        m["attention"] = "sdpa"
        notes.append("op-sac runs on --attention sdpa: it keeps the fused attention kernel's output")
    if "layers" not in m:
        m["layers"] = harness_layers(plan.pp, plan.vpp)
        if m["layers"] != DEFAULT_MODEL["layers"]:
            notes.append(f"pp {plan.pp} x {plan.vpp} virtual stages: the harness runs {m['layers']} layers "
                         f"(every pipeline chunk needs its own; --layers sets them)")
    for key, value in {**DEFAULT_MODEL, **ARCHITECTURE_DEFAULTS}.items():
        m.setdefault(key, value)
    return GPTConfig(**m), notes


def size_run(plan: Plan, asked: Mapping[str, Any], options: RunOptions, *, nproc_per_node: int | None = None,
             nnodes: int = 1, plan_file: str | None = None, flags_given=()) -> SizedRun:
    """The run ``validate`` launches for ``plan`` (see the module docstring), checked before torch starts.

    ``asked``: the model's MODEL_KEYS as given (None: not given); ``plan_file``: where the plan came from,
    ``flags_given`` the plan fields set beside it (a value the harness refuses is named by its flag, else
    by the file)."""
    notes = []
    if plan_file:
        notes.append(f"layout from {plan_file}; the model is the harness's (--layers/--hidden/...), not the plan's")
    check_supported(plan, plan_file, {f for f in plan.to_dict() if f not in set(flags_given)})
    for field in ("micro_batch", "vpp"):
        if getattr(plan, field) > MAX_SIZE:
            raise ConfigError(field, f"must be at most {MAX_SIZE:,} on the harness, got {getattr(plan, field):,}")
    plan, nproc = fill_dp(plan, nproc_per_node, nnodes)
    model, model_notes = size_model(plan, asked, plan_file)
    options = options.for_plan(plan)
    check_runs(plan, model, options)
    notes += run_as_notes(plan, model)
    if plan_file and plan.ep > 1:
        notes.append(f"ep {plan.ep} runs on the harness's mixture of experts (--experts, --top-k), dropless, "
                     f"ep carved from dp")
    return SizedRun(as_run(plan, model), model, options, nproc, nnodes, tuple(notes + model_notes))


def run_label(plan: Plan) -> str:
    """Short name of a harness plan: tp2, dp2 zero1, pp2 vpp2, ..."""
    parts = [f"{k}{v}" for k, v in (("tp", plan.tp), ("cp", plan.cp), ("pp", plan.pp), ("dp", plan.dp),
                                    ("ep", plan.ep), ("etp", plan.etp)) if v > 1]
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.vpp > 1:
        parts.append(f"vpp{plan.vpp}")
    if plan.sp:
        parts.append("sp")
    if plan.recompute != "none":
        parts.append(f"recompute {plan.recompute}")
    if plan.offload != "none":
        parts.append("optimizer offload")
    return " ".join(parts) or "single process"
