"""What the CloudWatch publisher needs to know, from arguments or the pod's environment.

A HyperPod EKS training pod has no standard variable for the cluster or the job, so the agent
reads its own (``SDC_*``) and falls back to what a Kubeflow PyTorchJob pod always has: its pod
name ``<job>-<replica type>-<index>`` (POD_NAME from the downward API, else HOSTNAME). Arguments
win over the environment. Every value is validated here, once, with an error that names it.

The report stream is ``<job>`` by default. With SDC_REPORT_STREAM=pod it is
``<namespace>/<job>/<pod>`` (POD_NAMESPACE and POD_NAME, both from the downward API): a stack
deployed with ``agentIdentity: pod-identity`` lets a pod write only the stream that ends in its
own namespace and pod name, so a job's reports can come only from its own pods.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdc_contract.environment import POD_NAMESPACE as ENV_POD_NAMESPACE
from sdc_contract.environment import SDC_CLUSTER_NAME as ENV_CLUSTER_NAME
from sdc_contract.environment import SDC_JOB_NAME as ENV_JOB_NAME
from sdc_contract.environment import SDC_LOG_GROUP as ENV_LOG_GROUP
from sdc_contract.environment import SDC_METRIC_NAMESPACE as ENV_NAMESPACE
from sdc_contract.environment import SDC_REPORT_STREAM as ENV_REPORT_STREAM
from sdc_contract.environment import SDC_SPOOL_DIR as ENV_SPOOL_DIR
from sdc_contract.environment import SDC_SPOOL_MAX_BYTES as ENV_SPOOL_MAX_BYTES
from sdc_contract.metrics import (
    DEFAULT_NAMESPACE,
    REPORT_STREAM_JOB,
    REPORT_STREAM_MODES,
    REPORT_STREAM_POD,
    pod_of_report_stream,
    pod_report_stream,
    report_log_group,
)
from sdc_contract.names import is_label_name, is_subdomain_name

from ..errors import SdcAgentError

DEFAULT_SPOOL_MAX_BYTES = 64 * 1024 * 1024
ENV_POD_NAME = "POD_NAME"
"""The pod's ``metadata.name`` (downward API): the last part of its report stream in pod mode."""

# Kubeflow's training operator names a replica's pod "<job>-<replica type>-<index>".
_KUBEFLOW_POD = re.compile(r"^(?P<job>.+)-(?:master|worker|launcher)-\d+$")
# CloudWatch Logs: log group names are [.-_/#A-Za-z0-9]{1,512}; stream names exclude ':' and '*'.
_LOG_GROUP = re.compile(r"^[.\-_/#A-Za-z0-9]{1,512}$")
_MAX_DIMENSION_VALUE = 1024


class PublishConfigError(SdcAgentError, ValueError):
    """The publisher's configuration is missing or invalid; the message names the value."""


@dataclass(frozen=True)
class RetryPolicy:
    """How the background sender retries one AWS call before it spools the alarm."""

    attempts: int = 4
    """Calls per request, the first included; 1 disables retries."""
    base_delay: float = 0.25
    """Seconds; the backoff before retry n is uniform in [0, min(max_delay, base_delay * 2**n)]."""
    max_delay: float = 5.0
    """Upper bound of one backoff, in seconds."""

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise PublishConfigError(
                f"RetryPolicy.attempts must be an integer >= 1, got {self.attempts!r}"
            )
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise PublishConfigError(
                    f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}"
                )


@dataclass(kw_only=True, frozen=True)
class PublishSettings:
    """Validated configuration of a CloudWatchPublisher (see :meth:`from_env`)."""

    cluster_name: str
    """The HyperPod cluster: the ClusterName dimension and the log group ``/sdc/<cluster>``."""
    job_name: str
    """The training job: the JobName dimension, and the log stream unless ``log_stream`` says
    otherwise."""
    namespace: str = DEFAULT_NAMESPACE
    """CloudWatch metric namespace."""
    log_group: str = ""
    """CloudWatch Logs group for reports and the rank map; empty means ``/sdc/<cluster_name>``."""
    log_stream: str = ""
    """CloudWatch Logs stream for reports and the rank map; empty means ``job_name``. In
    ``report_stream`` "pod" it must be the pod's ``<namespace>/<job_name>/<pod>`` (from_env
    builds it)."""
    report_stream: str = REPORT_STREAM_JOB
    """How the stream is named (``REPORT_STREAM_MODES``): "job" (``<job>``) or "pod"
    (``<namespace>/<job>/<pod>``, for a stack deployed with ``agentIdentity: pod-identity``)."""
    region: str | None = None
    """AWS region; from_env takes AWS_REGION; None lets boto3 resolve it (AWS_DEFAULT_REGION,
    config files)."""
    spool_dir: str = field(default_factory=lambda: default_spool_dir())
    """Directory of the local spool for alarms that could not be sent; each job spools into its
    own private subdirectory of it (see ``Spool.for_job``)."""
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    """The spool refuses records beyond this total size (the report is then logged instead)."""
    queue_size: int = 1000
    """Deliveries waiting for the sender; beyond it an alarm is spooled by the caller."""
    liveness_interval: float = 60.0
    """Seconds between two liveness PutMetricData calls (at most one per interval)."""
    connect_timeout: float = 2.0
    """Seconds to open a connection to AWS before the attempt counts as failed."""
    read_timeout: float = 5.0
    """Seconds to wait for AWS to answer before the attempt counts as failed."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Retries of each AWS call in the background sender."""

    def __post_init__(self) -> None:
        _require_text("cluster_name", ENV_CLUSTER_NAME, self.cluster_name, _MAX_DIMENSION_VALUE)
        if not _LOG_GROUP.match(report_log_group(self.cluster_name)):
            raise PublishConfigError(
                f"cluster_name ({ENV_CLUSTER_NAME}) may only hold letters, digits and . - _ # "
                f"(it names the log group /sdc/<cluster>), got {self.cluster_name!r}"
            )
        _require_text("job_name", ENV_JOB_NAME, self.job_name, 512)
        if ":" in self.job_name or "*" in self.job_name:
            raise PublishConfigError(
                f"job_name ({ENV_JOB_NAME}) names the log stream and may not contain ':' or '*', "
                f"got {self.job_name!r}"
            )
        self._check_log_stream()
        _require_text("namespace", ENV_NAMESPACE, self.namespace, 255)
        if self.namespace.startswith("AWS/"):
            raise PublishConfigError(
                f"namespace ({ENV_NAMESPACE}) may not start with 'AWS/', got {self.namespace!r}"
            )
        if not self.log_group:
            object.__setattr__(self, "log_group", report_log_group(self.cluster_name))
        if not _LOG_GROUP.match(self.log_group):
            raise PublishConfigError(
                f"log_group ({ENV_LOG_GROUP}) must be 1-512 of letters, digits and . - _ / #, "
                f"got {self.log_group!r}"
            )
        _require_text("spool_dir", ENV_SPOOL_DIR, self.spool_dir, 4096)
        for name, minimum in (("spool_max_bytes", 1), ("queue_size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise PublishConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
        for name in ("liveness_interval", "connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise PublishConfigError(f"{name} must be a positive number, got {value!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise PublishConfigError(f"retry must be a RetryPolicy, got {self.retry!r}")

    def _check_log_stream(self) -> None:
        """Validate ``report_stream`` and ``log_stream`` (defaulting the stream to the job).

        In pod mode the stream must be one of this job's pod streams: the stack's pod-identity
        policy refuses any other, so a wrong one would only fail later, in the background.
        """
        check_report_stream_mode(self.report_stream)
        if not self.log_stream and self.report_stream == REPORT_STREAM_JOB:
            object.__setattr__(self, "log_stream", self.job_name)
        if (
            not isinstance(self.log_stream, str)
            or not 1 <= len(self.log_stream) <= 512
            or ":" in self.log_stream
            or "*" in self.log_stream
        ):
            raise PublishConfigError(
                "log_stream must be 1-512 characters without ':' or '*' (it names the CloudWatch "
                f"Logs stream), got {self.log_stream!r}"
            )
        if self.report_stream == REPORT_STREAM_POD and not _is_pod_stream_of(
            self.log_stream, self.job_name
        ):
            raise PublishConfigError(
                f"with report_stream 'pod' ({ENV_REPORT_STREAM}=pod) log_stream must be "
                f"'<namespace>/{self.job_name}/<pod name>' ({ENV_POD_NAMESPACE}/{ENV_JOB_NAME}/"
                f"{ENV_POD_NAME}): the stack's pod-identity policy lets a pod write only that "
                f"stream; got {self.log_stream!r}"
            )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        cluster_name: str | None = None,
        job_name: str | None = None,
        namespace: str | None = None,
        log_group: str | None = None,
        region: str | None = None,
        spool_dir: str | None = None,
        report_stream: str | None = None,
        pod_namespace: str | None = None,
        pod_name: str | None = None,
        **options: Any,
    ) -> PublishSettings:
        """Settings from arguments, falling back to the environment a HyperPod EKS pod has.

        ``env`` defaults to ``os.environ``. ``options`` are the other fields, passed through.
        ``report_stream`` (SDC_REPORT_STREAM, default "job") "pod" names the log stream
        ``<namespace>/<job>/<pod>`` from ``pod_namespace`` (POD_NAMESPACE) and ``pod_name``
        (POD_NAME), unless ``log_stream=`` is passed. Raises PublishConfigError naming the
        argument and the variable when a value is missing.
        """
        env = os.environ if env is None else env
        cluster = cluster_name or env.get(ENV_CLUSTER_NAME, "").strip()
        if not cluster:
            raise PublishConfigError(
                f"the cluster name is missing: pass cluster_name=... or set {ENV_CLUSTER_NAME} "
                "(the HyperPod cluster's name)"
            )
        job = job_name or env.get(ENV_JOB_NAME, "").strip() or job_from_pod_name(env)
        if not job:
            raise PublishConfigError(
                f"the job name is missing: pass job_name=... or set {ENV_JOB_NAME} (for a "
                "PyTorchJob, from the pod label training.kubeflow.org/job-name via the downward "
                "API); POD_NAME/HOSTNAME did not look like a Kubeflow replica '<job>-worker-<n>'"
            )
        mode = report_stream or env.get(ENV_REPORT_STREAM, "").strip() or REPORT_STREAM_JOB
        check_report_stream_mode(mode)
        if mode == REPORT_STREAM_POD and not options.get("log_stream"):
            options["log_stream"] = pod_stream_from_env(env, job, pod_namespace, pod_name)
        if "spool_max_bytes" not in options and env.get(ENV_SPOOL_MAX_BYTES):
            raw = env[ENV_SPOOL_MAX_BYTES]
            try:
                options["spool_max_bytes"] = int(raw)
            except ValueError:
                raise PublishConfigError(
                    f"{ENV_SPOOL_MAX_BYTES} must be an integer number of bytes, got {raw!r}"
                ) from None
        return cls(
            cluster_name=cluster,
            job_name=job,
            namespace=namespace or env.get(ENV_NAMESPACE, "").strip() or DEFAULT_NAMESPACE,
            log_group=log_group or env.get(ENV_LOG_GROUP, "").strip(),
            # boto3 reads only AWS_DEFAULT_REGION; the other SDKs (and the EKS webhooks) also set
            # AWS_REGION, which wins over it there, so it wins here too.
            region=region or env.get("AWS_REGION", "").strip() or None,
            spool_dir=spool_dir or env.get(ENV_SPOOL_DIR, "").strip() or default_spool_dir(),
            report_stream=mode,
            **options,
        )


def default_spool_dir() -> str:
    """``<temp dir>/sdc-spool``: local to the pod unless SDC_SPOOL_DIR points at a volume."""
    return os.path.join(tempfile.gettempdir(), "sdc-spool")


def job_from_pod_name(env: Mapping[str, str]) -> str:
    """The job name in a Kubeflow replica's pod name (POD_NAME, else HOSTNAME), or ''."""
    pod = env.get("POD_NAME", "").strip() or env.get("HOSTNAME", "").strip()
    match = _KUBEFLOW_POD.match(pod)
    return match.group("job") if match else ""


def check_report_stream_mode(mode: object) -> None:
    """Refuse a report stream mode the stack does not know: a typo would otherwise fall back
    to a stream the deployed policy (or localize) does not expect, and fail only later."""
    if mode not in REPORT_STREAM_MODES:
        choices = ", ".join(repr(m) for m in REPORT_STREAM_MODES)
        raise PublishConfigError(
            f"report_stream ({ENV_REPORT_STREAM}) must be one of {choices}, got {mode!r}"
        )


def pod_stream_from_env(
    env: Mapping[str, str], job: str, namespace: str | None = None, pod: str | None = None
) -> str:
    """The pod's report stream ``<namespace>/<job>/<pod>`` from arguments, else POD_NAMESPACE
    and POD_NAME.

    Never HOSTNAME for the pod: a hostname is cut to 63 characters while IAM checks the session
    tag of the full pod name, so a long pod's writes would all be refused.
    """
    why = (
        "the stack's pod-identity policy (agentIdentity: pod-identity) lets a pod write only "
        "the report stream <namespace>/<job>/<its own pod name>"
    )
    namespace = namespace or env.get(ENV_POD_NAMESPACE, "").strip()
    if not namespace:
        raise PublishConfigError(
            f"{ENV_REPORT_STREAM}=pod needs the pod's namespace: pass pod_namespace=... or set "
            f"{ENV_POD_NAMESPACE} from the downward API (fieldRef metadata.namespace); {why}"
        )
    if not is_label_name(namespace):
        raise PublishConfigError(
            f"pod_namespace ({ENV_POD_NAMESPACE}) must be a Kubernetes namespace name "
            f"(lowercase letters, digits and '-', at most 63), got {namespace!r}; {why}"
        )
    pod = pod or env.get(ENV_POD_NAME, "").strip()
    if not pod:
        raise PublishConfigError(
            f"{ENV_REPORT_STREAM}=pod needs the pod's name: pass pod_name=... or set "
            f"{ENV_POD_NAME} from the downward API (fieldRef metadata.name); HOSTNAME is not "
            f"used, since it is cut to 63 characters and IAM checks the full pod name; {why}"
        )
    if not is_subdomain_name(pod):
        raise PublishConfigError(
            f"pod_name ({ENV_POD_NAME}) must be a Kubernetes pod name, got {pod!r}; {why}"
        )
    try:
        return pod_report_stream(namespace, job, pod)
    except ValueError as exc:
        raise PublishConfigError(
            f"job_name ({ENV_JOB_NAME}) cannot be part of a pod's report stream: {exc}"
        ) from None


def _is_pod_stream_of(stream: str, job: str) -> bool:
    """Whether ``stream`` is ``<namespace>/<job>/<pod>`` with a valid namespace and pod."""
    namespace = stream.split("/", 1)[0]
    if not is_label_name(namespace):
        return False
    return pod_of_report_stream(stream, namespace, job) is not None


def _require_text(name: str, variable: str, value: object, max_len: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise PublishConfigError(f"{name} ({variable}) must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise PublishConfigError(
            f"{name} ({variable}) must be at most {max_len} characters, got {len(value)}"
        )
