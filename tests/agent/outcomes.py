"""Reading the per-rank results the multi-process tests' jobs return."""

from __future__ import annotations

from typing import Any


def ok(results: dict, name: str) -> list[dict[str, Any]]:
    """Scenario ``name``'s per-rank results, asserting that no rank raised."""
    per_rank = results[name]
    errors = [r["trace"] for r in per_rank if "error" in r]
    assert not errors, errors[0]
    return per_rank


def the_alarm(results: dict, name: str) -> dict[str, Any]:
    """The alarm of scenario ``name``: asserted identical on every rank, then returned."""
    alarms = [r["alarm"] for r in ok(results, name)]
    assert alarms[0] is not None, f"{name}: no alarm"
    assert all(a == alarms[0] for a in alarms), f"{name}: ranks disagree"
    return alarms[0]
