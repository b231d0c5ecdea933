"""Bytes the CPU allocates for tensors while a block runs: a torch dispatch mode that counts each
new storage an op makes and frees it when its tensor goes. It stands in for
torch.cuda.max_memory_allocated on a machine without a GPU: the same tensors, counted at the
operator level (what the memory plan predicts), not the C allocator's pages."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class AllocationTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.device.type == "cpu"
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in inputs or ptr in self._seen or storage.nbytes() == 0:
                continue  # a view, an in-place result, or a storage already counted
            self._seen.add(ptr)
            self._count(storage.nbytes())
            weakref.finalize(t, self._free, ptr, storage.nbytes())
        return out

    def _count(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def _free(self, ptr: int, n: int) -> None:
        self._seen.discard(ptr)
        self.live -= n

    def reset_peak(self) -> None:
        self.peak = self.live
