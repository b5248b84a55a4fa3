"""``paraplan list``: the built-in hardware and model presets."""
from __future__ import annotations

from paraplan.hardware.catalog import load_part, preset_names
from paraplan.workloads.presets import load_model, model_names


#: the dense peaks ``list`` prints per accelerator, in this order
LISTED_PEAKS = ("bf16", "fp8", "fp4")


def _sources(part, indent: str = "      ") -> None:
    """Print each figure's source of a catalogue part (``--sources``)."""
    for key, src in part.sources.items():
        print(f"{indent}{key}: {src}")


def cmd_list(args) -> int:
    """Print the presets of one kind (or all hardware); ``--sources`` adds every figure's source."""
    what = args.what
    sources = getattr(args, "sources", False)
    if what in ("hardware", "accelerators"):
        print("accelerators (dense peaks in TFLOP/s; fp4 formats the tensor cores train in)")
        for n in preset_names("accelerators"):
            a = load_part("accelerators", n)
            peaks = {k: a.peak_flops.get(k) or (a.peak_flops.get("fp16") if k == "bf16" else None) for k in LISTED_PEAKS}
            peak_text = "  ".join(f"{k} {v / 1e12:7.1f}" if v else f"{k} {'-':>7s}" for k, v in peaks.items())
            fp4 = f"  ({', '.join(a.fp4_formats)})" if a.fp4_formats else ""
            print(f"  {n:14s} {a.model:36s} {a.memory_bytes / 2**30:5.0f} GiB  {a.memory_bandwidth_bytes_per_s / 1e12:5.2f} TB/s"
                  f"  {peak_text}{fp4}")
            if sources:
                _sources(a)
    if what in ("hardware", "systems"):
        print("systems (use as --cluster NAME --gpus N)")
        for n in preset_names("systems"):
            s = load_part("systems", n)
            c2c = (f" (host link {s.host_link_name} {s.host_link_bytes_per_s / 1e9:.0f} GB/s)"
                   if s.host_link_bandwidth_bytes_per_s else "")
            print(f"  {n:14s} {s.gpus_per_node:2d} x {s.accelerator.name:9s} intra {s.intra_node.bandwidth_bytes_per_s / 1e9:5.0f} GB/s"
                  f"  inter {s.inter_node.bandwidth_bytes_per_s / 1e9:6.2f} GB/s/GPU  PCIe{s.pcie_gen}{c2c}"
                  f"  host {s.host_cpu_sockets} x {s.host_cpu.name}, {s.host_memory_bytes / 2**30:.0f} GiB"
                  + (f"  ({s.hosts_per_node} hosts of {s.gpus_per_host} GPUs; --gpus: {s.accepted_gpus()})"
                     if s.hosts_per_node > 1 else ""))
            if sources:
                _sources(s)
    if what in ("hardware", "cpus"):
        print("CPUs")
        for n in preset_names("cpus"):
            c = load_part("cpus", n)
            caches = " ".join(f"L{x.level} {x.size_bytes // 1024} KiB/{x.shared_by_cores}c" for x in c.caches)
            print(f"  {n:15s} {c.cores:3d} cores {c.frequency_hz / 1e9:.2f} GHz SIMD {c.simd_bits:3d}b  {caches}"
                  f"  DRAM {c.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    if what in ("hardware", "nvme"):
        print("NVMe drives")
        for n in preset_names("nvme"):
            d = load_part("nvme", n)
            print(f"  {n:15s} read {d.read_bytes_per_s / 1e9:.1f} GB/s write {d.write_bytes_per_s / 1e9:.1f} GB/s"
                  f"  {d.capacity_bytes / 1e12:.2f} TB")
    if what == "models":
        print("models (use as --model NAME)")
        for n in model_names():
            print("  " + load_model(n).describe().replace(f"{n}:", f"{n:12s}", 1))
    return 0


def register(sub) -> None:
    """Add ``list`` to the subparsers."""
    ls = sub.add_parser("list", help="show presets")
    ls.add_argument("what", choices=("hardware", "models", "accelerators", "systems", "cpus", "nvme"))
    ls.add_argument("--sources", action="store_true",
                    help="under each accelerator and system, every figure's source (catalogue files' sources)")
    ls.set_defaults(func=cmd_list)
