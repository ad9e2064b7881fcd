"""Environment variable names: what infra sets on the functions and they read, and what the
agent reads in a training job.

Plain constants: docs/CONTRACT.md ("Lambdas: environment") and docs/agent-install.md ("The
environment it reads") say what each one means.
"""

from __future__ import annotations

# --- Lambdas: environment (infra/constructs/functions.py sets them; config.Settings reads them)
HYPERPOD_CLUSTER_NAME = "HYPERPOD_CLUSTER_NAME"
EKS_CLUSTER_NAME = "EKS_CLUSTER_NAME"
METRIC_NAMESPACE = "METRIC_NAMESPACE"
REPORT_LOG_GROUP = "REPORT_LOG_GROUP"
LOOKBACK_SECONDS = "LOOKBACK_SECONDS"
LEDGER_TABLE = "LEDGER_TABLE"
APPROVALS_TABLE = "APPROVALS_TABLE"
TOPIC_ARN = "TOPIC_ARN"
MAX_NODES_PER_HOUR = "MAX_NODES_PER_HOUR"
MAX_FRACTION = "MAX_FRACTION"
HEALTH_CHECKS = "HEALTH_CHECKS"
HEALTH_CHECK_TIMEOUT_SECONDS = "HEALTH_CHECK_TIMEOUT_SECONDS"
REPLACE_MODE = "REPLACE_MODE"
APPROVAL_TTL_SECONDS = "APPROVAL_TTL_SECONDS"
APPROVAL_TIMEOUT_SECONDS = "APPROVAL_TIMEOUT_SECONDS"
DRY_RUN = "DRY_RUN"
STATE_MACHINE_ARN = "STATE_MACHINE_ARN"
ALARM_ACCOUNT_ID = "ALARM_ACCOUNT_ID"
ALARM_NAME_PREFIX = "ALARM_NAME_PREFIX"
# Read by the functions, not set by infra (each has a default or is optional; docs/CONTRACT.md).
TRAINING_NAMESPACE = "TRAINING_NAMESPACE"
SHADOW_HEALTH_CHECK = "SHADOW_HEALTH_CHECK"
"""``true``: shadowed alarms run the deep health check, through the shadow guard (admit)."""
JOB_LABEL = "JOB_LABEL"
"""The pod label that names a pod's training job (default ``names.DEFAULT_JOB_LABEL``)."""
REPORT_STREAMS = "REPORT_STREAMS"
"""How the agent names its report streams (``metrics.REPORT_STREAM_MODES``; default ``job``):
``pod`` makes localize read a job's reports only from its own pods' streams."""
APPROVAL_URL = "APPROVAL_URL"
APPROVAL_REQUESTER_ROLE = "APPROVAL_REQUESTER_ROLE"
"""Set on the approve function only: the name of request_approval's role, whose calls of the
approve URL may settle the canary's approval and nothing else."""
CHECK_MODES = "CHECK_MODES"
AUTO_APPROVE = "AUTO_APPROVE"
AUTO_APPROVE_REQUIRES_SCREEN = "AUTO_APPROVE_REQUIRES_SCREEN"
"""Set on request_approval only (context key ``autoApproveRequiresScreen``, default ``false``):
``true`` lets the auto-approval policy approve only a node whose screen reproduced the fault
(``$.screen.status`` ``reproduced``); any other screen outcome means a person decides."""
CANARY_TIMEOUT_SECONDS = "CANARY_TIMEOUT_SECONDS"
"""Set on the canary function only: how long a run may take (``canaryTimeout``); a run stays open,
and its reports and approval acceptable, that long at most."""
DEFAULT_CANARY_TIMEOUT_SECONDS = 3600
FLOOD_WATCH_FRACTION = "FLOOD_WATCH_FRACTION"
"""Set on the sweeper only (``floodWatchFraction``): the share of an SDC alarm's 500-series
Metrics Insights limit at which the sweeper's flood watch tells the on-call that made-up JobNames
may blind it."""
DEFAULT_FLOOD_WATCH_FRACTION = 0.8
ALARM_PERIOD = "ALARM_PERIOD"
"""Set on the sweeper only (``alarmPeriod``, in seconds): the SDC alarms' period, the buckets in
which the flood watch counts the job series with data at once (default
``metrics.ALARM_PERIOD_SECONDS``)."""
# Set on the screen function only (context keys screenImage, screenNamespace,
# screenDeadlineSeconds): the node screen's Kubernetes Job (lambdas/README.md, "screen").
SCREEN_IMAGE = "SCREEN_IMAGE"
"""The image the screen Job runs ``python -m sdc_agent.screen`` from (the training image); empty
or unset: the screen is not configured, and the Screen step records ``not_configured``."""
SCREEN_NAMESPACE = "SCREEN_NAMESPACE"
"""The namespace the screen Jobs run in (the function's RBAC covers Jobs and pods there only)."""
DEFAULT_SCREEN_NAMESPACE = "sdc-screen"
SCREEN_DEADLINE_SECONDS = "SCREEN_DEADLINE_SECONDS"
"""The Job's ``activeDeadlineSeconds``: how long a screen may take, from its creation, start-up
(scheduling, the image pull) included."""
DEFAULT_SCREEN_DEADLINE_SECONDS = 1800
MIN_SCREEN_DEADLINE_SECONDS = 120
MAX_SCREEN_DEADLINE_SECONDS = 21600
"""The deadline's bounds (2 minutes, 6 hours): the approval waits for the screen."""
SCREEN_GRACE_SECONDS = 120
"""How long past the Job's deadline the Screen step still waits for Kubernetes to end the Job
before it gives up by itself (the workflow's execution timeout allows for it)."""

FUNCTION_ENVIRONMENT: tuple[str, ...] = (
    HYPERPOD_CLUSTER_NAME,
    EKS_CLUSTER_NAME,
    METRIC_NAMESPACE,
    REPORT_LOG_GROUP,
    LOOKBACK_SECONDS,
    LEDGER_TABLE,
    APPROVALS_TABLE,
    TOPIC_ARN,
    MAX_NODES_PER_HOUR,
    MAX_FRACTION,
    HEALTH_CHECKS,
    HEALTH_CHECK_TIMEOUT_SECONDS,
    REPLACE_MODE,
    APPROVAL_TTL_SECONDS,
    APPROVAL_TIMEOUT_SECONDS,
    DRY_RUN,
    STATE_MACHINE_ARN,
    ALARM_ACCOUNT_ID,
    ALARM_NAME_PREFIX,
    CHECK_MODES,
    AUTO_APPROVE,
    TRAINING_NAMESPACE,
    JOB_LABEL,
    SHADOW_HEALTH_CHECK,
    REPORT_STREAMS,
)
"""What infra sets on every function (besides Powertools' own variables below)."""

# Defaults both sides share: infra's when a context key is absent (infra/config.py), the
# functions' when a variable is (a function run outside the stack, as in a unit test).
DEFAULT_LOOKBACK_SECONDS = 600
DEFAULT_MAX_NODES_PER_HOUR = 2
DEFAULT_MAX_FRACTION = 0.05
DEFAULT_HEALTH_CHECK_TIMEOUT_SECONDS = 9000
DEFAULT_APPROVAL_TIMEOUT_SECONDS = 86400
APPROVAL_TTL_MARGIN_SECONDS = 86400
"""APPROVAL_TTL_SECONDS is the approval timeout plus this: a late CLI call finds the record
and says "expired" rather than "not found"."""

# The functions also read these two, which infra never sets: a proxy in front of a private EKS
# endpoint, or a local stand-in of the Kubernetes API (lambdas/README.md, "Cordon/uncordon").
K8S_API_ENDPOINT = "K8S_API_ENDPOINT"
K8S_API_CA_DATA = "K8S_API_CA_DATA"

# --- The agent, in a training job (docs/agent-install.md, "The environment it reads")
SDC_CLUSTER_NAME = "SDC_CLUSTER_NAME"
SDC_JOB_NAME = "SDC_JOB_NAME"
SDC_METRIC_NAMESPACE = "SDC_METRIC_NAMESPACE"
SDC_LOG_GROUP = "SDC_LOG_GROUP"
SDC_SPOOL_DIR = "SDC_SPOOL_DIR"
SDC_SPOOL_MAX_BYTES = "SDC_SPOOL_MAX_BYTES"
SDC_REPORT_STREAM = "SDC_REPORT_STREAM"
"""``job`` (the default: the stream is ``<job>``) or ``pod`` (``<namespace>/<job>/<pod>``, for a
stack deployed with ``agentIdentity: pod-identity``; needs POD_NAMESPACE and POD_NAME)."""
POD_NAMESPACE = "POD_NAMESPACE"
"""The pod's ``metadata.namespace`` (downward API): its report stream's first part."""

AGENT_ENVIRONMENT: tuple[str, ...] = (
    SDC_CLUSTER_NAME,
    SDC_JOB_NAME,
    SDC_METRIC_NAMESPACE,
    SDC_LOG_GROUP,
    SDC_SPOOL_DIR,
    SDC_SPOOL_MAX_BYTES,
    SDC_REPORT_STREAM,
    POD_NAMESPACE,
)
"""What the agent's CloudWatch publisher reads (arguments override each)."""

__all__ = [
    "AGENT_ENVIRONMENT",
    "ALARM_ACCOUNT_ID",
    "ALARM_NAME_PREFIX",
    "ALARM_PERIOD",
    "APPROVALS_TABLE",
    "APPROVAL_REQUESTER_ROLE",
    "APPROVAL_TIMEOUT_SECONDS",
    "APPROVAL_TTL_MARGIN_SECONDS",
    "APPROVAL_TTL_SECONDS",
    "APPROVAL_URL",
    "AUTO_APPROVE",
    "AUTO_APPROVE_REQUIRES_SCREEN",
    "CANARY_TIMEOUT_SECONDS",
    "CHECK_MODES",
    "DEFAULT_APPROVAL_TIMEOUT_SECONDS",
    "DEFAULT_CANARY_TIMEOUT_SECONDS",
    "DEFAULT_FLOOD_WATCH_FRACTION",
    "DEFAULT_HEALTH_CHECK_TIMEOUT_SECONDS",
    "DEFAULT_LOOKBACK_SECONDS",
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_MAX_NODES_PER_HOUR",
    "DEFAULT_SCREEN_DEADLINE_SECONDS",
    "DEFAULT_SCREEN_NAMESPACE",
    "DRY_RUN",
    "EKS_CLUSTER_NAME",
    "FLOOD_WATCH_FRACTION",
    "FUNCTION_ENVIRONMENT",
    "HEALTH_CHECKS",
    "HEALTH_CHECK_TIMEOUT_SECONDS",
    "HYPERPOD_CLUSTER_NAME",
    "JOB_LABEL",
    "K8S_API_CA_DATA",
    "K8S_API_ENDPOINT",
    "LEDGER_TABLE",
    "LOOKBACK_SECONDS",
    "MAX_FRACTION",
    "MAX_NODES_PER_HOUR",
    "MAX_SCREEN_DEADLINE_SECONDS",
    "METRIC_NAMESPACE",
    "MIN_SCREEN_DEADLINE_SECONDS",
    "POD_NAMESPACE",
    "REPLACE_MODE",
    "REPORT_LOG_GROUP",
    "REPORT_STREAMS",
    "SCREEN_DEADLINE_SECONDS",
    "SCREEN_GRACE_SECONDS",
    "SCREEN_IMAGE",
    "SCREEN_NAMESPACE",
    "SDC_CLUSTER_NAME",
    "SDC_JOB_NAME",
    "SDC_LOG_GROUP",
    "SDC_METRIC_NAMESPACE",
    "SDC_REPORT_STREAM",
    "SDC_SPOOL_DIR",
    "SDC_SPOOL_MAX_BYTES",
    "SHADOW_HEALTH_CHECK",
    "STATE_MACHINE_ARN",
    "TOPIC_ARN",
    "TRAINING_NAMESPACE",
]
