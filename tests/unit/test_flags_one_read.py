"""Check 1's one host read per step (issue 31 item 4): a rank's flags are read to the host in
one read together with the previous step's flag reduction, which is settled from it, and the
verdicts are the element-by-element rules'."""

from __future__ import annotations

import math

import pytest
import torch

from sdc_agent.checks.gradients.exchange import GradientCheck


def _check(local: list[float], reduced: list[float]) -> GradientCheck:
    """A GradientCheck whose taps recorded ``local`` flags and ``reduced`` sums this step."""
    check = GradientCheck([], None, 1)
    _record(check, local, reduced)
    return check


def _record(check: GradientCheck, local: list[float], reduced: list[float]) -> None:
    state = check.hook_state
    state.local_flags = [torch.tensor([v], dtype=torch.float32) for v in local]
    state.reduced_sums = [torch.tensor(v, dtype=torch.float32) for v in reduced]


@pytest.mark.parametrize(
    ("local", "reduced", "sensor", "expected"),
    [
        ([0.0, 0.0], [1.5, -2.0], None, (False, False, False)),
        # a finite sum near float32's largest value is not non-finite
        ([0.0], [3.0e38, -3.0e38], None, (False, False, False)),
        ([0.0, 1.0], [1.0, 2.0], None, (True, False, False)),
        ([0.0], [math.inf, 2.0], None, (False, True, False)),
        ([0.0], [-math.inf], None, (False, True, False)),
        ([math.nan], [math.nan], None, (True, True, False)),
        ([0.0], [1.0], 1.0, (False, False, True)),
        ([0.0], [1.0], 0.0, (False, False, False)),
    ],
)
def test_a_step_flags_are_judged_element_by_element(calls, local, reduced, sensor, expected):
    # Given a step's local flags and reduced sums (and a sensor flag)
    check = _check(local, reduced)
    flag = None if sensor is None else torch.tensor([sensor])
    # When the flags are read
    flags = check.read_flags(0, max_grad_norm=None, sensor_flag=flag)
    # Then the verdicts are the rules', and reading made no collective
    assert (flags.local_bad, flags.reduced_bad, flags.sensor_bad) == expected
    assert flags.bad == any(expected)
    assert calls == []


def test_the_previous_step_flags_are_read_in_the_same_read_and_settled(calls, monkeypatch):
    # Given step 0's exchange in flight (a rank's local gradient was bad), deferred
    check = _check([1.0], [math.nan])
    exchange, bad = check.exchange(0, max_grad_norm=None, device=torch.device("cpu"))
    assert bad and not exchange.settled
    check.pending = exchange
    # When step 1's flags (clean) are read
    _record(check, [0.0], [1.0])
    reads = []
    real_tolist = torch.Tensor.tolist

    def tolist(t):
        reads.append(t.numel())
        return real_tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    flags = check.read_flags(1, max_grad_norm=None)
    summary = exchange.summary()
    # Then one read of 6 values (step 1's flag and sum, step 0's 4 reduced flags) settled step 0
    assert reads == [6]
    assert not flags.bad
    assert exchange.settled and summary.step == 0 and summary.any_local and summary.any_reduced
    # And a step with nothing in flight reads only its own values
    check.pending = None
    check.read_flags(2, max_grad_norm=None)
    assert reads == [6, 2]
