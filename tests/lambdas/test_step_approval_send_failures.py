"""What the operator sees when SendTaskSuccess fails: a refused send leaves the request pending,
a send whose answer was lost leaves it ``sending`` and a repeat re-sends the same decision."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from remediation_factories import APPROVALS, LEDGER, item_state

from sdc_remediation import aws
from sdc_remediation.cli import main
from sdc_remediation.dal.dynamo import from_item

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
MOTO_CALLER = "arn:aws:sts::123456789012:user/moto"


def _request(invoke, node: str) -> str:
    admission = invoke("admit", item_state(node))
    invoke("request_approval", {**item_state(node, admission=admission), "task_token": TOKEN})
    return _stored()["approval_id"]


def _stored() -> dict:
    [item] = [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]
    return item


def _cli(*args: str):
    return CliRunner().invoke(
        main, ["--approvals-table", APPROVALS, "--ledger-table", LEDGER, *args]
    )


def _network(monkeypatch, *outcomes: Callable[[], Any]) -> list[dict]:
    """SendTaskSuccess answering with ``outcomes`` in turn (what a lossy network produces,
    which botocore's Stubber cannot); returns the calls' parameters."""
    sent: list[dict] = []
    queue = list(outcomes)

    def send_task_success(**params: Any) -> Any:
        sent.append(params)
        return queue.pop(0)()

    monkeypatch.setattr(aws.client("stepfunctions"), "send_task_success", send_task_success)
    return sent


def _read_timeout() -> Any:
    raise botocore.exceptions.ReadTimeoutError(
        endpoint_url="https://states.us-east-1.amazonaws.com"
    )


def _token_gone() -> Any:
    raise botocore.exceptions.ClientError(
        {
            "Error": {"Code": "TaskTimedOut", "Message": "Provided task does not exist anymore"},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "SendTaskSuccess",
    )


def test_a_denied_send_leaves_the_request_pending_and_names_the_callers_credentials(cloud, invoke):
    # Given a pending approval and an operator whose credentials lack states:SendTaskSuccess
    approval_id = _request(invoke, cloud.nodes[0])

    # When the operator approves, then (policy fixed) approves again
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_client_error("send_task_success", "AccessDeniedException", "not authorized", 400)
        sfn.add_response("send_task_success", {})
        denied = _cli("approve", approval_id)
        listed = _cli("pending")
        retried = _cli("approve", approval_id)

    # Then: the denial names the caller's credentials and says nothing was decided; the request
    # stayed listed and the retry decides it
    assert denied.exit_code == 1
    assert f"your credentials ({MOTO_CALLER}) are not allowed states:SendTaskSuccess" in (
        denied.output
    )
    assert "operator policy" in denied.output and "function's IAM policy" not in denied.output
    assert "pending again" in denied.output
    assert approval_id in listed.output
    assert retried.exit_code == 0, retried.output
    assert _stored()["status"] == "approved"


@pytest.mark.parametrize("code", ["ThrottlingException", "ValidationException"])
def test_any_definite_refusal_rolls_back_to_pending(cloud, invoke, code):
    # Given a pending approval
    approval_id = _request(invoke, cloud.nodes[0])

    # When Step Functions refuses the send
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_client_error("send_task_success", code, "no", 400)
        result = _cli("reject", approval_id)

    # Then: nothing decided, the request can be decided again
    assert result.exit_code == 1 and "nothing was decided" in result.output
    stored = _stored()
    assert stored["status"] == "pending" and "approver" not in stored


def test_a_lost_answer_leaves_the_outcome_unknown_and_a_repeat_resends_it(
    cloud, invoke, monkeypatch
):
    # Given an approve whose SendTaskSuccess timed out after sending, then goes through
    approval_id = _request(invoke, cloud.nodes[0])
    sent = _network(monkeypatch, _read_timeout, lambda: {})

    # When the operator approves, looks at the list, and repeats the approve
    first = _cli("approve", approval_id, "--reason", "persistent")
    listed = _cli("pending")
    again = _cli("approve", approval_id)

    # Then: the first says the outcome is unknown (never "nothing was decided"); the request is
    # listed as in flight; the repeat sent exactly the same decision and closed the request
    assert first.exit_code == 1
    assert "outcome is unknown" in first.output and "nothing was decided" not in first.output
    assert approval_id in listed.output and "outcome is unknown" in listed.output
    assert again.exit_code == 0, again.output
    assert len(sent) == 2 and sent[0] == sent[1]
    assert json.loads(sent[1]["output"])["reason"] == "persistent"
    assert _stored()["status"] == "approved"


def test_a_repeat_after_a_send_that_did_arrive_reports_already_decided(cloud, invoke, monkeypatch):
    # Given an approve whose answer was lost although it resumed the workflow
    approval_id = _request(invoke, cloud.nodes[0])
    _network(monkeypatch, _read_timeout, _token_gone)
    assert _cli("approve", approval_id).exit_code == 1
    assert _stored()["status"] == "sending"

    # When the operator repeats it (Step Functions: the task does not exist anymore)
    again = _cli("approve", approval_id)

    # Then: already decided (not "expired"), and the request is closed as approved
    assert again.exit_code == 1
    assert "ApprovalAlreadyDecided" in again.output and "ApprovalExpired" not in again.output
    assert _stored()["status"] == "approved"
    assert approval_id not in _cli("pending").output


def test_the_other_decision_is_refused_while_a_send_is_in_doubt(cloud, invoke, monkeypatch):
    # Given an approve whose outcome is unknown
    approval_id = _request(invoke, cloud.nodes[0])
    sent = _network(monkeypatch, _read_timeout)
    _cli("approve", approval_id)

    # When someone rejects it
    result = _cli("reject", approval_id)

    # Then: refused without sending anything (the approve may already have resumed the workflow)
    assert result.exit_code == 1
    assert "ApprovalAlreadyDecided" in result.output and "repeat `approve`" in result.output
    assert len(sent) == 1
    assert _stored()["status"] == "sending"


def test_send_task_success_is_attempted_once_per_call(cloud, invoke):
    # Given a pending approval and a network that loses every SendTaskSuccess answer
    approval_id = _request(invoke, cloud.nodes[0])
    attempts: list[str] = []

    def lose_the_answer(request: Any, **_: Any) -> None:
        attempts.append(request.url)
        _read_timeout()

    aws.client("stepfunctions").meta.events.register_first(
        "before-send.sfn.SendTaskSuccess", lose_the_answer
    )

    # When the operator approves
    result = _cli("approve", approval_id)

    # Then: one HTTP attempt; botocore did not resend on its own (a resend would meet the task
    # the first attempt resumed and misreport the decision as expired)
    assert len(attempts) == 1
    assert "outcome is unknown" in result.output
