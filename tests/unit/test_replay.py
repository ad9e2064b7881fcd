"""Replays reproduce a step's gradient bits exactly, including how the gradients started."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdc_agent.checks.replay.replayer import Replayer, outcome_of
from sdc_agent.fingerprint import fingerprints


class NegativeZeroGrad(nn.Module):
    """d loss / d w = c, with c holding -0.0: the gradient's sign bits depend on accumulation."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch)


BATCH = torch.tensor([-0.0, 1.0, -0.0, 2.0])


def trained_outcome(model: NegativeZeroGrad, replayer: Replayer, *, set_to_none: bool):
    """What the training step computes: zero_grad as asked, then one backward."""
    compute_loss(model, torch.ones(4)).backward()  # a previous step left gradients behind
    model.zero_grad(set_to_none=set_to_none)
    replayer.note_gradients_at_start(step=0)
    loss = compute_loss(model, BATCH)
    loss.backward()
    return outcome_of(loss, fingerprints([model.w.grad]), True)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_replay_starts_its_gradients_the_way_the_step_did(set_to_none):
    # Given a step whose gradient has -0.0 elements, zeroed in place or set to None
    model = NegativeZeroGrad()
    replayer = Replayer(model, [model.w], compute_loss)
    own = trained_outcome(model, replayer, set_to_none=set_to_none)
    # When the same micro-batch is replayed
    replayed = replayer.replay(BATCH, seed=0, deterministic=True)
    # Then the gradient bits agree (0 + -0.0 is +0.0: a replay from None would differ)
    assert replayed.matches(own, compare_grads=True)
    signs = torch.signbit(model.w.grad)
    assert signs.tolist() == ([True, False, True, False] if set_to_none else [False] * 4)


def test_accumulated_gradients_are_refused_before_an_audit():
    model = NegativeZeroGrad()
    replayer = Replayer(model, [model.w], compute_loss)
    compute_loss(model, torch.ones(4)).backward()  # an earlier micro-batch's gradient
    with pytest.raises(RuntimeError, match="gradient accumulation"):
        replayer.note_gradients_at_start(step=3)


class Scaled(nn.Module):
    """d loss / d w = the batch: a replay's gradient is whatever the batch says."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def test_a_replay_calls_huge_finite_gradients_finite_as_check_1_does():
    # Given a micro-batch whose gradient is huge but finite (its squared norm overflows float32)
    model = Scaled()
    batch = torch.full((4,), 1e30)
    compute_loss(model, batch).backward()
    grad = model.w.grad
    assert torch.isfinite(grad).all() and not torch.isfinite(grad.square().sum())
    model.w.grad = None  # the step's gradients start as None, as in training
    replayer = Replayer(model, [model.w], compute_loss)
    # When it is replayed
    replayed = replayer.replay(batch, seed=0, deterministic=True)
    # Then the outcome is finite: no false mismatch against the finite training step
    assert replayed.finite
    # And its digest is that of the huge gradient (the replay computed it, then restored None)
    assert (
        replayed.grad_digest == outcome_of(torch.zeros(()), fingerprints([grad]), True).grad_digest
    )
    assert model.w.grad is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_replay_calls_a_nan_or_inf_gradient_non_finite(bad):
    # Given a micro-batch whose gradient holds one NaN/Inf element (the loss stays finite: w is 0)
    model = Scaled()
    replayer = Replayer(model, [model.w], compute_loss)
    batch = torch.tensor([1.0, bad, 1.0, 1.0])
    # When it is replayed
    replayed = replayer.replay(batch, seed=0, deterministic=False)
    # Then the outcome is non-finite
    assert not replayed.finite
