"""Localize: the EventBridge alarm event -> {alarm, suspects, pending, refused, ambiguous,
reports}; or a pending node's Map item {alarm, pending} -> its suspect (``localize_late``)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import LateInput, parse_alarm_event, parse_step
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Parse the alarm event (InvalidAlarmEvent otherwise) and localize its suspects; a pending
    node's item (it carries ``pending``) is looked for again alone."""
    current = settings()
    kube = steps.kube_factory(current)
    if isinstance(event, dict) and "pending" in event:
        late = parse_step(event, LateInput)
        return steps.localize_late(late, current, kube).model_dump(mode="json")
    alarm_event = parse_alarm_event(event)
    return steps.localize(alarm_event, current, kube).model_dump(mode="json")
