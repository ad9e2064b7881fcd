"""RequestApproval (waitForTaskToken): store the token under an approval id, publish evidence."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import ApprovalRequestInput, parse_step
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> None:
    """Returns nothing: the task's output is what the operator CLI sends with SendTaskSuccess."""
    state = parse_step(event, ApprovalRequestInput)
    steps.request_approval(state, settings())
