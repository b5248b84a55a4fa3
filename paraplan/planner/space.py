"""The plan space: legal choices per axis, composed flat into numpy arrays of candidates.

Per axis (each respects what it can see alone): tp divides heads and the GPU count (and KV heads
divide tp or tp divides them); pp divides layers; cp divides the GPU count and leaves at least
``min_tokens_per_cp_rank`` tokens per rank; vpp divides layers/pp; micro-batch divides the global
batch; schedule, sequence parallelism, ZeRO stage, recomputation and offload from their lists.
Composition is the flat Cartesian product; cross-axis rules (degrees multiply to the GPU count,
batch divisible by dp·micro-batch, interleaving needs m % pp = 0, …) remove candidates and each
removal is counted under its reason.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Mapping

import numpy as np

from paraplan.errors import ConfigError
from paraplan.plan import CP_MODES, OFFLOAD, OPTIMIZERS, RECOMPUTE, SCHEDULES, Plan

AXES = ("tp", "pp", "cp", "vpp", "micro_batch", "schedule", "sp", "zero", "recompute", "offload", "offload_params")
OFFLOAD_CHOICES = (("none", False), ("cpu", False), ("nvme", False), ("cpu", True), ("nvme", True))


@dataclass(frozen=True)
class PlanBatch:
    """Many plans as parallel numpy arrays, with the attribute names the cost formulas read."""
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    sp: np.ndarray
    vpp: np.ndarray
    micro_batch: np.ndarray
    schedule_code: np.ndarray
    zero: np.ndarray
    recompute_code: np.ndarray
    offload_code: np.ndarray
    offload_params: np.ndarray
    flash_attention: np.ndarray
    overlap_grad_reduce: np.ndarray
    ep: np.ndarray = None
    etp: np.ndarray = None
    cp_mode_code: np.ndarray = None
    optimizer_code: np.ndarray = None
    delayed_update: np.ndarray = None
    grad_accumulation_fusion: np.ndarray = None
    dtype: str = "bf16"

    def __post_init__(self):
        n = len(self.tp)
        for name, default in (("ep", 1), ("etp", 1), ("cp_mode_code", 0), ("optimizer_code", 0),
                              ("delayed_update", False), ("grad_accumulation_fusion", True)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, default))

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, index) -> "PlanBatch":
        return PlanBatch(**{f.name: (getattr(self, f.name)[index] if f.name != "dtype" else self.dtype)
                            for f in fields(self)})

    def plan(self, i: int) -> Plan:
        return Plan(tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
                    sp=bool(self.sp[i]), vpp=int(self.vpp[i]), micro_batch=int(self.micro_batch[i]),
                    schedule=SCHEDULES[int(self.schedule_code[i])], zero=int(self.zero[i]),
                    recompute=RECOMPUTE[int(self.recompute_code[i])], offload=OFFLOAD[int(self.offload_code[i])],
                    offload_params=bool(self.offload_params[i]), dtype=self.dtype,
                    flash_attention=bool(self.flash_attention[i]),
                    overlap_grad_reduce=bool(self.overlap_grad_reduce[i]), ep=int(self.ep[i]), etp=int(self.etp[i]),
                    cp_mode=CP_MODES[int(self.cp_mode_code[i])], optimizer=OPTIMIZERS[int(self.optimizer_code[i])],
                    delayed_update=bool(self.delayed_update[i]),
                    grad_accumulation_fusion=bool(self.grad_accumulation_fusion[i]))


@dataclass(frozen=True)
class SpaceOptions:
    """What the search may choose. ``fixed`` pins axes (``{"tp": 8}``); the rest are defaults."""
    fixed: Mapping[str, object] = None
    max_micro_batch: int = 64
    max_vpp: int = 8
    max_tp: int = 64
    min_tokens_per_cp_rank: int = 1024
    allow_offload: bool = True
    allow_compression: bool = True
    allow_delayed_update: bool = False     # changes training semantics (one-step-stale weights): opt-in
    grad_accumulation_fusion: bool = True  # False: the engine adds micro-batch gradients unfused


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def axis_choices(model, job, cluster, options: SpaceOptions) -> dict[str, list]:
    """Legal values per axis, each judged on its own."""
    gpus = cluster.num_gpus
    tp = [t for t in divisors(gpus) if t <= options.max_tp and model.heads % t == 0
          and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]
    cp = [c for c in divisors(gpus) if job.seq_len % (2 * c) == 0 and job.seq_len // c >= options.min_tokens_per_cp_rank
          or c == 1]
    pp = [p for p in divisors(model.layers) if p <= gpus]
    vpp = [v for v in range(1, options.max_vpp + 1)]
    mb = [b for b in divisors(job.global_batch) if b <= options.max_micro_batch]
    ep = [e for e in divisors(gpus) if model.moe and model.moe.experts % e == 0] or [1]
    dtype_ok = "bf16" in cluster.accelerator.peak_flops
    choices = {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "micro_batch": mb, "schedule": list(range(len(SCHEDULES))),
               "ep": ep, "cp_mode": [0, 1] if len(cp) > 1 else [0],
               "sp": [False, True], "zero": [0, 1, 2, 3], "recompute": list(range(len(RECOMPUTE))),
               "offload": list(range(len(OFFLOAD_CHOICES) if options.allow_offload else 1)),
               "optimizer": list(range(len(OPTIMIZERS))) if options.allow_compression else [0],
               "delayed_update": [False, True] if options.allow_offload and options.allow_delayed_update else [False],
               "etp_is_tp": [False, True] if model.moe else [False]}
    fixed = dict(options.fixed or {})
    for key, value in fixed.items():
        if key == "dp":
            continue
        if key == "etp":
            choices["etp_is_tp"] = [value != 1]
            continue
        if key == "offload_params":
            choices["offload"] = [i for i in choices["offload"] if OFFLOAD_CHOICES[i][1] == bool(value)]
            continue
        if key not in choices:
            raise ConfigError("--fix", f"unknown axis {key!r}", accepted=", ".join(sorted(set(choices) | {'dp', 'etp'})))
        if key == "schedule":
            value = SCHEDULES.index(value)
        elif key == "recompute":
            value = RECOMPUTE.index(value)
        elif key == "cp_mode":
            value = CP_MODES.index(value)
        elif key == "optimizer":
            value = OPTIMIZERS.index(value)
        elif key == "offload":
            params = fixed.get("offload_params")
            value = [i for i, (o, p) in enumerate(OFFLOAD_CHOICES) if o == value and (params is None or p == params)]
        choices[key] = value if isinstance(value, list) else [value]
    choices["_dtype"] = "bf16" if dtype_ok else "fp16"
    return choices


def _grid(ch: dict, keys) -> dict:
    grids = np.meshgrid(*[np.asarray(ch[k]) for k in keys], indexing="ij")
    return {k: g.ravel() for k, g in zip(keys, grids)}


def _apply(rules, keep, rejected: Counter, weight):
    """Remove candidates rule by rule; each removal counts ``weight`` full combinations
    (a number, or one weight per candidate)."""
    for reason, bad in rules:
        newly = keep & bad
        n = int(np.sum(np.where(newly, weight, 0)))
        if n:
            rejected[reason] += n
        keep &= ~bad
    return keep


FIRST_AXES = ("tp", "pp", "cp", "vpp", "micro_batch", "schedule", "ep", "cp_mode")
SECOND_AXES = ("sp", "zero", "recompute", "offload", "optimizer", "delayed_update", "etp_is_tp")


def compose(model, job, cluster, options: SpaceOptions | None = None) -> tuple[PlanBatch, Counter, int]:
    """(legal candidates, rejected counts by reason, total composed).

    Formed in steps with the same result as one flat product: the degree axes (tp, pp, cp, vpp,
    micro-batch, schedule, ep, cp mode) and the categorical axes (sp, ZeRO, recompute, offload,
    optimizer, delayed update, expert TP) are each filtered by their own rules, a rejection counting
    once per combination of the other group's axes; then the survivors are crossed and the rules
    that mix both groups applied.
    """
    options = options or SpaceOptions()
    ch = axis_choices(model, job, cluster, options)
    dtype = ch.pop("_dtype")
    gpus = cluster.num_gpus
    a = _grid(ch, FIRST_AXES)
    b = _grid(ch, SECOND_AXES)
    n1, n2 = a["tp"].size, b["sp"].size
    total = n1 * n2
    rejected: Counter = Counter()
    # --- degree axes ---------------------------------------------------------------------------
    mp = a["tp"] * a["pp"] * a["cp"]
    dp = np.where(gpus % mp == 0, gpus // np.maximum(mp, 1), 0)
    interleaved = SCHEDULES.index("interleaved")
    m = np.where(dp > 0, job.global_batch // np.maximum(dp * a["micro_batch"], 1), 0)
    fixed_dp = (options.fixed or {}).get("dp")
    heads_per_tp = model.heads // a["tp"]
    rules = [
        ("tp*pp*cp does not divide the GPU count", gpus % mp != 0),
        ("dp differs from --fix dp", (dp != fixed_dp) if fixed_dp else np.zeros(n1, bool)),
        ("global batch not divisible by dp*micro_batch",
         (dp > 0) & (job.global_batch % np.maximum(dp * a["micro_batch"], 1) != 0)),
        ("layers not divisible by pp*vpp", model.layers % (a["pp"] * a["vpp"]) != 0),
        ("schedule irrelevant without pipeline (pp=1 keeps 1f1b)", (a["pp"] == 1) & (a["schedule"] != 0)),
        ("vpp>1 needs the interleaved schedule and vice versa", (a["vpp"] > 1) != (a["schedule"] == interleaved)),
        ("interleaved needs micro-batches % pp == 0", (a["schedule"] == interleaved) & (m % a["pp"] != 0)),
        ("ep must divide dp", (dp > 0) & (dp % a["ep"] != 0)),
        ("cp mode irrelevant without context parallelism", (a["cp"] == 1) & (a["cp_mode"] != 0)),
        ("Ulysses needs heads/tp divisible by cp", (a["cp_mode"] == 1) & (heads_per_tp % a["cp"] != 0)),
    ]
    keep1 = _apply(rules, np.ones(n1, bool), rejected, n2)
    # --- categorical axes (weights: surviving degree tuples) --------------------------------------
    off_dev = np.array([OFFLOAD.index(o) for o, _ in OFFLOAD_CHOICES])[b["offload"]]
    off_par = np.array([p for _, p in OFFLOAD_CHOICES])[b["offload"]]
    rules_b = [
        ("offload needs ZeRO>=1, parameter offload ZeRO-3",
         ((off_dev > 0) & (b["zero"] == 0)) | (off_par & (b["zero"] != 3))),
        ("compressed optimizers need ZeRO-0", (b["optimizer"] != 0) & (b["zero"] != 0)),
        ("delayed update needs CPU offload", b["delayed_update"] & (off_dev != OFFLOAD.index("cpu"))),
    ]
    keep2 = _apply(rules_b, np.ones(n2, bool), rejected, int(keep1.sum()))
    first = {k: v[keep1] for k, v in a.items()}
    first["dp"] = dp[keep1]
    second = {k: v[keep2] for k, v in b.items()}
    second["off_dev"], second["off_par"] = off_dev[keep2], off_par[keep2]
    nf, ns = first["tp"].size, second["sp"].size
    rep = {k: np.repeat(v, ns) for k, v in first.items()}
    til = {k: np.tile(v, nf) for k, v in second.items()}
    rules_c = [
        ("sequence parallelism needs tp>1", til["sp"] & (rep["tp"] == 1)),
        ("seq_len not divisible by cp*tp under sequence parallelism",
         til["sp"] & (job.seq_len % (rep["cp"] * rep["tp"]) != 0)),
        ("expert tensor parallelism needs tp>1", til["etp_is_tp"] & (rep["tp"] == 1)),
    ]
    keep3 = _apply(rules_c, np.ones(rep["tp"].size, bool), rejected, 1)
    idx = np.nonzero(keep3)[0]
    n = idx.size
    batch = PlanBatch(
        tp=rep["tp"][idx], pp=rep["pp"][idx], dp=rep["dp"][idx], cp=rep["cp"][idx], sp=til["sp"][idx],
        vpp=rep["vpp"][idx], micro_batch=rep["micro_batch"][idx], schedule_code=rep["schedule"][idx],
        zero=til["zero"][idx], recompute_code=til["recompute"][idx], offload_code=til["off_dev"][idx],
        offload_params=til["off_par"][idx], flash_attention=np.full(n, cluster.accelerator.flash_attention), overlap_grad_reduce=np.ones(n, bool),
        ep=rep["ep"][idx], etp=np.where(til["etp_is_tp"][idx], rep["tp"][idx], 1),
        cp_mode_code=rep["cp_mode"][idx], optimizer_code=til["optimizer"][idx],
        delayed_update=til["delayed_update"][idx], grad_accumulation_fusion=np.full(n, options.grad_accumulation_fusion),
        dtype=dtype)
    return batch, rejected, total
