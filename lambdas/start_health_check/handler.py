"""Start HyperPod's deep health check on the suspect instance."""

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
    """Start HyperPod's deep health check on the suspect instance."""
    state = parse_step(event, ItemState)
    current = settings()
    return steps.start_health_check(state, current, steps.kube_factory(current)).model_dump(
        mode="json"
    )
