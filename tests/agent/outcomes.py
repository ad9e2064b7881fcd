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


def assert_one_sensor_named_it(
    results: dict, name: str, *, sensor: tuple[str, str, str], rank: int, third: int, step: int
) -> dict[str, Any]:
    """Scenario ``name`` raised one alarm at ``step`` naming ``rank``, from exactly one sensor
    candidate, ``sensor`` = (layer, op, kind) on that rank above its threshold, confirmed
    ``transient`` by the replays on ``third`` and on the rank; the step was not applied on any
    rank. Returns the alarm."""
    layer, op, kind = sensor
    alarm = the_alarm(results, name)
    assert (alarm["step"], alarm["check"], alarm["suspects"]) == (step, "compute", [rank])
    candidates = alarm["sensor_candidates"]
    assert [(c["rank"], c["layer"], c["gemm"], c["kind"]) for c in candidates] == [
        (rank, layer, op, kind)
    ]
    assert candidates[0]["ratio"] > candidates[0]["threshold"]
    verdict = {"pair": [rank, rank], "third": third, "suspect": rank, "kind": "transient"}
    assert alarm["verdicts"] == [verdict]
    assert all(r["updates"] == list(range(step)) for r in results[name])
    return alarm
