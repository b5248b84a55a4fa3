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
:func:`paraplan.costmodels.compute.ring_exchange_times` prices.

As the harness's ``math`` attention, each step materialises its block of scores (``s/cp × s/cp``
per head) and keeps its probabilities for the backward (no recomputation of the scores), so a
rank saves ``(s/cp) · s`` probabilities per head, the single-process ``s × s`` over cp. Wall time
waiting for the exchange is added to ``comm.TIMERS['cp_comm']``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from paraplan.errors import ConfigError
from paraplan.validation import comm


def check_cp(seq_len: int, cp: int, tp: int = 1, sequence_parallel: bool = False) -> None:
    """Raise ConfigError unless the sequence splits into ``2·cp`` chunks (and each rank's ``s/cp``
    tokens over tp under sequence parallelism)."""
    if cp > 1 and seq_len % (2 * cp):
        raise ConfigError("cp", f"seq_len({seq_len}) is not divisible by 2 * cp({cp}) (ring attention "
                          f"balances 2*cp causal chunks)", accepted=f"cp with seq_len % (2*cp) == 0")
    if cp > 1 and sequence_parallel and (seq_len // cp) % tp:
        raise ConfigError("sequence_parallel", f"seq_len({seq_len}) / cp({cp}) is not divisible by tp({tp})")


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
        return recv, dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    with comm.timed("cp_comm"):
        for r in reqs:
            r.wait()


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's keys, by ring exchange.

    q, k, v: [batch, heads, s/cp, head_dim] for this rank's tokens. Returns [batch, heads, s/cp, head_dim].
    """

    @staticmethod
    def forward(ctx, q, k, v, cpx: CpContext):
        scale = 1.0 / math.sqrt(q.shape[-1])
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        probs, block_lse = [], []
        for step in range(cpx.size):
            owner = (cpx.rank - step) % cpx.size
            pending = cpx.exchange(kv) if step < cpx.size - 1 else None
            scores = (q @ kv[0].transpose(-2, -1)) * scale
            scores = scores.masked_fill(~cpx.allowed(owner, q.device), float("-inf"))
            lse_b = torch.logsumexp(scores, dim=-1)
            # rows that may attend nothing in this block: probabilities 0, block lse -inf
            p = torch.exp(scores - torch.where(torch.isfinite(lse_b), lse_b, 0.0).unsqueeze(-1))
            o_b = p @ kv[1]
            new_lse = torch.logaddexp(lse, lse_b)
            out = out * torch.exp(lse - new_lse).unsqueeze(-1) + o_b * torch.exp(lse_b - new_lse).unsqueeze(-1)
            lse = new_lse
            probs.append(p)
            block_lse.append(lse_b)
            if pending is not None:
                recv, reqs = pending
                _wait(reqs)
                kv = recv
        ctx.cpx = cpx
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse, *probs, *block_lse)
        return out

    @staticmethod
    def backward(ctx, d_out):
        cpx, scale = ctx.cpx, ctx.scale
        q, k, v, out, lse, *rest = ctx.saved_tensors
        probs, block_lse = rest[:cpx.size], rest[cpx.size:]
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)
        for step in range(cpx.size):
            if step > 0:
                # the block and its gradient accumulator arrive from the previous rank together
                recv, reqs = cpx.exchange(torch.cat([kv, dkv]))
                _wait(reqs)
                kv, dkv = recv[:2], recv[2:].clone()
            # the block's probabilities under the final normaliser
            p = probs[step] * torch.exp(block_lse[step] - lse).unsqueeze(-1)
            dv = p.transpose(-2, -1) @ d_out
            dp = d_out @ kv[1].transpose(-2, -1)
            ds = p * (dp - delta) * scale
            dq = dq + ds @ kv[0]
            dk = ds.transpose(-2, -1) @ q
            dkv = dkv + torch.stack([dk, dv])
        if cpx.size > 1:
            # each accumulator is one hop short of its owner
            recv, reqs = cpx.exchange(dkv.contiguous())
            _wait(reqs)
            dkv = recv
        return dq, dkv[0], dkv[1], None


def ring_attention(q, k, v, cpx: CpContext):
    """:class:`RingAttention` applied (see there)."""
    return RingAttention.apply(q, k, v, cpx)
