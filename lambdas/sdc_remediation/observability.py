"""The Powertools singletons every handler shares.

Service name and metrics namespace are the contract's constants (the same values the CDK app sets
as POWERTOOLS_SERVICE_NAME / POWERTOOLS_METRICS_NAMESPACE), given explicitly: Powertools reads its
variables when these objects are built, at import, and a process that imports a handler before
its environment is complete (a test runner collecting every module, a harness starting several
functions) would otherwise keep a Metrics without a namespace, whose every flush raises.
Tests disable tracing with POWERTOOLS_TRACE_DISABLED.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

from sdc_contract.metrics import POWERTOOLS_METRICS_NAMESPACE, POWERTOOLS_SERVICE_NAME

logger = Logger(service=POWERTOOLS_SERVICE_NAME)
tracer = Tracer(service=POWERTOOLS_SERVICE_NAME)
metrics = Metrics(namespace=POWERTOOLS_METRICS_NAMESPACE, service=POWERTOOLS_SERVICE_NAME)

__all__ = ["logger", "metrics", "tracer"]
