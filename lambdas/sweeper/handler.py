"""Sweeper (scheduled): close remediations whose workflow execution is no longer running."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.observability import logger, metrics, tracer


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The EventBridge schedule's event carries nothing we need; the ledger is the work list."""
    return steps.sweep(settings()).as_dict()
