"""An approval request whose announcement SNS refused is not left behind: nobody was told of it,
so nobody may find it in `pending` and decide it; the step fails, and its retry stores and
announces it again."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from remediation_factories import APPROVALS, item_state

from sdc_remediation import aws
from sdc_remediation.dal.dynamo import from_item

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
HEALTH = {"status": "passed", "started_at": "2026-11-29T10:00:00.000Z", "detail": "Passed"}


def _approvals() -> list[dict]:
    return [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]


def test_a_refused_announcement_leaves_no_pending_approval_and_a_retry_announces_it(cloud, invoke):
    # Given a node at its approval step
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    state = {**item_state(node, admission=admission, health=HEALTH), "task_token": TOKEN}

    # When SNS refuses the announcement (a subject it rejects, a deleted topic)
    with Stubber(aws.client("sns")) as sns:
        sns.add_client_error("publish", "InvalidParameter", "Invalid parameter: Subject")
        with pytest.raises(ClientError, match="InvalidParameter"):
            invoke("request_approval", state)

    # Then no approval is left for anyone to decide
    assert _approvals() == []

    # When the workflow retries the step and SNS takes it
    invoke("request_approval", state)

    # Then it is stored, pending and announced once
    (stored,) = _approvals()
    assert stored["status"] == "pending" and stored["notified"] is True
    (message,) = cloud.sns_messages()
    assert stored["approval_id"] in message["message"]


def test_the_subject_sns_gets_is_one_printable_line_under_100_characters(cloud, invoke):
    # Given a node whose job name is as long as a job name may be
    node = cloud.nodes[0]
    state = item_state(node)
    state["suspect"]["job"] = "j" * 63
    admission = invoke("admit", state)
    state = {**item_state(node, admission=admission, health=HEALTH), "task_token": TOKEN}

    # When the approval is announced, and a subject with a line break goes to the client
    invoke("request_approval", state)
    from sdc_remediation.clients import sns

    sns.publish(
        f"arn:aws:sns:us-east-1:123456789012:{'sdc-remediation'}",
        "[sdc-guard] persistent\nBcc: x\x1b[2J" + "x" * 200,
        "body",
    )

    # Then every subject SNS received is printable ASCII on one line, under 100 characters
    for message in cloud.sns_messages():
        subject = message["subject"]
        assert len(subject) < 100 and "\n" not in subject and "\x1b" not in subject
        assert all(" " <= c <= "~" for c in subject)
