"""Context-parallel communication of one layer for one micro-batch: ring attention's K/V exchange, the part
of it the attention core does not hide (:func:`cp_exposed_time`) and the time it holds the inter-node
links (:func:`ring_hidden_on_network`), and DeepSpeed-Ulysses' all-to-alls. Ring attention's merge kernels
are part of the attention core (:func:`paraplan.costmodels.attention.ring_attention_merge_times`).
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels.comm import ALL_TO_ALL, SEND_RECV, collective_time, ranks_per_node, ring_time
from paraplan.costmodels.kernels import device_is_host, element_bytes, tokens_per_rank
from paraplan.plan import CpMode


def ulysses_alltoall_time(model, job, plan, cluster):
    """DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): per layer forward, an all-to-all of
    Q, K, V ((h + 2h_kv) wide) before attention and one of the context (h wide) after it, over the
    cp group; each GPU holds s/cp tokens, so its bytes are b·(s/cp)·(2h + 2h_kv)·e/tp and the per-link
    volume stays constant when s and cp grow together."""
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    intra, inter = cluster.links("cp")
    qkv = collective_time(ALL_TO_ALL, T * (model.q_hidden + model.kv_hidden + model.v_hidden) * element_bytes(plan) / t,
                          plan.cp, k, intra, inter)
    out = collective_time(ALL_TO_ALL, T * model.attn_out_hidden * element_bytes(plan) / t, plan.cp, k, intra, inter)
    return qkv + out


def ring_attention_step_time(model, job, plan, cluster):
    """One ring-attention step: a K and V chunk of s/cp tokens to the next cp rank."""
    T = tokens_per_rank(job, plan)
    chunk = T * (model.kv_hidden + model.v_hidden) / np.asarray(plan.tp, dtype=float) * element_bytes(plan)
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    intra, inter = cluster.links("cp")
    return np.where(k < np.asarray(plan.cp), ring_time(SEND_RECV, chunk, 2, inter), ring_time(SEND_RECV, chunk, 2, intra))


def cp_exposed_time(model, job, plan, cluster, attn_fwd, attn_bwd, exchange=None):
    """Context parallelism per layer and micro-batch, exposed part.

    Ring attention (Liu et al. 2023; Megatron-LM context_parallel.md): K/V chunks pass around the
    cp ring, overlapped with the attention core; only the excess is exposed. Forward moves K and V
    (cp−1) times; backward moves K, V and their gradients. Ulysses: its all-to-alls sit on the
    critical path (forward 2, backward 2). ``exchange``: :func:`ring_exchange_times` when the caller
    has it already."""
    ulysses = 2 * ulysses_alltoall_time(model, job, plan, cluster)
    if exchange is None:
        exchange = ring_exchange_times(model, job, plan, cluster)
    if not ring_exchange_hides(cluster):
        attn_fwd = attn_bwd = 0.0
    ring = _ring_exposed(exchange, attn_fwd, attn_bwd, plan)
    c = np.asarray(plan.cp, dtype=float)
    return np.where(c > 1, np.where(np.asarray(plan.cp_mode_code) == CpMode.ULYSSES, ulysses, ring), 0.0)


def ring_exchange_hides(cluster) -> bool:
    """Whether ring attention's K/V exchange can run under the attention core. On GPUs it can (NCCL's
    or the copy engines' transfers beside the kernels). On a profiled CPU it cannot: gloo moves the
    bytes on the cores that compute, the send in the calling thread and the receive in gloo's own
    threads (measured in ``paraplan validate --cp 2`` on the default model: c10d::send held 6.4 ms of
    the rank's CPU per step besides 3.7 ms of waits), as its data-parallel collectives hide nothing
    there either (:mod:`paraplan.validation.predict`)."""
    return not device_is_host(cluster)


def ring_exchange_times(model, job, plan, cluster):
    """(step, forward, backward) seconds of ring attention's K/V exchange per layer and micro-batch:
    one step (:func:`ring_attention_step_time`), the forward's (cp−1) steps moving K and V, and the
    backward's 2(cp−1) moving K, V and their gradients. What :func:`_ring_exposed` and
    :func:`ring_hidden_on_network` share."""
    c = np.asarray(plan.cp, dtype=float)
    step = ring_attention_step_time(model, job, plan, cluster)
    return step, (c - 1) * step, 2 * (c - 1) * step


def _ring_exposed(exchange, attn_fwd, attn_bwd, plan):
    """Forward: the K/V chunks beyond the excess over the attention core. Backward likewise, plus
    the last step's dK/dV chunk, which goes back to its owner after the last attention kernel with
    nothing left to hide under (Transformer Engine's AttnFuncWithCPAndKVP2P.backward waits for it).
    ``exchange`` is :func:`ring_exchange_times`."""
    step, fwd, bwd = exchange
    exposed = np.maximum(0.0, fwd - attn_fwd) + np.maximum(0.0, bwd - attn_bwd) + step
    return np.where(np.asarray(plan.cp) > 1, exposed, 0.0)


def ring_hidden_on_network(model, job, plan, cluster, attn_fwd, attn_bwd, exchange=None):
    """(forward, backward) seconds per layer and micro-batch during which ring attention's K/V
    exchange, hidden under the attention core, holds the inter-node links: min(exchange, attention
    core) in each pass where the cp ring spans nodes (0 for Ulysses, cp = 1 or a ring inside a node).
    The data-parallel collectives that run over the same links cannot also hide in that time
    (:func:`paraplan.costmodels.estimate.step_terms`). ``exchange``: :func:`ring_exchange_times`
    when the caller has it already."""
    c = np.asarray(plan.cp, dtype=float)
    _, fwd_x, bwd_x = ring_exchange_times(model, job, plan, cluster) if exchange is None else exchange
    k = ranks_per_node(plan.cp, plan.tp, cluster.gpus_per_node)
    crosses = (c > 1) & (np.asarray(plan.cp_mode_code) != CpMode.ULYSSES) & (k < c)
    fwd = np.where(crosses, np.minimum(fwd_x, attn_fwd), 0.0)
    bwd = np.where(crosses, np.minimum(bwd_x, attn_bwd), 0.0)
    return fwd, bwd
