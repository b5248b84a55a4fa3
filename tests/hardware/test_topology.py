"""Topology-aware placement: the cluster graph and the bandwidth each parallel group gets."""
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.costmodels.comm import ALL_REDUCE, collective_time, ranks_per_node
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.hardware.model import GB, Link
from paraplan.hardware.topology import (SPINES, axis_groups, build_topology, fabric_loads, group_bandwidth,
                                        links_for_plan, place_groups, route)

NIC = 50 * GB        # DGX H100: one 400 Gb/s NDR NIC per GPU
NVLINK = 450 * GB    # NVLink4 per GPU, one direction


@pytest.fixture(scope="module")
def h100_64():
    return load_cluster("dgx-h100", 64)


@pytest.fixture(scope="module")
def g64(h100_64):
    return build_topology(h100_64)


def uplink_loads(loads):
    return {e: v for e, v in loads.items() if SPINES in e}


# --- the graph ---------------------------------------------------------------------------------

def test_graph_counts_rail_optimized(g64):
    kinds = {}
    for _, d in g64.nodes(data=True):
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    # 64 GPUs, 8 NVSwitch domains, 64 NICs, 8 rail leaves (one unit of <=32 nodes), ceil(8*32/64)=4 spines
    assert kinds == {"gpu": 64, "nvswitch": 8, "nic": 64, "leaf": 8, "spine": 4}
    tiers = {}
    for _, _, d in g64.edges(data=True):
        tiers[d["tier"]] = tiers.get(d["tier"], 0) + 1
    assert tiers == {"nvlink": 64, "pcie": 64, "network": 64 + 8 * 4}
    # rail k: NIC k of every node on leaf k
    assert all(g64.has_edge(("nic", n, k), ("leaf", 0, k)) for n in range(8) for k in range(8))
    assert nx.is_connected(g64)


def test_graph_counts_not_rail_optimized_and_oversubscribed(h100_64):
    g = build_topology(h100_64, rail_optimized=False, oversubscription=2)
    leaves = [n for n, d in g.nodes(data=True) if d["kind"] == "leaf"]
    spines = [n for n, d in g.nodes(data=True) if d["kind"] == "spine"]
    assert len(leaves) == 2                       # 32 ports / 8 NICs = 4 nodes per leaf
    assert len(spines) == math.ceil(2 * 32 / 2 / 64)
    assert all(g.has_edge(("nic", 0, k), ("leaf", 0)) for k in range(8))
    up = sum(g.edges[leaves[0], s]["bandwidth_bytes_per_s"] for s in spines)
    assert up == pytest.approx(32 * NIC / 2)      # 2:1 halves the uplink capacity


def test_edge_attributes(g64):
    e = g64.edges[("gpu", 3), ("nvswitch", 0)]
    assert (e["tier"], e["bandwidth_bytes_per_s"]) == ("nvlink", NVLINK)
    e = g64.edges[("gpu", 3), ("nic", 0, 3)]
    assert (e["tier"], e["bandwidth_bytes_per_s"]) == ("pcie", 50 * GB)
    e = g64.edges[("nic", 0, 3), ("leaf", 0, 3)]
    assert (e["tier"], e["bandwidth_bytes_per_s"]) == ("network", NIC)
    assert all(d["latency_s"] >= 0 for _, _, d in g64.edges(data=True))


def test_nics_shared_when_fewer_than_gpus():
    g = build_topology(load_cluster("dgx1-v100", 16))         # 4 x 100 Gb/s NICs for 8 GPUs
    assert g.has_edge(("gpu", 0), ("nic", 0, 0)) and g.has_edge(("gpu", 1), ("nic", 0, 0))
    assert g.has_edge(("gpu", 15), ("nic", 1, 3))
    assert sum(1 for n in g if n[0] == "nic") == 8


def test_cached_and_frozen(h100_64):
    a, b = build_topology(h100_64), build_topology(load_cluster("dgx-h100", 64))
    assert a is b
    assert build_topology(h100_64, oversubscription=2) is not a
    with pytest.raises(nx.NetworkXError):
        a.add_edge(("gpu", 0), ("gpu", 1))


@pytest.mark.parametrize("rail", [True, False])
def test_routes_are_shortest_paths(h100_64, rail):
    g = build_topology(h100_64, rail_optimized=rail, leaf_ports=16)
    for src, dst in [(0, 1), (0, 8), (0, 9), (3, 60), (63, 0), (5, 5)]:
        path = route(g, src, dst)
        assert path[0] == ("gpu", src) and path[-1] == ("gpu", dst)
        assert all(g.has_edge(u, v) for u, v in zip(path, path[1:]))
        assert len(path) - 1 == nx.shortest_path_length(g, ("gpu", src), ("gpu", dst))


# --- groups ------------------------------------------------------------------------------------

def test_tp8_inside_a_dgx_h100_gets_nvlink(g64):
    gl = group_bandwidth(g64, list(range(8)))
    assert gl.tier == "nvlink" and gl.nodes == 1
    assert gl.bandwidth_bytes_per_s == pytest.approx(NVLINK)
    assert gl.latency_s == pytest.approx(3.4e-6)


def test_tp16_spans_two_nodes_and_gets_the_network_figure(g64):
    gl = group_bandwidth(g64, list(range(16)), concurrent=[list(range(16 * i, 16 * i + 16)) for i in (1, 2, 3)])
    assert gl.tier == "network" and gl.nodes == 2 and gl.members_per_node == 8
    assert gl.bandwidth_bytes_per_s == pytest.approx(NIC)
    assert gl.latency_s == pytest.approx(14e-6)
    assert gl.intra_bandwidth_bytes_per_s == pytest.approx(NVLINK)      # the intra-node phase


def test_dp_one_gpu_per_node_rail_optimized_gets_full_nic(h100_64):
    placed = place_groups(h100_64, tp=8, dp=8)
    dp = placed["dp"]
    assert (dp.tier, dp.nodes, dp.members_per_node) == ("network", 8, 1)
    assert dp.bandwidth_bytes_per_s == pytest.approx(NIC)
    # still full with 2:1 spines: all 8 nodes sit under one rail leaf per rail
    assert place_groups(h100_64, tp=8, dp=8, oversubscription=2)["dp"].bandwidth_bytes_per_s == pytest.approx(NIC)


def test_oversubscribed_spines_halve_dp_groups_spanning_leaves(h100_64):
    # 4 nodes per rail leaf; tp=8, cp=4, dp=2: every dp group pairs node i with node i+4 across
    # leaves, so all of a leaf's NICs send through its uplinks at once.
    groups = axis_groups(64, tp=8, cp=4, dp=2)["dp"]
    assert sorted({(a // 8, b // 8) for a, b in groups}) == [(i, i + 4) for i in range(4)]
    full = place_groups(h100_64, tp=8, cp=4, dp=2, leaf_ports=4, oversubscription=1)["dp"]
    half = place_groups(h100_64, tp=8, cp=4, dp=2, leaf_ports=4, oversubscription=2)["dp"]
    assert full.bandwidth_bytes_per_s == pytest.approx(NIC)
    assert half.bandwidth_bytes_per_s == pytest.approx(NIC / 2, rel=0.05)
    assert "spine" in half.bottleneck
    assert half.latency_s > full.latency_s - 1e-12 and half.latency_s > 14e-6   # crosses a spine
    # a ring over all 8 nodes crosses each leaf boundary only twice per rail: NIC-bound even at 2:1
    ring8 = place_groups(h100_64, tp=8, dp=8, leaf_ports=4, oversubscription=2)["dp"]
    assert ring8.bandwidth_bytes_per_s == pytest.approx(NIC)


def test_not_rail_optimized_loads_leaf_uplinks_more():
    c = load_cluster("dgx-h100", 512)                        # 64 nodes
    dp_groups = axis_groups(512, tp=8, dp=64)["dp"]           # 8 concurrent dp rings, one per rail
    rail = uplink_loads(fabric_loads(build_topology(c, rail_optimized=True), dp_groups))
    flat = uplink_loads(fabric_loads(build_topology(c, rail_optimized=False), dp_groups))
    assert max(flat.values()) > max(rail.values())
    assert sum(flat.values()) > sum(rail.values())


def test_non_rail_cross_rail_pairs_do_not_need_spines(g64, h100_64):
    # rail-optimized: GPU 0 -> GPU 9 (different rails) goes over NVLink to GPU 1's NIC (PXN)
    path = route(g64, 0, 9)
    assert ("gpu", 1) in path and not any(n[0] == "spine" for n in path)
    g = build_topology(h100_64, rail_optimized=False)
    assert route(g, 0, 9) == [("gpu", 0), ("nic", 0, 0), ("leaf", 0), ("nic", 1, 1), ("gpu", 9)]


def test_shared_nics_divide_bandwidth():
    c = load_cluster("dgx1-v100", 32)                        # 2 GPUs per 100 Gb/s NIC
    dp = place_groups(c, tp=8, dp=4)["dp"]
    assert dp.bandwidth_bytes_per_s == pytest.approx(c.system.inter_node.bandwidth_bytes_per_s)
    eth = load_cluster("a100-eth40", 16)                     # one 40 Gb/s NIC for 8 GPUs
    dp = place_groups(eth, tp=1, dp=16)["dp"]
    assert dp.bandwidth_bytes_per_s == pytest.approx(eth.system.inter_node.bandwidth_bytes_per_s)


def test_place_groups_axes_and_megatron_order(h100_64):
    g = axis_groups(64, tp=2, cp=2, dp=4, pp=4)
    assert list(g["tp"][0]) == [0, 1] and list(g["cp"][0]) == [0, 2]
    assert list(g["dp"][0]) == [0, 4, 8, 12] and list(g["pp"][0]) == [0, 16, 32, 48]
    for arr in g.values():
        assert sorted(arr.ravel().tolist()) == list(range(64))
    placed = place_groups(h100_64, tp=2, cp=2, dp=4, pp=4)
    assert set(placed) == {"tp", "cp", "dp", "pp"}
    assert placed["tp"].tier == placed["cp"].tier == "nvlink"
    assert placed["dp"].tier == "network" and placed["dp"].members_per_node == 2
    assert placed["pp"].tier == "network"
    with pytest.raises(ConfigError, match="!= gpus"):
        place_groups(h100_64, tp=8, dp=4)


def test_links_for_plan_agree_with_comm_hierarchical_model(h100_64):
    links = links_for_plan(h100_64, tp=4, dp=16)
    s = h100_64.system
    for tl in links.values():
        assert isinstance(tl.intra_node, Link) and isinstance(tl.inter_node, Link)
        assert tl.intra_node.efficiency == s.intra_node.efficiency
        assert tl.inter_node.efficiency == s.inter_node.efficiency
    dp = links["dp"]
    assert dp.inter_node.bandwidth_bytes_per_s == pytest.approx(NIC)
    assert dp.intra_node.bandwidth_bytes_per_s == pytest.approx(NVLINK)
    # with a non-blocking fabric the topology gives back the catalogue's figures, so the
    # estimator's hierarchical all-reduce time is unchanged
    k = ranks_per_node(16, 4, 8)
    t_topo = collective_time(ALL_REDUCE, 1e9, 16, k, dp.intra_node, dp.inter_node)
    t_cat = collective_time(ALL_REDUCE, 1e9, 16, k, s.intra_node, h100_64.inter_node)
    assert float(t_topo) == pytest.approx(float(t_cat), rel=1e-9)


def test_deterministic(h100_64):
    a = place_groups(h100_64, tp=4, cp=2, dp=4, pp=2, oversubscription=2, leaf_ports=4)
    b = place_groups(load_cluster("dgx-h100", 64), tp=4, cp=2, dp=4, pp=2, oversubscription=2, leaf_ports=4)
    assert a == b
    g = build_topology(h100_64, leaf_ports=4)
    assert group_bandwidth(g, [0, 9, 40, 63]) == group_bandwidth(g, [63, 40, 9, 0])


def test_bad_members(g64):
    with pytest.raises(ConfigError):
        group_bandwidth(g64, [0, 64])
    with pytest.raises(ConfigError):
        group_bandwidth(g64, [1, 1])


@settings(max_examples=80, deadline=None)
@given(members=st.lists(st.integers(0, 63), min_size=1, max_size=12, unique=True),
       extra=st.integers(0, 63), rail=st.booleans(), over=st.sampled_from([1.0, 2.0, 4.0]),
       leaf_ports=st.sampled_from([1, 2, 4, 32]), pattern=st.sampled_from(["ring", "p2p"]))
def test_adding_members_never_increases_bandwidth_flat(h100_64, members, extra, rail, over, leaf_ports, pattern):
    g = build_topology(h100_64, rail_optimized=rail, oversubscription=over, leaf_ports=leaf_ports)
    before = group_bandwidth(g, members, pattern=pattern)
    after = group_bandwidth(g, sorted(set(members) | {extra}), pattern=pattern)
    assert after.bandwidth_bytes_per_s <= before.bandwidth_bytes_per_s * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(["dgx-h100", "dgx1-v100", "a100-eth40"]),
       local=st.sets(st.integers(0, 7), min_size=1), nodes=st.sets(st.integers(0, 7), min_size=1),
       more_local=st.integers(0, 7), more_node=st.integers(0, 7), grow_nodes=st.booleans(),
       rail=st.booleans(), over=st.sampled_from([1.0, 2.0, 4.0]), leaf_ports=st.sampled_from([1, 2, 4, 32]))
def test_adding_members_never_increases_bandwidth_hierarchical(name, local, nodes, more_local, more_node,
                                                               grow_nodes, rail, over, leaf_ports):
    # Hierarchical groups of the shape Megatron's rank order makes: the same local GPUs on each
    # node they touch. (Ragged groups, e.g. GPUs 3..15, pair the j-th members of the nodes
    # across rails, and there adding a member can realign rails and raise the figure.)
    g = build_topology(load_cluster(name, 64), rail_optimized=rail, oversubscription=over, leaf_ports=leaf_ports)
    group = lambda loc, nds: [n * 8 + j for n in sorted(nds) for j in sorted(loc)]
    before = group_bandwidth(g, group(local, nodes))
    bigger = group(local, nodes | {more_node}) if grow_nodes else group(local | {more_local}, nodes)
    after = group_bandwidth(g, bigger)
    assert after.bandwidth_bytes_per_s <= before.bandwidth_bytes_per_s * (1 + 1e-9)


def test_3072_gpus():
    """The fabric of 3072 GPUs is built and placed (how fast: benchmarks/planner_speed.py, not a timed test)."""
    c = load_cluster("dgx-h100", 3072)
    g = build_topology(c, oversubscription=2)
    placed = place_groups(c, tp=8, cp=1, dp=48, pp=8, oversubscription=2)
    assert g.number_of_nodes() == 3072 + 384 + 3072 + 96 + math.ceil(96 * 32 / 2 / 64)
    assert placed["tp"].bandwidth_bytes_per_s == pytest.approx(NVLINK)
