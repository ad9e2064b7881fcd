"""Admit: item state -> {decision: admitted | duplicate | circuit_open, remediation_id, reason}."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sdc_remediation.config import settings
from sdc_remediation.logic import steps
from sdc_remediation.models import ItemState, parse_step
from sdc_remediation.observability import logger, metrics, tracer


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Claim the node in the ledger unless it is open already or the guard trips."""
    state = parse_step(event, ItemState)
    current = settings()
    admission = steps.admit(state, current)
    metrics.add_dimension(name="ClusterName", value=current.hyperpod_cluster_name)
    metrics.add_metric(name=f"admission_{admission.decision}", unit="Count", value=1)
    return admission.model_dump(mode="json")
