"""Bounded memory in check 2's FSDP2 replay: each replayed gradient is fingerprinted and dropped
as autograd produces it, so the replay never holds the model's whole unsharded gradient.

A one-rank gloo group and a 1-D FSDP2 mesh of one rank (the replay's code path is the same as on
many ranks: sync off, check 1's taps on the unsharded parameters). Memory is measured by
:class:`LiveBytes`, which counts the bytes of the storages that tensors created inside it hold
while alive (the CPU allocator of torch exposes no peak statistic)."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from sdc_agent.checks.gradients.stats import GradStatsState
from sdc_agent.parallel.fsdp import FSDP2Adapter

WIDTH, LAYERS = 192, 8
GRADIENT_BYTES = WIDTH * WIDTH * 4
"""One layer's weight gradient (fp32)."""


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


@pytest.fixture
def world(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def test_an_fsdp2_replay_holds_about_one_gradient_at_a_time_and_fingerprints_as_training(world):
    # Given an FSDP2 model with check 1's taps, and one training step that fingerprinted its
    # local gradients (what the audit compares a replay with)
    torch.set_num_threads(1)
    model = sharded_model()
    adapter = FSDP2Adapter(model, None)
    stats = GradStatsState(
        process_group=None, param_index={id(p): i for i, p in enumerate(adapter.params)}
    )
    adapter.install_gradient_taps(stats)
    batch = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(1))
    stats.arm(capture_fingerprints=True, device=adapter.param_device)
    compute_loss(model, batch).backward()
    trained = stats.local_table().clone()
    sharded_grads = [p.grad.to_local().clone() for p in adapter.params]
    replayer = adapter.make_replayer(compute_loss, stats)
    # When the same batch is replayed (sync off), its allocations measured
    with LiveBytes() as memory:
        outcome = replayer.replay(batch, seed=0, deterministic=True)
    # Then its fingerprints are the training step's, bit for bit, and it was finite
    assert outcome.finite and torch.equal(replayer.last_table, trained)
    # And at its peak it held about one layer's gradient, not the model's (8 of them)
    assert memory.peak < 2 * GRADIENT_BYTES + 64 * 1024, memory.peak
    # And the step's sharded gradients are back, no unsharded gradient is left
    assert all(
        torch.equal(p.grad.to_local(), g)
        for p, g in zip(adapter.params, sharded_grads, strict=True)
    )
    assert all(p.grad is None for p in adapter.gradient_taps().unsharded_parameters())
