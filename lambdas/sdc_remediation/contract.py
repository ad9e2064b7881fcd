"""The names that cross between the CDK app (infra/) and the functions: one list both import.

Environment variable names the functions read and infra sets, the agent's metric names that
infra alarms on and localize reads, and the Powertools service/namespace of the functions'
metrics. Plain constants, no imports: infra imports this module without the Lambda runtime's
dependencies. docs/CONTRACT.md describes what each one means.
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
APPROVAL_URL = "APPROVAL_URL"
CHECK_MODES = "CHECK_MODES"
AUTO_APPROVE = "AUTO_APPROVE"
APPROVE_FUNCTION = "APPROVE_FUNCTION"
"""Set on request_approval only, when the canary is on: the approve function it invokes to settle
the canary's approval (docs/deploy.md, "The canary")."""

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
)
"""What infra sets on every function (besides Powertools' own variables below)."""

# --- Powertools: the functions' own metrics (EMF) and logs
POWERTOOLS_SERVICE_NAME = "sdc-remediation"
POWERTOOLS_METRICS_NAMESPACE = "SDCRemediation"

# --- The agent's metrics (docs/CONTRACT.md, "Agent -> CloudWatch")
SDC_ALARM_METRICS: tuple[str, ...] = (
    "sdc_nonfinite_grad",
    "sdc_replay_mismatch",
    "sdc_divergent_tensors",
)
"""One deployed alarm each; localize reads their per-node series."""
SDC_LIVENESS_METRICS: tuple[str, ...] = ("sdc_audit_pass", "sdc_weight_check_pass")
"""Counts the agent publishes per {ClusterName, JobName} while its checks run."""

# --- The live canary (docs/deploy.md, "The canary"): a reserved job and node that no training
# job can be. The instance id is a well-formed EC2 id of all-zero digits and "c0de", which EC2
# does not hand out to this account's HyperPod cluster; localize refuses a canary report naming
# any other node and a training report naming this one, so a canary can never touch a real node.
CANARY_JOB = "sdc-canary"
CANARY_INSTANCE_ID = "i-0000000000000c0de"
CANARY_NODE_NAME = f"hyperpod-{CANARY_INSTANCE_ID}"
CANARY_INSTANCE_GROUP = "sdc-canary"
CANARY_METRIC = "sdc_replay_mismatch"
"""The SDC metric the canary publishes (on its own {ClusterName, JobName} series)."""
CANARY_ALARM_SUFFIX = f"canary-{CANARY_METRIC}"
"""The canary's SDC alarm is named ALARM_NAME_PREFIX + this (infra/constructs/canary.py)."""
CANARY_COMPLETED_METRIC = "canary_completed"
"""Put (namespace POWERTOOLS_METRICS_NAMESPACE, dimension ClusterName) when a canary closes;
the canary alarm fires when none arrived in its window."""
