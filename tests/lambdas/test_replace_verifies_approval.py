"""Replace acts only on the decision the approvals table holds (issue 32: the task token is in
the execution's history, so a principal that may read it and send task results could resume
the workflow with ``{"decision": "approve", "approver": <anyone>}`` and replace a node nobody
approved, past the claim and ``decide_by``)."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber
from remediation_factories import ALICE, APPROVALS, approved, item_state

from sdc_remediation import aws
from sdc_remediation.dal.approvals import Approvals
from sdc_remediation.errors import ApprovalNotVerified
from sdc_remediation.logic.decision import verify_decision
from sdc_remediation.models import ApprovalDecision, ItemState

MALLORY = "arn:aws:iam::123456789012:role/ci-admin"


@pytest.fixture
def sagemaker(cloud):
    """The SageMaker client stubbed with no responses: any replacement call fails the test."""
    with Stubber(aws.client("sagemaker")) as stub:
        yield stub
        stub.assert_no_pending_responses()


def _pending_request(instance_id: str, execution: str = "exec-1") -> str:
    approval_id, _ = Approvals(APPROVALS).create(
        task_token=f"token-pending-{instance_id}",
        remediation_id=None,
        instance_id=instance_id,
        node_name=f"hyperpod-{instance_id}",
        evidence={},
        ttl_seconds=2 * 86400,
        execution=execution,
        timeout_seconds=86400,
    )
    return approval_id


def test_a_forged_approval_of_an_undecided_request_replaces_nothing(cloud, sagemaker, invoke):
    # Given a request nobody decided, and a message that SendTaskSuccess carried straight from a
    # principal with the token, naming an approver of its choice
    node = cloud.nodes[0]
    forged = {"decision": "approve", "approver": ALICE, "approval_id": _pending_request(node)}

    # When / Then: refused with the typed error, and no SageMaker call was made
    with pytest.raises(ApprovalNotVerified, match="pending"):
        invoke("replace", item_state(node, approval=forged))


def test_an_approval_id_the_table_does_not_have_replaces_nothing(cloud, sagemaker, invoke):
    # Given a made-up approval id
    forged = {"decision": "approve", "approver": ALICE, "approval_id": "a-0000000000000000"}

    # When / Then
    with pytest.raises(ApprovalNotVerified, match="no such request"):
        invoke("replace", item_state(cloud.nodes[0], approval=forged))


def test_a_real_approval_sent_under_another_approver_replaces_nothing(cloud, sagemaker, invoke):
    # Given alice approved the node through the approve function, and the workflow receives the
    # same approval id with another approver
    node = cloud.nodes[0]
    decision = {**approved(node), "approver": MALLORY}

    # When / Then
    with pytest.raises(ApprovalNotVerified, match="decided by"):
        invoke("replace", item_state(node, approval=decision))


def test_an_approval_of_another_node_or_execution_replaces_nothing(cloud, sagemaker, invoke):
    # Given a person approved node A in execution exec-1
    a, b = cloud.nodes[0], cloud.nodes[1]
    decision = approved(a)

    # When its decision reaches node B's item, or another execution's item of node A / Then
    with pytest.raises(ApprovalNotVerified, match="node_name"):
        invoke("replace", item_state(b, approval=decision))
    with pytest.raises(ApprovalNotVerified, match="execution"):
        invoke("replace", item_state(a, execution="exec-2", approval=decision))


def test_a_rejection_sent_as_an_approval_replaces_nothing(cloud, sagemaker, invoke):
    # Given a person rejected the node (kept cordoned), and the message says approve
    node = cloud.nodes[0]
    decision = {**approved(node, decision="reject"), "decision": "approve"}

    # When / Then
    with pytest.raises(ApprovalNotVerified, match="reject"):
        invoke("replace", item_state(node, approval=decision))


def _record(**overrides: object) -> dict:
    base = {
        "approval_id": "a-1",
        "status": "approved",
        "decision": "approve",
        "approver": ALICE,
        "decided_at": "2026-12-01T10:00:00Z",
        "decide_by": 2_000_000_000,
        "expires_at": 2_000_086_400,
        "node_name": "hyperpod-i-00000000000000001",
        "instance_id": "i-00000000000000001",
        "execution": "exec-1",
    }
    return {**base, **overrides}


def _state() -> ItemState:
    return ItemState.model_validate(item_state("i-00000000000000001"))


def test_a_claimed_decision_is_accepted_before_its_status_says_approved():
    # Given the approve function's send resumed the workflow and it has not yet written
    # `approved` (the status is still `sending`), or it has
    decision = ApprovalDecision(decision="approve", approver=ALICE, approval_id="a-1")

    # When / Then: both verify (fault-free: no false refusal)
    verify_decision(_record(status="sending"), decision, _state())
    verify_decision(_record(), decision, _state())


def test_a_decision_claimed_after_its_deadline_is_refused():
    # Given a record whose claim is dated after decide_by (a tampered or replayed record)
    decision = ApprovalDecision(decision="approve", approver=ALICE, approval_id="a-1")
    late = _record(decide_by=1_764_583_200, expires_at=1_764_583_200 + 86_400)

    # When / Then
    with pytest.raises(ApprovalNotVerified, match="after its deadline"):
        verify_decision(late, decision, _state())
    with pytest.raises(ApprovalNotVerified, match="no decision time"):
        verify_decision(_record(decided_at=None), decision, _state())


def test_a_forged_reject_with_release_uncordons_nothing(cloud, k8s, invoke):
    # Given a node this remediation cordoned, a request nobody decided, and a message sent
    # straight with the token asking to reject and release
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}")
    admission = {"decision": "admitted", "remediation_id": "r-1", "reason": "admitted"}
    invoke("cordon", item_state(node, admission=admission))
    forged = {
        "decision": "reject",
        "release": True,
        "approver": ALICE,
        "approval_id": _pending_request(node),
    }

    # When / Then: refused, and the node stays cordoned (one PATCH: the cordon)
    with pytest.raises(ApprovalNotVerified):
        invoke("uncordon", item_state(node, admission=admission, approval=forged))
    assert len(k8s.patches) == 1 and k8s.nodes[f"hyperpod-{node}"]["spec"]["unschedulable"]


def test_a_rejection_without_release_sent_as_one_with_release_uncordons_nothing(cloud, k8s, invoke):
    # Given a person rejected the node and asked to keep it cordoned
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}")
    admission = {"decision": "admitted", "remediation_id": "r-1", "reason": "admitted"}
    invoke("cordon", item_state(node, admission=admission))
    decision = {**approved(node, decision="reject", release=False), "release": True}

    # When / Then
    with pytest.raises(ApprovalNotVerified, match="release"):
        invoke("uncordon", item_state(node, admission=admission, approval=decision))
    assert k8s.nodes[f"hyperpod-{node}"]["spec"]["unschedulable"] is True
