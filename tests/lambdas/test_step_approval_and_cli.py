"""request_approval and the operator CLI (click), against moto DynamoDB/SNS/STS; Step Functions'
SendTaskSuccess is stubbed with botocore's Stubber to check the exact output and its errors."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import ANY, Stubber
from click.testing import CliRunner
from remediation_factories import APPROVALS, LEDGER, item_state

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.dal.dynamo import from_item

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
MOTO_CALLER = "arn:aws:sts::123456789012:user/moto"


def _approvals() -> list[dict]:
    ddb = aws.client("dynamodb")
    return [from_item(i) for i in ddb.scan(TableName=APPROVALS)["Items"]]


def _request(invoke, cloud, instance: str | None = None, **results) -> dict:
    node = instance or cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    health = {
        "status": "passed",
        "started_at": "2026-11-29T10:00:00.000Z",
        "checks": ["InstanceStress"],
        "detail": "Passed",
    }
    assert (
        invoke(
            "request_approval",
            {
                **item_state(node, admission=admission, health=health, **results),
                "task_token": TOKEN,
            },
        )
        is None
    )
    [item] = [a for a in _approvals() if a["instance_id"] == node]
    return item


def _cli(*args: str):
    return CliRunner().invoke(
        main, ["--approvals-table", APPROVALS, "--ledger-table", LEDGER, *args]
    )


def test_request_approval_stores_the_token_and_publishes_evidence_without_it(cloud, invoke):
    # Given a cordoned suspect whose health check passed
    # When
    item = _request(invoke, cloud)

    # Then: the token is stored under an opaque id with a TTL
    assert item["task_token"] == TOKEN
    assert item["approval_id"].startswith("a-") and TOKEN not in item["approval_id"]
    assert item["status"] == "pending"
    assert item["expires_at"] > datetime.now(UTC).timestamp() + 86000
    # and the message carries the evidence and the exact commands, never the token
    [msg] = cloud.sns_messages()
    assert TOKEN not in msg["message"] and TOKEN not in (msg["subject"] or "")
    body = msg["message"]
    for expected in (
        "compute at step 120, verdict persistent",
        "steps 100..120",
        "GPU-3",
        "passed",
        "Suggested action",
        f"approve {item['approval_id']}",
        f"reject {item['approval_id']}",
    ):
        assert expected in body


def test_the_message_shows_repeat_offender_history(cloud, invoke):
    # Given an instance that was remediated and released before
    node = cloud.nodes[0]
    old = invoke("admit", item_state(node, execution="old"))
    invoke(
        "record",
        {"transition": "released", "state": item_state(node, execution="old", admission=old)},
    )

    # When it is suspected again
    _request(invoke, cloud, node)

    # Then
    body = cloud.sns_messages()[-1]["message"]
    assert "1 earlier remediation(s)" in body and "admitted/released" in body


def _output(**fields) -> str:
    """SendTaskSuccess's output as the contract spells it (compact JSON, contract key order)."""
    return json.dumps(fields, separators=(",", ":"))


def test_approve_sends_the_decision_with_the_callers_identity(cloud, invoke):
    # Given a pending approval
    item = _request(invoke, cloud)
    output = _output(
        decision="approve",
        release=False,
        approver=MOTO_CALLER,
        reason="persistent twice",
        approval_id=item["approval_id"],
    )

    # When an operator approves
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": output})
        result = _cli("approve", item["approval_id"], "--reason", "persistent twice")
        sfn.assert_no_pending_responses()

    # Then: SendTaskSuccess got the contract's output; the request is closed
    assert result.exit_code == 0, result.output
    assert MOTO_CALLER in result.output
    [stored] = _approvals()
    assert stored["status"] == "approved" and stored["approver"] == MOTO_CALLER


def test_reject_with_release_sends_release_true(cloud, invoke):
    # Given a pending approval
    item = _request(invoke, cloud)

    output = _output(
        decision="reject",
        release=True,
        approver=MOTO_CALLER,
        reason="bad test",
        approval_id=item["approval_id"],
    )

    # When
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": output})
        result = _cli("reject", item["approval_id"], "--release", "--reason", "bad test")
        sfn.assert_no_pending_responses()

    # Then
    assert result.exit_code == 0, result.output
    assert "uncordoned" in result.output


@pytest.mark.parametrize("code", ["TaskTimedOut", "TaskDoesNotExist", "InvalidToken"])
def test_a_token_step_functions_no_longer_knows_is_expired(cloud, invoke, code):
    # Given the workflow stopped waiting (timeout, execution ended)
    item = _request(invoke, cloud)

    # When
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_client_error("send_task_success", code, "Task Timed Out", 400)
        result = _cli("approve", item["approval_id"])

    # Then: one line, exit 1, no traceback; the request is marked expired
    assert result.exit_code == 1
    assert "ApprovalExpired" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _approvals()[0]["status"] == "expired"


def test_an_approval_past_its_ttl_is_expired_without_calling_step_functions(
    cloud, invoke, monkeypatch
):
    # Given a request whose TTL passed (DynamoDB deletes lazily, the item may still be there)
    item = _request(invoke, cloud)
    later = datetime.now(UTC) + timedelta(days=2)
    monkeypatch.setattr(clock, "now", lambda: later)

    # When (no SendTaskSuccess is stubbed: a call would fail)
    with Stubber(aws.client("stepfunctions")):
        result = _cli("approve", item["approval_id"])

    # Then
    assert result.exit_code == 1
    assert "ApprovalExpired" in result.output


def test_an_unknown_id_is_a_clear_error(cloud):
    # When
    result = _cli("approve", "a-doesnotexist")

    # Then
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == "Error: ApprovalNotFound: no approval request with id 'a-doesnotexist'"
    )


def test_a_second_decision_is_refused(cloud, invoke):
    # Given an approval already approved
    item = _request(invoke, cloud)
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})
        assert _cli("approve", item["approval_id"]).exit_code == 0

    # When someone else rejects it
    result = _cli("reject", item["approval_id"])

    # Then
    assert result.exit_code == 1
    assert "ApprovalAlreadyDecided" in result.output and MOTO_CALLER in result.output


def test_no_credentials_is_a_clear_error(monkeypatch, tmp_path):
    # Given no credentials anywhere (and no instance metadata to fall back on)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    # When
    approve = _cli("approve", "a-123")
    pending = _cli("pending")

    # Then
    for result in (approve, pending):
        assert result.exit_code == 1
        assert "NoCredentials" in result.output and "Traceback" not in result.output


def test_pending_lists_requests_with_their_evidence(cloud, invoke):
    # Given one pending request
    item = _request(invoke, cloud)

    # When
    text = _cli("pending")
    as_json = _cli("pending", "--json")

    # Then
    assert text.exit_code == 0
    assert (
        item["approval_id"] in text.output
        and "verdict=persistent" in text.output
        and "health=passed" in text.output
    )
    [entry] = json.loads(as_json.output)
    assert entry["evidence"]["suspect_window"] == [100, 120]
    assert "task_token" not in entry


def test_history_shows_a_nodes_transitions(cloud, invoke):
    # Given a node admitted and then released
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    invoke("record", {"transition": "cordoned", "state": item_state(node, admission=admission)})

    # When
    result = _cli("history", "--node", f"hyperpod-{node}")

    # Then one line per transition, and the alarm's resume rule (the agent's) once
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    events = [line for line in lines if not line.startswith(" ")]
    assert [line.split()[3] for line in events] == ["admitted", "cordoned"]
    rules = [line.strip() for line in lines if line.startswith(" ")]
    assert rules == ["resume rule: resume from the newest checkpoint at or before step 100"]


def test_missing_table_option_is_a_clear_error():
    # When
    result = CliRunner().invoke(main, ["pending"])

    # Then
    assert result.exit_code == 1
    assert "SDC_APPROVALS_TABLE" in result.output


def test_a_retried_request_for_the_same_token_is_stored_and_announced_once(cloud, invoke):
    # Given a request already stored and announced
    item = _request(invoke, cloud)
    state = item_state(
        cloud.nodes[0],
        admission={"decision": "admitted", "remediation_id": item["remediation_id"], "reason": ""},
    )

    # When Step Functions retries the task with the same token
    invoke("request_approval", {**state, "task_token": TOKEN})

    # Then: still one request, one message
    assert [a["approval_id"] for a in _approvals()] == [item["approval_id"]]
    assert len(cloud.sns_messages()) == 1


def test_region_option_reaches_the_clients_without_touching_the_process_environment(cloud):
    # Given the tables exist in the configured region only, and the process's AWS settings
    before = {k: os.environ.get(k) for k in ("AWS_REGION", "AWS_DEFAULT_REGION")}

    # When the CLI is pointed at another region, and then run without the option
    elsewhere = CliRunner().invoke(
        main, ["--region", "eu-west-1", "--ledger-table", LEDGER, "history"]
    )
    here = _cli("history")

    # Then the other region's (missing) table was asked, and the next command was not affected
    assert elsewhere.exit_code == 1 and "ResourceNotFoundException" in elsewhere.output
    assert here.exit_code == 0, here.output
    # And os.environ, which every thread of the process shares, was never written
    assert {k: os.environ.get(k) for k in before} == before
