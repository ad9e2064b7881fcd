"""The admission policy as a pure function: what counts as out of service, and the answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sdc_remediation.logic.admission import AdmitRequest, GuardSnapshot, decide

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _req(instance: str = "i-new", **kw) -> AdmitRequest:
    base = {
        "cluster": "hp",
        "instance_id": instance,
        "node_name": f"hyperpod-{instance}",
        "execution": "arn:exec:1",
        "cluster_nodes": 40,
        "max_nodes_per_hour": 2,
        "max_fraction": 0.05,
    }
    return AdmitRequest(**{**base, **kw})


def _ago(hours: float) -> int:
    return int((NOW - timedelta(hours=hours)).timestamp())


def test_a_free_cluster_admits():
    assert decide(_req(), GuardSnapshot(node=None), NOW).decision == "admitted"


def test_held_nodes_count_against_the_fraction_although_nothing_is_in_flight():
    # Given two nodes cordoned by earlier remediations (ended, never released), 40 nodes x 0.05
    held = [
        {"instance_id": "i-a", "remediation_id": "r-a", "at": _ago(5)},
        {"instance_id": "i-b", "remediation_id": "r-b", "at": _ago(6)},
    ]
    # When a third node alarms, hourly cap lifted
    out = decide(_req(max_nodes_per_hour=10), GuardSnapshot(node=None, held=held), NOW)
    # Then the circuit is open, and the reason says they are cordoned, not released
    assert out.decision == "circuit_open"
    assert "2 cordoned and not released" in out.reason


def test_held_nodes_count_against_the_fraction_only_never_the_hourly_rate():
    # Given two nodes admitted three days ago and never released (superseded rule: held nodes
    # counted against MAX_NODES_PER_HOUR too, so these two jammed every new alarm), and a
    # cluster with room in its fraction
    held = [
        {"instance_id": "i-a", "remediation_id": "r-a", "at": _ago(72)},
        {"instance_id": "i-b", "remediation_id": "r-b", "at": _ago(73)},
    ]
    # When a new node alarms
    out = decide(_req(max_fraction=1.0), GuardSnapshot(node=None, held=held), NOW)
    # Then it is admitted: the rate counts the rolling hour's admissions only
    assert out.decision == "admitted"


def test_the_hourly_rate_counts_the_admissions_of_the_rolling_hour():
    admissions = [{"instance_id": "i-a", "at": _ago(0.5)}, {"instance_id": "i-b", "at": _ago(0.9)}]
    out = decide(_req(max_fraction=1.0), GuardSnapshot(node=None, admissions=admissions), NOW)
    assert out.decision == "circuit_open" and "MAX_NODES_PER_HOUR" in out.reason
    # ... and an admission older than the hour no longer counts
    older = [{"instance_id": "i-a", "at": _ago(0.5)}, {"instance_id": "i-b", "at": _ago(1.1)}]
    assert (
        decide(_req(max_fraction=1.0), GuardSnapshot(node=None, admissions=older), NOW).decision
        == "admitted"
    )


def test_one_remediation_per_report():
    # Given this report already raised remediation r-1 of the node (another execution: a second
    # alarm on another metric of the same report, a flapping contributor)
    claim = {"remediation_id": "r-1", "execution": "arn:exec:0", "item": 0}
    out = decide(_req(report="job#120#compute#t"), GuardSnapshot(node=None, report=claim), NOW)
    # Then it is a duplicate of r-1, not a second remediation
    assert (out.decision, out.remediation_id) == ("duplicate", "r-1")
    assert "one remediation per report" in out.reason
    # ... while a retry of the execution and item that claimed it is that admission again
    retry = decide(
        _req(report="job#120#compute#t", execution="arn:exec:0", item=0),
        GuardSnapshot(node=None, report=claim),
        NOW,
    )
    assert retry.decision == "admitted"


def test_a_node_that_is_itself_held_does_not_count_twice():
    # Given the node is the one held (its earlier remediation was rejected and kept)
    held = [{"instance_id": "i-new", "remediation_id": "r-old", "at": _ago(3)}]
    out = decide(_req(max_fraction=0.01), GuardSnapshot(node=None, held=held), NOW)
    assert out.decision == "admitted"


def test_two_items_of_one_alarm_naming_the_same_instance_are_one_admission():
    # Given item 0 of this execution admitted the node
    node = {"open": True, "remediation_id": "r-1", "execution": "arn:exec:1", "item": 0}
    # When item 1 of the same execution names it again, and item 0's Lambda is retried
    twice = decide(_req(item=1), GuardSnapshot(node=node, open_instances=["i-new"]), NOW)
    retry = decide(_req(item=0), GuardSnapshot(node=node, open_instances=["i-new"]), NOW)
    # Then the second naming is a duplicate, the retry the same admission
    assert (twice.decision, twice.remediation_id) == ("duplicate", "r-1")
    assert "twice" in twice.reason
    assert (retry.decision, retry.remediation_id) == ("admitted", "r-1")


def test_a_second_naming_after_the_first_item_already_ended_is_still_a_duplicate():
    admissions = [{"instance_id": "i-new", "at": _ago(0.1), "execution": "arn:exec:1", "item": 0}]
    node = {"open": False, "remediation_id": "r-1", "execution": "arn:exec:1", "item": 0}
    out = decide(_req(item=3), GuardSnapshot(node=node, admissions=admissions), NOW)
    assert out.decision == "duplicate"
