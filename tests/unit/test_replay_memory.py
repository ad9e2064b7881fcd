"""Bounded memory in check 2's FSDP2 replay: each replayed gradient is fingerprinted and dropped
as autograd produces it, so the replay never holds the model's whole unsharded gradient.

A one-rank gloo group and a 1-D FSDP2 mesh of one rank (the replay's code path is the same as on
many ranks: sync off, check 1's taps on the unsharded parameters). Memory is measured by
:class:`~tests.unit.live_bytes.LiveBytes` (torch's CPU allocator keeps no peak statistic)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from sdc_agent.checks.gradients.stats import GradStatsState
from sdc_agent.parallel.fsdp import FSDP2Adapter
from tests.unit.live_bytes import LiveBytes

WIDTH, LAYERS = 192, 8
GRADIENT_BYTES = WIDTH * WIDTH * 4
"""One layer's weight gradient (fp32)."""


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
