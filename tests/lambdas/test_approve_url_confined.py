"""The approve URL confined by caller (issue 32: request_approval's role, which may call the URL
to settle the canary's approval, could approve, reject or release any node through it)."""

from __future__ import annotations

import json

import pytest
from remediation_factories import APPROVALS

import sdc_contract as contract
from sdc_remediation.dal.approvals import Approvals
from sdc_remediation.logic import canary
from sdc_remediation.logic.operator_api import role_name_of

ROLE = "sdc-request-approval-role"
REQUEST_APPROVAL = f"arn:aws:sts::123456789012:assumed-role/{ROLE}/sdc-request-approval-fn"
ONCALL = "arn:aws:sts::123456789012:assumed-role/oncall/alice"


def _event(caller: str, body: dict) -> dict:
    """A function URL (payload 2.0) event Lambda authenticated as ``caller``."""
    return {
        "version": "2.0",
        "requestContext": {
            "http": {"method": "POST", "path": "/"},
            "authorizer": {"iam": {"userArn": caller}},
        },
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


@pytest.fixture
def confined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The approve function knows request_approval's role, as infra sets it."""
    monkeypatch.setenv(contract.APPROVAL_REQUESTER_ROLE, ROLE)


def _pending(instance: str) -> str:
    approval_id, _ = Approvals(APPROVALS).create(
        task_token=f"token-{instance}",
        remediation_id=None,
        instance_id=instance,
        node_name=f"hyperpod-{instance}",
        evidence={},
        ttl_seconds=2 * 86400,
        execution="exec-1",
        timeout_seconds=86400,
    )
    return approval_id


@pytest.mark.parametrize(
    "body",
    [
        {"action": "approve", "approval_id": "A"},
        {"action": "reject", "approval_id": "A", "release": True},
        {"action": "release", "node": "N"},
        {"action": "pending"},
    ],
)
def test_request_approvals_role_may_not_decide_or_release_a_node(cloud, invoke, confined, body):
    # Given a real node's approval waiting for a person
    instance = cloud.nodes[0]
    approval_id = _pending(instance)
    body = {k: approval_id if v == "A" else f"hyperpod-{instance}" if v == "N" else v
            for k, v in body.items()}  # fmt: skip

    # When request_approval's role calls the URL with a person's action
    response = invoke("approve", _event(REQUEST_APPROVAL, body))

    # Then it is refused by name (403) and the approval is still pending
    assert response["statusCode"] == 403
    assert json.loads(response["body"])["error"] == "CallerNotAllowed"
    assert Approvals(APPROVALS).get(approval_id)["status"] == "pending"


def test_request_approvals_role_may_still_ask_to_settle_and_an_operator_may_decide(
    cloud, invoke, confined
):
    # Given a real node's approval waiting for a person
    approval_id = _pending(cloud.nodes[0])

    # When request_approval's role asks to settle it as the canary, and an operator lists it
    settle = invoke(
        "approve",
        _event(REQUEST_APPROVAL, {"action": canary.SETTLE_ACTION, "approval_id": approval_id}),
    )
    listed = invoke("approve", _event(ONCALL, {"action": "pending"}))

    # Then the canary action is reached (and refuses a real node's approval, as before), and the
    # operator's call is served (fault-free: nobody else is confined)
    assert json.loads(settle["body"])["error"] == "CanaryApprovalRefused"
    assert listed["statusCode"] == 200
    assert [p["approval_id"] for p in json.loads(listed["body"])["pending"]] == [approval_id]


def test_role_names_are_read_from_the_callers_arn():
    # Given ARNs the function URL may authenticate / When / Then
    assert role_name_of(REQUEST_APPROVAL) == ROLE
    assert role_name_of(f"arn:aws:iam::123456789012:role/{ROLE}") == ROLE
    assert role_name_of("arn:aws:iam::123456789012:user/alice") is None
    assert role_name_of("arn:aws:sts::123456789012:federated-user/x") is None
    assert role_name_of("not an arn") is None


def test_the_requester_role_setting_takes_an_emulator_length_name_and_refuses_an_arn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's server names a stack's role past IAM's 64 characters (the deploy rehearsal's
    `SdcGuard-sdc-local-FunctionsRequestApprovalRole…`): the setting takes it, as the stack sets
    it from a role that exists. An ARN or a path is not a role name and is refused by name."""
    from sdc_remediation.config import settings
    from sdc_remediation.errors import ConfigurationError

    long_name = "SdcGuard-sdc-local-FunctionsRequestApprovalRole6685434B-6Q8T1VK3E8GN"
    monkeypatch.setenv(contract.APPROVAL_REQUESTER_ROLE, long_name)
    assert settings().approval_requester_role == long_name
    monkeypatch.setenv(contract.APPROVAL_REQUESTER_ROLE, f"arn:aws:iam::123456789012:role/{ROLE}")
    with pytest.raises(ConfigurationError, match=contract.APPROVAL_REQUESTER_ROLE):
        _ = settings().approval_requester_role
