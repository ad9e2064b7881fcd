"""An approval is decidable (and listed) only while the workflow waits for it: until
``decide_by`` = request time + the approval timeout, not until the record's TTL a day later."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from remediation_factories import APPROVALS, LEDGER, item_state

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.config import Settings
from sdc_remediation.dal.dynamo import from_item
from sdc_remediation.errors import ConfigurationError

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3


def _request(invoke, node: str) -> dict:
    admission = invoke("admit", item_state(node))
    invoke("request_approval", {**item_state(node, admission=admission), "task_token": TOKEN})
    [item] = [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]
    return item


def _cli(*args: str):
    return CliRunner().invoke(
        main, ["--approvals-table", APPROVALS, "--ledger-table", LEDGER, *args]
    )


def test_an_approval_leaves_the_list_and_cannot_be_decided_once_the_workflow_stopped_waiting(
    cloud, invoke, monkeypatch
):
    # Given a 1-hour approval timeout (infra sets the TTL to it plus one day) and a request
    monkeypatch.setenv("APPROVAL_TTL_SECONDS", str(3600 + 86400))
    item = _request(invoke, cloud.nodes[0])
    listed_then = _cli("pending")

    # When two hours later (the record still exists: its TTL is a day away) an operator looks
    # and approves (no SendTaskSuccess is stubbed: a call would fail the test)
    later = datetime.now(UTC) + timedelta(hours=2)
    monkeypatch.setattr(clock, "now", lambda: later)
    with Stubber(aws.client("stepfunctions")):
        listed_later = _cli("pending")
        approved = _cli("approve", item["approval_id"])

    # Then: listed while the workflow waited, not after; the approve is refused as expired and
    # the record is left as it was
    assert item["decide_by"] - int(datetime.fromisoformat(item["created_at"]).timestamp()) == 3600
    assert item["expires_at"] - item["decide_by"] == 86400
    assert item["approval_id"] in listed_then.output
    assert "No pending approvals." in listed_later.output
    assert approved.exit_code == 1 and "ApprovalExpired" in approved.output
    [stored] = [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]
    assert stored["status"] == "pending" and "approver" not in stored


def test_the_approval_timeout_is_the_ttl_less_one_day():
    # Given the TTL infra computes from a 90-minute approval timeout, and the default
    # Then
    assert Settings({"APPROVAL_TTL_SECONDS": str(90 * 60 + 86400)}).approval_timeout_seconds == (
        90 * 60
    )
    assert Settings({}).approval_timeout_seconds == 86400


def test_a_ttl_that_leaves_no_approval_timeout_is_a_clear_error():
    # Given a TTL shorter than a day plus the shortest approval timeout
    settings = Settings({"APPROVAL_TTL_SECONDS": "3600"})

    # When / Then
    with pytest.raises(ConfigurationError, match="APPROVAL_TTL_SECONDS"):
        _ = settings.approval_timeout_seconds
