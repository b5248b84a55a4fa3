"""Load the hardware catalogue (YAML data files, one per part or system) and cluster descriptions.

Layout: ``catalog/{accelerators,systems,cpus,nvme}/<name>.yaml``. Each file carries a ``sources``
mapping from every figure's key to where it comes from; units sit in the key names
(``_gib``, ``_gb_per_s``, ``_us``, ``_ghz``, ``_kib``) and are converted to SI here, once.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from paraplan.errors import ConfigError, unknown_name
from paraplan.hardware.model import (GB, GIB, Accelerator, CacheLevel, Cluster, Cpu, Link, Nvme,
                                     System, _frozen_map)

CATALOG_DIR = Path(__file__).parent / "catalog"
KINDS = ("accelerators", "systems", "cpus", "nvme")


def read_yaml(path: Path | str, field: str = "file") -> dict:
    """Read a YAML/JSON mapping, turning every failure into a ConfigError that names the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(field, f"cannot read {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(field, f"malformed YAML/JSON{where}: {getattr(e, 'problem', e)}",
                          source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(field, "expected a mapping of keys to values at the top level", source=str(path))
    return data


class _Fields:
    """Typed access to a mapping's fields with errors that name the field and the file."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = ""):
        self.data, self.source, self.prefix = data, source, prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ConfigError(self._name(key), "missing required field", source=self.source)
            return default
        return self.data[key]

    def string(self, key: str, default: Any = ...) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise ConfigError(self._name(key), f"expected text, got {v!r}", source=self.source)
        return v

    def number(self, key: str, default: Any = ..., *, positive: bool = True, integer: bool = False,
               at_most: float | None = None) -> float:
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(self._name(key), f"expected a number, got {v!r}", source=self.source)
        if integer and int(v) != v:
            raise ConfigError(self._name(key), f"expected an integer, got {v!r}", source=self.source)
        if positive and v <= 0:
            raise ConfigError(self._name(key), f"must be positive, got {v!r}", source=self.source)
        if not positive and v < 0:
            raise ConfigError(self._name(key), f"must not be negative, got {v!r}", source=self.source)
        if at_most is not None and v > at_most:
            raise ConfigError(self._name(key), f"must be at most {at_most}, got {v!r}", source=self.source)
        return int(v) if integer else float(v)

    def integer(self, key: str, default: Any = ..., *, positive: bool = True) -> int:
        return int(self.number(key, default, positive=positive, integer=True))

    def mapping(self, key: str, default: Any = ...) -> "_Fields":
        v = self.raw(key, default)
        if not isinstance(v, dict):
            raise ConfigError(self._name(key), f"expected a mapping, got {v!r}", source=self.source)
        return _Fields(v, self.source, f"{self._name(key)}.")

    def sources(self) -> Mapping[str, str]:
        s = self.data.get("sources") or {}
        if not isinstance(s, dict):
            raise ConfigError(self._name("sources"), "expected a mapping of field -> source", source=self.source)
        return _frozen_map({str(k): str(v) for k, v in s.items()})


def parse_link(f: _Fields) -> Link:
    return Link(
        name=f.string("name"),
        bandwidth_bytes_per_s=f.number("bandwidth_gb_per_s") * GB,
        efficiency=f.number("efficiency", at_most=1.0),
        latency_s=f.number("latency_us") * 1e-6,
    )


def parse_accelerator(f: _Fields) -> Accelerator:
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
        sources=f.sources(),
    )


def _flag(f: _Fields, key: str, default: bool) -> bool:
    v = f.raw(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f._name(key), f"expected true or false, got {v!r}", source=f.source)
    return v


def parse_cpu(f: _Fields) -> Cpu:
    levels = f.raw("caches")
    if not isinstance(levels, list) or not levels:
        raise ConfigError(f._name("caches"), "expected a non-empty list of cache levels", source=f.source)
    caches = []
    for i, lv in enumerate(levels):
        if not isinstance(lv, dict):
            raise ConfigError(f"{f._name('caches')}[{i}]", "expected a mapping", source=f.source)
        c = _Fields(lv, f.source, f"{f._name('caches')}[{i}].")
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


def parse_nvme(f: _Fields) -> Nvme:
    return Nvme(name=f.string("name"), model=f.string("model"),
                read_bytes_per_s=f.number("read_gb_per_s") * GB,
                write_bytes_per_s=f.number("write_gb_per_s") * GB,
                capacity_bytes=f.number("capacity_tb") * 1e12, sources=f.sources())


def _part(kind: str, f: _Fields, key: str):
    """A part given by preset name or inline mapping."""
    v = f.raw(key)
    if isinstance(v, str):
        return load_part(kind, v)
    return _PARSERS[kind](f.mapping(key))


def parse_system(f: _Fields) -> System:
    nvme = f.mapping("nvme")
    return System(
        name=f.string("name"), description=f.string("description", ""),
        accelerator=_part("accelerators", f, "accelerator"),
        gpus_per_node=f.integer("gpus_per_node"),
        intra_node=parse_link(f.mapping("intra_node")), inter_node=parse_link(f.mapping("inter_node")),
        nics_per_node=f.integer("nics_per_node"),
        nic_bandwidth_bytes_per_s=f.number("nic_bandwidth_gbit_per_s") * GB / 8,
        pcie_gen=f.integer("pcie_gen"), pcie_bandwidth_bytes_per_s=f.number("pcie_bandwidth_gb_per_s") * GB,
        host_cpu=_part("cpus", f, "host_cpu"), host_cpu_sockets=f.integer("host_cpu_sockets"),
        host_memory_bytes=f.number("host_memory_gib") * GIB,
        nvme=_part("nvme", nvme, "drive"), nvme_drives=nvme.integer("drives"),
        sources=f.sources())


_PARSERS: dict[str, Callable[[_Fields], Any]] = {
    "accelerators": parse_accelerator, "systems": parse_system, "cpus": parse_cpu, "nvme": parse_nvme}


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (CATALOG_DIR / kind).glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def load_part(kind: str, name: str):
    """Load one catalogue entry by preset name (``load_part('accelerators', 'a100-80g')``)."""
    path = CATALOG_DIR / kind / f"{name}.yaml"
    if not path.exists():
        raise unknown_name(kind.rstrip("s") if kind != "nvme" else "nvme", name, preset_names(kind))
    return _PARSERS[kind](_Fields(read_yaml(path), str(path)))


def raw_entry(kind: str, name: str) -> dict:
    return read_yaml(CATALOG_DIR / kind / f"{name}.yaml")


def load_cluster(spec: str, gpus: int | None = None, *, inter_node_oversubscription: float = 1.0,
                 db: str | None = None) -> Cluster:
    """A cluster from a system preset name and a GPU count, or from a YAML file, or from a
    measured profile: ``local`` (this machine) or ``profile:NAME`` in the profile database ``db``
    (default ``$PARAPLAN_PROFILE_DB``), see :mod:`paraplan.hardware.profiled`.

    YAML keys: ``system`` (a preset name or an inline system mapping), ``gpus``, optional
    ``name`` and ``inter_node_oversubscription``. ``gpus`` given here overrides the file's.
    """
    from paraplan.hardware.profiled import is_profile_spec, load_profiled_cluster
    if is_profile_spec(spec):
        return load_profiled_cluster(spec, gpus, db)
    path = Path(spec)
    if spec.endswith((".yaml", ".yml", ".json")) or path.is_file():
        data = read_yaml(path, "cluster")
        f = _Fields(data, str(path))
        system = _part("systems", f, "system")
        n = gpus if gpus is not None else f.integer("gpus")
        return Cluster(name=f.string("name", path.stem), system=system, num_gpus=int(n),
                       inter_node_oversubscription=f.number("inter_node_oversubscription", 1.0))
    if spec not in preset_names("systems"):
        raise unknown_name("cluster", spec, preset_names("systems"))
    system = load_part("systems", spec)
    n = system.gpus_per_node if gpus is None else gpus
    return Cluster(name=spec, system=system, num_gpus=int(n),
                   inter_node_oversubscription=inter_node_oversubscription)
