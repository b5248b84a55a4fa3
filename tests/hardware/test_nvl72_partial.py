"""GB200/GB300 NVL72 clusters whose GPU count is not a multiple of the 72-GPU rack.

A rack is one NVLink domain (``gpus_per_node: 72``) of 18 hosts (compute trays) of 4 GPUs
(``gpus_per_host: 4``). Beyond one rack, any count of whole trays is accepted and cut into equal
NVLink domains of whole trays (the largest that divides the count and fits a rack); the estimate
states that assumption, each domain gets its trays' share of the rack's host resources, and the
launch exports start one process per GPU on each tray."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from paraplan.cli import main
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.estimate import estimate, infeasibility
from paraplan.costmodels.offload import cpu_adam_time
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster, load_part, preset_names
from paraplan.hardware.model import GIB, launch_hosts, nvlink_domain_gpus
from paraplan.hardware.topology import fabric_of, place_groups
from paraplan.plan import Plan
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner import export as ex
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

NVL72 = ("gb200-nvl72", "gb300-nvl72")


def assumption_about_domains(e) -> list[str]:
    return [a for a in e.assumptions if "NVLink domains of" in a]


# --- the catalogue ---------------------------------------------------------------------------

def test_nvl72_hosts_are_4_gpu_trays_and_other_systems_are_their_own_host():
    for name in preset_names("systems"):
        s = load_part("systems", name)
        if name in NVL72:
            assert (s.gpus_per_host, s.hosts_per_node) == (4, 18)
        else:
            assert s.gpus_per_host == s.gpus_per_node and s.hosts_per_node == 1


SYSTEM_YAML = """\
system:
  name: nvl-test
  accelerator: gb200
  gpus_per_node: 72
  gpus_per_host: {host}
  intra_node: {{name: nvl, bandwidth_gb_per_s: 900, efficiency: 0.758, latency_us: 3.4}}
  inter_node: {{name: ib, bandwidth_gb_per_s: 50, efficiency: 0.9, latency_us: 14}}
  nics_per_node: 72
  nic_bandwidth_gbit_per_s: 400
  pcie_gen: 5
  pcie_bandwidth_gb_per_s: 50
  host_cpu: grace
  host_cpu_sockets: {sockets}
  host_memory_gib: 16093
  nvme: {{drive: u2-gen4-3.84t, drives: 144}}
gpus: 72
"""


@pytest.mark.parametrize("host,sockets,field,needle", [
    (5, 36, "system.gpus_per_host", "does not divide gpus_per_node (72)"),
    (0, 36, "system.gpus_per_host", ""),
    ("four", 36, "system.gpus_per_host", "expected a number"),
    (4, 35, "system.host_cpu_sockets", "not the same on each of the node's 18 hosts"),
])
def test_bad_gpus_per_host_in_a_system_file_names_the_field(tmp_path, host, sockets, field, needle):
    path = tmp_path / "cluster.yaml"
    path.write_text(SYSTEM_YAML.format(host=host, sockets=sockets))
    with pytest.raises(ConfigError) as err:
        load_cluster(str(path))
    assert err.value.field == field and needle in str(err.value)
    assert str(path) in str(err.value)


def test_a_system_file_with_trays_loads_and_splits_like_the_preset(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(SYSTEM_YAML.format(host=4, sockets=36))
    c = load_cluster(str(path), 256)
    assert (c.gpus_per_node, c.num_nodes, c.node_system.host_cpu_sockets) == (64, 4, 32)


def test_list_systems_shows_the_hosts_of_nvl72_only(capsys):
    assert main(["list", "systems"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for name in NVL72:
        assert "18 hosts of 4 GPUs" in lines[name] and "multiple of 4" in lines[name]
    assert "hosts of" not in lines["dgx-h100"]


# --- the domain rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("gpus,domain", [
    (256, 64), (128, 64), (512, 64), (144, 72), (216, 72), (288, 72), (100, 20), (76, 4), (80, 40),
    (72, 72), (64, 64), (36, 36), (6, 6), (1, 1)])
def test_nvl72_domain_is_the_largest_tray_multiple_dividing_the_count(gpus, domain):
    assert nvlink_domain_gpus(gpus, 72, 4) == domain
    c = load_cluster("gb200-nvl72", gpus)
    assert (c.gpus_per_node, c.num_nodes) == (domain, gpus // domain)
    assert c.partitioned == (gpus > 72 and gpus % 72 != 0)


@pytest.mark.parametrize("gpus", [8, 16, 64, 1024])
def test_dgx_clusters_keep_whole_nodes(gpus):
    c = load_cluster("dgx-h100", gpus)
    assert (c.gpus_per_node, c.num_nodes, c.partitioned) == (min(gpus, 8), max(1, gpus // 8), False)
    assert (c.num_hosts, c.gpus_per_host) == (c.num_nodes, c.gpus_per_node)
    assert c.node_system is c.system


def test_gb300_144_is_two_whole_racks():
    c = load_cluster("gb300-nvl72", 144)
    assert (c.gpus_per_node, c.num_nodes, c.partitioned) == (72, 2, False)
    assert c.node_system is c.system


def test_counts_that_split_a_tray_are_refused_with_the_accepted_counts():
    with pytest.raises(ConfigError) as err:
        load_cluster("gb200-nvl72", 250)
    assert err.value.field == "gpus"
    assert "250" in err.value.problem and "4-GPU hosts" in err.value.problem
    assert err.value.accepted == "1..72, or a multiple of 4 GPUs (whole 4-GPU hosts)"
    with pytest.raises(ConfigError) as err:     # DGX: the message it always had
        load_cluster("dgx-h100", 12)
    assert err.value.accepted == "1..8, or a multiple of 8 GPUs per node"
    assert "not whole nodes" in err.value.problem


def test_a_domain_holds_its_trays_share_of_the_rack():
    rack = load_part("systems", "gb200-nvl72")
    d = load_cluster("gb200-nvl72", 256).node_system       # 16 of the rack's 18 trays
    assert d.gpus_per_node == 64 and d.gpus_per_host == 4
    assert (d.nics_per_node, d.host_cpu_sockets, d.nvme_drives) == (64, 32, 128)
    assert d.host_memory_bytes == pytest.approx(rack.host_memory_bytes * 16 / 18)
    assert d.intra_node == rack.intra_node and d.inter_node == rack.inter_node   # per-GPU links unchanged
    # a cluster inside one rack holds the trays its GPUs sit on: 64 GPUs, the same 16 trays
    inside = load_cluster("gb200-nvl72", 64).node_system
    assert (inside.nics_per_node, inside.host_cpu_sockets, inside.nvme_drives) == (64, 32, 128)
    assert load_cluster("gb200-nvl72", 6).node_system.host_cpu_sockets == 4           # 2 trays (ceil 6 / 4)
    assert load_cluster("gb200-nvl72", 72).node_system is load_cluster("gb200-nvl72", 72).system
    dgx = load_cluster("dgx-h100", 4)                                                 # part of one host: the host
    assert dgx.node_system is dgx.system


def test_cpu_adam_per_gpu_is_the_same_on_a_64_gpu_domain_as_on_a_rack():
    """64 GPUs on 32 Grace run CPU-Adam as fast per GPU as 72 on 36; with the whole rack's 36
    sockets behind 64 GPUs it would come out 36/32 faster. The same for 8 GPUs (2 trays, 4 Grace),
    which the whole rack's 36 sockets made 4.5x faster."""
    c256, c72, c8 = (load_cluster("gb200-nvl72", n) for n in (256, 72, 8))
    shard = 1e9
    assert cpu_adam_time(shard, c256, curves_for(c256)) == pytest.approx(cpu_adam_time(shard, c72, curves_for(c72)))
    assert cpu_adam_time(shard, c8, curves_for(c8)) == pytest.approx(cpu_adam_time(shard, c72, curves_for(c72)))


def test_fabric_of_a_partitioned_cluster_has_a_nic_per_gpu_per_domain():
    f = fabric_of(load_cluster("gb200-nvl72", 256))
    assert (f.num_nodes, f.gpus_per_node, f.nics_per_node, f.nics_used) == (4, 64, 64, 64)
    assert [f.nic(g) for g in (0, 63, 64, 255)] == [0, 63, 0, 63]


# --- estimates ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama3-70b")


@pytest.mark.parametrize("gpus,domains", [(256, 4), (128, 2)])
def test_gb200_off_rack_counts_estimate_and_state_64_gpu_domains(llama70b, gpus, domains):
    c = load_cluster("gb200-nvl72", gpus)
    e = estimate(llama70b, TrainingJob(8192, gpus), c, Plan(tp=8, zero=1, recompute="full"))
    assert e.feasible and e.step_time_s > 0 and e.num_gpus == gpus
    (line,) = assumption_about_domains(e)
    assert line.startswith(f"{gpus} GPUs on gb200-nvl72 modelled as {domains} NVLink domains of 64 GPUs")
    assert "16 hosts of 4" in line and f"{gpus} is not a multiple of 72" in line
    assert e.details["nvlink_domains"] == {"count": domains, "gpus_each": 64, "assumption": line}


@pytest.mark.parametrize("system,gpus", [("gb200-nvl72", 72), ("gb300-nvl72", 144), ("gb200-nvl72", 64),
                                         ("dgx-h100", 64)])
def test_no_domain_assumption_for_whole_racks_or_one_rack(llama70b, system, gpus):
    e = estimate(llama70b, TrainingJob(8192, gpus), load_cluster(system, gpus), Plan(tp=8, zero=1, recompute="full"))
    assert assumption_about_domains(e) == [] and "nvlink_domains" not in e.details


def test_tp_stays_on_nvlink_and_dp_crosses_the_64_gpu_domains(llama70b):
    """tp 8 x dp 32 on 256 GB200: each tp group inside a domain (NVLink, as on one rack), each dp
    group over 4 domains, 8 members in each; its all-reduce is slower than on one rack (all NVLink)
    and than tp 8 x dp 36 on 288 = 4 racks of 72 (9 members per rack: each NIC carries 1/9 of the
    gradients instead of 1/8). Same micro-batches everywhere (8 per step)."""
    def run(gpus, dp):
        c = load_cluster("gb200-nvl72", gpus)
        return estimate(llama70b, TrainingJob(8192, 8 * dp), c, Plan(tp=8, dp=dp, zero=1, recompute="full"))
    one_rack, split, racks = run(64, 8), run(256, 32), run(288, 36)
    assert one_rack.time_breakdown_s["tp_comm"] == pytest.approx(split.time_breakdown_s["tp_comm"])
    assert split.time_breakdown_s["tp_comm"] == pytest.approx(racks.time_breakdown_s["tp_comm"])
    dp_total = {k: e.details["dp_comm_total_s"] for k, e in (("one", one_rack), ("split", split), ("racks", racks))}
    # across racks the bus bandwidth is min(NVLink, k x NIC) = min(682, 9 x 45 = 405 GB/s): 1.5-2x one rack
    assert dp_total["split"] > dp_total["racks"] > 1.5 * dp_total["one"]
    placed = place_groups(load_cluster("gb200-nvl72", 256), tp=8, dp=32)
    assert (placed["tp"].tier, placed["tp"].nodes) == ("nvlink", 1)
    assert (placed["dp"].tier, placed["dp"].nodes, placed["dp"].members_per_node) == ("network", 4, 8)


# --- exports -----------------------------------------------------------------------------------

def plan_doc(model, cluster, gpus, seq_len, global_batch, **plan):
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": model, "cluster": cluster, "gpus": gpus, "seq_len": seq_len,
                         "global_batch": global_batch},
            "plan": plan, "estimate": {}}


def torchrun_args(script: str) -> dict[str, str]:
    line = next(line for line in script.splitlines() if line.startswith("torchrun "))
    words = shlex.split(line.rstrip("\\"))[1:]
    return {w: v for w, v in zip(words, words[1:]) if w.startswith("--")}


@pytest.mark.parametrize("cluster,gpus,nnodes,nproc", [
    ("gb200-nvl72", 72, 18, 4), ("gb300-nvl72", 144, 36, 4), ("gb200-nvl72", 256, 64, 4),
    ("dgx-h100", 64, 8, 8), ("dgx-h100", 4, 1, 4)])
def test_torchrun_and_deepspeed_launch_one_process_per_gpu_of_each_host(cluster, gpus, nnodes, nproc):
    d = plan_doc("llama3-8b", cluster, gpus, 4096, gpus, tp=min(4, gpus), zero=1)
    args = torchrun_args(ex.to_megatron(d))
    assert (args["--nnodes"], args["--nproc-per-node"]) == (str(nnodes), str(nproc))
    assert f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} " in ex.to_torchtitan(d)
    launch = [n for n in ex.export_notes(d, "deepspeed") if n.startswith("launch:")]
    assert launch and f"--num_nodes {nnodes} --num_gpus {nproc} " in launch[0]
    assert not any("do not fill whole" in n for n in ex.export_notes(d, "megatron"))


def test_a_count_that_does_not_fill_trays_launches_evenly_and_says_so():
    assert launch_hosts(6, 4) == (2, 3) and launch_hosts(7, 4) == (7, 1) and launch_hosts(8, 8) == (1, 8)
    d = plan_doc("llama3-8b", "gb200-nvl72", 6, 4096, 6, zero=1)
    script = ex.to_megatron(d)
    assert (torchrun_args(script)["--nnodes"], torchrun_args(script)["--nproc-per-node"]) == ("2", "3")
    assert "# NOTE: 6 GPUs do not fill whole 4-GPU hosts: the launch starts 3 ranks on each of 2 hosts" in script


# --- the command line --------------------------------------------------------------------------

def test_cli_estimate_on_256_gb200_prints_the_assumption(capsys):
    args = ["estimate", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "256", "--seq-len", "8192",
            "--global-batch", "512", "--tp", "8", "--pp", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "NVLink domains  4 x 64 GPUs, assumed: 256 GPUs on gb200-nvl72 modelled as 4 NVLink domains" in out
    assert main(args + ["--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any(a.startswith("256 GPUs on gb200-nvl72 modelled as 4 NVLink domains of 64 GPUs")
               for a in doc["assumptions"])


def test_cli_plan_on_256_gb200_returns_candidates(capsys):
    assert main(["plan", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "256", "--seq-len", "8192",
                 "--global-batch", "512", "--top", "3", "--no-stage-ilp", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["plans"]) == 3
    for p in doc["plans"]:
        assert p["num_gpus"] == 256 and p["feasible"]
        assert any("4 NVLink domains of 64 GPUs" in a for a in p["assumptions"])


def test_cli_refuses_250_gb200_in_one_line():
    r = subprocess.run([sys.executable, "-m", "paraplan.cli", "estimate", "--model", "llama3-8b", "--cluster",
                        "gb200-nvl72", "--gpus", "250"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "paraplan: error: gpus: 250 GPUs span more than one gb200-nvl72 node but not whole 4-GPU hosts "
        "(accepted: 1..72, or a multiple of 4 GPUs (whole 4-GPU hosts))"]


def test_host_memory_is_checked_against_the_domains_trays():
    """15,000 GiB of offloaded states per NVLink domain fit a rack's 16,093 GiB but not the 14,305
    GiB of the 16 trays of a 64-GPU domain."""
    need = 15000 * GIB
    assert infeasibility(0.0, need, 0.0, load_cluster("gb200-nvl72", 288)) is None
    reason = infeasibility(0.0, need, 0.0, load_cluster("gb200-nvl72", 256))
    assert reason is not None and reason.startswith("host memory: needs 15000 GiB per node, 14305 GiB available")
