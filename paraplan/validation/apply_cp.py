"""Context parallelism for the validation model: ring attention over load-balanced causal chunks.

The sequence of ``s`` tokens is cut into ``2·cp`` chunks and cp rank ``r`` holds chunks ``r`` and
``2·cp − 1 − r`` (Megatron-LM's load balancing for causal attention, docs/source/api-guide/
context_parallel.rst: every rank then has the same share of the causal score matrix). Everything
outside attention is token-local and runs on the rank's ``s/cp`` tokens as it would on the whole
sequence; the learned position embedding is indexed by the tokens' global positions.

Attention is ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; the
p2p form Megatron-LM / Transformer Engine run, ``AttnFuncWithCPAndKVP2P``): in ``cp`` steps each
rank scores its queries against the K/V block it holds and passes that block to the next rank
(sends and receives posted before the step's compute, waited after it), merging the steps'
partial results with their log-sum-exp. The backward passes the K/V blocks round the ring again
with their gradient accumulators travelling beside them; after the last step each accumulator is
one hop from its owner and is sent there. So the forward moves K and V ``cp − 1`` times, the
backward K, V, dK and dV ``cp − 1`` times plus dK, dV once more: what
:func:`paraplan.costmodels.cpcomm.ring_exchange_times` prices.

Two forms, as the harness's two attentions. :class:`RingAttention` (``--attention math``)
materialises each step's block of scores (``s/cp × s/cp`` per head, masked by position) and keeps
its probabilities for the backward, so a rank saves ``(s/cp) · s`` probabilities per head, the
single-process ``s × s`` over cp. :class:`RingFlashAttention` (``--attention sdpa``) runs PyTorch's
fused CPU flash kernel per step on the unmasked half-blocks the load balancing leaves and keeps
only the output and its log-sum-exp. With grouped-query attention the ring carries the kv heads only
(the exchange the estimator prices by ``kv_hidden``). Wall time posting the exchange (gloo sends from the calling
thread) and waiting for it is added to ``comm.TIMERS['cp_comm']``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from paraplan.validation import comm


def cp_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of the tokens cp rank ``rank`` holds: chunks ``rank`` and ``2·cp − 1 − rank``
    of ``2·cp`` (all of ``0..seq_len−1`` when cp is 1)."""
    if cp == 1:
        return torch.arange(seq_len)
    c = seq_len // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)
    return torch.cat([first, second])


class CpContext:
    """This rank's place in its cp group: the group, its size and rank, the global ranks of the ring
    neighbours and every cp rank's token positions."""

    def __init__(self, group, seq_len: int):
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.positions = [cp_positions(seq_len, self.size, r) for r in range(self.size)]
        if group is not None:
            self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
            self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    @property
    def local_positions(self) -> torch.Tensor:
        return self.positions[self.rank]

    def allowed(self, owner: int, device) -> torch.Tensor:
        """[s/cp, s/cp] bool: query token i of this rank may attend key token j of cp rank ``owner``."""
        q = self.positions[self.rank].to(device)
        k = self.positions[owner].to(device)
        return k[None, :] <= q[:, None]

    def exchange(self, send: torch.Tensor):
        """Post the send of ``send`` to the next rank and the receive of its like from the previous one;
        returns (receive buffer, requests)."""
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group),
               dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        with comm.timed("cp_comm"):   # gloo sends from the calling thread: CPU time of the exchange
            return recv, dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    with comm.timed("cp_comm"):
        for r in reqs:
            r.wait()


def _ring_blocks(cpx: CpContext, k, v):
    """The forward's ring: yields (step, owner cp rank, K/V block [2, ...]) for each of the cp steps, the
    block first the rank's own; the send of the held block to the next rank and the receive of the
    following one are posted before the step's compute (the yield) and waited after it."""
    kv = torch.stack([k, v]).contiguous()
    for step in range(cpx.size):
        pending = cpx.exchange(kv) if step < cpx.size - 1 else None
        yield step, (cpx.rank - step) % cpx.size, kv
        if pending is not None:
            recv, reqs = pending
            _wait(reqs)
            kv = recv


def _ring_block_gradients(cpx: CpContext, k, v, add_block_gradients):
    """The backward's ring: for each step ``add_block_gradients(step, owner, kv, dkv)`` adds the step's
    dK/dV into ``dkv`` (in place), the accumulator travelling with its K/V block (both arrive from the
    previous rank together); after the last step each accumulator is one hop short of its owner and is
    sent there. Returns this rank's own (dK, dV)."""
    kv = torch.stack([k, v]).contiguous()
    dkv = torch.zeros_like(kv)
    for step in range(cpx.size):
        if step > 0:
            recv, reqs = cpx.exchange(torch.cat([kv, dkv]))
            _wait(reqs)
            kv, dkv = recv[:2], recv[2:].clone()
        add_block_gradients(step, (cpx.rank - step) % cpx.size, kv, dkv)
    if cpx.size > 1:
        recv, reqs = cpx.exchange(dkv.contiguous())
        _wait(reqs)
        dkv = recv
    return dkv[0], dkv[1]


def _grouped(x, kv_heads: int):
    """x [b, heads, s, d] viewed [b, kv heads, heads / kv heads, s, d]: the query heads that read one
    key/value head side by side (query head i reads key/value head i // (heads / kv heads))."""
    b, heads, s, d = x.shape
    return x.view(b, kv_heads, heads // kv_heads, s, d)


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's keys, by ring exchange.

    q: [batch, heads, s/cp, head_dim], k, v: [batch, kv heads, s/cp, head_dim] for this rank's tokens
    (grouped-query attention when kv heads < heads). Returns [batch, heads, s/cp, head_dim]. The ring
    carries K and V with their kv heads only; each step scores the group's queries [b, kv, rep, s, d]
    against the block's [b, kv, 1, s, d] by broadcasting, and the backward sums a block's dK/dV over
    the group (what the single process's grouped form computes).
    """

    @staticmethod
    def forward(ctx, q, k, v, cpx: CpContext):
        scale = 1.0 / math.sqrt(q.shape[-1])
        qg = _grouped(q, k.shape[1])
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        probs, block_lse = [], []
        for _, owner, kv in _ring_blocks(cpx, k, v):
            scores = (qg @ kv[0].unsqueeze(2).transpose(-2, -1)) * scale
            scores = scores.masked_fill(~cpx.allowed(owner, q.device), float("-inf"))
            lse_b = torch.logsumexp(scores, dim=-1)
            # rows that may attend nothing in this block: probabilities 0, block lse -inf
            p = torch.exp(scores - torch.where(torch.isfinite(lse_b), lse_b, 0.0).unsqueeze(-1))
            o_b = p @ kv[1].unsqueeze(2)
            new_lse = torch.logaddexp(lse, lse_b)
            out = out * torch.exp(lse - new_lse).unsqueeze(-1) + o_b * torch.exp(lse_b - new_lse).unsqueeze(-1)
            lse = new_lse
            probs.append(p)
            block_lse.append(lse_b)
        ctx.cpx = cpx
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse, *probs, *block_lse)
        return out.view(q.shape)

    @staticmethod
    def backward(ctx, d_out):
        cpx, scale = ctx.cpx, ctx.scale
        q, k, v, out, lse, *rest = ctx.saved_tensors
        probs, block_lse = rest[:cpx.size], rest[cpx.size:]
        qg = _grouped(q, k.shape[1])
        d_out = _grouped(d_out.contiguous(), k.shape[1])
        delta = (d_out * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qg)

        def add_block_gradients(step, owner, kv, dkv):
            # the block's probabilities under the final normaliser
            p = probs[step] * torch.exp(block_lse[step] - lse).unsqueeze(-1)
            dv = (p.transpose(-2, -1) @ d_out).sum(2)
            dp = d_out @ kv[1].unsqueeze(2).transpose(-2, -1)
            ds = p * (dp - delta) * scale
            dq.add_(ds @ kv[0].unsqueeze(2))
            dkv += torch.stack([(ds.transpose(-2, -1) @ qg).sum(2), dv])

        dk, dv = _ring_block_gradients(cpx, k, v, add_block_gradients)
        return dq.view(q.shape), dk, dv, None


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _merge(out, lse, rows, o_b, lse_b) -> None:
    """Fold one step's partial attention (``o_b``, ``lse_b`` over query ``rows``) into the running
    ``out`` / ``lse`` in place, by their log-sum-exp."""
    new = torch.logaddexp(lse[..., rows], lse_b)
    out[..., rows, :] = out[..., rows, :] * torch.exp(lse[..., rows] - new).unsqueeze(-1) \
        + o_b * torch.exp(lse_b - new).unsqueeze(-1)
    lse[..., rows] = new


class RingFlashAttention(torch.autograd.Function):
    """Ring attention on a fused kernel per step (``--attention sdpa``): PyTorch's CPU flash-attention
    kernel, which returns its log-sum-exp, as Transformer Engine runs FlashAttention per ring step.

    With the load-balanced chunks each step is one unmasked call, half the block's work, except the
    first (Transformer Engine's AttnFuncWithCPAndKVP2P splits the same way): at step 0 the rank's own
    block, whose positions ascend, is plain causal attention; a block from a lower cp rank is seen
    whole by every query through its first chunk only (its second chunk lies beyond all of them); a
    block from a higher cp rank is seen whole by the second half of the queries only. The backward
    calls the kernel's backward per step with the final output and log-sum-exp. The kernel takes
    grouped-query K/V (fewer heads than q) as they are and returns their gradients per kv head."""

    @staticmethod
    def forward(ctx, q, k, v, cpx: CpContext):
        scale = 1.0 / math.sqrt(q.shape[-1])
        half = q.shape[-2] // 2
        out = lse = None
        for step, owner, kv in _ring_blocks(cpx, k, v):
            if step == 0:
                out, lse = _flash(q, kv[0], kv[1], 0.0, True, scale=scale)
            elif owner < cpx.rank:
                o_b, lse_b = _flash(q, kv[0, ..., :half, :], kv[1, ..., :half, :], 0.0, False, scale=scale)
                _merge(out, lse, slice(None), o_b, lse_b)
            else:
                o_b, lse_b = _flash(q[..., half:, :], kv[0], kv[1], 0.0, False, scale=scale)
                _merge(out, lse, slice(half, None), o_b, lse_b)
        ctx.cpx, ctx.scale = cpx, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, d_out):
        cpx, scale = ctx.cpx, ctx.scale
        q, k, v, out, lse = ctx.saved_tensors
        half = q.shape[-2] // 2
        d_out = d_out.contiguous()
        dq = torch.zeros_like(q)

        def add_block_gradients(step, owner, kv, dkv):
            if step == 0:
                gq, gk, gv = _flash_backward(d_out, q, kv[0], kv[1], out, lse, 0.0, True, scale=scale)
                dq.add_(gq)
                dkv += torch.stack([gk, gv])
            elif owner < cpx.rank:
                gq, gk, gv = _flash_backward(d_out, q, kv[0, ..., :half, :], kv[1, ..., :half, :], out, lse,
                                             0.0, False, scale=scale)
                dq.add_(gq)
                dkv[..., :half, :] += torch.stack([gk, gv])
            else:
                gq, gk, gv = _flash_backward(d_out[..., half:, :], q[..., half:, :], kv[0], kv[1],
                                             out[..., half:, :], lse[..., half:], 0.0, False, scale=scale)
                dq[..., half:, :] += gq
                dkv += torch.stack([gk, gv])

        dk, dv = _ring_block_gradients(cpx, k, v, add_block_gradients)
        return dq, dk, dv, None


def ring_attention(q, k, v, cpx: CpContext, fused: bool = False):
    """:class:`RingAttention` (materialised scores, ``--attention math``) or, ``fused``,
    :class:`RingFlashAttention` (``--attention sdpa``) applied."""
    return (RingFlashAttention if fused else RingAttention).apply(q, k, v, cpx)
