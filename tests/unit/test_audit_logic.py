"""The replay audit's reasoning, on synthetic outcomes (no processes)."""

from __future__ import annotations

import pytest

from sdc_agent.checks.replay.attribution import (
    Outcome,
    confirmation_jobs,
    find_culprits,
    find_mismatches,
    mismatch_verdict,
    nonfinite_verdict,
    unexplained,
)

GOOD = Outcome(loss_bits=100, grad_digest=(1, 2), finite=True)
BAD = Outcome(loss_bits=101, grad_digest=(1, 2), finite=True)
BAD_GRADS = Outcome(loss_bits=100, grad_digest=(9, 9), finite=True)
NAN = Outcome(loss_bits=0x7FC00000, grad_digest=(0, 0), finite=False)


def batch_outcomes(world: int) -> list[Outcome]:
    """A distinct correct result per rank's batch."""
    return [Outcome(loss_bits=1000 + r, grad_digest=(r, r), finite=True) for r in range(world)]


def corrupt(o: Outcome) -> Outcome:
    return Outcome(loss_bits=o.loss_bits ^ 1, grad_digest=o.grad_digest, finite=o.finite)


def test_outcome_round_trips_through_its_row():
    assert Outcome.from_row(GOOD.to_row()) == GOOD
    assert Outcome.from_row(NAN.to_row()) == NAN


def test_an_unfilled_row_is_rejected():
    with pytest.raises(ValueError, match="not a filled outcome row"):
        Outcome.from_row([0, 0, 0, 0, 0])


def test_gradient_digests_count_only_with_deterministic_kernels():
    assert not GOOD.matches(BAD_GRADS, compare_grads=True)
    assert GOOD.matches(BAD_GRADS, compare_grads=False)
    assert not GOOD.matches(BAD, compare_grads=False)


def test_a_persistently_wrong_rank_is_in_two_mismatches_and_is_the_culprit():
    # Given 6 ranks, offset 2, rank 3 wrong on its own batch and on its replay of rank 5's
    world, offset = 6, 2
    truth = batch_outcomes(world)
    own = list(truth)
    own[3] = corrupt(truth[3])
    replayed = [truth[(r + offset) % world] for r in range(world)]
    replayed[3] = corrupt(truth[5])
    # When the pairs are compared
    pairs = find_mismatches(own, replayed, offset, compare_grads=True)
    # Then (3, 1) and (5, 3) mismatch, 3 is the culprit and nothing is left to confirm
    assert pairs == [(3, 1), (5, 3)]
    assert find_culprits(pairs) == [3]
    assert unexplained(pairs, [3]) == []


def test_a_single_mismatch_goes_to_confirmation():
    pairs = [(3, 1)]
    assert find_culprits(pairs) == []
    assert unexplained(pairs, []) == [(3, 1)]


def test_confirmation_jobs_go_to_the_third_gpu_and_the_target():
    # Slot 0 confirms target 3: column 0 by the third GPU (5), column 1 by 3 itself
    assert confirmation_jobs([3], 6, 2, me=5) == [(0, 0, 3)]
    assert confirmation_jobs([3], 6, 2, me=3) == [(0, 1, 3)]
    assert confirmation_jobs([3], 6, 2, me=1) == []


@pytest.mark.parametrize(
    ("original", "replayed", "third", "again", "expected"),
    [
        (BAD, GOOD, GOOD, GOOD, ("transient", "target")),
        (BAD, GOOD, GOOD, BAD, ("persistent", "target")),
        (GOOD, BAD, GOOD, GOOD, ("replayer_wrong", "replayer")),
        (BAD, GOOD, BAD_GRADS, GOOD, ("unclear", "")),
    ],
    ids=["transient", "persistent", "replayer-wrong", "unclear"],
)
def test_mismatch_verdicts(original, replayed, third, again, expected):
    assert mismatch_verdict(original, replayed, third, again, compare_grads=True) == expected


@pytest.mark.parametrize(
    ("third", "again", "expected"),
    [
        (GOOD, GOOD, ("transient", "target")),
        (GOOD, NAN, ("persistent", "target")),
        (NAN, NAN, ("reproducible", "")),
        (GOOD, BAD, ("unclear", "target")),
    ],
    ids=["transient", "persistent", "bad-batch", "unclear"],
)
def test_nonfinite_verdicts(third, again, expected):
    assert nonfinite_verdict(third, again, compare_grads=True) == expected
