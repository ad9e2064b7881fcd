"""Authenticated approvals end to end: the operator CLI decides through the approve function's
URL (the loopback stand-in of tests/e2e/harness/function_url.py), SigV4-signed; the approver the
workflow and the ledger record is the principal AWS authenticated, whatever the body claims, and
the approve function's decision deadline and single-use claim hold on that path."""

from __future__ import annotations

import json
import time

import pytest

from sdc_remediation.clients.approval_url import ApprovalService
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import to_item
from tests.e2e.harness.account import REGION
from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.scenario import culprit_alarm, local_cluster, operator, pending_for, raise_alarm

pytestmark = pytest.mark.slow

CLUSTER = local_cluster()
SUSPECT = CLUSTER.instance_ids[1]
SOMEONE_ELSE = "arn:aws:iam::123456789012:user/the-boss"


def _set_decide_by(p: LocalPipeline, approval: str, epoch: int) -> None:
    """Move the approval's decision deadline (what passing time would do)."""
    p.client("dynamodb").update_item(
        TableName=p.tables["approvals"],
        Key=to_item(keys.approval(approval)),
        UpdateExpression="SET decide_by = :t",
        ExpressionAttributeValues={":t": {"N": str(epoch)}},
    )


def _decide_by(p: LocalPipeline, approval: str) -> int:
    item = p.client("dynamodb").get_item(
        TableName=p.tables["approvals"], Key=to_item(keys.approval(approval))
    )["Item"]
    return int(item["decide_by"]["N"])


def test_the_url_records_the_authenticated_principal_once_and_only_before_the_deadline(tmp_path):
    with LocalPipeline(CLUSTER) as p:
        # Given a replay mismatch on rank 3 waiting for an approval
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), str(tmp_path / "spool"))
        approval = pending_for(p, execution)
        me = p.client("sts").get_caller_identity()["Arn"]

        # When the decision window has passed and an operator approves through the URL
        deadline = _decide_by(p, approval)
        _set_decide_by(p, approval, int(time.time()) - 1)
        code, late = operator(p, "approve", approval, "--reason", "too late")
        # Then the approve function refuses it and the workflow still waits
        assert code == 1 and "ApprovalExpired" in late, late
        assert p.execution(execution)["status"] == "RUNNING"
        assert [i["approval_id"]["S"] for i in p.pending_approvals()] == [approval]

        # When (the deadline put back) a signed request claims someone else approved
        _set_decide_by(p, approval, deadline)
        service = ApprovalService(p.approval_url, region=REGION)
        decided = service.call(
            "approve", approval_id=approval, approver=SOMEONE_ELSE, reason="confirmed"
        )
        # Then the decision names the signer that AWS authenticated, not the claimed one
        assert decided["approver"] == me != SOMEONE_ELSE
        event = p.function_url.events[-1]
        assert event["requestContext"]["authorizer"]["iam"]["userArn"] == me
        assert event["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
        assert f"/{REGION}/lambda/aws4_request" in event["headers"]["authorization"]

        # When a second approval of the same request arrives
        code, again = operator(p, "approve", approval, "--reason", "me too")
        # Then it is refused: a decision is single-use
        assert code == 1 and "ApprovalAlreadyDecided" in again, again

        # And the workflow went on once, with the authenticated approver recorded
        done = p.finish(execution)
        assert done["status"] == "SUCCEEDED"
        assert p.hyperpod.replaced.keys() == {SUSPECT}
        approved = [
            c.payload["state"]["approval"]
            for c in p.invocations
            if c.folder == "record" and c.payload.get("transition") == "approved"
        ]
        assert [a["approver"] for a in approved] == [me]
        assert SOMEONE_ELSE not in json.dumps(p.ledger(), default=str)


def test_the_url_refuses_a_request_altered_after_signing(tmp_path):
    with LocalPipeline(CLUSTER) as p:
        # Given a request the CLI signed
        request = ApprovalService(p.approval_url, region=REGION).sign({"action": "pending"})
        headers = {k.lower(): v for k, v in request.headers.items()}
        # When its body is changed on the way
        status, body = p.function_url.serve(
            "POST", request.url, headers, b'{"action": "release", "node": "hyperpod-i-1"}'
        )
        # Then the URL answers 403 and the approve function never runs
        assert status == 403 and b"signature does not match" in body
        assert not p.function_url.events
        assert not [c for c in p.invocations if c.folder == "approve"]
        # While the request as signed is served
        status, _ = p.function_url.serve("POST", request.url, headers, request.body)
        assert status == 200
