"""Approval requests: the task token stored under an opaque id, and the decision that resumes it.

The Lambda side (``request``) stores the token and publishes the evidence; the operator side
(``Approvals.pending/decide``, used by the CLI) finds requests and sends the decision with
SendTaskSuccess. The token only ever lives in the table (with a TTL), never in a message.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import botocore.exceptions

from . import aws, clock
from .dynamo import from_item, to_item
from .errors import (
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    AwsApiUnavailable,
    NoCredentials,
)
from .models import ApprovalDecision

# Step Functions' answers for a token it no longer waits on (timed out, execution ended, garbage).
EXPIRED_TOKEN_ERRORS = {"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"}


def approval_id_for(task_token: str) -> str:
    """The approval id of a task token: opaque, shell-safe, and the same for a retried task.

    A one-way hash, so the id reveals nothing of the token; deterministic, so a Lambda retried by
    Step Functions with the same token finds its own request instead of creating a second one.
    """
    return "a-" + hashlib.sha256(task_token.encode()).hexdigest()[:16]


class Approvals:
    """The approvals table, plus Step Functions and STS for decisions."""

    def __init__(self, table: str) -> None:
        self.table = table

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    def create(
        self,
        *,
        task_token: str,
        remediation_id: str | None,
        instance_id: str,
        node_name: str,
        evidence: dict[str, Any],
        ttl_seconds: int,
        execution: str,
    ) -> tuple[str, bool]:
        """Store a pending approval; returns its id and whether its notification is still due
        (False when a retried invocation finds the request already announced)."""
        approval_id = approval_id_for(task_token)
        now = clock.now()
        item = {
            "approval_id": approval_id,
            "task_token": task_token,
            "remediation_id": remediation_id or "",
            "instance_id": instance_id,
            "node_name": node_name,
            "evidence": json.dumps(evidence, default=str),
            "status": "pending",
            "created_at": clock.iso(now),
            "expires_at": int(now.timestamp()) + ttl_seconds,
            "execution": execution,
        }
        try:
            with aws.aws_errors("dynamodb:PutItem"):
                self._ddb.put_item(
                    TableName=self.table,
                    Item=to_item(item),
                    ConditionExpression="attribute_not_exists(approval_id)",
                )
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) != "ConditionalCheckFailedException":
                raise
            return approval_id, not self.get(approval_id).get("notified", False)
        return approval_id, True

    def mark_notified(self, approval_id: str) -> None:
        """Remember that the request's message went out (a retry then does not send it again)."""
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=to_item({"approval_id": approval_id}),
                UpdateExpression="SET notified = :t",
                ExpressionAttributeValues=to_item({":t": True}),
            )

    def get(self, approval_id: str) -> dict[str, Any]:
        """The approval item (ApprovalNotFound when there is none)."""
        with aws.aws_errors("dynamodb:GetItem"):
            resp = self._ddb.get_item(
                TableName=self.table, Key=to_item({"approval_id": approval_id}), ConsistentRead=True
            )
        item = from_item(resp.get("Item"))
        if item is None:
            raise ApprovalNotFound(f"no approval request with id {approval_id!r}")
        return item

    def pending(self) -> list[dict[str, Any]]:
        """Pending, unexpired approvals with their evidence (token removed), oldest first."""
        now = int(clock.now().timestamp())
        items: list[dict[str, Any]] = []
        with aws.aws_errors("dynamodb:Scan"):
            for page in self._ddb.get_paginator("scan").paginate(
                TableName=self.table,
                FilterExpression="#s = :pending AND expires_at > :now",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=to_item({":pending": "pending", ":now": now}),
            ):
                items.extend(from_item(i) for i in page.get("Items", []))
        for item in items:
            item.pop("task_token", None)
            item["evidence"] = json.loads(item.get("evidence") or "{}")
        return sorted(items, key=lambda i: i["created_at"])

    def decide(
        self,
        approval_id: str,
        decision: Literal["approve", "reject"],
        *,
        release: bool = False,
        reason: str = "",
    ) -> ApprovalDecision:
        """Claim the request, then resume the workflow with SendTaskSuccess.

        The claim (a conditional update from ``pending``) makes two concurrent approvers safe:
        exactly one sends the decision. A token Step Functions no longer knows means expired.
        """
        approver = caller_arn()
        item = self.get(approval_id)
        self._check_open(item)
        status = "approved" if decision == "approve" else "rejected"
        now = clock.now()
        try:
            with aws.aws_errors("dynamodb:UpdateItem"):
                self._ddb.update_item(
                    TableName=self.table,
                    Key=to_item({"approval_id": approval_id}),
                    UpdateExpression="SET #s = :status, approver = :who, reason = :why, decided_at = :at, #rel = :rel",
                    ConditionExpression="#s = :pending AND expires_at > :now",
                    ExpressionAttributeNames={"#s": "status", "#rel": "release"},
                    ExpressionAttributeValues=to_item(
                        {
                            ":status": status,
                            ":who": approver,
                            ":why": reason,
                            ":at": clock.iso(now),
                            ":rel": release,
                            ":pending": "pending",
                            ":now": int(now.timestamp()),
                        }
                    ),
                )
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) == "ConditionalCheckFailedException":
                self._check_open(self.get(approval_id))  # raises the precise reason
            raise
        result = ApprovalDecision(
            decision=decision,
            release=release if decision == "reject" else False,
            approver=approver,
            reason=reason,
            approval_id=approval_id,
        )
        self._send(item, result)
        return result

    def _check_open(self, item: dict[str, Any]) -> None:
        status = item.get("status")
        if status == "expired" or (
            status == "pending" and int(item["expires_at"]) <= int(clock.now().timestamp())
        ):
            raise ApprovalExpired(
                f"approval {item['approval_id']} expired; the node stays cordoned"
            )
        if status != "pending":
            raise ApprovalAlreadyDecided(
                f"approval {item['approval_id']} was already {status} by {item.get('approver', '?')} "
                f"at {item.get('decided_at', '?')}"
            )

    def _send(self, item: dict[str, Any], result: ApprovalDecision) -> None:
        sfn = aws.client("stepfunctions")
        try:
            with aws.aws_errors("states:SendTaskSuccess"):
                sfn.send_task_success(taskToken=item["task_token"], output=result.model_dump_json())
        except botocore.exceptions.ClientError as exc:
            code = aws.error_code(exc)
            if code in EXPIRED_TOKEN_ERRORS:
                self._set_status(item["approval_id"], "expired")
                raise ApprovalExpired(
                    f"approval {item['approval_id']}: the workflow no longer waits for it ({code}); "
                    "the node stays cordoned"
                ) from exc
            self._set_status(item["approval_id"], "pending")
            raise AwsApiUnavailable(
                f"SendTaskSuccess failed ({code}); nothing was decided, try again"
            ) from exc
        except AwsApiUnavailable:
            self._set_status(item["approval_id"], "pending")
            raise

    def _set_status(self, approval_id: str, status: str) -> None:
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=to_item({"approval_id": approval_id}),
                UpdateExpression="SET #s = :s",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=to_item({":s": status}),
            )


def caller_arn() -> str:
    """The caller's IAM identity (what the ledger and the workflow record as approver)."""
    sts = aws.client("sts")
    with aws.aws_errors("sts:GetCallerIdentity"):
        try:
            return sts.get_caller_identity()["Arn"]
        except botocore.exceptions.NoCredentialsError as exc:
            raise NoCredentials(
                "no AWS credentials found (configure a profile, SSO login or AWS_* variables)"
            ) from exc
