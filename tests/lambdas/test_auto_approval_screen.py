"""Auto-approval that requires a reproduced screen (``AUTO_APPROVE_REQUIRES_SCREEN``, context key
``autoApproveRequiresScreen``, issue 35): with it on, the policy approves a replacement only when
the node screen reproduced the fault on that node; any other outcome (clean, inconclusive,
failed, not configured, skipped, none) asks a person and says why. Off: unchanged. A clean
screen never releases a node. SendTaskSuccess is stubbed (Stubber): a call it does not expect
fails the test."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from remediation_factories import APPROVALS, item_state, ledger_item

from sdc_contract.autoapprove import AutoApprovePolicy
from sdc_remediation import aws
from sdc_remediation.config import Settings
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import from_item
from sdc_remediation.errors import ConfigurationError
from sdc_remediation.logic import autoapprove
from sdc_remediation.logic.screen import job_name
from sdc_remediation.models import ApprovalRequestInput
from tests.e2e.harness.kube_jobs import JobsStandIn
from tests.lambdas.test_screen_step import IMAGE, NAMESPACE, UUID, document

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
HEALTH = {"started_at": "2026-11-29T10:00:00.000Z", "checks": ["InstanceStress"], "detail": ""}
ON_HEALTH_FAILED = json.dumps({"onHealthCheckFailed": True})
OTHER_OUTCOMES = ["clean", "inconclusive", "failed", "not_configured", "skipped"]


def _approvals() -> list[dict[str, Any]]:
    return [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]


def _screen(state: dict[str, Any], status: str) -> dict[str, Any]:
    """A finished screen of ``status`` as the Screen step leaves it at ``$.screen`` for this
    item (its own Job)."""
    result: dict[str, Any] = {
        "status": status,
        "job": job_name(ApprovalRequestInput.model_validate({**state, "task_token": TOKEN})),
        "namespace": NAMESPACE,
        "deleted": True,
    }
    if status == "reproduced":
        result.update(gpu_index=3, gpu_uuid=UUID, reason="device 3 reproduced")
    elif status == "clean":
        result.update(ran="gemm x6, sdpa x1; 8 GPU(s)", reason="clean")
    elif status == "failed":
        result.update(reason="the screen Job never started within its deadline (600 s)")
    return result


def _state(invoke, node: str, health: str, screen: str | None) -> dict[str, Any]:
    admission = invoke("admit", item_state(node))
    state = item_state(node, admission=admission, health={**HEALTH, "status": health})
    if screen is not None:
        state["screen"] = _screen(state, screen)
    return state


def _request(invoke, state: dict[str, Any]) -> None:
    assert invoke("request_approval", {**state, "task_token": TOKEN}) is None


def _expect_send(sfn: Stubber) -> None:
    sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})


def _decide(invoke, state: dict[str, Any], *, approves: bool) -> dict[str, Any]:
    """Ask for the approval with SendTaskSuccess stubbed (expected only when the policy
    approves, so an unexpected decision fails), and return the stored request."""
    with Stubber(aws.client("stepfunctions")) as sfn:
        if approves:
            _expect_send(sfn)
        _request(invoke, state)
        sfn.assert_no_pending_responses()
    (stored,) = _approvals()
    return stored


def _person_asked(invoke, state: dict[str, Any]) -> str:
    """Ask for the approval, check that a person is asked (the request is pending), and return
    the policy's reason for not approving."""
    stored = _decide(invoke, state, approves=False)
    assert stored["status"] == "pending"
    return json.loads(stored["evidence"])["auto_approval"]["reason"]


@pytest.fixture
def requires_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The health-check rule, with a reproduced screen required."""
    monkeypatch.setenv("AUTO_APPROVE", ON_HEALTH_FAILED)
    monkeypatch.setenv("AUTO_APPROVE_REQUIRES_SCREEN", "true")


def test_a_reproduced_screen_lets_the_policy_approve(cloud, invoke, requires_screen):
    # Given a failed health check and a screen that reproduced the fault on GPU 3 of this node
    state = _state(invoke, cloud.nodes[0], "failed", "reproduced")

    # When RequestApproval runs
    # Then the policy approved, and its reason names the screen and the key
    stored = _decide(invoke, state, approves=True)
    assert stored["status"] == "approved"
    assert stored["approver"] == "policy:sdc-guard-auto-approve/health-check-failed"
    assert f"screen reproduced on GPU 3 (UUID {UUID})" in stored["reason"]
    assert "autoApproveRequiresScreen=true" in stored["reason"]
    (message,) = cloud.sns_messages()
    assert "auto-approved replacing" in message["subject"]
    assert "no person decided" in message["message"]


@pytest.mark.parametrize("outcome", OTHER_OUTCOMES)
def test_any_other_screen_outcome_asks_a_person_and_says_why(
    cloud, invoke, requires_screen, outcome
):
    # Given a failed health check (the policy's rule holds) and a screen that did not reproduce
    state = _state(invoke, cloud.nodes[0], "failed", outcome)

    # When RequestApproval runs (no SendTaskSuccess may happen: the Stubber has none)
    # Then a person is asked, and both the evidence and the message say why not the policy
    stored = _decide(invoke, state, approves=False)
    assert stored["status"] == "pending"
    why = f"auto-approval needs a reproduced screen: screen {outcome.replace('_', ' ')}"
    evidence = json.loads(stored["evidence"])
    assert evidence["auto_approval"]["approve"] is False
    assert why in evidence["auto_approval"]["reason"]
    (message,) = cloud.sns_messages()
    assert "approve replacing" in message["subject"]
    assert f"Auto-approval:  not applied: {why}" in message["message"]


def test_no_screen_at_all_asks_a_person(cloud, invoke, requires_screen):
    # Given a failed health check and no screen in the state
    state = _state(invoke, cloud.nodes[0], "failed", None)

    reason = _person_asked(invoke, state)
    assert "auto-approval needs a reproduced screen: screen not run" in reason


def test_a_screen_caught_as_an_error_is_a_failed_screen_and_asks_a_person(
    cloud, invoke, requires_screen
):
    # Given the workflow's Catch put the Screen step's error at $.screen
    state = _state(invoke, cloud.nodes[0], "failed", None)
    state["screen"] = {"Error": "ClusterApiUnavailable", "Cause": "503 after the retries"}

    reason = _person_asked(invoke, state)
    assert "auto-approval needs a reproduced screen: screen failed" in reason


def test_a_reproduced_screen_of_another_job_is_not_this_nodes(cloud, invoke, requires_screen):
    # Given a reproduced screen whose Job is not the one this item's Screen step created
    state = _state(invoke, cloud.nodes[0], "failed", "reproduced")
    state["screen"]["job"] = "sdc-screen-0000000000000000"

    reason = _person_asked(invoke, state)
    assert "auto-approval needs a reproduced screen: screen reproduced by a Job" in reason


def test_a_reproduced_screen_alone_approves_nothing(cloud, invoke, requires_screen):
    # Given a reproduced screen but a passed health check and no precision rule
    state = _state(invoke, cloud.nodes[0], "passed", "reproduced")

    # Then the requirement adds a condition, never a rule: a person decides
    reason = _person_asked(invoke, state)
    assert reason == "no auto-approval rule applies; a person decides"


@pytest.mark.parametrize("outcome", ["clean", *OTHER_OUTCOMES[1:], None])
def test_key_off_the_policy_is_unchanged_whatever_the_screen(cloud, invoke, monkeypatch, outcome):
    # Given the health-check rule without the requirement (the default)
    monkeypatch.setenv("AUTO_APPROVE", ON_HEALTH_FAILED)
    monkeypatch.delenv("AUTO_APPROVE_REQUIRES_SCREEN", raising=False)
    state = _state(invoke, cloud.nodes[0], "failed", outcome)

    # When RequestApproval runs
    # Then the policy approves as before, and its reason says nothing of the screen
    stored = _decide(invoke, state, approves=True)
    assert stored["status"] == "approved"
    assert stored["reason"] == (
        "auto-approved by policy: the deep health check failed (hardware confirmed); "
        "inputs: onHealthCheckFailed=true, health=failed"
    )


def test_key_off_a_passed_check_still_asks_a_person_without_a_screen_reason(
    cloud, invoke, monkeypatch
):
    monkeypatch.setenv("AUTO_APPROVE", ON_HEALTH_FAILED)
    monkeypatch.setenv("AUTO_APPROVE_REQUIRES_SCREEN", "false")
    state = _state(invoke, cloud.nodes[0], "passed", "clean")

    reason = _person_asked(invoke, state)
    assert "screen" not in reason


def test_a_clean_screen_never_releases_the_node(cloud, invoke, requires_screen):
    # Given a passed health check and a clean screen (both "nothing found")
    node = cloud.nodes[0]
    state = _state(invoke, node, "passed", "clean")

    # Then nothing decided: the request waits for a person, the node stays held by the guard
    stored = _decide(invoke, state, approves=False)
    assert stored["status"] == "pending"
    assert stored.get("decision") is None and stored.get("release") in (None, False)
    (message,) = cloud.sns_messages()
    assert "clean (ran: gemm x6, sdpa x1; 8 GPU(s); not an exoneration)" in message["message"]
    node_state = ledger_item(keys.state(node))
    assert node_state is not None
    assert node_state["open"] is True


def test_the_policy_never_releases_for_any_screen_outcome():
    # The pure policy: whatever the screen said, its only answers are approve or ask a person.
    policy = AutoApprovePolicy(on_health_check_failed=True, min_precision=0.5, min_events=1)
    precision = autoapprove.Precision(right=9, wrong=0, low=0.7, high=1.0, jobs=9)
    for outcome in ["reproduced", *OTHER_OUTCOMES, None]:
        for health in ("passed", "failed", "timed_out"):
            decision = autoapprove.evaluate(
                policy,
                check="compute",
                verdict="persistent",
                health_status=health,
                precision=precision,
                requires_screen=True,
                screen=outcome,
            )
            assert decision.approve is (outcome == "reproduced")
            assert "release" not in decision.reason
            if not decision.approve:
                assert decision.approver == ""
                assert decision.reason.startswith("auto-approval needs a reproduced screen")


def test_the_precision_rule_needs_a_reproduced_screen_too():
    policy = AutoApprovePolicy(min_precision=0.9, min_events=2)
    precision = autoapprove.Precision(right=5, wrong=0, low=0.6, high=1.0, jobs=5)
    common: dict[str, Any] = {
        "check": "compute",
        "verdict": "persistent",
        "health_status": "passed",
        "precision": precision,
        "requires_screen": True,
    }
    approved = autoapprove.evaluate(
        policy, screen="reproduced", screen_line="reproduced on GPU 1 (UUID GPU-x)", **common
    )
    assert approved.approve and approved.approver.endswith("/precision")
    assert "screen reproduced on GPU 1 (UUID GPU-x)" in approved.reason
    refused = autoapprove.evaluate(policy, screen="clean", **common)
    assert not refused.approve
    assert refused.reason.startswith("auto-approval needs a reproduced screen: screen clean")


@pytest.mark.parametrize("value", ["maybe", "2", "on"])
def test_a_bad_value_is_a_configuration_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("AUTO_APPROVE_REQUIRES_SCREEN", value)
    with pytest.raises(ConfigurationError, match="AUTO_APPROVE_REQUIRES_SCREEN must be 'true'"):
        _ = Settings().auto_approve_requires_screen


def test_a_bad_value_fails_request_approval_naming_the_variable(cloud, invoke, monkeypatch):
    monkeypatch.setenv("AUTO_APPROVE", ON_HEALTH_FAILED)
    monkeypatch.setenv("AUTO_APPROVE_REQUIRES_SCREEN", "perhaps")
    state = _state(invoke, cloud.nodes[0], "failed", "reproduced")
    with pytest.raises(Exception, match="AUTO_APPROVE_REQUIRES_SCREEN must be 'true' or 'false'"):
        _request(invoke, state)


def test_the_real_screen_step_reproducing_the_fault_is_approved(
    cloud, invoke, requires_screen, monkeypatch
):
    # Given the loopback Kubernetes API runs the screen's Job on the cordoned node
    node = cloud.nodes[0]
    with JobsStandIn() as k8s:
        monkeypatch.setenv("K8S_API_ENDPOINT", k8s.url)
        monkeypatch.setenv("K8S_API_CA_DATA", k8s.ca_b64)
        monkeypatch.setenv("SCREEN_IMAGE", IMAGE)
        monkeypatch.setenv("SCREEN_NAMESPACE", NAMESPACE)
        monkeypatch.setenv("SCREEN_DEADLINE_SECONDS", "600")
        k8s.add_gpu_node(f"hyperpod-{node}", gpus=8)
        state = _state(invoke, node, "failed", None)
        state["screen"] = invoke("screen", state)
        k8s.run_job(state["screen"]["job"], json.dumps(document("reproduced")), exit_code=3)
        state["screen"] = invoke("screen", state)
    assert state["screen"]["status"] == "reproduced"

    # When RequestApproval runs
    # Then the policy approved on the screen's word on GPU 3
    stored = _decide(invoke, state, approves=True)
    assert stored["status"] == "approved"
    assert f"screen reproduced on GPU 3 (UUID {UUID})" in stored["reason"]
