"""Data parallelism with ZeRO sharding (Rajbhandari et al. 2020, "ZeRO", sec. 5).

* stage 0: plain DP, gradients all-reduced (averaged) over dp, every rank runs AdamW on all
  of its parameters.
* stage 1 (P_os): parameters live in one flat buffer; gradients are all-reduced, each dp rank
  keeps AdamW states for its 1/dp slice only, updates that slice and all-gathers the buffer.
* stage 2 (P_os+g): as stage 1 but gradients are reduce-scattered, so a rank holds only its
  gradient slice after the sync.
* stage 3 (P_os+g+p): parameters sharded too, via FSDP2 ``fully_shard`` per block (parameters
  all-gathered before each block's forward and backward, gradients reduce-scattered).
* optimizer offload (ZeRO-Offload, Ren et al. 2021, sec. 4; stages 1-2): the rank's fp32 master
  slice and AdamW's states live in host memory; each step copies the gradient slice to the host,
  steps AdamW there and copies the updated slice back before the all-gather. On a CPU device the
  host is the same memory, and the two copies are what remains of the transfers.

Memory accounting reports bytes held by this rank: parameters, gradients after the
data-parallel sync (full gradients that exist transiently during backward under stage 2 are
not counted) and optimizer states.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraplan.errors import ConfigError
from paraplan.validation import comm

ZERO_STAGES = (0, 1, 2, 3)


def local_nbytes(t) -> int:
    """Bytes of the local part of a tensor (DTensor-aware)."""
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def make_adamw(params, lr: float = 1e-3, weight_decay: float = 0.01):
    """The one AdamW configuration used by both the reference and the parallel runs."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=weight_decay, foreach=False)


class ZeroOptimizer:
    """Gradient sync over ``dp_group`` plus AdamW for ZeRO stages 0, 1 and 2.

    Parameters
    ----------
    named_params : list of (str, Parameter)
        This rank's parameters (tp shards of this pipeline stage) in a fixed order.
    dp_group : ProcessGroup or None
    stage : int
        0, 1 or 2 (stage 3 uses :func:`apply_fsdp` and a plain AdamW).
    """

    def __init__(self, named_params, dp_group, stage: int, lr: float = 1e-3,
                 weight_decay: float = 0.01, offload: bool = False, divisor: int | None = None):
        if stage not in (0, 1, 2):
            raise ConfigError("zero", f"ZeroOptimizer handles stages 0-2, got {stage}",
                              accepted="0, 1, 2")
        if offload and stage == 0:
            raise ConfigError("offload", "optimizer offload shards the optimizer: it needs ZeRO 1 or 2",
                              accepted="zero 1, 2")
        self.offload = offload
        self.host_grad = None
        self.named = list(named_params)
        self.params = [p for _, p in self.named]
        self.group = dp_group
        self.dp = 1 if dp_group is None else dist.get_world_size(dp_group)
        self.rank = 0 if dp_group is None else dist.get_rank(dp_group)
        #: what the summed gradients are divided by: the group's size, or (experts under ep) every
        #: data-parallel rank whose loss the local gradients already sum over (dp·cp)
        self.divisor = self.dp if divisor is None else divisor
        self.stage = stage
        self.grad_shard = None
        if stage == 0:
            self.opt = make_adamw(self.params, lr, weight_decay)
            return
        numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-numel // self.dp)
        dtype = self.params[0].dtype
        self.flat = torch.zeros(self.shard_numel * self.dp, dtype=dtype,
                                device=self.params[0].device)
        off = 0
        for p in self.params:  # params become views into the flat buffer (no copy kept)
            n = p.numel()
            self.flat[off:off + n].copy_(p.data.reshape(-1))
            p.data = self.flat[off:off + n].view_as(p)
            off += n
        self.numel = numel
        lo = self.rank * self.shard_numel
        self.shard = nn.Parameter(self.flat[lo:lo + self.shard_numel])
        if offload:   # the master slice and AdamW's states in (pinned, on CUDA) host memory
            pin = self.flat.is_cuda
            self.host_shard = nn.Parameter(torch.empty(self.shard_numel, dtype=dtype, pin_memory=pin))
            self.host_shard.data.copy_(self.shard.data)
            self.host_grad = torch.empty(self.shard_numel, dtype=dtype, pin_memory=pin)
            self.opt = make_adamw([self.host_shard], lr, weight_decay)
        else:
            self.opt = make_adamw([self.shard], lr, weight_decay)

    def _flat_grad(self) -> torch.Tensor:
        """Every local gradient in one flat tensor (padded to dp equal slices under stages 1-2):
        one pass over the gradients, the copy DDP makes into its buckets. Under stages 0-1, which
        hold the whole gradient after the sync anyway, the flat tensor is allocated once and kept,
        as DDP's buckets and Megatron-LM's gradient buffer are: a fresh one each step above glibc's
        32 MiB mmap ceiling comes from the kernel page by page, and its first-touch faults cost the
        default MoE model's 74 MB of gradients ~40 ms a step on the 2-core VM (measured: "other"
        77 ms against 33 predicted), what no engine pays. Stage 2 keeps only its slice after the
        sync, so its flat tensor is not kept."""
        grads = [p.grad.reshape(-1) for p in self.params]
        pad = self.shard_numel * self.dp - self.numel if self.stage else 0
        if pad:
            grads.append(grads[0].new_zeros(pad))
        if self.stage == 2:
            return torch.cat(grads)
        total = sum(g.numel() for g in grads)
        buf = getattr(self, "grad_buffer", None)
        if buf is None or buf.numel() != total or buf.dtype != grads[0].dtype or buf.device != grads[0].device:
            buf = self.grad_buffer = torch.empty(total, dtype=grads[0].dtype, device=grads[0].device)
        return torch.cat(grads, out=buf)

    def sync_grads(self) -> None:
        """Average gradients over dp: all-reduce (stages 0, 1) or reduce-scatter (stage 2) of the
        flat gradient, scaled by 1/dp in place; parameters' gradients (stage 0) and the rank's
        slice (stages 1, 2) become views of the result, not copies (as DDP's
        ``gradient_as_bucket_view``)."""
        flat = self._flat_grad()
        lo = self.rank * getattr(self, "shard_numel", 0)
        with comm.timed("dp_comm"):
            if self.stage == 2 and self.dp > 1:
                out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
                dist.reduce_scatter_tensor(out, flat, group=self.group)
                flat = None
            elif self.dp > 1:
                dist.all_reduce(flat, group=self.group)
                out = flat
            else:
                out = flat
        if self.divisor > 1:
            out.div_(self.divisor)
        if self.stage == 0:
            off = 0
            for p in self.params:
                p.grad = out[off:off + p.numel()].view_as(p)
                off += p.numel()
            return
        if self.stage == 2 and self.dp > 1:
            self.grad_shard = out
        else:
            self.grad_shard = out[lo:lo + self.shard_numel]
        if self.stage == 2:
            for p in self.params:  # only the slice is kept
                p.grad = None

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Averaged gradient of every local parameter, unsharded over dp (debug/testing)."""
        if self.stage == 0:
            return {n: p.grad.detach().clone() for n, p in self.named}
        full = torch.empty_like(self.flat)
        if self.dp > 1:
            dist.all_gather_into_tensor(full, self.grad_shard.contiguous(), group=self.group)
        else:
            full.copy_(self.grad_shard)
        out, off = {}, 0
        for n, p in self.named:
            out[n] = full[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        return out

    def step(self) -> None:
        """AdamW on this rank's parameters (stage 0) or slice, then all-gather (stages 1, 2)."""
        if self.stage == 0:
            self.opt.step()
            return
        if self.offload:   # gradient slice down, AdamW on the host, updated slice back
            self.host_grad.copy_(self.grad_shard)
            self.host_shard.grad = self.host_grad
            self.opt.step()
            self.host_shard.grad = None
            self.shard.data.copy_(self.host_shard.data)
        else:
            self.shard.grad = self.grad_shard
            self.opt.step()
            self.shard.grad = None
        self.grad_shard = None
        if self.dp > 1:
            with comm.timed("dp_comm"):
                dist.all_gather_into_tensor(self.flat, self.shard.detach().clone(),
                                            group=self.group)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of AdamW's states on the device (none under offload: they live in host memory)."""
        return 0 if self.offload else optimizer_state_bytes(self.opt)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds: parameters, gradients (after sync), optimizer states."""
        params = sum(local_nbytes(p) for p in self.params)
        if self.stage == 0:
            grads = sum(local_nbytes(p.grad) for p in self.params)
        elif self.stage == 1:
            grads = sum(p.numel() * p.element_size() for p in self.params)
        else:
            grads = local_nbytes(self.grad_shard) if self.grad_shard is not None else \
                self.shard_numel * self.flat.element_size()
        return {"parameters": params, "gradients": grads, "optimizer_states": self.state_bytes()}

    def host_memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in host memory under offload: the fp32 master slice, its gradient
        buffer and AdamW's states (empty without offload)."""
        if not self.offload:
            return {}
        return {"master_parameters": local_nbytes(self.host_shard), "gradients": local_nbytes(self.host_grad),
                "optimizer_states": optimizer_state_bytes(self.opt)}


def optimizer_state_bytes(opt) -> int:
    """Bytes of every tensor in an optimizer's state (exp_avg, exp_avg_sq, step)."""
    return sum(local_nbytes(v) for st in opt.state.values() for v in st.values()
               if torch.is_tensor(v))


def apply_fsdp(stage_module: nn.Module, dp_mesh) -> nn.Module:
    """ZeRO-3: ``fully_shard`` every block and then the stage (root) over ``dp_mesh``."""
    from torch.distributed.fsdp import fully_shard
    for block in stage_module.blocks.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(stage_module, mesh=dp_mesh)
    return stage_module


class FsdpOptimizer:
    """ZeRO-3 counterpart of :class:`ZeroOptimizer` (FSDP2 does the gradient sync)."""

    stage = 3

    def __init__(self, named_params, lr: float = 1e-3, weight_decay: float = 0.01):
        self.named = list(named_params)
        self.params = [p for _, p in self.named]
        self.opt = make_adamw(self.params, lr, weight_decay)

    def sync_grads(self) -> None:
        """Nothing to do: FSDP2 reduce-scattered the gradients in backward."""

    def full_grads(self) -> dict[str, torch.Tensor]:
        return {n: p.grad.full_tensor().detach().clone() for n, p in self.named}

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def state_bytes(self) -> int:
        return optimizer_state_bytes(self.opt)

    def memory_bytes(self) -> dict[str, int]:
        return {"parameters": sum(local_nbytes(p) for p in self.params),
                "gradients": sum(local_nbytes(p.grad) for p in self.params),
                "optimizer_states": self.state_bytes()}


class ExpertSplitOptimizer:
    """Two :class:`ZeroOptimizer` side by side under expert parallelism: the dense parameters over
    the data-parallel group, the routed experts over the expert-data-parallel group (their
    ``dp·cp/ep`` replicas), each with its own ZeRO slices. An expert's local gradient already sums
    the losses of the ep ranks that routed tokens to it, so it is divided by dp·cp, not by its
    group's size (:mod:`paraplan.validation.apply_ep`)."""

    def __init__(self, dense: ZeroOptimizer, experts: ZeroOptimizer):
        self.parts = (dense, experts)
        self.stage = dense.stage

    def sync_grads(self) -> None:
        for o in self.parts:
            o.sync_grads()

    def full_grads(self) -> dict[str, torch.Tensor]:
        return {n: g for o in self.parts for n, g in o.full_grads().items()}

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self) -> None:
        for o in self.parts:
            o.zero_grad()

    def state_bytes(self) -> int:
        return sum(o.state_bytes() for o in self.parts)

    def memory_bytes(self) -> dict[str, int]:
        return _summed(o.memory_bytes() for o in self.parts)

    def host_memory_bytes(self) -> dict[str, int]:
        return _summed(o.host_memory_bytes() for o in self.parts)


def _summed(byte_counts) -> dict[str, int]:
    """Key-wise sum of byte-count dicts (zeros kept, unlike collections.Counter's addition)."""
    out: dict[str, int] = {}
    for counts in byte_counts:
        for k, v in counts.items():
            out[k] = out.get(k, 0) + v
    return out
