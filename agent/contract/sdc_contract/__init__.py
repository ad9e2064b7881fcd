"""sdc_contract: the names and rules that cross between sdc-guard's parts, defined once.

The agent (in the training job), the remediation Lambdas, infra (the CDK app) and the operator
CLI all import this package; nothing else keeps a copy of what it defines. Standard library
only, Python 3.10+ (the agent's floor). How it ships: in the agent's wheel (``pip install
./agent``), alone for deploying and the CLI (``pip install -e ./agent/contract``, listed in
requirements.txt), and copied into the Lambda code asset by ``infra/bundling.py``
(docs/CONTRACT.md, "How the contract ships").

Modules, by what they fix:

- ``report``: the ``sdc.alarm/v1`` report (schemas, keys), check names, verdict names and how a
  verdict outside the list is read (``verdict_name`` -> ``unknown``).
- ``metrics``: metric names, their series (dimensions), the report log group, the functions'
  own Powertools service and namespace.
- ``environment``: environment variable names (the functions', the agent's).
- ``names``: Kubernetes names, HyperPod node names, instance ids, health-check types, replace
  modes: validated the same way by infra, the functions and localize.
- ``modes``: per check x verdict ``enforce`` / ``shadow`` (``checkModes`` / ``CHECK_MODES``).
- ``autoapprove``: the auto-approval policy's shape (``autoApprove`` / ``AUTO_APPROVE``).
- ``resume``: where a job may resume after an alarm (the agent's alarm log and every message of
  the pipeline state the same rule).
- ``canary``: the live canary's reserved job, node and metric names.

The constants are also importable from the package itself (``sdc_contract.CANARY_JOB``).
"""

from __future__ import annotations

from .canary import (
    CANARY_ALARM_SUFFIX,
    CANARY_COMPLETED_METRIC,
    CANARY_INSTANCE_GROUP,
    CANARY_INSTANCE_ID,
    CANARY_JOB,
    CANARY_METRIC,
    CANARY_NODE_NAME,
)
from .environment import (
    AGENT_ENVIRONMENT,
    ALARM_ACCOUNT_ID,
    ALARM_NAME_PREFIX,
    APPROVAL_TIMEOUT_SECONDS,
    APPROVAL_TTL_SECONDS,
    APPROVAL_URL,
    APPROVALS_TABLE,
    APPROVE_FUNCTION,
    AUTO_APPROVE,
    CHECK_MODES,
    DRY_RUN,
    EKS_CLUSTER_NAME,
    FUNCTION_ENVIRONMENT,
    HEALTH_CHECK_TIMEOUT_SECONDS,
    HEALTH_CHECKS,
    HYPERPOD_CLUSTER_NAME,
    K8S_API_CA_DATA,
    K8S_API_ENDPOINT,
    LEDGER_TABLE,
    LOOKBACK_SECONDS,
    MAX_FRACTION,
    MAX_NODES_PER_HOUR,
    METRIC_NAMESPACE,
    REPLACE_MODE,
    REPORT_LOG_GROUP,
    SDC_CLUSTER_NAME,
    SDC_JOB_NAME,
    SDC_LOG_GROUP,
    SDC_METRIC_NAMESPACE,
    SDC_SPOOL_DIR,
    SDC_SPOOL_MAX_BYTES,
    STATE_MACHINE_ARN,
    TOPIC_ARN,
    TRAINING_NAMESPACE,
)
from .metrics import (
    AUDIT_PASS_METRIC,
    CHECK_DIMENSION,
    CLUSTER_DIMENSION,
    CLUSTER_SERIES,
    DEFAULT_NAMESPACE,
    DIVERGENT_TENSORS_METRIC,
    JOB_DIMENSION,
    JOB_SERIES,
    NODE_DIMENSION,
    NODE_SERIES,
    NONFINITE_GRAD_METRIC,
    OUTCOME_DIMENSIONS,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_SERVICE_NAME,
    REPLAY_MISMATCH_METRIC,
    SDC_ALARM_METRICS,
    SDC_LIVENESS_METRICS,
    UNCONFIRMED_SENSOR_FLAGS_METRIC,
    VERDICT_DIMENSION,
    WEIGHT_CHECK_PASS_METRIC,
    report_log_group,
)
from .report import (
    ALARM_RECORD_SCHEMA,
    ALARM_SCHEMA,
    CHECKS,
    NAMING_REASONS,
    RANKMAP_SCHEMA,
    SUSPECT_VERDICTS,
    UNKNOWN_VERDICT,
    VERDICT_KINDS,
    Check,
    NamingReason,
    SuspectVerdict,
    VerdictKind,
    verdict_name,
)

__all__ = [
    "AGENT_ENVIRONMENT",
    "ALARM_ACCOUNT_ID",
    "ALARM_NAME_PREFIX",
    "ALARM_RECORD_SCHEMA",
    "ALARM_SCHEMA",
    "APPROVALS_TABLE",
    "APPROVAL_TIMEOUT_SECONDS",
    "APPROVAL_TTL_SECONDS",
    "APPROVAL_URL",
    "APPROVE_FUNCTION",
    "AUDIT_PASS_METRIC",
    "AUTO_APPROVE",
    "CANARY_ALARM_SUFFIX",
    "CANARY_COMPLETED_METRIC",
    "CANARY_INSTANCE_GROUP",
    "CANARY_INSTANCE_ID",
    "CANARY_JOB",
    "CANARY_METRIC",
    "CANARY_NODE_NAME",
    "CHECKS",
    "CHECK_DIMENSION",
    "CHECK_MODES",
    "CLUSTER_DIMENSION",
    "CLUSTER_SERIES",
    "DEFAULT_NAMESPACE",
    "DIVERGENT_TENSORS_METRIC",
    "DRY_RUN",
    "EKS_CLUSTER_NAME",
    "FUNCTION_ENVIRONMENT",
    "HEALTH_CHECKS",
    "HEALTH_CHECK_TIMEOUT_SECONDS",
    "HYPERPOD_CLUSTER_NAME",
    "JOB_DIMENSION",
    "JOB_SERIES",
    "K8S_API_CA_DATA",
    "K8S_API_ENDPOINT",
    "LEDGER_TABLE",
    "LOOKBACK_SECONDS",
    "MAX_FRACTION",
    "MAX_NODES_PER_HOUR",
    "METRIC_NAMESPACE",
    "NAMING_REASONS",
    "NODE_DIMENSION",
    "NODE_SERIES",
    "NONFINITE_GRAD_METRIC",
    "OUTCOME_DIMENSIONS",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_SERVICE_NAME",
    "RANKMAP_SCHEMA",
    "REPLACE_MODE",
    "REPLAY_MISMATCH_METRIC",
    "REPORT_LOG_GROUP",
    "SDC_ALARM_METRICS",
    "SDC_CLUSTER_NAME",
    "SDC_JOB_NAME",
    "SDC_LIVENESS_METRICS",
    "SDC_LOG_GROUP",
    "SDC_METRIC_NAMESPACE",
    "SDC_SPOOL_DIR",
    "SDC_SPOOL_MAX_BYTES",
    "STATE_MACHINE_ARN",
    "SUSPECT_VERDICTS",
    "TOPIC_ARN",
    "TRAINING_NAMESPACE",
    "UNCONFIRMED_SENSOR_FLAGS_METRIC",
    "UNKNOWN_VERDICT",
    "VERDICT_DIMENSION",
    "VERDICT_KINDS",
    "WEIGHT_CHECK_PASS_METRIC",
    "Check",
    "NamingReason",
    "SuspectVerdict",
    "VerdictKind",
    "report_log_group",
    "verdict_name",
]
