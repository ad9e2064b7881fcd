"""Gradient accumulation: the audited micro-batch's gradient is isolated exactly, and isolating
it changes none of the accumulated gradient's bits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sdc_agent import Schedule
from sdc_agent.checks.replay.accumulation import MicroBatchIsolation
from sdc_agent.checks.replay.replayer import Replayer, micro_batch_loss, outcome_of
from sdc_agent.fingerprint import bit_patterns, fingerprints

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


def test_an_isolation_run_from_anothers_hook_and_attached_late_changes_no_bit():
    # Given FSDP2's way: no hooks of its own, tensors attached only once they exist (the first
    # forward), and the isolation run from the first of the caller's own post-accumulate-grad
    # hooks, before a second hook that reads the gradient (check 1's flags, FSDP2's reduction)
    model = make_model()
    params = [p for p in model.parameters() if p.requires_grad]
    isolation = MicroBatchIsolation([None] * len(params), register_hooks=False)
    seen: list[torch.Tensor] = []

    def tap(index: int):
        def hook(param: nn.Parameter) -> None:
            isolation.gradient_accumulated(index, param)
            if index == 0:
                seen.append(param.grad.clone())  # what a later reader of the gradient gets

        return hook

    for index, param in enumerate(params):
        param.register_post_accumulate_grad_hook(tap(index))
    position = N - 1  # the synchronised micro-batch, after three accumulated ones
    table = None
    for i, micro in enumerate(MICROS):
        if i == 1:
            for index, param in enumerate(params):
                isolation.attach(index, param)  # exists from here on
        if i == position:
            isolation.begin()
        micro_batch_loss(compute_loss(model, micro), N).backward()
        if i == position:
            table = isolation.end()
    # Then the accumulated gradient is bit-identical to normal accumulation, the reader after
    # the isolation saw the full sum, and the table is the last micro-batch's own gradient
    normal, _, _ = accumulate(make_model(), isolate_at=None, set_to_none=True)
    assert same_bits([p.grad for p in params], normal)
    assert torch.equal(bit_patterns(seen[-1]), bit_patterns(normal[0]))
    ref = make_model()
    ref_params = [p for p in ref.parameters() if p.requires_grad]
    alone = torch.autograd.grad(
        micro_batch_loss(compute_loss(ref, MICROS[position]), N), ref_params
    )
    assert torch.equal(table, fingerprints(alone))
