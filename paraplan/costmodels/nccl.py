"""How NCCL itself prices a collective that leaves the node: protocols, ring and tree.

NCCL picks, for every call, the (algorithm, protocol) pair its own cost model says is fastest
(NVIDIA/nccl @ b647562 : src/graph/tuning.cc, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``):

  time = latency(algorithm, protocol) + bytes / algbw(algorithm, protocol)

with, for n ranks on N nodes (k = n/N per node):

  ring   nsteps = 2(n−1) all-reduce, n−1 reduce-scatter / all-gather; of those the steps that cross
         the network: 2N all-reduce (N > 1), N−1 reduce-scatter / all-gather
         latency = base(p) + (nsteps − netsteps)·hop_intra(p) + netsteps·hop_net(p)
         algbw   = busbw(p) · n / nsteps
  tree   (all-reduce only, N > 1) latency = base_tree(p) + 2·((k−1)·hop_intra_tree(p) + log2(N)·hop_net_tree(p))
         algbw   = busbw_tree(p) / 2, times NCCL's tree correction by message size

Protocols (same file): LL (8-byte flag+data stores: a quarter of the bus bandwidth, lowest latency),
LL128 (128-byte lines: 0.92 of it, medium latency), Simple (the full bandwidth, a fence and a 256 kB
chunk per step: highest latency). Which protocols a network allows is link data
(:attr:`paraplan.hardware.model.Link.protocols`): InfiniBand/RoCE all three (NCCL's default); AWS EFA
only Simple (aws/aws-ofi-nccl @ a21f4df : src/platform-aws.c sets ``NCCL_PROTO=simple``, EFA lacking
128-byte in-order delivery).

Bus bandwidth across nodes, "inter-node speed depends on intra-node speed" (stas00/ml-engineering @
744d01e : network/README.md): every rank of the group drives its own NIC, so a group with k ranks per
node moves k NICs' worth across the boundary while the rest of each step stays on NVLink:

  busbw = min(η_intra·B_intra, k·η_net·B_net)

NCCL's latency figures are per hop for the Simple protocol on the link's own tier (3.4 µs NVLink,
14 µs network); a link's ``latency_s`` is that Simple ring hop, and the other protocols' and the
tree's hops keep NCCL's ratio to it (so a slower network scales all of them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paraplan.constants import fitted

LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)
RING, TREE = "ring", "tree"


@dataclass(frozen=True)
class ProtocolTable:
    """NCCL's figures for one protocol (NVIDIA/nccl @ b647562 : src/graph/tuning.cc; µs as there).

    ``base_*``: baseLat (ring, tree). ``hop_*``: hwLat for NVLink and network, ring and tree.
    ``ring_bw_factor``: the ring's bus bandwidth over the Simple one (LL 1/4, LL128 0.92);
    ``tree_bw_factor``: the tree's (0.92 for every protocol, LL then /3.8, LL128 ×120/128 across nodes);
    ``ll_cap_gbs``: LL's bus bandwidth cap across 2 / more than 2 nodes (llMaxBws, x86 Intel hosts)."""
    name: str
    base_ring_us: float
    base_tree_us: float
    hop_nvlink_ring_us: float
    hop_net_ring_us: float
    hop_nvlink_tree_us: float
    hop_net_tree_us: float
    ring_bw_factor: float
    tree_bw_factor: float
    net_overhead_us: float
    ll_cap_gbs: tuple[float, float] | None = None


#: tuning.cc baseLat / hwLat (NVLink, NET rows), the "model refinements" on busBw, and the network
#: post overhead (getNetOverhead: 1 µs on x86 Intel, ×3 for Simple) every intra-node ring step of a
#: multi-node ring costs at least
TABLES = {
    LL: ProtocolTable(LL, 6.6, 6.8, 0.6, 2.7, 0.6, 5.0, 1 / 4, 0.92 / 3.8, 1.0, (39.0, 20.4)),
    LL128: ProtocolTable(LL128, 14.0, 14.0, 1.9, 4.0, 1.25, 8.5, 0.92, 0.92 * 120 / 128, 1.0),
    SIMPLE: ProtocolTable(SIMPLE, 8.4, 0.0, 3.4, 14.0, 28.0, 28.0, 1.0, 0.92, 3.0),
}

#: tuning.cc ncclTopoGetAlgoTime: a multi-node Simple ring all-reduce's latency ×1.4 on sm80 and later
#: ("plateau effect of ring"; ×1.9 before sm80)
RING_PLATEAU = 1.4

#: tuning.cc treeCorrectionFactor, per protocol, by log2(bytes/64) from 0 (64 B) to 22 (256 MiB); 1 above
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}

#: seconds a call costs above NCCL's kernel model (the one-node sweep's small-message floor less NCCL's
#: LL latency there; fitted_constants.yaml collective_call_overhead)
CALL_OVERHEAD_S = fitted("collective_call_overhead")

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"


def ring_steps(kind: str, n):
    """Ring steps (tuning.cc ``nsteps``): 2(n−1) for all-reduce, n−1 for reduce-scatter / all-gather."""
    n = np.asarray(n, dtype=float)
    return 2 * (n - 1) if kind == ALL_REDUCE else n - 1


def ring_network_steps(kind: str, nodes):
    """Ring steps that cross the network (tuning.cc ``nInterSteps``): 2N for an all-reduce over N > 1
    nodes, N−1 for reduce-scatter / all-gather; 0 inside one node."""
    nodes = np.asarray(nodes, dtype=float)
    if kind == ALL_REDUCE:
        return np.where(nodes > 1, 2 * nodes, 0.0)
    return nodes - 1


def ring_intra_steps(kind: str, n, nodes):
    """Ring steps that stay on NVLink: nsteps − netsteps, at least 0 (one rank per node: every step
    crosses the network)."""
    return np.maximum(ring_steps(kind, n) - ring_network_steps(kind, nodes), 0.0)


def ring_latency(kind: str, n, nodes, proto: str, nvlink_hop_s: float, net_hop_s: float):
    """Seconds of a ring's latency: base + (nsteps − netsteps)·hop_intra + netsteps·hop_net, each hop
    scaled from the link's Simple hop by NCCL's protocol ratio; the intra hops of a multi-node ring at
    least NCCL's network post overhead; ×:data:`RING_PLATEAU` for a multi-node Simple all-reduce."""
    t = TABLES[proto]
    nodes = np.asarray(nodes, dtype=float)
    intra_hop = nvlink_hop_s * t.hop_nvlink_ring_us / TABLES[SIMPLE].hop_nvlink_ring_us
    intra_hop = np.where(nodes > 1, np.maximum(intra_hop, t.net_overhead_us * 1e-6), intra_hop)
    net_hop = net_hop_s * t.hop_net_ring_us / TABLES[SIMPLE].hop_net_ring_us
    intra_steps = ring_intra_steps(kind, n, nodes)
    net_steps = ring_steps(kind, n) - intra_steps
    lat = t.base_ring_us * 1e-6 + intra_steps * intra_hop + net_steps * net_hop
    if kind == ALL_REDUCE and proto == SIMPLE:
        lat = np.where(nodes > 1, lat * RING_PLATEAU, lat)
    return lat


def tree_latency(n, nodes, proto: str, nvlink_hop_s: float, net_hop_s: float):
    """Seconds of a tree all-reduce's latency: base + 2·((k−1)·hop_intra + log2(N)·hop_net), k = n/N
    (tuning.cc; NCCL's log2i rounds down)."""
    t = TABLES[proto]
    n, nodes = np.asarray(n, dtype=float), np.asarray(nodes, dtype=float)
    intra_hop = nvlink_hop_s * t.hop_nvlink_tree_us / TABLES[SIMPLE].hop_nvlink_ring_us
    net_hop = net_hop_s * t.hop_net_tree_us / TABLES[SIMPLE].hop_net_ring_us
    depth = np.floor(np.log2(np.maximum(nodes, 1.0)))
    return t.base_tree_us * 1e-6 + 2 * ((n / nodes - 1) * intra_hop + depth * net_hop)


def multinode_bus_bandwidth(intra_bw, net_bw, ranks_per_node):
    """Bytes/s of bus bandwidth of a collective across nodes: min(intra, k·net), each the tier's
    achieved large-message rate (η·B) per GPU: every one of the group's k ranks on a node drives its
    own NIC (stas00/ml-engineering @ 744d01e : network/README.md, "Inter-node speed depends on
    intra-node speed")."""
    return np.minimum(np.asarray(intra_bw, dtype=float), np.asarray(ranks_per_node, dtype=float) * net_bw)


def ll_cap(nodes):
    """Bytes/s cap on LL's bus bandwidth across nodes (tuning.cc llMaxBws, x86 Intel: 39 GB/s on 2
    nodes, 20.4 on more)."""
    lo, hi = TABLES[LL].ll_cap_gbs
    return np.where(np.asarray(nodes, dtype=float) <= 2, lo, hi) * 1e9


def tree_correction(size_bytes, proto: str):
    """NCCL's static correction of a tree's bandwidth by message size (tuning.cc treeCorrectionFactor;
    1 from 512 MiB up)."""
    table = np.asarray(TREE_CORRECTION[proto])
    idx = np.floor(np.log2(np.maximum(np.asarray(size_bytes, dtype=float) / 64.0, 1.0))).astype(int)
    return np.where(idx < len(table), table[np.minimum(idx, len(table) - 1)], 1.0)


def ring_time(kind: str, size_bytes, n, nodes, busbw, proto: str, nvlink_hop_s: float, net_hop_s: float):
    """Seconds of a ring ``kind`` over n ranks on ``nodes`` nodes with protocol ``proto``:
    latency + S / (busbw_p · n / nsteps); S the full (unsharded) buffer, as nccl-tests counts it."""
    t = TABLES[proto]
    bw = np.asarray(busbw, dtype=float) * t.ring_bw_factor
    if proto == LL:
        bw = np.minimum(bw, ll_cap(nodes))
    n = np.asarray(n, dtype=float)
    algbw = bw * n / np.maximum(ring_steps(kind, n), 1.0)   # n = 1 entries of a vector: no traffic, no division
    return ring_latency(kind, n, nodes, proto, nvlink_hop_s, net_hop_s) + np.asarray(size_bytes, dtype=float) / algbw


def tree_time(size_bytes, n, nodes, busbw, proto: str, nvlink_hop_s: float, net_hop_s: float):
    """Seconds of a tree all-reduce: latency + S / (busbw_tree · ½ · correction(S))."""
    t = TABLES[proto]
    bw = np.asarray(busbw, dtype=float) * t.tree_bw_factor
    if proto == LL:
        bw = np.minimum(bw, ll_cap(nodes))
    algbw = bw * 0.5 * tree_correction(size_bytes, proto)
    return tree_latency(n, nodes, proto, nvlink_hop_s, net_hop_s) + np.asarray(size_bytes, dtype=float) / algbw


def multinode_time(kind: str, size_bytes, n, ranks_per_node, intra_bw, net_bw, nvlink_hop_s: float,
                   net_hop_s: float, protocols=PROTOCOLS):
    """Seconds a ``kind`` (all_reduce, reduce_scatter, all_gather) over n ranks with k per node across
    n/k nodes takes: :data:`CALL_OVERHEAD_S` + the fastest (algorithm, protocol) pair among
    ``protocols`` by the module's model, as NCCL itself chooses (tree only for all-reduce)."""
    n = np.asarray(n, dtype=float)
    k = np.minimum(np.asarray(ranks_per_node, dtype=float), n)
    nodes = n / k
    busbw = multinode_bus_bandwidth(intra_bw, net_bw, k)
    best = np.full(np.broadcast(n, k, np.asarray(size_bytes, dtype=float)).shape, math.inf)
    for p in protocols:
        best = np.minimum(best, ring_time(kind, size_bytes, n, nodes, busbw, p, nvlink_hop_s, net_hop_s))
        if kind == ALL_REDUCE:
            tree = tree_time(size_bytes, n, nodes, busbw, p, nvlink_hop_s, net_hop_s)
            best = np.minimum(best, np.where(nodes > 1, tree, math.inf))
    return CALL_OVERHEAD_S + best
