"""The cluster as a networkx graph, and the bandwidth each parallel group really gets from it.

Graph (:func:`build_topology`)
------------------------------
Nodes: ``("gpu", i)`` for every GPU (global rank i), ``("nvswitch", n)`` one NVLink domain per node n,
``("nic", n, k)`` the compute NICs, ``("leaf", ...)`` and ``("spine", s)`` switches. Edges, each with
``bandwidth_bytes_per_s`` (one direction), ``latency_s`` and ``tier``:

  GPU — NVSwitch   intra-node per-GPU line rate (``system.intra_node``)              tier "nvlink"
  GPU — NIC        PCIe (``system.pcie_bandwidth_bytes_per_s``); GPU j of a node
                   drives NIC ``j · nics_per_node // gpus_per_node`` (DGX-1: 4 NICs
                   for 8 GPUs, 2 GPUs share one)                                     tier "pcie"
  NIC — leaf       ``system.nic_bandwidth_bytes_per_s``                             tier "network"
  leaf — spine     the leaf's uplink capacity, split evenly over the spines         tier "network"

Rail-optimized (DGX SuperPOD style): the nodes are cut into scalable units of
``leaf_ports`` nodes; NIC k of every node of a unit goes to rail leaf ``("leaf", unit, k)``.
Otherwise every NIC of a group of ``leaf_ports // nics_per_node`` nodes goes to one leaf
``("leaf", j)``. Leaves are joined by spines (none when there is only one leaf). A leaf's uplink
capacity is ``leaf_ports · nic_bandwidth / oversubscription`` (2 = 2:1), spread over
``ceil(leaves · leaf_ports / oversubscription / spine_ports)`` spines.

Latency: a GPU→NVSwitch→GPU path costs the system's intra-node α (3.4 µs on NVLink, NCCL
tuning.cc); a GPU→NIC→leaf→NIC→GPU path costs the system's inter-node α (14 µs per network hop,
which NCCL measures GPU to GPU, so the PCIe edges carry none); each leaf—spine link adds
``SWITCH_HOP_LATENCY_S`` (an estimate: one more switch traversal and cable).

Routing (:func:`route`): shortest paths by hop count. Inside a node: through the NVSwitch. Between
nodes: out of the source GPU's NIC, through the leaf (and, across leaves, a spine), into the
destination GPU's NIC. When a rail-optimized fabric would need a spine only to change rails, the
flow first crosses NVLink to the source-node GPU on the destination's rail and leaves by its NIC
(NCCL's PXN; same hop count as the spine route). Spine traffic is split evenly over all spines
(ideal ECMP), so loads are counted on each leaf's uplinks as a whole.

Group bandwidth (:func:`group_bandwidth`)
----------------------------------------
A group's traffic is a set of flows, each at the same rate r; the flows of the group and of every
group running at the same time (``concurrent``: the sibling groups of the same axis) are routed,
the flows on every directed edge are counted, and r = min over the edges the group uses of
capacity / flows. That r is the per-GPU, one-direction bandwidth a ring collective sees (nccl-tests
bus bandwidth, NVIDIA/nccl-tests doc/PERFORMANCE.md). Patterns:

* ``"hierarchical"`` (tp, dp; the model of :mod:`paraplan.costmodels.comm`): inside one node, a ring
  over the members on NVLink. Across nodes with k members per node: an intra-node ring per node
  (NVLink tier), and k inter-node rings, ring j over the j-th member of every node, all at once,
  each GPU through its own NIC (network tier). ``collective_time(kind, S, n, k, intra, inter)`` with
  the two returned tiers is then the hierarchical time of comm.py.
* ``"ring"`` (cp's ring attention): one flat ring over the members in rank order.
* ``"p2p"`` (pp): each member sends to the next (activations); the gradients going back use the
  reverse directions of the same edges and, in 1F1B, a stage trades with one neighbour at a time,
  so they give the same figure and are not added.

The intra-node and inter-node phases of a hierarchical collective run one after the other, so
their loads are counted separately. Groups of the shape Megatron's order makes (the same local
GPUs on every node they touch) are rail-aligned; in ragged groups (GPUs 3..15, say) the j-th
members of two nodes sit on different rails, the flow crosses NVLink to a proxy GPU (PXN) and may
share that GPU's NIC, so there adding a member can realign the rails and raise the figure.

The group's ``tier`` is "network" when it spans nodes, and its ``bandwidth_bytes_per_s`` /
``latency_s`` are those of that tier; the intra-node figures come alongside.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple, Sequence

import networkx as nx
import numpy as np

from paraplan.constants import fitted
from paraplan.errors import ConfigError
from paraplan.hardware.model import Cluster, Link

SWITCH_HOP_LATENCY_S = fitted("switch_hop_latency")   # an estimate: one extra leaf-spine traversal
SPINES = ("spines",)            # stands for the whole spine layer in load accounting (ideal ECMP)
PATTERNS = ("hierarchical", "ring", "p2p")
AXES = ("tp", "cp", "dp", "pp")
AXIS_PATTERN = {"tp": "hierarchical", "cp": "ring", "dp": "hierarchical", "pp": "p2p"}


# ---------------------------------------------------------------------------------------------
# The fabric: numbers that define the graph, hashable (Cluster itself is not: its catalogue
# mappings are mapping proxies), used as the cache key and for fast structural routing.

@dataclass(frozen=True)
class Fabric:
    """Everything :func:`build_topology` needs, in one hashable value."""
    num_gpus: int
    gpus_per_node: int          # GPUs of this cluster per node (fewer than the system's for a partial node)
    system_gpus_per_node: int
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    intra: Link
    inter: Link
    rail_optimized: bool
    oversubscription: float
    leaf_ports: int
    spine_ports: int

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node

    def node(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def nic(self, gpu: int) -> int:
        """Index of the NIC a GPU drives (several GPUs share one where NICs are fewer)."""
        return (gpu % self.gpus_per_node) * self.nics_per_node // self.system_gpus_per_node

    @property
    def nics_used(self) -> int:
        return (self.gpus_per_node - 1) * self.nics_per_node // self.system_gpus_per_node + 1

    @property
    def nodes_per_leaf(self) -> int:
        if self.rail_optimized:
            return self.leaf_ports
        return max(1, self.leaf_ports // self.nics_per_node)

    def leaf(self, node: int, nic: int) -> tuple:
        if self.rail_optimized:
            return ("leaf", node // self.leaf_ports, nic)
        return ("leaf", node // self.nodes_per_leaf)

    @functools.cached_property
    def leaves(self) -> tuple:
        seen = dict.fromkeys(self.leaf(n, k) for n in range(self.num_nodes) for k in range(self.nics_used))
        return tuple(seen)

    @property
    def uplink_bytes_per_s(self) -> float:
        """A leaf's whole uplink capacity to the spine layer, one direction."""
        return self.leaf_ports * self.nic_bandwidth_bytes_per_s / self.oversubscription

    @functools.cached_property
    def num_spines(self) -> int:
        if len(self.leaves) <= 1:
            return 0
        return max(1, math.ceil(len(self.leaves) * self.leaf_ports / self.oversubscription / self.spine_ports))


def fabric_of(cluster: Cluster, *, rail_optimized: bool = True, oversubscription: float | None = None,
              leaf_ports: int = 32, spine_ports: int = 64) -> Fabric:
    """The hashable description of a cluster's fabric under the given options."""
    s = cluster.node_system     # NICs per NVLink domain (a domain's share on a cluster cut into domains)
    over = cluster.inter_node_oversubscription if oversubscription is None else float(oversubscription)
    if over < 1:
        raise ConfigError("oversubscription", f"must be >= 1 (1 = non-blocking), got {over}")
    if leaf_ports < 1 or spine_ports < 1:
        raise ConfigError("leaf_ports/spine_ports", f"must be positive, got {leaf_ports}/{spine_ports}")
    return Fabric(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                  system_gpus_per_node=s.gpus_per_node, nics_per_node=s.nics_per_node,
                  nic_bandwidth_bytes_per_s=s.nic_bandwidth_bytes_per_s,
                  pcie_bandwidth_bytes_per_s=s.pcie_bandwidth_bytes_per_s,
                  intra=s.intra_node, inter=s.inter_node, rail_optimized=bool(rail_optimized),
                  oversubscription=over, leaf_ports=int(leaf_ports), spine_ports=int(spine_ports))


# ---------------------------------------------------------------------------------------------
# Building the graph

def build_topology(cluster: Cluster, *, rail_optimized: bool = True, oversubscription: float | None = None,
                   leaf_ports: int = 32, spine_ports: int = 64) -> nx.Graph:
    """The cluster as an undirected networkx graph (frozen; cached per cluster and options).

    Parameters
    ----------
    cluster : Cluster
    rail_optimized : bool
        NIC k of every node of a scalable unit on rail leaf k (True), or all NICs of a few nodes
        on one leaf (False).
    oversubscription : float, optional
        Divides each leaf's spine uplink capacity (2 = 2:1); default
        ``cluster.inter_node_oversubscription``.
    leaf_ports, spine_ports : int
        Down-facing ports of a leaf (nodes per rail leaf, or NICs per leaf) and ports of a spine.

    Returns
    -------
    networkx.Graph
        Edge attributes ``bandwidth_bytes_per_s`` (one direction), ``latency_s``, ``tier``
        ("nvlink", "pcie", "network"); ``graph.graph["fabric"]`` holds the :class:`Fabric`.
    """
    return _build(fabric_of(cluster, rail_optimized=rail_optimized, oversubscription=oversubscription,
                            leaf_ports=leaf_ports, spine_ports=spine_ports))


@functools.lru_cache(maxsize=32)
def _build(f: Fabric) -> nx.Graph:
    g = nx.Graph(fabric=f)
    nvl = dict(bandwidth_bytes_per_s=f.intra.bandwidth_bytes_per_s, latency_s=f.intra.latency_s / 2,
               tier="nvlink")
    pcie = dict(bandwidth_bytes_per_s=f.pcie_bandwidth_bytes_per_s, latency_s=0.0, tier="pcie")
    nic = dict(bandwidth_bytes_per_s=f.nic_bandwidth_bytes_per_s, latency_s=f.inter.latency_s / 2,
               tier="network")
    for i in range(f.num_gpus):
        n, k = f.node(i), f.nic(i)
        g.add_node(("gpu", i), kind="gpu", node=n)
        g.add_edge(("gpu", i), ("nvswitch", n), **nvl)
        g.add_edge(("gpu", i), ("nic", n, k), **pcie)
    for n in range(f.num_nodes):
        g.nodes[("nvswitch", n)]["kind"] = "nvswitch"
        for k in range(f.nics_used):
            g.nodes[("nic", n, k)]["kind"] = "nic"
            g.add_edge(("nic", n, k), f.leaf(n, k), **nic)
    for leaf in f.leaves:
        g.nodes[leaf]["kind"] = "leaf"
    if f.num_spines:
        up = dict(bandwidth_bytes_per_s=f.uplink_bytes_per_s / f.num_spines, latency_s=SWITCH_HOP_LATENCY_S,
                  tier="network")
        for s in range(f.num_spines):
            g.add_node(("spine", s), kind="spine")
            for leaf in f.leaves:
                g.add_edge(leaf, ("spine", s), **up)
    return nx.freeze(g)


def _fabric(graph: nx.Graph) -> Fabric:
    try:
        return graph.graph["fabric"]
    except KeyError:
        raise ConfigError("graph", "not a graph from build_topology (no 'fabric' attribute)") from None


# ---------------------------------------------------------------------------------------------
# Routing: structural shortest paths (checked against networkx in the tests)

def _hops(f: Fabric, src: int, dst: int) -> list[tuple]:
    """Directed edges of the flow src→dst; a spine crossing is (leaf, SPINES), (SPINES, leaf)."""
    a, b = ("gpu", src), ("gpu", dst)
    na, nb = f.node(src), f.node(dst)
    if src == dst:
        return []
    if na == nb:
        sw = ("nvswitch", na)
        return [(a, sw), (sw, b)]
    ka, kb = f.nic(src), f.nic(dst)
    la, lb = f.leaf(na, ka), f.leaf(nb, kb)
    head: list[tuple] = []
    if la != lb and f.rail_optimized and f.leaf(na, kb) == lb:
        # PXN: cross NVLink to the source-node GPU on the destination's rail, leave by its NIC.
        proxy = ("gpu", na * f.gpus_per_node + _first_gpu_of_nic(f, kb))
        sw = ("nvswitch", na)
        head = [(a, sw), (sw, proxy)]
        a, ka, la = proxy, kb, lb
    nic_a, nic_b = ("nic", na, ka), ("nic", nb, kb)
    path = head + [(a, nic_a), (nic_a, la)]
    if la != lb:
        path += [(la, SPINES), (SPINES, lb)]
    return path + [(lb, nic_b), (nic_b, b)]


@functools.lru_cache(maxsize=256)
def _first_gpu_of_nic_cached(gpus_per_node: int, nics: int, system_gpus: int, k: int) -> int:
    return next(j for j in range(gpus_per_node) if j * nics // system_gpus == k)


def _first_gpu_of_nic(f: Fabric, k: int) -> int:
    return _first_gpu_of_nic_cached(f.gpus_per_node, f.nics_per_node, f.system_gpus_per_node, k)


def route(graph: nx.Graph, src: int, dst: int) -> list[tuple]:
    """One shortest path (graph nodes, source to destination) of the flow from GPU src to GPU dst.

    Spine traffic is spread over every spine in the load accounting; the path shown takes spine
    ``(src + dst) % spines``.
    """
    f = _fabric(graph)
    _check_members(f, {src, dst})
    hops = _hops(f, src, dst)
    if not hops:
        return [("gpu", src)]
    nodes = [hops[0][0]] + [v for _, v in hops]
    if SPINES in nodes:
        nodes[nodes.index(SPINES)] = ("spine", (src + dst) % f.num_spines)
    return nodes


def _capacity(graph: nx.Graph, f: Fabric, edge: tuple) -> float:
    u, v = edge
    if u == SPINES or v == SPINES:
        return f.uplink_bytes_per_s
    return graph.edges[u, v]["bandwidth_bytes_per_s"]


def _latency(graph: nx.Graph, edge: tuple) -> float:
    u, v = edge
    if u == SPINES or v == SPINES:
        return SWITCH_HOP_LATENCY_S
    return graph.edges[u, v]["latency_s"]


# ---------------------------------------------------------------------------------------------
# Flows of a group

def _ring_pairs(members: Sequence[int]) -> list[tuple[int, int]]:
    n = len(members)
    return [(members[i], members[(i + 1) % n]) for i in range(n)] if n > 1 else []


def _flows(f: Fabric, members: Sequence[int], pattern: str) -> tuple[list, list]:
    """(intra-node-phase pairs, spanning-tier pairs) of one group under a pattern."""
    members = sorted(members)
    if pattern == "p2p":   # forward sends; backward sends mirror them on the reverse directions
        return [], list(zip(members, members[1:]))
    if pattern == "ring":
        return [], _ring_pairs(members)
    by_node: dict[int, list[int]] = {}
    for m in members:
        by_node.setdefault(f.node(m), []).append(m)
    if len(by_node) == 1:
        return [], _ring_pairs(members)
    intra = [p for ms in by_node.values() for p in _ring_pairs(ms)]
    inter = []
    for j in range(max(len(ms) for ms in by_node.values())):
        inter += _ring_pairs([ms[j] for ms in by_node.values() if len(ms) > j])
    return intra, inter


def _check_members(f: Fabric, members: Iterable[int]) -> list[int]:
    ms = [int(m) for m in members]
    bad = [m for m in ms if not 0 <= m < f.num_gpus]
    if bad:
        raise ConfigError("members", f"GPU ranks {bad} outside 0..{f.num_gpus - 1}")
    if len(set(ms)) != len(ms):
        raise ConfigError("members", f"repeated GPU ranks in {sorted(ms)}")
    return ms


def fabric_loads(graph: nx.Graph, groups: Iterable[Sequence[int]], *, pattern: str = "hierarchical",
                 phase: str = "spanning") -> dict[tuple, float]:
    """Flows on every directed edge when all ``groups`` run a collective of ``pattern`` at once.

    ``phase``: "spanning" (the flows of the tier the groups span: all flows of a ring or p2p, the
    inter-node rings of a hierarchical collective) or "intra" (the intra-node rings of a
    hierarchical collective that spans nodes; they run before and after the inter-node phase, so
    the two phases never share an edge's load). Keys are directed edges ``(u, v)`` of the graph,
    except that a leaf's spine uplink (all its leaf—spine links, ideal ECMP) is ``(leaf, SPINES)``
    and its downlink ``(SPINES, leaf)``.
    """
    f = _fabric(graph)
    if pattern not in PATTERNS:
        raise ConfigError("pattern", f"unknown pattern {pattern!r}", accepted=", ".join(PATTERNS))
    if phase not in ("spanning", "intra"):
        raise ConfigError("phase", f"unknown phase {phase!r}", accepted="spanning, intra")
    loads: dict[tuple, float] = {}
    for grp in groups:
        intra, inter = _flows(f, _check_members(f, grp), pattern)
        for a, b in (inter if phase == "spanning" else intra):
            for e in _hops(f, a, b):
                loads[e] = loads.get(e, 0.0) + 1.0
    return loads


# ---------------------------------------------------------------------------------------------
# What a group gets

@dataclass(frozen=True)
class GroupLink:
    """The bandwidth a parallel group gets, per GPU and one direction, on the tier it spans.

    ``bandwidth_bytes_per_s`` / ``latency_s`` belong to ``tier`` ("nvlink" inside one node,
    "network" across nodes); ``latency_s`` is the largest path latency of one hop. For a
    hierarchical group spanning nodes, ``intra_*`` give its intra-node phase (None otherwise).
    ``bottleneck`` names the edge that sets the bandwidth.
    """
    bandwidth_bytes_per_s: float
    latency_s: float
    tier: str
    bottleneck: str
    size: int
    nodes: int
    members_per_node: int
    intra_bandwidth_bytes_per_s: float | None = None
    intra_latency_s: float | None = None

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1


def _describe(edge: tuple, flows: float, cap: float) -> str:
    u, v = edge
    name = f"{u} uplinks to spines" if v == SPINES else f"spine downlinks to {v}" if u == SPINES else f"{u}->{v}"
    return f"{name}: {flows:g} flow(s) sharing {cap / 1e9:g} GB/s"


def _tier_figures(graph: nx.Graph, f: Fabric, pairs: list, loads: Mapping[tuple, float]):
    """(bandwidth, worst hop latency, bottleneck text) over the flows in pairs."""
    best = (math.inf, "")
    worst_lat = 0.0
    for a, b in pairs:
        hops = _hops(f, a, b)
        worst_lat = max(worst_lat, sum(_latency(graph, e) for e in hops))
        for e in hops:
            cap = _capacity(graph, f, e)
            bw = cap / loads[e]
            if bw < best[0]:
                best = (bw, _describe(e, loads[e], cap))
    return best[0], worst_lat, best[1]


def group_bandwidth(graph: nx.Graph, members: Sequence[int], *, pattern: str = "hierarchical",
                    concurrent: Iterable[Sequence[int]] = ()) -> GroupLink:
    """Per-GPU bandwidth and per-hop latency a group of GPUs gets (see the module docstring).

    Parameters
    ----------
    graph : networkx.Graph
        From :func:`build_topology`.
    members : list of int
        Global GPU ranks of the group; the ring runs in rank order.
    pattern : {"hierarchical", "ring", "p2p"}
    concurrent : iterable of lists of int
        Other groups running at the same time (e.g. the other groups of the same axis); their
        flows share the edges.

    Returns
    -------
    GroupLink
        Bandwidth = min over the edges the group uses of capacity / flows on the edge.
    """
    f = _fabric(graph)
    ms = sorted(_check_members(f, members))
    groups = [ms, *concurrent]
    return _group_link(graph, f, ms, pattern, fabric_loads(graph, groups, pattern=pattern),
                       lambda: fabric_loads(graph, groups, pattern=pattern, phase="intra"))


def _group_link(graph: nx.Graph, f: Fabric, ms: list[int], pattern: str, loads: Mapping[tuple, float],
                intra_loads) -> GroupLink:
    """GroupLink of the sorted group ms given the loads of everything running at once.

    ``loads``: spanning-phase loads; ``intra_loads()``: the intra-node phase's (computed on demand).
    """
    nodes = sorted({f.node(m) for m in ms})
    per_node = max(sum(1 for m in ms if f.node(m) == n) for n in nodes)
    intra, inter = _flows(f, ms, pattern)
    if not inter:   # a single member: no traffic; report the GPU's own NVLink figure
        return GroupLink(f.intra.bandwidth_bytes_per_s, 0.0, "nvlink", "single member: no traffic",
                         1, 1, 1)
    bw, lat, neck = _tier_figures(graph, f, inter, loads)
    tier = "network" if len(nodes) > 1 else "nvlink"
    ibw = ilat = None
    if intra:
        ibw, ilat, _ = _tier_figures(graph, f, intra, intra_loads())
    return GroupLink(bandwidth_bytes_per_s=bw, latency_s=lat, tier=tier, bottleneck=neck, size=len(ms),
                     nodes=len(nodes), members_per_node=per_node,
                     intra_bandwidth_bytes_per_s=ibw, intra_latency_s=ilat)


# ---------------------------------------------------------------------------------------------
# Plans

def axis_groups(num_gpus: int, tp: int = 1, cp: int = 1, dp: int = 1, pp: int = 1) -> dict[str, np.ndarray]:
    """Every group of every axis under Megatron's rank order (tp fastest, then cp, dp, pp).

    Returns ``{axis: array of shape (num_groups, axis_size)}`` of global ranks.
    """
    sizes = dict(tp=tp, cp=cp, dp=dp, pp=pp)
    if any(int(v) != v or v < 1 for v in sizes.values()):
        raise ConfigError("plan", f"parallel sizes must be positive integers, got {sizes}")
    total = tp * cp * dp * pp
    if total != num_gpus:
        raise ConfigError("plan", f"tp({tp}) * cp({cp}) * dp({dp}) * pp({pp}) = {total} != gpus({num_gpus})")
    r = np.arange(num_gpus).reshape(pp, dp, cp, tp)   # rank = t + tp*(c + cp*(d + dp*p))
    return {"tp": r.reshape(-1, tp),
            "cp": r.transpose(0, 1, 3, 2).reshape(-1, cp),
            "dp": r.transpose(0, 2, 3, 1).reshape(-1, dp),
            "pp": r.transpose(1, 2, 3, 0).reshape(-1, pp)}


def place_groups(cluster: Cluster, tp: int = 1, cp: int = 1, dp: int = 1, pp: int = 1, *,
                 rail_optimized: bool = True, oversubscription: float | None = None,
                 leaf_ports: int = 32, spine_ports: int = 64) -> dict[str, GroupLink]:
    """The :class:`GroupLink` of each axis's representative group under Megatron's rank order.

    All groups of an axis run at once and share the fabric (other axes' traffic is not added).
    The representative is the slowest group of the axis (the step waits for it), ties going to
    the group with the lowest ranks. Patterns: tp and dp hierarchical, cp ring, pp p2p.
    """
    f = fabric_of(cluster, rail_optimized=rail_optimized, oversubscription=oversubscription,
                  leaf_ports=leaf_ports, spine_ports=spine_ports)
    return dict(_place(f, int(tp), int(cp), int(dp), int(pp)))


@functools.lru_cache(maxsize=1024)
def _place(f: Fabric, tp: int, cp: int, dp: int, pp: int) -> tuple:
    graph = _build(f)
    out = []
    for axis, groups in axis_groups(f.num_gpus, tp, cp, dp, pp).items():
        out.append((axis, _slowest(graph, f, [list(map(int, g)) for g in groups], AXIS_PATTERN[axis])))
    return tuple(out)


def _slowest(graph: nx.Graph, f: Fabric, groups: list[list[int]], pattern: str) -> GroupLink:
    """The GroupLink of the slowest of groups that all run at once (loads routed once)."""
    loads = fabric_loads(graph, groups, pattern=pattern)
    worst, worst_bw = groups[0], math.inf
    if len(groups[0]) > 1:
        for grp in groups:
            _, inter = _flows(f, grp, pattern)
            bw = min(_capacity(graph, f, e) / loads[e] for a, b in inter for e in _hops(f, a, b))
            if bw < worst_bw - 1e-6 * worst_bw:
                worst, worst_bw = grp, bw
    return _group_link(graph, f, sorted(worst), pattern, loads,
                       lambda: fabric_loads(graph, groups, pattern=pattern, phase="intra"))


class TierLinks(NamedTuple):
    """The intra-node and inter-node links one axis's collectives see (comm.collective_time's intra, inter)."""
    intra_node: Link
    inter_node: Link


def links_for_plan(cluster: Cluster, tp: int = 1, cp: int = 1, dp: int = 1, pp: int = 1, *,
                   rail_optimized: bool = True, oversubscription: float | None = None,
                   leaf_ports: int = 32, spine_ports: int = 64) -> dict[str, TierLinks]:
    """Per axis, :class:`~paraplan.hardware.model.Link` objects for the estimator.

    Bandwidth and latency come from :func:`place_groups`, efficiency from the system's tier.
    A tier an axis does not use keeps the system's figure (inter-node: ``cluster.inter_node``).
    """
    placed = place_groups(cluster, tp, cp, dp, pp, rail_optimized=rail_optimized,
                          oversubscription=oversubscription, leaf_ports=leaf_ports, spine_ports=spine_ports)
    s = cluster.system
    out = {}
    for axis, gl in placed.items():
        intra, inter = s.intra_node, cluster.inter_node
        if gl.tier == "network":
            inter = Link(f"{s.inter_node.name}@{axis}", gl.bandwidth_bytes_per_s, s.inter_node.efficiency,
                         gl.latency_s, protocols=s.inter_node.protocols)
            if gl.intra_bandwidth_bytes_per_s is not None:
                intra = Link(f"{s.intra_node.name}@{axis}", gl.intra_bandwidth_bytes_per_s,
                             s.intra_node.efficiency, gl.intra_latency_s)
        elif gl.size > 1:
            intra = Link(f"{s.intra_node.name}@{axis}", gl.bandwidth_bytes_per_s, s.intra_node.efficiency,
                         gl.latency_s)
        out[axis] = TierLinks(intra, inter)
    return out
