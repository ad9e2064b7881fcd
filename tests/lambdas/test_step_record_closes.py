"""record closes a remediation on every terminal transition, so the node and its guard slot are
free again: a later alarm is admitted, never swallowed as a duplicate."""

from __future__ import annotations

from typing import Any

import pytest
from remediation_factories import CLUSTER, LEDGER, item_state, ledger_item

from sdc_remediation.dal import keys, ledger
from sdc_remediation.logic.admission import AdmitRequest, decide

FAILURE = {"Error": "ClusterApiUnavailable", "Cause": '{"errorMessage": "API down"}'}


def _admit_on_32_nodes(instance_id: str, execution: str) -> dict[str, Any]:
    """Admission as the admit step does it, for a 32-node cluster with the default limits:
    MAX_FRACTION 0.05 -> at most max(1, floor(1.6)) = 1 node open; MAX_NODES_PER_HOUR 2."""
    decision = ledger.Ledger(LEDGER).admit(
        AdmitRequest(
            cluster=CLUSTER,
            instance_id=instance_id,
            node_name=f"hyperpod-{instance_id}",
            execution=execution,
            cluster_nodes=32,
            max_nodes_per_hour=2,
            max_fraction=0.05,
        ),
        decide,
    )
    return {
        "decision": decision.decision,
        "remediation_id": decision.remediation_id,
        "reason": decision.reason,
    }


def _record(invoke, transition: str, node: str, execution: str, admission: dict, **extra) -> None:
    invoke(
        "record",
        {
            "transition": transition,
            "notify": True,
            "state": item_state(node, execution=execution, admission=admission),
            **extra,
        },
    )


def test_a_new_alarm_after_a_failed_remediation_is_admitted_again(cloud, invoke):
    # Given a remediation that failed after admission (e.g. the Kubernetes API was down)
    node = cloud.nodes[0]
    first = invoke("admit", item_state(node, execution="e1"))
    _record(invoke, "failed", node, "e1", first, error=FAILURE)

    # When the GPU keeps corrupting and a new alarm names the same node
    second = invoke("admit", item_state(node, execution="e2"))

    # Then: a new remediation is admitted (not a silent duplicate), and it is the one open now
    assert second["decision"] == "admitted"
    assert second["remediation_id"] != first["remediation_id"]
    state = ledger_item(keys.state(node))
    assert state["open"] is True and state["remediation_id"] == second["remediation_id"]
    assert ledger_item(keys.guard(CLUSTER))["open_instances"] == [node]


@pytest.mark.parametrize("terminal", ["rejected", "approval_timed_out", "failed"])
def test_a_node_kept_cordoned_holds_its_guard_slot_until_released(cloud, invoke, terminal):
    # Given a 32-node cluster (one node out of service at most) whose first suspect was kept
    # cordoned by the operator, whose approval timed out, or whose remediation failed
    a, b = cloud.nodes[:2]
    first = _admit_on_32_nodes(a, "e-a")
    _record(
        invoke, terminal, a, "e-a", first, **({"error": FAILURE} if terminal == "failed" else {})
    )

    # When another node alarms while the first is still cordoned, then after an operator
    # released the first one
    while_held = _admit_on_32_nodes(b, "e-b0")
    ledger.Ledger(LEDGER).release(CLUSTER, f"hyperpod-{a}", released_by="arn:aws:iam::1:user/op")
    after_release = _admit_on_32_nodes(b, "e-b1")

    # Then: the remediation ended (a new alarm on the node is not a silent duplicate), but the
    # cordoned node held its slot until released
    assert ledger_item(keys.state(a))["open"] is False
    assert ledger_item(keys.state(a))["status"] == terminal
    assert while_held["decision"] == "circuit_open"
    assert "not released" in while_held["reason"]
    assert after_release["decision"] == "admitted"
    guard = ledger_item(keys.guard(CLUSTER))
    assert guard["open_instances"] == [b]
    assert [h["instance_id"] for h in guard["held"]] == [b]
    # And the release is in the node's history with who released it
    released = [e for e in ledger.Ledger(LEDGER).events(a) if e["transition"] == "released"]
    assert [e["approver"] for e in released] == ["arn:aws:iam::1:user/op"]


def test_a_replaced_or_released_node_frees_its_slot_at_once(cloud, invoke):
    # Given a 32-node cluster: one node replaced, then another uncordoned by the workflow
    a, b, c = cloud.nodes[:3]
    first = _admit_on_32_nodes(a, "e-a")
    _record(invoke, "replaced", a, "e-a", first)
    second = _admit_on_32_nodes(b, "e-b")
    _record(invoke, "released", b, "e-b", second)

    # When a third node alarms (the hourly cap is 2: lift it for this test)
    third = ledger.Ledger(LEDGER).admit(
        AdmitRequest(
            cluster=CLUSTER,
            instance_id=c,
            node_name=f"hyperpod-{c}",
            execution="e-c",
            cluster_nodes=32,
            max_nodes_per_hour=10,
            max_fraction=0.05,
        ),
        decide,
    )

    # Then both earlier nodes were admitted in turn and nothing holds the slot any more
    assert second["decision"] == "admitted"
    assert third.decision == "admitted"


def test_a_bug_that_fails_every_remediation_cannot_cordon_more_than_the_limit(cloud, invoke):
    # Given a bug that fails every remediation right after the cordon, and alarms on 10 nodes
    # spread over 12 hours (each hour's cap would admit 2 more if failures freed their slots)
    from datetime import UTC, datetime, timedelta

    from sdc_remediation import clock

    start = datetime.now(UTC) - timedelta(hours=12)
    decisions = []
    for hour, node in enumerate(cloud.nodes[:10]):
        moment = start + timedelta(hours=hour, minutes=1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(clock, "now", lambda moment=moment: moment)
            admission = _admit_on_32_nodes(node, f"e-{hour}")
            decisions.append(admission["decision"])
            if admission["decision"] == "admitted":
                _record(invoke, "failed", node, f"e-{hour}", admission, error=FAILURE)

    # Then only as many nodes as MAX_FRACTION allows (1 of 32) were ever admitted
    assert decisions.count("admitted") == 1
    assert set(decisions[1:]) == {"circuit_open"}


def test_closed_remediations_still_count_towards_the_hourly_cap(cloud, invoke):
    # Given two remediations admitted and replaced within the hour (MAX_NODES_PER_HOUR=2)
    a, b, c = cloud.nodes[:3]
    for node, execution in ((a, "e-a"), (b, "e-b")):
        admission = _admit_on_32_nodes(node, execution)
        _record(invoke, "replaced", node, execution, admission)

    # When a third node alarms in the same hour
    third = _admit_on_32_nodes(c, "e-c")

    # Then: the hourly cap still holds although nothing is open
    assert third["decision"] == "circuit_open"
    assert "MAX_NODES_PER_HOUR" in third["reason"]
    assert ledger_item(keys.guard(CLUSTER))["open_instances"] == []


def test_a_failure_after_a_duplicate_does_not_close_the_remediation_in_flight(cloud, invoke):
    # Given a node with a remediation in flight, and a second alarm for it found duplicate
    node = cloud.nodes[0]
    first = invoke("admit", item_state(node, execution="e1"))
    dup = invoke("admit", item_state(node, execution="e2"))

    # When the second execution fails (its admission names the first remediation's id)
    _record(invoke, "failed", node, "e2", dup, error=FAILURE)

    # Then: the first remediation is still open and still holds its guard slot
    assert dup["decision"] == "duplicate"
    assert dup["remediation_id"] == first["remediation_id"]
    state = ledger_item(keys.state(node))
    assert state["open"] is True and state["remediation_id"] == first["remediation_id"]
    assert state["status"] == "admitted"
    assert ledger_item(keys.guard(CLUSTER))["open_instances"] == [node]
    assert invoke("admit", item_state(node, execution="e3"))["decision"] == "duplicate"
