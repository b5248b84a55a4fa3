"""Uneven pipeline stages and per-stage recomputation for a chosen plan (the optima of the ILPs of ilp.py).

The closed-form estimate splits layers evenly. Real models are not even: the embedding sits on the
first stage, the LM head (and the loss over the vocabulary) on the last, MoE layers weigh more than
dense ones, and under 1F1B stage s holds min(m, p − s) micro-batches. Here every layer becomes an
``ilp.LayerCost`` built from the same cost model (forward + backward + the plan's recomputation and
tensor/context/expert communication, model-state bytes after tp/ep/ZeRO, activation bytes per
micro-batch), the partition balances the slowest stage under the memory cap, and the
recomputation then picks how many layers each stage recomputes (Megatron's
--recompute-num-layers, per stage) so every stage fits at the least added time.

Both are the optima of the ILPs of ``ilp.py``, found by exact methods that need no solver: the
contiguous partition by dynamic programming (``partition_stages_dp``, milliseconds; CBC spent its
whole time limit, 5 s, on a 64-stage pipeline without proving the same split), the recomputation by
taking each stage's fewest layers that fit (``recompute_fewest_that_fit``). ``ilp=True`` solves the
ILPs with CBC instead (tests compare the two).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.costmodels import compute as C
from paraplan.costmodels import memory as M
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import RUNTIME_RESERVED_BYTES, layers_time
from paraplan.costmodels.kernels import tokens_per_rank
from paraplan.planner.ilp import (LayerCost, PipelineSpec, StageRecomputeCost, in_flight_per_stage,
                                  partition_from_boundaries, partition_stages, partition_stages_dp, plan_recompute,
                                  recompute_fewest_that_fit)
from paraplan.engines import spec_named
from paraplan.errors import InfeasiblePlan
from paraplan.workloads.transformer import LAYER_KINDS
from paraplan.plan import Plan, expert_data_parallel, stage_layer_counts


@dataclass(frozen=True)
class StageLayout:
    """Uniform and ILP-balanced splits of one plan, and the per-stage recomputation."""
    layer_names: tuple[str, ...]
    uniform_boundaries: tuple[int, ...]
    uniform_bottleneck_s: float
    boundaries: tuple[int, ...]
    bottleneck_s: float
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    partition_status: str
    recompute_layers: tuple[int, ...] | None
    recompute_status: str | None
    pipeline_time_uniform_s: float
    pipeline_time_balanced_s: float

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "layer_names"}


def _f(x) -> float:
    return float(np.asarray(x))


def _variant(model, moe_layer: bool):
    """The model with every layer dense, or every layer MoE (for per-layer costs)."""
    if not moe_layer:
        return replace(model, moe=None)
    return replace(model, moe=replace(model.moe, every=1, first_dense=0))


def layer_costs(model, job, cluster, plan: Plan, curves=None, recompute: str | None = None) -> list[LayerCost]:
    """Embedding, each transformer layer, LM head as ``LayerCost`` under the plan."""
    curves = curves or curves_for(cluster)
    # another recompute mode drops the plan's module list (Megatron's --recompute-modules is selective's)
    swap = {"recompute": recompute, "recompute_modules": plan.recompute_modules if recompute == "selective" else ""}
    if recompute == "full":
        # switches that refuse full recomputation are dropped for these costs: neither changes what a layer
        # saves (the EP overlap pairs micro-batches; activation offload moves saved tensors to the host)
        swap.update(ep_comm_overlap=False, offload_activation_layers=0)
    p = replace(plan, pp=1, vpp=1, schedule="1f1b", **(swap if recompute else {}))

    def one_layer(moe_layer: bool) -> LayerCost:
        m = _variant(model, moe_layer)
        lt = C.layer_times(m, job, p, curves, cluster)
        t = layers_time(1, lt)
        params = (m.params_per_moe_layer - m.routed_expert_params_per_moe_layer if moe_layer else m.params_per_layer)
        states = sum(M.model_state_bytes(params / plan.tp, p).values())
        if moe_layer:
            experts = m.routed_expert_params_per_moe_layer / (plan.ep * plan.etp)
            states += sum(M.model_state_bytes(experts, p, shard_degree=expert_data_parallel(plan)).values())
        acts = M.activation_bytes_per_layer(m, job, p)
        return LayerCost("moe" if moe_layer else "dense", _f(t), _f(states), _f(acts))

    if getattr(model, "layer_pattern", ""):
        return _hybrid_layer_costs(model, job, cluster, plan, p, curves)
    dense = one_layer(False)
    moe = one_layer(True) if model.moe else None
    moe_start = model.moe.first_dense if model.moe else model.layers
    every = model.moe.every if model.moe else 1
    ht = C.head_times(model, job, p, curves, cluster)
    T = _f(tokens_per_rank(job, p))
    emb_states = sum(M.model_state_bytes(model.embedding_params / plan.tp, p).values())
    head_params = model.lm_head_params + (model.vocab * model.hidden if model.tied_embeddings else 0)
    head_states = sum(M.model_state_bytes(head_params / plan.tp, p).values())
    out = [LayerCost("embedding", _f(ht["embedding"]), _f(emb_states), 3 * T * model.hidden)]
    for i in range(model.layers):
        is_moe = moe is not None and i >= moe_start and (i - moe_start) % every == every - 1
        out.append(replace(moe if is_moe else dense, name=f"{'moe' if is_moe else 'dense'}-{i}"))
    out.append(LayerCost("lm_head", _f(ht["head"] + ht["tp_comm"]), _f(head_states),
                         4.0 * T * model.vocab / plan.tp + 2 * T * model.hidden))
    return out


def _embedding_and_head(model, job, cluster, plan: Plan, p: Plan, curves) -> tuple[LayerCost, LayerCost]:
    ht = C.head_times(model, job, p, curves, cluster)
    T = _f(tokens_per_rank(job, p))
    emb_states = sum(M.model_state_bytes(model.embedding_params / plan.tp, p).values())
    head_params = model.lm_head_params + (model.vocab * model.hidden if model.tied_embeddings else 0)
    head_states = sum(M.model_state_bytes(head_params / plan.tp, p).values())
    return (LayerCost("embedding", _f(ht["embedding"]), _f(emb_states), 3 * T * model.hidden),
            LayerCost("lm_head", _f(ht["head"] + ht["tp_comm"]), _f(head_states),
                      4.0 * T * model.vocab / plan.tp + 2 * T * model.hidden))


def _hybrid_layer_costs(model, job, cluster, plan: Plan, p: Plan, curves) -> list[LayerCost]:
    """A hybrid pattern's layers in order, each its kind's cost (compute.hybrid_kind_times,
    memory.hybrid_kind_activation_bytes, its kind's parameters over tp, an E layer's routed experts over
    ep·etp as a transformer MoE layer's): Mamba, attention, MLP and MoE layers
    weigh differently, so the partition ILP balances stages by the pattern, not by layer counts."""
    times = C.hybrid_kind_times(model, job, p, curves, cluster)
    acts = M.hybrid_kind_activation_bytes(model, job, p)
    kinds = {}
    for k in times:
        routed = model.routed_expert_params_per_moe_layer if k == "moe" else 0
        states = sum(M.model_state_bytes((model.kind_params(k) - routed) / plan.tp, p).values())
        if routed:      # an E layer's routed experts over ep·etp, sharded over the expert-data-parallel group
            states += sum(M.model_state_bytes(routed / (plan.ep * plan.etp), p,
                                              shard_degree=expert_data_parallel(plan)).values())
        kinds[k] = LayerCost(k, _f(layers_time(1, times[k])), _f(states), _f(acts[k]))
    emb, head = _embedding_and_head(model, job, cluster, plan, p, curves)
    layers = [replace(kinds[LAYER_KINDS[c]], name=f"{LAYER_KINDS[c]}-{i}") for i, c in enumerate(model.layer_pattern)]
    return [emb, *layers, head]


def _megatron_hybrid(model, plan: Plan) -> bool:
    """Megatron-LM's hybrid Mamba stack splits the pattern evenly over pp (mamba_block.py MambaStack
    ._select_layers_for_pipeline_parallel): it runs no other split, so there is none to balance."""
    return bool(getattr(model, "layer_pattern", "")) and spec_named(plan.engine).behaviour.hybrid_layers == "even"


def _pipeline_time(stage_times, m: int) -> float:
    """1F1B with unequal stages: (m − 1)·t_max + Σ t_i (pipeline.py)."""
    return (m - 1) * max(stage_times) + sum(stage_times)


def stage_layout(model, job, cluster, plan: Plan, *, curves=None, max_memory_fraction: float = 1.0,
                 time_limit_s: float = 5.0, ilp: bool = False) -> StageLayout | None:
    """Balanced stages and per-stage recomputation for a plan with pp > 1 (None for pp = 1, and for ZBV,
    DualPipe and DualPipeV, whose ranks hold two chunks each, the first both ends of the model: the
    partition cuts one contiguous stage per rank; and for Megatron-LM's even hybrid split).

    Exact without a solver (``partition_stages_dp``, ``recompute_fewest_that_fit``); ``ilp=True``
    solves the two ILPs with CBC instead, each within ``time_limit_s``."""
    plan = plan.with_dp_for(cluster.num_gpus)
    if plan.pp == 1 or _megatron_hybrid(model, plan) or plan.schedule in ("zbv", "dualpipe", "dualpipev"):
        return None
    m = job.global_batch // (plan.dp * plan.micro_batch)
    cap = cluster.accelerator.memory_bytes * max_memory_fraction
    fixed = _f(M.buffer_bytes(model, plan, RUNTIME_RESERVED_BYTES))
    schedule = "gpipe" if plan.schedule == "gpipe" else "1f1b"
    spec = PipelineSpec(stages=plan.pp, micro_batches=m, schedule=schedule, memory_cap_bytes=cap,
                        fixed_bytes_per_stage=fixed)
    layers = layer_costs(model, job, cluster, plan, curves)
    if plan.recompute != "full":
        # partition on the plan's time with each layer's most frugal memory (its input only, as under
        # full recomputation); the per-stage recomputation below then decides where recomputing is needed
        frugal = layer_costs(model, job, cluster, plan, curves, recompute="full")
        layers = [replace(l, activation_bytes=f.activation_bytes) for l, f in zip(layers, frugal)]
    # the plan's own split (paraplan.plan.stage_layer_counts, uneven when pp does not divide the
    # layers); the embedding is item 0, so stage s > 0 starts after 1 + the layers before it
    counts = stage_layer_counts(model.layers, plan)
    uniform_b = tuple([0] + [1 + sum(counts[:s]) for s in range(1, plan.pp)])
    free = PipelineSpec(stages=plan.pp, micro_batches=m, schedule=schedule, memory_cap_bytes=float("inf"),
                        fixed_bytes_per_stage=fixed)
    uniform = partition_from_boundaries(layers, free, uniform_b)
    try:
        part = partition_stages(layers, spec, time_limit_s=time_limit_s) if ilp else partition_stages_dp(layers, spec)
    except InfeasiblePlan as e:
        return StageLayout(tuple(l.name for l in layers), uniform_b, uniform.bottleneck_time_s, (), float("nan"),
                           (), (), f"infeasible: {e}", None, None, _pipeline_time(uniform.stage_time_s, m),
                           float("nan"))
    rec_layers = rec_status = None
    if plan.recompute != "full":
        # per-stage recompute on the balanced split: recompute whole layers only where memory needs it
        full = frugal
        none = layer_costs(model, job, cluster, plan, curves, recompute="none")
        inflight = in_flight_per_stage(plan.pp, m, schedule)
        b = list(part.boundaries) + [len(layers)]
        stages = []
        for s in range(plan.pp):
            seg = range(b[s], b[s + 1])
            body = [i for i in seg if none[i].name.startswith(("dense", "moe"))]
            ends = [i for i in seg if i not in body]
            n = max(1, len(body))
            stages.append(StageRecomputeCost(
                layers=len(body), base_time_s=sum(none[i].time_s for i in seg),
                static_bytes=fixed + sum(none[i].weight_bytes for i in seg)
                + inflight[s] * sum(none[i].activation_bytes for i in ends),
                in_flight=inflight[s],
                activation_bytes_per_layer=sum(none[i].activation_bytes for i in body) / n,
                recomputed_activation_bytes_per_layer=sum(full[i].activation_bytes for i in body) / n,
                # a host-bound MoE layer (moe.MOE_HOST_SECONDS_PER_LAYER) recomputes inside its
                # wait: the difference is 0 up to rounding, never below
                recompute_time_per_layer_s=max(0.0, sum(full[i].time_s - none[i].time_s for i in body) / n)))
        try:
            rp = plan_recompute(stages, cap, time_limit_s=time_limit_s) if ilp else recompute_fewest_that_fit(stages, cap)
            rec_layers, rec_status = rp.layers_recomputed, rp.status
        except InfeasiblePlan as e:
            rec_status = f"infeasible: {e}"
    return StageLayout(
        layer_names=tuple(l.name for l in layers), uniform_boundaries=uniform_b,
        uniform_bottleneck_s=uniform.bottleneck_time_s, boundaries=part.boundaries,
        bottleneck_s=part.bottleneck_time_s, stage_time_s=part.stage_time_s,
        stage_memory_bytes=part.stage_memory_bytes, partition_status=part.status,
        recompute_layers=rec_layers, recompute_status=rec_status,
        pipeline_time_uniform_s=_pipeline_time(uniform.stage_time_s, m),
        pipeline_time_balanced_s=_pipeline_time(part.stage_time_s, m))


def describe_layout(layout: StageLayout, n_layers_total: int) -> str:
    if not layout.boundaries:
        return f"stage layout: {layout.partition_status}"
    b = list(layout.boundaries) + [n_layers_total]
    counts = [b[i + 1] - b[i] for i in range(len(b) - 1)]
    u = list(layout.uniform_boundaries) + [n_layers_total]
    ucounts = [u[i + 1] - u[i] for i in range(len(u) - 1)]
    lines = [f"stage layout ({layout.partition_status}): items per stage {counts} "
             f"(embedding and LM head count as items; uniform {ucounts})",
             f"  slowest stage {layout.bottleneck_s * 1e3:.1f} ms vs {layout.uniform_bottleneck_s * 1e3:.1f} ms uniform;"
             f" pipeline {layout.pipeline_time_balanced_s:.3f} s vs {layout.pipeline_time_uniform_s:.3f} s uniform"
             " (1F1B over the stages' layer times: (m - 1) x slowest + sum; not the step time above, which prices"
             " the plan's own schedule and the step's other terms)"]
    if layout.recompute_layers is not None:
        lines.append(f"  per-stage recomputation ({layout.recompute_status}): layers recomputed per stage "
                     f"{list(layout.recompute_layers)} (Megatron --recompute-num-layers per stage)")
    elif layout.recompute_status:
        lines.append(f"  per-stage recomputation: {layout.recompute_status}")
    return "\n".join(lines)
