"""A measured profile as a cluster: ``load_cluster('local' | 'profile:NAME', gpus)``.

The profile (``paraplan profile``, SQLite store; ``$PARAPLAN_PROFILE_DB`` or ``db=`` picks the
file) becomes one node of ``gpus`` ranks:

* :class:`~paraplan.hardware.model.Accelerator` for the profiled device: peak FLOP/s per dtype =
  the best measured GEMM rate (so ``gemm_plateau_efficiency`` = 1), memory = the device's
  capacity (physical RAM for a CPU, as recorded by the profile, else read here), bandwidth = the
  measured copy bandwidth; it carries the :class:`~paraplan.hardware.model.MeasuredProfile` whose
  :class:`~paraplan.costmodels.profiled.ProfiledCurves` the estimator then uses by default (:func:`paraplan.costmodels.efficiency.curves_for`).
* the intra-node :class:`~paraplan.hardware.model.Link` fitted to the measured collectives (the
  in-step ones, each issued after about a millisecond of compute as in a training step, when the
  profile has them; else the back-to-back ones):
  per op, α and β = 1/B of ``T = steps(n)·α + factor(n)·S·β`` by non-negative least squares on
  the relative error over every message size and world size (all-reduce: 2(n−1) steps, factor
  2(n−1)/n; reduce-scatter, all-gather, all-to-all: n−1 and (n−1)/n; send/recv: 1 and 1);
  efficiency 1.0 since B is measured. The link's own α and B are the fit over all ops pooled;
  each op's fit rides in ``Link.per_op``. The inter-node link is the same (one node). A cluster
  of n ranks fits only the launch with n ranks (the nearest measured world size): ranks that
  share a CPU's cores run their collectives slower per byte as more of them are busy, which one
  α-β pair over every world size cannot express.
* A calibrated profile (``paraplan calibrate``) multiplies each calibrated collective's α and β by
  its fitted latency and bandwidth factors (:func:`calibrated_link`); its compute factors ride on the curves.
* Host CPU, PCIe and NVMe: the measured host copy bandwidth where there is one; figures that
  are not measured are placeholders, named as such in ``sources``.
"""
from __future__ import annotations

import os
import sqlite3
import sys

import numpy as np

from paraplan.costmodels.efficiency import measured_curves
from paraplan.costmodels.profiled import measured_device
from paraplan.errors import ConfigError, shown
from paraplan.io import path_problem
from paraplan.hardware.model import (GIB, Accelerator, CacheLevel, Cluster, Cpu, Link, MeasuredProfile, Nvme,
                                     System, _frozen_map, link_calibration)
from paraplan.profiles.store import ProfileStore, db_field, default_db_path, machine_fingerprint, measured_tables

PROFILE_PREFIX = "profile:"
HINT = "run `paraplan profile --quick` first"
STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
         "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1, "send_recv": lambda n: 1}
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
          "send_recv": lambda n: 1.0}
DTYPES = {"float32": "fp32", "tfloat32": "tf32", "bfloat16": "bf16", "float16": "fp16"}


def is_profile_spec(spec: str) -> bool:
    return spec == "local" or spec.startswith(PROFILE_PREFIX)


def _nnls2(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``a x ≈ y`` with x ≥ 0 for two unknowns (active set by enumeration)."""
    best, best_res = np.zeros(2), float(np.sum(y ** 2))
    cands = [np.linalg.lstsq(a, y, rcond=None)[0]]
    for j in range(2):
        col = a[:, j]
        x = np.zeros(2)
        x[j] = max(0.0, float(col @ y) / float(col @ col)) if col @ col > 0 else 0.0
        cands.append(x)
    for x in cands:
        if np.all(x >= 0):
            res = float(np.sum((a @ x - y) ** 2))
            if res < best_res:
                best, best_res = x, res
    return best


def fit_alpha_beta(op_rows) -> tuple[float, float]:
    """(α s, B bytes/s) from [(op, n, bytes, time_s)], minimizing the relative error."""
    a = np.array([[STEPS[op](n) / t, FACTOR[op](n) * s / t] for op, n, s, t in op_rows], dtype=float)
    alpha, beta = _nnls2(a, np.ones(len(op_rows)))
    if beta <= 0:  # latency-bound everywhere: bandwidth not resolved by the sizes measured
        beta = 1e-15
    return float(alpha), float(1.0 / beta)


def collective_rows(collectives: dict) -> dict[str, list]:
    """{op: [(op, n, bytes, time_s)]} from ``measured_tables()['collectives']``."""
    out = {}
    for op, per_world in collectives.items():
        if op not in STEPS:
            continue
        rows = [(op, int(n), float(s), float(t)) for n, lst in per_world.items() for s, _, t in lst
                if t and t > 0 and int(n) >= 2]
        if rows:
            out[op] = rows
    return out


def predicted_collective_time(link: Link, op: str, n: int, nbytes: float) -> float:
    alpha, bw = link.alpha_beta(op)
    return STEPS[op](n) * alpha + FACTOR[op](n) * nbytes / bw


def fitted_link(collectives: dict, name: str = "measured", world_size: int | None = None) -> Link:
    """The α-β link of the measured collectives (see the module docstring); with ``world_size``
    only the launch with that many ranks (the nearest measured one) is fitted."""
    if world_size is not None:
        worlds = sorted({int(n) for per in collectives.values() for n in per if int(n) >= 2})
        if worlds:
            pick = min(worlds, key=lambda w: (abs(np.log(w / max(int(world_size), 2))), -w))
            collectives = {op: {n: v for n, v in per.items() if int(n) == pick}
                           for op, per in collectives.items()}
    rows = collective_rows(collectives)
    if not rows:
        raise ConfigError("profile", "the profile has no collective measurements",
                          accepted="run `paraplan profile --quick` (without --no-collectives) first")
    per_op = {op: fit_alpha_beta(r) for op, r in rows.items()}
    alpha, bw = fit_alpha_beta([x for r in rows.values() for x in r])
    world = max((n for r in rows.values() for _, n, _, _ in r), default=0) if world_size is not None else 0
    measured = {op: tuple(sorted((s, t) for _, n, s, t in r if n == world)) for op, r in rows.items()} if world else {}
    return Link(name=name, bandwidth_bytes_per_s=bw, efficiency=1.0, latency_s=alpha,
                per_op=per_op, measured={op: tab for op, tab in measured.items() if len(tab) >= 2},
                measured_world=world)


def calibrated_link(link: Link, factors: dict) -> Link:
    """``link`` with the calibrated collectives: ``{op}.latency`` multiplies the op's α and
    ``{op}.bandwidth`` its β = 1/B (the op's own fit, else the link's); ``{op}`` alone both. The
    measured times the link interpolates inside its sizes are scaled by what the factors do to the
    α-β time at that size, ``(f_α·steps·α + f_β·factor·S/B) / (steps·α + factor·S/B)`` at the
    measured world size; other ops as they were."""
    from dataclasses import replace
    per_op = dict(link.per_op)
    measured = dict(link.measured or {})
    scaled = link_calibration(factors)
    for op, (fa, fb) in scaled.items():
        alpha, bw = link.alpha_beta(op)
        per_op[op] = (alpha * fa, bw / fb)
        if op in measured:
            n = max(int(link.measured_world), 2)
            ta, tb = STEPS[op](n) * alpha, [FACTOR[op](n) * s / bw for s, _ in measured[op]]
            measured[op] = tuple((s, t * (fa * ta + fb * b) / (ta + b) if ta + b > 0 else t * fb)
                                 for (s, t), b in zip(measured[op], tb))
    return replace(link, per_op=per_op, measured=measured) if scaled else link


def resolve_profile(spec: str, db: str | None = None) -> tuple[str, str]:
    """(fingerprint id, label) of the machine ``local`` or ``profile:NAME`` names; ConfigError when there is none."""
    return _resolve(spec, db)


def _resolve(spec: str, db: str | None) -> tuple[str, str]:
    """(fingerprint id, label) of the machine a spec names; ConfigError when there is none."""
    path = db or default_db_path()
    if not path_problem(path) and not os.path.exists(path):
        given = db_field(db) if db or os.environ.get("PARAPLAN_PROFILE_DB") else "the default; --db names another"
        raise ConfigError("cluster", f"{shown(spec, 80)}: no profile database at {shown(path, 80)} ({given})",
                          accepted=HINT)
    store = ProfileStore(db, readonly=True)
    if spec == "local":
        fp = machine_fingerprint()
        if store.latest_run(fp["id"]) is None:
            raise ConfigError("cluster", f"local: no profile of this machine ({fp['id']}, "
                              f"{fp['hostname']}) in {path}", accepted=HINT)
        return fp["id"], "local"
    name = spec[len(PROFILE_PREFIX):]
    ids = store.resolve(name)
    if not ids:
        known = ", ".join(f"{m['fingerprint']} ({m['hostname']})" for m in store.machines()) or "none"
        raise ConfigError("cluster", f"{shown(spec, 80)}: no profile named {shown(name, 80)} in {shown(path, 80)} "
                          f"(profiles: {known[:300]})", accepted=HINT)
    if len(ids) > 1:
        raise ConfigError("cluster", f"{shown(spec, 80)}: {shown(name, 80)} matches {len(ids)} machines "
                          f"({', '.join(map(str, ids))[:200]})",
                          accepted="a fingerprint id")
    return ids[0], name


def _ram_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16.0 * GIB


def cluster_from_tables(tables: dict, gpus: int | None = None, label: str = "local") -> Cluster:
    """The one-node cluster a profile describes (see the module docstring)."""
    worlds = [int(n) for per in (tables.get("collectives") or {}).values() for n in per]
    n = int(gpus) if gpus is not None else max(worlds or [1])
    profile = MeasuredProfile(name=f"profiled-{label}", device=measured_device(tables), world_size=n, tables=tables)
    curves = measured_curves(profile)
    dev = curves.device
    cuda = dev.startswith("cuda")
    peaks = {}
    for dt in curves.gemm:
        peaks[dt] = curves.peak_flops(dt)
    mem = (tables.get("device_memory") or {}).get(dev)
    mem_source = "profile: device capacity recorded by `paraplan profile`"
    if not mem:
        mem = _ram_bytes() if not cuda else None
        mem_source = "read on this machine (the profile predates the device row)"
    if not mem:
        raise ConfigError("profile", "the profile records no device memory", accepted=HINT)
    acc = Accelerator(
        name=curves.name, vendor="measured", model=f"{dev} ({tables.get('fingerprint')})",
        memory_bytes=float(mem), memory_bandwidth_bytes_per_s=curves.memory_bandwidth_bytes_per_s,
        peak_flops=_frozen_map(peaks), scale_up_bandwidth_bytes_per_s=0.0,
        gemm_plateau_efficiency=1.0, streaming_multiprocessors=1,
        sources=_frozen_map({"peak_flops": "best measured GEMM FLOP/s per dtype",
                             "memory_bytes": mem_source,
                             "memory_bandwidth_bytes_per_s": "measured device copy (read + write)"}),
        measured=profile)
    in_step = tables.get("collectives_in_step") or {}
    measured_collectives = in_step or tables.get("collectives") or {}
    if n == 1 and not collective_rows(measured_collectives):
        # one process on one device (a single-GPU machine profiled without collectives): nothing is
        # communicated, so the link is never priced; it is named as unmeasured
        link = Link(name=f"no collectives measured ({label}): one process", bandwidth_bytes_per_s=1e9,
                    efficiency=1.0, latency_s=0.0)
    else:
        link = fitted_link(measured_collectives, world_size=n,
                           name=f"measured collectives{' in step' if in_step else ''} ({label})")
    link = calibrated_link(link, tables.get("calibration") or {})
    acc = _with(acc, scale_up_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s)
    host_bw = (tables.get("memory_bandwidth") or {}).get("cpu") or curves.memory_bandwidth_bytes_per_s
    cores = os.cpu_count() or 1
    cpu = Cpu(name="profiled-host", vendor="measured", model="host of the profile", cores=cores,
              threads_per_core=1, frequency_hz=1e9, simd_bits=256, fma_units_per_core=1,
              caches=(CacheLevel(level=3, size_bytes=32 << 20, shared_by_cores=cores, latency_cycles=40,
                                 bandwidth_bytes_per_cycle_per_core=16),),
              memory_bandwidth_bytes_per_s=float(host_bw), memory_latency_s=100e-9, memory_channels=1,
              sources=_frozen_map({"memory_bandwidth_bytes_per_s": "measured CPU copy",
                                   "*": "placeholders (not measured): frequency, SIMD, caches"}))
    pcie = tables.get("h2d") or host_bw
    nvme = Nvme(name="unmeasured", model="not measured", read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                capacity_bytes=0.0, sources=_frozen_map({"*": "placeholder: NVMe is not profiled"}))
    system = System(
        name=f"profile:{label}", description=f"measured profile run {tables.get('run_id')} of "
        f"{tables.get('fingerprint')} ({dev})", accelerator=acc, gpus_per_node=n, intra_node=link,
        inter_node=link, nics_per_node=1, nic_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
        pcie_gen=0, pcie_bandwidth_bytes_per_s=float(pcie), host_cpu=cpu, host_cpu_sockets=1,
        host_memory_bytes=_ram_bytes() if cuda else float(mem), nvme=nvme, nvme_drives=1,
        sources=_frozen_map({"intra_node": "alpha-beta fit of the measured collectives" +
                             (", each issued after ~1 ms of compute (in step)" if in_step else ", back to back"),
                             "pcie_bandwidth_bytes_per_s": "measured H2D copy" if tables.get("h2d")
                             else "host memory (CPU device: host and device memory are one)"}))
    return Cluster(name=f"profile:{label}" if label != "local" else "local", system=system, num_gpus=n)


def _with(acc: Accelerator, **changes) -> Accelerator:
    from dataclasses import replace
    return replace(acc, **changes)


def load_profiled_cluster(spec: str, gpus: int | None = None, db: str | None = None) -> Cluster:
    """``local`` (this machine's latest profile) or ``profile:NAME`` (fingerprint id, unique id
    prefix or hostname) in the profile database ``db`` (default ``$PARAPLAN_PROFILE_DB`` or the
    cache); ConfigError pointing at ``paraplan profile --quick`` when there is none."""
    try:
        fid, label = _resolve(spec, db)
        tables = measured_tables(db, fid)
        cluster = cluster_from_tables(tables, gpus, label)
    except (sqlite3.Error, ValueError, KeyError, TypeError, AttributeError, IndexError, ZeroDivisionError) as e:
        # what the database holds is the user's file: a file that is not a database, another
        # program's tables, or rows that are not what `paraplan profile` writes
        path = db or default_db_path()
        raise ConfigError(db_field(db), f"{shown(path, 80)} is not a readable paraplan profile database "
                          f"({type(e).__name__}: {str(e)[:120]})", accepted=HINT) from None
    warn_if_noisy(tables)
    return cluster


_WARNED: set = set()


def noisy_profile_warning(tables: dict) -> str | None:
    """The warning for a profile whose repeats spread widely (``ProfileNoise.is_noisy``), else None."""
    noise = tables.get("noise")
    if noise is None or not noise.is_noisy:
        return None
    return (f"paraplan: warning: profile run {tables.get('run_id')} of machine {tables.get('fingerprint')} "
            f"was measured on a busy machine ({noise.describe()}); predictions from it are uncertain: "
            f"run `paraplan profile` again when the machine is quiet")


def warn_if_noisy(tables: dict) -> None:
    """Print :func:`noisy_profile_warning` on stderr, once per profile run and process."""
    msg = noisy_profile_warning(tables)
    key = (tables.get("fingerprint"), tables.get("run_id"))
    if msg and key not in _WARNED:
        _WARNED.add(key)
        print(msg, file=sys.stderr)
