"""Bounded memory in check 2's DDP replay (``checks/replay/replayer.py``): each replayed gradient
is fingerprinted, checked for NaN/Inf and dropped as autograd produces it, so a replay never holds
the model's whole gradient; its outcome is bit for bit what the whole gradient gave.

No process group: the DDP replayer runs on the bare module. Memory is measured by
:class:`~tests.unit.live_bytes.LiveBytes` (torch's CPU allocator keeps no peak statistic): the
bytes of the storages the replay's operators allocate, a deterministic count (no timing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdc_agent.checks.gradients.finiteness import all_finite
from sdc_agent.checks.replay.replayer import Replayer, outcome_of
from sdc_agent.fingerprint import fingerprints
from tests.unit.live_bytes import LiveBytes

WIDTH, LAYERS = 192, 8
GRADIENT_BYTES = WIDTH * WIDTH * 4
"""One layer's weight gradient (fp32)."""


class Net(nn.Module):
    """``LAYERS`` linears, one parameter whose gradient is -0.0 (its bits tell a gradient that
    started as None from one added into a zero tensor), and one parameter the forward never
    uses (its gradient never comes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
        self.negative_zero = nn.Parameter(torch.ones(4))
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x) + (self.negative_zero * -0.0).sum()


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def _whole_gradient_outcome(model: Net, batch: torch.Tensor, zero_start: bool):
    """What the replay compared before: the whole gradient left by a backward, then
    ``fingerprints`` and ``all_finite`` of it (the reference)."""
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p) if zero_start else None
    loss = compute_loss(model, batch)
    loss.backward()
    grads = [p.grad for p in params]
    table = fingerprints(grads)
    outcome = outcome_of(loss, table, all_finite(grads))
    for p in params:
        p.grad = None
    return table, outcome


@pytest.mark.parametrize("zero_start", [False, True], ids=["grads-None", "grads-zero"])
def test_a_ddp_replay_holds_about_one_gradient_at_a_time_and_compares_the_same_bits(
    zero_start: bool,
) -> None:
    # Given a model, its reference outcome from the whole gradient, and a replayer over its
    # parameters whose step began with gradients None or zero (zero_grad(set_to_none=False))
    torch.set_num_threads(1)
    model = Net()
    batch = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(1))
    table, reference = _whole_gradient_outcome(model, batch, zero_start)
    other, _ = _whole_gradient_outcome(model, batch, not zero_start)
    assert not torch.equal(table, other)  # the start matters to the bits compared
    params = list(model.parameters())
    replayer = Replayer(model, params, compute_loss)
    replayer.zero_grads_at_start = [True] * len(params) if zero_start else None
    training = [torch.full_like(p, 0.5) for p in params]
    for p, g in zip(params, training, strict=True):
        p.grad = g  # the step's own gradients, set aside during the replay
    # When the batch is replayed, its allocations measured
    with LiveBytes() as memory:
        outcome = replayer.replay(batch, seed=0, deterministic=True)
    # Then its outcome is the whole gradient's, bit for bit (the unused parameter's row too)
    assert torch.equal(replayer.last_table.cpu(), table.cpu())
    assert outcome == reference and outcome.finite
    # And at its peak it held about one layer's gradient, not the model's (8 of them): the
    # pin of the guard's extra memory in a replay (activations of a 2-row batch are small)
    assert memory.peak < 2 * GRADIENT_BYTES + 64 * 1024, memory.peak
    # And the step's own gradients are back, the same tensors
    assert all(p.grad is g for p, g in zip(params, training, strict=True))


def test_a_ddp_replay_without_deterministic_kernels_still_drops_and_flags_a_nan() -> None:
    # Given a model whose first layer holds a NaN weight (so its gradients are not finite)
    torch.set_num_threads(1)
    model = Net()
    with torch.no_grad():
        model.layers[0].weight[0, 0] = float("nan")
    batch = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(1))
    _, reference = _whole_gradient_outcome(model, batch, zero_start=False)
    replayer = Replayer(model, list(model.parameters()), compute_loss)
    # When it is replayed without deterministic kernels (no table: loss and finiteness only)
    with LiveBytes() as memory:
        outcome = replayer.replay(batch, seed=0, deterministic=False)
    # Then it is not finite, as the whole gradient said, and held no more than before
    assert not reference.finite and not outcome.finite
    assert outcome.loss_bits == reference.loss_bits and replayer.last_table is None
    assert memory.peak < 2 * GRADIENT_BYTES + 64 * 1024, memory.peak


def test_a_gradient_accumulated_twice_in_one_replay_is_refused_by_name() -> None:
    # Given a replay whose backward reaches one parameter twice through two backward calls
    # (what a reentrant checkpoint around a shared weight does)
    torch.set_num_threads(1)
    model = Net()

    def twice(module: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        compute_loss(module, batch).backward(retain_graph=False)
        return compute_loss(module, batch)

    replayer = Replayer(model, list(model.parameters()), twice)
    batch = torch.randn(2, WIDTH)
    # When it is replayed, then it raises, naming the cause and the fix
    with pytest.raises(RuntimeError, match="accumulated a parameter's gradient twice"):
        replayer.replay(batch, seed=0, deterministic=True)
    # And the hooks are gone: a plain backward afterwards keeps its gradients
    compute_loss(model, batch).backward()
    assert all(p.grad is not None for p in model.layers.parameters())
