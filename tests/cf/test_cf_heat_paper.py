"""The analytical side reproduces the tile sizes HEAT (Wang et al., ICS'23) chose on its CPUs.

Sources: the HEAT paper (ICS'23, arXiv:2304.07334 v1; ICS23-HEAT.pdf in hipdac-lab/HEAT @ 61fc46b) §5.1 (platforms: 2× EPYC 7742 with "32 MB L2
cache and 256 MB L3 cache" per socket; A64FX with 48 cores and 32 MB L2), §5.2 (benchmark setting
d = 128, 64 negatives), §4.2 / Algorithm 1 (tile rule: "num_threads·N1 embeddings can be held in
the L2 cache"; sampling space (M/N2)·N1), Table 6 (chosen tile N1 and interval N2 per dataset),
the LightGCN splits' sizes (reczoo/RecZoo matching/cf/SimpleX/data/*/README.md; HEAT §5.1).
"""
import pytest

from paraplan.cf.cost import Tiling, sampling_space
from paraplan.hardware.catalog import load_part
from paraplan.cf.plan import (MIN_TILE_PER_NEGATIVE, default_min_sampling_space, heat_tile_rows,
                                      plan_tiles)
from paraplan.cf.model import CFModel

EPYC = load_part("cpus", "epyc-7742")
A64FX = load_part("cpus", "a64fx")
# training interactions of the LightGCN splits (users, items, training interactions)
DATASETS = {"AmazonBooks": (52643, 91599, 2380730), "Yelp18": (31668, 38048, 1237259),
            "Gowalla": (29858, 40981, 810128)}
# HEAT Table 6 (tile N1, interval N2): MF-CCL and ACCL rows
TABLE6 = {("MF-CCL", "AmazonBooks"): (1024, 4096), ("MF-CCL", "Yelp18"): (1024, 2048),
          ("MF-CCL", "Gowalla"): (512, 2048), ("ACCL", "AmazonBooks"): (1024, 2048),
          ("ACCL", "Yelp18"): (1024, 4096), ("ACCL", "Gowalla"): (1024, 4096)}


def test_epyc_7742_64_threads_d128_gives_1024():
    """HEAT §5.1 + Algorithm 1: 32 MB aggregate L2 / (64 threads · 512 B rows) = 1024, the N1 of
    Table 6 for MF-CCL on AmazonBooks and Yelp18 and for ACCL on all three datasets."""
    assert heat_tile_rows(EPYC, 64, 128) == 1024
    assert sum(1 for v in TABLE6.values() if v[0] == 1024) == 5


def test_a64fx_48_threads_d128_gives_1024():
    """A64FX (HEAT §5.1: 48 cores, 32 MB L2 = 4 CMGs × 8 MB): 32 MB / (48 · 512 B) = 1365 rows, so
    the power-of-two tile is 1024, the same as on the EPYC. The paper reports no A64FX tile table
    (its Fig. 14 gives only the speedup), so this is the rule's prediction, not a paper number."""
    assert heat_tile_rows(A64FX, 48, 128) == 1024


def test_rule_scales_with_threads_and_dim():
    """Fig. 10's sweep (AmazonBooks, d = 128) reaches the ">2× when N1 < 128" regime only with the
    tile inside L2; halving d doubles N1, halving the threads on the same cores does too."""
    assert heat_tile_rows(EPYC, 64, 64) == 2048
    assert heat_tile_rows(EPYC, 32, 128) == 1024   # 32 threads use 32 cores' L2: 16 MB / 32 / 512 B
    assert heat_tile_rows(EPYC, 128, 128) == 512   # SMT: 128 threads share the 64 cores' L2


@pytest.mark.xfail(strict=True, reason="Table 6 picks N1 = 512 for MF-CCL on Gowalla; the capacity rule "
                                        "alone gives 1024 (the paper's N2/accuracy step is not reproduced)")
def test_gowalla_mf_ccl_512_is_not_the_capacity_rule():
    assert heat_tile_rows(EPYC, 64, 128) == TABLE6[("MF-CCL", "Gowalla")][0]


@pytest.mark.parametrize("key", sorted(TABLE6))
def test_heat_choices_pass_our_quality_constraints(key):
    """Every Table 6 choice (recall@20 within 0.001 of uniform sampling, §5.5) satisfies the
    planner's sampling-space minimum and the N1 ≥ 8·n bound at HEAT's 64 negatives (§5.2)."""
    users, items, inter = DATASETS[key[1]]
    n1, n2 = TABLE6[key]
    m = CFModel(users=users, items=items, interactions=inter, dim=128, negatives=64, batch=4096, threads=64)
    assert sampling_space(m, Tiling(n1, n2)) >= default_min_sampling_space(m)
    assert n1 >= MIN_TILE_PER_NEGATIVE * m.negatives


def test_planner_on_paper_cpu_keeps_l2_tiles_for_amazonbooks():
    """The analytical planner for the EPYC 7742 (64 threads, AmazonBooks, d = 128, n = 64) bound to
    L2 as HEAT's rule is: every ranked tile fits the 512 KiB L2 per thread with the 8d-byte
    footprint, and the rule's 1024 is among them or below the quality bound."""
    users, items, inter = DATASETS["AmazonBooks"]
    m = CFModel(users=users, items=items, interactions=inter, dim=128, negatives=64, batch=4096, threads=64)
    pl = plan_tiles(m, EPYC, cache_level="L2")
    assert all(c.footprint_bytes <= 512 * 1024 for c in pl.choices)
    assert 512 in {c.tile_rows for c in pl.choices}   # 512 · 8d = 512 KiB: the largest that fits
