"""What the validation harness runs of a :class:`paraplan.plan.Plan`, and what it runs it as (no torch).

One table, :data:`SUPPORT`, says per plan field and value whether the harness **runs** it, runs it
**as** something else (and what: zb-h1 and GPipe as 1F1B, Ulysses as ring attention, bf16 as fp32,
any engine as plain PyTorch with the generic engine's accounting, ...) or **refuses** it (NVMe and
parameter offload, fp8). ``paraplan validate`` prints its notes and refusals from it, the worker and
the prediction run the plan it gives (:func:`as_run`), and ``docs/validation.md`` shows it
(:func:`support_rows`). A field the table does not list runs at its Plan default, said in a note when a
plan asks for another value.

The legality rules a Plan has are not repeated here: :func:`check_runs` evaluates the Plan's own
rules (:data:`paraplan.plan.RULES`) on the harness's model and batch, naming the field the harness
changes to satisfy them, and adds only the harness's own limits (:data:`HARNESS_LIMITS`: ZeRO-3
without a pipeline or expert parallelism, optimizer offload on ZeRO 1-2, expert tensor parallelism
over the whole tp group, op-level SAC on the fused attention, whole layers per pipeline chunk, ...).
Errors name the field (``tp``, ``sp``, ``kv_heads``, ``global_batch``); ``paraplan validate`` turns
them into its flags.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from paraplan.errors import ConfigError
from paraplan.plan import DTYPES, MODES, RULES_BY_NAME, ZERO_STAGES, Plan, PlanBatch, Scene, is_fp8
from paraplan.validation.config import GPTConfig, RunOptions

RUNS, RUNS_AS, REFUSED = "runs", "runs as", "refused"


@dataclass(frozen=True)
class Support:
    """What the harness does with ``field`` at ``values`` (None: every value no earlier entry names).

    ``what``: how it runs it, or for REFUSED what the harness has not (the error says "the validation
    harness runs no <what>"). ``runs_as`` (RUNS_AS, or RUNS where the value depends on the rest of the
    plan): the value the harness runs, or a function ``(plan, model) -> value``; ``as_text`` how a note
    names it (default: the value). ``accepted``: what a refused field takes instead."""
    field: str
    values: tuple | None
    verdict: str
    what: str = ""
    runs_as: Any = None
    as_text: str | None = None
    accepted: str | None = None

    def value_run(self, plan: Plan, model: GPTConfig):
        """The value the harness runs for this entry (the plan's own where it runs it)."""
        if self.runs_as is None:
            return getattr(plan, self.field)
        return self.runs_as(plan, model) if callable(self.runs_as) else self.runs_as

    def note(self, value, ran) -> str:
        """The note said when a plan asks for ``value`` and the harness runs ``ran``."""
        shown = _text(ran) if callable(self.runs_as) or not self.as_text else self.as_text
        return f"{self.field} {_text(value)} runs as {shown} ({self.what})"


def _s(field, values, verdict, what="", runs_as=None, as_text=None, accepted=None) -> Support:
    return Support(field, None if values is None else tuple(values), verdict, what, runs_as, as_text, accepted)


def runs_eager_elementwise(model: GPTConfig) -> bool:
    """Whether the harness's model runs the norms, activation or rotary positions as eager PyTorch ops
    (the estimator's ``fused_elementwise = False``): SwiGLU as silu and mul, RMSNorm (the model's, or
    its QK-norm) as its composite ops (PyTorch's CPU build has no fused kernel for it), rotary as
    q·cos + rotate_half(q)·sin. LayerNorm and GELU are one native kernel each, which the default
    (fused) describes."""
    return (getattr(model, "activation", "gelu") == "swiglu" or getattr(model, "norm", "layernorm") == "rmsnorm"
            or getattr(model, "rotary", False) or getattr(model, "qk_norm", False))


_FP8 = tuple(d for d in DTYPES if is_fp8(d))

#: per plan field, the first matching entry wins; fields or values not listed: :func:`_default_support`
SUPPORT: tuple[Support, ...] = (
    _s("tp", None, RUNS, "Megatron-LM's tensor parallelism: fused QKV and fc1 column-parallel, o and fc2 "
       "row-parallel, the vocabulary split over tp"),
    _s("pp", None, RUNS, "PipeDream-Flush 1F1B over pp stages, an equal run of whole layers per chunk"),
    _s("dp", None, RUNS, "data parallelism over the ranks tp·cp·pp leave (0: what they leave)"),
    _s("cp", None, RUNS, "ring attention over 2·cp load-balanced causal chunks (Megatron-LM's p2p context "
       "parallelism)"),
    _s("sp", None, RUNS, "Megatron sequence parallelism: all-gather and reduce-scatter around each "
       "parallel region"),
    _s("vpp", None, RUNS, "Megatron-LM's interleaved 1F1B, vpp chunks per stage"),
    _s("micro_batch", None, RUNS, "sequences per micro-batch"),
    _s("schedule", ("1f1b",), RUNS, "PipeDream-Flush 1F1B"),
    _s("schedule", ("interleaved",), RUNS, "interleaved 1F1B; with vpp 1 that is 1F1B",
       runs_as=lambda plan, model: "interleaved" if plan.vpp > 1 else "1f1b", as_text="1F1B"),
    _s("schedule", ("zb-h1", "gpipe"), RUNS_AS, "the harness has no zero-bubble or GPipe schedule",
       runs_as="1f1b", as_text="1F1B"),
    _s("schedule", ("zbv", "dualpipe", "dualpipev"), REFUSED,
       "V-placed or bidirectional schedules (ZBV, DualPipe, DualPipeV: two chunks per rank)",
       accepted="1f1b, interleaved (zb-h1 and gpipe run as 1F1B)"),
    _s("zero", (0, 1, 2), RUNS, "the harness's sharded AdamW: gradients all-reduced (0) or reduce-scattered "
       "and the parameters all-gathered (1, 2)"),
    _s("zero", (3,), RUNS, "FSDP2's fully_shard over the data-parallel ranks"),
    _s("recompute", ("none", "selective", "full", "op-sac"), RUNS,
       "selective: the attention core; full: each layer from its input; op-sac: torchtitan's op-level "
       "selective checkpointing on the fused attention"),
    _s("offload", ("none", "cpu"), RUNS, "cpu: the optimizer's states and fp32 master slice in host memory "
       "(ZeRO-Offload)"),
    _s("offload", ("nvme",), REFUSED, "nvme offload (it offloads the optimizer to host memory: none, cpu)",
       accepted="none, cpu"),
    _s("offload_params", (False,), RUNS, "parameters stay on the device"),
    _s("offload_params", (True,), REFUSED, "parameter offload", accepted="false"),
    _s("dtype", ("fp32",), RUNS, "fp32 throughout"),
    _s("dtype", ("bf16", "fp16"), RUNS_AS, "the harness trains in fp32; the prediction doubles the 16-bit "
       "activation bytes", runs_as="fp32"),
    _s("dtype", _FP8, REFUSED, "fp8 and fp4", accepted="bf16, fp16, fp32 (run as fp32)"),
    _s("flash_attention", None, RUNS_AS, "the harness model's attention decides: --attention math (the "
       "default) materialises the scores, sdpa is fused", runs_as=lambda plan, model: model.attention == "sdpa",
       as_text="--attention's"),
    _s("overlap_grad_reduce", None, RUNS_AS, "the harness reduces gradients after the backward below "
       "ZeRO-3; FSDP2 overlaps ZeRO-3's", runs_as=lambda plan, model: plan.zero == 3,
       as_text="true under ZeRO-3, else false"),
    _s("ep", None, RUNS, "on the harness's dropless mixture of experts (all-to-all dispatch), ep carved "
       "from dp"),
    _s("etp", None, RUNS, "1: each expert whole on every tp rank, run on its sequence shard; tp: each "
       "expert split over the tp group (with ep 1)"),
    _s("cp_mode", ("ring",), RUNS, "ring attention"),
    _s("cp_mode", ("ulysses",), RUNS_AS, "the harness's context parallelism", runs_as="ring",
       as_text="ring attention"),
    _s("optimizer", ("adam",), RUNS, "AdamW"),
    _s("optimizer", None, RUNS_AS, "the harness's AdamW", runs_as="adam"),
    _s("delayed_update", (False,), RUNS, "the update every step"),
    _s("delayed_update", (True,), RUNS_AS, "the harness updates the parameters every step", runs_as=False),
    _s("grad_accumulation_fusion", None, RUNS_AS, "autograd adds each micro-batch's gradients into .grad "
       "with separate kernels", runs_as=False),
    _s("fused_elementwise", None, RUNS_AS, "the harness model decides: LayerNorm and GELU are one native "
       "kernel each; SwiGLU, RMSNorm, rotary positions and QK-norm run as eager ops",
       runs_as=lambda plan, model: not runs_eager_elementwise(model), as_text="the model's"),
    _s("fused_softmax", None, RUNS_AS, "the prediction prices the harness's math attention with the fused "
       "softmax", runs_as=True),
    _s("rope_fusion", None, RUNS_AS, "the harness's eager rotary positions are priced through "
       "fused_elementwise false", runs_as=True),
    _s("engine", ("generic",), RUNS, "plain PyTorch, the ZeRO paper's accounting"),
    _s("engine", None, RUNS_AS, "the harness is plain PyTorch; the prediction uses the ZeRO paper's "
       "accounting", runs_as="generic"),
    _s("first_stage_layers", (0,), RUNS, "the even split"),
    _s("first_stage_layers", None, RUNS_AS, "the harness splits the layers evenly over the pipeline chunks",
       runs_as=0),
    _s("last_stage_layers", (0,), RUNS, "the even split"),
    _s("last_stage_layers", None, RUNS_AS, "the harness splits the layers evenly over the pipeline chunks",
       runs_as=0),
    _s("tp_comm_overlap", (False,), RUNS, "tp collectives on the critical path"),
    _s("tp_comm_overlap", (True,), RUNS_AS, "the harness does not overlap its tp collectives", runs_as=False),
    _s("grad_reduce_bf16", (False,), RUNS, "fp32 gradients"),
    _s("grad_reduce_bf16", (True,), RUNS_AS, "the harness reduces fp32 gradients", runs_as=False),
    _s("fp8_param_gather", (False,), RUNS, "no fp8 parameters"),
    _s("fp8_param_gather", (True,), REFUSED, "fp8", accepted="false"),
    _s("te_cross_entropy", (False,), RUNS, "the harness's cross-entropy"),
    _s("te_cross_entropy", (True,), RUNS_AS, "the harness runs its own cross-entropy", runs_as=False),
    _s("precision_aware_optimizer", (False,), RUNS, "AdamW's fp32 states"),
    _s("precision_aware_optimizer", (True,), REFUSED, "Transformer Engine's FusedAdam (a CUDA build)", accepted="false"),
    _s("optimizer_state_dtype", ("fp32",), RUNS, "fp32 moments"),
    _s("optimizer_state_dtype", ("bf16", "fp16", "fp8"), REFUSED, "Transformer Engine's FusedAdam (a CUDA build)", accepted="fp32"),
    _s("expandable_segments", (False,), RUNS, "the allocator's default segments"),
    _s("expandable_segments", (True,), RUNS_AS, "the harness keeps the allocator's default segments",
       runs_as=False),
    _s("offload_activation_layers", (0,), RUNS, "activations on the device"),
    _s("offload_activation_layers", None, RUNS_AS, "the harness keeps activations on the device", runs_as=0),
    _s("attention_kernel", ("auto",), RUNS, "PyTorch's attention (--attention)"),
    _s("attention_kernel", None, RUNS_AS, "the harness's attention is PyTorch's (--attention)", runs_as="auto"),
    _s("ep_comm_overlap", (False,), RUNS, "all-to-alls on the critical path"),
    _s("ep_comm_overlap", (True,), RUNS_AS, "the harness does not overlap its all-to-alls", runs_as=False),
    _s("moe_flex_dispatch", (False,), RUNS, "the all-to-all dispatcher"),
    _s("moe_flex_dispatch", (True,), RUNS_AS, "the harness's all-to-all dispatcher", runs_as=False),
    _s("recompute_modules", ("",), RUNS, "selective recomputes the attention core"),
    _s("recompute_modules", None, RUNS_AS, "the attention core", runs_as="", as_text="selective"),
)


def _default_support(field: str, value) -> Support:
    """A value the table does not list: the field's Plan default runs, any other runs as it."""
    default = next(f.default for f in fields(Plan) if f.name == field)
    if value == default:
        return Support(field, (default,), RUNS, "the Plan's default")
    return Support(field, None, RUNS_AS, "the harness has no such option", runs_as=default)


def support_of(field: str, value) -> Support:
    """The table's entry for one plan field's value."""
    for s in SUPPORT:
        if s.field == field and (s.values is None or value in s.values):
            return s
    return _default_support(field, value)


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else ("''" if value == "" else str(value))


def refused(plan: Plan) -> list[tuple[str, Any, Support]]:
    """(field, value, entry) of every value of ``plan`` the harness refuses, in field order."""
    out = []
    for f in fields(Plan):
        value = getattr(plan, f.name)
        s = support_of(f.name, value)
        if s.verdict == REFUSED:
            out.append((f.name, value, s))
    return out


def check_supported(plan: Plan, plan_file: str | None = None, from_file=()) -> None:
    """Refuse the first value the harness does not run: ConfigError naming the field, or ``plan`` with
    the file (``plan_file``) where the value came from it (``from_file``: the fields it set)."""
    for field, value, s in refused(plan):
        if plan_file and field in from_file:
            raise ConfigError("plan", f"{plan_file}: {field} {_text(value)}: the validation harness runs no {s.what}",
                              accepted=f"{field} {s.accepted}, or that field's flag beside the file")
        raise ConfigError(field, f"{_text(value)}: the validation harness runs no {s.what}", accepted=s.accepted)


def as_run(plan: Plan, model: GPTConfig) -> Plan:
    """The plan as the harness runs it on ``model``: every field at the value it runs (refused values
    are refused: :func:`check_supported`)."""
    check_supported(plan)
    changes = {}
    for f in fields(Plan):
        value = getattr(plan, f.name)
        run = support_of(f.name, value).value_run(plan, model)
        if run != value:
            changes[f.name] = run
    return replace(plan, **changes) if changes else plan


def run_as_notes(plan: Plan, model: GPTConfig) -> list[str]:
    """One note per value ``plan`` asks for (not a Plan default) that the harness runs differently."""
    notes = []
    run = as_run(plan, model)
    for f in fields(Plan):
        value, ran = getattr(plan, f.name), getattr(run, f.name)
        if value != f.default and ran != value:
            notes.append(support_of(f.name, value).note(value, ran))
    return notes


def _every_value(field: str) -> tuple | None:
    """Every value a field can take where there are few (booleans, modes, ZeRO stages); None if open."""
    default = next(f.default for f in fields(Plan) if f.name == field)
    if isinstance(default, bool):
        return (False, True)
    if field == "zero":
        return ZERO_STAGES
    if field in MODES:
        return MODES[field].labels()
    return None


def support_rows() -> list[tuple[str, str, str, str]]:
    """(field, values, verdict, what) for every plan field, in Plan's order: the table as the docs show it."""
    rows = []
    for f in fields(Plan):
        listed = [s for s in SUPPORT if s.field == f.name] or [_default_support(f.name, f.default)]
        named = {v for s in listed for v in (s.values or ())}
        every = _every_value(f.name)
        rest = None if every is None else [v for v in every if v not in named]
        if all(s.values is not None for s in listed) and (rest is None or rest):
            listed.append(replace(_default_support(f.name, object()), values=None if rest is None else tuple(rest)))
        for s in listed:
            values = ("any other" if len(listed) > 1 else "any") if s.values is None else \
                ", ".join(_text(v) for v in s.values)
            verdict = s.verdict
            if s.verdict == RUNS_AS:
                verdict = f"runs as {s.as_text or _text(s.runs_as)}"
            rows.append((f.name, values, verdict, s.what))
    return rows


# --- the harness's own limits, beyond the Plan's rules ---------------------------------------------

@dataclass(frozen=True)
class Limit:
    """One thing the harness cannot run that a Plan may ask for: ``bad(plan, model, options)``,
    ``message(...)`` and ``accepted(...)`` (or None), naming ``field``."""
    name: str
    field: str
    bad: Callable[[Plan, GPTConfig, RunOptions], bool]
    message: Callable[[Plan, GPTConfig, RunOptions], str]
    accepted: Callable[[Plan, GPTConfig, RunOptions], str | None] = lambda p, m, o: None


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


HARNESS_LIMITS: tuple[Limit, ...] = (
    Limit("whole-layers-per-chunk", "layers",
          lambda p, m, o: m.layers % (p.pp * p.vpp) != 0,
          lambda p, m, o: (f"layers({m.layers}) % (pp({p.pp}) * vpp({p.vpp})) = {m.layers % (p.pp * p.vpp)}: the "
                           "harness runs an equal number of whole layers on every pipeline chunk"),
          lambda p, m, o: f"a multiple of {p.pp * p.vpp}"),
    Limit("vocabulary-over-tp", "vocab_size",
          lambda p, m, o: m.vocab_size % p.tp != 0,
          lambda p, m, o: f"vocab_size({m.vocab_size}) is not divisible by tp({p.tp}) (the vocabulary is split over tp)",
          lambda p, m, o: f"a multiple of {p.tp}"),
    Limit("kv-heads-over-tp", "kv_heads",
          lambda p, m, o: m.n_kv % p.tp != 0,
          lambda p, m, o: f"{m.n_kv} key/value heads do not divide over tp({p.tp}) (whole key/value heads per "
                          "tp rank)",
          lambda p, m, o: f"a multiple of {p.tp}"),
    Limit("zero3-without-pipeline", "zero",
          lambda p, m, o: p.zero == 3 and p.pp > 1,
          lambda p, m, o: f"ZeRO-3 with pp({p.pp}) > 1 is not run by the harness",
          lambda p, m, o: "0-2 with pp > 1"),
    Limit("optimizer-offload-zero-1-2", "offload",
          lambda p, m, o: p.offload != "none" and p.zero not in (1, 2),
          lambda p, m, o: f"{p.offload} with zero {p.zero}: the harness offloads a ZeRO-1/2-sharded optimizer",
          lambda p, m, o: "zero 1 or 2 with offload cpu"),
    Limit("moe-under-tp-needs-sp", "sp",
          lambda p, m, o: bool(m.experts) and p.tp > 1 and not p.sp,
          lambda p, m, o: (f"mixture-of-experts layers with tp {p.tp} run under sequence parallelism "
                           "(Megatron-LM requires it)"),
          lambda p, m, o: "sp with tp > 1 and experts"),
    Limit("etp-needs-experts", "etp",
          lambda p, m, o: p.etp > 1 and not m.experts,
          lambda p, m, o: f"etp({p.etp}) needs a mixture-of-experts model",
          lambda p, m, o: "experts E, or etp 1"),
    Limit("etp-whole-tp-group", "etp",
          lambda p, m, o: p.etp not in (1, p.tp),
          lambda p, m, o: f"etp({p.etp}): the harness splits an expert over the whole tp group ({p.tp}) or not at all",
          lambda p, m, o: f"1, {p.tp}" if p.tp > 1 else "1"),
    Limit("etp-with-ep-1", "etp",
          lambda p, m, o: p.etp > 1 and p.ep > 1,
          lambda p, m, o: f"etp({p.etp}) with ep({p.ep}): the harness runs expert tensor parallelism with ep 1 only",
          lambda p, m, o: "etp 1 with ep > 1, or ep 1 with etp = tp"),
    Limit("expert-width-over-etp", "expert_ffn",
          lambda p, m, o: bool(m.experts) and m.expert_width % p.etp != 0,
          lambda p, m, o: (f"an expert's width {m.expert_width} is not divisible by etp({p.etp}) (each expert is "
                           "split over the tp group)"),
          lambda p, m, o: f"a multiple of {p.etp}"),
    Limit("zero3-without-ep", "zero",
          lambda p, m, o: p.zero == 3 and p.ep > 1,
          lambda p, m, o: (f"ZeRO-3 with ep({p.ep}) > 1 is not run by the harness (FSDP2 would shard experts that "
                           "differ across the data-parallel group)"),
          lambda p, m, o: "0-2 with ep > 1"),
    Limit("op-sac-on-fused-attention", "attention",
          lambda p, m, o: p.recompute == "op-sac" and m.attention != "sdpa",
          lambda p, m, o: (f"{m.attention}: recompute op-sac keeps the fused attention kernel's output, which the "
                           f"{m.attention} attention has not"),
          lambda p, m, o: "sdpa with recompute op-sac"),
    Limit("op-sac-dense", "recompute",
          lambda p, m, o: p.recompute == "op-sac" and bool(m.experts),
          lambda p, m, o: "the harness runs op-sac on dense MLPs only",
          lambda p, m, o: "none, selective or full with experts"),
    Limit("op-sac-without-cp", "recompute",
          lambda p, m, o: p.recompute == "op-sac" and p.cp > 1,
          lambda p, m, o: f"the harness runs op-sac without context parallelism (cp {p.cp})",
          lambda p, m, o: "none, selective or full with cp > 1"),
)


#: the Plan's own rules that the harness's model and batch can break, and the field the harness names
#: for each (with what it accepts): :func:`check_runs` evaluates them on the harness's model
PLAN_RULES_NAMED: dict[str, tuple[str, Callable[[Plan, GPTConfig, RunOptions], str | None]]] = {
    "tp-splits-heads": ("tp", lambda p, m, o: _divisors(m.heads)),
    "ring-balanced-chunks": ("cp", lambda p, m, o: ", ".join(str(c) for c in range(1, 65) if m.seq_len % (2 * c) == 0)),
    "seq-splits-over-cp-tp": ("sp", lambda p, m, o: f"seq_len a multiple of cp * tp = {p.cp * p.tp}"),
    "ep-needs-moe": ("ep", lambda p, m, o: f"experts E a multiple of {p.ep}, or ep 1"),
    "ep-divides-experts": ("ep", lambda p, m, o: _divisors(m.experts)),
    "ep-divides-dp": ("ep", lambda p, m, o: _divisors(p.dp) + " (or dp a multiple of ep)"),
    "batch-divisible": ("global_batch", lambda p, m, o: f"a multiple of micro_batch * dp = {p.micro_batch * p.dp}"),
    "interleaved-micro-batches": ("global_batch",
                                  lambda p, m, o: f"a multiple of micro_batch * dp * pp = {p.micro_batch * p.dp * p.pp}"),
}


def check_runs(plan: Plan, model: GPTConfig, options: RunOptions) -> None:
    """Raise ConfigError unless the harness runs ``plan`` (dp filled) on ``model`` with ``options``:
    its values (:data:`SUPPORT`), the Plan's rules on this model and batch (:data:`PLAN_RULES_NAMED`), then
    the harness's own limits (:data:`HARNESS_LIMITS`). The first problem, naming its field."""
    from paraplan.validation.predict import estimator_model   # the estimator's view of the harness model
    from paraplan.workloads.transformer import TrainingJob
    check_supported(plan)
    options = options.for_plan(plan)
    run = as_run(plan, model)
    view = PlanBatch.from_plans([run])
    scene = Scene(estimator_model(model), TrainingJob(model.seq_len, options.global_batch), None, run.dp)
    for name, (field, accepted) in PLAN_RULES_NAMED.items():
        rule = RULES_BY_NAME[name]
        if rule.mask(view, scene, 1)[0]:
            raise ConfigError(field, rule.explain(view, scene), accepted=accepted(run, model, options))
    for limit in HARNESS_LIMITS:
        if limit.bad(run, model, options):
            raise ConfigError(limit.field, limit.message(run, model, options), accepted=limit.accepted(run, model, options))


def support_markdown() -> str:
    """:func:`support_rows` as the Markdown table docs/validation.md holds (a test keeps them equal)."""
    lines = ["| plan field | value | the harness | how, or why not |", "| --- | --- | --- | --- |"]
    for field, values, verdict, what in support_rows():
        lines.append(f"| `{field}` | {values} | {verdict} | {what} |")
    return "\n".join(lines) + "\n"
