"""The record step writes the approver the approvals table holds, never the one in the workflow's
message (issue 32): whoever holds the task token (it is in the execution's history) may resume
the workflow naming any approver, and the ledger, and precision after it, must not record a
person who never decided."""

from __future__ import annotations

from typing import Any

from remediation_factories import ALICE, APPROVALS, LEDGER, approved, item_state

from sdc_remediation.dal import ledger
from sdc_remediation.dal.approvals import Approvals

MALLORY = "arn:aws:iam::123456789012:role/ci-admin"


def _recorded(instance_id: str, transition: str) -> dict[str, Any]:
    (event,) = [
        e for e in ledger.Ledger(LEDGER).events(instance_id) if e["transition"] == transition
    ]
    return event


def test_the_approver_recorded_is_the_tables_when_the_message_names_another(cloud, invoke):
    # Given Alice's approval, claimed through the approve function, and a message to the
    # workflow that names Mallory instead (sent with the token by someone else)
    node = cloud.nodes[0]
    approval = {**approved(node, approver=ALICE), "approver": MALLORY, "reason": "forged"}

    # When the record step records the replacement
    invoke("record", {"transition": "replaced", "state": item_state(node, approval=approval)})

    # Then the ledger names Alice, with the table's decision, not the message's reason, and
    # says what the message claimed
    event = _recorded(node, "replaced")
    assert event["approver"] == ALICE
    assert event["decision"] == "approve"
    assert event["reason"] == ""
    assert MALLORY in event["detail"]


def test_a_decision_nobody_claimed_is_recorded_as_no_decision(cloud, invoke):
    # Given a request still pending in the table, and a forged approval of it
    node = cloud.nodes[0]
    approval_id, _ = Approvals(APPROVALS).create(
        task_token="token-pending",
        remediation_id=None,
        instance_id=node,
        node_name=f"hyperpod-{node}",
        evidence={},
        ttl_seconds=2 * 86400,
        execution="exec-1",
        timeout_seconds=86400,
    )
    forged = {"decision": "approve", "approver": MALLORY, "approval_id": approval_id}
    error = {"Error": "ApprovalNotVerified", "Cause": "forged"}

    # When the workflow records the failure replace ended with
    invoke(
        "record",
        {"transition": "failed", "state": item_state(node, approval=forged), "error": error},
    )

    # Then no decision and no approver are recorded, and the claim is kept as unverified
    event = _recorded(node, "failed")
    assert event.get("approver") is None
    assert event.get("decision") is None
    assert "unverified_approval" in event["detail"] and MALLORY in event["detail"]


def test_an_approval_of_another_node_does_not_lend_its_approver(cloud, invoke):
    # Given Alice's genuine approval of one node, sent in the message of another node's item
    first, second = cloud.nodes[:2]
    approval = approved(first, approver=ALICE)

    # When the second node's item records a replacement with it
    invoke("record", {"transition": "replaced", "state": item_state(second, approval=approval)})

    # Then the second node's event names no approver
    event = _recorded(second, "replaced")
    assert event.get("approver") is None and event.get("decision") is None
    assert "instance_id" in event["detail"]


def test_the_approvers_own_message_is_recorded_as_sent(cloud, invoke):
    # Given Alice's approval, sent unchanged
    node = cloud.nodes[0]
    approval = {**approved(node, approver=ALICE), "reason": "bad GPU"}

    # When it is recorded, then her name, decision and reason are
    invoke("record", {"transition": "replaced", "state": item_state(node, approval=approval)})
    event = _recorded(node, "replaced")
    assert (event["approver"], event["decision"], event["reason"]) == (ALICE, "approve", "bad GPU")
    assert "unverified_approval" not in event.get("detail", "")
