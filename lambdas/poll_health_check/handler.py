"""PollHealthCheck: item state with $.health -> in_progress | passed | failed | replaced_by_hyperpod | timed_out."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import PollInput, parse_step
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One poll of the deep health check started by start_health_check."""
    state = parse_step(event, PollInput)
    current = settings()
    return steps.poll_health_check(state, current, steps.kube_factory(current)).model_dump(
        mode="json"
    )
