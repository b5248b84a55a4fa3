"""Published collective measurements reproduced by paraplan's collective model (costmodels.comm, which
prices collectives across nodes as NCCL does: costmodels.nccl), and the pieces of NCCL's model.

Every all-reduce bus bandwidth below is a published figure (busbw = 2(n-1)/n x size / time, the
nccl-tests definition, NVIDIA/nccl-tests @ a0b82b2 : doc/PERFORMANCE.md); the model must land within
TOLERANCE of it. TOLERANCE is 30 %: the one-node B200 sweep's own neighbours at 8 and 16 MiB took 116
and 115 us, a factor 2 apart in busbw, so a smooth model cannot be held tighter at every size.

Before the NCCL model, a multi-node group ran a serialized hierarchy (intra reduce-scatter, inter
all-reduce of 1/k, intra all-gather) with one network hop latency per inter-node step: the 4-node
P6-B200 rows at 1 MiB and 16 MiB came out 2.7x and 2.1x too fast, the 16 GiB row 25 % too slow.
"""
import math

import numpy as np
import pytest

from paraplan.costmodels import nccl
from paraplan.costmodels.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_part, parse_link
from paraplan.io import FieldReader

TOLERANCE = 0.30
KIB, MIB, GIB = 2**10, 2**20, 2**30

SWEEP = "stas00/ml-engineering @ 744d01e : network/README.md, 'Inter-node speed depends on intra-node speed'"
SHARP = "stas00/ml-engineering @ 744d01e : network/README.md, SHARP section (ring forced)"


def _links(system: str, nic_share: float = 1.0):
    s = load_part("systems", system)
    return s.intra_node, s.inter_node.scaled(nic_share)


#: (what, system, share of the system's NICs per GPU, ranks, ranks per node, bytes, busbw GB/s, source)
PUBLISHED = [
    ("8 x A100 all-reduce", "dgx-a100-80g", 1, 8, 8, 8 * GIB, 230.0, "NVIDIA/nccl-tests issue 149 (sjeaugey)"),
    ("8 x A100 all-reduce", "dgx-a100-80g", 1, 8, 8, 8 * GIB, 232.54, "NVIDIA/nccl-tests issue 175"),
    ("2 x (8 x A100, 4 x HDR)", "dgx-a100-40g", 0.5, 16, 8, 8 * GIB, 86.0, "NVIDIA/nccl-tests issue 175"),
    ("3 x (8 x A100-40GB, 4 x HDR), average", "dgx-a100-40g", 0.5, 24, 8, 8 * GIB, 84.8,
     "NVIDIA/nccl-tests issue 119"),
    ("2 x (HGX A100, 4 x CX-6 200 Gb)", "dgx-a100-80g", 0.5, 16, 8, 8 * GIB, 91.0, "NVIDIA/nccl-tests issue 100"),
    ("8 x H100 ring", "dgx-h100", 1, 8, 8, 8 * GIB, 370.0, "NVIDIA/nccl-tests issue 212 (sjeaugey)"),
    ("8 x H200 ring forced", "dgx-h200", 1, 8, 8, 8 * GIB, 365.6, SHARP),
    ("8 x B200 ring forced", "dgx-b200", 1, 8, 8, 8 * GIB, 682.2, SHARP),
    ("1 x P6-B200 32 KiB", "p6-b200", 1, 8, 8, 32 * KIB, 1.20, SWEEP),
    ("1 x P6-B200 1 MiB", "p6-b200", 1, 8, 8, MIB, 36.06, SWEEP),
    ("1 x P6-B200 16 MiB", "p6-b200", 1, 8, 8, 16 * MIB, 254.96, SWEEP),
    ("1 x P6-B200 256 MiB", "p6-b200", 1, 8, 8, 256 * MIB, 646.11, SWEEP),
    ("1 x P6-B200 1 GiB", "p6-b200", 1, 8, 8, GIB, 723.34, SWEEP),
    ("1 x P6-B200 16 GiB (NVLS on)", "p6-b200", 1, 8, 8, 16 * GIB, 845.67, SWEEP),
    ("4 x P6-B200 1 MiB", "p6-b200", 1, 32, 8, MIB, 5.37, SWEEP),
    ("4 x P6-B200 16 MiB", "p6-b200", 1, 32, 8, 16 * MIB, 64.43, SWEEP),
    ("4 x P6-B200 256 MiB", "p6-b200", 1, 32, 8, 256 * MIB, 229.09, SWEEP),
    ("4 x P6-B200 1 GiB", "p6-b200", 1, 32, 8, GIB, 361.99, SWEEP),
    ("4 x P6-B200 16 GiB", "p6-b200", 1, 32, 8, 16 * GIB, 381.80, SWEEP),
]


def model_busbw(system, share, n, k, size):
    intra, inter = _links(system, share)
    t = float(collective_time(ALL_REDUCE, size, n, k, intra, inter))
    return 2 * (n - 1) / n * size / t / 1e9


@pytest.mark.parametrize("what,system,share,n,k,size,busbw,source", PUBLISHED, ids=[r[0] for r in PUBLISHED])
def test_published_all_reduce_bus_bandwidth(what, system, share, n, k, size, busbw, source):
    got = model_busbw(system, share, n, k, size)
    assert abs(got / busbw - 1) <= TOLERANCE, f"{what}: model {got:.2f} GB/s, published {busbw} ({source})"


@pytest.mark.xfail(strict=True, reason="4 x P6-B200 at 32 KiB took 6.3 ms (busbw 0.01 GB/s), 16x the same "
                   "sweep's latency floor of 0.36-0.39 ms at 256 KiB-2 MiB: no per-hop latency model reaches it")
def test_four_node_32kib_outlier_is_not_reproduced():
    got = model_busbw("p6-b200", 1, 32, 8, 32 * KIB)
    assert abs(got / 0.01 - 1) <= TOLERANCE


def test_leaving_the_node_costs_about_2x_at_large_sizes_not_18x():
    """The sweep's point: the links are 18x apart (900 vs 50 GB/s) but a 16 GiB all-reduce slows
    2.2x from 1 to 4 nodes; the model gives the same order (between 1.5x and 3x)."""
    ratio = model_busbw("p6-b200", 1, 8, 8, 16 * GIB) / model_busbw("p6-b200", 1, 32, 8, 16 * GIB)
    assert 1.5 < ratio < 3.0


def test_ring_steps_and_network_steps():
    assert nccl.ring_steps(ALL_REDUCE, 32) == 62
    assert nccl.ring_steps(REDUCE_SCATTER, 32) == 31
    assert nccl.ring_network_steps(ALL_REDUCE, 4) == 8
    assert nccl.ring_network_steps(ALL_GATHER, 4) == 3
    assert nccl.ring_network_steps(ALL_REDUCE, 1) == 0
    # one rank per node: every step crosses the network, none is left on NVLink
    assert nccl.ring_intra_steps(ALL_REDUCE, 4, 4) == 0


def test_ring_latency_is_nccls_for_simple_across_four_nodes():
    """tuning.cc: 8.4 + 54 x 3.4 + 8 x 14 = 304 us, x1.4 (plateau) for a multi-node Simple all-reduce."""
    lat = float(nccl.ring_latency(ALL_REDUCE, 32, 4, nccl.SIMPLE, 3.4e-6, 14e-6))
    assert lat == pytest.approx(304.0e-6 * 1.4, rel=1e-9)


def test_tree_latency_grows_with_log_of_nodes():
    a = float(nccl.tree_latency(8 * 4, 4, nccl.LL, 3.4e-6, 14e-6))
    b = float(nccl.tree_latency(8 * 64, 64, nccl.LL, 3.4e-6, 14e-6))
    net_hop = 14e-6 * 5.0 / 14.0
    assert b - a == pytest.approx(2 * (6 - 2) * net_hop)


def _choice(size, protocols, n=32, k=8):
    """(algorithm, protocol) NCCL's model picks for an all-reduce on DGX H100 links."""
    intra, inter = _links("dgx-h100")
    busbw = nccl.multinode_bus_bandwidth(intra.effective_bandwidth_bytes_per_s,
                                         inter.effective_bandwidth_bytes_per_s, k)
    times = {}
    for p in protocols:
        times[("ring", p)] = float(nccl.ring_time(ALL_REDUCE, size, n, n / k, busbw, p, 3.4e-6, 14e-6))
        times[("tree", p)] = float(nccl.tree_time(size, n, n / k, busbw, p, 3.4e-6, 14e-6))
    return min(times, key=times.get)


def test_protocol_choice_follows_message_size():
    """LL for small messages, LL128 in between, Simple for the largest (NCCL's own trade-off)."""
    assert _choice(32 * KIB, nccl.PROTOCOLS)[1] == nccl.LL
    assert _choice(16 * MIB, nccl.PROTOCOLS)[1] == nccl.LL128
    assert _choice(16 * GIB, nccl.PROTOCOLS)[1] == nccl.SIMPLE


def test_efa_allows_simple_only_and_is_slower_than_infiniband_for_small_messages():
    efa = load_part("systems", "p6-b200").inter_node
    ib = load_part("systems", "dgx-b200").inter_node
    assert efa.protocols == load_part("systems", "p5-h100").inter_node.protocols == (nccl.SIMPLE,)
    assert ib.protocols == nccl.PROTOCOLS
    intra = load_part("systems", "dgx-b200").intra_node
    t_efa = float(collective_time(REDUCE_SCATTER, 16 * MIB, 32, 8, intra, efa))
    t_ib = float(collective_time(REDUCE_SCATTER, 16 * MIB, 32, 8, intra, ib))
    assert t_efa > 1.2 * t_ib
    # at 16 GiB both run Simple at the same bandwidth
    big = [float(collective_time(REDUCE_SCATTER, 16 * GIB, 32, 8, intra, x)) for x in (efa, ib)]
    assert big[0] == pytest.approx(big[1], rel=0.02)


def test_inter_node_speed_depends_on_intra_node_speed():
    """When NVLink is the slower of min(intra, k x NIC), slowing it slows the multi-node collective."""
    intra, inter = _links("dgx-a100-80g")            # 0.77 x 300 = 231 GB/s vs 8 x 0.9 x 25 = 180 GB/s
    slow = intra.scaled(0.5)                         # 115.5 GB/s: now the bottleneck
    t = [float(collective_time(ALL_REDUCE, 8 * GIB, 32, 8, x, inter)) for x in (intra, slow)]
    assert t[1] / t[0] == pytest.approx(180 / 115.5, rel=0.03)


def test_multinode_is_never_cheaper_than_one_node():
    intra, inter = _links("dgx-h100")
    for size in (4 * KIB, 64 * KIB, MIB, 16 * MIB, GIB):
        for kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER):
            one = float(collective_time(kind, size, 8, 8, intra, inter))
            four = float(collective_time(kind, size, 32, 8, intra, inter))
            assert four > one, (kind, size)


def test_tree_correction_is_one_from_512_mib():
    assert float(nccl.tree_correction(64, nccl.SIMPLE)) == 0.9
    assert float(nccl.tree_correction(16 * MIB, nccl.LL128)) == 0.9
    assert float(nccl.tree_correction(GIB, nccl.SIMPLE)) == 1.0


def test_vectorized_over_sizes_and_groups():
    intra, inter = _links("dgx-h100")
    t = collective_time(ALL_GATHER, np.array([MIB, GIB]), np.array([16, 64]), 8, intra, inter)
    assert t.shape == (2,) and np.all(np.isfinite(t)) and t[1] > t[0]
    assert math.isfinite(float(collective_time(ALL_REDUCE, MIB, 64, 1, intra, inter)))


def test_catalogue_link_protocols_bad_input():
    with pytest.raises(ConfigError) as e:
        parse_link(FieldReader({"name": "x", "bandwidth_gb_per_s": 50, "efficiency": 0.9, "latency_us": 14,
                                "protocols": ["LL64"]}, "test.yaml"))
    assert "protocols" in str(e.value) and "LL128" in str(e.value)
    link = parse_link(FieldReader({"name": "x", "bandwidth_gb_per_s": 50, "efficiency": 0.9, "latency_us": 14},
                                  "test.yaml"))
    assert link.protocols == nccl.PROTOCOLS
