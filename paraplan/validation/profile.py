"""``paraplan profile``: micro-benchmarks of this machine, stored in the SQLite profile store.

Measured: GEMMs over a grid of shapes and dtypes (achieved FLOP/s, 2 m n k FLOPs per op), the
three GEMMs of a Linear's forward and backward in their layouts (``gemm_linear``: x·Wᵀ, g·W,
gᵀ·x, per GEMM),
causal ``scaled_dot_product_attention`` (4 b h s^2 d FLOPs forward, halved for causal),
memory bandwidth of a large device copy (read + write bytes), the launch overhead of a tiny
op (``launch``: a 1-element add, no autograd), host<->device copies when CUDA is present, and
collectives (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv) through
torch.distributed under torchrun, one launch per world size (gloo on CPU, NCCL on GPU), each rank
with the validation workers' intra-op thread count (``OMP_NUM_THREADS``, default 1).

The per-device benchmarks run in a fresh process with the validation ranks' environment
(:func:`device_benchmark_rows`), so they see the runtime a rank sees.

What a training step pays beyond the kernels' arithmetic (``training_rows``), measured alone
(world size 1) and again on every rank at once inside each collective launch (world size n: the
ranks share the machine's cores, as the validation workers do):

* ``autograd``: forward + backward of tiny Linear, LayerNorm, GELU, softmax and batched-matmul
  ops under autograd, each divided by the kernels it runs (Linear with bias 4: addmm, then mm,
  mm and a bias sum; the others 2, batched matmul 3); their median is the per-kernel cost of an
  eager training step (dispatch, autograd graph, engine) that the profiled curves charge per
  kernel.
* ``contention``: the validation model's transformer block (hidden 256, seq 256) forward +
  backward, and a 128^3 fp32 GEMM; the block's time at world size n over its time alone is the
  compute slowdown of n ranks sharing the machine (cores, caches and memory bandwidth).
* ``optimizer``: ``torch.optim.AdamW`` (``foreach=False``, as the harness) over 64 tensors of 64
  elements and over 16 tensors of 2^16 elements (a small layer's weight matrix): the per-tensor
  and per-parameter cost of a step, taken cold (fresh gradients and the caches overwritten
  before every step, untimed), as it runs after a forward and backward.
* ``routed``: a mixture of experts' routed MLPs (``ROUTED_MLP``: 8 experts of 64 tokens each, one
  after another, each with its own weights) forward + backward, and one MLP of the same FLOPs on all
  512 tokens: small per-expert GEMMs in a step run well below the rate their FLOPs get alone (on the
  2-core VM 40 against 68 GFLOP/s for the one MLP), which the FLOPs-only GEMM curve cannot say.
* ``checkpoint``: the two regions recomputation checkpoints, the attention core (QKᵀ, scale, mask,
  softmax, PV: 4 of the estimator's kernels) and a whole pre-LN block (16), at the contention
  block's size, run forward + backward plainly, forward alone, and forward + backward under
  non-reentrant ``torch.utils.checkpoint``: what recomputation costs beyond re-running the
  forward, per region and per kernel.

Every collective is timed twice: back to back, and in step (issued right after about a
millisecond of GEMMs on every rank, minus the GEMMs alone: :func:`_in_step_time`), which is what a
training step pays for it; the profiled cluster's link is fitted to the in-step figures.

Collective sizes and bus bandwidth follow the nccl-tests convention (PERFORMANCE.md): ``bytes``
is the full buffer (the all-gather output, the reduce-scatter input), algorithm bandwidth is
bytes / time and bus bandwidth multiplies it by 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, and 1 for send/recv (one-way, half a ping-pong).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace

import torch

from paraplan import progress
from paraplan.errors import ConfigError
from paraplan.profiles.store import ProfileStore, machine_fingerprint, profile_noise
from paraplan.validation.apply_zero import make_adamw
from paraplan.validation.launch import LaunchOptions, WorkerFailed, run_torchrun, worker_env
from paraplan.validation.procs import die_with_parent, pin_from_env
from paraplan.validation.model import Block, GPTConfig, ParallelContext

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "send_recv": lambda n: 1.0}


@dataclass(frozen=True)
class ProfileOptions:
    """What to measure; ``quick()`` / ``full()`` give the two standard sets."""

    gemm_shapes: tuple = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512),
                          (1024, 1024, 1024))
    gemm_dtypes: tuple = ("float32", "bfloat16")
    sdpa_shapes: tuple = ((1, 8, 256, 64), (4, 8, 512, 64))  # (batch, heads, seq, head_dim)
    copy_bytes: int = 64 << 20
    world_sizes: tuple = (2, 4)
    # up to 16 MiB: the default validate model's gradients (about 15 MB in fp32) are measured,
    # not extrapolated; 256 KiB is its tensor-parallel activation all-reduce (256 tokens x 256 x
    # 4 bytes), which interpolating between 64 KiB and 1 MiB put at 1.6-2.3 ms over seven profiles
    # of the 2-core development VM while the harness paid about 2.5 ms each
    collective_bytes: tuple = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
    min_time_s: float = 0.15
    mode: str = "quick"

    @classmethod
    def quick(cls) -> "ProfileOptions":
        return cls()

    @classmethod
    def full(cls) -> "ProfileOptions":
        return cls(gemm_shapes=tuple((n, n, n) for n in (64, 128, 256, 512, 1024, 2048)) +
                   ((4096, 1024, 1024), (1024, 4096, 1024)),
                   gemm_dtypes=("float32", "bfloat16", "float16"),
                   sdpa_shapes=((1, 8, 256, 64), (4, 8, 512, 64), (2, 16, 1024, 64)),
                   copy_bytes=256 << 20, world_sizes=(2, 4),
                   collective_bytes=tuple(1 << k for k in range(10, 25, 2)),
                   min_time_s=0.5, mode="full")


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def bench(fn, device="cpu", min_time_s: float = 0.15, max_iters: int = 1000) -> float:
    """Median seconds per call of ``fn`` after one warm-up, over at least ``min_time_s``."""
    fn()
    _sync(device)
    samples, start = [], time.perf_counter()
    while len(samples) < max_iters and (time.perf_counter() - start < min_time_s or len(samples) < 3):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


#: rounds every case is timed in; the figure is their median, the spread their range over it
ROUNDS = 3
#: a case whose spread exceeds this is re-measured (up to REMEASURES more times, the quietest kept)
#: and, if it stays above, counted as noisy
NOISY_SPREAD = 0.25
REMEASURES = 2


def spread_of(xs) -> float:
    """(max - min) / median of repeated timings; with 5 or more, the fastest and slowest are
    dropped first (one burst of load from another process does not make a case noisy)."""
    xs = sorted(xs)
    if len(xs) < 2:
        return 0.0
    med = statistics.median(xs)
    if len(xs) >= 5:
        xs = xs[1:-1]
    return (xs[-1] - xs[0]) / med if med > 0 else 0.0


def repeated(measure, rounds: int = ROUNDS) -> tuple[float, float]:
    """(median, spread) of ``measure()`` over ``rounds`` calls; re-measured up to REMEASURES
    times while the spread exceeds NOISY_SPREAD, keeping the attempt with the smallest spread."""
    best = None
    for _ in range(1 + REMEASURES):
        xs = [measure() for _ in range(rounds)]
        got = (statistics.median(xs), spread_of(xs))
        if best is None or got[1] < best[1]:
            best = got
        if got[1] <= NOISY_SPREAD:
            break
    return best


def bench_repeated(fn, device="cpu", min_time_s: float = 0.15, max_iters: int = 1000) -> tuple[float, float]:
    """(seconds per call, spread): :func:`bench` in ROUNDS rounds of ``min_time_s / ROUNDS``."""
    return repeated(lambda: bench(fn, device, min_time_s / ROUNDS, max_iters))


def bench_throughput(fn, device="cpu", min_time_s: float = 0.15, max_iters: int = 20000) -> float:
    """Mean seconds per call of ``fn`` (wall clock over at least ``min_time_s`` after a warm-up):
    unlike the median it keeps the time slices lost to other processes sharing the cores."""
    fn()
    _sync(device)
    iters, start = 0, time.perf_counter()
    while iters < max_iters and (time.perf_counter() - start < min_time_s or iters < 3):
        fn()
        iters += 1
    _sync(device)
    return (time.perf_counter() - start) / iters


def bench_prepared(fn, prepare, device="cpu", min_time_s: float = 0.15, max_iters: int = 2000) -> float:
    """Mean seconds per call of ``fn`` with ``prepare()`` run untimed before every call (a warm-up
    call first); the time of ``fn`` alone adds up to at least ``min_time_s``."""
    prepare()
    fn()
    _sync(device)
    iters, spent = 0, 0.0
    while iters < max_iters and (spent < min_time_s or iters < 3):
        prepare()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        spent += time.perf_counter() - t0
        iters += 1
    return spent / iters


def _row(kind, op, device, dtype=None, world_size=1, shape=None, nbytes=None, flops=None,
         time_s=None, bus_factor=None, spread=None):
    return {"kind": kind, "op": op, "device": str(device), "dtype": dtype,
            "world_size": world_size, "shape": shape, "bytes": nbytes, "flops": flops,
            "time_s": time_s, "spread": spread,
            "flops_per_s": flops / time_s if flops and time_s else None,
            "bandwidth_bytes_per_s": nbytes / time_s if nbytes and time_s else None,
            "bus_bandwidth_bytes_per_s": nbytes / time_s * bus_factor
            if nbytes and time_s and bus_factor is not None else None}


def gemm_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """Achieved FLOP/s of ``a @ b`` ([m, k] x [k, n]) per shape and dtype."""
    rows = []
    for name in opts.gemm_dtypes:
        dtype = getattr(torch, name)
        for m, n, k in opts.gemm_shapes:
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(k, n, device=device).to(dtype)
            t, sp = bench_repeated(lambda: a @ b, device, opts.min_time_s)
            rows.append(_row("gemm", "matmul", device, name, shape={"m": m, "n": n, "k": k},
                             flops=2.0 * m * n * k, time_s=t, spread=sp,
                             nbytes=(m * k + k * n + m * n) * a.element_size()))
    return rows


#: (tokens m, in k, out n) of the training-layout GEMMs: a Linear's forward x·Wᵀ, input gradient
#: g·W and weight gradient gᵀ·x, from the validation model's sizes up to 1024^3
COLD_BYTES = 64 << 20
LINEAR_SHAPES = ((64, 128, 128), (128, 128, 512), (256, 512, 128), (256, 256, 256), (512, 512, 512),
                 (1024, 1024, 1024))


def linear_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """The three GEMMs of a Linear's forward and backward in their layouts (x @ W.t(), g @ W,
    g.t() @ x), timed together over operand sets that do not fit in the caches; the row is per
    GEMM (2mnk FLOPs, a third of the time): the rate a training step's GEMMs get, whose operands
    were last touched by other ops, unlike a square ``a @ b`` repeated on hot operands."""
    rows = []
    for name in opts.gemm_dtypes:
        dtype = getattr(torch, name)
        for m, k, n in LINEAR_SHAPES:
            # operands rotate over sets that together exceed the caches (COLD_BYTES): in a step a
            # GEMM's inputs were written by other ops in between, not by the previous call
            size = (m * k + n * k + m * n) * torch.tensor([], dtype=dtype).element_size()
            sets = [tuple(torch.randn(*shape, device=device).to(dtype) for shape in ((m, k), (n, k), (m, n)))
                    for _ in range(max(1, min(256, -(-COLD_BYTES // size))))]
            it = iter(())

            def three():
                nonlocal it
                try:
                    x, w, g = next(it)
                except StopIteration:
                    it = iter(sets)
                    x, w, g = next(it)
                x @ w.t()
                g @ w
                g.t() @ x
            t, sp = bench_repeated(three, device, opts.min_time_s)
            rows.append(_row("gemm_linear", "linear_fwd_bwd", device, name, shape={"m": m, "n": n, "k": k},
                             flops=2.0 * m * n * k, time_s=t / 3, spread=sp))
    return rows


def sdpa_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """Causal SDPA forward; FLOPs 4 b h s^2 d / 2 (causal half counted)."""
    rows = []
    dtype = "float32" if str(device) == "cpu" else "bfloat16"
    for b, h, s, d in opts.sdpa_shapes:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=getattr(torch, dtype))
                   for _ in range(3))
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        t, sp = bench_repeated(fn, device, opts.min_time_s)
        rows.append(_row("sdpa", "sdpa_causal_fwd", device, dtype,
                         shape={"batch": b, "heads": h, "seq": s, "head_dim": d},
                         flops=4.0 * b * h * s * s * d / 2, time_s=t, spread=sp))
    return rows


def launch_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """Seconds per call of a 1-element add: the fixed cost of one op (dispatch, launch)."""
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)
    t, sp = bench_repeated(lambda: torch.add(a, b), device, opts.min_time_s, max_iters=20000)
    return [_row("launch", "add_1", device, "float32", shape={"numel": 1}, time_s=t, spread=sp)]


#: eager elementwise kernels timed forward + backward, with the bytes the estimator charges them per
#: element (fp32, forward + backward; paraplan.costmodels.compute, .attention): GELU and LayerNorm 4 B forward
#: and twice that backward in 16-bit; scale-mask-softmax 9 + 11 B per score; cross-entropy 3 passes
#: over fp32 logits (4 B each)
ELEMENTWISE_OPS = {"gelu": 24.0, "layer_norm": 24.0, "scale_mask_softmax": 40.0, "cross_entropy": 12.0}
#: element counts of the two sizes whose time difference gives the rate (per-op costs cancel)
ELEMENTWISE_SIZES = {"cpu": (1 << 14, 1 << 17), "cuda": (1 << 20, 1 << 23)}


def _forward_backward(f):
    """A step running ``f()`` forward and backward with a ones gradient (made once, on the first call)."""
    g = None

    def step():
        nonlocal g
        out = f()
        if g is None:
            g = torch.ones_like(out)
        out.backward(g)
    return step


def _elementwise_case(op, numel, device):
    import torch.nn.functional as F
    if op == "gelu":
        x = torch.randn(numel // 256, 256, device=device, requires_grad=True)
        f = lambda: F.gelu(x)
    elif op == "layer_norm":
        x = torch.randn(numel // 128, 128, device=device, requires_grad=True)
        w = torch.ones(128, device=device, requires_grad=True)
        b = torch.zeros(128, device=device, requires_grad=True)
        f = lambda: F.layer_norm(x, (128,), w, b)
    elif op == "scale_mask_softmax":
        x = torch.randn(numel // 64, 64, device=device, requires_grad=True)
        mask = torch.ones(64, 64, dtype=torch.bool, device=device).triu(1).repeat(numel // 4096 or 1, 1)
        f = lambda: torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), dim=-1)
    elif op == "cross_entropy":
        x = torch.randn(numel // 1024, 1024, device=device, requires_grad=True)
        t = torch.randint(0, 1024, (numel // 1024,), device=device)
        f = lambda: F.cross_entropy(x, t)
    else:
        raise ValueError(op)
    return _forward_backward(f)


def elementwise_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """Eager elementwise kernels forward + backward at two sizes (``ELEMENTWISE_SIZES``); ``bytes``
    is what the estimator charges them (``ELEMENTWISE_OPS``). On a CPU core GELU's erf and the
    softmax's exp make these compute-bound, several times below the copy bandwidth."""
    sizes = ELEMENTWISE_SIZES["cuda" if str(device).startswith("cuda") else "cpu"]
    rows = []
    for op, per_el in ELEMENTWISE_OPS.items():
        for n in sizes:
            t, sp = bench_repeated(_elementwise_case(op, n, device), device, opts.min_time_s / 2)
            rows.append(_row("elementwise", op, device, "float32", shape={"numel": n},
                             nbytes=int(per_el * n), time_s=t, spread=sp))
    return rows


#: (op, kernels it runs forward + backward) of the autograd micro-benchmarks
AUTOGRAD_OPS = (("linear", 4), ("layer_norm", 2), ("gelu", 2), ("softmax", 2), ("bmm", 3))
ADAM_SMALL = (64, 64)          # tensors, elements each
ADAM_LARGE = (16, 1 << 16)     # a layer's weight matrices are of this order (256 KiB each)
#: one flat 8 MiB tensor, as a ZeRO-1/2 shard is: its parameter, gradient and two states (32 MiB)
#: no longer stay in the caches across AdamW's passes (2-core development machine, ranks alone:
#: 2.1-2.3 ns per element up to 2^21 elements in one tensor, 4.8 at 2^22; in the validation run's
#: ZeRO-1, both ranks stepping 1.9 M-element shards at once: 5.7-8.4 ms where 2^16-element tensors
#: predicted 4.0-4.9)
ADAM_FLAT = (1, 1 << 21)
#: on CUDA the flat tensor is 2^24 elements (256 MiB with its gradient and states): at 2^21 a GPU's
#: AdamW is still bound by its kernel launches, and the per-element figure, held for larger tensors,
#: priced a 2048-wide model's 4-16 M-element weights at 13.2 ms a step where they took 7.3 (lent H100)
ADAM_FLAT_CUDA = (1, 1 << 24)


def adam_flat(device) -> tuple[int, int]:
    return ADAM_FLAT_CUDA if str(device).startswith("cuda") else ADAM_FLAT
#: estimator kernels in the regions timed with and without activation checkpointing: the unfused
#: attention core (selective recomputation) and a whole layer (full); two sizes separate the
#: per-region cost from the per-kernel one (compute.layer_times charges the same counts)
CHECKPOINT_REGION_OPS = (4, 16)


#: ops chained in one autograd case on CUDA: there backward() hands its work to the device's autograd
#: thread and waits for it, a fixed cost per backward call (~0.2 ms on a lent H100) that a training
#: step pays once for all its kernels; one op per call (the CPU figure) charged it to every kernel
#: (67 us per kernel there, against ~10 us of dispatch). On a CPU backward runs on the calling thread.
AUTOGRAD_CHAIN = {"cpu": 1, "cuda": 16}


def autograd_chain(device) -> int:
    return AUTOGRAD_CHAIN["cuda" if str(device).startswith("cuda") else "cpu"]


def _autograd_case(op, device):
    """Forward + backward of ``autograd_chain(device)`` applications of one tiny op (shape-preserving)."""
    import torch.nn.functional as F
    x = torch.randn(1, 4, 8, device=device, requires_grad=True)
    if op == "linear":
        w = torch.randn(8, 8, device=device, requires_grad=True)
        b = torch.randn(8, device=device, requires_grad=True)
        one = lambda y: F.linear(y, w, b)
    elif op == "layer_norm":
        w = torch.ones(8, device=device, requires_grad=True)
        b = torch.zeros(8, device=device, requires_grad=True)
        one = lambda y: F.layer_norm(y, (8,), w, b)
    elif op == "gelu":
        one = F.gelu
    elif op == "softmax":
        one = lambda y: torch.softmax(y, dim=-1)
    elif op == "bmm":
        m = torch.randn(1, 8, 8, device=device, requires_grad=True)
        one = lambda y: y @ m
    else:
        raise ValueError(op)
    chain = autograd_chain(device)

    def f():
        y = x
        for _ in range(chain):
            y = one(y)
        return y
    return _forward_backward(f)


#: calls of the tensor-parallel wrappers chained in the ``tp`` case (half reduce-from-tp, half copy-to-tp)
TP_WRAPPER_CALLS = 8


def _tp_wrapper_cases(device) -> dict:
    """{"wrapped", "plain"}: forward + backward of a tiny op followed by TP_WRAPPER_CALLS of the
    validation harness's tensor-parallel autograd wrappers (:mod:`paraplan.validation.comm`'s
    ``_ReduceFromTP`` and ``_CopyToTP`` in turn, the conjugate pair every tp layer calls twice), and
    of the op alone. Called on one process (group None) the wrappers' collective is the identity, so
    what the difference measures is their host side alone: ``Function.apply``, the Python forward
    and backward, the autograd node; the collective itself is the ``collective`` rows'. Per call:
    ``(wrapped - plain) / TP_WRAPPER_CALLS`` (:func:`paraplan.costmodels.profiled.training_measurements`)."""
    from paraplan.validation import comm
    x = torch.randn(1, 4, 8, device=device, requires_grad=True)

    def wrapped():
        y = x * 1.0
        for i in range(TP_WRAPPER_CALLS):
            y = (comm._ReduceFromTP if i % 2 == 0 else comm._CopyToTP).apply(y, None)
        return y
    return {"wrapped": _forward_backward(wrapped), "plain": _forward_backward(lambda: x * 1.0)}


def _checkpoint_cases(ops: int, device) -> dict:
    """The region recomputation checkpoints that runs ``ops`` of the estimator's kernels (4: the
    attention core of a :class:`~paraplan.validation.model.Block` on q, k, v; 16: the block's
    whole body) at CHECKPOINT_BLOCK's size (small, so the overhead stands out of the noise), as three steps: ``plain`` forward + backward,
    ``forward`` alone and ``checkpointed`` forward + backward under ``torch.utils.checkpoint``
    (non-reentrant, as the harness). checkpointed − plain − forward is what recomputing the
    region costs beyond re-running its forward: the saved-tensor hooks, the region's bookkeeping
    and the replay under autograd. Measured on the development VM: attention core 0.45 ms and
    block 0.69 ms per region at batch 1, where regions of 4 and 16 tiny ops (the profile before)
    gave 0.28 and 0.51 ms; in a real step the core region cost ~0.6 ms."""
    from torch.utils.checkpoint import checkpoint

    if ops not in CHECKPOINT_REGION_OPS:
        raise ValueError(f"no checkpoint region of {ops} kernels; have {CHECKPOINT_REGION_OPS}")
    c = CHECKPOINT_BLOCK
    cfg = GPTConfig(vocab_size=256, seq_len=c["seq"], hidden=c["hidden"], heads=c["heads"], layers=1)
    block = Block(cfg, 0, ParallelContext()).to(device)
    if ops == 4:
        hd = c["hidden"] // c["heads"]
        inputs = tuple(torch.randn(c["batch"], c["heads"], c["seq"], hd, device=device, requires_grad=True)
                       for _ in range(3))
        region = block._core_attention
    else:
        inputs = (torch.randn(c["batch"], c["seq"], c["hidden"], device=device, requires_grad=True),)
        region = block._body

    # op-level SAC's machinery on the same region with nothing recomputed (every op's output kept): its
    # TorchDispatchMode runs each op through Python in the forward and replays each from its cache in the
    # backward; sac - plain is that cost (the block's region runs its projections as op-sac splits them)
    sac_region = region
    if ops != 4:
        sac_region = Block(cfg, 0, ParallelContext(recompute="op-sac")).to(device)._body
    return {"plain": lambda: region(*inputs).sum().backward(), "forward": lambda: region(*inputs),
            "checkpointed": lambda: checkpoint(region, *inputs, use_reentrant=False).sum().backward(),
            "sac": lambda: checkpoint(sac_region, *inputs, use_reentrant=False,
                                      context_fn=_keep_everything_context).sum().backward()}


def _keep_everything_context():
    """Selective-checkpoint contexts whose policy keeps every op's output (nothing recomputed)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(lambda ctx, op, *args, **kwargs: CheckpointPolicy.MUST_SAVE)


#: the validation model's transformer block timed forward + backward for the contention figure:
#: a working set of a few MiB and the op mix of a real step, unlike one cache-resident GEMM
#: (the size of ``validate``'s default model, so the slowdown is measured on the working set it runs)
CONTENTION_BLOCK = {"hidden": 256, "heads": 4, "seq": 256, "batch": 1}
#: the block whose regions the checkpoint cases time: small, so that recomputation's bookkeeping is a
#: measurable share of the region (the size these figures were measured at before)
CHECKPOINT_BLOCK = {"hidden": 128, "heads": 4, "seq": 64, "batch": 1}


#: the routed-experts case: ``experts`` GELU MLPs (hidden -> ffn -> hidden, biases) on ``tokens`` tokens
#: each, against one such MLP on experts x tokens tokens (the default validate model's MoE: 8 experts,
#: top-2 of 256 tokens gives ~64 per expert)
ROUTED_MLP = {"hidden": 256, "ffn": 1024, "experts": 8, "tokens": 64}


def _routed_cases(device) -> dict:
    """{"routed": step, "dense": step}: forward + backward of the routed experts one after another
    (:func:`paraplan.validation.apply_ep.run_experts`, each with its own weights) and of one MLP of
    the same FLOPs; gradients fresh every step, as after ``zero_grad``."""
    from paraplan.validation.apply_ep import run_experts
    c = ROUTED_MLP
    h, f, E, m = c["hidden"], c["ffn"], c["experts"], c["tokens"]

    def case(groups, tokens):
        weights = [tuple(torch.randn(*shape, device=device, requires_grad=True)
                         for shape in ((f, h), (f,), (h, f), (h,))) for _ in range(groups)]
        params = [w for ws in weights for w in ws]
        x = torch.randn(groups * tokens, h, device=device, requires_grad=True)

        def step():
            run_experts(x, [tokens] * groups, weights).sum().backward()
            for p in params + [x]:
                p.grad = None
        return step
    return {"routed": case(E, m), "dense": case(1, E * m)}


def _block_case(device):
    c = CONTENTION_BLOCK
    cfg = GPTConfig(vocab_size=256, seq_len=c["seq"], hidden=c["hidden"], heads=c["heads"], layers=1)
    block = Block(cfg, 0, ParallelContext()).to(device)
    x = torch.randn(c["batch"], c["seq"], c["hidden"], device=device, requires_grad=True)

    def step():
        block(x).sum().backward()
    return step


def _adamw_case(tensors: int, numel: int, device):
    """(step, prepare) of an AdamW step over ``tensors`` x ``numel`` elements as a training step
    finds it: ``prepare`` gives every parameter a freshly allocated gradient (backward makes new
    ones after ``zero_grad``) and writes a buffer larger than the caches (COLD_BYTES), as the
    forward and backward between two steps do, so the step reads parameters and states cold.
    Measured on the 2-core development machine for the validation model's 69 tensors (1.06 M
    elements): 2.9 ms back to back, 4.3 ms so prepared, 4.3-4.7 ms after a real forward+backward."""
    import torch.nn as nn

    params = [nn.Parameter(torch.randn(numel, device=device)) for _ in range(tensors)]
    flush = torch.empty(COLD_BYTES // 4, device=device)

    def prepare():
        for p in params:
            p.grad = torch.randn_like(p)
        flush.fill_(1.0)
    return make_adamw(params).step, prepare


def training_rows(opts: ProfileOptions, device="cpu", world_size: int = 1, rounds: int = 7) -> list[dict]:
    """Per-kernel autograd cost, compute contention reference, AdamW step and activation
    checkpointing's overhead (module docstring).

    Every case runs in ``rounds`` short rounds interleaved with the others and keeps the median
    round (cases whose rounds spread over NOISY_SPREAD are run again, up to REMEASURES times, the
    quietest set kept): a burst of load from another process on a shared machine spoils one round, not the
    figure."""
    t_round = max(0.35, opts.min_time_s) / rounds
    # (kind, op, shape, flops, bytes, fn, prepare or None)
    cases = [("autograd", op, {"numel": 32, "kernels": k * autograd_chain(device)}, None, None,
              _autograd_case(op, device), None) for op, k in AUTOGRAD_OPS]
    a = torch.randn(128, 128, device=device)
    b = torch.randn(128, 128, device=device)
    cases.append(("contention", "gemm", {"m": 128, "n": 128, "k": 128}, 2.0 * 128 ** 3, None,
                  lambda: a @ b, None))
    cases.append(("contention", "block", dict(CONTENTION_BLOCK), None, None, _block_case(device), None))
    flops = 6.0 * 2 * ROUTED_MLP["experts"] * ROUTED_MLP["tokens"] * ROUTED_MLP["hidden"] * ROUTED_MLP["ffn"]
    cases += [("routed", op, dict(ROUTED_MLP), flops, None, fn, None) for op, fn in _routed_cases(device).items()]
    for tensors, numel in (ADAM_SMALL, ADAM_LARGE, adam_flat(device)):
        cases.append(("optimizer", "adamw", {"tensors": tensors, "numel": numel}, None,
                      4 * tensors * numel, *_adamw_case(tensors, numel, device)))
    cases += [("tp", variant, {"calls": TP_WRAPPER_CALLS if variant == "wrapped" else 0}, None, None, fn, None)
              for variant, fn in _tp_wrapper_cases(device).items()]
    for ops in CHECKPOINT_REGION_OPS:
        cases += [("checkpoint", variant, {"ops": ops}, None, None, fn, None)
                  for variant, fn in _checkpoint_cases(ops, device).items()]
    def measure(which: list[int]) -> dict[int, list[float]]:
        got = {i: [] for i in which}
        for _ in range(rounds):
            for i in which:
                *_, fn, prepare = cases[i]
                got[i].append(bench_throughput(fn, device, t_round) if prepare is None
                              else bench_prepared(fn, prepare, device, t_round))
        return got

    samples = measure(list(range(len(cases))))
    for _ in range(REMEASURES):   # noisy cases again (interleaved among themselves), quietest kept
        noisy = [i for i, ts in samples.items() if spread_of(ts) > NOISY_SPREAD]
        if not noisy:
            break
        for i, ts in measure(noisy).items():
            if spread_of(ts) < spread_of(samples[i]):
                samples[i] = ts
    samples = [samples[i] for i in range(len(cases))]
    return [_row(kind, op, device, "float32", world_size, shape=shape, flops=flops, nbytes=nbytes,
                 time_s=statistics.median(ts), spread=spread_of(ts))
            for (kind, op, shape, flops, nbytes, _, _), ts in zip(cases, samples)]


def device_memory_bytes(device="cpu") -> int | None:
    """Physical RAM for the CPU, total memory for a CUDA device."""
    if str(device).startswith("cuda"):
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def device_rows(device="cpu") -> list[dict]:
    """The device's memory capacity (not a benchmark; what a profiled cluster needs)."""
    mem = device_memory_bytes(device)
    return [_row("device", "memory", device, shape={"threads": torch.get_num_threads()},
                 nbytes=mem)] if mem else []


def per_rank_threads() -> int:
    """Intra-op threads of one validation rank: the launcher's OMP_NUM_THREADS (default 1)."""
    try:
        return max(1, int(worker_env().get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def memory_rows(opts: ProfileOptions, device="cpu") -> list[dict]:
    """Device copy bandwidth (bytes read + written) and, on CUDA, pinned H2D / D2H copies."""
    n = opts.copy_bytes // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    t, sp = bench_repeated(lambda: dst.copy_(src), device, opts.min_time_s)
    rows = [_row("memcpy", "copy", device, "float32", shape={"bytes": opts.copy_bytes},
                 nbytes=2 * opts.copy_bytes, time_s=t, spread=sp)]
    if str(device).startswith("cuda"):
        host = torch.ones(n, pin_memory=True)
        t = bench(lambda: src.copy_(host, non_blocking=True), device, opts.min_time_s)
        rows.append(_row("h2d", "copy", device, "float32", shape={"bytes": opts.copy_bytes},
                         nbytes=opts.copy_bytes, time_s=t))
        t = bench(lambda: host.copy_(src, non_blocking=True), device, opts.min_time_s)
        rows.append(_row("d2h", "copy", device, "float32", shape={"bytes": opts.copy_bytes},
                         nbytes=opts.copy_bytes, time_s=t))
    return rows


# ---------------------------------------------------------------- collectives (under torchrun)

def _collective_case(op, nbytes, world, rank, device):
    import torch.distributed as dist
    n = max(world, nbytes // 4 // world * world)  # float32 elements, divisible by world
    full = torch.ones(n, device=device)
    part = torch.ones(n // world, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if op == "send_recv":  # ping-pong between ranks 0 and 1
        def pingpong():
            if rank == 0:
                dist.send(full, 1)
                dist.recv(full, 1)
            elif rank == 1:
                dist.recv(full, 0)
                dist.send(full, 0)
        return pingpong
    raise ValueError(op)


#: compute a collective follows in the in-step measurement: about what a training step runs
#: between two of its collectives (a tensor-parallel half layer, a backward before the gradient sync)
IN_STEP_COMPUTE_S = 1e-3


def _rank0_count(count: int, device) -> int:
    """Rank 0's ``count``, on every rank (each decides from its own timing; all must loop alike)."""
    import torch.distributed as dist
    t = torch.tensor([count], dtype=torch.int32, device=device)
    dist.broadcast(t, 0)
    return int(t.item())


def _per_iteration(body, iters: int, device) -> float:
    """Seconds per call of ``body`` over ``iters`` calls, every rank starting together (barrier)."""
    import torch.distributed as dist
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        body()
    _sync(device)
    return (time.perf_counter() - t0) / iters


def _loop_count(body, device, min_time_s: float) -> int:
    """Calls of ``body`` that fill ``min_time_s`` (3 to 200), from two timed calls on rank 0."""
    per = _per_iteration(body, 2, device)
    return _rank0_count(max(3, min(200, int(min_time_s / max(per, 1e-7)))), device)


def _slowest_rank(seconds: float, device) -> float:
    import torch.distributed as dist
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _compute_burst(device):
    """About IN_STEP_COMPUTE_S of 128^3 GEMMs on this rank, the same count on every rank (rank 0
    times them and broadcasts the count)."""
    a = torch.randn(128, 128, device=device)
    b = torch.randn(128, 128, device=device)
    per = bench(lambda: a @ b, device, 0.05)
    n = _rank0_count(max(1, int(IN_STEP_COMPUTE_S / max(per, 1e-9))), device)

    def burst():
        for _ in range(n):
            a @ b
    return burst


def _in_step_time(fn, burst, device, min_time_s: float) -> tuple[float, float]:
    """(seconds, spread) a collective adds when issued right after a burst of compute, as in a
    training step: the loop (burst, collective) minus the loop of bursts alone, per iteration,
    slowest rank; in ROUNDS rounds (median; the spread is the rounds' range over the paired loop's
    time, as the difference of two loops can be near zero).

    On a shared-core CPU this is well above the back-to-back figure: while a rank computes, the
    communication threads of its process group sleep and must be woken and scheduled when the
    collective starts (measured on the 2-core development machine, gloo, 64 KiB all-reduce, 2
    ranks: 0.57 ms back to back, 0.76-0.85 ms after 0.5-1 ms of compute)."""
    def both():
        burst()
        fn()
    iters = max(3, _loop_count(both, device, min_time_s) // ROUNDS)
    diffs, paired_times = [], []

    def one_round():
        alone, paired = _per_iteration(burst, iters, device), _per_iteration(both, iters, device)
        d = _slowest_rank(max(paired - alone, 1e-9), device)
        paired_times.append(_slowest_rank(paired, device))
        diffs.append(d)
        return d
    best = None
    for _ in range(1 + REMEASURES):   # every rank sees the same slowest-rank figures: same decisions
        diffs.clear()
        paired_times.clear()
        xs = [one_round() for _ in range(ROUNDS)]
        sp = (max(xs) - min(xs)) / statistics.median(paired_times)
        if best is None or sp < best[1]:
            best = (statistics.median(xs), sp)
        if sp <= NOISY_SPREAD:
            break
    return best


#: iterations of the FSDP2 case (every rank runs the same count: the case holds collectives)
FSDP_WARMUP, FSDP_ITERS, FSDP_REPEATS = 3, 10, 3


def _lockstep_time(fn, iters: int, device) -> float:
    """Seconds per call of ``fn`` run ``iters`` times on every rank together: the slowest rank's."""
    import torch.distributed as dist
    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _lockstep_medians(cases: dict, device) -> tuple[dict, dict]:
    """({case: median seconds per call}, {case: the repeats' seconds}) of each zero-argument callable,
    warmed up FSDP_WARMUP times, then FSDP_REPEATS rounds of FSDP_ITERS calls in turn (:func:`_lockstep_time`)."""
    for fn in cases.values():
        for _ in range(FSDP_WARMUP):
            fn()
    got = {k: [] for k in cases}
    for _ in range(FSDP_REPEATS):
        for k, fn in cases.items():
            got[k].append(_lockstep_time(fn, FSDP_ITERS, device))
    return {k: statistics.median(v) for k, v in got.items()}, got


#: transformer blocks in the FSDP2 case's stack (each its own ``fully_shard`` unit, under a root unit)
FSDP_STACK_BLOCKS = 2


def fsdp_rows(device, world: int) -> list[dict]:
    """FSDP2's own cost per wrapped unit and micro-batch, beyond the compute and the collectives it
    runs, measured the way FSDP2 is applied (the validation harness's ZeRO-3, torchtitan): a stack of
    FSDP_STACK_BLOCKS contention blocks, ``fully_shard`` on each block and then on the stack (the
    root), forward + backward, minus the same stack plain, minus each block's two parameter
    all-gathers and one gradient reduce-scatter timed alone at the block's size
    (``all_gather_into_tensor`` / ``reduce_scatter_tensor``), divided by the units (blocks + root).
    What is left is the hooks, the DTensor bookkeeping, the copies in and out of the flat buffers,
    the root's once-per-step work, and what one unit's collectives cost the next unit's compute when
    they overlap (on a CPU they share its cores), which a lone unit never shows; the estimator
    charges it per unit (layers + 1) under ZeRO-3 on this device."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    c = CONTENTION_BLOCK
    blocks = FSDP_STACK_BLOCKS
    cfg = GPTConfig(vocab_size=256, seq_len=c["seq"], hidden=c["hidden"], heads=c["heads"], layers=blocks)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(*[Block(cfg, i, ParallelContext()) for i in range(blocks)]).to(device)
    sharded = copy.deepcopy(plain)
    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    mesh = init_device_mesh(dev, (world,))
    for block in sharded:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    x = torch.randn(c["batch"], c["seq"], c["hidden"], device=device, requires_grad=True)
    numel = sum(p.numel() for p in plain[0].parameters())
    shard = -(-numel // world)
    ag_in = torch.zeros(shard, device=device)
    ag_out = torch.zeros(shard * world, device=device)
    rs_out = torch.zeros(shard, device=device)

    def comm():
        for _ in range(blocks):
            dist.all_gather_into_tensor(ag_out, ag_in)
            dist.all_gather_into_tensor(ag_out, ag_in)
            dist.reduce_scatter_tensor(rs_out, ag_out)

    t, got = _lockstep_medians({"plain": lambda: plain(x).sum().backward(),
                                "fsdp": lambda: sharded(x).sum().backward(), "comm": comm}, device)
    overhead = max(0.0, t["fsdp"] - t["plain"] - t["comm"]) / (blocks + 1)
    return [_row("fsdp", "unit", dev, "float32", world,
                 shape={**c, "blocks": blocks, "params": numel, "fsdp_s": t["fsdp"], "plain_s": t["plain"],
                        "comm_s": t["comm"]},
                 time_s=overhead, spread=spread_of(got["fsdp"])),
            fsdp_adam_row(sharded, device, world)]


def fsdp_adam_row(sharded, device, world: int) -> dict:
    """FSDP2's cost per parameter tensor in the optimizer step: the harness's AdamW
    (:func:`paraplan.validation.apply_zero.make_adamw`) stepping the stack's sharded (DTensor)
    parameters, minus the same AdamW stepping plain tensors of the same local shard shapes and
    gradients; every elementwise op of the update dispatches through DTensor once per tensor, which
    the plain-tensor AdamW fit (``optimizer`` rows) does not see. Seconds per tensor and step."""
    import torch.distributed as dist

    from paraplan.validation.apply_zero import make_adamw
    params = [p for p in sharded.parameters() if p.grad is not None]
    plain = []
    for p in params:
        q = torch.nn.Parameter(p.to_local().detach().clone())
        q.grad = p.grad.to_local().detach().clone()
        plain.append(q)
    t, got = _lockstep_medians({"dtensor": make_adamw(params).step, "plain": make_adamw(plain).step}, device)
    per_tensor = max(0.0, t["dtensor"] - t["plain"]) / max(1, len(params))
    dist.barrier()
    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    return _row("fsdp", "adam_tensor", dev, "float32", world,
                shape={"tensors": len(params), "dtensor_s": t["dtensor"], "plain_s": t["plain"]},
                time_s=per_tensor, spread=spread_of(got["dtensor"]))


def collective_worker(sizes: list[int], out_path: str, min_time_s: float,
                      with_training: bool = True) -> None:
    """Runs on every torchrun rank; rank 0 writes the rows (max time over ranks) to JSON.

    With ``with_training`` every rank first runs :func:`training_rows` at the same time (rows
    at this world size, mean over ranks): what one rank pays while all of them compute."""
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
    else:
        pin_from_env()   # as the validation ranks are
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{local}" if cuda else "cpu"
    rows = []
    if with_training:
        dist.barrier()
        mine = training_rows(ProfileOptions(min_time_s=min_time_s), device, world)
        every = [None] * world
        dist.all_gather_object(every, [r["time_s"] for r in mine])
        for i, r in enumerate(mine):  # the mean over the ranks that ran concurrently
            r.update(_row(r["kind"], r["op"], "cuda" if cuda else "cpu", r["dtype"], world,
                          shape=r["shape"], nbytes=r["bytes"], flops=r["flops"],
                          time_s=statistics.mean(e[i] for e in every), spread=r["spread"]))
        rows += mine
        if world > 1:
            try:
                rows += fsdp_rows(device, world)
            except ImportError:       # a torch without FSDP2 (torch.distributed.fsdp.fully_shard): no figure
                pass
    burst = _compute_burst(device)
    for op in COLLECTIVES:
        for nbytes in sizes:
            fn = _collective_case(op, nbytes, world, rank, device)
            fn()
            # every rank runs the same count, decided up front by rank 0 from two timed calls,
            # then back to back with nothing else in the loop (a per-call agreement, a broadcast
            # say, would add its own latency to every sample)
            iters = max(3, _loop_count(fn, device, min_time_s) // ROUNDS)
            back_to_back = repeated(lambda: _slowest_rank(_per_iteration(fn, iters, device), device))
            in_step = _in_step_time(fn, burst, device, min_time_s)
            n_el = max(world, nbytes // 4 // world * world)
            for (t, sp), extra in ((back_to_back, {}), (in_step, {"after_compute_s": IN_STEP_COMPUTE_S})):
                if op == "send_recv":
                    t /= 2  # one way
                rows.append(_row("collective", op, "cuda" if cuda else "cpu", "float32", world,
                                 shape={"bytes": n_el * 4, **extra}, nbytes=n_el * 4, time_s=t,
                                 bus_factor=BUS_FACTOR[op](world), spread=sp))
    if rank == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, out_path)
    dist.barrier()
    dist.destroy_process_group()


#: tries of one world size's launch: a launch that dies (CI saw a rank end in SIGABRT once, not
#: reproduced in 18 runs since) is run once more, with a warning, rather than losing the profile
LAUNCH_ATTEMPTS = 2


def collective_rows(opts: ProfileOptions, on_world=None) -> list[dict]:
    """Launch one torchrun per world size and collect the collective rows (``on_world(n)`` after each);
    a failed launch is retried once (LAUNCH_ATTEMPTS) with a warning naming the failure."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="paraplan-profile-") as d:
        for world in opts.world_sizes:
            out = os.path.join(d, f"coll{world}.json")
            args = ["--collectives-worker", "--out", out, "--min-time", str(opts.min_time_s),
                    "--sizes", *[str(s) for s in opts.collective_bytes]]
            for attempt in range(1, LAUNCH_ATTEMPTS + 1):
                try:
                    run_torchrun(LaunchOptions(nproc_per_node=world), "paraplan.validation.profile",
                                 args, os.path.join(d, f"torchrun{world}.log"))
                    break
                except WorkerFailed as e:
                    if attempt == LAUNCH_ATTEMPTS:
                        raise
                    why = next((ln.strip() for ln in e.tail.splitlines() if ln.strip()), "no output")
                    print(f"paraplan: warning: the benchmarks at {world} ranks failed (exit {e.returncode}: "
                          f"{why[:200]}); running them once more", file=sys.stderr)
            with open(out) as f:
                rows += json.load(f)
            if on_world is not None:
                on_world(world)
    return rows


#: the per-device benchmark groups, in the order they run
DEVICE_GROUPS = (("GEMMs", gemm_rows), ("Linear GEMMs", linear_rows), ("attention", sdpa_rows),
                 ("memory copies", memory_rows), ("launch", launch_rows),
                 ("device", lambda opts, dev: device_rows(dev)), ("elementwise", elementwise_rows),
                 ("training step costs", training_rows))
PROGRESS_TAG = "@paraplan-progress"


def _local_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _device_rows_here(opts: ProfileOptions, report=None) -> list[dict]:
    """Every per-device benchmark (GEMMs, Linear layouts, SDPA, copies, launch, training rows)
    on the local devices, in this process; ``report(label)`` after each group."""
    rows = []
    threads = torch.get_num_threads()
    # a CPU "device" is one rank as the harness runs it: its intra-op thread count
    torch.set_num_threads(per_rank_threads())
    try:
        for dev in _local_devices():
            for label, group in DEVICE_GROUPS:
                rows += group(opts, dev)
                if report is not None:
                    report(f"{label} ({dev})")
    finally:
        torch.set_num_threads(threads)
    return rows


def summarize(rows: list[dict]) -> list[str]:
    """A few human lines about a profile's rows: best GEMM rate per dtype, the training-layout GEMM
    range, copy bandwidth and per-op cost, collectives per world size (latency at the smallest
    size and bus bandwidth at the largest, in step), and the noise of the repeats."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault(r["kind"], []).append(r)
    for dev in sorted({r["device"] for r in rows if r["kind"] == "gemm"}):
        rates = {}
        for r in by.get("gemm", []):
            if r["device"] == dev and r["flops_per_s"]:
                rates.setdefault(r["dtype"], []).append(r["flops_per_s"])
        if rates:
            lines.append(f"{dev} GEMM a@b, best: " + ", ".join(
                f"{dt} {max(v) / 1e9:.1f} GFLOP/s" for dt, v in sorted(rates.items())))
        lin = [r["flops_per_s"] for r in by.get("gemm_linear", [])
               if r["device"] == dev and r["dtype"] == "float32" and r["flops_per_s"]]
        if lin:
            lines.append(f"{dev} training GEMMs (Linear fwd+bwd layouts, fp32): {min(lin) / 1e9:.1f}"
                         f"-{max(lin) / 1e9:.1f} GFLOP/s")
        copy = [r for r in by.get("memcpy", []) if r["device"] == dev]
        launch = [r for r in by.get("launch", []) if r["device"] == dev]
        if copy or launch:
            parts = ([f"copy {copy[0]['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"] if copy else []) + \
                    ([f"one tiny op {launch[0]['time_s'] * 1e6:.1f} us"] if launch else [])
            lines.append(f"{dev} memory: " + ", ".join(parts))
    coll = [r for r in by.get("collective", []) if "after_compute_s" in (r["shape"] or {})]
    for n in sorted({r["world_size"] for r in coll}):
        ar = sorted((r for r in coll if r["world_size"] == n and r["op"] == "all_reduce"), key=lambda r: r["bytes"])
        if ar:
            lines.append(f"all-reduce at {n} ranks (in step): {ar[0]['time_s'] * 1e3:.2f} ms for "
                         f"{ar[0]['bytes'] >> 10} KiB, {(ar[-1]['bus_bandwidth_bytes_per_s'] or 0) / 1e9:.2f} GB/s "
                         f"bus at {ar[-1]['bytes'] >> 20} MiB")
    noise = profile_noise(rows)
    lines.append(f"noise: {noise.describe()}")
    return lines


def _options_from_json(d: dict) -> ProfileOptions:
    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v
    return ProfileOptions(**{k: tup(v) for k, v in d.items()})


def device_benchmark_rows(opts: ProfileOptions, on_group=None) -> list[dict]:
    """The per-device benchmarks, run in a fresh process with the validation ranks' environment
    (:func:`paraplan.validation.launch.worker_env`: ``OMP_NUM_THREADS`` set before torch starts).

    Why not in this process: a rank starts with one intra-op thread, while this process may have
    started its thread pool wider and then narrowed it (``torch.set_num_threads``), and it holds
    whatever the caller imported. Measured on the 2-core development machine, the per-kernel
    autograd cost came out about 25 % higher in the calling process than in a fresh one with
    ``OMP_NUM_THREADS=1``, which made the world-size-1 figures slower than the same figures
    taken with two ranks busy.

    ``on_group(label)`` is called as each benchmark group ends (the worker says so on stdout)."""
    import subprocess
    from dataclasses import asdict

    with tempfile.TemporaryDirectory(prefix="paraplan-profile-") as d:
        out = os.path.join(d, "device.json")
        cmd = [sys.executable, "-m", "paraplan.validation.profile", "--device-worker", "--out", out,
               "--options", json.dumps(asdict(opts))]
        with open(os.path.join(d, "stderr.log"), "w+") as err:
            proc = subprocess.Popen(cmd, env=worker_env(), stdout=subprocess.PIPE, stderr=err, text=True,
                                    start_new_session=True, preexec_fn=die_with_parent)
            other = []
            try:
                for line in proc.stdout:
                    if line.startswith(PROGRESS_TAG):
                        if on_group is not None:
                            on_group(line[len(PROGRESS_TAG):].strip())
                    else:
                        other.append(line)
                rc = proc.wait()
            finally:
                if proc.poll() is None:   # interrupted: the benchmarks must not run on
                    proc.kill()
                    proc.wait()
            err.seek(0)
            output = "".join(other) + err.read()
        if rc != 0 or not os.path.exists(out):
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise ConfigError("profile", f"the device benchmarks failed (exit {rc}):\n{tail}")
        with open(out) as f:
            return json.load(f)


def placeable_world_sizes(world_sizes, gpus: int | None = None) -> tuple:
    """The collective world sizes this machine can launch: on CUDA one rank per GPU (NCCL refuses two
    ranks on one device), so sizes above the GPU count are left out; on CPU (gloo) every size."""
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else None
    return tuple(w for w in world_sizes if gpus is None or w <= gpus)


def run_profile(opts: ProfileOptions, db: str | None = None,
                collectives: bool = True) -> tuple[int, list[dict]]:
    """Run every benchmark on the local devices and store one run; returns (run_id, rows).

    A progress bar (:mod:`paraplan.progress`) counts the benchmark groups and the collective
    launches; a summary line gives the count, the time and the noise (:func:`profile_noise`)."""
    started = time.time()
    placeable = placeable_world_sizes(opts.world_sizes)
    skipped = sorted(set(opts.world_sizes) - set(placeable))
    if collectives and skipped:
        print(f"paraplan: note: collectives at {', '.join(map(str, skipped))} ranks skipped: NCCL puts one rank "
              f"on each GPU and this machine has {torch.cuda.device_count()}", file=sys.stderr)
    opts = replace(opts, world_sizes=placeable)
    worlds = opts.world_sizes if collectives else ()
    total = len(DEVICE_GROUPS) * len(_local_devices()) + len(worlds)
    with progress.bar(desc=f"profile ({opts.mode})", total=total, unit="group") as b:
        def done(label):
            b.set_postfix_str(f"{label} done", refresh=False)
            b.update(1)
        rows = device_benchmark_rows(opts, on_group=done)
        if collectives:
            rows += collective_rows(opts, on_world=lambda n: done(f"collectives at {n} ranks"))
    store = ProfileStore(db)
    run_id = store.add_run(machine_fingerprint(), opts.mode, rows, started=started)
    noise = profile_noise(rows)
    progress.summary(f"profile: {len(rows)} measurements in {time.time() - started:.1f} s; {noise.describe()}")
    return run_id, rows


def _worker_main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--collectives-worker", action="store_true")
    mode.add_argument("--device-worker", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-time", type=float, default=0.15)
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--no-training", action="store_true")
    ap.add_argument("--options", help="ProfileOptions as JSON (--device-worker)")
    a = ap.parse_args(argv)
    if a.device_worker:
        die_with_parent()
        if not torch.cuda.is_available():
            pin_from_env()   # one core, as validation rank 0 is
        rows = _device_rows_here(_options_from_json(json.loads(a.options)),
                                 report=lambda label: print(PROGRESS_TAG, label, flush=True))
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, a.out)
        return 0
    if not a.sizes:
        ap.error("--collectives-worker needs --sizes")
    die_with_parent()
    collective_worker(a.sizes, a.out, a.min_time, with_training=not a.no_training)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
