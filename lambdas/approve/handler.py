"""Approve (function URL, AWS_IAM auth): decide approvals and release nodes as the caller IAM
authenticated; the only function allowed to send task results to the workflow (unless the opt-in
autoApprove policy is on). request_approval invokes it directly to settle the canary's approval."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import operator_api, steps
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """A function URL request (payload format 2.0) -> its HTTP response; request_approval's
    direct canary event -> the canary's decision (``operator_api.settle_canary``)."""
    if operator_api.is_direct_canary_event(event):
        return operator_api.settle_canary(event, settings())
    current = settings()
    return operator_api.handle(event, current, steps.kube_factory(current))
