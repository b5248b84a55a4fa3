"""Load the hardware catalogue (YAML data files, one per part or system) and cluster descriptions.

Layout: ``catalog/{accelerators,systems,cpus,nvme}/<name>.yaml``. Each file carries a ``sources``
mapping from every figure's key to where it comes from; units sit in the key names
(``_gib``, ``_gb_per_s``, ``_us``, ``_ghz``, ``_kib``) and are converted to SI here, once.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable


from paraplan.errors import ConfigError, shown, unknown_name
from paraplan.hardware.names import Resolved, system_for_gpu
from paraplan.io import FieldReader, read_yaml
from paraplan.hardware.model import (GB, GIB, Accelerator, CacheLevel, Cluster, Cpu, Link, Nvme,
                                     System, _frozen_map, calibrated_system)

CATALOG_DIR = Path(__file__).parent / "catalog"
KINDS = ("accelerators", "systems", "cpus", "nvme")


def parse_link(f: FieldReader) -> Link:
    return Link(
        name=f.string("name"),
        bandwidth_bytes_per_s=f.number("bandwidth_gb_per_s") * GB,
        efficiency=f.number("efficiency", at_most=1.0),
        latency_s=f.number("latency_us") * 1e-6,
        protocols=_protocols(f),
    )


NCCL_PROTOCOLS = ("LL", "LL128", "Simple")


def _protocols(f: FieldReader) -> tuple[str, ...]:
    """A link's ``protocols`` (the NCCL protocols its transport allows), all three when not given."""
    if not f.has("protocols"):
        return NCCL_PROTOCOLS
    raw = f.raw("protocols")
    if not isinstance(raw, list) or not raw or any(p not in NCCL_PROTOCOLS for p in raw):
        raise ConfigError(f._name("protocols"), f"{raw!r} is not a list of NCCL protocols",
                          accepted=", ".join(NCCL_PROTOCOLS), source=f.source)
    return tuple(p for p in NCCL_PROTOCOLS if p in raw)


def parse_accelerator(f: FieldReader) -> Accelerator:
    if f.has("power_limit_w") and not f.has("rated_power_w"):
        raise ConfigError(f._name("power_limit_w"), "a power limit needs the part's rated_power_w (the board power "
                          "its gemm_plateau_efficiency was measured at) to price it against", source=f.source)
    peaks = f.mapping("peak_tflops")
    peak_flops = {k: peaks.number(k) * 1e12 for k, v in peaks.data.items() if v is not None}
    return Accelerator(
        name=f.string("name"), vendor=f.string("vendor"), model=f.string("model"),
        memory_bytes=f.number("memory_gib") * GIB,
        memory_bandwidth_bytes_per_s=f.number("memory_bandwidth_gb_per_s") * GB,
        peak_flops=_frozen_map(peak_flops),
        scale_up_bandwidth_bytes_per_s=f.number("scale_up_bandwidth_gb_per_s") * GB,
        gemm_plateau_efficiency=f.number("gemm_plateau_efficiency", at_most=1.0),
        streaming_multiprocessors=f.integer("streaming_multiprocessors"),
        flash_attention=_flag(f, "flash_attention", True),
        gemm_plateau_efficiency_fp8=(f.number("gemm_plateau_efficiency_fp8", at_most=1.0)
                                     if f.has("gemm_plateau_efficiency_fp8") else None),
        microscaling=_flag(f, "microscaling", False),
        fp4_formats=_fp4_formats(f, peak_flops),
        rated_power_w=f.number("rated_power_w") if f.has("rated_power_w") else None,
        power_limit_w=f.number("power_limit_w") if f.has("power_limit_w") else None,
        sources=f.sources(),
    )


FP4_FORMATS = ("nvfp4", "mxfp4")


def _fp4_formats(f: FieldReader, peak_flops: dict) -> tuple:
    """``fp4_formats``: a list of the 4-bit training formats the part's tensor cores take (nvfp4,
    mxfp4); it needs an ``fp4`` entry in ``peak_tflops`` to price them at."""
    v = f.raw("fp4_formats", [])
    if not isinstance(v, list) or any(x not in FP4_FORMATS for x in v):
        raise ConfigError(f._name("fp4_formats"), f"expected a list of {', '.join(FP4_FORMATS)}, got {v!r}",
                          accepted=f"a list of {', '.join(FP4_FORMATS)}", source=f.source)
    if v and not peak_flops.get("fp4"):
        raise ConfigError(f._name("fp4_formats"), "an fp4 format needs an fp4 figure in peak_tflops to price it at",
                          accepted="peak_tflops with fp4, or no fp4_formats", source=f.source)
    return tuple(v)


def _flag(f: FieldReader, key: str, default: bool) -> bool:
    v = f.raw(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f._name(key), f"expected true or false, got {v!r}", source=f.source)
    return v


def parse_cpu(f: FieldReader) -> Cpu:
    levels = f.raw("caches")
    if not isinstance(levels, list) or not levels:
        raise ConfigError(f._name("caches"), "expected a non-empty list of cache levels", source=f.source)
    caches = []
    for i, lv in enumerate(levels):
        if not isinstance(lv, dict):
            raise ConfigError(f"{f._name('caches')}[{i}]", "expected a mapping", source=f.source)
        c = FieldReader(lv, f.source, f"{f._name('caches')}[{i}].")
        caches.append(CacheLevel(
            level=c.integer("level"), size_bytes=int(c.number("size_kib") * 1024),
            shared_by_cores=c.integer("shared_by_cores"), latency_cycles=c.number("latency_cycles"),
            bandwidth_bytes_per_cycle_per_core=c.number("bandwidth_bytes_per_cycle_per_core"),
            line_bytes=c.integer("line_bytes", 64)))
    return Cpu(
        name=f.string("name"), vendor=f.string("vendor"), model=f.string("model"),
        cores=f.integer("cores"), threads_per_core=f.integer("threads_per_core"),
        frequency_hz=f.number("frequency_ghz") * 1e9, simd_bits=f.integer("simd_bits"),
        fma_units_per_core=f.integer("fma_units_per_core"), caches=tuple(sorted(caches, key=lambda c: c.level)),
        memory_bandwidth_bytes_per_s=f.number("memory_bandwidth_gb_per_s") * GB,
        memory_latency_s=f.number("memory_latency_ns") * 1e-9,
        memory_channels=f.integer("memory_channels"), sources=f.sources())


def parse_nvme(f: FieldReader) -> Nvme:
    return Nvme(name=f.string("name"), model=f.string("model"),
                read_bytes_per_s=f.number("read_gb_per_s") * GB,
                write_bytes_per_s=f.number("write_gb_per_s") * GB,
                capacity_bytes=f.number("capacity_tb") * 1e12, sources=f.sources())


def _part(kind: str, f: FieldReader, key: str):
    """A part given by preset name or inline mapping."""
    v = f.raw(key)
    if isinstance(v, str):
        return load_part(kind, v)
    return _PARSERS[kind](f.mapping(key))


def _gpus_per_host(f: FieldReader, gpus_per_node: int, per_node: dict[str, int]) -> int:
    """``gpus_per_host`` (default ``gpus_per_node``: the node is one host). It must divide
    ``gpus_per_node``, and where a node holds several hosts, each host must hold an equal share of
    the node's NICs, CPU sockets and NVMe drives (``per_node``: key -> count), which a cluster cut
    into NVLink domains of whole hosts divides (:func:`paraplan.hardware.model.system_of_hosts`)."""
    h = f.integer("gpus_per_host", gpus_per_node)
    if gpus_per_node % h:
        raise ConfigError(f._name("gpus_per_host"), f"{h} does not divide gpus_per_node ({gpus_per_node})",
                          accepted=f"a divisor of {gpus_per_node}", source=f.source)
    hosts = gpus_per_node // h
    for key, count in per_node.items():
        if count % hosts:
            raise ConfigError(f._name(key), f"{count} is not the same on each of the node's {hosts} hosts "
                              f"({gpus_per_node} GPUs / gpus_per_host {h})", accepted=f"a multiple of {hosts}",
                              source=f.source)
    return h


def parse_system(f: FieldReader) -> System:
    nvme = f.mapping("nvme")
    gpus_per_node = f.integer("gpus_per_node")
    per_node = {"nics_per_node": f.integer("nics_per_node"), "host_cpu_sockets": f.integer("host_cpu_sockets"),
                "nvme.drives": nvme.integer("drives")}
    return System(
        name=f.string("name"), description=f.string("description", ""),
        accelerator=_part("accelerators", f, "accelerator"),
        gpus_per_node=gpus_per_node, gpus_per_host=_gpus_per_host(f, gpus_per_node, per_node),
        intra_node=parse_link(f.mapping("intra_node")), inter_node=parse_link(f.mapping("inter_node")),
        nics_per_node=f.integer("nics_per_node"),
        nic_bandwidth_bytes_per_s=f.number("nic_bandwidth_gbit_per_s") * GB / 8,
        pcie_gen=f.integer("pcie_gen"), pcie_bandwidth_bytes_per_s=f.number("pcie_bandwidth_gb_per_s") * GB,
        host_cpu=_part("cpus", f, "host_cpu"), host_cpu_sockets=f.integer("host_cpu_sockets"),
        host_memory_bytes=f.number("host_memory_gib") * GIB,
        nvme=_part("nvme", nvme, "drive"), nvme_drives=nvme.integer("drives"),
        host_link_bandwidth_bytes_per_s=(f.number("host_link_bandwidth_gb_per_s") * GB
                                         if f.raw("host_link_bandwidth_gb_per_s", None) is not None else None),
        sources=f.sources())


_PARSERS: dict[str, Callable[[FieldReader], Any]] = {
    "accelerators": parse_accelerator, "systems": parse_system, "cpus": parse_cpu, "nvme": parse_nvme}


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (CATALOG_DIR / kind).glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def load_part(kind: str, name: str):
    """Load one catalogue entry by preset name (``load_part('accelerators', 'a100-80g')``)."""
    path = CATALOG_DIR / kind / f"{name}.yaml"
    if name not in preset_names(kind):
        raise unknown_name(kind.rstrip("s") if kind != "nvme" else "nvme", name, preset_names(kind))
    return _PARSERS[kind](FieldReader(read_yaml(path), str(path)))


def raw_entry(kind: str, name: str) -> dict:
    return read_yaml(CATALOG_DIR / kind / f"{name}.yaml")


def _is_file(path: Path) -> bool:
    """Path.is_file that says False for names the OS cannot look up (over 255 bytes, NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _system_named_by_gpu(spec: str) -> str:
    """The system preset a GPU name denotes ("H100", "A100-SXM4-80GB", "GB200 NVL72": hardware/names.py),
    or a ConfigError: the reason the part has no preset ("H100 PCIe"), or the unknown name with close
    matches. A name the reader completes with an assumption ("A100": which memory?) is not taken."""
    found = system_for_gpu(spec) if len(spec) <= 200 else None
    if isinstance(found, Resolved) and found.assumption is None and found.preset in preset_names("systems"):
        return found.preset
    if isinstance(found, Resolved):
        raise ConfigError("cluster", f"{spec!r} does not say which part (memory size); name the system, e.g. "
                          f"{found.preset}", accepted=", ".join(sorted(preset_names("systems"))))
    if isinstance(found, str) and "has no system preset" not in found:
        raise ConfigError("cluster", found, accepted=", ".join(sorted(preset_names("systems"))))
    raise unknown_name("cluster", spec, preset_names("systems"))


def rated_power(accelerator: Accelerator, field: str) -> float:
    """The part's ``rated_power_w``, which a power limit is priced against; refused, naming ``field`` and
    the catalogue parts that state one, where the part states none."""
    if accelerator.rated_power_w is None:
        rated_parts = [n for n in preset_names("accelerators") if load_part("accelerators", n).rated_power_w]
        raise ConfigError(field, f"{accelerator.name} states no rated power to price a limit against",
                          accepted=f"a cluster of a part with rated_power_w ({', '.join(rated_parts)}), or an "
                                   "accelerator file that sets it")
    return accelerator.rated_power_w


def power_limited(accelerator: Accelerator, watts: float, field: str) -> Accelerator:
    """The accelerator run at a board power limit of ``watts``, priced by its power-limited clock factor
    against :func:`rated_power`; a limit above the rating is refused (the firmware's maximum limit is the
    rated power). ``field`` names the input in errors."""
    rated = rated_power(accelerator, field)
    if not watts > 0:
        raise ConfigError(field, f"must be positive, got {watts:g}", accepted=f"watts per GPU, at most {rated:g}")
    if watts > rated:
        raise ConfigError(field, f"{watts:g} W is above {accelerator.name}'s rated {rated:g} W",
                          accepted=f"a limit of at most {rated:g} W")
    return replace(accelerator, power_limit_w=float(watts))


def _calibrated(system: System, f: FieldReader) -> System:
    """``system`` with the file's ``calibration`` factors (what `paraplan calibrate --write-cluster`
    writes: knob -> factor, :data:`~paraplan.hardware.model.CALIBRATION_KNOBS`) applied, where it has them."""
    if not f.has("calibration"):
        if f.has("calibration_residuals"):
            raise ConfigError("calibration_residuals", "given without calibration", source=f.source,
                              accepted="both, as `paraplan calibrate --write-cluster` writes them")
        return system
    knobs = f.mapping("calibration")
    factors = {str(k): knobs.number(str(k)) for k in knobs.data}
    residuals = None
    if f.has("calibration_residuals"):
        raw = f.raw("calibration_residuals")
        if not isinstance(raw, list) or not all(not isinstance(r, bool) and isinstance(r, (int, float))
                                                and math.isfinite(r) and abs(r) < 10 for r in raw):
            raise ConfigError("calibration_residuals", f"expected a list of finite numbers, got {shown(raw, 60)}",
                              source=f.source, accepted="ln(measured / predicted) per calibration run, e.g. [0.03, -0.05]")
        residuals = tuple(float(r) for r in raw)
    try:
        return calibrated_system(system, factors, residuals)
    except ConfigError as e:
        raise ConfigError(e.field, e.problem, accepted=e.accepted, source=f.source) from None


def load_cluster(spec: str, gpus: int | None = None, *, inter_node_oversubscription: float = 1.0) -> Cluster:
    """A cluster from a system preset name and a GPU count, or from a YAML file (a measured
    profile, ``local`` or ``profile:NAME``, is loaded by :func:`paraplan.scenario.load_cluster`).

    YAML keys: ``system`` (a preset name or an inline system mapping), ``gpus``, optional
    ``name``, ``inter_node_oversubscription`` and ``gpu_power_limit_w`` (the board power limit the GPUs
    run at, at most their rated power: :func:`power_limited`). ``gpus`` given here overrides the file's. A system
    file itself (a copy of a catalogue preset, edited: it has ``accelerator`` and ``gpus_per_node`` and
    no ``system``) is read as the system, with ``gpus`` from the argument (default: one node).
    """
    path = Path(spec)
    if spec.endswith((".yaml", ".yml", ".json")) or _is_file(path):
        data = read_yaml(path, "cluster")
        f = FieldReader(data, str(path))
        if isinstance(data, dict) and "system" not in data and {"accelerator", "gpus_per_node"} <= set(data):
            system = _calibrated(parse_system(f), f)
            n = system.gpus_per_node if gpus is None else gpus
            # named after the file: the copy's own ``name`` is still the preset's it was copied from
            return Cluster(name=path.stem, system=system, num_gpus=int(n),
                           inter_node_oversubscription=inter_node_oversubscription)
        system = _part("systems", f, "system")
        if f.has("gpu_power_limit_w"):
            watts = f.number("gpu_power_limit_w")
            system = replace(system, accelerator=power_limited(system.accelerator, watts, f._name("gpu_power_limit_w")))
        system = _calibrated(system, f)
        n = gpus if gpus is not None else f.integer("gpus")
        return Cluster(name=f.string("name", path.stem), system=system, num_gpus=int(n),
                       inter_node_oversubscription=f.number("inter_node_oversubscription", 1.0))
    if spec not in preset_names("systems"):
        spec = _system_named_by_gpu(spec)
    system = load_part("systems", spec)
    n = system.gpus_per_node if gpus is None else gpus
    return Cluster(name=spec, system=system, num_gpus=int(n),
                   inter_node_oversubscription=inter_node_oversubscription)
