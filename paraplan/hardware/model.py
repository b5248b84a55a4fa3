"""Typed, frozen descriptions of hardware: accelerators, links, nodes (systems), clusters, CPUs, NVMe.

SI units inside (bytes, seconds, FLOP/s, bytes/s). The YAML catalogue uses GB/s, GiB, µs in its key
names; :mod:`paraplan.hardware.catalog` converts once on load.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from paraplan.errors import ConfigError

GB = 1e9
GIB = 2**30


def _frozen_map(m: Mapping | None) -> Mapping:
    return MappingProxyType(dict(m or {}))


#: what `paraplan calibrate` fits (docs/calibrate.md): factors on the time of the GEMMs' work, fused
#: attention's, the memory-bound kernels', the per-kernel cost and the optimizer step, and per collective
#: kind on its latency α and its bandwidth term β = 1/B
CALIBRATION_COMPUTE_KNOBS = ("gemm", "attention", "memory", "kernel", "optimizer")
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
CALIBRATION_KNOBS = CALIBRATION_COMPUTE_KNOBS + tuple(f"{op}.{part}" for op in COLLECTIVE_KINDS
                                                      for part in ("latency", "bandwidth"))


@dataclass(frozen=True, eq=False)
class MeasuredProfile:
    """What ``paraplan profile`` measured on one device, as plain tables
    (:func:`paraplan.profiles.store.measured_tables`), with the device and the number of ranks the
    cluster was loaded for. Hardware data only: the cost models read their curves from it
    (:func:`paraplan.costmodels.efficiency.curves_for`). Compared and hashed by identity."""
    name: str
    device: str
    world_size: int
    tables: Mapping = field(repr=False)


@dataclass(frozen=True)
class CacheLevel:
    """One level of a CPU's cache hierarchy.

    ``shared_by_cores`` is how many cores share one instance: 1 for a private L1/L2, 4 for the L3
    of a Zen 2 core complex (CCX), all cores of a socket for a monolithic L3.
    """
    level: int
    size_bytes: int
    shared_by_cores: int
    latency_cycles: float
    bandwidth_bytes_per_cycle_per_core: float
    line_bytes: int = 64


@dataclass(frozen=True)
class Cpu:
    """A CPU socket: cores, vector width, caches and its DRAM bandwidth."""
    name: str
    vendor: str
    model: str
    cores: int
    threads_per_core: int
    frequency_hz: float
    simd_bits: int
    fma_units_per_core: int
    caches: tuple[CacheLevel, ...]
    memory_bandwidth_bytes_per_s: float
    memory_latency_s: float
    memory_channels: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def peak_fp32_flops(self) -> float:
        """cores · f · (simd_bits/32 lanes) · 2 (FMA) · FMA units."""
        return self.cores * self.frequency_hz * (self.simd_bits / 32) * 2 * self.fma_units_per_core

    def cache(self, level: int) -> CacheLevel:
        for c in self.caches:
            if c.level == level:
                return c
        raise KeyError(f"{self.name} has no L{level} cache")


@dataclass(frozen=True)
class Nvme:
    """An NVMe drive: sustained sequential read/write bandwidth and capacity."""
    name: str
    model: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    capacity_bytes: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Accelerator:
    """A GPU or other accelerator.

    ``peak_flops`` maps dtype (fp32, tf32, fp16, bf16, fp8) to dense peak FLOP/s (no sparsity).
    ``gemm_plateau_efficiency`` is the best achieved/peak of a large GEMM (MAMF), the ceiling of the
    GEMM efficiency curve, ``gemm_plateau_efficiency_fp8`` the same for fp8 GEMMs (None: not
    measured; the bf16 figure stands in). ``microscaling`` says whether the tensor cores take OCP MX
    block-scaled formats (MXFP8: Blackwell). ``flash_attention`` says whether fused (FlashAttention) kernels run on the
    part; where they do not (Volta), the planner only considers unfused attention.
    """
    name: str
    vendor: str
    model: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops: Mapping[str, float]
    scale_up_bandwidth_bytes_per_s: float
    gemm_plateau_efficiency: float
    streaming_multiprocessors: int
    flash_attention: bool = True
    gemm_plateau_efficiency_fp8: float | None = None
    microscaling: bool = False
    #: the 4-bit training formats the tensor cores take (``nvfp4``, ``mxfp4``), where ``peak_flops``
    #: has an ``fp4`` figure; empty: no fp4 training (Hopper, Ampere, CDNA 3)
    fp4_formats: tuple = ()
    #: the board power the part's GEMM plateau was measured at (its rated TDP) and the power limit it
    #: runs at where that is lower (Meta's Grand Teton H100s: 500 W against 700 W); None: not capped
    rated_power_w: float | None = None
    power_limit_w: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: what a profile measured on this device (None for catalogue parts: analytical curves)
    measured: "MeasuredProfile | None" = field(default=None, compare=False, repr=False)
    #: factors `paraplan calibrate` fitted to runs on a cluster of this part (:data:`CALIBRATION_KNOBS`, the
    #: compute ones): each multiplies the analytical curves' time of its kind of work
    #: (:func:`paraplan.costmodels.efficiency.analytical_curves`); empty for the catalogue's parts
    calibration: Mapping[str, float] = field(default_factory=dict)
    #: ln(measured / predicted) step time of each run `paraplan calibrate` fitted ``calibration`` on, each
    #: predicted leave-one-run-out: the estimate's interval on this cluster comes from them
    #: (:func:`paraplan.costmodels.intervals.describe_interval`) where there are enough
    calibration_residuals: tuple[float, ...] = ()

    def plateau(self, dtype: str) -> float:
        """The GEMM plateau efficiency (MAMF / peak) for GEMMs in ``dtype``. fp4 GEMMs take the fp8
        plateau where the part has one (no fp4 MAMF measurement is published for any part: an
        estimate, said with the estimate), else the bf16 one."""
        if dtype in ("fp8", "fp4") and self.gemm_plateau_efficiency_fp8:
            return self.gemm_plateau_efficiency_fp8
        return self.gemm_plateau_efficiency

    def power_limited_clock_factor(self) -> float:
        """Sustained clock of dense tensor-core work under ``power_limit_w`` over its clock at
        ``rated_power_w``: (P_limit / P_rated)^(1/3), 1 where the part is not capped below its rating.

        A dense GEMM already runs at the board's power limit at its rated power (its plateau, MAMF, was
        measured there), and the firmware holds a lower limit by lowering the clock. Dynamic power is
        P = α·C·V²·f (the CMOS switching-power relation) and across the DVFS range the supply voltage
        is lowered with the frequency, V ∝ f, so P ∝ f³ and f_limit / f_rated = (P_limit / P_rated)^(1/3):
        0.894 at 500 W of 700 W. An estimate: it counts the whole board power as switching power
        (leakage, which does not scale with the clock, would lower the factor: 0.874 with 100 W of it),
        and it leaves memory-bound kernels and communication, which draw less than the limit, at full
        speed."""
        if self.power_limit_w is None or self.rated_power_w is None or self.power_limit_w >= self.rated_power_w:
            return 1.0
        return (self.power_limit_w / self.rated_power_w) ** (1.0 / 3.0)

    def peak(self, dtype: str) -> float:
        v = self.peak_flops.get(dtype)
        if v is None and dtype == "bf16":
            v = self.peak_flops.get("fp16")  # V100 has no bf16; callers reject it earlier
        if not v:
            raise KeyError(f"{self.name} has no {dtype} peak")
        return v


@dataclass(frozen=True)
class Link:
    """One tier of the interconnect as a collective sees it, per GPU, one direction.

    ``efficiency`` is achieved ring bus bandwidth / line rate for large messages;
    ``latency_s`` is the per-step latency α of the alpha-beta model.
    ``per_op`` optionally overrides (α seconds, effective bandwidth bytes/s) per collective
    (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``send_recv``): a link
    fitted from measured collectives (:mod:`paraplan.profiles.cluster`) carries one fit per op.
    """
    name: str
    bandwidth_bytes_per_s: float
    efficiency: float
    latency_s: float
    per_op: Mapping[str, tuple[float, float]] = field(default_factory=dict, compare=False)
    #: measured times by size at ``measured_world`` ranks, per collective: ((bytes, seconds), ...)
    #: ascending; inside the measured sizes a collective at that world size reads them (log-log
    #: interpolation) instead of the α-β fit, which cannot follow a profile's curvature
    measured: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict, compare=False)
    measured_world: int = 0
    #: the NCCL protocols collectives over this tier may use (``LL``, ``LL128``, ``Simple``): all three
    #: (NCCL's default) unless the transport forbids the low-latency ones, as AWS EFA does
    #: (:mod:`paraplan.costmodels.nccl`)
    protocols: tuple[str, ...] = ("LL", "LL128", "Simple")

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    #: per collective kind, factors (on α, on β = 1/B) `paraplan calibrate` fitted to runs on this tier
    #: (:func:`calibrated_system`); :meth:`alpha_beta` applies them
    calibration: Mapping[str, tuple[float, float]] = field(default_factory=dict, compare=False)

    def alpha_beta(self, op: str) -> tuple[float, float]:
        """(latency α in s, effective bandwidth in bytes/s) for collective ``op``, with the tier's
        calibration factors for ``op`` (α times the first, bandwidth over the second)."""
        fit = self.per_op.get(op)
        alpha, bw = fit if fit is not None else (self.latency_s, self.effective_bandwidth_bytes_per_s)
        fa, fb = self.calibration.get(op, (1.0, 1.0))
        return alpha * fa, bw / fb

    def scaled(self, factor: float) -> "Link":
        return replace(self, bandwidth_bytes_per_s=self.bandwidth_bytes_per_s * factor,
                       per_op={k: (a, b * factor) for k, (a, b) in self.per_op.items()},
                       measured={}, measured_world=0)   # a what-if link: the fit, not the old measurements


@dataclass(frozen=True)
class System:
    """A node type (a DGX, say): its accelerators and everything around them.

    ``gpus_per_node`` is the NVLink domain: every GPU of a node reaches every other at the intra-node
    rate. ``gpus_per_host`` is the host (the machine that runs one launcher, holds its own CPUs and
    NICs and is allocated whole): the node itself on a DGX (None fills it in), a 4-GPU compute tray
    of an NVL72 rack, whose 72-GPU NVLink domain spans 18 hosts. It must divide ``gpus_per_node``."""
    name: str
    description: str
    accelerator: Accelerator
    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float
    pcie_gen: int
    pcie_bandwidth_bytes_per_s: float
    host_cpu: Cpu
    host_cpu_sockets: int
    host_memory_bytes: float
    nvme: Nvme
    nvme_drives: int
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    gpus_per_host: int | None = None
    #: the GPU's own link to host memory, one direction, where it is not the PCIe slot the NICs hang off
    #: (NVLink-C2C on a Grace superchip); None: the PCIe figure (:attr:`host_link_bytes_per_s`)
    host_link_bandwidth_bytes_per_s: float | None = None

    @property
    def host_link_bytes_per_s(self) -> float:
        """Bytes per second one GPU moves to or from host memory (offload, activation offload)."""
        return self.host_link_bandwidth_bytes_per_s or self.pcie_bandwidth_bytes_per_s

    @property
    def host_link_name(self) -> str:
        """What :attr:`host_link_bytes_per_s` is: NVLink-C2C where the catalogue gives a host link apart from
        the PCIe slot (its only such presets are the Grace superchips), else the PCIe generation."""
        return "NVLink-C2C" if self.host_link_bandwidth_bytes_per_s else f"PCIe Gen{self.pcie_gen}"

    def __post_init__(self):
        if self.gpus_per_host is None:
            object.__setattr__(self, "gpus_per_host", self.gpus_per_node)
        h, g = self.gpus_per_host, self.gpus_per_node
        if isinstance(h, bool) or not isinstance(h, int) or h < 1 or g % h:
            raise ConfigError("gpus_per_host", f"{h!r} does not divide the {g} GPUs per node of {self.name}",
                              accepted=f"a positive divisor of gpus_per_node ({g})")

    @property
    def hosts_per_node(self) -> int:
        """Hosts that make up one node (one NVLink domain): 1 on a DGX, 18 trays on an NVL72 rack."""
        return self.gpus_per_node // self.gpus_per_host

    def accepts_gpus(self, num_gpus: int) -> bool:
        """Whether a cluster of ``num_gpus`` of this system can be formed: part of one node
        (1..gpus_per_node), or whole hosts beyond one node (a multiple of gpus_per_host, which is
        whole nodes where a host is the node)."""
        return 1 <= num_gpus <= self.gpus_per_node or num_gpus % self.gpus_per_host == 0

    def accepted_gpus(self) -> str:
        """The GPU counts :meth:`accepts_gpus` takes, as an error message lists them."""
        if self.gpus_per_host == self.gpus_per_node:
            return f"1..{self.gpus_per_node}, or a multiple of {self.gpus_per_node} GPUs per node"
        return (f"1..{self.gpus_per_node}, or a multiple of {self.gpus_per_host} GPUs "
                f"(whole {self.gpus_per_host}-GPU hosts)")

    @property
    def nvme_read_bytes_per_s(self) -> float:
        return self.nvme.read_bytes_per_s * self.nvme_drives

    @property
    def nvme_write_bytes_per_s(self) -> float:
        return self.nvme.write_bytes_per_s * self.nvme_drives

    @property
    def nvme_capacity_bytes(self) -> float:
        return self.nvme.capacity_bytes * self.nvme_drives


def nvlink_domain_gpus(num_gpus: int, gpus_per_node: int, gpus_per_host: int) -> int:
    """GPUs per NVLink domain of a cluster of ``num_gpus`` on nodes (NVLink domains) of
    ``gpus_per_node`` GPUs made of hosts of ``gpus_per_host``: the "node" every cost model sees.

    Rule: a cluster inside one node is one domain of all its GPUs; beyond one node, the largest
    multiple of ``gpus_per_host`` that divides ``num_gpus`` and is at most ``gpus_per_node``. For
    whole nodes that is ``gpus_per_node`` (a DGX cluster, 144 GPUs on NVL72 racks: 72). Otherwise
    (256 GPUs on NVL72 racks: 64, four domains of 16 trays) it is an assumption about how the
    scheduler packs hosts into racks: in equal segments of whole hosts, each inside one rack, the
    largest that divide the job -- as Slurm's topology/block plugin allocates with ``--segment``
    (https://slurm.schedmd.com/topology.html; NVIDIA's developer blog "Unlock Exascale Performance
    on NVIDIA GB200 NVL72 with Slurm Topology-Aware Job Scheduling" recommends 16-tray segments for
    jobs of 128 GPUs and more). The estimate states it
    (:func:`paraplan.costmodels.comm.nvlink_domain_assumption`).
    ``num_gpus`` beyond one node must be a multiple of ``gpus_per_host`` (:meth:`System.accepts_gpus`).
    """
    if num_gpus <= gpus_per_node:
        return num_gpus
    hosts, most = num_gpus // gpus_per_host, gpus_per_node // gpus_per_host
    return gpus_per_host * max(k for k in range(1, most + 1) if hosts % k == 0)


def launch_hosts(num_gpus: int, gpus_per_host: int) -> tuple[int, int]:
    """(hosts, processes per host) a launcher (torchrun --nnodes/--nproc-per-node, deepspeed
    --num_nodes/--num_gpus) starts ``num_gpus`` ranks on: the same number on every host, as both
    require, as many as a host holds. Processes per host: the largest divisor of ``num_gpus`` that is
    at most ``gpus_per_host`` (a DGX: ``num_gpus`` up to a node, else 8; 72 GB200: 4 on 18 trays;
    6 GB200: 3 on 2 trays, one GPU of each idle)."""
    per_host = max(d for d in range(1, min(num_gpus, gpus_per_host) + 1) if num_gpus % d == 0)
    return num_gpus // per_host, per_host


def system_of_hosts(system: System, hosts: int) -> System:
    """``system`` cut to ``hosts`` of its hosts: one NVLink domain of ``hosts · gpus_per_host`` GPUs
    with the hosts' share of the node's NICs, CPU sockets, host memory and NVMe drives (each host
    holds an equal share: an NVL72 tray 4 NICs, 2 Grace, 1/18 of the memory, 8 drives; MLPerf
    Training v5.1 system files, 18 nodes x 4 GPUs). Per-GPU links are unchanged."""
    if hosts == system.hosts_per_node:
        return system
    share = hosts / system.hosts_per_node
    return replace(system, gpus_per_node=hosts * system.gpus_per_host,
                   nics_per_node=max(1, round(system.nics_per_node * share)),
                   host_cpu_sockets=max(1, round(system.host_cpu_sockets * share)),
                   host_memory_bytes=system.host_memory_bytes * share,
                   nvme_drives=max(1, round(system.nvme_drives * share)))


#: the most GPUs a cluster may have: past a C int a count is a typo, and numpy's C longs overflow on
#: it in the plan checks (``gpus % (tp * pp * cp)``)
MAX_CLUSTER_GPUS = 2**31 - 1


@dataclass(frozen=True)
class Cluster:
    """A number of GPUs of one system type: part of one node, whole nodes, or, where a node (an
    NVLink domain) holds several hosts, whole hosts cut into equal NVLink domains
    (:func:`nvlink_domain_gpus`). ``gpus_per_node``/``num_nodes`` are the domains the cost models
    see; ``gpus_per_host``/``num_hosts`` what a launcher starts."""
    name: str
    system: System
    num_gpus: int
    inter_node_oversubscription: float = 1.0
    axis_links: Mapping[str, tuple] | None = field(default=None, compare=False)

    def __post_init__(self):
        s = self.system
        if self.num_gpus < 1:
            raise ConfigError("gpus", f"must be a positive integer, got {self.num_gpus}")
        if self.num_gpus > MAX_CLUSTER_GPUS:      # numpy's C longs overflow on it in the plan checks
            raise ConfigError("gpus", f"must be at most {MAX_CLUSTER_GPUS:,}, got {self.num_gpus:.3g}")
        if not s.accepts_gpus(self.num_gpus):
            whole = "whole nodes" if s.gpus_per_host == s.gpus_per_node else f"whole {s.gpus_per_host}-GPU hosts"
            raise ConfigError(
                "gpus", f"{self.num_gpus} GPUs span more than one {s.name} node but not {whole}",
                accepted=s.accepted_gpus())
        if self.inter_node_oversubscription < 1:
            raise ConfigError("inter_node_oversubscription", "must be >= 1 (1 = non-blocking)")

    @property
    def accelerator(self) -> Accelerator:
        return self.system.accelerator

    @property
    def gpus_per_node(self) -> int:
        """GPUs per NVLink domain (:func:`nvlink_domain_gpus`)."""
        return nvlink_domain_gpus(self.num_gpus, self.system.gpus_per_node, self.system.gpus_per_host)

    @property
    def num_nodes(self) -> int:
        """NVLink domains."""
        return self.num_gpus // self.gpus_per_node

    @property
    def partitioned(self) -> bool:
        """The cluster spans several nodes but is cut into NVLink domains smaller than the system's
        (its GPU count is not a multiple of the node's): the assumption of :func:`nvlink_domain_gpus`."""
        return self.num_gpus > self.system.gpus_per_node and self.gpus_per_node < self.system.gpus_per_node

    @property
    def node_system(self) -> System:
        """The system as one NVLink domain of this cluster holds it: the catalogue system, or, for a
        partitioned cluster, its domain's hosts (:func:`system_of_hosts`: NICs, CPU sockets, host
        memory and NVMe drives per domain). A cluster inside one node whose hosts are smaller than
        the node (8 GPUs of a GB200 NVL72 rack: 2 of its 18 trays) holds only the hosts its GPUs sit
        on; a cluster inside one host (part of a DGX) keeps that host's resources."""
        host = self.system.gpus_per_host
        if self.num_gpus < self.system.gpus_per_node and host < self.system.gpus_per_node:
            return system_of_hosts(self.system, -(-self.num_gpus // host))
        if not self.partitioned:
            return self.system
        return system_of_hosts(self.system, self.gpus_per_node // host)

    @property
    def gpus_per_host(self) -> int:
        """Processes a launcher starts per host (:func:`launch_hosts`)."""
        return launch_hosts(self.num_gpus, self.system.gpus_per_host)[1]

    @property
    def num_hosts(self) -> int:
        """Hosts a launcher starts on (:func:`launch_hosts`)."""
        return launch_hosts(self.num_gpus, self.system.gpus_per_host)[0]

    @property
    def inter_node(self) -> Link:
        if self.inter_node_oversubscription == 1:
            return self.system.inter_node
        return self.system.inter_node.scaled(1 / self.inter_node_oversubscription)

    def links(self, axis: str) -> tuple["Link", "Link"]:
        """(intra-node, inter-node) links a group of ``axis`` (tp, cp, dp, pp, ep) sees: from the
        topology placement when attached (``axis_links``), else the system's tiers."""
        if self.axis_links and axis in self.axis_links:
            return tuple(self.axis_links[axis])
        return self.system.intra_node, self.inter_node

    def with_system(self, **changes) -> "Cluster":
        return replace(self, system=replace(self.system, **changes))


def link_calibration(factors: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """The per-collective (α factor, β factor) of :attr:`Link.calibration` from calibrate's knobs
    (``{op}.latency``, ``{op}.bandwidth``; ``{op}`` alone both); kinds without a factor are left out."""
    out = {}
    for op in COLLECTIVE_KINDS:
        both = float(factors.get(op, 1.0))
        fa, fb = float(factors.get(f"{op}.latency", both)), float(factors.get(f"{op}.bandwidth", both))
        if (fa, fb) != (1.0, 1.0):
            out[op] = (fa, fb)
    return out


def calibrated_system(system: "System", factors: Mapping[str, float],
                      residuals: tuple[float, ...] | None = None) -> "System":
    """``system`` with calibrate's factors (:data:`CALIBRATION_KNOBS`) applied on top of any it carries
    (multiplied): the compute knobs on its accelerator (:attr:`Accelerator.calibration`, read by the analytical curves) and the collective knobs
    on both interconnect tiers (:attr:`Link.calibration`). ConfigError for a knob calibrate does not fit
    or a factor that is not a positive number. ``residuals``: the calibration runs' leave-one-run-out
    ln(measured / predicted) (:attr:`Accelerator.calibration_residuals`), where given."""
    unknown = sorted(set(factors) - set(CALIBRATION_KNOBS) - set(COLLECTIVE_KINDS))
    if unknown:
        raise ConfigError("calibration", f"unknown knob(s) {', '.join(map(repr, unknown))[:200]}",
                          accepted=", ".join(CALIBRATION_KNOBS))
    for k, v in factors.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < float("inf"):
            raise ConfigError(f"calibration.{k}", f"{v!r} is not a positive factor", accepted="a number > 0, e.g. 0.9")
    held = dict(system.accelerator.calibration)
    for k, v in factors.items():
        if k in CALIBRATION_COMPUTE_KNOBS:
            held[k] = held.get(k, 1.0) * float(v)
    acc = replace(system.accelerator, calibration=_frozen_map(held))
    if residuals is not None:
        acc = replace(acc, calibration_residuals=tuple(float(r) for r in residuals))
    links = link_calibration(factors)

    def tier(link: Link) -> Link:
        both = dict(link.calibration)
        for op, (fa, fb) in links.items():
            a0, b0 = both.get(op, (1.0, 1.0))
            both[op] = (a0 * fa, b0 * fb)
        return replace(link, calibration=_frozen_map(both))
    return replace(system, accelerator=acc, intra_node=tier(system.intra_node), inter_node=tier(system.inter_node))
