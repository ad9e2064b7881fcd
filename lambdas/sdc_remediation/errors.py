"""Typed errors: the exception class name is the contract with the workflow.

Step Functions matches Retry/Catch on the error type, which for a Python Lambda is the exception's
class name. Handlers therefore let these propagate; they never turn one into a return value.
See docs/CONTRACT.md ("Errors"); the names the workflow matches are ``sdc_contract.errors``'.
"""

from __future__ import annotations

from sdc_contract.errors import TRANSIENT_ERROR_NAMES


class RemediationError(Exception):
    """Base of every error this package raises on purpose."""


# --- Transient: the workflow retries these with backoff. ---------------------------------------


class ClusterApiUnavailable(RemediationError):
    """The Kubernetes API answered 5xx/429/409, timed out or could not be reached."""


class AwsApiUnavailable(RemediationError):
    """An AWS API throttled, answered 5xx, timed out or could not be reached."""


class ReportNotYetVisible(RemediationError):
    """The per-node metrics or the agent's report are not visible yet (eventual consistency)."""


# --- Terminal: caught by the workflow, recorded as `failed`, humans notified. ------------------


class InvalidAlarmEvent(RemediationError):
    """The workflow input is not an ALARM state change of one of this cluster's SDC alarms."""


class InvalidStepInput(RemediationError):
    """A step received a state object it cannot parse (a wiring error in the workflow)."""


class NodeNotFound(RemediationError):
    """Kubernetes has no node (or pod) of that name (HTTP 404)."""


class InstanceNotInCluster(RemediationError):
    """HyperPod has no such instance in the cluster: never guess another node."""


class HealthCheckRejected(RemediationError):
    """StartClusterHealthCheck refused the request."""


class ReplaceFailed(RemediationError):
    """BatchReplaceClusterNodes reported the node in Failed[] (or refused the call)."""


class ConfigurationError(RemediationError):
    """A setting is missing or invalid, or an IAM/RBAC permission is missing."""


# --- Operator CLI only. -------------------------------------------------------------------------


class ApprovalNotFound(RemediationError):
    """No approval with that id (never existed, or its TTL removed it)."""


class ApprovalExpired(RemediationError):
    """The approval's TTL passed or Step Functions no longer waits for its task token."""


class ApprovalAlreadyDecided(RemediationError):
    """Someone already approved or rejected this request."""


class NoCredentials(RemediationError):
    """No AWS credentials were found for the CLI."""


# --- Untrusted input (appended; the name is the workflow contract). ------------------------------


class UntrustedReport(RemediationError):
    """An agent report (or rank map) is malformed or contradicts HyperPod or Kubernetes.

    Reports are written by training pods, so nothing in one is acted on until HyperPod and
    Kubernetes confirm it: a node name that is not a Kubernetes name, an instance id that is not
    one, a node name that is not the instance's, a pod that is not the job's or not on that
    node. Terminal: the workflow records it as `failed`, notifies, and cordons nothing. ``field``
    names what did not hold (e.g. ``ranks.3.instance_id``), for the on-call message.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


TRANSIENT: tuple[type[RemediationError], ...] = tuple(globals()[n] for n in TRANSIENT_ERROR_NAMES)
"""The errors the workflow retries; everything else ends cordoned-and-notified."""

__all__ = [
    "TRANSIENT",
    "ApprovalAlreadyDecided",
    "ApprovalExpired",
    "ApprovalNotFound",
    "AwsApiUnavailable",
    "ClusterApiUnavailable",
    "ConfigurationError",
    "HealthCheckRejected",
    "InstanceNotInCluster",
    "InvalidAlarmEvent",
    "InvalidStepInput",
    "NoCredentials",
    "NodeNotFound",
    "RemediationError",
    "ReplaceFailed",
    "ReportNotYetVisible",
    "UntrustedReport",
]


class ApprovalNotVerified(RemediationError):
    """The decision a step received is not one the approvals table holds: no such request, not
    claimed with that decision, claimed after its ``decide_by``, by another approver, or for
    another node or execution. The task token sits in the execution's history, so whoever may
    read it and send task results could resume the workflow with any message; only what the
    approve function claimed in the table (a person's, or the auto-approval policy's, decision)
    replaces a node. Terminal: recorded ``failed``, the node stays cordoned."""


class NodeNotHeld(RemediationError):
    """``sdc-remediation release``: the blast-radius guard does not hold that node."""


__all__ += ["ApprovalNotVerified", "NodeNotHeld"]


class NodeStillCordoned(RemediationError):
    """``sdc-remediation release``: the node is still cordoned; uncordon (or replace) it first,
    or the guard would count it in service while it is not."""


__all__ += ["NodeStillCordoned"]


class NodeInRemediation(RemediationError):
    """``sdc-remediation release``: a remediation of the node is still in flight (admitted, not
    yet closed). Releasing it then would drop the guard's hold of a node the remediation is
    about to cordon and keep; decide its approval (reject, with ``--release`` to uncordon) or
    wait for it to end, then release."""


__all__ += ["NodeInRemediation"]
