"""Collectives for hand-written tensor/sequence parallelism, as explicit autograd functions.

Megatron-LM's conjugate pairs (Shoeybi et al. 2019, fig. 3; Korthikanti et al. 2022, fig. 5):

=========================  ====================  ======================
function                   forward               backward
=========================  ====================  ======================
copy_to_tp                 identity              all-reduce
reduce_from_tp             all-reduce            identity
gather_seq_reduce_scatter  all-gather (seq)      reduce-scatter (seq)
reduce_scatter_seq         reduce-scatter (seq)  all-gather (seq)
split_seq                  keep own seq chunk    all-gather (seq)
gather_seq_split_grad      all-gather (seq)      keep own seq chunk
=========================  ====================  ======================

The vocabulary is split over tp as in Megatron-LM: :func:`vocab_parallel_embedding` and
:func:`vocab_parallel_cross_entropy` (the LM head is column-parallel over the vocabulary).

With ``group=None`` (a single process) every function is the identity. Wall time spent in
collectives is added to ``TIMERS`` by category so the worker can report a time breakdown.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.distributed as dist

SEQ_DIM = 1  # activations are [batch, seq, hidden]
TIMERS: dict[str, float] = defaultdict(float)


@contextmanager
def timed(category: str):
    """Add the wall time of the block to ``TIMERS[category]`` (synchronising CUDA first)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        TIMERS[category] += time.perf_counter() - t0


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def all_reduce(x: torch.Tensor, group, category: str = "tp_comm") -> torch.Tensor:
    """Sum ``x`` over ``group`` (returns a new tensor)."""
    if _size(group) == 1:
        return x
    x = x.contiguous().clone()
    with timed(category):
        dist.all_reduce(x, group=group)
    return x


def all_gather_seq(x: torch.Tensor, group, async_op: bool = False):
    """Concatenate every rank's ``x`` along the sequence dim. With ``async_op`` the gather is only
    started: returns a function that waits for it and returns the concatenation."""
    n = _size(group)
    if n == 1:
        return (lambda: x) if async_op else x
    x = x.contiguous()
    # the single-buffer collective (Megatron's _all_gather_base), the one `paraplan profile` times
    out = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    with timed("tp_comm"):
        work = dist.all_gather_into_tensor(out, x, group=group, async_op=async_op)

    def finish():
        if work is not None:
            with timed("tp_comm"):
                work.wait()
        return torch.cat(out.chunk(n, dim=0), dim=SEQ_DIM)
    return finish if async_op else finish()


def reduce_scatter_seq_raw(x: torch.Tensor, group) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's chunk along the sequence dim."""
    n = _size(group)
    if n == 1:
        return x
    stacked = torch.cat(x.chunk(n, dim=SEQ_DIM), dim=0)   # rank r's chunk at rows r·b .. (r+1)·b
    out = torch.empty((x.shape[0],) + tuple(stacked.shape[1:]), dtype=x.dtype, device=x.device)
    with timed("tp_comm"):
        dist.reduce_scatter_tensor(out, stacked, group=group)   # Megatron's _reduce_scatter_base
    return out


def own_seq_chunk(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's chunk of ``x`` along the sequence dim, in storage of its own: a chunk that is
    contiguous already (micro-batch 1) would otherwise be a view that keeps the whole tensor alive
    for as long as the next layer saves it (Megatron-Core clones its embedding's scatter output for
    the same reason: ``clone_scatter_output_in_embedding``)."""
    n = _size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=SEQ_DIM)[dist.get_rank(group)].clone(memory_format=torch.contiguous_format)


def _conjugate(name: str, forward, backward) -> type:
    """An autograd function ``name`` whose forward is ``forward(x, group)`` and whose backward is
    ``backward(grad, group)``: one of Megatron-LM's conjugate pairs (the module's table)."""
    def fwd(ctx, x, group):
        ctx.group = group
        return forward(x, group)

    def bwd(ctx, g):
        return backward(g, ctx.group), None
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                                                   "__doc__": f"{forward.__name__} forward, {backward.__name__} backward"})


def _identity(x: torch.Tensor, group) -> torch.Tensor:
    return x.view_as(x)


_CopyToTP = _conjugate("_CopyToTP", _identity, all_reduce)
_ReduceFromTP = _conjugate("_ReduceFromTP", all_reduce, _identity)
_GatherSeqReduceScatterGrad = _conjugate("_GatherSeqReduceScatterGrad", all_gather_seq, reduce_scatter_seq_raw)
_ReduceScatterSeq = _conjugate("_ReduceScatterSeq", reduce_scatter_seq_raw, all_gather_seq)
_SplitSeq = _conjugate("_SplitSeq", own_seq_chunk, all_gather_seq)
_GatherSeqSplitGrad = _conjugate("_GatherSeqSplitGrad", all_gather_seq, own_seq_chunk)


class _SequenceGatheredLinear(torch.autograd.Function):
    """``F.linear(all_gather_seq(x), weight, bias)`` that keeps only the sequence shard ``x`` for
    backward, as Megatron-LM's column-parallel linear does under sequence parallelism
    (LinearWithGradAccumulationAndAsyncCommunication saves its un-gathered input): the QKV, FC1 and
    LM-head inputs stay T·h/tp shards between forward and backward, what the estimator counts.
    Backward gathers the shard again, asynchronously, while the input gradient's matmul runs (as
    Megatron overlaps it), then computes the weight gradient and reduce-scatters the input gradient,
    partial over the weight's output split, back to the shard."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(all_gather_seq(x, group), weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gathered = all_gather_seq(x, ctx.group, async_op=True)
        grad_full = g @ weight                       # overlaps the gather
        full = gathered()
        g2 = g.reshape(-1, g.shape[-1])
        grad_weight = g2.t() @ full.reshape(-1, full.shape[-1])
        grad_bias = g2.sum(0) if ctx.has_bias else None
        return reduce_scatter_seq_raw(grad_full, ctx.group), grad_weight, grad_bias, None


def sequence_gathered_linear(x: torch.Tensor, weight: torch.Tensor, group, bias: torch.Tensor | None = None):
    """:class:`_SequenceGatheredLinear`; a plain linear on one rank."""
    if _size(group) == 1:
        return torch.nn.functional.linear(x, weight, bias)
    return _SequenceGatheredLinear.apply(x, weight, bias, group)


def _wrap(fn):
    def apply(x, group):
        if _size(group) == 1:
            return x
        return fn.apply(x, group)
    apply.__doc__ = fn.__name__
    return apply


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary (Megatron-LM's
    ``vocab_parallel_cross_entropy``, Shoeybi et al. 2019 sec. 3): the row max all-reduced (MAX),
    then the target logit and the sum of exponentials all-reduced together (SUM); the softmax of
    the local vocabulary slice is kept for backward."""

    @staticmethod
    def forward(ctx, logits, target, start, group):
        n_local = logits.shape[-1]
        row_max = logits.max(dim=-1).values
        with timed("tp_comm"):
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        z = logits - row_max.unsqueeze(-1)
        outside = (target < start) | (target >= start + n_local)
        local_t = (target - start).masked_fill(outside, 0)
        picked = z.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = z.exp()
        both = torch.stack([picked, exp.sum(dim=-1)])
        with timed("tp_comm"):
            dist.all_reduce(both, group=group)
        picked, sum_exp = both[0], both[1]
        exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(exp, outside, local_t)
        return sum_exp.log() - picked

    @staticmethod
    def backward(ctx, g):
        softmax, outside, local_t = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, start: int,
                                 group) -> torch.Tensor:
    """Per-token loss of ``logits`` [N, V/t] holding vocabulary ids ``start .. start + V/t``."""
    return _VocabParallelCrossEntropy.apply(logits, target, start, group)


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, start: int, group) -> torch.Tensor:
    """Rows ``start .. start + V/t`` of the embedding on this rank: look up the ids it holds,
    zeros elsewhere, all-reduce over tp (identity backward: each rank's slice gets its rows)."""
    outside = (ids < start) | (ids >= start + weight.shape[0])
    out = torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), weight)
    out = out.masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(out, group)


copy_to_tp = _wrap(_CopyToTP)
reduce_from_tp = _wrap(_ReduceFromTP)
gather_seq_reduce_scatter_grad = _wrap(_GatherSeqReduceScatterGrad)
reduce_scatter_seq = _wrap(_ReduceScatterSeq)
split_seq = _wrap(_SplitSeq)
gather_seq_split_grad = _wrap(_GatherSeqSplitGrad)
