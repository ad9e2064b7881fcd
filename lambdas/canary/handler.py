"""Canary (scheduled, and the canary alarm's action): start a synthetic SDC event, or say where
the newest one stopped."""

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
    """A CloudWatch alarm action's event (``alarmData``) asks where the run stopped; the
    schedule's (``{"action": "start"}``) starts a run."""
    if isinstance(event, dict) and "alarmData" in event:
        stop = steps.canary_check(settings())
        return {"stopped_at": stop.step, "run": stop.run_id, "summary": stop.sentence()}
    run = steps.canary_start(settings())
    return {"run": run.run_id, "steps": run.reached}
