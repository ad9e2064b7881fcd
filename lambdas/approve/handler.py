"""Approve (function URL, AWS_IAM auth): decide approvals and release nodes as the caller IAM
authenticated; the only function allowed to send task results to the workflow (unless the opt-in
autoApprove policy is on). Reached only through its URL; request_approval settles the canary's
approval through it too (its own action, signed with its role)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """A function URL request (payload format 2.0) -> its HTTP response."""
    return steps.approve(event, settings())
