"""Opt-in auto-approval at RequestApproval: the policy approves on a failed deep health check,
or on a check x verdict whose measured precision over enough decided remediations reaches the
threshold, and records itself and its inputs as the approver; below the threshold (or with too
few events, or without a policy) a person decides. SendTaskSuccess is stubbed (Stubber)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from remediation_factories import APPROVALS, CLUSTER, item_state

from sdc_remediation import aws, clock
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import from_item, to_item

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
HEALTH = {"started_at": "2026-11-29T10:00:00.000Z", "checks": ["InstanceStress"], "detail": ""}


def _approvals() -> list[dict[str, Any]]:
    return [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]


def _request(invoke, node: str, health: str) -> None:
    admission = invoke("admit", item_state(node))
    state = item_state(node, admission=admission, health={**HEALTH, "status": health})
    assert invoke("request_approval", {**state, "task_token": TOKEN}) is None


def _seed_outcomes(right: int, wrong: int) -> None:
    """compute/persistent remediations of other nodes: `right` confirmed by a failed health
    check, `wrong` rejected by a person (each on its own job, days apart: no recurrence)."""
    ddb = aws.client("dynamodb")
    start = clock.now() - timedelta(days=60)
    for n in range(right + wrong):
        at = start + timedelta(days=n)
        pk = f"i-{0xA00 + n:017x}"
        steps = ["admitted", "cordoned", "health_check_failed" if n < right else "rejected"]
        for k, transition in enumerate(steps):
            moment = clock.iso(at + timedelta(minutes=k))
            item = {
                **keys.event(pk, moment, f"r-{n}"),
                "remediation_id": f"r-{n}",
                "transition": transition,
                "at": moment,
                "cluster": CLUSTER,
                "check": "compute",
                "verdict": "persistent",
                "job": f"job-{n}",
            }
            if transition == "rejected":
                item["decision"] = "reject"
                item["approver"] = "arn:aws:iam::123456789012:user/alice"
            ddb.put_item(TableName="sdc-ledger", Item=to_item(item))


def _expect_send(sfn: Stubber) -> None:
    sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})


def test_a_failed_health_check_is_approved_by_the_policy(cloud, invoke, monkeypatch):
    # Given the policy approves on a failed deep health check
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"onHealthCheckFailed": True}))

    # When a remediation whose health check failed reaches RequestApproval
    with Stubber(aws.client("stepfunctions")) as sfn:
        _expect_send(sfn)
        _request(invoke, cloud.nodes[0], "failed")
        sfn.assert_no_pending_responses()

    # Then the workflow was resumed with an approval whose approver is the policy
    (stored,) = _approvals()
    assert stored["status"] == "approved"
    assert stored["approver"] == "policy:sdc-guard-auto-approve/health-check-failed"
    assert "deep health check failed" in stored["reason"]
    # And the on-call is told that no person decided (and not asked to approve)
    (message,) = cloud.sns_messages()
    assert "auto-approved replacing" in message["subject"]
    assert "no person decided" in message["message"]
    assert "policy:sdc-guard-auto-approve/health-check-failed" in message["message"]


def test_a_passed_health_check_is_not_approved_by_the_health_rule(cloud, invoke, monkeypatch):
    # Given only the health-check rule
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"onHealthCheckFailed": True}))

    # When the health check passed (no SendTaskSuccess may happen: the Stubber has none)
    with Stubber(aws.client("stepfunctions")) as sfn:
        _request(invoke, cloud.nodes[0], "passed")
        sfn.assert_no_pending_responses()

    # Then a person is asked, as without a policy
    (stored,) = _approvals()
    assert stored["status"] == "pending"
    (message,) = cloud.sns_messages()
    assert "approve replacing" in message["subject"]


def test_precision_at_or_above_the_threshold_is_approved(cloud, invoke, monkeypatch):
    # Given compute/persistent right 19 times of 20 decided, and a 0.9 / 20-event policy
    _seed_outcomes(right=19, wrong=1)
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 0.9, "minEvents": 20}))

    # When a compute/persistent remediation (health check passed) reaches RequestApproval
    with Stubber(aws.client("stepfunctions")) as sfn:
        _expect_send(sfn)
        _request(invoke, cloud.nodes[0], "passed")
        sfn.assert_no_pending_responses()

    # Then the policy approved it, naming its inputs
    (stored,) = _approvals()
    assert stored["status"] == "approved"
    assert stored["approver"] == "policy:sdc-guard-auto-approve/precision"
    assert (
        "compute/persistent precision 0.950 (19 right of 20 decided, one per job"
        in stored["reason"]
    )
    assert "minPrecision=0.9, minEvents=20" in stored["reason"]


@pytest.mark.parametrize(
    ("right", "wrong", "why"),
    [
        (17, 3, "below the auto-approval threshold: compute/persistent precision 0.850"),
        (9, 0, "has 9 decided remediation(s) of distinct jobs, fewer than minEvents=20"),
    ],
)
def test_precision_below_the_threshold_or_too_few_events_is_refused(
    cloud, invoke, monkeypatch, right, wrong, why
):
    # Given a 0.9 / 20-event policy and a check that is not good enough (or not yet known)
    _seed_outcomes(right=right, wrong=wrong)
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 0.9, "minEvents": 20}))

    # When (no SendTaskSuccess may happen)
    with Stubber(aws.client("stepfunctions")) as sfn:
        _request(invoke, cloud.nodes[0], "passed")
        sfn.assert_no_pending_responses()

    # Then a person decides, and the evidence says why the policy did not
    (stored,) = _approvals()
    assert stored["status"] == "pending"
    evidence = json.loads(stored["evidence"])
    assert evidence["auto_approval"]["approve"] is False
    assert why in evidence["auto_approval"]["reason"]


def test_a_bad_policy_is_a_configuration_error_naming_the_variable(cloud, invoke, monkeypatch):
    # Given a policy with a threshold above 1
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 1.5}))

    # Then the step refuses with the variable's name
    with pytest.raises(Exception, match="AUTO_APPROVE: minPrecision must be a number in"):
        _request(invoke, cloud.nodes[0], "passed")
