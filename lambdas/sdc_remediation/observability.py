"""The Powertools singletons every handler shares (service name and namespace come from the
POWERTOOLS_* variables the CDK app sets; tests disable tracing with POWERTOOLS_TRACE_DISABLED)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
tracer = Tracer()
metrics = Metrics()

__all__ = ["logger", "metrics", "tracer"]
