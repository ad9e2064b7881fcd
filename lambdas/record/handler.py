"""Record: {transition, notify, state, error?} -> ledger entry + EMF metric (+ SNS) -> {recorded}."""

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
    """Append the transition to the ledger, emit its metric, notify when asked.

    A damaged state is salvaged rather than refused: this step is where every failure ends.
    """
    return steps.record(event, settings()).model_dump(mode="json")
