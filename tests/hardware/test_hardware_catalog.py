"""The hardware catalogue: every entry loads, every figure names its source, and the published
figures we rely on (datasheets, MLPerf system files, stas00/ml-engineering's tables, the HEAT paper's
platforms) are what the files say."""
from __future__ import annotations

import pytest

from paraplan.errors import ConfigError
from paraplan.hardware import catalog
from paraplan.hardware.catalog import load_cluster, load_part, preset_names, raw_entry
from paraplan.hardware.model import GB, GIB

ALL_ENTRIES = [(kind, name) for kind in catalog.KINDS for name in preset_names(kind)]
# Descriptive text fields; everything else that is a number or a structure must be sourced.
TEXT_FIELDS = {"name", "vendor", "model", "description", "sources"}

REQUIRED = {
    "systems": {"dgx1-v100", "dgx2-v100", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200"},
    "accelerators": {"v100-16g", "v100-32g", "a100-40g", "a100-80g", "h100-sxm", "h200", "b200", "mi300x"},
    "cpus": {"epyc-7742", "xeon-8380", "graviton3", "a64fx"},
}


def _id(entry):
    return "/".join(entry)


# --- every entry ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,name", ALL_ENTRIES, ids=map(_id, ALL_ENTRIES))
def test_entry_loads_and_is_named_after_its_file(kind, name):
    part = load_part(kind, name)
    assert part.name == name
    assert raw_entry(kind, name)["name"] == name


def _needs_source(value) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float, dict, list))


@pytest.mark.parametrize("kind,name", ALL_ENTRIES, ids=map(_id, ALL_ENTRIES))
def test_every_figure_has_a_source(kind, name):
    raw = raw_entry(kind, name)
    sources = raw.get("sources") or {}
    assert isinstance(sources, dict), f"{kind}/{name}: sources must be a mapping"
    missing = [k for k, v in raw.items()
               if k not in TEXT_FIELDS and _needs_source(v)
               and not (isinstance(sources.get(k), str) and sources[k].strip())]
    assert not missing, f"{kind}/{name}: no source for {missing}"


@pytest.mark.parametrize("kind,name", ALL_ENTRIES, ids=map(_id, ALL_ENTRIES))
def test_sources_name_real_fields(kind, name):
    raw = raw_entry(kind, name)
    stray = set(raw.get("sources") or {}) - set(raw)
    assert not stray, f"{kind}/{name}: sources for fields that do not exist: {sorted(stray)}"


@pytest.mark.parametrize("kind", sorted(REQUIRED))
def test_required_presets_exist(kind):
    assert REQUIRED[kind] <= set(preset_names(kind))


def test_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError):
        load_part("accelerators", "h100")  # the preset is h100-sxm


# --- accelerators -----------------------------------------------------------------------------

ACCELERATORS = preset_names("accelerators")


@pytest.mark.parametrize("name", ACCELERATORS)
def test_accelerator_sanity(name):
    a = load_part("accelerators", name)
    assert 0 < a.gemm_plateau_efficiency <= 1
    assert a.peak("fp16") > a.peak("fp32")
    assert a.memory_bandwidth_bytes_per_s > 0.5e12
    assert a.streaming_multiprocessors >= 80


def test_h100_and_h200_published_figures():
    h100, h200 = load_part("accelerators", "h100-sxm"), load_part("accelerators", "h200")
    assert h100.peak("bf16") == pytest.approx(989e12)
    assert h100.peak("fp8") == pytest.approx(1979e12)
    assert h100.memory_bytes == pytest.approx(80 * GIB)
    assert h200.peak("bf16") == h100.peak("bf16")  # same compute die
    assert 135 * GIB <= h200.memory_bytes <= 145 * GIB  # the "141 GB" class
    assert h200.memory_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert h100.streaming_multiprocessors == h200.streaming_multiprocessors == 132


def test_v100_has_no_bf16_or_tf32():
    for name in ("v100-16g", "v100-32g"):
        v = load_part("accelerators", name)
        assert "bf16" not in v.peak_flops and "tf32" not in v.peak_flops
        assert v.peak("fp16") == pytest.approx(125e12)
        assert v.peak("fp32") == pytest.approx(15.7e12)
    assert load_part("accelerators", "v100-16g").memory_bytes == pytest.approx(16 * GIB)
    assert load_part("accelerators", "v100-32g").memory_bytes == pytest.approx(32 * GIB)


def test_mamf_plateaus():
    expected = {"a100-40g": 0.869, "a100-80g": 0.869, "h100-sxm": 0.803, "h200": 0.803,
                "b200": 0.776, "mi300x": 0.514}
    for name, eff in expected.items():
        assert load_part("accelerators", name).gemm_plateau_efficiency == pytest.approx(eff)


def test_hbm_bandwidth_ordering():
    bw = [load_part("accelerators", n).memory_bandwidth_bytes_per_s
          for n in ("v100-32g", "a100-40g", "a100-80g", "h100-sxm", "h200", "b200")]
    assert bw == sorted(bw) and len(set(bw)) == len(bw)


def test_scale_up_link_generations():
    expected = {"v100-16g": 150, "a100-80g": 300, "h100-sxm": 450, "h200": 450, "b200": 900, "mi300x": 448}
    for name, gbps in expected.items():
        assert load_part("accelerators", name).scale_up_bandwidth_bytes_per_s == pytest.approx(gbps * GB)


# --- systems ----------------------------------------------------------------------------------

SYSTEMS = preset_names("systems")
# GB300 NVL72 (36 x 480 GB LPDDR5X < 72 x 288 GB HBM3e) and Jean Zay's A100 nodes (bigscience: "CPU memory:
# 512GB per node", "GPU memory: 640GB per node") are documented exceptions
HOST_SMALLER_THAN_HBM = {"gb300-nvl72", "jean-zay-a100"}


@pytest.mark.parametrize("name", SYSTEMS)
def test_intra_node_faster_than_inter_node(name):
    s = load_part("systems", name)
    assert s.intra_node.bandwidth_bytes_per_s > s.inter_node.bandwidth_bytes_per_s
    assert s.intra_node.effective_bandwidth_bytes_per_s > s.inter_node.effective_bandwidth_bytes_per_s
    assert s.intra_node.latency_s < s.inter_node.latency_s


@pytest.mark.parametrize("name", SYSTEMS)
def test_inter_node_bandwidth_is_the_nics_shared_by_the_gpus(name):
    s = load_part("systems", name)
    per_node = s.nics_per_node * s.nic_bandwidth_bytes_per_s
    assert s.inter_node.bandwidth_bytes_per_s * s.gpus_per_node == pytest.approx(per_node)


@pytest.mark.parametrize("name", SYSTEMS)
def test_scale_up_link_matches_accelerator(name):
    s = load_part("systems", name)
    assert s.intra_node.bandwidth_bytes_per_s <= s.accelerator.scale_up_bandwidth_bytes_per_s
    # Host memory holds at least the GPUs' memory (offload needs room) and PCIe is sensible;
    # GB300 NVL72 is the documented exception (36 x 480 GB LPDDR5X < 72 x 288 GB HBM3e).
    if name not in HOST_SMALLER_THAN_HBM:
        assert s.host_memory_bytes >= s.gpus_per_node * s.accelerator.memory_bytes
    assert {3: 12, 4: 25, 5: 50}[s.pcie_gen] * GB == pytest.approx(s.pcie_bandwidth_bytes_per_s)


def test_published_system_figures():
    dgx1 = load_part("systems", "dgx1-v100")
    assert dgx1.gpus_per_node == 8 and dgx1.accelerator.name == "v100-16g"
    assert dgx1.inter_node.bandwidth_bytes_per_s == pytest.approx(6.25 * GB)
    assert dgx1.host_cpu.name == "xeon-e5-2698v4" and dgx1.host_memory_bytes == pytest.approx(512 * GIB)

    dgx2 = load_part("systems", "dgx2-v100")
    assert dgx2.gpus_per_node == 16 and dgx2.accelerator.name == "v100-32g"
    assert dgx2.inter_node.bandwidth_bytes_per_s == pytest.approx(6.25 * GB)
    assert dgx2.pcie_bandwidth_bytes_per_s == pytest.approx(12 * GB)
    assert dgx2.nvme_read_bytes_per_s == pytest.approx(28 * GB)  # ZeRO-Infinity slides, per node
    assert dgx2.host_cpu.cores == 24

    a40 = load_part("systems", "dgx-a100-40g")
    assert a40.accelerator.memory_bytes == pytest.approx(40 * GIB)
    assert a40.nvme_capacity_bytes == pytest.approx(15.36e12)

    h100 = load_part("systems", "dgx-h100")
    assert h100.inter_node.bandwidth_bytes_per_s == pytest.approx(50 * GB)
    assert h100.intra_node.effective_bandwidth_bytes_per_s == pytest.approx(370 * GB, rel=0.01)
    assert h100.host_cpu.name == "xeon-8480c" and h100.host_cpu.cores == 56
    assert h100.nvme_capacity_bytes == pytest.approx(30.72e12)

    h200 = load_part("systems", "dgx-h200")
    assert h200.accelerator.name == "h200" and h200.gpus_per_node == 8
    assert h200.inter_node == h100.inter_node

    b200 = load_part("systems", "dgx-b200")
    assert b200.intra_node.effective_bandwidth_bytes_per_s == pytest.approx(682.2 * GB, rel=0.01)

    eth = load_part("systems", "a100-eth40")
    assert eth.inter_node.bandwidth_bytes_per_s == pytest.approx(0.625 * GB)
    assert eth.nic_bandwidth_bytes_per_s == pytest.approx(40e9 / 8)


def test_nvswitch_systems_beat_the_cube_mesh():
    mesh = load_part("systems", "dgx1-v100").intra_node
    switch = load_part("systems", "dgx2-v100").intra_node
    assert mesh.bandwidth_bytes_per_s == switch.bandwidth_bytes_per_s
    assert mesh.efficiency < switch.efficiency


# --- variants added for issue 14 (H800, GH200, GB200/GB300 NVL72) -----------------------------

NEW_VARIANTS = {
    "accelerators": {"h800-sxm", "gh200", "gh200-144g", "gb200", "gb300"},
    "systems": {"hgx-h800", "gb200-nvl72", "gb300-nvl72"},
    "cpus": {"grace"},
}


@pytest.mark.parametrize("kind", sorted(NEW_VARIANTS))
def test_new_variants_exist(kind):
    assert NEW_VARIANTS[kind] <= set(preset_names(kind))


def test_new_accelerators_have_curve_entries():
    from paraplan.costmodels.curvefile import curve_table
    table = curve_table()
    hopper, blackwell = table["h100-sxm"], table["b200"]
    for name in ("h800-sxm", "gh200", "gh200-144g"):
        assert table[name] == hopper
    assert table["gb200"] == blackwell
    # Blackwell Ultra: Blackwell's curves plus its doubled softmax-exponential rate, nothing else changed
    gb300 = {k: v for k, v in table["gb300"].items() if k not in ("attention_exp_speedup", "sources")}
    assert gb300 == {k: v for k, v in blackwell.items() if k != "sources"}
    assert table["gb300"]["attention_exp_speedup"] == 2.0
    assert set(blackwell["sources"]) < set(table["gb300"]["sources"])


def test_h800_is_an_h100_with_cut_nvlink():
    h100, h800 = load_part("accelerators", "h100-sxm"), load_part("accelerators", "h800-sxm")
    assert h800.peak_flops == h100.peak_flops
    assert h800.memory_bytes == pytest.approx(80 * GIB)
    assert h800.scale_up_bandwidth_bytes_per_s == pytest.approx(200 * GB)  # 400 GB/s bidirectional
    node, dgx = load_part("systems", "hgx-h800"), load_part("systems", "dgx-h100")
    assert node.gpus_per_node == 8
    assert node.intra_node.bandwidth_bytes_per_s < dgx.intra_node.bandwidth_bytes_per_s
    assert node.intra_node.effective_bandwidth_bytes_per_s == pytest.approx(160 * GB)  # DeepEP / DeepSeek-V3
    assert node.inter_node.bandwidth_bytes_per_s == pytest.approx(50 * GB)  # one CX7 400 Gb/s per GPU


def test_gh200_figures():
    small, big, h100 = (load_part("accelerators", n) for n in ("gh200", "gh200-144g", "h100-sxm"))
    assert small.memory_bytes == pytest.approx(96 * GIB) and big.memory_bytes == pytest.approx(144 * GIB)
    assert small.memory_bandwidth_bytes_per_s == pytest.approx(4.0e12)
    assert big.memory_bandwidth_bytes_per_s == pytest.approx(4.9e12)
    assert small.peak("bf16") == pytest.approx(h100.peak("bf16"), rel=0.01)  # same die; datasheet rounds to 990
    assert small.memory_bandwidth_bytes_per_s > h100.memory_bandwidth_bytes_per_s
    assert small.gemm_plateau_efficiency == pytest.approx(0.838)
    grace = load_part("cpus", "grace")
    assert grace.cores == 72 and grace.cache(3).size_bytes == 114 * 2**20
    assert grace.memory_bandwidth_bytes_per_s == pytest.approx(512 * GB)


def test_nvl72_systems():
    gb200, gb300 = load_part("systems", "gb200-nvl72"), load_part("systems", "gb300-nvl72")
    for s in (gb200, gb300):
        assert s.gpus_per_node == 72  # one NVLink domain
        assert s.intra_node.bandwidth_bytes_per_s == pytest.approx(900 * GB)  # 1.8 TB/s bidirectional
        assert s.host_cpu.name == "grace" and s.host_cpu_sockets == 36
    assert gb200.accelerator.memory_bytes == pytest.approx(189471 * 2**20, rel=1e-3)  # MLPerf Training v5.1, MiB
    assert gb300.accelerator.memory_bytes == pytest.approx(284208 * 2**20, rel=1e-3)
    assert gb300.accelerator.memory_bytes > gb200.accelerator.memory_bytes
    assert gb200.accelerator.peak("bf16") == pytest.approx(2500e12)
    assert gb300.accelerator.peak("fp4") > gb200.accelerator.peak("fp4") == pytest.approx(10000e12)
    assert gb200.accelerator.peak("bf16") > load_part("accelerators", "b200").peak("bf16")  # GB200 clocks higher
    assert gb200.inter_node.bandwidth_bytes_per_s == pytest.approx(50 * GB)  # CX-7 400 Gb/s per GPU
    assert gb300.inter_node.bandwidth_bytes_per_s == pytest.approx(100 * GB)  # CX-8 800 Gb/s per GPU
    assert gb300.host_memory_bytes < gb300.gpus_per_node * gb300.accelerator.memory_bytes
    c = load_cluster("gb200-nvl72", 144)
    assert c.num_nodes == 2 and c.gpus_per_node == 72
    assert load_cluster("gb300-nvl72", 64).num_nodes == 1


# --- CPUs -------------------------------------------------------------------------------------

CPUS = preset_names("cpus")


@pytest.mark.parametrize("name", CPUS)
def test_cpu_cache_hierarchy_is_sane(name):
    c = load_part("cpus", name)
    levels = [x.level for x in c.caches]
    assert levels == list(range(1, len(levels) + 1))
    for inner, outer in zip(c.caches, c.caches[1:]):
        assert inner.size_bytes < outer.size_bytes
        assert inner.latency_cycles < outer.latency_cycles
        assert inner.shared_by_cores <= outer.shared_by_cores
    for x in c.caches:
        assert c.cores % x.shared_by_cores == 0
    assert c.memory_bandwidth_bytes_per_s > 0 and c.memory_channels > 0


def test_epyc_7742_peak_and_ccx():
    c = load_part("cpus", "epyc-7742")
    assert c.peak_fp32_flops == pytest.approx(64 * 2.25e9 * 8 * 2 * 2)
    assert c.cache(3).shared_by_cores == 4
    assert c.cache(3).size_bytes == 16 * 2**20


def test_a64fx_has_two_levels_and_256_byte_lines():
    c = load_part("cpus", "a64fx")
    assert len(c.caches) == 2
    with pytest.raises(KeyError):
        c.cache(3)
    assert all(x.line_bytes == 256 for x in c.caches)
    assert c.cache(2).shared_by_cores == 12 and c.cache(2).size_bytes == 8 * 2**20
    assert c.memory_bandwidth_bytes_per_s == pytest.approx(1024 * GB)
    assert c.peak_fp32_flops == pytest.approx(48 * 2.0e9 * 16 * 2 * 2)


def test_xeon_8380_and_graviton3():
    x = load_part("cpus", "xeon-8380")
    assert (x.cores, x.simd_bits) == (40, 512)
    assert x.cache(1).size_bytes == 48 * 1024 and x.cache(2).size_bytes == 1280 * 1024
    assert x.cache(3).size_bytes == 60 * 2**20 and x.cache(3).shared_by_cores == 40
    assert x.memory_bandwidth_bytes_per_s == pytest.approx(204.8 * GB)
    g = load_part("cpus", "graviton3")
    assert (g.cores, g.threads_per_core, g.simd_bits) == (64, 1, 256)
    assert g.memory_bandwidth_bytes_per_s == pytest.approx(307.2 * GB)


# --- clusters ---------------------------------------------------------------------------------

def test_cluster_whole_nodes():
    c = load_cluster("dgx2-v100", 32)
    assert c.num_nodes == 2 and c.gpus_per_node == 16
    assert load_cluster("dgx-h100").num_gpus == 8
    assert load_cluster("dgx-h100", 4).num_nodes == 1


def test_cluster_partial_nodes_rejected():
    with pytest.raises(ConfigError):
        load_cluster("dgx-h100", 12)


def test_unknown_cluster_name():
    with pytest.raises(ConfigError):
        load_cluster("dgx-h1000", 8)


def test_an_edited_copy_of_a_system_preset_is_a_cluster_file(tmp_path):
    """A user copies a catalogue system YAML and edits it: --cluster FILE reads it as the system (gpus from
    the argument, default one node); a bad value names its field."""
    from paraplan.errors import ConfigError
    from paraplan.hardware.catalog import CATALOG_DIR, load_cluster
    text = (CATALOG_DIR / "systems" / "gb200-nvl72.yaml").read_text()
    mine = tmp_path / "my-gb200.yaml"
    mine.write_text(text.replace("host_link_bandwidth_gb_per_s: 175", "host_link_bandwidth_gb_per_s: 350"))
    c = load_cluster(str(mine), 8)
    assert c.num_gpus == 8 and c.system.host_link_bytes_per_s == pytest.approx(350e9)
    assert c.name == "my-gb200"          # the file's, not the preset's it was copied from
    assert load_cluster(str(mine)).num_gpus == 72
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("host_link_bandwidth_gb_per_s: 175", "host_link_bandwidth_gb_per_s: -5"))
    with pytest.raises(ConfigError) as err:
        load_cluster(str(bad), 8)
    assert err.value.field.startswith("host_link_bandwidth_gb_per_s") and "positive" in str(err.value)
