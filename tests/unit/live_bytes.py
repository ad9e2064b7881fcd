"""Peak live memory of what a block allocates, measured on the CPU, where torch's allocator keeps
no peak statistic (``torch.cuda.max_memory_allocated`` has no CPU counterpart)."""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class LiveBytes(TorchDispatchMode):
    """The peak, over the block, of the bytes held by storages that ops inside it allocated
    (a storage counts from the op that returned it until every tensor seen on it is gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors alive]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in pytree.tree_leaves((args, kwargs))
            if type(t) in (torch.Tensor, nn.Parameter)
        }
        for t in pytree.tree_leaves(out):
            if type(t) not in (torch.Tensor, nn.Parameter):
                continue
            storage = t.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
            entry = self._live.get(address)
            if entry is None:
                if not address or not size or address in inputs:
                    continue  # no memory, or a view / in-place result of a tensor from outside
                entry = self._live[address] = [size, 0]
                self.now += size
                self.peak = max(self.peak, self.now)
            entry[1] += 1
            weakref.finalize(t, self._release, address)
        return out

    def _release(self, address: int) -> None:
        entry = self._live[address]
        entry[1] -= 1
        if not entry[1]:
            del self._live[address]
            self.now -= entry[0]
