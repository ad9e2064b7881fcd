"""The remediation errors by name: what the workflow retries and what it catches; and the one
base of the agent's own errors (:class:`SdcAgentError`).

The Lambdas raise exceptions whose class names are these strings (``sdc_remediation.errors``);
the state machine (``infra/constructs/workflow.py``) matches its Retry and Catch clauses on the
same strings. Both import them from here, so a renamed error cannot leave a step uncaught.
"""

from __future__ import annotations

REPORT_NOT_YET_VISIBLE = "ReportNotYetVisible"
"""A series names a node whose report CloudWatch Logs does not show yet (eventual consistency):
retried without jitter, so the wait for the report has a floor (the workflow's REPORT_WAIT)."""

TRANSIENT_ERROR_NAMES: tuple[str, ...] = (
    "ClusterApiUnavailable",
    "AwsApiUnavailable",
    REPORT_NOT_YET_VISIBLE,
)
"""Raised when a dependency is briefly unavailable: retried with jittered backoff."""

TERMINAL_ERROR_NAMES: tuple[str, ...] = (
    "InvalidAlarmEvent",
    "InvalidStepInput",
    "NodeNotFound",
    "InstanceNotInCluster",
    "HealthCheckRejected",
    "ReplaceFailed",
    "ConfigurationError",
    # A report that is malformed or contradicts HyperPod/Kubernetes: nothing is cordoned.
    "UntrustedReport",
    # A decision that is not the one the approvals table holds: nothing is replaced.
    "ApprovalNotVerified",
)
"""Never retried: caught, recorded as ``failed``, humans notified."""


class SdcAgentError(Exception):
    """An error the agent raised on purpose; its message says what is wrong and what to change.

    It lives here, beside the contract's own ``AlarmLogError`` (which derives from it), so that
    the modules the remediation and the operator load without torch (``sdc_contract.resume``,
    ``sdc_agent/recovery.py`` as a file) share it; ``sdc_agent.SdcAgentError`` is this class."""


__all__ = [
    "REPORT_NOT_YET_VISIBLE",
    "TERMINAL_ERROR_NAMES",
    "TRANSIENT_ERROR_NAMES",
    "SdcAgentError",
]
