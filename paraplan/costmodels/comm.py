"""Collective communication time: alpha-beta over the tier(s) a group spans.

Ring collectives on one tier (nccl-tests doc/PERFORMANCE.md bus-bandwidth factors; NCCL
src/graph/tuning.cc step counts), n ranks, S bytes (the full, unsharded buffer), link bandwidth
B and efficiency η, per-step latency α (a link fitted from a profile may carry its own α and
η·B per collective, :meth:`paraplan.hardware.model.Link.alpha_beta`):

  all-reduce          T = 2(n−1)·α + 2(n−1)/n · S/(η·B)
  reduce-scatter      T =  (n−1)·α +  (n−1)/n · S/(η·B)      (all-gather the same)
  all-to-all          T =  (n−1)·α +  (n−1)/n · S/(η·B)      (S = bytes each rank holds)
  send/recv           T =        α +            S/(η·B)

A group of n ranks with k of them per node spans n/k nodes. Its all-reduce, reduce-scatter and
all-gather are priced as NCCL prices them (:mod:`paraplan.costmodels.nccl`, after NVIDIA/nccl
src/graph/tuning.cc): the fastest of ring and (all-reduce) tree under each protocol the network allows,
the ring paying NVLink hop latencies for its steps inside a node and network hop latencies for the
steps that cross one, at a bus bandwidth of min(η·B intra, k·η·B inter) since every GPU drives its own
NIC ("Inter-node speed depends on intra-node speed", stas00/ml-engineering @ 744d01e, network/README.md).
Links fitted from a profile (per-op α-β, measured tables) keep the hierarchical form instead: intra-node
reduce-scatter over k, inter-node collective over n/k ranks on 1/k of the data, intra-node all-gather.
All-to-all and send/recv stay α-β per tier. The inter-node link's bandwidth is per GPU.

Placement: ranks are numbered tp fastest, then cp, then dp, then pp (Megatron's order), so a
group's members per node follow from the strides; :func:`ranks_per_node` gives k.
"""
from __future__ import annotations

import numpy as np

from paraplan.costmodels import nccl
from paraplan.hardware.model import Link

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, SEND_RECV = "all_reduce", "reduce_scatter", "all_gather", \
    "all_to_all", "send_recv"


def ring_time(kind: str, size_bytes, n, link: Link):
    """Seconds for one collective on a single tier (flat ring); 0 when n == 1."""
    n = np.asarray(n, dtype=float)
    s = np.asarray(size_bytes, dtype=float)
    alpha, bw = link.alpha_beta(kind)
    if kind == SEND_RECV:
        return _measured_or(alpha + s / bw, kind, s, 2, link)
    if kind == ALL_REDUCE:
        t = 2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bw
    elif kind in (REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL):
        t = (n - 1) * alpha + (n - 1) / n * s / bw
    else:
        raise ValueError(f"unknown collective {kind}")
    t = _measured_or(t, kind, s, n, link)
    return np.where(n > 1, t, 0.0)


def _measured_or(t, kind: str, s, n, link: Link):
    """``t`` where the link has no measurement of ``kind`` at ``n`` ranks and size ``s``; inside the
    measured sizes, the measured time interpolated log-log between its neighbours."""
    table = (link.measured or {}).get(kind)
    if not table or len(table) < 2:
        return t
    sizes = np.log([b for b, _ in table])
    times = np.log([x for _, x in table])
    ls = np.log(np.maximum(s, 1.0))
    inside = (ls >= sizes[0]) & (ls <= sizes[-1]) & (n == link.measured_world)
    return np.where(inside, np.exp(np.interp(ls, sizes, times)), t)


def collective_time(kind: str, size_bytes, n, k, intra: Link, inter: Link):
    """Seconds for a collective over n ranks with k ranks per node (k = n: inside one node).

    Hierarchical when the group spans nodes: see the module docstring.
    """
    n = np.asarray(n, dtype=float)
    k = np.minimum(np.asarray(k, dtype=float), n)
    nodes = n / k
    s = np.asarray(size_bytes, dtype=float)
    if kind == ALL_TO_ALL:
        # Each rank keeps 1/n, sends (k-1)/n inside the node and (n-k)/n out through its NIC.
        a_in, b_in = intra.alpha_beta(ALL_TO_ALL)
        a_out, b_out = inter.alpha_beta(ALL_TO_ALL)
        t_intra = (k - 1) * a_in + (k - 1) / n * s / b_in
        t_inter = (nodes - 1) * a_out + (n - k) / n * s / b_out
        return np.where(n > 1, t_intra + t_inter, 0.0)
    if kind == SEND_RECV:
        return np.where(nodes > 1, ring_time(kind, s, 2, inter), ring_time(kind, s, 2, intra))
    single = ring_time(kind, s, n, intra)
    if not (intra.per_op or inter.per_op or intra.measured or inter.measured):
        if not np.any(nodes > 1):
            return single
        (a_in, b_in), (a_out, b_out) = intra.alpha_beta(kind), inter.alpha_beta(kind)   # with calibration factors
        across = nccl.multinode_time(kind, s, n, k, b_in, b_out, a_in, a_out, inter.protocols)
        return np.where(nodes > 1, across, single)
    intra_part = ring_time(REDUCE_SCATTER, s, k, intra)           # RS (or AG) inside the node
    inter_part = ring_time(kind, s / k, nodes, inter)             # same collective across nodes on 1/k
    if kind == ALL_REDUCE:
        hier = 2 * intra_part + inter_part                        # RS + AR + AG
    else:
        hier = intra_part + inter_part
    return np.where(nodes > 1, hier, single)


RANK_ORDER_ASSUMPTION = "ranks ordered tp, cp, dp, pp (tp innermost): groups fill a node before spanning nodes"


def rank_order_assumption(**_) -> tuple[str, ...]:
    """The placement :func:`ranks_per_node` reads the groups' strides from."""
    return (RANK_ORDER_ASSUMPTION,)


def ranks_per_node(group_size, stride, gpus_per_node):
    """How many members of a group (size n, rank stride) sit on one node of g GPUs.

    A group with stride ≥ g has one member per node; otherwise g/stride members share a node,
    capped by the group size.
    """
    n = np.asarray(group_size, dtype=float)
    stride = np.asarray(stride, dtype=float)
    per_node = np.maximum(1.0, np.floor(gpus_per_node / stride))
    return np.minimum(n, per_node)


def nvlink_domain_assumption(cluster, **_) -> tuple[str, ...]:
    """The assumption a cluster cut into NVLink domains smaller than its system's node rests on
    (:func:`paraplan.hardware.model.nvlink_domain_gpus`: equal domains of whole hosts, each inside one
    node, as Slurm's topology/block ``--segment`` allocates), with the host resources each domain
    then holds; nothing for a cluster inside one node or of whole nodes."""
    if not cluster.partitioned:
        return ()
    s, g = cluster.system, cluster.gpus_per_node
    hosts = g // s.gpus_per_host
    return (f"{cluster.num_gpus} GPUs on {s.name} modelled as {cluster.num_nodes} NVLink domains of {g} GPUs "
            f"({hosts} hosts of {s.gpus_per_host} each; {cluster.num_gpus} is not a multiple of {s.gpus_per_node}): "
            f"placed as equal segments of whole hosts, each inside one {s.gpus_per_node}-GPU node, collectives "
            f"between segments on the network, each domain with {hosts}/{s.hosts_per_node} of a node's NICs, CPUs, "
            f"host memory and NVMe",)
