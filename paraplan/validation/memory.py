"""Activation memory on CPU: bytes of tensors autograd saves for backward, counted with hooks.

``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an op saves. Each distinct
storage is counted once while any saved reference to it is alive (a saved tensor is released
when backward frees the graph), parameters and views of parameters are skipped, and the peak of
the live total is kept. Inside ``torch.utils.checkpoint`` regions the checkpoint's own hooks win,
so recomputed activations are (correctly) not counted; the model saves the checkpoint's inputs
through an identity op so they are, only while a counter is active (``SavedActivationCounter.
active``): the identity is a Python autograd Function, which timed steps should not pay.
"""
from __future__ import annotations

import torch
from torch import nn


class _Held:
    __slots__ = ("counter", "key", "tensor", "__weakref__")

    def __init__(self, counter, key, tensor):
        self.counter, self.key, self.tensor = counter, key, tensor

    def __del__(self):
        try:
            self.counter._release(self.key)
        except Exception:  # interpreter shutdown
            pass


class SavedActivationCounter:
    """Context manager tracking live and peak bytes of saved activations (``peak_bytes``).
    ``SavedActivationCounter.active`` counts the counters entered (the model's checkpoint-input
    marks run only while it is positive)."""

    active = 0
    #: the counter entered last (op-level SAC's policy adds the outputs it keeps to it: they are
    #: held by the checkpoint's cache, not through saved-tensor hooks)
    current = None

    def __init__(self):
        self.live: dict[int, list[int]] = {}  # storage ptr -> [nbytes, refs]
        self.current_bytes = 0
        self.peak_bytes = 0
        self._hooks = None

    def _pack(self, t: torch.Tensor):
        base = t._base if t._base is not None else t
        if isinstance(base, nn.Parameter) or isinstance(t, nn.Parameter) or t.device.type == "meta":
            return t
        try:
            storage = t.untyped_storage()
        except Exception:  # tensor subclasses without a plain storage
            return t
        key = storage.data_ptr()
        if key == 0:
            return t
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [storage.nbytes(), 1]
            self.current_bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        else:
            entry[1] += 1
        return _Held(self, key, t)

    @staticmethod
    def _unpack(x):
        return x.tensor if isinstance(x, _Held) else x

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self.live[key]

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` kept outside the saved-tensor hooks (op-level SAC's cached outputs)."""
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def drop(self, nbytes: int) -> None:
        """Stop counting bytes :meth:`hold` counted (the backward's recomputation took them)."""
        self.current_bytes -= nbytes

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        SavedActivationCounter.active += 1
        self._outer, SavedActivationCounter.current = SavedActivationCounter.current, self
        return self

    def __exit__(self, *exc):
        SavedActivationCounter.active -= 1
        SavedActivationCounter.current = self._outer
        self._hooks.__exit__(*exc)
        return False
