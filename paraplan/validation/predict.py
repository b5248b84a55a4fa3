"""The prediction side of ``paraplan validate``: the same ``estimate`` on this machine's profile.

:func:`predict_run` maps the harness model and plan onto the estimator's types and runs
:func:`paraplan.costmodels.estimate.estimate` on ``load_cluster('local', world)`` (the measured
profile as a cluster, :mod:`paraplan.profiles.cluster`), profiling first (quick mode) when the
database holds no profile of this machine.

Mapping (what the harness runs -> what the estimator is told):

* :class:`~paraplan.validation.model.GPTConfig` -> ``TransformerModel``: learned positions
  (``max_positions = seq_len``) or rotary ones, untied embeddings, a GELU or SwiGLU MLP of
  ``mlp_ratio · hidden``, biases or none (LayerNorm keeps its own), LayerNorm or RMSNorm, MHA or
  grouped-query attention (``kv_heads``), no dropout (the harness has none: no masks kept); with ``experts``
  a ``MoESpec`` (every layer, dropless, permute dispatch, ``expert_ffn_hidden`` the expert width),
  priced at ``moe_imbalance`` (validate --moe-imbalance, default 1 as estimate's; the run reports
  the busiest ep rank's load it measured, validation.apply_ep.expert_load).
* The harness's ``Plan`` -> the estimator's: the plan as the harness runs it
  (:func:`paraplan.validation.support.as_run`, the table of what it runs and runs as): tp, pp, dp, ep,
  etp, cp (``cp_mode = ring``: the harness runs ring attention, :mod:`paraplan.validation.apply_cp`),
  zero, micro_batch, recompute, sp, vpp (``interleaved`` when > 1, else ``1f1b``), offload (``cpu``:
  optimizer states in host memory; on a profiled CPU the estimator prices it as the same AdamW plus two
  copies, kernels.device_is_host); ``dtype = fp32`` (the harness trains in fp32); ``flash_attention``
  only for ``--attention sdpa``; ``fused_elementwise`` off when the model runs SwiGLU, RMSNorm or rotary
  positions (eager ops, :func:`paraplan.validation.support.runs_eager_elementwise`);
  ``grad_accumulation_fusion = False`` (autograd adds each micro-batch's gradients into ``.grad`` with
  separate kernels); every other field at its default (the generic engine). ``overlap_grad_reduce`` off
  below ZeRO-3 (the harness reduces gradients after the backward, not under it) and on for ZeRO-3
  (FSDP2 prefetches) except on a CPU device, where gloo's collectives run on the same cores as the
  ranks' compute and hide nothing.
* Terms, estimator -> harness names: compute + recompute + grad_accumulation -> ``compute`` (the
  harness times recomputation and the accumulation inside compute), tp_comm, cp_comm (with cp > 1),
  ep_comm (with ep > 1: the token all-to-alls and their counts), pp_comm + pp_bubble ->
  ``pp_comm`` (the harness's pipeline receives include the bubble), dp_comm, optimizer +
  offload -> ``optimizer``.
* ``other``, the harness's own work outside the estimator's terms (:func:`harness_other_time`):
  its gradient sync below ZeRO-3 first flattens every local gradient into one buffer
  (``torch.cat``, as DDP fills its buckets; Megatron-LM's contiguous gradient buffer, which the
  estimator describes, needs no such copy) and, with dp > 1, scales that buffer by 1/dp in place;
  each pass reads and writes the rank's gradient bytes, at the profile's measured copy bandwidth.
  Under sequence parallelism the gradients of the parameters each tp rank holds whole but ran on its
  own sequence shard (norms, biases, the router, and whole experts under etp 1) are concatenated for one
  tp all-reduce and copied back (``apply_tp.sync_sequence_parallel_grads``): two more passes over them,
  of which only the experts' weigh.
* Memory per rank: parameters + gradients + optimizer states + activations (the estimator's
  runtime buffers are left out; the harness does not count them). Activations are what the harness's
  counter sees, the tensors saved for backward (:class:`~paraplan.validation.memory.
  SavedActivationCounter`): the estimate's activations less the working sets it adds while one layer
  runs backward (:func:`kept_activation_bytes`), which live inside the checkpoint's own saved-tensor
  hooks (a recomputation's rematerialized tensors) or are no saved tensors at all (unfused attention's
  score gradients).

Both sides split the vocabulary over tp (Megatron's vocabulary-parallel embedding, LM head and
cross-entropy); the estimator does not count the cross-entropy's two small all-reduces. Known
approximation: fp32 activation bytes are the 16-bit formulas doubled.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.kernels import device_is_host
from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.profiles.store import ProfileStore, machine_fingerprint
from paraplan.scenario import load_cluster
from paraplan.validation.config import RunOptions, world_size
from paraplan.validation.support import as_run
from paraplan.workloads.transformer import MoESpec, TrainingJob, TransformerModel

TERM_MAP = {"compute": ("compute", "recompute", "grad_accumulation", "moe_host"), "tp_comm": ("tp_comm",),
            "cp_comm": ("cp_comm",), "ep_comm": ("ep_comm",), "pp_comm": ("pp_comm", "pp_bubble"), "dp_comm": ("dp_comm",),
            "optimizer": ("optimizer", "offload")}
MEMORY_MAP = {"parameters": "parameters", "gradients": "gradients",
              "optimizer_states": "optimizer_states", "activations_peak": "activations"}
NOTES = ("estimate on this machine's measured profile (paraplan profile, ProfiledCurves + fitted "
         "collective link)",
         "terms mapped: compute = compute + recompute + grad_accumulation, pp_comm = pp_comm + "
         "pp_bubble, optimizer = optimizer + offload; other = the harness's gradient flattening and 1/dp "
         "scaling (ZeRO 0-2: read + write of the rank's gradients per pass, measured copy bandwidth)",
         "memory per rank = parameters + gradients + optimizer states + activations (no runtime buffers)",
         "vocabulary split over tp on both sides (Megatron); the cross-entropy's two small all-reduces "
         "are not predicted",
         "fp32: activation bytes of the 16-bit formulas doubled",
         "activations = the tensors kept for backward, as the harness counts them (saved-tensor hooks): "
         "the estimate's activations less the working sets it adds while one layer runs backward (a "
         "recomputation's rematerialized tensors, held by the checkpoint's own hooks; unfused attention's "
         "score-gradient temporaries), which the counter does not see")


def estimator_model(cfg):
    experts = getattr(cfg, "experts", 0)
    moe = MoESpec(experts=experts, top_k=cfg.top_k, expert_ffn_hidden=cfg.expert_width) if experts else None
    rotary = getattr(cfg, "rotary", False)
    return TransformerModel(name="validation-gpt", layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                            kv_heads=getattr(cfg, "kv_heads", 0) or None, vocab=cfg.vocab_size, ffn_hidden=cfg.ffn,
                            activation=getattr(cfg, "activation", "gelu"), tied_embeddings=False,
                            norm=getattr(cfg, "norm", "layernorm"), bias=getattr(cfg, "bias", True),
                            learned_positions=not rotary, max_positions=0 if rotary else cfg.seq_len,
                            rotary=rotary, dropout=False, moe=moe, qk_norm=getattr(cfg, "qk_norm", False))


def estimator_plan(cfg, plan: Plan, cpu: bool = False) -> Plan:
    """The estimator's plan for a harness run of ``plan`` on ``cfg``: the plan as the harness runs it
    (:func:`paraplan.validation.support.as_run`), its ZeRO-3 overlap off on a CPU device (``cpu``)."""
    run = as_run(plan, cfg)
    return replace(run, overlap_grad_reduce=run.zero == 3 and not cpu)


def ensure_profile(db: str | None, world_size: int, allow_profiling: bool = True) -> None:
    """Profile this machine (quick mode) when ``db`` holds no profile of it."""
    store = ProfileStore(db)
    fp = machine_fingerprint()
    if store.latest_run(fp["id"]) is not None:
        return
    if not allow_profiling:
        raise ConfigError("profile", f"no profile of this machine ({fp['id']}) in {store.path}",
                          accepted="run `paraplan profile --quick` first")
    from dataclasses import replace

    from paraplan.validation.profile import ProfileOptions, run_profile
    worlds = (2,) if world_size <= 2 else (2, world_size)
    print(f"no profile of this machine in {store.path}: running `paraplan profile --quick` "
          f"(collectives at world sizes {', '.join(map(str, worlds))})", file=sys.stderr)
    run_profile(replace(ProfileOptions.quick(), world_sizes=worlds), db=db)


def harness_other_time(plan: Plan, gradient_bytes: float, copy_bytes_per_s: float, tp_summed_bytes: float = 0.0) -> float:
    """Seconds per step of the harness's gradient flattening and scaling (the module docstring):
    ``passes · 2 · G / B``, G the rank's gradient bytes before the sync, B the measured copy
    bandwidth (bytes read + written per second), one pass for the flattening and one more for the
    1/dp scaling when dp > 1 (0 under ZeRO-3: FSDP2 reduce-scatters each unit's gradients itself), plus
    ``2 · 2 · S / B`` for the sequence-parallel sync's concatenation and copy back of ``tp_summed_bytes``
    S (the gradients of whole experts each tp rank ran on its own shard; 0 without sp)."""
    if not copy_bytes_per_s > 0:
        return 0.0
    sp_sync = 2 * 2.0 * float(tp_summed_bytes) / float(copy_bytes_per_s) if plan.sp and plan.tp > 1 else 0.0
    if plan.zero == 3:
        return sp_sync
    passes = 1 + (plan.dp > 1)
    return passes * 2.0 * float(gradient_bytes) / float(copy_bytes_per_s) + sp_sync


def kept_activation_bytes(model, job, plan, activations: float, stage: str = "first") -> float:
    """The estimate's ``activations`` (bytes, at pipeline ``stage``: first, middle or last) less what
    it adds while one layer runs backward (:func:`paraplan.costmodels.memory.backward_working_bytes`:
    the layer's rematerialized tensors under recomputation, unfused attention's score-gradient
    temporaries, the engine's gradient temporaries, none for the harness's generic engine) and less
    the stage outputs the pipeline runtime holds
    (:func:`paraplan.costmodels.memory.held_stage_output_bytes`: no backward saved them): the tensors
    kept for backward, which the harness counts."""
    from paraplan.costmodels.memory import backward_working_bytes, held_stage_output_bytes
    held = held_stage_output_bytes(model, job, plan)[stage]
    return float(activations) - float(backward_working_bytes(model, job, plan)) - float(held)


def kept_activation_bytes_by_stage(model, job, plan) -> dict:
    """:func:`kept_activation_bytes` of the first, a middle and the last pipeline stage (bytes; 0 for
    a middle stage the plan does not have; the first stage's at pp 1)."""
    from paraplan.costmodels.memory import activation_bytes
    acts = activation_bytes(model, job, plan)
    return {stage: kept_activation_bytes(model, job, plan, float(acts[stage]), stage) if float(acts[stage]) else 0.0
            for stage in acts}


def to_predicted(e, other_s: float = 0.0, cp: int = 1, ep: int = 1, kept_activations: float | None = None) -> dict:
    """The report's ``predicted`` dict from an Estimate (harness term names, see the docstring),
    with ``other_s`` of harness work (:func:`harness_other_time`) added to the step; ``cp_comm``
    only with context parallelism (``cp`` > 1) and ``ep_comm`` only with expert parallelism, as the
    harness reports them."""
    tb = e.time_breakdown_s
    mem = e.memory_bytes_per_gpu
    shown = {"cp_comm": cp > 1, "ep_comm": ep > 1}
    breakdown = {k: sum(tb[x] for x in xs) for k, xs in TERM_MAP.items() if shown.get(k, True)}
    breakdown["other"] = float(other_s)
    memory = {k: mem[v] for k, v in MEMORY_MAP.items()}
    if kept_activations is not None:
        memory["activations_peak"] = kept_activations
    return {"step_time_s": e.step_time_s + float(other_s), "memory_bytes_per_rank": sum(memory.values()),
            "time_breakdown_s": breakdown, "memory_breakdown_bytes": memory,
            "source": "estimate --cluster local", "notes": list(NOTES)}


def predict_run(cfg, plan: Plan, options: RunOptions, db: str | None = None, allow_profiling: bool = True,
                moe_imbalance: float = 1.0):
    """(predicted dict, Estimate) for a harness model and plan (dp filled) with ``options``' global batch on
    this machine's profile; ``moe_imbalance`` is the job's (the busiest expert shard's tokens over the
    balanced share)."""
    world = world_size(plan)
    ensure_profile(db, world, allow_profiling)
    return predict_on_cluster(cfg, plan, options, load_cluster("local", world, db=db), moe_imbalance)


def predict_on_cluster(cfg, plan: Plan, options: RunOptions, cluster, moe_imbalance: float = 1.0):
    """:func:`predict_run` on a given cluster (a profile's, :func:`paraplan.profiles.cluster.cluster_from_tables`):
    (predicted dict, Estimate)."""
    cpu = device_is_host(cluster)
    global_batch = options.for_plan(plan).global_batch
    model, job, est_plan = (estimator_model(cfg), TrainingJob(cfg.seq_len, global_batch, moe_imbalance=moe_imbalance),
                            estimator_plan(cfg, plan, cpu))
    e = estimate(model, job, cluster, est_plan)
    kept = kept_activation_bytes(model, job, est_plan, e.memory_bytes_per_gpu["activations"],
                                 e.details["peak_memory_stage"])
    # the rank's full local gradients before the sync (ZeRO-1/2 shard only after it): its parameters
    from paraplan.costmodels.kernels import element_bytes
    from paraplan.costmodels.memory import expert_params_per_gpu
    whole_experts = float(expert_params_per_gpu(model, est_plan) * element_bytes(est_plan)) if plan.etp == 1 else 0.0
    other = harness_other_time(plan, e.memory_bytes_per_gpu["parameters"],
                               cluster.accelerator.memory_bandwidth_bytes_per_s, whole_experts)
    return to_predicted(e, other, plan.cp, plan.ep, kept), e
