"""The precision estimate's arithmetic: the Wilson score interval and the duration format."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sdc_remediation.logic.stats import parse_duration, wilson_interval


def test_wilson_interval_matches_known_values():
    # Given/When/Then: textbook values (z = 1.96)
    low, high = wilson_interval(10, 10)
    assert (low, high) == (pytest.approx(0.7225, abs=5e-4), 1.0)
    low, high = wilson_interval(0, 5)
    assert (low, high) == (0.0, pytest.approx(0.4345, abs=5e-4))
    low, high = wilson_interval(45, 50)
    assert (low, high) == (pytest.approx(0.7864, abs=5e-4), pytest.approx(0.9565, abs=5e-4))


def test_wilson_interval_without_events_is_none_and_refuses_nonsense():
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError, match=r"within 0\.\.3"):
        wilson_interval(4, 3)


def test_durations_take_a_unit_and_refuse_anything_else():
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("2w") == timedelta(days=14)
    assert parse_duration("12h") == timedelta(hours=12)
    for bad in ("30", "0d", "thirty", "-1d"):
        with pytest.raises(ValueError, match="30d"):
            parse_duration(bad)
