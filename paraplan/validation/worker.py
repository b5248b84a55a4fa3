"""The per-rank training program that ``torchrun`` starts (``python -m paraplan.validation.worker``).

It reads one JSON spec (``{"model": {...}, "plan": {...}, "run": {...}, "dump_grads": bool}``:
:func:`paraplan.validation.config.run_spec`, the plan a :class:`paraplan.plan.Plan` as the harness
runs it), builds this rank's share of the model for the plan, runs warm-up and timed AdamW steps and writes
``rank<N>.json`` into the output directory: loss per step, step times, a time breakdown,
per-op times from ``torch.profiler`` and memory by category. With ``dump_grads`` the first
step's gradients (unsharded over tp and dp) are saved to ``grads_rank<N>.pt`` by the ranks with
tp_rank = dp_rank = 0, so a test can compare them with a single-process run.

:func:`run_training` with ``groups=None`` is that single-process reference run.

Time breakdown per step (seconds, wall clock of the rank): ``tp_comm`` tp/SP collectives
(forward, backward and the SP LayerNorm-gradient all-reduce), ``cp_comm`` (cp > 1 only) time
posting and waiting for ring attention's K/V exchange, ``pp_comm`` time blocked in
pipeline receives plus the final wait on sends (so it contains the pipeline bubble),
``dp_comm`` gradient all-reduce / reduce-scatter over the dp·cp ranks and the ZeRO parameter all-gather (FSDP2's
own collectives under ZeRO-3 are inside ``compute``), ``optimizer`` the AdamW update,
``compute`` the rest of forward+backward, ``other`` what remains of the step.

Memory per rank (bytes): ``parameters``, ``gradients`` (held after the dp sync),
``optimizer_states`` (after the first step creates them) and ``activations_peak`` (peak of
live tensors saved for backward, see :mod:`paraplan.validation.memory`, counted in the first
step, a warm-up step unless ``warmup = 0``, so timed steps carry no counting hooks); on CUDA also
``torch.cuda.max_memory_allocated``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.validation import comm
from paraplan.validation.apply_cp import CpContext
from paraplan.validation.apply_ep import EpContext, expert_load
from paraplan.validation.apply_pp import PipelineRunner, interleaved_1f1b, stage_layers
from paraplan.validation.apply_tp import make_tp_context, sync_sequence_parallel_grads
from paraplan.validation.apply_zero import ExpertSplitOptimizer, FsdpOptimizer, ZeroOptimizer, apply_fsdp
from paraplan.validation.config import GPTConfig, RunOptions, micro_batches, read_run_spec, world_size
from paraplan.validation.memory import SavedActivationCounter
from paraplan.validation.model import Stage, is_expert_param, param_specs, synthetic_batch
from paraplan.validation.support import check_runs


@dataclass
class Groups:
    """This rank's coordinates and process groups
    (rank = ((pp_rank*dp + dp_rank)*cp + cp_rank)*tp + tp_rank, Megatron-LM's order).

    ``dp_group`` / ``dp_mesh`` span data and context parallelism together (dp·cp ranks): gradients
    are averaged and ZeRO shards over both, as Megatron-LM's data-parallel group "with context
    parallel" does, since every cp rank's loss covers its own tokens of the same sequences."""

    rank: int
    tp_rank: int
    dp_rank: int
    pp_rank: int
    tp_group: object
    dp_group: object
    dp_mesh: object
    pp_ranks: list
    cp_rank: int = 0
    cp_group: object = None
    #: expert parallelism: ep consecutive dp ranks (equal pp, cp, tp coordinates), and the expert-data-
    #: parallel group of the ranks holding the same experts (None where of size 1)
    ep_group: object = None
    edp_group: object = None


def _expert_groups(plan: Plan, rank: int) -> tuple[object, object]:
    """(ep group, expert-data-parallel group) of ``rank``; every rank creates every group, in the same
    order (torch.distributed.new_group). Rank = ((p·dp + d)·cp + c)·tp + t; an ep group is
    d = b·ep … b·ep + ep − 1 at fixed (p, c, t); an expert-data-parallel group fixes (p, t, d mod ep)
    and runs over c and d div ep."""
    tp, dp, cp, ep = plan.tp, plan.dp, plan.cp, plan.ep
    at = lambda p, d, c, t: ((p * dp + d) * cp + c) * tp + t   # noqa: E731
    mine = [None, None]
    for p in range(plan.pp):
        for t in range(tp):
            for c in range(cp):
                for b in range(dp // ep):
                    ranks = [at(p, d, c, t) for d in range(b * ep, (b + 1) * ep)]
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        mine[0] = group
            if dp * cp // ep > 1:
                for j in range(ep):
                    ranks = sorted(at(p, b * ep + j, c, t) for c in range(cp) for b in range(dp // ep))
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        mine[1] = group
    return mine[0], mine[1]


def make_groups(plan: Plan, device_type: str) -> Groups:
    """Create the groups with a (pp, dp·cp, tp) DeviceMesh (tp the fastest-varying axis, cp next),
    one cp group per run of cp consecutive dp·cp coordinates and, with ep > 1, the expert groups
    (:func:`_expert_groups`)."""
    from torch.distributed.device_mesh import init_device_mesh
    rank = dist.get_rank()
    tp, dp, cp = plan.tp, plan.dp, plan.cp
    mesh = init_device_mesh(device_type, (plan.pp, dp * cp, tp), mesh_dim_names=("pp", "dp", "tp"))
    tp_rank, dpcp_rank, pp_rank = rank % tp, (rank // tp) % (dp * cp), rank // (tp * dp * cp)
    pp_ranks = [s * tp * dp * cp + dpcp_rank * tp + tp_rank for s in range(plan.pp)]
    cp_group = None
    if cp > 1:   # every rank creates every group, in the same order (torch.distributed.new_group)
        for p in range(plan.pp):
            for d in range(dp):
                for t in range(tp):
                    ranks = [((p * dp + d) * cp + c) * tp + t for c in range(cp)]
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        cp_group = group
    ep_group, edp_group = _expert_groups(plan, rank) if plan.ep > 1 else (None, None)
    return Groups(rank, tp_rank, dpcp_rank // cp, pp_rank,
                  mesh.get_group("tp") if tp > 1 else None,
                  mesh.get_group("dp") if dp * cp > 1 else None, mesh["dp"], pp_ranks,
                  cp_rank=dpcp_rank % cp, cp_group=cp_group, ep_group=ep_group, edp_group=edp_group)


def _micro_split(t: torch.Tensor, plan: Plan, dp_rank: int, device, positions=None) -> list[torch.Tensor]:
    """This dp rank's rows of the batch in micro-batches; with ``positions`` (context parallelism)
    only those tokens of each row."""
    rows = t.shape[0] // plan.dp
    mine = t[dp_rank * rows:(dp_rank + 1) * rows]
    if positions is not None:
        mine = mine[:, positions]
    return list(mine.contiguous().to(device).split(plan.micro_batch))


def _gather_tp(name: str, g: torch.Tensor, dim, tp_group) -> torch.Tensor:
    if dim is None or tp_group is None:
        return g
    parts = [torch.empty_like(g) for _ in range(dist.get_world_size(tp_group))]
    dist.all_gather(parts, g.contiguous(), group=tp_group)
    return torch.cat(parts, dim=dim)


def _op_times(prof, top: int = 40) -> dict:
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", 0) or 0
        rows.append((e.key, {"count": e.count, "self_cpu_time_s": e.self_cpu_time_total * 1e-6,
                             "cpu_time_total_s": e.cpu_time_total * 1e-6,
                             "self_device_time_s": dev * 1e-6}))
    rows.sort(key=lambda kv: -(kv[1]["self_cpu_time_s"] + kv[1]["self_device_time_s"]))
    return dict(rows[:top])


def nudge_parameters(model: nn.Module, seed: int) -> None:
    """Move every parameter element one unit in the last place towards +inf or -inf, at random
    (``seed``), in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            up = (torch.rand(p.shape, generator=gen) < 0.5).to(p.device)
            p.copy_(torch.nextafter(p, torch.where(up, float("inf"), float("-inf")).to(p.dtype)))


def run_training(cfg: GPTConfig, plan: Plan, options: RunOptions, groups: Groups | None = None,
                 device: str = "cpu", dump_grads: bool = False, on_step=None, nudge_seed: int | None = None,
                 trace_path: str | None = None) -> dict:
    """Train ``options.warmup + options.steps`` steps of ``plan`` (dp filled; the harness runs what
    :func:`paraplan.validation.support.as_run` gives) on ``cfg``; returns this rank's results dict.

    ``on_step(done, total)`` is called after each step (and the profiled one), for progress.
    ``trace_path``: where the profiled step's Chrome trace goes (``export_chrome_trace``: the
    profiler's own JSON, its step marked ``ProfilerStep#N``; read by :mod:`paraplan.validation.trace`).
    ``nudge_seed`` (single process only): move every initial parameter element by one unit in the
    last place, up or down at random (seeded), a rounding-sized difference like the ones a parallel
    layout's summation order makes (:func:`paraplan.validation.reference.reference_spread`).

    With ``groups=None`` this is the single-process reference: the plan's micro-batch and
    recomputation on one rank (no tp, pp, dp, cp, ep, ZeRO or offload), ``options``' global batch.
    """
    single = groups is None
    options = options.for_plan(plan)
    if single:
        plan = Plan(dp=1, micro_batch=plan.micro_batch, recompute=plan.recompute)
        groups = Groups(0, 0, 0, 0, None, None, None, [0])
    check_runs(plan, cfg, options)
    offload = plan.offload == "cpu"
    ctx = make_tp_context(cfg, groups.tp_group, sequence_parallel=plan.sp, recompute=plan.recompute)
    ctx.ep = EpContext(groups.ep_group)
    ctx.expert_tp = plan.etp > 1
    positions = None
    if plan.cp > 1:
        ctx.cp = CpContext(groups.cp_group, cfg.seq_len)
        positions = ctx.cp.local_positions
    layer_sets = stage_layers(cfg.layers, plan.pp, plan.vpp)
    n_chunks = plan.pp * plan.vpp
    chunks = []
    for j in range(plan.vpp):
        g = j * plan.pp + groups.pp_rank
        chunks.append(Stage(cfg, ctx, layer_sets[g], g == 0, g == n_chunks - 1).to(device))
    model = nn.ModuleList(chunks)
    if nudge_seed is not None:
        if not single:
            raise ValueError("nudge_seed is for the single-process reference only")
        nudge_parameters(model, nudge_seed)
    named = [(n.split(".", 1)[1], p) for n, p in model.named_parameters()]
    if plan.zero == 3:
        # fully_shard replaces every parameter by a sharded one; the sequence-parallel mark (the
        # gradient summed over tp, sync_sequence_parallel_grads) goes to the new parameter
        sp_partial = {n for n, p in model.named_parameters() if getattr(p, "sp_partial", False)}
        apply_fsdp(chunks[0], groups.dp_mesh)
        for n, p in model.named_parameters():
            p.sp_partial = n in sp_partial
        named = [(n.split(".", 1)[1], p) for n, p in model.named_parameters()]
        opt = FsdpOptimizer(named, lr=options.lr)
        before_backward = chunks[0].set_requires_gradient_sync
    elif plan.ep > 1:   # experts differ across the ep group: their own ZeRO over their replicas
        dense = [(n, p) for n, p in named if not is_expert_param(n)]
        experts = [(n, p) for n, p in named if is_expert_param(n)]
        opt = ExpertSplitOptimizer(
            ZeroOptimizer(dense, groups.dp_group, plan.zero, lr=options.lr, offload=offload),
            ZeroOptimizer(experts, groups.edp_group, plan.zero, lr=options.lr, offload=offload,
                          divisor=plan.dp * plan.cp))
        before_backward = None
    else:
        opt = ZeroOptimizer(named, groups.dp_group, plan.zero, lr=options.lr, offload=offload)
        before_backward = None
    seq_local = cfg.seq_len // plan.cp
    seq_local = seq_local // ctx.tp_size if ctx.sequence_parallel else seq_local
    runner = PipelineRunner(chunks, groups.pp_ranks, groups.pp_rank,
                            (plan.micro_batch, seq_local, cfg.hidden), device=device)
    schedule = interleaved_1f1b(groups.pp_rank, plan.pp, micro_batches(plan, options), plan.vpp)
    is_last = groups.pp_rank == plan.pp - 1
    counter = SavedActivationCounter()
    cuda = device.startswith("cuda")

    losses, times, breakdowns, grads, memory = [], [], [], None, None

    def one_step(step: int, record: bool):
        nonlocal grads, memory
        inputs, targets = synthetic_batch(cfg, options.global_batch, step)
        mi = _micro_split(inputs, plan, groups.dp_rank, device, positions)
        mt = _micro_split(targets, plan, groups.dp_rank, device, positions)
        comm.TIMERS.clear()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        # saved activations are counted (Python hooks on every saved tensor) in the first step
        # only, so the timed steps pay no instrumentation (one timed step does when warmup = 0)
        if step == 0:
            with counter:
                loss = runner.run(mi, mt, schedule, before_backward)
        else:
            loss = runner.run(mi, mt, schedule, before_backward)
        t1 = time.perf_counter()
        at_t1 = dict(comm.TIMERS)   # the exchange of ring attention is waited on inside the pipeline run
        for c in chunks:
            sync_sequence_parallel_grads(c, ctx)
        opt.sync_grads()
        t2 = time.perf_counter()
        if dump_grads and step == 0:
            specs = {n: d for n, _, d, _ in param_specs(cfg, ctx.expert_tp)}
            full = opt.full_grads()
            grads = {n: _gather_tp(n, g, specs[n], groups.tp_group) for n, g in full.items()}
        if record and memory is None:
            memory = dict(opt.memory_bytes())
        dp_before_step = comm.TIMERS.get("dp_comm", 0.0)
        t3 = time.perf_counter()
        opt.step()
        if record and "optimizer_states_after_step" not in memory:
            # AdamW creates its states lazily in the first step: count them after it
            memory["optimizer_states"] = opt.state_bytes()
            memory["optimizer_states_after_step"] = True
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        t4 = time.perf_counter()
        loss_t = torch.tensor([loss], dtype=torch.float64, device=device)
        if groups.dp_group is not None:   # every dp and cp rank's mean over its own tokens
            dist.all_reduce(loss_t, group=groups.dp_group)
            loss_t /= plan.dp * plan.cp
        losses.append(float(loss_t) if is_last else None)
        if record:
            timers = dict(comm.TIMERS)
            step_s = (t2 - t0) + (t4 - t3)
            tp_c, cp_c, pp_c, dp_c = (timers.get(k, 0.0) for k in ("tp_comm", "cp_comm", "pp_comm", "dp_comm"))
            compute = (t1 - t0) - sum(at_t1.get(k, 0.0) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm"))
            opt_s = (t4 - t3) - (dp_c - dp_before_step)
            parts = {"compute": compute, "tp_comm": tp_c, "pp_comm": pp_c, "dp_comm": dp_c,
                     "optimizer": opt_s}
            if plan.cp > 1:
                parts["cp_comm"] = cp_c
            if plan.ep > 1:
                parts["ep_comm"] = timers.get("ep_comm", 0.0)
            parts["other"] = max(0.0, step_s - sum(parts.values()))
            breakdowns.append(parts)
            times.append(step_s)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    total = options.warmup + options.steps + (1 if options.profile_ops else 0)
    for step in range(options.warmup + options.steps):
        one_step(step, record=step >= options.warmup)
        if on_step is not None:
            on_step(step + 1, total)
    ops = {}
    if options.profile_ops:
        from torch.profiler import ProfilerActivity, profile, record_function
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        keep = list(losses)
        with profile(activities=acts) as prof:
            # named as the profiler names the steps of a scheduled run, for trace readers
            with record_function(f"ProfilerStep#{options.warmup + options.steps}"):
                one_step(options.warmup + options.steps, record=False)
        losses[:] = keep
        ops = _op_times(prof)
        if trace_path:
            tmp = f"{trace_path}.{os.getpid()}.tmp"
            prof.export_chrome_trace(tmp)
            os.replace(tmp, trace_path)
        if on_step is not None:
            on_step(total, total)
    memory.pop("optimizer_states_after_step", None)
    memory["activations_peak"] = counter.peak_bytes
    memory["total"] = sum(memory.values())
    # per term, the median over the timed steps, as the step time (validation.compare)
    median_bd = {k: statistics.median(b[k] for b in breakdowns) for k in breakdowns[0]}
    result = {
        "rank": groups.rank, "tp_rank": groups.tp_rank, "dp_rank": groups.dp_rank, "cp_rank": groups.cp_rank,
        "pp_rank": groups.pp_rank, "is_last_stage": is_last,
        "plan": plan.to_dict(), "run": asdict(options), "model": asdict(cfg), "device": device,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "losses": losses, "step_times_s": times, "time_breakdown_s": median_bd,
        "memory_bytes": memory,
        # under optimizer offload: what the rank keeps in host memory (not in memory_bytes' total)
        "host_memory_bytes": opt.host_memory_bytes() if hasattr(opt, "host_memory_bytes") else {},
        "cuda_max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else None,
        "op_times_s": ops,
    }
    if cfg.experts:   # how evenly the router spread the tokens (validation.apply_ep.expert_load)
        result["expert_load"] = expert_load(ctx.stats.get("expert_calls", []), ctx.ep)
    if dump_grads:
        result["grads"] = grads
    return result


def write_status(status_dir: str, rank: int, **record) -> None:
    """This rank's progress record (pid, phase, step) for the launcher, replaced atomically."""
    from paraplan.validation.launch import status_path
    path = status_path(status_dir, rank)
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "rank": rank, **record}, f)
    os.replace(tmp, path)


def _clear_own_files(out_dir: str, rank: int) -> None:
    """Remove this rank's results of an earlier run in ``out_dir`` (never merged into this one)."""
    for name in (f"rank{rank}.json", f"grads_rank{rank}.pt", f"trace_rank{rank}.json"):
        try:
            os.remove(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass


def _run_one(spec: dict, out_dir: str, cuda: bool, local_rank: int, status=None) -> None:
    cfg, plan, options = read_run_spec(spec)
    if dist.get_world_size() != world_size(plan):
        raise ConfigError("nproc", f"world size {dist.get_world_size()} != tp({plan.tp}) * cp({plan.cp}) * "
                          f"pp({plan.pp}) * dp({plan.dp}) = {world_size(plan)}")
    device = f"cuda:{local_rank}" if cuda else "cpu"
    torch.manual_seed(cfg.seed)
    groups = make_groups(plan, "cuda" if cuda else "cpu")
    os.makedirs(out_dir, exist_ok=True)
    _clear_own_files(out_dir, groups.rank)
    result = run_training(cfg, plan, options, groups, device, bool(spec.get("dump_grads")), on_step=status,
                          trace_path=os.path.join(out_dir, f"trace_rank{groups.rank}.json"))
    grads = result.pop("grads", None)
    r = groups.rank
    if grads is not None and groups.tp_rank == 0 and groups.cp_rank == 0 and groups.dp_rank < plan.ep:
        # dp rank 0 saves every gradient of its stage; under ep, dp ranks 1..ep-1 their own experts'
        keep = {k: v.cpu() for k, v in grads.items() if groups.dp_rank == 0 or is_expert_param(k)}
        torch.save(keep, os.path.join(out_dir, f"grads_rank{r}.pt"))
    tmp = os.path.join(out_dir, f".rank{r}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, f"rank{r}.json"))
    dist.barrier()


def main(argv=None) -> int:
    """torchrun entry: ``worker SPEC.json --out DIR``.

    SPEC is one run (``{"model", "plan", "run", "dump_grads"}``) written to DIR, or
    ``{"runs": [{"name", "model", "plan", "run", "dump_grads"}, ...]}``: several plans of the same
    world size in one launch, each written to DIR/<name>.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="JSON file with model, plan, run and dump_grads (or runs)")
    ap.add_argument("--out", required=True, help="directory for rank<N>.json")
    args = ap.parse_args(argv)
    from paraplan.validation.procs import die_with_parent, pin_from_env
    die_with_parent()   # torchrun killed -> this rank too
    rank = int(os.environ.get("RANK", 0))
    os.makedirs(args.out, exist_ok=True)
    write_status(args.out, rank, phase="rendezvous")
    with open(args.spec) as f:
        spec = json.load(f)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        pin_from_env()
    dist.init_process_group("nccl" if cuda else "gloo")
    runs = spec["runs"] if "runs" in spec else [dict(spec, name=None)]
    try:
        for i, run in enumerate(runs):
            phase = "training" if run["name"] is None else f"training {run['name']}"

            def status(done, total, phase=phase, i=i):
                write_status(args.out, rank, phase=phase, step=done, steps=total, run=i, runs=len(runs))
            status(0, None)
            _run_one(run, args.out if run["name"] is None else os.path.join(args.out, run["name"]),
                     cuda, local_rank, status)
    finally:
        dist.destroy_process_group()
    write_status(args.out, rank, phase="done", run=len(runs), runs=len(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
