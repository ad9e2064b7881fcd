"""The deployment's settings: read once from cdk.json context (environment variables may
override), validated into a frozen dataclass, handed down to the constructs.

Every problem is reported as a `ConfigError` that names the context key (and the environment
variable that can set it), so `npx cdk synth` fails with one line a user can act on. Constructs
never read context themselves: config flows one way, app.py -> SdcConfig -> constructs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sdc_contract import autoapprove, environment, idle_screen, metrics, modes, names

METRIC_NAMES: tuple[str, ...] = metrics.SDC_ALARM_METRICS
"""The agent's alarm metrics (docs/CONTRACT.md, "Agent -> CloudWatch"): one deployed alarm each."""

LIVENESS_METRIC_NAMES: tuple[str, ...] = metrics.SDC_LIVENESS_METRICS
"""Counts the agent publishes per {ClusterName, JobName} while its checks run."""

LOG_RETENTION_DAYS: tuple[int, ...] = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
    3288, 3653,
)  # fmt: skip
"""The retention periods CloudWatch Logs accepts, in days."""

MIN_REPORT_RETENTION_DAYS = 30
"""The shortest retention of the report group: a report is the full evidence of the remediation
it raised (messages and the ledger point to it), so it must outlive that remediation (the
health check, a day's approval by default) and the on-call's look at it afterwards."""

# Name patterns from the service APIs, so a typo fails at synth instead of at 3 a.m.
_HYPERPOD_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker ClusterName
_HYPERPOD_ARN = re.compile(r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{12}:cluster/[a-z0-9]{12}$")
_EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$")  # EKS CreateCluster name
_NAMESPACE = re.compile(r"^[^:][^:]{0,254}$")  # CloudWatch namespace: no colon, 1..255 chars
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SG_ID = re.compile(r"^sg-[0-9a-f]{8,17}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
# EventBridge Scheduler's recurring expressions: rate(value unit), cron(six fields). A one-time
# at(...) is refused: screening idle nodes is a standing duty, not an event.
_RATE = re.compile(r"^rate\((\d+) (minutes?|hours?|days?)\)$")
_CRON = re.compile(r"^cron\((\S+( \S+){5})\)$")
_RATE_UNIT_MINUTES = {"minute": 1, "hour": 60, "day": 1440}
MIN_SCREEN_IDLE_RATE_MINUTES = 5
"""The shortest rate of `screenIdleSchedule`: each run lists every node and pod of the cluster
(a heavy call on a large cluster's API server), and a screen takes tens of minutes, so a run
more often than this would only poll the same Jobs again."""
OFF_WORDS = ("off", "false", "none", "null", "disabled")
"""Values of a schedule key that mean "no schedule" (an environment variable cannot be null)."""
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

SHARED_IDENTITY = "shared"
POD_IDENTITY = "pod-identity"
AGENT_IDENTITIES: tuple[str, ...] = (SHARED_IDENTITY, POD_IDENTITY)
"""The values of `agentIdentity`: how the pods' role tells the training pods apart."""

ENV_PREFIX = "SDC_"
"""Environment variables override context: key `maxNodesPerHour` <- `SDC_MAX_NODES_PER_HOUR`."""


class ConfigError(ValueError):
    """A context key is missing or has an invalid value; the message names the key."""


@dataclass(kw_only=True, frozen=True)
class SdcConfig:
    """Validated deployment settings (cdk.json context keys in parentheses)."""

    hyperpod_cluster_name: str
    """Name of the SageMaker HyperPod cluster to protect (`hyperPodClusterName`)."""
    eks_cluster_name: str
    """Name of the EKS cluster that orchestrates it (`eksClusterName`)."""
    hyperpod_cluster_arn: str | None = None
    """HyperPod cluster ARN; scopes the SageMaker IAM statements to that cluster. HyperPod ARNs
    end in a generated id, not the name, so without it they cover `cluster/*` of this account
    and region (`hyperPodClusterArn`)."""
    namespace: str = metrics.DEFAULT_NAMESPACE
    """CloudWatch namespace the agent publishes to (`namespace`)."""
    alarm_period_seconds: int = metrics.ALARM_PERIOD_SECONDS
    """Alarm period, whole minutes: the SDC alarms are Metrics Insights alarms with one
    contributor per job, which evaluate minutes only (`alarmPeriod`)."""
    alarm_thresholds: Mapping[str, float] = field(
        default_factory=lambda: dict.fromkeys(METRIC_NAMES, 1.0)
    )
    """Alarm fires when a period's Sum reaches this, per metric (`alarmThresholds`)."""
    approval_timeout_seconds: int = environment.DEFAULT_APPROVAL_TIMEOUT_SECONDS
    """How long the workflow waits for a human decision before giving up (`approvalTimeout`)."""
    health_checks: tuple[str, ...] = names.DEFAULT_HEALTH_CHECKS
    """Deep health checks to run on a suspect (`healthChecks`)."""
    health_check_timeout_seconds: int = environment.DEFAULT_HEALTH_CHECK_TIMEOUT_SECONDS
    """Give up waiting for the deep health check after this long (`healthCheckTimeout`)."""
    health_check_poll_seconds: int = 300
    """Interval between health-check polls (`healthCheckPollInterval`)."""
    max_nodes_per_hour: int = environment.DEFAULT_MAX_NODES_PER_HOUR
    """Blast-radius guard: admissions per hour before the circuit opens (`maxNodesPerHour`)."""
    max_fraction: float = environment.DEFAULT_MAX_FRACTION
    """Blast-radius guard: fraction of the cluster in remediation at once (`maxFraction`)."""
    replace_mode: str = "api"
    """`api` (BatchReplaceClusterNodes) or `label` (node-health-status label) (`replaceMode`)."""
    notification_emails: tuple[str, ...] = ()
    """Email addresses subscribed to the notification topic (`notificationEmails`)."""
    dry_run: bool = False
    """Run every step but only log cordon and replace (`dryRun`)."""
    vpc_id: str | None = None
    """VPC for the functions that call a private EKS endpoint (`vpcId`)."""
    subnet_ids: tuple[str, ...] = ()
    """Private subnets (with a route to AWS APIs) for those functions (`subnetIds`)."""
    security_group_ids: tuple[str, ...] = ()
    """Security groups allowed to reach the EKS endpoint; one is created if empty
    (`securityGroupIds`)."""
    liveness_job_name: str | None = None
    """Job whose checks must keep running; enables the liveness alarm (`livenessJobName`)."""
    liveness_window_seconds: int = 1800
    """The liveness alarm fires when no check passed for this long (`livenessWindow`)."""
    log_retention_days: int = 30
    """Retention of the functions' and the workflow's log groups (`logRetentionDays`)."""
    report_retention_days: int = 400
    """Retention of the agent's report group `/sdc/<cluster>`, the evidence behind every alarm
    the ledger records: 400 days keeps a year of it for an annual audit, plus a month to run
    the audit (`reportRetentionDays`)."""
    adopt_report_log_group: bool = False
    """The report group already exists (an agent of an earlier release created it): the stack
    does not create it, and its retention and key are set by the commands of the
    `ReportLogGroupAdoptCommand` output (`adoptReportLogGroup`)."""
    auto_approve: autoapprove.AutoApprovePolicy = field(
        default_factory=autoapprove.AutoApprovePolicy
    )
    """Opt-in approval without a person: `{"onHealthCheckFailed": bool, "minPrecision": 0..1,
    "minEvents": N}`; off by default (`autoApprove`)."""
    auto_approve_requires_screen: bool = False
    """The auto-approval policy approves only a node whose screen reproduced the fault
    (`$.screen.status` `reproduced`); any other screen outcome (clean, inconclusive, failed,
    not configured, skipped) leaves it to a person; off by default (`autoApproveRequiresScreen`)."""
    check_modes: Mapping[str, str] = field(default_factory=dict)
    """Per check x verdict `enforce` or `shadow`: keys `<check>/<verdict>`, `<check>/*` or
    `*`, the most specific wins; unlisted ones are enforced (`checkModes`)."""
    shadow_health_check: bool = False
    """Shadowed alarms also run the deep health check on the (not cordoned) node before they
    are recorded; off by default: the check disrupts what runs on the node (`shadowHealthCheck`)."""
    canary_schedule_seconds: int = 86400
    """How often the live canary runs (an EventBridge Scheduler rate); `off` (0) disables it
    and its alarm (`canarySchedule`)."""
    canary_timeout_seconds: int = environment.DEFAULT_CANARY_TIMEOUT_SECONDS
    """How long a canary run may take; the canary alarm fires when none completed within the
    schedule's period plus this (`canaryTimeout`)."""
    training_namespace: str = "default"
    """The Kubernetes namespace of the guarded jobs' pods: localize trusts a report's pod only
    there (`trainingNamespace`)."""
    job_label: str = names.DEFAULT_JOB_LABEL
    """The pod label naming a pod's training job, whose value the agent's job name follows:
    localize cordons a node only when a pod of the report's job ran there (`jobLabel`)."""
    flood_threshold: int = 50
    """Job data points of one SDC metric in one minute, all jobs together, at which the flood
    alarm pages: a flood of made-up JobNames can keep real jobs out of the SDC alarms
    (`floodThreshold`)."""
    flood_watch_fraction: float = environment.DEFAULT_FLOOD_WATCH_FRACTION
    """The sweeper's flood watch tells the topic when an SDC alarm's recently active job series
    (one per JobName, past three hours) reach this fraction of the 500 series its Metrics
    Insights query returns: made-up JobNames may be keeping real jobs out of ALARM
    (`floodWatchFraction`)."""
    screen_image: str | None = None
    """The image the workflow's Screen step runs ``python -m sdc_agent.screen`` from, as a
    Kubernetes Job on the cordoned suspect node (the training image); unset or empty: the
    screen is not configured, and the step records ``not configured`` (`screenImage`)."""
    screen_namespace: str = environment.DEFAULT_SCREEN_NAMESPACE
    """The Kubernetes namespace of the screen Jobs; the screen function's RBAC covers Jobs and
    pods there only (infra/k8s/screen-rbac.yaml) (`screenNamespace`)."""
    screen_deadline_seconds: int = environment.DEFAULT_SCREEN_DEADLINE_SECONDS
    """The screen Job's activeDeadlineSeconds, start-up (scheduling, the image pull) included;
    the approval waits for it (`screenDeadlineSeconds`)."""
    screen_idle_schedule: str | None = idle_screen.DEFAULT_SCREEN_IDLE_SCHEDULE
    """How often the idle screener runs (an EventBridge Scheduler expression, `rate(...)` or
    `cron(...)`): each run starts screens of idle HyperPod nodes, oldest screen first, and
    collects finished ones. None (`off`, or an explicit null given to `load_config`) turns idle
    screening off; it also exists only where `screenImage` is set (`screenIdleSchedule`)."""
    screen_rescreen_days: int = idle_screen.DEFAULT_SCREEN_RESCREEN_DAYS
    """A node whose last screen is older than this is screened again: defects appear with age
    (`screenRescreenDays`)."""
    screen_idle_max_nodes: int = idle_screen.DEFAULT_SCREEN_IDLE_MAX_NODES
    """At most this many idle-node screens at once in the cluster: each holds all of a node's
    GPUs for up to `screenDeadlineSeconds`, the GPU time idle screening costs
    (`screenIdleMaxNodes`)."""
    agent_identity: str = SHARED_IDENTITY
    """How the training pods' role tells pods apart (`agentIdentity`): `shared` (any pod the
    agent policy is attached to may write any job's report stream: IRSA, or Pod Identity
    without session tags) or `pod-identity` (EKS Pod Identity's session tags scope the policy:
    a pod of TRAINING_NAMESPACE writes only its own stream `<namespace>/<job>/<pod>`, and
    localize reads a job's reports only from its own pods' streams)."""

    def __post_init__(self) -> None:
        if self.screen_image is not None:
            _check(
                names.is_image_reference(self.screen_image),
                "screenImage",
                f"{self.screen_image[:80]!r} is not a container image reference "
                "(registry/repository:tag or @sha256:digest, no spaces, at most 512 characters)",
            )
        _check(
            names.is_label_name(self.screen_namespace),
            "screenNamespace",
            f"{self.screen_namespace!r} is not a Kubernetes namespace name (a DNS-1123 label: "
            "lower-case letters, digits and '-', at most 63)",
        )
        _check(
            environment.MIN_SCREEN_DEADLINE_SECONDS
            <= self.screen_deadline_seconds
            <= environment.MAX_SCREEN_DEADLINE_SECONDS,
            "screenDeadlineSeconds",
            f"{self.screen_deadline_seconds} s is outside "
            f"{environment.MIN_SCREEN_DEADLINE_SECONDS} s .. "
            f"{environment.MAX_SCREEN_DEADLINE_SECONDS} s (the approval waits for the screen)",
        )
        if self.screen_idle_schedule is not None:
            problem = _schedule_problem(self.screen_idle_schedule)
            _check(
                problem is None,
                "screenIdleSchedule",
                f"{self.screen_idle_schedule[:80]!r}: {problem}",
            )
        _check(
            idle_screen.MIN_SCREEN_RESCREEN_DAYS
            <= self.screen_rescreen_days
            <= idle_screen.MAX_SCREEN_RESCREEN_DAYS,
            "screenRescreenDays",
            f"{self.screen_rescreen_days} days is outside "
            f"{idle_screen.MIN_SCREEN_RESCREEN_DAYS} .. {idle_screen.MAX_SCREEN_RESCREEN_DAYS}",
        )
        _check(
            idle_screen.MIN_SCREEN_IDLE_MAX_NODES
            <= self.screen_idle_max_nodes
            <= idle_screen.MAX_SCREEN_IDLE_MAX_NODES,
            "screenIdleMaxNodes",
            f"{self.screen_idle_max_nodes} nodes is outside "
            f"{idle_screen.MIN_SCREEN_IDLE_MAX_NODES} .. {idle_screen.MAX_SCREEN_IDLE_MAX_NODES} "
            "(each screen holds all of a node's GPUs for up to screenDeadlineSeconds)",
        )
        _check(
            names.is_label_key(self.job_label),
            "jobLabel",
            f"{self.job_label!r} is not a Kubernetes label key ([prefix/]name)",
        )
        _check(
            self.flood_threshold >= 2,
            "floodThreshold",
            f"{self.flood_threshold}: at least 2 (one real finding gives one data point)",
        )
        _check(
            0 < self.flood_watch_fraction <= 1,
            "floodWatchFraction",
            f"{self.flood_watch_fraction} is outside (0, 1] (a share of the 500 series an SDC "
            "alarm's Metrics Insights query returns)",
        )
        _check(
            self.agent_identity in AGENT_IDENTITIES,
            "agentIdentity",
            f"{self.agent_identity!r}; expected one of {list(AGENT_IDENTITIES)} (pod-identity: "
            "EKS Pod Identity with its session tags; shared: IRSA or one role for every pod)",
        )
        _check(
            names.is_label_name(self.training_namespace),
            "trainingNamespace",
            f"{self.training_namespace!r} is not a Kubernetes namespace name (a DNS-1123 label: "
            "lower-case letters, digits and '-', at most 63)",
        )
        _check(
            bool(_HYPERPOD_NAME.match(self.hyperpod_cluster_name)),
            "hyperPodClusterName",
            f"{self.hyperpod_cluster_name!r} is not a valid HyperPod cluster name (letters, digits, hyphens; at most 63)",
        )
        _check(
            bool(_EKS_NAME.match(self.eks_cluster_name)),
            "eksClusterName",
            f"{self.eks_cluster_name!r} is not a valid EKS cluster name",
        )
        if self.hyperpod_cluster_arn is not None:
            _check(
                bool(_HYPERPOD_ARN.match(self.hyperpod_cluster_arn)),
                "hyperPodClusterArn",
                f"{self.hyperpod_cluster_arn!r} is not a HyperPod cluster ARN (arn:aws:sagemaker:REGION:ACCOUNT:cluster/ID)",
            )
        _check(
            bool(_NAMESPACE.match(self.namespace)),
            "namespace",
            "must be 1-255 characters without ':'",
        )
        _check(
            0 < self.alarm_period_seconds <= 3 * 3600 and self.alarm_period_seconds % 60 == 0,
            "alarmPeriod",
            f"{self.alarm_period_seconds} s: whole minutes up to 3 hours (the SDC alarms are "
            "Metrics Insights alarms, one contributor per job, which evaluate minutes only; "
            "10 s and 30 s are no longer possible)",
        )
        unknown = set(self.alarm_thresholds) - set(METRIC_NAMES)
        _check(
            not unknown,
            "alarmThresholds",
            f"unknown metric(s) {sorted(unknown)}; expected {list(METRIC_NAMES)}",
        )
        missing = set(METRIC_NAMES) - set(self.alarm_thresholds)
        _check(not missing, "alarmThresholds", f"missing metric(s) {sorted(missing)}")
        for metric, threshold in self.alarm_thresholds.items():
            _check(
                threshold > 0,
                "alarmThresholds",
                f"{metric}: threshold must be > 0, got {threshold}",
            )
        # Step Functions caps a task's timeout at the execution's one-year limit; less than a
        # minute would expire before anyone could read the notification.
        _check(
            60 <= self.approval_timeout_seconds <= 365 * 86400,
            "approvalTimeout",
            f"{self.approval_timeout_seconds} s is outside 1 minute .. 365 days",
        )
        _check(bool(self.health_checks), "healthChecks", "needs at least one check")
        bad_checks = set(self.health_checks) - set(names.HEALTH_CHECK_TYPES)
        _check(
            not bad_checks,
            "healthChecks",
            f"unknown check(s) {sorted(bad_checks)}; expected some of "
            f"{sorted(names.HEALTH_CHECK_TYPES)}",
        )
        _check(
            self.health_check_timeout_seconds >= 60,
            "healthCheckTimeout",
            "must be at least 60 seconds",
        )
        _check(
            1 <= self.health_check_poll_seconds <= self.health_check_timeout_seconds,
            "healthCheckPollInterval",
            "must be between 1 second and healthCheckTimeout",
        )
        _check(self.max_nodes_per_hour >= 1, "maxNodesPerHour", "must be at least 1")
        _check(0 < self.max_fraction <= 1, "maxFraction", f"{self.max_fraction} is outside (0, 1]")
        _check(
            self.replace_mode in names.REPLACE_MODES,
            "replaceMode",
            f"{self.replace_mode!r}; expected one of {sorted(names.REPLACE_MODES)}",
        )
        for email in self.notification_emails:
            _check(
                bool(_EMAIL.match(email)),
                "notificationEmails",
                f"{email!r} is not an email address",
            )
        if self.vpc_id is not None:
            _check(bool(_VPC_ID.match(self.vpc_id)), "vpcId", f"{self.vpc_id!r} is not a VPC id")
            _check(bool(self.subnet_ids), "subnetIds", "is required when vpcId is set")
        else:
            _check(not self.subnet_ids, "vpcId", "is required when subnetIds is set")
            _check(not self.security_group_ids, "vpcId", "is required when securityGroupIds is set")
        for subnet in self.subnet_ids:
            _check(bool(_SUBNET_ID.match(subnet)), "subnetIds", f"{subnet!r} is not a subnet id")
        for group in self.security_group_ids:
            _check(
                bool(_SG_ID.match(group)),
                "securityGroupIds",
                f"{group!r} is not a security group id",
            )
        _check(
            300 <= self.liveness_window_seconds <= 86400 and self.liveness_window_seconds % 60 == 0,
            "livenessWindow",
            "must be whole minutes between 5 minutes and 1 day (it is the alarm's period)",
        )
        _check(
            self.log_retention_days in LOG_RETENTION_DAYS,
            "logRetentionDays",
            f"{self.log_retention_days}: CloudWatch Logs accepts {list(LOG_RETENTION_DAYS)}",
        )
        _check(
            self.report_retention_days in LOG_RETENTION_DAYS
            and self.report_retention_days >= MIN_REPORT_RETENTION_DAYS,
            "reportRetentionDays",
            f"{self.report_retention_days}: CloudWatch Logs accepts {list(LOG_RETENTION_DAYS)}; "
            f"at least {MIN_REPORT_RETENTION_DAYS} (the reports are the evidence every "
            "remediation's messages and ledger entries point to)",
        )

        if self.canary_schedule_seconds != 0:
            _check(
                3600 <= self.canary_schedule_seconds <= 6 * 86400
                and self.canary_schedule_seconds % 60 == 0,
                "canarySchedule",
                f"{self.canary_schedule_seconds} s: whole minutes between 1 hour and 6 days, or "
                "'off'",
            )
        _check(
            300 <= self.canary_timeout_seconds <= 86400 and self.canary_timeout_seconds % 60 == 0,
            "canaryTimeout",
            f"{self.canary_timeout_seconds} s: whole minutes between 5 minutes and 1 day",
        )

    @property
    def canary_enabled(self) -> bool:
        """Whether the live canary (schedule, function, alarms) is deployed."""
        return self.canary_schedule_seconds != 0

    @property
    def idle_screen_enabled(self) -> bool:
        """Whether the idle screener (function, schedule, alarm, RBAC) is deployed: it runs the
        node screen, so it needs `screenImage`, and a schedule (`screenIdleSchedule` not off)."""
        return self.screen_image is not None and self.screen_idle_schedule is not None

    @property
    def canary_window_seconds(self) -> int:
        """The canary alarm's period: one schedule period plus the time a run may take (at most
        7 days, CloudWatch's limit for an alarm's evaluation range)."""
        return self.canary_schedule_seconds + self.canary_timeout_seconds

    @property
    def report_streams(self) -> str:
        """How the agent names its report streams (``sdc_contract.metrics.REPORT_STREAM_MODES``):
        by the writing pod under Pod Identity, else by the job."""
        if self.agent_identity == POD_IDENTITY:
            return metrics.REPORT_STREAM_POD
        return metrics.REPORT_STREAM_JOB

    @property
    def pod_identity_namespace(self) -> str | None:
        """The Kubernetes namespace the agent's grants are scoped to by EKS Pod Identity's
        session tags (``agentIdentity: pod-identity``), else None."""
        return self.training_namespace if self.agent_identity == POD_IDENTITY else None

    @property
    def resource_prefix(self) -> str:
        """Prefix of the physical names this stack sets (alarms, state machine)."""
        return f"sdc-guard-{self.hyperpod_cluster_name}"

    @property
    def report_log_group(self) -> str:
        """Log group where the agent writes its reports (docs/CONTRACT.md)."""
        return metrics.report_log_group(self.hyperpod_cluster_name)

    @property
    def approval_ttl_seconds(self) -> int:
        """Approval records outlive the task token by a day, so a late CLI call finds the
        record and says "expired" instead of "not found"."""
        return self.approval_timeout_seconds + environment.APPROVAL_TTL_MARGIN_SECONDS

    @property
    def check_modes_json(self) -> str:
        """`checkModes` as the functions read it (CHECK_MODES), keys sorted."""
        return json.dumps(dict(self.check_modes), sort_keys=True, separators=(",", ":"))

    @property
    def uses_vpc(self) -> bool:
        """Whether the Kubernetes-facing functions run inside the configured VPC."""
        return self.vpc_id is not None


def _check(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"context key {key!r} ({env_name(key)}): {problem}")


def env_name(key: str) -> str:
    """Environment variable that overrides context `key` (camelCase -> SDC_UPPER_SNAKE)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).upper()
    return ENV_PREFIX + snake


# ---- parsing raw context values --------------------------------------------------------------


def _as_str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a non-empty string, got {value!r}"
        )
    return value.strip()


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected an integer, got {value!r}"
        )
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected an integer, got {value!r}"
        ) from None


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a number, got {value!r}"
        )
    try:
        return float(str(value).strip())
    except ValueError:
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a number, got {value!r}"
        ) from None


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigError(
        f"context key {key!r} ({env_name(key)}): expected true or false, got {value!r}"
    )


def _as_duration(key: str, value: Any) -> int:
    """Seconds from an integer or a string with a unit: 600, "600s", "10m", "24h", "7d"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected seconds or a duration like '10m', '24h', got {value!r}"
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _as_list(key: str, value: Any) -> tuple[str, ...]:
    """A JSON list, or a comma-separated string (what an environment variable can hold)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"context key {key!r} ({env_name(key)}): invalid JSON list: {exc}"
                ) from None
        else:
            return tuple(part.strip() for part in text.split(",") if part.strip())
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a list of strings, got {value!r}"
        )
    return tuple(item.strip() for item in value if item.strip())


def _as_thresholds(key: str, value: Any) -> dict[str, float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"context key {key!r} ({env_name(key)}): invalid JSON object: {exc}"
            ) from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dict.fromkeys(METRIC_NAMES, float(value))
    if not isinstance(value, dict):
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a number or an object per metric, got {value!r}"
        )
    # Metrics left out keep the default threshold of 1.
    merged = dict.fromkeys(METRIC_NAMES, 1.0)
    merged.update({str(k): _as_float(f"{key}.{k}", v) for k, v in value.items()})
    return merged


def _as_modes(key: str, value: Any) -> dict[str, str]:
    """The per check x verdict modes (an object, or its JSON text from the environment)."""
    try:
        return dict(modes.parse_modes(value))
    except ValueError as exc:
        raise ConfigError(f"context key {key!r} ({env_name(key)}): {exc}") from None


def _as_policy(key: str, value: Any) -> autoapprove.AutoApprovePolicy:
    """The auto-approval policy (an object, or its JSON text from the environment)."""
    try:
        return autoapprove.parse_policy(value)
    except ValueError as exc:
        raise ConfigError(f"context key {key!r} ({env_name(key)}): {exc}") from None


def _as_schedule(key: str, value: Any) -> int:
    """A duration, or `off` (also false/none/disabled: 0) for no schedule."""
    if value is False or str(value).strip().lower() in ("off", "false", "none", "disabled"):
        return 0
    return _as_duration(key, value)


def _schedule_problem(expression: str) -> str | None:
    """What is wrong with a `screenIdleSchedule` expression, or None when it is fine."""
    rate = _RATE.match(expression)
    if rate is not None:
        value, unit = int(rate.group(1)), rate.group(2)
        if value < 1:
            return "a rate's value is a positive integer"
        # Scheduler, like EventBridge, wants the singular unit for 1 and the plural otherwise.
        singular = unit.rstrip("s")
        expected = singular if value == 1 else f"{singular}s"
        if unit != expected:
            return f"write rate({value} {expected})"
        minutes = value * _RATE_UNIT_MINUTES[singular]
        if minutes < MIN_SCREEN_IDLE_RATE_MINUTES:
            return (
                f"at most one run every {MIN_SCREEN_IDLE_RATE_MINUTES} minutes (each run lists "
                "every node and pod of the cluster; a screen takes tens of minutes)"
            )
        return None
    if _CRON.match(expression) is not None:
        return None
    if expression.startswith("at("):
        return "a one-time at(...) schedule would screen once; use rate(...) or cron(...)"
    return (
        "expected an EventBridge Scheduler expression, 'rate(30 minutes)' or 'cron(0 3 * * ? *)' "
        "(six fields), or 'off'"
    )


def _as_schedule_expression(key: str, value: Any) -> str | None:
    """A recurring schedule expression (checked by `SdcConfig`), or None for off (null, false or
    one of OFF_WORDS)."""
    if value is None or value is False:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"context key {key!r} ({env_name(key)}): expected a schedule expression such as "
            f"'rate(30 minutes)', or 'off', got {value!r}"
        )
    text = value.strip()
    return None if text.lower() in OFF_WORDS else text


def _optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def parse_optional(key: str, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return parse(key, value)

    return parse_optional


# context key -> (dataclass field, parser); the single table of what a user can set.
KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "hyperPodClusterName": ("hyperpod_cluster_name", _as_str),
    "eksClusterName": ("eks_cluster_name", _as_str),
    "hyperPodClusterArn": ("hyperpod_cluster_arn", _optional(_as_str)),
    "namespace": ("namespace", _as_str),
    "alarmPeriod": ("alarm_period_seconds", _as_duration),
    "alarmThresholds": ("alarm_thresholds", _as_thresholds),
    "approvalTimeout": ("approval_timeout_seconds", _as_duration),
    "healthChecks": ("health_checks", _as_list),
    "healthCheckTimeout": ("health_check_timeout_seconds", _as_duration),
    "healthCheckPollInterval": ("health_check_poll_seconds", _as_duration),
    "maxNodesPerHour": ("max_nodes_per_hour", _as_int),
    "maxFraction": ("max_fraction", _as_float),
    "replaceMode": ("replace_mode", _as_str),
    "notificationEmails": ("notification_emails", _as_list),
    "dryRun": ("dry_run", _as_bool),
    "vpcId": ("vpc_id", _optional(_as_str)),
    "subnetIds": ("subnet_ids", _as_list),
    "securityGroupIds": ("security_group_ids", _as_list),
    "livenessJobName": ("liveness_job_name", _optional(_as_str)),
    "livenessWindow": ("liveness_window_seconds", _as_duration),
    "logRetentionDays": ("log_retention_days", _as_int),
    "reportRetentionDays": ("report_retention_days", _as_int),
    "adoptReportLogGroup": ("adopt_report_log_group", _as_bool),
    "checkModes": ("check_modes", _as_modes),
    "autoApprove": ("auto_approve", _as_policy),
    "autoApproveRequiresScreen": ("auto_approve_requires_screen", _as_bool),
    "shadowHealthCheck": ("shadow_health_check", _as_bool),
    "canarySchedule": ("canary_schedule_seconds", _as_schedule),
    "canaryTimeout": ("canary_timeout_seconds", _as_duration),
    "trainingNamespace": ("training_namespace", _as_str),
    "jobLabel": ("job_label", _as_str),
    "agentIdentity": ("agent_identity", _as_str),
    "floodThreshold": ("flood_threshold", _as_int),
    "floodWatchFraction": ("flood_watch_fraction", _as_float),
    "screenImage": ("screen_image", _optional(_as_str)),
    "screenNamespace": ("screen_namespace", _as_str),
    "screenDeadlineSeconds": ("screen_deadline_seconds", _as_duration),
    "screenIdleSchedule": ("screen_idle_schedule", _as_schedule_expression),
    "screenRescreenDays": ("screen_rescreen_days", _as_int),
    "screenIdleMaxNodes": ("screen_idle_max_nodes", _as_int),
}
REQUIRED_KEYS: tuple[str, ...] = ("hyperPodClusterName", "eksClusterName")
OFF_KEYS: tuple[str, ...] = ("screenIdleSchedule",)
"""Keys whose parsed None means "off", not "the default": an explicit null or `off` is kept.
(CDK itself drops a context value of null before the app sees it, so cdk.json and `-c` write
`off`; a null reaches this loader only from a caller that passes one.)"""

assert {f for f, _ in KEYS.values()} == {f.name for f in fields(SdcConfig)}, "KEYS out of sync"


def load_config(context: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> SdcConfig:
    """Validate the CDK context (and `SDC_*` environment overrides) into an `SdcConfig`.

    `context` holds the raw values (cdk.json "context" plus `-c key=value`); a key missing from
    both context and environment keeps the dataclass default. Raises `ConfigError` naming the
    first missing or invalid key.
    """
    environ = {} if environ is None else environ
    values: dict[str, Any] = {}
    for key, (attr, parse) in KEYS.items():
        raw = environ.get(env_name(key))
        if raw is None:
            raw = context.get(key)
        if raw is None and key in OFF_KEYS and key in context:
            values[attr] = None  # an explicit null: off
            continue
        if raw is None:
            if key in REQUIRED_KEYS:
                raise ConfigError(
                    f"context key {key!r} ({env_name(key)}) is required: set it in cdk.json, "
                    f"with `npx cdk deploy -c {key}=...`, or in the environment"
                )
            continue
        parsed = parse(key, raw)
        if parsed is not None or key in OFF_KEYS:
            values[attr] = parsed
    return SdcConfig(**values)
