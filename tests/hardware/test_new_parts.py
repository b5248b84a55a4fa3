"""Blackwell Ultra (B300, DGX B300) and AMD Instinct MI325X / MI350X / MI355X with their 8-GPU platforms
(issue 66): the catalogue's figures against the sources their files cite, the names papers use, the
curves they borrow (and say so), and what ``paraplan list`` shows."""
import pytest

from paraplan.cli import main
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.intervals import GENERATION
from paraplan.hardware.catalog import load_cluster, load_part, raw_entry
from paraplan.hardware.model import GB, GIB
from paraplan.hardware.names import system_for_gpu
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

NEW_ACCELERATORS = ("b300", "mi325x", "mi350x", "mi355x")
NEW_SYSTEMS = ("dgx-b300", "mi325x-x8", "mi350x-x8", "mi355x-x8")


def test_b300_figures_are_the_hgx_datasheet_and_mlperf_files():
    b300 = load_part("accelerators", "b300")
    # HGX B300 per GPU, dense: BF16 2250, FP8 4500, FP4 105 PF / 8 = 13125 TF/s (glennklockwood.com, NVIDIA HGX)
    assert b300.peak("bf16") == pytest.approx(2250e12) and b300.peak("fp8") == pytest.approx(4500e12)
    assert b300.peak("fp4") == pytest.approx(105e15 / 8)
    # MLPerf Training v5.1, Nebius B300: 275040 MiB of HBM3e per GPU; 1100 W TGP
    assert b300.memory_bytes == pytest.approx(275040 * 2**20, rel=1e-4)
    assert b300.rated_power_w == 1100 and b300.fp4_formats == ("nvfp4", "mxfp4")
    # below the 1400 W GB300's 2500 / 5000 / 15000
    gb300 = load_part("accelerators", "gb300")
    assert b300.peak("fp4") < gb300.peak("fp4") and b300.peak("bf16") < gb300.peak("bf16")


def test_mi355x_and_mi350x_peaks_follow_from_cus_rate_and_clock():
    """256 CUs x 8192 FP8 FLOPs per CU per clock (ISSCC 2026) x 2.4 GHz (MI355X) / 2.2 GHz (MI350X);
    bf16 half, MXFP4 twice; fp32 at CDNA 3's 256 per CU per clock."""
    for name, ghz in (("mi355x", 2.4), ("mi350x", 2.2)):
        a = load_part("accelerators", name)
        fp8 = 256 * 8192 * ghz * 1e9
        assert a.peak("fp8") == pytest.approx(fp8, rel=1e-4)
        assert a.peak("bf16") == pytest.approx(fp8 / 2, rel=1e-4)
        assert a.peak("fp4") == pytest.approx(2 * fp8, rel=1e-4)
        assert a.peak("fp32") == pytest.approx(256 * 256 * ghz * 1e9, rel=1e-3)
        assert a.memory_bytes == pytest.approx(288 * GIB) and a.memory_bandwidth_bytes_per_s == pytest.approx(8e12)
        assert a.streaming_multiprocessors == 256 and a.fp4_formats == ("mxfp4",)
    # Tom's Hardware's 'maximum FP4' figures are twice the dense ones (20.1 and 18.45 PF)
    assert 2 * load_part("accelerators", "mi355x").peak("fp4") == pytest.approx(20.1e15, rel=0.002)
    assert 2 * load_part("accelerators", "mi350x").peak("fp4") == pytest.approx(18.45e15, rel=0.001)


def test_mi325x_is_mi300x_compute_with_hbm3e_and_its_own_measured_mamf():
    mi325x, mi300x = load_part("accelerators", "mi325x"), load_part("accelerators", "mi300x")
    assert mi325x.peak("bf16") == pytest.approx(mi300x.peak("bf16"), rel=0.01)
    assert mi325x.streaming_multiprocessors == mi300x.streaming_multiprocessors == 304
    assert mi325x.memory_bytes == pytest.approx(256 * GIB) and mi325x.memory_bandwidth_bytes_per_s == pytest.approx(6e12)
    # stas00/ml-engineering MAMF: 784.9 TF/s BF16 on MI325X
    assert mi325x.gemm_plateau_efficiency * mi325x.peak("bf16") == pytest.approx(784.9e12, rel=0.002)
    assert not mi325x.fp4_formats


@pytest.mark.parametrize("name, gpus, nic_gbit, intra_gb", [
    ("dgx-b300", 8, 800, 900), ("mi355x-x8", 8, 400, 537.6), ("mi350x-x8", 8, 400, 537.6), ("mi325x-x8", 8, 400, 448)])
def test_platforms_node_shape_nics_and_scale_up(name, gpus, nic_gbit, intra_gb):
    s = load_part("systems", name)
    assert s.gpus_per_node == gpus and s.nics_per_node == gpus
    assert s.nic_bandwidth_bytes_per_s == pytest.approx(nic_gbit * GB / 8)
    assert s.intra_node.bandwidth_bytes_per_s == pytest.approx(intra_gb * GB)
    assert s.host_memory_bytes >= s.gpus_per_node * s.accelerator.memory_bytes


@pytest.mark.parametrize("kind, name", [("accelerators", n) for n in NEW_ACCELERATORS]
                         + [("systems", n) for n in NEW_SYSTEMS])
def test_every_new_figure_says_where_it_comes_from(kind, name):
    raw = raw_entry(kind, name)
    figures = set(raw) - {"name", "vendor", "model", "description", "accelerator", "sources"}
    assert figures <= set(raw["sources"]), figures - set(raw["sources"])
    assert all(len(raw["sources"][k]) > 20 for k in figures)


@pytest.mark.parametrize("name, preset", [("B300", "dgx-b300"), ("NVIDIA Blackwell Ultra GPU (B300-SXM-270GB)", "dgx-b300"),
                                          ("GB300", "gb300-nvl72"), ("AMD Instinct MI355X", "mi355x-x8"),
                                          ("MI325X", "mi325x-x8"), ("MI350X", "mi350x-x8")])
def test_published_gpu_names_reach_the_new_presets(name, preset):
    found = system_for_gpu(name)
    assert not isinstance(found, str) and found.preset == preset and found.assumption is None


def test_borrowed_curves_are_said_with_every_estimate():
    """No calibration rows for these parts: the curves of the nearest calibrated generation are reused,
    and the estimate says so (curves.yaml caveat); Blackwell Ultra's doubled exponentials carry to B300."""
    model, job = load_model("llama3-8b"), TrainingJob(4096, 64)
    plan = Plan(tp=1, dp=8, micro_batch=1, zero=1, engine="megatron")
    for system, words in (("dgx-b300", "B300 has no calibration rows"), ("mi355x-x8", "CDNA 4"),
                          ("mi325x-x8", "AMD Instinct")):
        e = estimate(model, job, load_cluster(system, 8), plan)
        assert any(words in a for a in e.assumptions), system
    assert analytical_curves(load_part("accelerators", "b300")).attention_exp_speedup == 2.0
    assert GENERATION["b300"] == "Blackwell" and GENERATION["mi355x"] == "MI355X"


def test_list_hardware_shows_the_new_parts_with_sources(capsys):
    assert main(["list", "hardware", "--sources"]) == 0
    out = capsys.readouterr().out
    for name in NEW_ACCELERATORS + NEW_SYSTEMS:
        assert f"  {name} " in out
    assert "13125.0" in out and "(nvfp4, mxfp4)" in out and "(mxfp4)" in out
    assert "nebius_b300_n1.json" in out and "MI355X_EPYC_9575F_pytorch.json" in out
    assert main(["list", "accelerators"]) == 0
    assert "nebius_b300_n1" not in capsys.readouterr().out      # sources only when asked
