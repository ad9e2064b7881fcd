"""Settings from the environment, read lazily and validated with errors that name the variable.

Nothing is read at import time: a Lambda's handler module imports this package during its init
phase, and tests set the environment per test. Each property reads its variable when first used,
so a function that never cordons does not need the Kubernetes settings. See docs/CONTRACT.md
("Lambdas: environment") for the list the CDK app sets.

A host that runs several functions in one process (the local pipeline of tests/e2e) gives each
invocation its own variables with :func:`environment` instead of writing ``os.environ``: the
process environment is shared by every thread, and botocore iterates it while building clients.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import urllib.parse
from collections import ChainMap
from collections.abc import Iterator, Mapping
from typing import Literal

import sdc_contract as contract
from sdc_contract.autoapprove import AutoApprovePolicy, parse_policy
from sdc_contract.environment import (
    APPROVAL_TTL_MARGIN_SECONDS,
    AUTO_APPROVE_REQUIRES_SCREEN,
    DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    DEFAULT_FLOOD_WATCH_FRACTION,
    DEFAULT_HEALTH_CHECK_TIMEOUT_SECONDS,
    DEFAULT_LOOKBACK_SECONDS,
    DEFAULT_MAX_FRACTION,
    DEFAULT_MAX_NODES_PER_HOUR,
    FLOOD_WATCH_FRACTION,
    MAX_SCREEN_DEADLINE_SECONDS,
    MIN_SCREEN_DEADLINE_SECONDS,
    SCREEN_DEADLINE_SECONDS,
    SCREEN_IMAGE,
    SCREEN_NAMESPACE,
)
from sdc_contract.metrics import DEFAULT_NAMESPACE, report_log_group
from sdc_contract.modes import Mode, mode_for, parse_modes
from sdc_contract.names import (
    DEFAULT_HEALTH_CHECKS,
    DEFAULT_JOB_LABEL,
    HEALTH_CHECK_TYPES,
    REPLACE_MODES,
    is_image_reference,
    is_label_key,
    is_label_name,
)

from .errors import ConfigurationError

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no", ""}
# IAM role names: alphanumerics and +=,.@_- (no path, no ARN).
_ROLE_NAME = re.compile(r"[\w+=,.@-]+", re.ASCII)

# Variables of the invocation running in this context, read before os.environ. A ContextVar is
# per thread (and per asyncio task), so concurrent invocations never see each other's.
_INVOCATION_ENV: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "sdc_remediation_invocation_env", default=None
)


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Within the block, :class:`Settings` read ``variables`` before ``os.environ``, in this
    thread (or task) only; nested blocks layer over the outer one. ``os.environ`` is untouched.
    """
    outer = _INVOCATION_ENV.get()
    token = _INVOCATION_ENV.set(dict(variables) if outer is None else {**outer, **variables})
    try:
        yield
    finally:
        _INVOCATION_ENV.reset(token)


class Settings:
    """Typed, validated view of the remediation environment variables.

    Every property raises ``ConfigurationError`` naming the variable when it is missing or invalid.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` replaces the environment; by default the variables of the enclosing
        :func:`environment` block, then ``os.environ`` (read when a property is used)."""
        if environ is None:
            invocation = _INVOCATION_ENV.get()
            environ = os.environ if invocation is None else ChainMap(dict(invocation), os.environ)
        self._env = environ

    # -- helpers ------------------------------------------------------------------------------

    def _required(self, name: str) -> str:
        value = self._env.get(name, "").strip()
        if not value:
            raise ConfigurationError(f"environment variable {name} is required but not set")
        return value

    def _optional(self, name: str) -> str | None:
        value = self._env.get(name, "").strip()
        return value or None

    def _int(self, name: str, default: int, minimum: int = 1) -> int:
        raw = self._optional(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigurationError(f"{name} must be >= {minimum}, got {value}")
        return value

    # -- cluster ------------------------------------------------------------------------------

    @property
    def hyperpod_cluster_name(self) -> str:
        """HYPERPOD_CLUSTER_NAME: the HyperPod cluster (name or ARN) this workflow guards."""
        return self._required(contract.HYPERPOD_CLUSTER_NAME)

    @property
    def eks_cluster_name(self) -> str:
        """EKS_CLUSTER_NAME: the EKS cluster that orchestrates it (token audience, endpoint)."""
        return self._required(contract.EKS_CLUSTER_NAME)

    @property
    def k8s_api_endpoint(self) -> str | None:
        """K8S_API_ENDPOINT: overrides the endpoint eks:DescribeCluster returns (optional)."""
        value = self._optional(contract.K8S_API_ENDPOINT)
        if value is not None and not value.startswith("https://"):
            raise ConfigurationError(f"K8S_API_ENDPOINT must be an https:// URL, got {value!r}")
        return value

    @property
    def k8s_api_ca_data(self) -> str | None:
        """K8S_API_CA_DATA: base64 PEM CA bundle overriding eks:DescribeCluster's (optional)."""
        return self._optional(contract.K8S_API_CA_DATA)

    # -- localize -----------------------------------------------------------------------------

    @property
    def metric_namespace(self) -> str:
        """METRIC_NAMESPACE: the agent's CloudWatch namespace (default SDC)."""
        return self._optional(contract.METRIC_NAMESPACE) or DEFAULT_NAMESPACE

    @property
    def report_log_group(self) -> str:
        """REPORT_LOG_GROUP: where the agent writes reports (default /sdc/<HyperPod cluster>)."""
        return self._optional(contract.REPORT_LOG_GROUP) or report_log_group(
            self.hyperpod_cluster_name
        )

    @property
    def lookback_seconds(self) -> int:
        """LOOKBACK_SECONDS: how far before the alarm to look for series and reports (600)."""
        return self._int(contract.LOOKBACK_SECONDS, DEFAULT_LOOKBACK_SECONDS, minimum=10)

    @property
    def alarm_account_id(self) -> str:
        """ALARM_ACCOUNT_ID: the account whose alarm events localize accepts (this stack's)."""
        value = self._required(contract.ALARM_ACCOUNT_ID)
        if not (len(value) == 12 and value.isdigit()):
            raise ConfigurationError(
                f"ALARM_ACCOUNT_ID must be a 12-digit account id, got {value!r}"
            )
        return value

    @property
    def alarm_name_prefix(self) -> str:
        """ALARM_NAME_PREFIX: localize accepts only alarms whose name starts with it (this
        stack's SDC alarms are named ``<prefix><metric>``)."""
        return self._required(contract.ALARM_NAME_PREFIX)

    @property
    def training_namespace(self) -> str:
        """TRAINING_NAMESPACE: the Kubernetes namespace of the guarded training jobs' pods; a
        report's pod is looked up there only (default ``default``)."""
        value = self._optional(contract.TRAINING_NAMESPACE) or "default"
        if not is_label_name(value):
            raise ConfigurationError(
                f"TRAINING_NAMESPACE must be a Kubernetes namespace name, got {value!r}"
            )
        return value

    @property
    def report_streams(self) -> str:
        """REPORT_STREAMS: how the agent names its report streams (default ``job``: ``<job>``);
        ``pod`` (a stack deployed with ``agentIdentity: pod-identity``): each pod writes its own
        ``<namespace>/<job>/<pod>``, and localize reads a job's reports from its pods' only."""
        value = self._optional(contract.REPORT_STREAMS) or contract.REPORT_STREAM_JOB
        if value not in contract.REPORT_STREAM_MODES:
            raise ConfigurationError(
                f"REPORT_STREAMS must be one of {list(contract.REPORT_STREAM_MODES)}, got "
                f"{value[:80]!r}"
            )
        return value

    @property
    def job_label(self) -> str:
        """JOB_LABEL: the pod label naming a pod's training job, by which localize corroborates
        that a report's job ran on the node it names (default the Kubeflow training operator's
        ``training.kubeflow.org/job-name``)."""
        value = self._optional(contract.JOB_LABEL) or DEFAULT_JOB_LABEL
        if not is_label_key(value):
            raise ConfigurationError(f"JOB_LABEL must be a Kubernetes label key, got {value!r}")
        return value

    # -- ledger, approvals, notifications -----------------------------------------------------

    @property
    def ledger_table(self) -> str:
        """LEDGER_TABLE: the DynamoDB remediation ledger."""
        return self._required(contract.LEDGER_TABLE)

    @property
    def approvals_table(self) -> str:
        """APPROVALS_TABLE: the DynamoDB table holding task tokens under approval ids."""
        return self._required(contract.APPROVALS_TABLE)

    @property
    def topic_arn(self) -> str:
        """TOPIC_ARN: the SNS topic humans subscribe to."""
        value = self._required(contract.TOPIC_ARN)
        if not value.startswith("arn:"):
            raise ConfigurationError(f"TOPIC_ARN must be an SNS topic ARN, got {value!r}")
        return value

    @property
    def state_machine_arn(self) -> str | None:
        """STATE_MACHINE_ARN: informational, quoted in messages."""
        return self._optional(contract.STATE_MACHINE_ARN)

    @property
    def approval_url(self) -> str | None:
        """APPROVAL_URL: the approve function's AWS_IAM URL, quoted in approval messages, and
        what request_approval calls to settle a canary's approval (optional: without it the
        message names the approvals table, the direct path)."""
        value = self._optional(contract.APPROVAL_URL)
        if value is not None:
            check_approval_url(value, contract.APPROVAL_URL)
        return value

    @property
    def approval_requester_role(self) -> str | None:
        """APPROVAL_REQUESTER_ROLE (the approve function's): the name of request_approval's IAM
        role. Its calls of the URL may settle the canary's approval only (``operator_api``);
        unset (a function run outside the stack), no caller is confined."""
        value = self._optional(contract.APPROVAL_REQUESTER_ROLE)
        # The characters IAM allows in a role name. No length bound: the stack sets this from
        # a role that exists, whose name IAM already bounded, and emulators (moto's server)
        # generate names past IAM's 64, which must not stop the function.
        if value is not None and not _ROLE_NAME.fullmatch(value):
            raise ConfigurationError(
                f"{contract.APPROVAL_REQUESTER_ROLE}={value[:80]!r} is not an IAM role name"
            )
        return value

    @property
    def approval_ttl_seconds(self) -> int:
        """APPROVAL_TTL_SECONDS: lifetime of an approval request: the workflow's approval
        timeout plus one day, as infra/config.py computes it (default 24 h + 1 day)."""
        default = DEFAULT_APPROVAL_TIMEOUT_SECONDS + APPROVAL_TTL_MARGIN_SECONDS
        return self._int(contract.APPROVAL_TTL_SECONDS, default, minimum=60)

    @property
    def approval_timeout_seconds(self) -> int:
        """APPROVAL_TIMEOUT_SECONDS: how long the workflow waits for a decision (the
        RequestApproval task's timeout); infra sets it beside APPROVAL_TTL_SECONDS.

        When it is not set (an environment from before it existed), it is derived as before:
        the TTL minus the one day infra adds to it.
        """
        if self._optional(contract.APPROVAL_TIMEOUT_SECONDS) is not None:
            timeout = self._int(
                contract.APPROVAL_TIMEOUT_SECONDS, DEFAULT_APPROVAL_TIMEOUT_SECONDS, minimum=60
            )
            if timeout > self.approval_ttl_seconds:
                raise ConfigurationError(
                    f"APPROVAL_TIMEOUT_SECONDS ({timeout}) must not exceed APPROVAL_TTL_SECONDS "
                    f"({self.approval_ttl_seconds}): the record must outlive the wait"
                )
            return timeout
        timeout = self.approval_ttl_seconds - APPROVAL_TTL_MARGIN_SECONDS
        if timeout < 60:
            raise ConfigurationError(
                f"APPROVAL_TTL_SECONDS must be the approval timeout (at least 60 s) plus "
                f"{APPROVAL_TTL_MARGIN_SECONDS} s, got {self.approval_ttl_seconds}"
            )
        return timeout

    # -- blast-radius guard -------------------------------------------------------------------

    @property
    def max_nodes_per_hour(self) -> int:
        """MAX_NODES_PER_HOUR: admissions allowed per rolling hour (default 2)."""
        return self._int(contract.MAX_NODES_PER_HOUR, DEFAULT_MAX_NODES_PER_HOUR, minimum=1)

    @property
    def max_fraction(self) -> float:
        """MAX_FRACTION: largest share of the cluster's nodes open at once (default 0.05)."""
        raw = self._optional(contract.MAX_FRACTION)
        if raw is None:
            return DEFAULT_MAX_FRACTION
        try:
            value = float(raw)
        except ValueError:
            raise ConfigurationError(f"MAX_FRACTION must be a number, got {raw!r}") from None
        if not 0.0 < value <= 1.0:
            raise ConfigurationError(f"MAX_FRACTION must be in (0, 1], got {value}")
        return value

    # -- the sweeper's flood watch -------------------------------------------------------------

    @property
    def flood_watch_fraction(self) -> float:
        """FLOOD_WATCH_FRACTION: the share of an SDC alarm's series limit (500) at which the
        sweeper's flood watch tells the on-call that made-up JobNames may blind it (default 0.8)."""
        raw = self._optional(FLOOD_WATCH_FRACTION)
        if raw is None:
            return DEFAULT_FLOOD_WATCH_FRACTION
        try:
            value = float(raw)
        except ValueError:
            raise ConfigurationError(
                f"{FLOOD_WATCH_FRACTION} must be a number, got {raw[:80]!r}"
            ) from None
        if not 0.0 < value <= 1.0:
            raise ConfigurationError(
                f"{FLOOD_WATCH_FRACTION} must be in (0, 1] (a share of the alarm's 500-series "
                f"limit), got {raw[:80]!r}"
            )
        return value

    @property
    def alarm_period_seconds(self) -> int:
        """ALARM_PERIOD: the SDC alarms' period in seconds, whole minutes up to 3 hours (as
        infra's ``alarmPeriod``); default ``ALARM_PERIOD_SECONDS`` (60)."""
        raw = self._optional(contract.ALARM_PERIOD)
        if raw is None:
            return contract.ALARM_PERIOD_SECONDS
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{contract.ALARM_PERIOD} must be a whole number of seconds, got {raw[:80]!r}"
            ) from None
        if not (0 < value <= 3 * 3600 and value % 60 == 0):
            raise ConfigurationError(
                f"{contract.ALARM_PERIOD} must be whole minutes up to 3 hours (the SDC alarms' "
                f"period), got {raw[:80]!r}"
            )
        return value

    # -- health check and replacement ---------------------------------------------------------

    @property
    def health_checks(self) -> list[str]:
        """HEALTH_CHECKS: comma list of DeepHealthCheckType (default InstanceStress)."""
        raw = self._optional(contract.HEALTH_CHECKS) or ",".join(DEFAULT_HEALTH_CHECKS)
        checks = [c.strip() for c in raw.split(",") if c.strip()]
        unknown = [c for c in checks if c not in HEALTH_CHECK_TYPES]
        if unknown or not checks or len(checks) > 3:
            raise ConfigurationError(
                f"HEALTH_CHECKS must be 1-3 of {', '.join(HEALTH_CHECK_TYPES)}; got {raw!r}"
            )
        return checks

    @property
    def health_check_timeout_seconds(self) -> int:
        """HEALTH_CHECK_TIMEOUT_SECONDS: give up polling after this long (default 9000)."""
        return self._int(
            contract.HEALTH_CHECK_TIMEOUT_SECONDS, DEFAULT_HEALTH_CHECK_TIMEOUT_SECONDS, minimum=60
        )

    @property
    def replace_mode(self) -> Literal["api", "label"]:
        """REPLACE_MODE: `api` (BatchReplaceClusterNodes) or `label` (HyperPod's node label)."""
        value = (self._optional(contract.REPLACE_MODE) or "api").lower()
        if value not in REPLACE_MODES:
            raise ConfigurationError(f"REPLACE_MODE must be 'api' or 'label', got {value!r}")
        return value

    @property
    def check_modes(self) -> dict[str, Mode]:
        """CHECK_MODES: JSON object mapping ``<check>/<verdict>``, ``<check>/*`` or ``*`` to
        ``enforce`` or ``shadow`` (default: everything enforced); see ``sdc_contract.modes``."""
        try:
            return parse_modes(self._optional(contract.CHECK_MODES) or "")
        except ValueError as exc:
            raise ConfigurationError(f"CHECK_MODES: {exc}") from None

    def mode_for(self, check: str, verdict: str) -> Mode:
        """Whether alarms of this check and verdict are enforced or only shadowed (a verdict
        outside the contract's list is looked up as ``unknown``)."""
        return mode_for(self.check_modes, check, verdict)

    @property
    def auto_approve(self) -> AutoApprovePolicy:
        """AUTO_APPROVE: JSON ``{onHealthCheckFailed, minPrecision, minEvents}``, the opt-in
        auto-approval policy (default: off; see ``sdc_contract.autoapprove``)."""
        try:
            return parse_policy(self._optional(contract.AUTO_APPROVE) or "")
        except ValueError as exc:
            raise ConfigurationError(f"AUTO_APPROVE: {exc}") from None

    @property
    def auto_approve_requires_screen(self) -> bool:
        """AUTO_APPROVE_REQUIRES_SCREEN: `true` lets the auto-approval policy approve only a node
        whose screen reproduced the fault (default false; context key autoApproveRequiresScreen;
        set on request_approval)."""
        raw = (self._optional(AUTO_APPROVE_REQUIRES_SCREEN) or "false").lower()
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ConfigurationError(
            f"{AUTO_APPROVE_REQUIRES_SCREEN} must be 'true' or 'false', got {raw[:40]!r}"
        )

    @property
    def shadow_health_check(self) -> bool:
        """SHADOW_HEALTH_CHECK: `true` runs a shadowed alarm's deep health check (through the
        shadow guard) before it is recorded (default false; context key shadowHealthCheck)."""
        raw = (self._optional(contract.SHADOW_HEALTH_CHECK) or "false").lower()
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ConfigurationError(f"SHADOW_HEALTH_CHECK must be 'true' or 'false', got {raw!r}")

    @property
    def canary_timeout_seconds(self) -> int:
        """CANARY_TIMEOUT_SECONDS: how long a canary run may take (``canaryTimeout``; set on the
        canary function); a run's report and approval are refused after that."""
        return self._int(
            contract.CANARY_TIMEOUT_SECONDS, contract.DEFAULT_CANARY_TIMEOUT_SECONDS, minimum=60
        )

    # -- the node screen ----------------------------------------------------------------------

    @property
    def screen_image(self) -> str | None:
        """SCREEN_IMAGE: the image the Screen step's Job runs ``python -m sdc_agent.screen``
        from (the training image); unset or empty: the screen is not configured (context key
        screenImage)."""
        value = self._optional(SCREEN_IMAGE)
        if value is not None and not is_image_reference(value):
            raise ConfigurationError(
                f"{SCREEN_IMAGE} must be a container image reference (no spaces, at most 512 "
                f"characters), got {value[:80]!r}"
            )
        return value

    @property
    def screen_namespace(self) -> str:
        """SCREEN_NAMESPACE: the namespace of the screen Jobs (default ``sdc-screen``)."""
        value = self._optional(SCREEN_NAMESPACE) or contract.DEFAULT_SCREEN_NAMESPACE
        if not is_label_name(value):
            raise ConfigurationError(
                f"{SCREEN_NAMESPACE} must be a Kubernetes namespace name, got {value[:80]!r}"
            )
        return value

    @property
    def screen_deadline_seconds(self) -> int:
        """SCREEN_DEADLINE_SECONDS: the screen Job's activeDeadlineSeconds (default 1800)."""
        value = self._int(
            SCREEN_DEADLINE_SECONDS,
            contract.DEFAULT_SCREEN_DEADLINE_SECONDS,
            minimum=MIN_SCREEN_DEADLINE_SECONDS,
        )
        if value > MAX_SCREEN_DEADLINE_SECONDS:
            raise ConfigurationError(
                f"{SCREEN_DEADLINE_SECONDS} must be <= {MAX_SCREEN_DEADLINE_SECONDS}, got {value}"
            )
        return value

    def _bounded(self, name: str, default: int, minimum: int, maximum: int, what: str) -> int:
        """An integer setting within the contract's [minimum, maximum] (errors name it)."""
        value = self._int(name, default, minimum=minimum)
        if value > maximum:
            raise ConfigurationError(f"{name} ({what}) must be <= {maximum}, got {value}")
        return value

    @property
    def screen_rescreen_days(self) -> int:
        """SCREEN_RESCREEN_DAYS: the idle screener screens a node again once its last screen is
        this many days old (default 30; context key screenRescreenDays)."""
        return self._bounded(
            contract.SCREEN_RESCREEN_DAYS,
            contract.DEFAULT_SCREEN_RESCREEN_DAYS,
            contract.MIN_SCREEN_RESCREEN_DAYS,
            contract.MAX_SCREEN_RESCREEN_DAYS,
            "the rescreen age in days",
        )

    @property
    def screen_idle_max_nodes(self) -> int:
        """SCREEN_IDLE_MAX_NODES: at most this many idle-node screens run at once in the cluster
        (default 2; context key screenIdleMaxNodes)."""
        return self._bounded(
            contract.SCREEN_IDLE_MAX_NODES,
            contract.DEFAULT_SCREEN_IDLE_MAX_NODES,
            contract.MIN_SCREEN_IDLE_MAX_NODES,
            contract.MAX_SCREEN_IDLE_MAX_NODES,
            "idle-node screens at once",
        )

    @property
    def dry_run(self) -> bool:
        """DRY_RUN: `true` runs every step but only logs cordon, uncordon and replace."""
        raw = (self._optional(contract.DRY_RUN) or "false").lower()
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise ConfigurationError(f"DRY_RUN must be 'true' or 'false', got {raw!r}")

    @property
    def canary_alarm_name(self) -> str:
        """The canary's SDC alarm (ALARM_NAME_PREFIX + the contract's canary suffix)."""
        return self.alarm_name_prefix + contract.CANARY_ALARM_SUFFIX

    def dry_run_only(self) -> Settings:
        """These settings with DRY_RUN forced on (what every step of a canary runs under,
        whatever the deployment's own DRY_RUN)."""
        return Settings(ChainMap({contract.DRY_RUN: "true"}, dict(self._env)))


def check_approval_url(url: str, what: str = "the approval URL") -> None:
    """An approval URL is https, or plain http to a loopback stand-in only: a signed request is
    replayable for minutes, so it never travels in clear text off this host
    (ConfigurationError otherwise)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    loopback = url.startswith("http://") and host in ("127.0.0.1", "localhost", "::1")
    if not (url.startswith("https://") or loopback):
        raise ConfigurationError(
            f"{what} must be an https:// URL (http:// only to a loopback stand-in), got {url!r}"
        )


def settings() -> Settings:
    """The settings of this invocation: its :func:`environment` block, else the process
    environment (cheap: nothing is read until used)."""
    return Settings()
