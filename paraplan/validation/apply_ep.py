"""Mixture-of-Experts MLPs and expert parallelism for the validation model.

An MoE layer (Shazeer et al. 2017; the dropless, token-permuting form of Megatron-Core's
``MoELayer`` with its all-to-all token dispatcher, and of MegaBlocks) replaces the block's MLP:

1. a router (a bias-free ``E × h`` linear) scores every token, softmax over the ``E`` experts, and
   the token goes to its ``top_k`` best, with those ``k`` probabilities renormalised to sum to one
   (Mixtral's and Qwen3's ``norm_topk_prob``);
2. the ``T·k`` (token, expert) pairs are sorted by expert (a stable argsort: Megatron-Core's
   ``permute``) and the tokens gathered in that order;
3. with expert parallelism (``ep`` ranks share the ``E`` experts, ``E/ep`` each, rank ``r`` holding
   experts ``r·E/ep … (r+1)·E/ep − 1``) the ranks first swap how many tokens each sends each expert
   (one all-to-all of ``E`` counts), then the tokens themselves (one all-to-all with uneven splits),
   and regroup what they received by local expert;
4. each local expert, a GELU MLP ``h → f → h`` with biases, runs on its tokens (one GEMM pair per
   expert, DeepSpeed-MoE's loop: no grouped GEMM on a CPU);
5. the outputs travel back by the inverse all-to-all, are weighted by their gate and summed into
   their tokens (Megatron-Core's ``unpermute``).

Nothing is dropped and nothing is padded, so every layout computes what one process computes.
Expert parallelism is carved from data parallelism, as DeepSpeed-MoE and the estimator's generic
engine lay it out (:func:`paraplan.plan.expert_data_parallel`): the ep group is ``ep`` consecutive
data-parallel ranks with equal pipeline and context coordinates, and an expert's gradients are
averaged over its ``dp·cp/ep`` replicas (the expert-data-parallel group). Wall time of the two
all-to-alls (and of their backward) is added to ``comm.TIMERS['ep_comm']``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paraplan.validation import comm


class EpContext:
    """This rank's ep group (None for ep 1), its size and rank."""

    def __init__(self, group=None):
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` split ``send`` per rank go out, ``recv`` rows per rank come in; the backward is
    the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, g):
        return _exchange(g, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    with comm.timed("ep_comm"):
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def _swap_counts(counts: torch.Tensor, ep: EpContext) -> torch.Tensor:
    """Every rank's token counts for this rank's experts: [ep, E/ep] (row = sending rank)."""
    out = torch.empty_like(counts)
    with comm.timed("ep_comm"):
        dist.all_to_all_single(out, counts, group=ep.group)
    return out.view(ep.size, -1)


def _row_index(counts: list[int], width: int, device) -> torch.Tensor:
    """Positions of every rank's ``counts[r]`` rows in a gather of blocks ``width`` rows long."""
    return torch.cat([torch.arange(r * width, r * width + n, device=device) for r, n in enumerate(counts)])


class _GatherRows(torch.autograd.Function):
    """Every tp rank's rows (``counts[r]`` of them) gathered in rank order, each rank's block padded to
    the largest for one all-gather (Megatron-Core gathers uneven splits, the same rows); backward
    reduce-scatters the gradients back to the rows' own rank, summing every rank's partial."""

    @staticmethod
    def forward(ctx, x, counts: list[int], rank: int, group):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        ctx.index = _row_index(counts, max(counts), x.device)
        return _gather_rows(x, counts, group, ctx.index)

    @staticmethod
    def backward(ctx, g):
        return _scatter_rows(g, ctx.counts, ctx.rank, ctx.group, ctx.index), None, None, None


def _gather_rows(x, counts: list[int], group, index) -> torch.Tensor:
    """The all-gather of :class:`_GatherRows`: this rank's rows padded to the largest block, gathered,
    the padding dropped (``index``: :func:`_row_index`)."""
    width = max(counts)
    padded = x.new_zeros((width,) + tuple(x.shape[1:]))
    padded[: x.shape[0]] = x
    out = x.new_empty((len(counts) * width,) + tuple(x.shape[1:]))
    with comm.timed("tp_comm"):
        dist.all_gather_into_tensor(out, padded, group=group)
    return out.index_select(0, index)


def _scatter_rows(y, counts: list[int], rank: int, group, index) -> torch.Tensor:
    """The reduce-scatter of :class:`_GatherRows`' layout: rows summed over the ranks, each rank's own kept."""
    width = max(counts)
    full = y.new_zeros((len(counts) * width,) + tuple(y.shape[1:]))
    full.index_copy_(0, index, y)
    out = y.new_empty((width,) + tuple(y.shape[1:]))
    with comm.timed("tp_comm"):
        dist.reduce_scatter_tensor(out, full, group=group)
    return out[: counts[rank]]


class _ScatterRows(torch.autograd.Function):
    """The experts' partial outputs of every rank's rows summed over tp, each rank keeping its own rows
    (Megatron-Core's reduce-scatter back to the sequence shard); backward all-gathers."""

    @staticmethod
    def forward(ctx, y, counts: list[int], rank: int, group):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        ctx.index = _row_index(counts, max(counts), y.device)
        return _scatter_rows(y, counts, rank, group, ctx.index)

    @staticmethod
    def backward(ctx, g):
        return _gather_rows(g, ctx.counts, ctx.group, ctx.index), None, None, None


class _Combine(torch.autograd.Function):
    """Rows of ``weighted`` added into their tokens' rows (``source``) of a ``tokens``-row output: the
    unpermute's sum. Its backward reads the gradient at ``source`` and keeps only that index, as
    Megatron-Core's fused unpermute does (``Tensor.index_add`` would keep ``weighted`` as well)."""

    @staticmethod
    def forward(ctx, weighted, source, tokens: int):
        ctx.save_for_backward(source)
        return weighted.new_zeros((tokens,) + tuple(weighted.shape[1:])).index_add_(0, source, weighted)

    @staticmethod
    def backward(ctx, g):
        (source,) = ctx.saved_tensors
        return g.index_select(0, source), None, None


def _by_expert(counts: torch.Tensor) -> torch.Tensor:
    """The order that regroups rows laid out by (sender, expert), ``counts`` [senders, E], by expert
    (stable: within an expert, by sender)."""
    expert = torch.arange(counts.shape[1], device=counts.device).repeat(counts.shape[0])
    return torch.argsort(torch.repeat_interleave(expert, counts.reshape(-1)), stable=True)


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes ``order``."""
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return back


def mlp_activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    """The MLP's activation on its first projection ``y``: GELU, or SwiGLU on rows ordered (unit,
    gate/up) (``silu(gate) · up``, Shazeer 2020), which halves the width."""
    if activation == "swiglu":
        gate, up = y.unflatten(-1, (-1, 2)).unbind(-1)
        return F.silu(gate) * up
    return F.gelu(y)


def run_experts(x: torch.Tensor, sizes: list[int], experts, activation: str = "gelu") -> torch.Tensor:
    """Local expert ``j`` on the next ``sizes[j]`` rows of ``x``: ``act(x W1ᵀ + b1) W2ᵀ + b2``, with
    ``experts[j]`` = (W1, b1, W2, b2) (biases None in a model without them)."""
    outs = [F.linear(mlp_activation(F.linear(xj, w1, b1), activation), w2, b2)
            for (w1, b1, w2, b2), xj in zip(experts, x.split(sizes))]
    return torch.cat(outs) if outs else x


def moe_mlp(x: torch.Tensor, router, experts, top_k: int, ep: EpContext, stats: dict | None = None,
            activation: str = "gelu", expert_tp=None):
    """The MoE MLP of ``x`` [b, s, h] (the module docstring's five steps); ``router`` [E, h];
    ``experts`` this rank's E/ep experts in order, each (W1 [f, h], b1 [f], W2 [h, f], b2 [h]): one
    parameter each, as Megatron-Core's SequentialMLP and TEGroupedMLP hold them (slices of one stacked
    tensor would cost a full-size zero-filled gradient per expert in autograd). ``stats`` (if given)
    collects, per call, the tokens this rank's experts processed and their balanced share
    (``expert_calls``; :func:`expert_load`).

    ``expert_tp`` = (tp group, tp rank): expert tensor parallelism, each expert split over the tp group
    (``experts`` hold this rank's shards) and ``x`` this rank's sequence shard. As Megatron-Core's
    dispatchers run it with etp = tp: the rank routes and permutes its own tokens, the ranks swap their
    per-expert counts and all-gather the routed copies, regroup them by expert, run their shards on
    all of them, and reduce-scatter the partial outputs back to the copies' own rank."""
    b, s, h = x.shape
    tokens = x.reshape(-1, h)
    probs = torch.softmax(F.linear(tokens, router), dim=-1)
    top_p, top_i = probs.topk(top_k, dim=-1)
    gates = top_p / top_p.sum(dim=-1, keepdim=True)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat, stable=True)
    source = order // top_k
    routed = tokens.index_select(0, source)
    counts = torch.bincount(flat, minlength=router.shape[0])
    balanced = flat.numel()
    if expert_tp is not None:
        group, rank = expert_tp
        every = counts.new_empty(dist.get_world_size(group) * counts.numel())
        with comm.timed("tp_comm"):
            dist.all_gather_into_tensor(every, counts, group=group)
        every = every.view(-1, counts.numel())                    # [tp, E]
        rows = every.sum(dim=1).tolist()
        gathered = _GatherRows.apply(routed, rows, rank, group)   # by sending rank, then expert
        regroup = _by_expert(every)
        local_sizes = every.sum(dim=0).tolist()
        out = run_experts(gathered.index_select(0, regroup), local_sizes, experts, activation)
        y = _ScatterRows.apply(out.index_select(0, _inverse(regroup)), rows, rank, group)
        balanced = sum(rows)
    elif ep.size == 1:
        local_sizes = counts.tolist()
        y = run_experts(routed, local_sizes, experts, activation)
    else:
        received = _swap_counts(counts, ep)                       # [ep, E/ep]
        send = counts.view(ep.size, -1).sum(dim=1).tolist()
        recv = received.sum(dim=1).tolist()
        arrived = _AllToAll.apply(routed, send, recv, ep.group)   # by sending rank, then local expert
        regroup = _by_expert(received)                            # by local expert, then sending rank
        local_sizes = received.sum(dim=0).tolist()
        out = run_experts(arrived.index_select(0, regroup), local_sizes, experts, activation)
        y = _AllToAll.apply(out.index_select(0, _inverse(regroup)), recv, send, ep.group)
    if stats is not None:   # (tokens this rank's experts ran, their balanced share) per call
        stats.setdefault("expert_calls", []).append((sum(local_sizes), balanced))
    weighted = y * gates.reshape(-1).index_select(0, order).unsqueeze(-1)
    return _Combine.apply(weighted, source, tokens.shape[0]).view(b, s, h)


def expert_load(calls: list[tuple[int, int]], ep: EpContext) -> dict:
    """How evenly the router spread the work, from every rank's ``(tokens run, balanced share)`` per
    MoE call (the same calls in the same order on every rank of the ep group): ``rank`` = this rank's
    tokens over its balanced share, all calls together; ``busiest`` = the mean over calls of the
    busiest ep rank's ratio, which is what the call waits for (the estimator's ``moe_imbalance``: the
    busiest expert shard's tokens over the balanced share). 1.0 without ep: one device runs every
    expert in turn, so only the total counts."""
    if not calls:
        return {"rank": None, "busiest": None}
    ran = sum(c[0] for c in calls) / sum(c[1] for c in calls)
    if ep.size == 1:
        return {"rank": ran, "busiest": ran}
    everyone = [None] * ep.size
    dist.all_gather_object(everyone, calls, group=ep.group)
    per_call = [max(r[i][0] for r in everyone) / calls[i][1] for i in range(len(calls))]
    return {"rank": ran, "busiest": sum(per_call) / len(per_call)}
