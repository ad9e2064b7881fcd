"""Gradient accumulation: the audited micro-batch's gradient is isolated exactly, and isolating
it changes none of the accumulated gradient's bits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdc_agent import Schedule
from sdc_agent.accumulation import MicroBatchIsolation
from sdc_agent.fingerprint import bit_patterns, fingerprints
from sdc_agent.replay import Replayer, micro_batch_loss, outcome_of

N = 4


def make_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3), nn.Linear(3, 1))
    model[3].requires_grad_(False)  # a frozen layer: no gradient, no hook
    return model


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean()


MICROS = [torch.randn(5, 8, generator=torch.Generator().manual_seed(i)) * 3 for i in range(N)]


def accumulate(model: nn.Module, *, isolate_at: int | None, set_to_none: bool):
    """One step of N micro-batches; returns the accumulated gradients and, when isolating, the
    audited micro-batch's fingerprints and recorded loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=set_to_none)
    isolation = MicroBatchIsolation(params)
    table, recorded = None, None
    try:
        for i, micro in enumerate(MICROS):
            if i == isolate_at:
                isolation.begin()
            loss = micro_batch_loss(compute_loss(model, micro), N)
            loss.backward()
            if i == isolate_at:
                table, recorded = isolation.end(), loss.detach()
    finally:
        isolation.remove()
    return [p.grad.clone() for p in params], table, recorded


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(bit_patterns(x), bit_patterns(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("position", range(N))
def test_isolating_a_micro_batch_leaves_the_accumulated_gradient_bit_identical(
    position, set_to_none
):
    # Given N micro-batches accumulated normally, and the same with micro-batch `position`
    # isolated (stash the sum so far, compute it alone, add the stash back); the last position
    # is the one DDP synchronises
    normal, _, _ = accumulate(make_model(), isolate_at=None, set_to_none=set_to_none)
    isolated, _, _ = accumulate(make_model(), isolate_at=position, set_to_none=set_to_none)
    # Then every gradient bit is the same
    assert same_bits(normal, isolated)
    # And the rounding is real: a different summation order would have changed some bits
    ref = make_model()
    params = [p for p in ref.parameters() if p.requires_grad]
    alone = [
        torch.autograd.grad(micro_batch_loss(compute_loss(ref, micro), N), params)
        for micro in MICROS
    ]
    reordered = [sum(g[j] for g in reversed(alone)) for j in range(len(params))]
    assert not same_bits(normal, reordered)


@pytest.mark.parametrize("position", range(N))
def test_the_isolated_gradient_is_what_a_replay_of_that_micro_batch_computes(position):
    # Given micro-batch `position` isolated during accumulation
    model = make_model()
    _, table, recorded = accumulate(model, isolate_at=position, set_to_none=True)
    own = outcome_of(recorded, table, True)
    # When another copy of the model replays that micro-batch alone (loss / N, from no gradient)
    twin = make_model()
    params = [p for p in twin.parameters() if p.requires_grad]
    replayed = Replayer(twin, params, compute_loss, grad_accum=N).replay(
        MICROS[position], seed=0, deterministic=True
    )
    # Then loss and per-parameter gradient fingerprints agree bit for bit
    assert replayed.matches(own, compare_grads=True)
    # and the table is that of the micro-batch's own gradient, not of the accumulated one
    ref = make_model()
    ref_params = [p for p in ref.parameters() if p.requires_grad]
    alone = torch.autograd.grad(
        micro_batch_loss(compute_loss(ref, MICROS[position]), N), ref_params
    )
    assert torch.equal(table, fingerprints(alone))


def test_a_gradient_scaler_scales_replays_as_training_did():
    # Given a micro-batch back-propagated with a GradScaler's scale
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    model = make_model()
    params = [p for p in model.parameters() if p.requires_grad]
    loss = compute_loss(model, MICROS[0])
    scaler.scale(loss).backward()
    own = outcome_of(loss, fingerprints([p.grad for p in params]), True)
    # When a replayer that knows the scaler replays it
    twin = make_model()
    twin_params = [p for p in twin.parameters() if p.requires_grad]
    replayed = Replayer(twin, twin_params, compute_loss, scaler=scaler).replay(
        MICROS[0], seed=0, deterministic=True
    )
    # Then it matches bit for bit; without the scale it would not
    assert replayed.matches(own, compare_grads=True)
    unscaled = Replayer(twin, twin_params, compute_loss).replay(
        MICROS[0], seed=0, deterministic=True
    )
    assert not unscaled.matches(own, compare_grads=True)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, None])
def test_grad_accum_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=r"Schedule\.grad_accum"):
        Schedule(grad_accum=value)


def test_every_micro_batch_position_is_audited_within_grad_accum_audits():
    schedule = Schedule(audit_every=5, grad_accum=N)
    positions = [schedule.audited_micro_batch(s) for s in range(0, 5 * N, 5)]
    assert sorted(positions) == list(range(N))
    assert Schedule(audit_every=5).audited_micro_batch(35) == 0
