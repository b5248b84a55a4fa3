"""What-if sweeps: the value parser, scenario files, and what each point means."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.errors import ConfigError
from paraplan.reports.sweep import (Scenario, base_point, load_scenario, parse_sweep, resolve_points,
                                    sweep_values)

GIB = 2**30


@pytest.mark.parametrize("text, base, expected", [
    ("gpus=64,128,256", 8, [64, 128, 256]),
    ("gpus=64..1024", 8, [64, 128, 256, 512, 1024]),
    ("seq_len=2k..128k", 2048, [2048, 4096, 8192, 16384, 32768, 65536, 131072]),
    ("seq_len=2k,8K", 2048, [2048, 8192]),
    ("seq_len=3k..16k", 2048, [3072, 4096, 8192, 16384]),   # ends kept, powers of two between
    ("gpus=x0.5,x1,x2", 64, [32, 64, 128]),
    ("gpus=16,x1,64..128", 32, [16, 32, 64, 128]),          # mixed items
    ("gpus=64,64,x1", 64, [64]),                            # duplicates dropped
    ("hbm=x0.5,x1,x2", 80.0, [40.0, 80.0, 160.0]),
    ("hbm=80,141", 80.0, [80.0, 141.0]),
    ("inter_node_bandwidth=x0.25,x4", 50.0, [12.5, 200.0]),
    ("offload=none,CPU,auto", "auto", ["none", "cpu", "auto"]),
    ("cluster=dgx-h100,dgx-h200", "dgx-h100", ["dgx-h100", "dgx-h200"]),
])
def test_sweep_values(text, base, expected):
    assert sweep_values(parse_sweep(text), base) == expected


@pytest.mark.parametrize("text, field, words", [
    ("gpus=abc", "--sweep gpus", "not a number"),
    ("gpus=0,8", "--sweep gpus", "positive"),
    ("gpus=-8", "--sweep gpus", "positive"),
    ("gpus=128..64", "--sweep gpus", "backwards"),
    ("gpus=", "--sweep gpus", "no values"),
    ("gpus=8.5", "--sweep gpus", "whole number"),
    ("seq_len=2q", "--sweep seq_len", "not a number"),
    ("offload=gpu", "--sweep offload", "unknown value"),
    ("cluster=x2", "--sweep cluster", "named"),
    ("warp=1,2", "--sweep", "unknown variable"),
    ("gpus", "--sweep", "VAR=VALUES"),
    ("hbm=xbig", "--sweep hbm", "not a number"),
    ("hbm=1e-320", "--sweep hbm", "at least 1e-06 GiB"),       # a denormal overflowed the planner
    ("inter_node_bandwidth=1e-9..50", "--sweep inter_node_bandwidth", "at least"),
])
def test_bad_sweep_values_name_the_field(text, field, words):
    with pytest.raises(ConfigError) as err:
        parse_sweep(text)
    assert err.value.field == field
    assert words in str(err.value)


def test_multiplier_that_leaves_too_little_hbm_names_the_field():
    with pytest.raises(ConfigError) as err:
        sweep_values(parse_sweep("hbm=x1e-300"), 80.0)
    assert err.value.field == "--sweep hbm" and "at least" in str(err.value)


def test_multiplier_that_is_not_whole_names_the_field():
    with pytest.raises(ConfigError) as err:
        sweep_values(parse_sweep("seq_len=x0.3"), 2048)
    assert err.value.field == "--sweep seq_len" and "whole number" in err.value.problem


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 20), st.integers(0, 20))
def test_power_of_two_range_is_every_power_between(a, b):
    lo, hi = sorted((a, b))
    values = sweep_values(parse_sweep(f"gpus={2**lo}..{2**hi}"), 1)
    assert values == [2**e for e in range(lo, hi + 1)]


def test_points_apply_hardware_changes():
    sc = Scenario(model="llama3-8b", cluster="dgx-h100", gpus=16, seq_len=4096, global_batch=64,
                  sweeps=(parse_sweep("hbm=x0.5,x2"), parse_sweep("inter_node_bandwidth=x2")))
    points = resolve_points(sc)
    assert [p.values["hbm"] for p in points] == [40.0, 160.0]
    base = resolve_points(Scenario(model="llama3-8b", cluster="dgx-h100", gpus=16,
                                   sweeps=(parse_sweep("gpus=16"),)))[0].cluster
    for p in points:
        assert p.cluster.accelerator.memory_bytes == p.values["hbm"] * GIB
        assert p.cluster.system.inter_node.bandwidth_bytes_per_s == pytest.approx(
            2 * base.system.inter_node.bandwidth_bytes_per_s)
        assert p.cluster.system.intra_node == base.system.intra_node
        assert p.job.seq_len == 4096 and p.job.global_batch == 64 and p.cluster.num_gpus == 16


def test_host_link_sweep_moves_what_offload_moves_over():
    """host_link_bandwidth (GB/s per GPU and direction): its base is the system's host link (NVLink-C2C on a
    GB200, PCIe on a DGX), a multiplier scales it, and an offloading plan's exposed transfers shrink as it
    grows while the PCIe figure (the NICs' slot) stays."""
    from paraplan.costmodels.estimate import estimate
    from paraplan.plan import Plan
    sc = Scenario(model="llama3-8b", cluster="gb200-nvl72", gpus=8, seq_len=4096, global_batch=64,
                  sweeps=(parse_sweep("host_link_bandwidth=x0.25,x1"),))
    points = resolve_points(sc)
    assert [p.values["host_link_bandwidth"] for p in points] == [pytest.approx(43.75), pytest.approx(175.0)]
    assert [p.cluster.system.host_link_bytes_per_s for p in points] == [pytest.approx(43.75e9), pytest.approx(175e9)]
    assert {p.cluster.system.pcie_bandwidth_bytes_per_s for p in points} == {50e9}
    plan = Plan(dp=8, zero=3, offload="cpu", offload_params=True, engine="deepspeed", grad_accumulation_fusion=False)
    slow, fast = (estimate(p.model, p.job, p.cluster, plan).time_breakdown_s["offload"] for p in points)
    assert slow > 2 * fast


def test_gpu_sweep_keeps_global_batch_or_scales_it_when_not_given():
    fixed = resolve_points(Scenario(model="llama3-8b", cluster="dgx-h100", global_batch=256,
                                    sweeps=(parse_sweep("gpus=8..32"),)))
    assert [(p.cluster.num_gpus, p.job.global_batch) for p in fixed] == [(8, 256), (16, 256), (32, 256)]
    weak = resolve_points(Scenario(model="llama3-8b", cluster="dgx-h100", sweeps=(parse_sweep("gpus=8..32"),)))
    assert [p.job.global_batch for p in weak] == [8, 16, 32]


def test_two_sweeps_make_a_grid_first_outer():
    sc = Scenario(model="llama3-8b", cluster="dgx-h100", gpus=8,
                  sweeps=(parse_sweep("seq_len=2k,4k"), parse_sweep("offload=none,cpu,auto")))
    points = resolve_points(sc)
    assert [(p.values["seq_len"], p.values["offload"]) for p in points] == [
        (2048, "none"), (2048, "cpu"), (2048, "auto"), (4096, "none"), (4096, "cpu"), (4096, "auto")]
    assert points[1].fixed["offload"] == "cpu" and "offload" not in points[2].fixed


def test_gpu_count_that_is_not_whole_nodes_fails_before_running():
    with pytest.raises(ConfigError) as err:
        resolve_points(Scenario(model="llama3-8b", cluster="dgx-h100", sweeps=(parse_sweep("gpus=8,12"),)))
    assert err.value.field == "gpus" and "gpus=12" in err.value.problem


def test_scenario_rules():
    with pytest.raises(ConfigError):
        Scenario(model="llama3-8b", cluster="dgx-h100", sweeps=())
    with pytest.raises(ConfigError):
        Scenario(model="llama3-8b", cluster="dgx-h100", sweeps=(parse_sweep("gpus=8"), parse_sweep("gpus=16")))
    with pytest.raises(ConfigError) as err:
        resolve_points(Scenario(model="llama3-8b", cluster="dgx-h100",
                                sweeps=(parse_sweep("cluster=dgx-h100,dgx-h200"), parse_sweep("hbm=x2"))))
    assert "ambiguous" in str(err.value)


def test_base_point_takes_first_swept_value_when_flag_missing():
    sc = Scenario(model="llama3-8b", cluster="dgx-h100", seq_len=4096,
                  sweeps=(parse_sweep("gpus=16..64"), parse_sweep("seq_len=2k,8k")))
    p = base_point(sc)
    assert p.cluster.num_gpus == 16 and p.job.seq_len == 4096


def test_scenario_file_round_trip(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama3-8b\ncluster: dgx-h100\nseq_len: 4096\nglobal_batch: 128\n"
                    "sweep:\n  gpus: 8..32\n  offload: [none, auto]\nfix: [zero=1]\n"
                    "price_per_gpu_hour: 2.5\ntrain_tokens: 1e12\n")
    sc = load_scenario(path)
    assert [s.var for s in sc.sweeps] == ["gpus", "offload"] and sc.fixed == {"zero": 1}
    assert sc.train_tokens == 1e12 and sc.price_per_gpu_hour == 2.5
    import yaml
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(sc.to_dict()))
    assert load_scenario(again) == sc
    path.write_text("model: llama3-8b\ncluster: dgx-h100\nsweep: {gpus: 8}\nspeed: 3\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert err.value.field == "speed" and str(path) in str(err.value)


def test_power_limit_sweep_slows_tensor_core_work_by_the_cube_root_law():
    """power_limit (W per GPU): its base is the part's rated power (700 W on an H100 SXM), a multiplier scales
    it, and a fixed plan's step slows as the limit falls while its memory does not move; the GEMMs alone
    slow by (700 / limit)^(1/3)."""
    plan = {"tp": 1, "pp": 1, "zero": 1, "micro_batch": 1, "recompute": "none"}
    sc = Scenario(model="llama3-8b", cluster="dgx-h100", gpus=8, seq_len=4096, global_batch=64, plan=plan,
                  sweeps=(parse_sweep("power_limit=x0.5,500,x1"),))
    points = resolve_points(sc)
    assert [p.values["power_limit"] for p in points] == [350.0, 500.0, 700.0]
    assert [p.cluster.accelerator.power_limit_w for p in points] == [350.0, 500.0, 700.0]
    from paraplan.reports.sweep import evaluate_point
    results = [evaluate_point(p, sc).estimate for p in points]
    steps = [e.step_time_s for e in results]
    assert steps[0] > steps[1] > steps[2]
    assert len({round(e.memory_bytes_per_gpu["total"]) for e in results}) == 1
    # the slow-down is below the clock's: memory-bound kernels and communication keep their speed
    assert 1.0 < steps[1] / steps[2] < (700 / 500) ** (1 / 3)


@pytest.mark.parametrize("cluster, values, words", [
    ("dgx-a100-80g", "power_limit=500", "above a100-80g's rated 400 W"),
    ("mi300x-x8", "power_limit=500", "mi300x states no rated power"),
    ("mi300x-x8", "power_limit=x0.5,x1", "mi300x states no rated power"),
])
def test_power_limit_sweep_refuses_what_it_cannot_price(cluster, values, words):
    with pytest.raises(ConfigError) as err:
        resolve_points(Scenario(model="llama3-8b", cluster=cluster, gpus=8, sweeps=(parse_sweep(values),)))
    assert err.value.field == "--sweep power_limit" and words in str(err.value)
