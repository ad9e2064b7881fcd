"""The canary's approval goes through the approve function's URL, as a person's decision does:
request_approval stores it as for a person and calls the URL (its own action, signed with its
role); approve settles it as the canary only if the record is the canary's. No role invokes the
approve function any other way (the template test holds IAM to that), so a direct invoke with a
made-up caller decides nothing, and approve stays the only sender of task results.

The function URL is served in-process by the real approve handler (the CLI tests' way);
Step Functions' SendTaskSuccess is stubbed (botocore's Stubber): a call the test did not expect
fails it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from remediation_factories import APPROVALS, item_state

import sdc_contract as contract
from sdc_remediation import aws
from sdc_remediation.clients import approval_url
from sdc_remediation.config import Settings
from sdc_remediation.dal import keys
from sdc_remediation.dal.approvals import approval_id_for
from sdc_remediation.dal.canary_runs import RunStore
from sdc_remediation.dal.dynamo import from_item, to_item
from sdc_remediation.errors import ConfigurationError, RemediationError
from sdc_remediation.logic import canary

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeCanaryTaskToken" * 3
URL = "https://abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws/"
REQUEST_APPROVAL = "arn:aws:sts::123456789012:assumed-role/sdc-request-approval/request_approval"
HEALTH = {"status": "passed", "started_at": "2026-11-29T10:00:00.000Z", "detail": "Passed"}


@pytest.fixture
def the_url(monkeypatch, invoke) -> list[dict[str, Any]]:
    """request_approval's APPROVAL_URL (as infra sets it), served by the real approve handler
    with request_approval's role as the authenticated caller; returns the events served."""
    monkeypatch.setenv(contract.APPROVAL_URL, URL)
    events: list[dict[str, Any]] = []

    def serve(request) -> tuple[int, bytes]:
        assert request.url == URL
        assert request.headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
        event = approval_url.function_url_event(request, REQUEST_APPROVAL)
        events.append(event)
        response = invoke("approve", event)
        return response["statusCode"], response["body"].encode()

    monkeypatch.setattr(approval_url, "_send", serve)
    return events


def _record(approval_id: str) -> dict:
    item = aws.client("dynamodb").get_item(
        TableName=APPROVALS, Key=to_item(keys.approval(approval_id)), ConsistentRead=True
    )["Item"]
    return from_item(item)


def _canary_state(invoke, run_id: str) -> dict:
    """A canary item after admit and the (dry run) health check, as the workflow has it."""
    state = item_state(contract.CANARY_INSTANCE_ID)
    state["suspect"].update(
        job=contract.CANARY_JOB,
        instance_group=contract.CANARY_INSTANCE_GROUP,
        canary_run=run_id,
        ranks={"0": {"node_name": contract.CANARY_NODE_NAME,
                     "instance_id": contract.CANARY_INSTANCE_ID}},
    )  # fmt: skip
    admission = invoke("admit", state)
    return {**state, "admission": admission, "health": HEALTH, "task_token": TOKEN}


def test_the_canary_is_approved_through_the_approve_functions_url(cloud, invoke, the_url):
    # Given a canary run at its approval step
    run = canary.start_run(Settings())

    # When request_approval runs for it (the URL's approve function may send the decision once)
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})
        invoke("request_approval", _canary_state(invoke, run.run_id))
        sfn.assert_no_pending_responses()

    # Then it went through the URL, the canary's own action, signed by request_approval's role
    (event,) = the_url
    assert json.loads(event["body"]) == {
        "action": canary.SETTLE_ACTION,
        "approval_id": approval_id_for(TOKEN),
    }
    # And approve settled it as the canary through the one claim-and-send path, naming who asked
    record = _record(approval_id_for(TOKEN))
    assert (record["status"], record["approver"]) == ("approved", canary.APPROVER)
    assert (
        record["reason"]
        == f"canary run {run.run_id}, settled through the URL by {REQUEST_APPROVAL}"
    )
    assert cloud.sns_messages() == []  # nobody was paged


def test_the_canary_action_settles_nothing_but_a_canary_approval(cloud, invoke, the_url):
    # Given an approval of a real node, waiting for a person
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    with Stubber(aws.client("stepfunctions")):
        invoke(
            "request_approval",
            {**item_state(node, admission=admission, health=HEALTH), "task_token": TOKEN},
        )
    approval_id = approval_id_for(TOKEN)
    before = _record(approval_id)

    # When the canary's action names it through the URL (any SendTaskSuccess would fail the test)
    service = approval_url.ApprovalService(URL)
    refused = pytest.raises(RemediationError, match="not a canary approval")
    with Stubber(aws.client("stepfunctions")), refused:
        service.call(canary.SETTLE_ACTION, approval_id=approval_id)

    # Then nothing was sent and the record is unchanged (still the person's to decide)
    assert _record(approval_id) == before and before["status"] == "pending"


def test_a_direct_invoke_with_no_url_authentication_decides_nothing(cloud, invoke):
    # Given the canary's old direct event, and one with a made-up caller (what a role allowed a
    # direct invoke could send): the handler answers both as URL requests
    run = canary.start_run(Settings())
    direct = {"action": canary.SETTLE_ACTION, "approval_id": f"a-{run.run_id}"}
    # When / Then: no authenticated caller, nothing decided (any send would fail the test);
    # that no role may invoke it directly at all is IAM's (test_infra_permissions)
    with Stubber(aws.client("stepfunctions")):
        out = invoke("approve", direct)
    assert out["statusCode"] == 403 and json.loads(out["body"])["error"] == "NotAuthenticated"


def test_approve_refuses_a_canary_approval_whose_run_is_closed(cloud, invoke, the_url):
    # Given a canary approval whose run closed before it was settled
    run = canary.start_run(Settings())
    state = _canary_state(invoke, run.run_id)
    RunStore(Settings().ledger_table, Settings().hyperpod_cluster_name).reach(run.run_id, "closed")
    # When request_approval asks the URL / Then it is refused, nothing sent, and the step fails
    refused = pytest.raises(RemediationError, match="not an open canary run")
    with Stubber(aws.client("stepfunctions")), refused:
        invoke("request_approval", state)
    assert _record(approval_id_for(TOKEN))["status"] == "pending"


def test_a_failed_send_is_written_on_the_canary_run(cloud, invoke, the_url):
    # Given a canary approval, and Step Functions refusing the approve function's send
    run = canary.start_run(Settings())
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_client_error("send_task_success", "AccessDeniedException", http_status_code=400)
        # When request_approval asks the URL / Then it fails loudly
        with pytest.raises(ConfigurationError, match="SendTaskSuccess was denied"):
            invoke("request_approval", _canary_state(invoke, run.run_id))
    # And the run records why, so the canary alarm's message names the approval step and it
    stored = RunStore(Settings().ledger_table, Settings().hyperpod_cluster_name).get(run.run_id)
    assert stored is not None and "could not settle canary approval" in (stored.error or "")
    stop = canary.stopped_at(stored, alarm_fired=True, execution_started=True)
    assert "could not settle canary approval" in stop.sentence()
    assert _record(approval_id_for(TOKEN))["status"] == "pending"  # nothing decided


def test_request_approval_without_the_url_fails_the_step(cloud, invoke):
    # Given a canary at its approval step, and no APPROVAL_URL on request_approval
    run = canary.start_run(Settings())
    # When request_approval runs / Then the step fails naming the variable
    failed = pytest.raises(ConfigurationError, match=contract.APPROVAL_URL)
    with Stubber(aws.client("stepfunctions")), failed:
        invoke("request_approval", _canary_state(invoke, run.run_id))
