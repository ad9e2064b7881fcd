"""Screen idle: the schedule's ``{"action": "run"}`` follows the running idle-node screens and
starts new ones; ``{"action": "screen", "node": N}`` screens one node now."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import idle_screen, steps
from sdc_remediation.observability import logger, metrics, tracer


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One run of the idle screener, or one node screened by hand (a JSON summary)."""
    current = settings()
    return idle_screen.handle(event, current, steps.kube_factory(current))
