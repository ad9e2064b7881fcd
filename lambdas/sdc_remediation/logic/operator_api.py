"""The approve function's API: what operators do, as the IAM principal AWS authenticated.

The function sits behind a Lambda function URL with ``AWS_IAM`` auth. Lambda verifies the
request's SigV4 signature and puts the caller's ARN in the event
(``requestContext.authorizer.iam.userArn``, payload format 2.0); that ARN, and never anything in
the body, is recorded as the approver. The function's role is the only one allowed to send task
results to the state machine (unless the opt-in autoApprove policy is on) and to read the
approvals table (task tokens), so the decision deadline and the single-use claim
(``approvals.Approvals.decide``) hold for every decision.

Every request comes through the URL: no role may invoke the function otherwise (IAM conditions
every lambda:InvokeFunction grant on ``lambda:InvokedViaFunctionUrl``), because a handler cannot
tell a direct invoke carrying a made-up ``requestContext`` from a URL request. The canary's
approval takes its own action on the URL, ``settle_canary_approval`` (request_approval calls it,
signed with its role): it approves as the canary (``canary.APPROVER``) only an approval whose
record is the canary's (``canary.settle_approval``); anything else is refused
(``CanaryApprovalRefused``, 403) and nothing is sent.

Request: ``POST`` with a JSON body ``{"action": "pending" | "approve" | "reject" | "release" |
"settle_canary_approval", "approval_id": ..., "node": ..., "reason": ..., "release": bool}``.
Response: JSON, 200 with the result, or 4xx/5xx with ``{"error": <exception class name>,
"message": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..clients.kube import KubeApi
from ..config import Settings
from ..dal.approvals import Approvals
from ..dal.ledger import Ledger
from ..errors import (
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    AwsApiUnavailable,
    InvalidStepInput,
    NodeInRemediation,
    NodeNotHeld,
    NodeStillCordoned,
    RemediationError,
)
from ..observability import logger
from . import canary, release


class CallerNotAllowed(RemediationError):
    """The caller may not ask for this action: request_approval's role (``APPROVAL_REQUESTER_ROLE``)
    may settle the canary's approval only, never approve, reject or release a node."""


STATUS_OF: dict[type[RemediationError], int] = {
    InvalidStepInput: 400,
    canary.CanaryApprovalRefused: 403,
    CallerNotAllowed: 403,
    ApprovalNotFound: 404,
    NodeNotHeld: 404,
    ApprovalAlreadyDecided: 409,
    NodeStillCordoned: 409,
    NodeInRemediation: 409,
    ApprovalExpired: 410,
    AwsApiUnavailable: 503,
}
"""HTTP status of each domain error (others: 500). The CLI turns them back into the class."""


class NotAuthenticated(RemediationError):
    """The request carries no IAM caller (the function URL is not AWS_IAM, or a direct invoke)."""


def role_name_of(caller: str) -> str | None:
    """The IAM role name in an ARN the function URL authenticated (``arn:aws:sts::<account>:
    assumed-role/<role>/<session>``, or an ``iam`` role ARN); None for any other principal."""
    parts = caller.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        return None
    service, resource = parts[2], parts[5]
    if service == "sts" and resource.startswith("assumed-role/"):
        segments = resource.split("/")
        return segments[1] if len(segments) >= 3 else None
    if service == "iam" and resource.startswith("role/"):
        return resource.rsplit("/", 1)[-1]
    return None


def confine(request: OperatorRequest, caller: str, settings: Settings) -> None:
    """request_approval's role reaches the URL to settle the canary's approval: that action is
    all it may ask for (``CallerNotAllowed`` otherwise). Everyone else is confined by the
    actions themselves (``settle_canary_approval`` settles a canary approval only)."""
    role = settings.approval_requester_role
    if role and role_name_of(caller) == role and request.action != canary.SETTLE_ACTION:
        raise CallerNotAllowed(
            f"{caller[:200]} (request_approval's role) may call the approve URL only to settle "
            f"the canary's approval ({canary.SETTLE_ACTION}), not {request.action!r}"
        )


class OperatorRequest(BaseModel):
    """The body of a request to the approve function. An ``approver`` key is ignored."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["pending", "approve", "reject", "release", "settle_canary_approval"]
    approval_id: str | None = Field(default=None, min_length=1, max_length=64)
    node: str | None = Field(default=None, min_length=1, max_length=253)
    reason: str = Field(default="", max_length=1000)
    release: bool = False


def caller_of(event: dict[str, Any]) -> str:
    """The authenticated caller's ARN from a function URL (payload 2.0) event."""
    iam = ((event.get("requestContext") or {}).get("authorizer") or {}).get("iam") or {}
    arn = iam.get("userArn")
    if not isinstance(arn, str) or not arn.startswith("arn:"):
        raise NotAuthenticated(
            "no authenticated IAM caller in the request: the approve function only answers its "
            "AWS_IAM function URL"
        )
    return arn


def parse_request(event: dict[str, Any]) -> OperatorRequest:
    """The request body, decoded (function URLs base64-encode bodies they deem binary)."""
    method = ((event.get("requestContext") or {}).get("http") or {}).get("method", "POST")
    if method != "POST":
        raise InvalidStepInput(f"use POST, not {method}")
    body = event.get("body") or "{}"
    try:
        if event.get("isBase64Encoded"):
            body = base64.b64decode(body).decode()
        return OperatorRequest.model_validate(json.loads(body))
    except (ValueError, binascii.Error, ValidationError) as exc:
        raise InvalidStepInput(f"bad request body: {str(exc).splitlines()[0]}") from exc


def perform(
    request: OperatorRequest, caller: str, settings: Settings, kube: Callable[[], KubeApi]
) -> dict[str, Any]:
    """Do what the operator asked, as ``caller``; the JSON result."""
    confine(request, caller, settings)
    if request.action == "pending":
        return {"pending": Approvals(settings.approvals_table).pending()}
    if request.action == "release":
        if not request.node:
            raise InvalidStepInput("release needs `node`")
        instance_id = release.release(
            Ledger(settings.ledger_table),
            kube,
            request.node,
            released_by=caller,
            reason=request.reason,
        )
        return {"released": instance_id, "released_by": caller}
    if not request.approval_id:
        raise InvalidStepInput(f"{request.action} needs `approval_id`")
    if request.action == canary.SETTLE_ACTION:
        logger.info("canary approval", extra={"approval_id": request.approval_id})
        settled = canary.settle_approval(settings, request.approval_id, caller)
        if settled is None:
            return {"approval_id": request.approval_id, "already_decided": True}
        return settled.model_dump(mode="json")
    if request.action not in ("approve", "reject"):  # every other action returned above
        raise InvalidStepInput(f"unknown action {request.action!r}")
    result = Approvals(settings.approvals_table).decide(
        request.approval_id,
        request.action,
        release=request.release,
        reason=request.reason,
        approver=caller,
    )
    return result.model_dump(mode="json")


def handle(
    event: dict[str, Any], settings: Settings, kube: Callable[[], KubeApi]
) -> dict[str, Any]:
    """A function URL event -> a function URL response (never raises a domain error)."""
    try:
        caller = caller_of(event)
        request = parse_request(event)
        logger.info("operator request", extra={"action": request.action, "caller": caller})
        body, status = perform(request, caller, settings, kube), 200
    except NotAuthenticated as exc:
        body, status = {"error": type(exc).__name__, "message": str(exc)}, 403
    except RemediationError as exc:
        status = next((s for t, s in STATUS_OF.items() if isinstance(exc, t)), 500)
        body = {"error": type(exc).__name__, "message": str(exc)}
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(body, default=str),
    }
