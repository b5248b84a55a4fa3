"""A parallelism plan: degrees, micro-batch, schedule, ZeRO, recomputation, offload, dtype.

Categorical choices are strings for people and small integer codes for the cost formulas, which
run over numpy arrays of plans (``paraplan.planner.search``) as well as over one plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from paraplan.errors import ConfigError

SCHEDULES = ("1f1b", "interleaved", "gpipe", "zb-h1")
RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "cpu", "nvme")
DTYPES = ("bf16", "fp16", "fp32")  # fp32: plain fp32 training (the CPU validation runs)
ZERO_STAGES = (0, 1, 2, 3)
CP_MODES = ("ring", "ulysses")
OPTIMIZERS = ("adam", "onebit-adam", "zero-one-adam", "onebit-lamb")


@dataclass(frozen=True)
class Plan:
    """How a job is laid out on the cluster. ``dp`` of 0 means "what the GPU count leaves"."""
    tp: int = 1
    pp: int = 1
    dp: int = 0
    cp: int = 1
    sp: bool = False
    vpp: int = 1
    micro_batch: int = 1
    schedule: str = "1f1b"
    zero: int = 0
    recompute: str = "none"
    offload: str = "none"
    offload_params: bool = False
    dtype: str = "bf16"
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    ep: int = 1
    etp: int = 1
    cp_mode: str = "ring"
    optimizer: str = "adam"
    delayed_update: bool = False
    # gradient accumulation over micro-batches fused into the weight-gradient GEMMs (Megatron-LM's
    # gradient_accumulation_fusion writes into main_grad with beta = 1); False: every micro-batch
    # after the first adds its gradients with separate kernels (plain PyTorch, DDP no_sync, FSDP)
    grad_accumulation_fusion: bool = True

    def __post_init__(self):
        for key in ("tp", "pp", "cp", "vpp", "micro_batch", "ep", "etp"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(key.replace("_", "-"), f"must be a positive integer, got {v!r}")
        if isinstance(self.dp, bool) or not isinstance(self.dp, int) or self.dp < 0:
            raise ConfigError("dp", f"must be a positive integer (or 0 for 'what is left'), got {self.dp!r}")
        choices = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "offload": OFFLOAD, "dtype": DTYPES,
                   "cp_mode": CP_MODES, "optimizer": OPTIMIZERS}
        for key, accepted in choices.items():
            if getattr(self, key) not in accepted:
                raise ConfigError(key, f"unknown value {getattr(self, key)!r}", accepted=", ".join(accepted))
        if self.zero not in ZERO_STAGES:
            raise ConfigError("zero", f"unknown ZeRO stage {self.zero!r}", accepted="0, 1, 2, 3")
        if self.vpp > 1 and self.schedule != "interleaved":
            raise ConfigError("vpp", f"vpp={self.vpp} needs --schedule interleaved (got {self.schedule})")
        if self.schedule == "interleaved" and self.pp == 1:
            raise ConfigError("schedule", "the interleaved schedule needs pp > 1")
        if self.offload_params and (self.offload == "none" or self.zero != 3):
            raise ConfigError("offload_params", "parameter offload (ZeRO-Infinity) needs --zero 3 and "
                              "--offload cpu or nvme")
        if self.offload != "none" and self.zero == 0:
            raise ConfigError("offload", "optimizer offload needs a ZeRO stage >= 1 (ZeRO-Offload builds on "
                              "ZeRO-2)", accepted="--zero 1, 2 or 3 with --offload cpu|nvme")
        if self.sp and self.tp == 1:
            raise ConfigError("sp", "Megatron sequence parallelism needs tp > 1")
        if self.tp % self.etp:
            raise ConfigError("etp", f"expert tensor parallelism etp({self.etp}) must divide tp({self.tp})")
        if self.optimizer != "adam" and self.zero > 0:
            raise ConfigError("optimizer", f"{self.optimizer} compresses the plain data-parallel all-reduce and "
                              "does not combine with ZeRO (DeepSpeed)", accepted="--zero 0")
        if self.delayed_update and self.offload != "cpu":
            raise ConfigError("delayed_update", "the one-step delayed parameter update (ZeRO-Offload DPU) needs "
                              "--offload cpu")

    # --- numeric codes for vectorized formulas ----------------------------------------------------
    @property
    def schedule_code(self) -> int:
        return SCHEDULES.index(self.schedule)

    @property
    def recompute_code(self) -> int:
        return RECOMPUTE.index(self.recompute)

    @property
    def offload_code(self) -> int:
        return OFFLOAD.index(self.offload)

    @property
    def cp_mode_code(self) -> int:
        return CP_MODES.index(self.cp_mode)

    @property
    def optimizer_code(self) -> int:
        return OPTIMIZERS.index(self.optimizer)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def with_dp_for(self, gpus: int) -> "Plan":
        """Fill dp = gpus / (tp·pp·cp) when it was left at 0."""
        if self.dp:
            return self
        mp = self.model_parallel
        if gpus % mp:
            raise ConfigError("gpus", f"tp({self.tp}) * pp({self.pp}) * cp({self.cp}) = {mp} does not divide "
                              f"gpus({gpus})", accepted=f"a GPU count that is a multiple of {mp}")
        return replace(self, dp=gpus // mp)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "plan") -> "Plan":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(unknown[0], "unknown plan key", accepted=", ".join(sorted(names)), source=source)
        return cls(**dict(data))

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        parts.append(f"mb{self.micro_batch}")
        if self.sp:
            parts.append("sp")
        return " ".join(parts)


def check_plan(plan: Plan, model, job, cluster) -> Plan:
    """Check a plan against the model, the job and the cluster; return it with dp filled.

    Raises one ConfigError listing every violated rule with its factors.
    """
    gpus = cluster.num_gpus
    problems: list[str] = []
    if not plan.dp and gpus % plan.model_parallel:
        problems.append(f"tp({plan.tp}) * pp({plan.pp}) * cp({plan.cp}) = {plan.model_parallel} does not divide "
                        f"gpus({gpus})")
        plan = replace(plan, dp=max(1, gpus // plan.model_parallel))
    else:
        plan = plan.with_dp_for(gpus)
        if plan.tp * plan.pp * plan.dp * plan.cp != gpus:
            problems.append(f"tp({plan.tp}) * pp({plan.pp}) * dp({plan.dp}) * cp({plan.cp}) = "
                            f"{plan.tp * plan.pp * plan.dp * plan.cp} != gpus({gpus})")
    t, p, d, c, v, b = plan.tp, plan.pp, plan.dp, plan.cp, plan.vpp, plan.micro_batch
    if model.heads % t:
        problems.append(f"heads({model.heads}) % tp({t}) = {model.heads % t}, must be 0")
    if model.kv_heads % t and t % model.kv_heads:
        problems.append(f"kv_heads({model.kv_heads}) and tp({t}) must divide one another")
    if model.layers % (p * v):
        problems.append(f"layers({model.layers}) % (pp({p}) * vpp({v})) = {model.layers % (p * v)}, must be 0")
    if job.global_batch % (d * b):
        problems.append(f"global_batch({job.global_batch}) % (dp({d}) * micro_batch({b})) = "
                        f"{job.global_batch % (d * b)}, must be 0")
    else:
        m = job.global_batch // (d * b)
        if plan.schedule == "interleaved" and m % p:
            problems.append(f"micro-batches per step ({m}) % pp({p}) = {m % p}; the interleaved schedule "
                            "needs a multiple of pp")
    shard = c * (t if plan.sp else 1)
    if job.seq_len % shard:
        what = f"cp({c}) * tp({t})" if plan.sp else f"cp({c})"
        problems.append(f"seq_len({job.seq_len}) % {what} = {job.seq_len % shard}, must be 0")
    if c > 1 and plan.cp_mode == "ring" and job.seq_len % (2 * c):
        problems.append(f"seq_len({job.seq_len}) % (2 * cp({c})) must be 0 (load-balanced causal chunks)")
    if plan.dtype == "bf16" and "bf16" not in cluster.accelerator.peak_flops:
        problems.append(f"{cluster.accelerator.name} has no bf16 support; use --dtype fp16")
    if plan.ep > 1:
        if model.moe is None:
            problems.append(f"ep({plan.ep}) needs a mixture-of-experts model; {model.name} is dense")
        else:
            if d % plan.ep:
                problems.append(f"dp({d}) % ep({plan.ep}) = {d % plan.ep}, must be 0 (expert parallelism is "
                                "carved from data parallelism)")
            if model.moe.experts % plan.ep:
                problems.append(f"experts({model.moe.experts}) % ep({plan.ep}) = {model.moe.experts % plan.ep}, "
                                "must be 0")
    if plan.cp_mode == "ulysses" and c > 1 and (model.heads // t) % c:
        problems.append(f"Ulysses splits heads: heads/tp ({model.heads // t}) % cp({c}) must be 0")
    if problems:
        raise ConfigError("plan", "; ".join(problems))
    return plan
