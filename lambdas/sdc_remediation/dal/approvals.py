"""Approval requests: the task token stored under an opaque id, and the decision that resumes it.

The Lambda side (``request``) stores the token and publishes the evidence; the operator side
(``Approvals.pending/decide``, used by the CLI) finds requests and sends the decision with
SendTaskSuccess. The token only ever lives in the table (with a TTL), never in a message.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Literal

import botocore.exceptions

from sdc_contract.names import APPROVAL_DECISION_ATTRIBUTES

from .. import aws, clock
from ..errors import (
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    AwsApiUnavailable,
    ConfigurationError,
    NoCredentials,
)
from ..models import ApprovalDecision
from . import keys
from .dynamo import Table, condition_failed

# Step Functions' answers for a token it no longer waits on (timed out, execution ended, garbage).
EXPIRED_TOKEN_ERRORS = {"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"}

# Approval statuses: pending -> sending (claimed, SendTaskSuccess under way or its outcome
# unknown) -> approved | rejected | expired; a send that certainly failed goes back to pending.
PENDING = "pending"
SENDING = "sending"


DECISION_ATTRIBUTES: tuple[str, ...] = APPROVAL_DECISION_ATTRIBUTES
"""What a step that acts on a decision reads of its approval (``Approvals.decision_record``):
never the task token; the replace function's grant is conditioned on these attributes."""


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
        self._table = Table(table)

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
        timeout_seconds: int | None = None,
    ) -> tuple[str, bool]:
        """Store a pending approval; returns its id and whether its notification is still due
        (False when a retried invocation finds the request already announced).

        ``timeout_seconds`` is how long the workflow waits for the decision: after
        ``decide_by`` (now + it) the request is no longer listed nor decidable, although the
        record lives until ``expires_at`` (``ttl_seconds``). None: until ``expires_at``.
        """
        approval_id = approval_id_for(task_token)
        now = clock.now()
        created = int(now.timestamp())
        item = {
            **keys.approval(approval_id),
            "task_token": task_token,
            "remediation_id": remediation_id or "",
            "instance_id": instance_id,
            "node_name": node_name,
            "evidence": json.dumps(evidence, default=str),
            "status": PENDING,
            "created_at": clock.iso(now),
            "expires_at": created + ttl_seconds,
            "decide_by": created + min(ttl_seconds, timeout_seconds or ttl_seconds),
            "execution": execution,
        }
        if not self._table.put_if(item, "attribute_not_exists(approval_id)"):
            return approval_id, not self.get(approval_id).get("notified", False)
        return approval_id, True

    def withdraw(self, approval_id: str) -> bool:
        """Remove a request whose announcement could not be sent (still ``pending``, never
        ``notified``): nobody was told of it, so nobody may find it in ``pending`` and decide a
        workflow that is about to retry the step (which stores and announces it again) or to
        record the failure. False when it was announced or decided meanwhile (kept)."""
        return self._table.delete_if(
            keys.approval(approval_id),
            "#s = :pending AND attribute_not_exists(notified)",
            names={"#s": "status"},
            values={":pending": PENDING},
        )

    def mark_notified(self, approval_id: str) -> None:
        """Remember that the request's message went out (a retry then does not send it again)."""
        self._table.update(keys.approval(approval_id), "SET notified = :t", values={":t": True})

    def get(self, approval_id: str) -> dict[str, Any]:
        """The approval item (ApprovalNotFound when there is none)."""
        item = self._table.get(keys.approval(approval_id))
        if item is None:
            raise ApprovalNotFound(f"no approval request with id {approval_id!r}")
        return item

    def decision_record(self, approval_id: str) -> dict[str, Any] | None:
        """The approval's decision as the table holds it (``DECISION_ATTRIBUTES`` only, never
        the token; a consistent read), or None when there is no such request."""
        names = {f"#a{index}": name for index, name in enumerate(DECISION_ATTRIBUTES)}
        return self._table.get(
            keys.approval(approval_id),
            ProjectionExpression=", ".join(names),
            ExpressionAttributeNames=names,
        )

    def pending(self) -> list[dict[str, Any]]:
        """Approvals still waiting for a decision, with their evidence (token removed), oldest
        first: ``pending`` ones, and ``sending`` ones whose decision's outcome is unknown (the
        decision must be repeated to re-send it)."""
        now = int(clock.now().timestamp())
        items = self._table.scan(
            "#s IN (:pending, :sending) AND expires_at > :now "
            "AND (attribute_not_exists(decide_by) OR decide_by > :now)",
            names={"#s": "status"},
            values={":pending": PENDING, ":sending": SENDING, ":now": now},
        )
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
        approver: str | None = None,
    ) -> ApprovalDecision:
        """Claim the request, then resume the workflow with SendTaskSuccess.

        ``approver`` is the authenticated IAM ARN of whoever decides: the approve function passes
        the caller its function URL authenticated (``requestContext.authorizer.iam.userArn``);
        None asks STS for this process's own identity (the direct path, for principals allowed
        to send task results themselves). Never a name taken from a request body.

        The claim (a conditional update from ``pending`` to ``sending``, which stores the
        decision) makes two concurrent approvers safe: exactly one sends the decision. Then:

        - sent: the status becomes ``approved`` / ``rejected``;
        - Step Functions no longer knows the token: ``expired`` (ApprovalExpired);
        - refused for sure (denied, throttled, invalid): back to ``pending``, nothing decided;
        - outcome unknown (the answer was lost after sending, or a 5xx): it stays ``sending``.
          Repeating the same decision re-sends the stored one, which is safe: on a task that the
          first send already resumed, Step Functions answers TaskTimedOut/InvalidToken, read
          then as "already decided".
        """
        approver = approver or caller_arn()
        item = self.get(approval_id)
        if item.get("status") == SENDING:
            return self._resend(item, decision)
        self._check_open(item)
        result = ApprovalDecision(
            decision=decision,
            release=release if decision == "reject" else False,
            approver=approver,
            reason=reason,
            approval_id=approval_id,
        )
        self._claim(item, result)
        self._send(item, result, resend=False)
        return result

    def _claim(self, item: dict[str, Any], result: ApprovalDecision) -> None:
        """``pending`` -> ``sending`` with the decision; the precise error when that fails."""
        now = clock.now()
        try:
            # Not ``update_if``: when the table holds no precise reason for the refusal, the
            # refusal itself is the error.
            self._table.update(
                keys.approval(item["approval_id"]),
                "SET #s = :sending, #d = :decision, approver = :who, reason = :why, "
                "decided_at = :at, #rel = :rel",
                condition="#s = :pending AND expires_at > :now "
                "AND (attribute_not_exists(decide_by) OR decide_by > :now)",
                names={"#s": "status", "#d": "decision", "#rel": "release"},
                values={
                    ":sending": SENDING,
                    ":decision": result.decision,
                    ":who": result.approver,
                    ":why": result.reason,
                    ":at": clock.iso(now),
                    ":rel": result.release,
                    ":pending": PENDING,
                    ":now": int(now.timestamp()),
                },
            )
        except botocore.exceptions.ClientError as exc:
            if condition_failed(exc):
                latest = self.get(item["approval_id"])
                if latest.get("status") == SENDING:
                    raise ApprovalAlreadyDecided(_in_flight(latest)) from exc
                self._check_open(latest)  # raises the precise reason
            raise

    def _resend(
        self, item: dict[str, Any], decision: Literal["approve", "reject"]
    ) -> ApprovalDecision:
        """Send again a decision whose first send had an unknown outcome (status ``sending``).

        The stored decision is sent unchanged (its approver, reason and release), so the
        workflow sees one decision whichever send reached it. Asking for the other decision is
        refused: the first one may already have resumed the workflow.
        """
        stored = ApprovalDecision(
            decision=item["decision"],
            release=bool(item.get("release", False)) if item["decision"] == "reject" else False,
            approver=item.get("approver", "?"),
            reason=item.get("reason", ""),
            approval_id=item["approval_id"],
        )
        if decision != stored.decision:
            raise ApprovalAlreadyDecided(_in_flight(item))
        self._send(item, stored, resend=True)
        return stored

    def _check_open(self, item: dict[str, Any]) -> None:
        status = item.get("status")
        now = int(clock.now().timestamp())
        deadline = int(item.get("decide_by", item["expires_at"]))
        if status == "expired" or (
            status == PENDING and min(deadline, int(item["expires_at"])) <= now
        ):
            # Past decide_by the workflow no longer waits (its approval timed out): refuse
            # without calling Step Functions or changing the record.
            raise ApprovalExpired(
                f"approval {item['approval_id']} expired (the workflow waited until "
                f"{clock.iso(datetime.fromtimestamp(deadline, UTC))}); the node stays cordoned"
            )
        if status != PENDING:
            raise ApprovalAlreadyDecided(
                f"approval {item['approval_id']} was already {status} by {item.get('approver', '?')} "
                f"at {item.get('decided_at', '?')}"
            )

    def _send(self, item: dict[str, Any], result: ApprovalDecision, *, resend: bool) -> None:
        """SendTaskSuccess, then the status its outcome allows (see ``decide``)."""
        approval_id = item["approval_id"]
        decided = "approved" if result.decision == "approve" else "rejected"
        sfn = aws.client("stepfunctions")
        try:
            sfn.send_task_success(taskToken=item["task_token"], output=result.model_dump_json())
        except botocore.exceptions.ClientError as exc:
            code = aws.error_code(exc)
            http_status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in EXPIRED_TOKEN_ERRORS:
                if resend:
                    # The earlier send (whose answer was lost) most likely resumed the task.
                    self._set_status(approval_id, decided)
                    raise ApprovalAlreadyDecided(
                        f"approval {approval_id}: the workflow no longer waits for it ({code}): "
                        f"the earlier {result.decision} by {result.approver} reached it (unless "
                        "the approval timed out at that moment: `sdc-remediation history` shows "
                        "which)"
                    ) from exc
                self._set_status(approval_id, "expired")
                raise ApprovalExpired(
                    f"approval {approval_id}: the workflow no longer waits for it ({code}); "
                    "the node stays cordoned"
                ) from exc
            if http_status >= 500:
                # The service failed while handling the request: it may have resumed the task.
                raise self._unknown(approval_id, result, f"{code or http_status}") from exc
            if not resend:
                self._release_claim(approval_id)
            left = (
                f"the earlier send's outcome is still unknown: repeat the {result.decision}"
                if resend
                else f"nothing was decided: approval {approval_id} is pending again"
            )
            if code in aws.DENIED_CODES:
                raise ConfigurationError(
                    f"SendTaskSuccess was denied ({code}): your credentials ({result.approver}) "
                    "are not allowed states:SendTaskSuccess on the state machine; ask for the "
                    f"operator policy. {left[0].upper()}{left[1:]}"
                ) from exc
            raise AwsApiUnavailable(f"SendTaskSuccess failed ({code}); {left}, try again") from exc
        except botocore.exceptions.HTTPClientError as exc:
            # Connected and (maybe) sent, then the answer was lost: read timeout, closed socket.
            raise self._unknown(approval_id, result, type(exc).__name__) from exc
        except Exception:
            # Refused before anything was sent (no connection, no credentials, bad parameters).
            if not resend:
                self._release_claim(approval_id)
            raise
        self._set_status(approval_id, decided)

    def _unknown(self, approval_id: str, result: ApprovalDecision, why: str) -> AwsApiUnavailable:
        """The error for a send whose outcome is unknown; the status stays ``sending``."""
        command = "approve" if result.decision == "approve" else "reject"
        return AwsApiUnavailable(
            f"SendTaskSuccess's outcome is unknown ({why}): the {result.decision} of approval "
            f"{approval_id} may or may not have reached the workflow. Run `sdc-remediation "
            f"{command} {approval_id}` again to re-send it (safe: if it arrived, the retry says "
            "it was already decided)"
        )

    def _release_claim(self, approval_id: str) -> None:
        """``sending`` -> ``pending`` after a send that certainly did not happen."""
        self._table.update_if(
            keys.approval(approval_id),
            "SET #s = :pending REMOVE #d, approver, reason, decided_at, #rel",
            "#s = :sending",
            names={"#s": "status", "#d": "decision", "#rel": "release"},
            values={":pending": PENDING, ":sending": SENDING},
        )

    def _set_status(self, approval_id: str, status: str) -> None:
        self._table.update(
            keys.approval(approval_id),
            "SET #s = :s",
            names={"#s": "status"},
            values={":s": status},
        )


def _in_flight(item: dict[str, Any]) -> str:
    """Why a decision is refused while another one's send has an unknown outcome."""
    return (
        f"approval {item['approval_id']}: the {item.get('decision', '?')} by "
        f"{item.get('approver', '?')} at {item.get('decided_at', '?')} was sent but its outcome "
        f"is unknown; repeat `{item.get('decision', '?')}` to re-send it"
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
