"""Kernel reference profile of one CUDA GPU: what the analytical curves of its generation should say.

Run on a machine with one NVIDIA GPU (``python benchmarks/gpu_kernels.py --out DIR``); writes
``DIR/gpu_kernels.json`` after every section, so a run cut short keeps what it measured. Everything
is timed with CUDA events around the kernel alone, after warm-up, median of repeats, on random data,
the repeats queued behind a spin kernel so that short kernels are not timed at the host's launch pace
(:func:`queued_times`); inputs smaller than the L2 cache rotate among several copies so the figures
are not the cache's.

Sections (FLOP conventions as the estimator's, paraplan/costmodels/compute.py and the kernels.py and
attention.py it builds a layer from):

* ``gemm``: bf16 GEMMs of dense transformer layers in their three training layouts (forward
  ``y = x Wᵀ``, dgrad ``dx = dy W``, wgrad ``dW = dyᵀ x``), 2 m n k FLOPs, over hidden sizes,
  tensor-parallel shards and tokens per micro-batch.
* ``gemm_fp8``: ``torch._scaled_mm`` e4m3 x e4m3 -> bf16 in the forward layout, per-tensor and
  row-wise scales.
* ``attention``: causal ``scaled_dot_product_attention`` per backend (flash, cuDNN, memory-efficient,
  math for short sequences), forward and forward + backward, by sequence length, head dim and heads;
  forward FLOPs 4 b h s² d / 2, backward 2.5 x forward.
* ``memory``: a large device copy (read + write bytes) and the eager memory-bound kernels of a layer
  (LayerNorm, RMSNorm, GELU, SiLU·mul, add) forward + backward, with the bytes each must move.
* ``adamw``: ``torch.optim.AdamW(fused=True)`` and the foreach default over fp32 parameters.
* ``layers``: whole transformer layers (the per-rank shard of a tensor-parallel layer, no
  communication) forward + backward in bf16, timed per step and split by kernel class with
  ``torch.profiler`` (GEMM, attention, other), for comparison with ``compute.layer_times``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

RESULT: dict = {"sections": {}, "errors": {}}
DEADLINE = [math.inf]


def write(out_dir: str) -> None:
    path = os.path.join(out_dir, "gpu_kernels.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULT, f, indent=1)
    os.replace(tmp, path)


def late() -> bool:
    return time.monotonic() > DEADLINE[0]


# Repeats queued behind one spin kernel: at most this many, so that their launches (events and kernels)
# stay well inside the CUDA launch queue while the GPU spins (a full queue would block the host).
QUEUED_MAX_REPS = 64
SPIN_CYCLES_PER_S: list = []     # the GPU's torch.cuda._sleep rate, measured once


def spin_cycles_per_s() -> float:
    """Cycles per second of ``torch.cuda._sleep`` on this GPU, timed with CUDA events."""
    if not SPIN_CYCLES_PER_S:
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.cuda._sleep(cycles); e.record(); e.synchronize()
        SPIN_CYCLES_PER_S.append(cycles / (s.elapsed_time(e) / 1e3))
    return SPIN_CYCLES_PER_S[0]


def queued_times(fn, reps: int, hold_s: float = 0.02, tries: int = 3):
    """Per-call seconds of ``fn`` with all ``reps`` calls queued before the GPU reaches them: one spin
    kernel (``torch.cuda._sleep``) holds the stream while the host enqueues an event, the call and an
    event per repeat, so each event pair brackets the call's kernels run back to back. Without it a
    call shorter than the host's own time per Python call (~30-60 us) is timed at the host's pace:
    the GPU idles between the events (without the hold, 167 of the 1200 reference GEMMs came out
    within 2 x the fastest call, 29 us). If the host took longer than the hold, the hold doubles and the batch runs
    again. Returns (times, host seconds to enqueue, whether the hold covered it)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    rate = spin_cycles_per_s()
    for _ in range(tries):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(hold_s * rate))
        t0 = time.perf_counter()
        for i in range(reps):
            starts[i].record(); fn(); ends[i].record()
        enqueue_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        if enqueue_s < hold_s:
            break
        hold_s = 2 * enqueue_s
    return [a.elapsed_time(b) / 1e3 for a, b in zip(starts, ends)], enqueue_s, enqueue_s < hold_s


def bench(fn, device, budget_s=0.04, min_reps=5, max_reps=200) -> float:
    """Median seconds of ``fn`` over repeats (CUDA events), after warm-up; on CUDA the repeats are
    queued behind a spin kernel (:func:`queued_times`), falling back to events around each call
    where ``torch.cuda._sleep`` is missing (``RESULT["timing"]`` says which ran)."""
    for _ in range(2):
        fn()
    if device == "cpu":
        t0 = time.perf_counter(); fn(); one = time.perf_counter() - t0
        reps = max(min_reps, min(max_reps, int(budget_s / max(one, 1e-6))))
        xs = []
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); xs.append(time.perf_counter() - t0)
        return statistics.median(xs)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); e.synchronize()
    one = s.elapsed_time(e) / 1e3
    reps = max(min_reps, min(max_reps, int(budget_s / max(one, 1e-6))))
    if hasattr(torch.cuda, "_sleep"):
        times, enqueue_s, held = queued_times(fn, min(reps, QUEUED_MAX_REPS))
        timing = RESULT.setdefault("timing", {"method": "queued behind torch.cuda._sleep", "calls": 0,
                                              "calls_not_held": 0})
        timing["calls"] += 1
        timing["calls_not_held"] += int(not held)
        return statistics.median(times)
    RESULT["timing"] = {"method": "events around each call (host-paced below ~60 us)"}
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record(); fn(); ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(starts, ends))


def copies(make, nbytes, l2_bytes):
    """Enough independent input sets that rotating among them defeats the L2 cache."""
    n = 1 if nbytes > 4 * l2_bytes else min(8, math.ceil(4 * l2_bytes / max(nbytes, 1)))
    return [make() for _ in range(n)]


class Rotating:
    def __init__(self, sets, body):
        self.sets, self.body, self.i = sets, body, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.sets)
        return self.body(*self.sets[self.i])


def environment(device) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        env.update(name=p.name, sms=p.multi_processor_count, memory_bytes=p.total_memory,
                   l2_bytes=getattr(p, "L2_cache_size", None), capability=list(torch.cuda.get_device_capability()),
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit,temperature.gpu",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:  # noqa: BLE001 - informational only
            env["nvidia_smi"] = repr(exc)
    return env


# ------------------------------------------------------------------ GEMMs

LAYER_SHAPES = {  # name: (hidden, ffn per GEMM output, kv hidden, gelu/swiglu)
    "h2048": (2048, 8192, 2048, "gelu"),
    "h4096": (4096, 14336, 1024, "swiglu"),
    "h5120": (5120, 20480, 5120, "gelu"),
    "h8192": (8192, 28672, 1024, "swiglu"),
    "h12288": (12288, 49152, 12288, "gelu"),
}


def layer_gemms(hidden, ffn, kv, act, tp):
    """(label, n, k) of a layer's four forward GEMMs on one tensor-parallel rank (y[m,n] = x[m,k] Wᵀ)."""
    mlp_out = (2 if act == "swiglu" else 1) * ffn // tp
    return [("qkv", (hidden + 2 * kv) // tp, hidden), ("proj", hidden, hidden // tp),
            ("fc1", mlp_out, hidden), ("fc2", hidden, ffn // tp)]


def layer_gemm_cases(shapes, tps, tokens):
    """(layer, tp, gemm, m, n, k) of every layer shape's forward GEMMs on each tp rank for each token
    count, until the run's deadline (:func:`late`)."""
    for name, (h, f, kv, act) in shapes.items():
        for tp in tps:
            for label, n, k in layer_gemms(h, f, kv, act, tp):
                for m in tokens:
                    if late():
                        return
                    yield name, tp, label, m, n, k


def gemm_section(device, dtype, tokens, tps, l2, smoke=False) -> list[dict]:
    rows = []
    shapes = LAYER_SHAPES if not smoke else {"h256": (256, 1024, 256, "gelu")}
    for name, tp, label, m, n, k in layer_gemm_cases(shapes, tps, tokens):
        el = 2
        def make():
            return (torch.randn(m, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype),
                    torch.randn(m, n, device=device, dtype=dtype))
        sets = copies(make, el * (m * k + n * k + m * n), l2)
        for layout, body in (("fwd", lambda x, w, g: F.linear(x, w)),
                             ("dgrad", lambda x, w, g: torch.mm(g, w)),
                             ("wgrad", lambda x, w, g: torch.mm(g.t(), x))):
            t = bench(Rotating(sets, body), device)
            rows.append({"layer": name, "tp": tp, "gemm": label, "layout": layout, "m": m, "n": n, "k": k,
                         "time_s": t, "tflops": 2 * m * n * k / t / 1e12})
        del sets
    return rows


def fp8_section(device, tokens, tps, l2) -> list[dict]:
    rows = []
    e4 = torch.float8_e4m3fn
    for name, tp, label, m, n, k in layer_gemm_cases(LAYER_SHAPES, tps, tokens):
        def make():
            a = torch.randn(m, k, device=device).to(e4)
            b = torch.randn(n, k, device=device).to(e4)
            return a, b
        sets = copies(make, m * k + n * k + 2 * m * n, l2)
        one = torch.ones((), device=device, dtype=torch.float32)
        sa, sb = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)
        for recipe, body in (
                ("tensorwise", lambda a, b: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16)),
                ("rowwise", lambda a, b: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16))):
            try:
                t = bench(Rotating(sets, body), device)
            except Exception as exc:  # noqa: BLE001 - recorded, the section goes on
                rows.append({"layer": name, "tp": tp, "gemm": label, "recipe": recipe, "m": m, "n": n,
                             "k": k, "error": repr(exc)[:200]})
                continue
            rows.append({"layer": name, "tp": tp, "gemm": label, "recipe": recipe, "m": m, "n": n, "k": k,
                         "time_s": t, "tflops": 2 * m * n * k / t / 1e12})
        del sets
    return rows


# ------------------------------------------------------------------ attention

def attention_cases(smoke=False):
    if smoke:
        return [(2, 4, 128, 64)]
    cases = []
    for d in (128, 64):
        heads = 32 if d == 128 else 64
        for s in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
            if d == 64 and s > 32768:
                continue
            cases.append((max(1, 16384 // s), heads, s, d))
    for s in (4096, 16384):
        for heads in (4, 8, 16, 64):
            cases.append((1, heads, s, 128))
    return cases


def attention_section(device, smoke=False) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    rows = []
    for b, heads, s, d in attention_cases(smoke):
        q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn(b, heads, s, d, device=device, dtype=dtype)
        flops_fwd = 4 * b * heads * s * s * d / 2
        for name, backend in backends.items():
            if late():
                return rows
            if name == "math" and (s > 4096 or b * heads * s * s * 4 > 8e9):
                continue
            row = {"backend": name, "batch": b, "heads": heads, "seq": s, "head_dim": d, "flops_fwd": flops_fwd}
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwd_bwd():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        out.backward(g)
                    tf = bench(fwd, device, budget_s=0.1, min_reps=3)
                    tfb = bench(fwd_bwd, device, budget_s=0.2, min_reps=3)
                q.grad = k.grad = v.grad = None
                row.update(fwd_s=tf, fwd_bwd_s=tfb, bwd_s=tfb - tf, fwd_tflops=flops_fwd / tf / 1e12,
                           bwd_tflops=2.5 * flops_fwd / max(tfb - tf, 1e-9) / 1e12,
                           fwd_bwd_tflops=3.5 * flops_fwd / tfb / 1e12)
            except Exception as exc:  # noqa: BLE001 - a backend that refuses a shape is a result
                row["error"] = repr(exc)[:200]
            rows.append(row)
        del q, k, v, g
        if device != "cpu":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ memory-bound kernels and AdamW

def memory_section(device, tokens, hidden, l2) -> list[dict]:
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    el = torch.tensor([], dtype=dtype).element_size()
    rows = []
    big = 1 << 30 if device != "cpu" else 1 << 24
    src = torch.empty(big // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), device)
    rows.append({"op": "copy", "bytes": 2 * big, "time_s": t, "gb_per_s": 2 * big / t / 1e9})
    del src, dst
    n = tokens * hidden
    w = torch.randn(hidden, device=device, dtype=dtype, requires_grad=True)
    bias = torch.randn(hidden, device=device, dtype=dtype, requires_grad=True)

    def fb(f, *shapes, grads=True):
        xs = [torch.randn(*sh, device=device, dtype=dtype, requires_grad=grads) for sh in shapes]
        g = torch.randn(tokens, hidden, device=device, dtype=dtype)

        def fwd():
            with torch.no_grad():
                return f(*xs)

        def both():
            f(*xs).backward(g)
        return bench(fwd, device), bench(both, device)
    cases = {
        # op: (function, input shapes, bytes forward, bytes backward) -- the fewest each must move
        "layer_norm": (lambda x: F.layer_norm(x, (hidden,), w, bias), [(tokens, hidden)], 2 * n * el, 3 * n * el),
        "rms_norm": (lambda x: F.rms_norm(x, (hidden,), w), [(tokens, hidden)], 2 * n * el, 3 * n * el),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(tokens, hidden)], 2 * n * el, 3 * n * el),
        "gelu": (lambda x: F.gelu(x), [(tokens, hidden)], 2 * n * el, 3 * n * el),
        "silu_mul": (lambda a, b: F.silu(a) * b, [(tokens, hidden), (tokens, hidden)], 3 * n * el, 5 * n * el),
        "add": (lambda a, b: a + b, [(tokens, hidden), (tokens, hidden)], 3 * n * el, 3 * n * el),
    }
    for op, (f, shapes, bf, bb) in cases.items():
        if late():
            break
        tf, tfb = fb(f, *shapes)
        rows.append({"op": op, "tokens": tokens, "hidden": hidden, "fwd_s": tf, "fwd_bwd_s": tfb,
                     "bytes_fwd": bf, "bytes_bwd": bb, "fwd_gb_per_s": bf / tf / 1e9,
                     "bwd_gb_per_s": bb / max(tfb - tf, 1e-9) / 1e9})
    return rows


def adamw_section(device, params=256 << 20, tensors=64) -> list[dict]:
    rows = []
    per = params // tensors
    ps = [torch.nn.Parameter(torch.randn(per, device=device)) for _ in range(tensors)]
    for p in ps:
        p.grad = torch.randn_like(p)
    for name, kw in (("fused", {"fused": True}), ("foreach", {"foreach": True})):
        if device == "cpu" and name == "fused":
            continue
        opt = torch.optim.AdamW(ps, lr=1e-4, **kw)
        t = bench(opt.step, device, budget_s=0.3, min_reps=3)
        rows.append({"impl": name, "params": per * tensors, "tensors": tensors, "time_s": t,
                     "ns_per_param": t / (per * tensors) * 1e9,
                     "gb_per_s_at_16B": 16 * per * tensors / t / 1e9, "gb_per_s_at_28B": 28 * per * tensors / t / 1e9})
        del opt
    return rows


# ------------------------------------------------------------------ whole layers

LAYER_CASES = [  # label, hidden, heads (rank), kv heads (rank), head dim, ffn (rank), act, norm, seq, batch, tp
    ("llama3-8b tp1 s8192", 4096, 32, 8, 128, 14336, "swiglu", "rms", 8192, 1, 1),
    ("llama3-8b tp1 s32768", 4096, 32, 8, 128, 14336, "swiglu", "rms", 32768, 1, 1),
    ("llama3-70b tp8 s8192", 8192, 8, 1, 128, 3584, "swiglu", "rms", 8192, 1, 8),
    ("llama3-70b tp4 s4096 b2", 8192, 16, 2, 128, 7168, "swiglu", "rms", 4096, 2, 4),
    ("gpt3-175b tp8 s2048", 12288, 12, 12, 128, 6144, "gelu", "layernorm", 2048, 1, 8),
    ("gpt-13b tp1 s2048 b2", 5120, 40, 40, 128, 20480, "gelu", "layernorm", 2048, 2, 1),
    ("gpt-13b tp2 s2048 b4", 5120, 20, 20, 128, 10240, "gelu", "layernorm", 2048, 4, 2),
]


class Layer(torch.nn.Module):
    """The per-rank shard of a pre-norm decoder layer: norm, QKV, RoPE (Llama), causal SDPA,
    output projection, residual, norm, MLP (SwiGLU or GELU), residual; no communication."""

    def __init__(self, hidden, heads, kv, hd, ffn, act, norm, device, dtype, linear=F.linear):
        super().__init__()
        self.linear = linear
        self.heads, self.kv, self.hd, self.act, self.norm = heads, kv, hd, act, norm
        mk = lambda o, i: torch.nn.Parameter(torch.randn(o, i, device=device, dtype=dtype) * i ** -0.5)
        self.qkv = mk((heads + 2 * kv) * hd, hidden)
        self.proj = mk(hidden, heads * hd)
        self.fc1 = mk((2 if act == "swiglu" else 1) * ffn, hidden)
        self.fc2 = mk(hidden, ffn)
        self.n1 = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.n2 = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.b1 = torch.nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype))
        self.b2 = torch.nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype))

    def _norm(self, x, w, b):
        h = x.shape[-1]
        return F.rms_norm(x, (h,), w) if self.norm == "rms" else F.layer_norm(x, (h,), w, b)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.linear(self._norm(x, self.n1, self.b1), self.qkv)
        q, k, v = qkv.split([self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
        if self.norm == "rms":  # Llama: rotary embeddings (rotate-half form, eager)
            def rope(t):
                t1, t2 = t.chunk(2, dim=-1)
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin
            q, k = rope(q), rope(k)
        if self.kv != self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.linear(o.transpose(1, 2).reshape(b, s, self.heads * self.hd), self.proj)
        u = self.linear(self._norm(x, self.n2, self.b2), self.fc1)
        if self.act == "swiglu":
            a, g = u.chunk(2, dim=-1)
            u = F.silu(a) * g
        else:
            u = F.gelu(u, approximate="tanh")
        return x + self.linear(u, self.fc2)


def kernel_class(name: str) -> str:
    n = name.lower()
    if any(t in n for t in ("flash", "fmha", "attn", "attention", "cudnn_generated")):
        return "attention"
    if any(t in n for t in ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "ampere_", "cublas", "matmul")):
        return "gemm"
    return "other"


def device_time_by_class(step, steps=3) -> dict:
    """Kernel time of one ``step`` by class (GEMM, attention, other), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if "cuda" not in str(getattr(ev, "device_type", "")).lower():
            continue
        c = kernel_class(ev.key)
        out[c] = out.get(c, 0.0) + (getattr(ev, "self_device_time_total", 0) or 0) / steps / 1e6
    return out


def layers_section(device, smoke=False, backend=None) -> list[dict]:
    """Whole layers; ``backend`` (flash, cudnn, efficient) pins SDPA's kernel, else torch chooses."""
    import contextlib
    if backend:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        pin = sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                            "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]])
    else:
        pin = contextlib.nullcontext()
    with pin:
        rows = _layers(device, smoke)
    for r in rows:
        r["sdpa_backend"] = backend or "default"
    return rows


def _layers(device, smoke=False) -> list[dict]:
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    rows = []
    cases = LAYER_CASES if not smoke else [("tiny", 256, 4, 2, 64, 512, "swiglu", "rms", 128, 1, 1)]
    for label, h, heads, kv, hd, ffn, act, norm, s, b, tp in cases:
        if late():
            break
        row = {"label": label, "hidden": h, "heads": heads, "kv_heads": kv, "head_dim": hd, "ffn": ffn, "act": act,
               "norm": norm, "seq": s, "batch": b, "tp": tp}
        try:
            layer = Layer(h, heads, kv, hd, ffn, act, norm, device, dtype)
            x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
            g = torch.randn(b, s, h, device=device, dtype=dtype)
            pos = torch.arange(s, device=device, dtype=torch.float32)[:, None] * \
                (10000 ** (-torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))[None]
            cos, sin = (torch.cat([f(pos)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))

            def fwd():
                with torch.no_grad():
                    return layer(x, cos, sin)

            def step():
                layer(x, cos, sin).backward(g)
            row["fwd_s"] = bench(fwd, device, budget_s=0.2, min_reps=5)
            row["fwd_bwd_s"] = bench(step, device, budget_s=0.4, min_reps=5)
            if device != "cpu":
                torch.cuda.reset_peak_memory_stats()
                step(); torch.cuda.synchronize()
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
            with profile(activities=acts) as prof:
                for _ in range(3):
                    step()
                if device != "cpu":
                    torch.cuda.synchronize()
            by_class, names = {}, {}
            for ev in prof.key_averages():
                if "cuda" not in str(getattr(ev, "device_type", "")).lower():
                    continue   # CPU-side ops carry their kernels' time too: count the kernels alone
                dev_us = getattr(ev, "self_device_time_total", None)
                if dev_us is None:
                    dev_us = getattr(ev, "self_cuda_time_total", 0)
                if not dev_us or device == "cpu":
                    continue
                c = kernel_class(ev.key)
                by_class[c] = by_class.get(c, 0.0) + dev_us / 3 / 1e6
                names[ev.key[:90]] = round(dev_us / 3 / 1e6, 7)
            row["device_time_by_class_s"] = by_class
            row["kernels"] = dict(sorted(names.items(), key=lambda kv_: -kv_[1])[:40])
            del layer, x, g
        except Exception as exc:  # noqa: BLE001 - recorded, the next case goes on
            row["error"] = repr(exc)[:300]
            row["trace"] = traceback.format_exc()[-1500:]
        rows.append(row)
        if device != "cpu":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ MoE expert GEMMs

MOE_CASES = [  # label, hidden, expert ffn (per GEMM output of the up projection: 2 x for SwiGLU), local experts
    ("deepseek-v3 ep8", 7168, 2048, 32),
    ("deepseek-v3 ep32", 7168, 2048, 8),
    ("mixtral-8x7b ep1", 4096, 14336, 8),
    ("mixtral-8x7b ep8", 4096, 14336, 1),
    ("qwen3-30b-a3b ep8", 2048, 768, 16),
]


def moe_section(device) -> list[dict]:
    """The routed experts' up (x·W1ᵀ, 2·ffn wide) and down GEMMs of one GPU, bf16, at balanced tokens
    per expert: as one grouped GEMM (``torch._grouped_mm``, one launch for all local experts) and as a
    loop of per-expert ``torch.mm`` (what the estimator prices today)."""
    rows = []
    for label, h, ffn, local in MOE_CASES:
        for m in (128, 512, 2048, 8192):
            if late() or m * local > 262144:
                continue
            row = {"label": label, "hidden": h, "ffn": ffn, "local_experts": local, "tokens_per_expert": m}
            for name, (k, n) in (("up", (h, 2 * ffn)), ("down", (ffn, h))):
                x = torch.randn(m * local, k, device=device, dtype=torch.bfloat16)
                w = torch.randn(local, n, k, device=device, dtype=torch.bfloat16)
                offs = torch.arange(1, local + 1, device=device, dtype=torch.int32) * m
                xs = list(x.split(m))
                loop = lambda: [torch.mm(xi, w[i].t()) for i, xi in enumerate(xs)]
                row[f"{name}_loop_s"] = bench(loop, device)
                try:
                    wt = w.transpose(-2, -1)
                    grouped = lambda: torch._grouped_mm(x, wt, offs=offs, out_dtype=torch.bfloat16)
                    row[f"{name}_grouped_s"] = bench(grouped, device)
                except Exception as exc:  # noqa: BLE001 - recorded
                    row[f"{name}_grouped_error"] = repr(exc)[:200]
                row[f"{name}_flops"] = 2.0 * m * local * k * n
                del x, w, xs
            rows.append(row)
    return rows


# ------------------------------------------------------------------ fp8 linear layers

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def quantize(t, dtype, max_value):
    """Current per-tensor scaling: amax of the tensor, scale to the format's range, cast."""
    amax = t.abs().amax().float()
    scale = max_value / torch.clamp(amax, min=1e-12)
    return (t.float() * scale).clamp(-max_value, max_value).to(dtype), scale.reciprocal()


def quantize_transposed(t, dtype, max_value):
    """:func:`quantize` that also writes the transposed fp8 copy (Transformer Engine's cast-transpose)."""
    q, inv = quantize(t, dtype, max_value)
    return q, q.t().contiguous(), inv


def fp8_linear_fn(quant, cast_transpose: bool = False):
    """``F.linear`` with its three GEMMs in fp8 (``torch._scaled_mm``, per-tensor current scaling;
    e4m3 activations and weights, e5m2 gradients). cuBLAS's fp8 GEMMs are TN-only, so dgrad needs the
    transposed weight and wgrad both operands transposed: with ``cast_transpose`` those copies come
    out of the quantization itself (``quant`` returns (q, qᵀ, 1/scale), as Transformer Engine's
    cast-transpose kernel); without, ``quant`` returns (q, 1/scale) and the backward transposes."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2

    def quantized(t, dtype, max_value):
        """(q, what the backward transposes or has transposed already, 1/scale)."""
        if cast_transpose:
            q, qt, inv = quant(t, dtype, max_value)
            return q, qt, inv
        q, inv = quant(t, dtype, max_value)
        return q, q, inv

    def transposed(kept):
        return kept if cast_transpose else kept.t().contiguous()

    class Fp8Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            shape = x.shape
            xq, x_kept, xs = quantized(x.reshape(-1, shape[-1]), e4, E4M3_MAX)
            wq, w_kept, ws = quantized(w, e4, E4M3_MAX)
            y = torch._scaled_mm(xq, wq.t(), xs, ws, out_dtype=torch.bfloat16)
            ctx.save_for_backward(x_kept, w_kept, xs, ws)
            ctx.shape = shape
            return y.view(*shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, gy):
            x_kept, w_kept, xs, ws = ctx.saved_tensors
            gq, g_kept, gs = quantized(gy.reshape(-1, gy.shape[-1]), e5, E5M2_MAX)
            dx = torch._scaled_mm(gq, transposed(w_kept).t(), gs, ws, out_dtype=torch.bfloat16)
            dw = torch._scaled_mm(transposed(g_kept), transposed(x_kept).t(), gs, xs, out_dtype=torch.bfloat16)
            return dx.view(ctx.shape), dw

    return Fp8Linear.apply


def layers_fp8_section(device) -> list[dict]:
    """bf16 against fp8 linears (eager casts, and casts compiled by torch.compile into one amax
    and one scale-cast kernel each, as Transformer Engine's fused kernels) in the same layers."""
    rows = []
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 256   # one compilation per operand shape
    torch._dynamo.config.cache_size_limit = 256
    variants = {"bf16": F.linear, "fp8_eager": fp8_linear_fn(quantize),
                "fp8_compiled": fp8_linear_fn(torch.compile(quantize, dynamic=False)),
                "fp8_cast_transpose": fp8_linear_fn(torch.compile(quantize_transposed, dynamic=False),
                                                    cast_transpose=True)}
    for label, h, heads, kv, hd, ffn, act, norm, s, b, tp in [LAYER_CASES[i] for i in (0, 2, 5)]:
        row = {"label": label, "hidden": h, "heads": heads, "kv_heads": kv, "head_dim": hd, "ffn": ffn,
               "act": act, "norm": norm, "seq": s, "batch": b, "tp": tp}
        for name, lin in variants.items():
            if late():
                break
            try:
                layer = Layer(h, heads, kv, hd, ffn, act, norm, device, torch.bfloat16, linear=lin)
                x = torch.randn(b, s, h, device=device, dtype=torch.bfloat16, requires_grad=True)
                g = torch.randn(b, s, h, device=device, dtype=torch.bfloat16)
                pos = torch.arange(s, device=device, dtype=torch.float32)[:, None] * \
                    (10000 ** (-torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))[None]
                cos, sin = (torch.cat([f(pos)] * 2, dim=-1).to(torch.bfloat16) for f in (torch.cos, torch.sin))

                def step():
                    layer(x, cos, sin).backward(g)
                for _ in range(3):
                    step()
                row[name + "_fwd_bwd_s"] = bench(step, device, budget_s=0.4, min_reps=5)
                row[name + "_device_time_by_class_s"] = device_time_by_class(step)
                del layer, x, g
            except Exception as exc:  # noqa: BLE001 - recorded
                row[name + "_error"] = repr(exc)[:300]
                row[name + "_trace"] = traceback.format_exc()[-1200:]
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new measurements after this")
    ap.add_argument("--sections", default="env,layers,attention,gemm,memory,adamw,gemm_fp8")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the script)")
    ap.add_argument("--sdpa-backend", choices=("flash", "cudnn", "efficient"),
                    help="pin the layers' attention kernel (default: torch's choice)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    DEADLINE[0] = t0 + a.budget_s
    device = "cuda" if torch.cuda.is_available() else "cpu"
    RESULT["environment"] = environment(device)
    torch.manual_seed(0)
    l2 = (RESULT["environment"].get("l2_bytes") or 50e6)
    tokens = (1024, 2048, 4096, 8192, 16384) if not a.smoke else (64,)
    tps = (1, 2, 4, 8) if not a.smoke else (1,)
    runners = {
        "layers": lambda: layers_section(device, a.smoke, a.sdpa_backend),
        "attention": lambda: attention_section(device, a.smoke),
        "gemm": lambda: gemm_section(device, torch.bfloat16 if device != "cpu" else torch.float32, tokens, tps, l2,
                                     a.smoke),
        "memory": lambda: memory_section(device, 8192 if not a.smoke else 64, 8192 if not a.smoke else 256, l2),
        "adamw": lambda: adamw_section(device, params=(256 << 20) if not a.smoke else (1 << 16)),
        "gemm_fp8": lambda: fp8_section(device, tokens, tps, l2) if device != "cpu" else [],
        "layers_fp8": lambda: layers_fp8_section(device) if device != "cpu" else [],
        "moe": lambda: moe_section(device) if device != "cpu" else [],
    }
    for name in a.sections.split(","):
        if name == "env" or name not in runners:
            continue
        if late():
            RESULT["errors"][name] = "skipped: out of time"
            continue
        s0 = time.monotonic()
        try:
            RESULT["sections"][name] = runners[name]()
        except Exception:  # noqa: BLE001 - keep the other sections
            RESULT["errors"][name] = traceback.format_exc()[-2000:]
        RESULT.setdefault("seconds", {})[name] = round(time.monotonic() - s0, 1)
        print(f"{name}: {RESULT['seconds'][name]} s, {len(RESULT['sections'].get(name, []))} rows", flush=True)
        write(a.out)
    write(a.out)
    print(json.dumps(RESULT["environment"]))
    for r in RESULT["sections"].get("layers", []):
        print(r["label"], r.get("fwd_s"), r.get("fwd_bwd_s"), r.get("device_time_by_class_s"), r.get("error", ""))
    for r in RESULT["sections"].get("layers_fp8", []):
        print({k: v for k, v in r.items() if not k.endswith("_trace")})
    for r in RESULT["sections"].get("moe", []):
        print(r)
    print("errors:", {k: v[-300:] for k, v in RESULT["errors"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
