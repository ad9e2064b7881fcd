"""Localize: the EventBridge alarm event -> {alarm, suspects, ambiguous, reports}."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import parse_alarm_event
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Parse the alarm event (InvalidAlarmEvent otherwise) and localize its suspects."""
    alarm_event = parse_alarm_event(event)
    current = settings()
    return steps.localize(alarm_event, current, steps.kube_factory(current)).model_dump(mode="json")
