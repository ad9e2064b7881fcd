"""Screen: item state (with $.screen after the first call) -> the node screen's Job started,
polled, or its outcome (reproduced | clean | inconclusive | failed | not_configured | skipped)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import ItemState, parse_step
from sdc_remediation.observability import logger, tracer


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One call of the Screen step: create the screen Job, or read where it stands."""
    state = parse_step(event, ItemState)
    current = settings()
    return steps.screen(state, current, steps.kube_factory(current)).model_dump(mode="json")
