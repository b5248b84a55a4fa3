"""Pipeline parallelism: split blocks into stages and run 1F1B (or interleaved 1F1B) by hand.

Schedules follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", sec. 2.2): PipeDream-Flush 1F1B with ``p - r - 1`` warm-up
forwards on rank ``r``, and the interleaved variant with ``v`` model chunks per rank, micro-
batches issued in groups of ``p`` and ``2 (p - r - 1) + (v - 1) p`` warm-up forwards.

The executor posts sends without waiting (``isend``; all are waited at the end of the step)
and blocks only on receives, so any dependency-feasible order runs without deadlock. Every
message carries a tag naming (direction, chunk, micro-batch), so forward activations and
backward gradients between the same pair of ranks never mix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from paraplan.errors import ConfigError
from paraplan.validation import comm


@dataclass(frozen=True)
class Action:
    """One unit of pipeline work on a rank: forward or backward of (chunk, micro-batch)."""

    kind: str  # "F" or "B"
    chunk: int  # local model-chunk index (0..v-1)
    micro: int


def stage_layers(layers: int, pp: int, virtual: int = 1) -> list[list[int]]:
    """Block indices of each of the ``pp * virtual`` model chunks, in pipeline order."""
    chunks = pp * virtual
    if layers % chunks:
        raise ConfigError("pp", f"layers({layers}) is not divisible by pp({pp}) * "
                          f"virtual_stages({virtual}) = {chunks}")
    per = layers // chunks
    return [list(range(c * per, (c + 1) * per)) for c in range(chunks)]


def one_f_one_b(rank: int, pp: int, micro: int) -> list[Action]:
    """PipeDream-Flush 1F1B order for ``rank``."""
    warm = min(pp - rank - 1, micro)
    acts = [Action("F", 0, i) for i in range(warm)]
    for i in range(micro - warm):
        acts += [Action("F", 0, warm + i), Action("B", 0, i)]
    acts += [Action("B", 0, i) for i in range(micro - warm, micro)]
    return acts


def interleaved_1f1b(rank: int, pp: int, micro: int, virtual: int) -> list[Action]:
    """Megatron interleaved 1F1B order for ``rank`` (needs micro % pp == 0)."""
    if virtual == 1:
        return one_f_one_b(rank, pp, micro)
    if micro % pp:
        raise ConfigError("micro_batches", f"interleaved schedule needs micro-batches({micro}) "
                          f"divisible by pp({pp})")
    total = micro * virtual

    def fwd(k):
        return Action("F", (k // pp) % virtual, (k // (pp * virtual)) * pp + k % pp)

    def bwd(k):
        return Action("B", virtual - 1 - (k // pp) % virtual, (k // (pp * virtual)) * pp + k % pp)

    warm = min((pp - rank - 1) * 2 + (virtual - 1) * pp, total)
    acts = [fwd(k) for k in range(warm)]
    for i in range(total - warm):
        acts += [fwd(warm + i), bwd(i)]
    acts += [bwd(k) for k in range(total - warm, total)]
    return acts


class PipelineRunner:
    """Runs one training step's forward/backward for this rank's model chunks.

    Parameters
    ----------
    chunks : list of Stage
        This rank's model chunks, local index ``j`` is global chunk ``j * pp + pp_rank``.
    pp_ranks : list of int
        Global rank of each pipeline stage (same tp and dp coordinates as this rank).
    pp_rank : int
        This rank's stage index.
    act_shape : tuple
        Shape of the hidden state passed between stages for one micro-batch.
    """

    def __init__(self, chunks, pp_ranks, pp_rank, act_shape, dtype=torch.float32,
                 device="cpu"):
        self.chunks, self.pp_ranks, self.pp_rank = chunks, pp_ranks, pp_rank
        self.pp, self.virtual = len(pp_ranks), len(chunks)
        self.act_shape, self.dtype, self.device = act_shape, dtype, device

    def _global_chunk(self, j):
        return j * self.pp + self.pp_rank

    def _rank_of(self, g):
        return self.pp_ranks[g % self.pp]

    @staticmethod
    def _tag(kind, g, micro):
        return (0 if kind == "F" else 1) * 1_000_000 + g * 1000 + micro

    def _recv(self, src, tag):
        buf = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        with comm.timed("pp_comm"):
            dist.irecv(buf, src, tag=tag).wait()
        return buf

    def run(self, micro_inputs, micro_targets, schedule: list[Action],
            before_backward=None) -> float:
        """Execute ``schedule``; returns the summed loss (already divided per micro-batch).

        ``before_backward(is_last)`` is called before each backward, ``is_last`` true for the
        rank's final one (FSDP uses it to reduce-scatter gradients only once per step).
        """
        m = len(micro_inputs)
        n_backward = sum(a.kind == "B" for a in schedule)
        done_backward = 0
        last_g = self.pp * self.virtual - 1
        inputs, outputs, sends = {}, {}, []
        loss_sum = 0.0
        for a in schedule:
            g = self._global_chunk(a.chunk)
            stage = self.chunks[a.chunk]
            if a.kind == "F":
                if g == 0:
                    x = micro_inputs[a.micro]
                else:
                    x = self._recv(self._rank_of(g - 1), self._tag("F", g - 1, a.micro))
                    x.requires_grad_(True)
                inputs[(a.chunk, a.micro)] = x
                if g == last_g:
                    out = stage(x, micro_targets[a.micro]) / m
                    loss_sum += float(out.detach())
                else:
                    out = stage(x)
                    y = out.detach().contiguous()
                    sends.append((dist.isend(y, self._rank_of(g + 1),
                                             tag=self._tag("F", g, a.micro)), y))
                outputs[(a.chunk, a.micro)] = out
            else:
                out = outputs.pop((a.chunk, a.micro))
                x = inputs.pop((a.chunk, a.micro))
                done_backward += 1
                if before_backward is not None:
                    before_backward(done_backward == n_backward)
                if g == last_g:
                    out.backward()
                else:
                    grad = self._recv(self._rank_of(g + 1), self._tag("B", g + 1, a.micro))
                    torch.autograd.backward(out, grad)
                if g > 0:
                    dx = x.grad.contiguous()
                    sends.append((dist.isend(dx, self._rank_of(g - 1),
                                             tag=self._tag("B", g, a.micro)), dx))
        with comm.timed("pp_comm"):
            for w, _ in sends:
                w.wait()
        return loss_sum
