"""Authenticated approvals: the CLI signs its requests (SigV4, service lambda) to the approve
function's URL; the approver recorded is the IAM principal Lambda authenticated, never a name
from the request; the decision deadline and the single-use claim hold on that path.

Lambda's function URL is played by a transport that checks the request is SigV4-signed for
`lambda` with the caller's access key, maps that key to the principal it belongs to (what AWS
does when it authenticates), and calls the real approve handler with the payload-2.0 event.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from remediation_factories import APPROVALS, LEDGER, held_after_rejection, item_state

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.clients import approval_url
from sdc_remediation.dal import keys, ledger
from sdc_remediation.dal.dynamo import from_item, to_item

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
URL = "https://abcdefghij0123456789.lambda-url.us-east-1.on.aws/"
ONCALL = "arn:aws:sts::123456789012:assumed-role/oncall/alice"


@pytest.fixture
def function_url(monkeypatch, invoke) -> list[dict[str, Any]]:
    """Serve the CLI's signed requests with the real approve handler; returns the events."""
    events: list[dict[str, Any]] = []

    def serve(request) -> tuple[int, bytes]:
        auth = request.headers["Authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=")
        key, _date, region, service, _ = auth.split("Credential=")[1].split(",")[0].split("/")
        assert (region, service) == ("us-east-1", "lambda")
        # The caller's own key: AWS authenticates it as the principal it belongs to
        assert key == aws.session().get_credentials().access_key
        event = approval_url.function_url_event(request, ONCALL)
        events.append(event)
        response = invoke("approve", event)
        return response["statusCode"], response["body"].encode()

    monkeypatch.setattr(approval_url, "_send", serve)
    return events


def _approvals() -> list[dict]:
    ddb = aws.client("dynamodb")
    return [from_item(i) for i in ddb.scan(TableName=APPROVALS)["Items"]]


def _request(invoke, cloud) -> dict:
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    health = {"status": "passed", "started_at": "2026-11-29T10:00:00.000Z", "detail": "Passed"}
    invoke(
        "request_approval",
        {**item_state(node, admission=admission, health=health), "task_token": TOKEN},
    )
    (item,) = _approvals()
    return item


def _cli(*args: str):
    # No table options: an operator with the URL needs neither table name nor access to it.
    return CliRunner().invoke(main, ["--approval-url", URL, *args])


def _sent(decision: str, approval_id: str, approver: str, reason: str = "", release=False) -> str:
    return json.dumps(
        {
            "decision": decision,
            "release": release,
            "approver": approver,
            "reason": reason,
            "approval_id": approval_id,
        },
        separators=(",", ":"),
    )


def test_the_cli_approves_through_the_url_as_the_authenticated_principal(
    cloud, invoke, function_url
):
    # Given a pending approval
    item = _request(invoke, cloud)

    # When an operator lists and approves it through the function URL
    listed = _cli("pending", "--json")
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response(
            "send_task_success",
            {},
            {"taskToken": TOKEN, "output": _sent("approve", item["approval_id"], ONCALL, "ok")},
        )
        result = _cli("approve", item["approval_id"], "--reason", "ok")
        sfn.assert_no_pending_responses()

    # Then the workflow and the table got the principal Lambda authenticated
    assert result.exit_code == 0, result.output
    assert ONCALL in result.output
    (stored,) = _approvals()
    assert stored["status"] == "approved" and stored["approver"] == ONCALL
    # And pending showed the request without its task token
    assert listed.exit_code == 0, listed.output
    (pending,) = json.loads(listed.output)
    assert pending["approval_id"] == item["approval_id"] and "task_token" not in pending
    assert TOKEN not in listed.output
    assert all(e["requestContext"]["authorizer"]["iam"]["userArn"] == ONCALL for e in function_url)


def test_a_body_naming_another_approver_still_records_the_authenticated_one(
    cloud, invoke, function_url
):
    # Given a pending approval, and a request crafted to claim someone else approved
    item = _request(invoke, cloud)
    service = approval_url.ApprovalService(URL)

    # When it reaches the function
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response(
            "send_task_success",
            {},
            {"taskToken": TOKEN, "output": _sent("approve", item["approval_id"], ONCALL)},
        )
        result = service.call(
            "approve", approval_id=item["approval_id"], approver="arn:aws:iam::1:user/boss"
        )

    # Then the recorded approver is the caller, not the name in the body
    assert result["approver"] == ONCALL
    assert _approvals()[0]["approver"] == ONCALL


def test_the_deadline_and_the_single_use_claim_hold_on_the_url_path(
    cloud, invoke, function_url, monkeypatch
):
    # Given one approval decided once, and another whose decision window passed
    item = _request(invoke, cloud)
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response(
            "send_task_success",
            {},
            {"taskToken": TOKEN, "output": _sent("reject", item["approval_id"], ONCALL)},
        )
        first = _cli("reject", item["approval_id"])
    # When a second decision arrives, and (later) one past the deadline
    with Stubber(aws.client("stepfunctions")):  # any SendTaskSuccess would fail the test
        second = _cli("approve", item["approval_id"])
        aws.client("dynamodb").update_item(
            TableName=APPROVALS,
            Key=to_item(keys.approval(item["approval_id"])),
            UpdateExpression="SET #s = :p",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":p": {"S": "pending"}},
        )
        later = datetime.now(UTC) + timedelta(days=3)
        monkeypatch.setattr(clock, "now", lambda: later)
        late = _cli("approve", item["approval_id"])

    # Then only the first one counted
    assert first.exit_code == 0, first.output
    assert second.exit_code == 1 and "ApprovalAlreadyDecided" in second.output
    assert late.exit_code == 1 and "ApprovalExpired" in late.output


def test_a_request_without_an_authenticated_caller_is_refused(cloud, invoke):
    # Given a direct invocation (no function URL authentication in the event)
    out = invoke(
        "approve",
        {
            "requestContext": {"http": {"method": "POST"}},
            "body": json.dumps({"action": "approve", "approval_id": "a-1", "approver": "me"}),
        },
    )
    # Then nothing is decided
    assert out["statusCode"] == 403
    assert json.loads(out["body"])["error"] == "NotAuthenticated"


def test_release_through_the_url_records_the_authenticated_principal(
    cloud, k8s, invoke, function_url
):
    # Given a node kept cordoned after a rejection, which the operator has since uncordoned
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}")
    held_after_rejection(invoke, node)
    # When an operator releases it through the URL
    result = _cli("release", node, "--reason", "swapped the GPU")
    # Then the guard frees it and the ledger names the authenticated principal
    assert result.exit_code == 0, result.output
    (released,) = [e for e in ledger.Ledger(LEDGER).events(node) if e["transition"] == "released"]
    assert released["approver"] == ONCALL


def test_release_through_the_url_refuses_a_node_still_cordoned(cloud, k8s, invoke, function_url):
    # Given a node kept cordoned after a rejection, still cordoned in Kubernetes
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}", unschedulable=True)
    held_after_rejection(invoke, node)
    # When an operator releases it through the URL before uncordoning it
    result = _cli("release", node)
    # Then the approve function answers 409 NodeStillCordoned, and the guard still holds it
    assert result.exit_code == 1 and "NodeStillCordoned" in result.output
    assert json.loads(function_url[-1]["body"])["action"] == "release"
    assert [h["instance_id"] for h in ledger.Ledger(LEDGER).held("hp-test")] == [node]
    assert not [e for e in ledger.Ledger(LEDGER).events(node) if e["transition"] == "released"]


@pytest.mark.parametrize("url", ["http://approve.example.com/", "ftp://x/", "approve"])
def test_the_cli_refuses_to_send_a_signed_request_in_clear_text(cloud, url):
    result = CliRunner().invoke(main, ["--approval-url", url, "approve", "a-1"])
    assert result.exit_code == 1
    assert "https://" in result.output
