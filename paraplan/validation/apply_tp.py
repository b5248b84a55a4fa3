"""Tensor (and Megatron sequence) parallelism for the validation model.

The layers in :mod:`paraplan.validation.model` hold tp shards directly (fused qkv/fc1 split by
output rows, o/fc2 by input columns, heads split across tp) and call the conjugate collectives
of :mod:`paraplan.validation.comm`. This module builds the per-rank context and all-reduces the gradients of replicated parameters that only saw a
sequence shard under sequence parallelism (LayerNorms and row-parallel biases). What divides over
tp is checked before a run starts (:func:`paraplan.validation.support.check_runs`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraplan.validation import comm
from paraplan.validation.model import GPTConfig, ParallelContext


def make_tp_context(cfg: GPTConfig, tp_group, *, sequence_parallel: bool = False,
                    recompute: str = "none") -> ParallelContext:
    """The ParallelContext for this rank of ``tp_group`` (None for a single process)."""
    tp = 1 if tp_group is None else dist.get_world_size(tp_group)
    rank = 0 if tp_group is None else dist.get_rank(tp_group)
    return ParallelContext(tp_group=tp_group if tp > 1 else None, tp_size=tp, tp_rank=rank,
                           sequence_parallel=sequence_parallel and tp > 1, recompute=recompute)


def sync_sequence_parallel_grads(module: nn.Module, ctx: ParallelContext) -> None:
    """Sum the grads of replicated params that saw one sequence shard each (under SP), and of the
    QK-norm weights that saw one shard of the heads each (any tp), in one all-reduce of their
    concatenation (Megatron-LM's ``_allreduce_layernorm_grads`` coalesces them the same way)."""
    if ctx.tp_group is None or ctx.tp_size <= 1:
        return
    grads = []
    for p in module.parameters():
        if getattr(p, "sp_partial", False) and p.grad is not None:
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with comm.timed("tp_comm"):
        dist.all_reduce(flat, group=ctx.tp_group)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()
