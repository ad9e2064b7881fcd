"""record closes a remediation on every terminal transition, so the node and its guard slot are
free again: a later alarm is admitted, never swallowed as a duplicate."""

from __future__ import annotations

from typing import Any

import pytest
from remediation_factories import CLUSTER, LEDGER, item_state

from sdc_remediation import aws, ledger
from sdc_remediation.dynamo import from_item, to_item

FAILURE = {"Error": "ClusterApiUnavailable", "Cause": '{"errorMessage": "API down"}'}


def _item(pk: str, sk: str) -> dict | None:
    ddb = aws.client("dynamodb")
    return from_item(ddb.get_item(TableName=LEDGER, Key=to_item({"pk": pk, "sk": sk})).get("Item"))


def _admit_on_32_nodes(instance_id: str, execution: str) -> dict[str, Any]:
    """Admission as the admit step does it, for a 32-node cluster with the default limits:
    MAX_FRACTION 0.05 -> at most max(1, floor(1.6)) = 1 node open; MAX_NODES_PER_HOUR 2."""
    decision = ledger.Ledger(LEDGER).admit(
        ledger.AdmitRequest(
            cluster=CLUSTER,
            instance_id=instance_id,
            node_name=f"hyperpod-{instance_id}",
            execution=execution,
            cluster_nodes=32,
            max_nodes_per_hour=2,
            max_fraction=0.05,
        )
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
    state = _item(node, "STATE")
    assert state["open"] is True and state["remediation_id"] == second["remediation_id"]
    assert _item(ledger.guard_pk(CLUSTER), "GUARD")["open_instances"] == [node]


@pytest.mark.parametrize("terminal", ["rejected", "approval_timed_out"])
def test_a_node_kept_cordoned_frees_the_guard_of_a_small_cluster(cloud, invoke, terminal):
    # Given a 32-node cluster (one remediation open at most) whose first suspect was kept
    # cordoned by the operator, or whose approval timed out
    a, b = cloud.nodes[:2]
    first = _admit_on_32_nodes(a, "e-a")
    blocked = _admit_on_32_nodes(b, "e-b0")
    _record(invoke, terminal, a, "e-a", first)

    # When another node alarms
    other = _admit_on_32_nodes(b, "e-b1")

    # Then: it was blocked while the first was in flight, and is admitted once that ended
    assert blocked["decision"] == "circuit_open" and "MAX_FRACTION" in blocked["reason"]
    assert other["decision"] == "admitted"
    assert _item(a, "STATE")["open"] is False
    assert _item(a, "STATE")["status"] == terminal
    assert _item(ledger.guard_pk(CLUSTER), "GUARD")["open_instances"] == [b]


def test_closed_remediations_still_count_towards_the_hourly_cap(cloud, invoke):
    # Given two remediations admitted and rejected within the hour (MAX_NODES_PER_HOUR=2)
    a, b, c = cloud.nodes[:3]
    for node, execution in ((a, "e-a"), (b, "e-b")):
        admission = _admit_on_32_nodes(node, execution)
        _record(invoke, "rejected", node, execution, admission)

    # When a third node alarms in the same hour
    third = _admit_on_32_nodes(c, "e-c")

    # Then: the hourly cap still holds although nothing is open
    assert third["decision"] == "circuit_open"
    assert "MAX_NODES_PER_HOUR" in third["reason"]
    assert _item(ledger.guard_pk(CLUSTER), "GUARD")["open_instances"] == []


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
    state = _item(node, "STATE")
    assert state["open"] is True and state["remediation_id"] == first["remediation_id"]
    assert state["status"] == "admitted"
    assert _item(ledger.guard_pk(CLUSTER), "GUARD")["open_instances"] == [node]
    assert invoke("admit", item_state(node, execution="e3"))["decision"] == "duplicate"
