"""The canary's approval goes through the approve function: request_approval stores it as for a
person and invokes approve (asynchronously) with a direct event; approve settles it as the canary
only if the record is the canary's, so approve stays the only sender of task results.

Lambda's invoke and Step Functions' SendTaskSuccess are stubbed (botocore's Stubber): a call
the test did not expect fails it.
"""

from __future__ import annotations

import json

import pytest
from botocore.stub import ANY, Stubber
from remediation_factories import APPROVALS, item_state

import sdc_contract as contract
from sdc_remediation import aws
from sdc_remediation.config import Settings
from sdc_remediation.dal.approvals import approval_id_for
from sdc_remediation.dal.canary_runs import RunStore
from sdc_remediation.dal.dynamo import from_item
from sdc_remediation.errors import ConfigurationError, InvalidStepInput
from sdc_remediation.logic import canary

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeCanaryTaskToken" * 3
APPROVE_FUNCTION = "sdc-guard-approve"
HEALTH = {"status": "passed", "started_at": "2026-11-29T10:00:00.000Z", "detail": "Passed"}


@pytest.fixture
def approve_function(monkeypatch) -> str:
    """request_approval's APPROVE_FUNCTION, as infra sets it when the canary is on."""
    monkeypatch.setenv(contract.APPROVE_FUNCTION, APPROVE_FUNCTION)
    return APPROVE_FUNCTION


def _record(approval_id: str) -> dict:
    item = aws.client("dynamodb").get_item(
        TableName=APPROVALS, Key={"approval_id": {"S": approval_id}}, ConsistentRead=True
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


def _request_canary_approval(invoke, run_id: str) -> str:
    """request_approval for a canary, with the invoke of approve it must make; its id."""
    approval_id = approval_id_for(TOKEN)
    with Stubber(aws.client("lambda")) as lam, Stubber(aws.client("stepfunctions")):
        lam.add_response(
            "invoke",
            {"StatusCode": 202},
            {
                "FunctionName": APPROVE_FUNCTION,
                "InvocationType": "Event",
                "Payload": json.dumps(canary.settle_event(approval_id)).encode(),
            },
        )
        invoke("request_approval", _canary_state(invoke, run_id))
        lam.assert_no_pending_responses()
    return approval_id


def test_the_canary_is_approved_through_the_approve_function(cloud, invoke, approve_function):
    # Given a canary run at its approval step
    run = canary.start_run(Settings())
    # When request_approval runs for it (it may invoke approve, and send no task result)
    approval_id = _request_canary_approval(invoke, run.run_id)
    # Then the approval is stored as for a person, pending, and nobody was paged
    assert _record(approval_id)["status"] == "pending"
    # When approve gets request_approval's direct event
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})
        out = invoke("approve", canary.settle_event(approval_id))
        sfn.assert_no_pending_responses()
    # Then it approved as the canary through the one claim-and-send path
    assert out["decision"] == "approve" and out["approver"] == canary.APPROVER
    record = _record(approval_id)
    assert (record["status"], record["approver"]) == ("approved", canary.APPROVER)
    assert record["reason"] == f"canary run {run.run_id}"
    # And a retried event sends nothing again
    with Stubber(aws.client("stepfunctions")):
        assert invoke("approve", canary.settle_event(approval_id))["already_decided"] is True


def test_approve_refuses_a_direct_event_for_a_persons_approval(cloud, invoke):
    # Given an approval of a real node, waiting for a person
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    invoke(
        "request_approval",
        {**item_state(node, admission=admission, health=HEALTH), "task_token": TOKEN},
    )
    approval_id = approval_id_for(TOKEN)
    before = _record(approval_id)
    # When a direct canary event names it
    # (any SendTaskSuccess would fail the test: none is stubbed)
    refused = pytest.raises(canary.CanaryApprovalRefused, match="not a canary approval")
    with Stubber(aws.client("stepfunctions")), refused:
        invoke("approve", canary.settle_event(approval_id))
    # Then nothing was sent and the record is unchanged (still the person's to decide)
    assert _record(approval_id) == before
    assert before["status"] == "pending"


def test_approve_refuses_a_canary_approval_whose_run_is_closed(cloud, invoke, approve_function):
    # Given a canary approval whose run already closed
    run = canary.start_run(Settings())
    approval_id = _request_canary_approval(invoke, run.run_id)
    RunStore(Settings().ledger_table, Settings().hyperpod_cluster_name).reach(run.run_id, "closed")
    before = _record(approval_id)
    # When the direct event names it / Then it is refused, nothing sent, nothing changed
    refused = pytest.raises(canary.CanaryApprovalRefused, match="not an open canary run")
    with Stubber(aws.client("stepfunctions")), refused:
        invoke("approve", canary.settle_event(approval_id))
    assert _record(approval_id) == before


def test_the_canary_action_is_refused_through_the_url_and_a_bad_event_is_invalid(cloud, invoke):
    # Given the canary's action sent to the function URL by an authenticated caller
    url_event = {
        "requestContext": {
            "http": {"method": "POST"},
            "authorizer": {"iam": {"userArn": "arn:aws:sts::123456789012:assumed-role/x/y"}},
        },
        "body": json.dumps({"action": canary.SETTLE_ACTION, "approval_id": "a-1"}),
    }
    # Then the URL knows no such action (a person cannot approve as the canary)
    with Stubber(aws.client("stepfunctions")):
        out = invoke("approve", url_event)
        assert out["statusCode"] == 400
        # And a direct event with more than the canary's two keys is refused as invalid
        with pytest.raises(InvalidStepInput, match="bad canary event"):
            invoke("approve", {**canary.settle_event("a-1"), "approver": "me"})


def test_a_failed_send_is_written_on_the_canary_run(cloud, invoke, approve_function):
    # Given a canary approval, and Step Functions refusing the approve function's send
    run = canary.start_run(Settings())
    approval_id = _request_canary_approval(invoke, run.run_id)
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_client_error("send_task_success", "AccessDeniedException", http_status_code=400)
        # When approve settles it / Then it fails loudly
        with pytest.raises(ConfigurationError, match="SendTaskSuccess was denied"):
            invoke("approve", canary.settle_event(approval_id))
    # And the run records why, so the canary alarm's message names the approval step and it
    stored = RunStore(Settings().ledger_table, Settings().hyperpod_cluster_name).get(run.run_id)
    assert stored is not None and "could not settle canary approval" in (stored.error or "")
    stop = canary.stopped_at(stored, alarm_fired=True, execution_started=True)
    assert "could not settle canary approval" in stop.sentence()
    assert _record(approval_id)["status"] == "pending"  # nothing decided


def test_request_approval_without_the_approve_function_fails_the_step(cloud, invoke):
    # Given a canary at its approval step, and no APPROVE_FUNCTION (the canary off in infra)
    run = canary.start_run(Settings())
    # When request_approval runs / Then the step fails naming the variable
    failed = pytest.raises(ConfigurationError, match=contract.APPROVE_FUNCTION)
    with Stubber(aws.client("stepfunctions")), failed:
        invoke("request_approval", _canary_state(invoke, run.run_id))
