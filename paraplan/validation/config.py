"""What one validation run trains, without torch: the harness's model (:class:`GPTConfig`), a
:class:`paraplan.plan.Plan` as the harness runs it (:func:`paraplan.validation.support.as_run`), and
the run's own options (:class:`RunOptions`: batch, steps, learning rate, op profiling).

The worker processes get the three as one JSON spec (:func:`run_spec`, read back by
:func:`read_run_spec`): the plan in its own ``to_dict`` / ``from_dict`` form, so the harness and
the estimator read the same field names (``sp``, ``vpp``, ``offload``, ...).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from paraplan.errors import ConfigError
from paraplan.plan import Plan

ATTENTION_CHOICES = ("math", "sdpa")
ACTIVATION_CHOICES = ("gelu", "swiglu")
NORM_CHOICES = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class GPTConfig:
    """Size of the validation model (tiny by default so CPU runs take seconds)."""

    vocab_size: int = 256
    seq_len: int = 32
    hidden: int = 64
    heads: int = 4
    layers: int = 4
    mlp_ratio: int = 4
    seed: int = 0
    attention: str = "math"  # "math": softmax(QK^T)V materialised (as in Korthikanti et al.
    #                          2022's activation count); "sdpa": fused scaled_dot_product_attention
    #: routed experts of every layer's MLP (0: a dense MLP), :mod:`paraplan.validation.apply_ep`
    experts: int = 0
    top_k: int = 2
    #: an expert's inner width (0: the dense MLP's, mlp_ratio · hidden)
    expert_ffn: int = 0
    #: the Llama family's choices: SwiGLU MLPs (gate and up projections, mlp_ratio · hidden wide),
    #: RMSNorm, linear layers without biases, grouped-query attention (kv_heads; 0: one per head)
    #: and rotary positions instead of the learned ones
    activation: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    kv_heads: int = 0
    rotary: bool = False
    #: Qwen3's QK-norm: an RMSNorm over each query and key head (head_dim weights shared by the heads)
    #: after the projection, before the rotary positions
    qk_norm: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "hidden", "heads", "layers", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.attention not in ATTENTION_CHOICES:
            raise ConfigError("model.attention", f"unknown value {self.attention!r}",
                              accepted=", ".join(ATTENTION_CHOICES))
        for name in ("experts", "expert_ffn"):
            if getattr(self, name) < 0:
                raise ConfigError(f"model.{name}", f"must be >= 0, got {getattr(self, name)}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ConfigError("model.top_k", f"top_k({self.top_k}) must be between 1 and experts({self.experts})",
                              accepted=f"1..{self.experts}")
        if self.hidden % self.heads:
            raise ConfigError("model.hidden", f"hidden({self.hidden}) is not divisible by "
                              f"heads({self.heads})")
        if self.activation not in ACTIVATION_CHOICES:
            raise ConfigError("model.activation", f"unknown value {self.activation!r}",
                              accepted=", ".join(ACTIVATION_CHOICES))
        if self.norm not in NORM_CHOICES:
            raise ConfigError("model.norm", f"unknown value {self.norm!r}", accepted=", ".join(NORM_CHOICES))
        if self.kv_heads < 0 or self.heads % self.n_kv:
            raise ConfigError("model.kv_heads", f"heads({self.heads}) is not a multiple of kv_heads({self.kv_heads})",
                              accepted=", ".join(str(d) for d in range(1, self.heads + 1) if self.heads % d == 0))
        if self.rotary and (self.hidden // self.heads) % 2:
            raise ConfigError("model.rotary", f"rotary positions need an even head size, got {self.hidden // self.heads}")

    @property
    def ffn(self) -> int:
        return self.mlp_ratio * self.hidden

    @property
    def expert_width(self) -> int:
        return self.expert_ffn or self.ffn

    @property
    def n_kv(self) -> int:
        """Key/value heads (grouped-query attention; the heads themselves without it)."""
        return self.kv_heads or self.heads

    @property
    def gated(self) -> int:
        """Matrices the MLP's first projection stacks: 2 for SwiGLU (gate, up), else 1."""
        return 2 if self.activation == "swiglu" else 1


@dataclass(frozen=True)
class RunOptions:
    """How long and on what batch one run trains; the layout itself is the Plan's."""

    #: sequences per optimizer step; 0: micro_batch · dp · pp (enough micro-batches to fill the pipe)
    global_batch: int = 0
    #: timed steps (the step time is their median)
    steps: int = 3
    #: untimed steps before them
    warmup: int = 1
    #: AdamW's learning rate
    lr: float = 1e-3
    #: one more step under torch.profiler for the per-op times
    profile_ops: bool = True

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError("steps", f"must be >= 1, got {self.steps}")
        for name in ("warmup", "global_batch"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")

    def for_plan(self, plan: Plan) -> "RunOptions":
        """These options with the global batch filled for ``plan`` (``micro_batch · dp · pp`` where 0)."""
        if self.global_batch:
            return self
        return replace(self, global_batch=plan.micro_batch * max(plan.dp, 1) * plan.pp)


def world_size(plan: Plan) -> int:
    """Ranks a plan runs on: tp · cp · pp · dp (dp filled)."""
    return plan.tp * plan.cp * plan.pp * plan.dp


def micro_batches(plan: Plan, options: RunOptions) -> int:
    """Micro-batches per step of each data-parallel rank."""
    return options.for_plan(plan).global_batch // (plan.micro_batch * plan.dp)


def run_spec(model: GPTConfig, plan: Plan, options: RunOptions, dump_grads: bool = False, **extra) -> dict:
    """The worker's JSON spec of one run (``extra``: e.g. the ``name`` of a run in a batch)."""
    return {**extra, "model": asdict(model), "plan": plan.to_dict(), "run": asdict(options),
            "dump_grads": bool(dump_grads)}


def read_run_spec(spec: Mapping[str, Any]) -> tuple[GPTConfig, Plan, RunOptions]:
    """(model, plan, options) of a spec written by :func:`run_spec`; unknown keys name the key."""
    model = _from_dict(GPTConfig, spec.get("model", {}), "model")
    plan = Plan.from_dict(spec.get("plan", {}), source="spec")
    if not plan.dp:
        raise ConfigError("plan.dp", "the harness runs a plan with dp filled (Plan.with_dp_for)", source="spec")
    options = _from_dict(RunOptions, spec.get("run", {}), "run")
    return model, plan, options.for_plan(plan)


def _from_dict(cls, data: Mapping[str, Any], where: str):
    known = {f.name for f in fields(cls)}
    extra = set(data) - known
    if extra:
        raise ConfigError(where, f"unknown keys {sorted(extra)}", accepted=", ".join(sorted(known)))
    return cls(**data)
