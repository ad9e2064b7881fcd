"""Liveness batching: passing checks reach CloudWatch at most once per interval, none lost."""

from __future__ import annotations

from sdc_agent.publish.liveness import LivenessBatch, LivenessCounts


def test_first_batch_is_due_at_once_then_at_most_once_per_interval():
    batch = LivenessBatch(interval=60.0)
    # Given a first pass at t=0
    assert batch.add(step=0, audit_passes=1, weight_check_passes=0) is True
    assert batch.seconds_until_due(0.0) == 0.0
    assert batch.take(0.0) == LivenessCounts(1, 0, 0)
    # When more passes arrive during the next minute
    assert batch.add(step=5, audit_passes=1, weight_check_passes=0) is True
    assert batch.add(step=10, audit_passes=1, weight_check_passes=1) is False
    # Then nothing is due before t=60, and at t=60 one batch holds them all
    assert batch.seconds_until_due(30.0) == 30.0
    assert batch.take(59.9) is None
    assert batch.take(60.0) == LivenessCounts(2, 1, 10)
    assert batch.take(200.0) is None  # nothing pending


def test_failed_counts_are_restored_into_the_next_batch():
    batch = LivenessBatch(interval=60.0)
    batch.add(1, 2, 1)
    counts = batch.take(0.0)
    batch.restore(counts)
    batch.add(2, 1, 0)
    assert batch.take(60.0) == LivenessCounts(3, 1, 2)


def test_force_sends_before_the_interval_and_nothing_pending_is_never_due():
    batch = LivenessBatch(interval=60.0)
    assert batch.seconds_until_due(0.0) is None
    batch.add(1, 1, 0)
    batch.take(0.0)
    batch.add(2, 0, 1)
    assert batch.take(1.0) is None
    assert batch.take(1.0, force=True) == LivenessCounts(0, 1, 2)
    assert batch.add(3, 0, 0) is False and not batch.pending()
