"""CloudWatch names: the agent's metrics and their series, the report log group, and the
functions' own (Powertools) metrics that infra's dashboard and alarms read.

docs/CONTRACT.md ("Agent -> CloudWatch") says what each one counts.
"""

from __future__ import annotations

from .names import is_label_name, is_subdomain_name

DEFAULT_NAMESPACE = "SDC"
"""The agent's metric namespace unless configured (context key ``namespace``,
``SDC_METRIC_NAMESPACE`` in the job, ``METRIC_NAMESPACE`` in the functions)."""

NONFINITE_GRAD_METRIC = "sdc_nonfinite_grad"
"""Ranks with a non-finite gradient (check ``compute`` with non-finite ranks, and
``reduced_gradient``)."""
REPLAY_MISMATCH_METRIC = "sdc_replay_mismatch"
"""Mismatched replay pairs (check ``compute``)."""
DIVERGENT_TENSORS_METRIC = "sdc_divergent_tensors"
"""Tensors whose replicas disagree (check ``weights``)."""
SDC_ALARM_METRICS: tuple[str, ...] = (
    NONFINITE_GRAD_METRIC,
    REPLAY_MISMATCH_METRIC,
    DIVERGENT_TENSORS_METRIC,
)
"""One deployed alarm each; localize reads their per-node series."""

AUDIT_PASS_METRIC = "sdc_audit_pass"
WEIGHT_CHECK_PASS_METRIC = "sdc_weight_check_pass"
SDC_LIVENESS_METRICS: tuple[str, ...] = (AUDIT_PASS_METRIC, WEIGHT_CHECK_PASS_METRIC)
"""Counts the agent publishes per {ClusterName, JobName} while its checks run."""
UNCONFIRMED_SENSOR_FLAGS_METRIC = "sdc_unconfirmed_sensor_flags"
"""Online sensor candidates that replays did not confirm: not SDC, but a noisy sensor shows
(published with the liveness counts)."""

AUDIT_SKIPPED_METRIC = "sdc_audit_skipped"
"""Audits that did not run or could not judge (a ``rebuild_batch`` that raised, a set-up finding
that turned the audits off): published on the job's series with the liveness counts, never an
SDC metric, so that an alarm can catch a job that is no longer protected."""

CLUSTER_DIMENSION = "ClusterName"
JOB_DIMENSION = "JobName"
NODE_DIMENSION = "NodeName"
CLUSTER_SERIES: tuple[str, ...] = (CLUSTER_DIMENSION,)
"""The cluster's series of each SDC metric (the dashboard's)."""
JOB_SERIES: tuple[str, ...] = (CLUSTER_DIMENSION, JOB_DIMENSION)
"""A job's series: of each SDC metric (what the per-job alarms watch) and the liveness counts."""
NODE_SERIES: tuple[str, ...] = (CLUSTER_DIMENSION, JOB_DIMENSION, NODE_DIMENSION)
"""The per-node series of every node an alarm names, which localize lists."""

POWERTOOLS_SERVICE_NAME = "sdc-remediation"
"""The functions' Powertools service (logs, metrics' ``service`` dimension)."""
POWERTOOLS_METRICS_NAMESPACE = "SDCRemediation"
"""The namespace of the functions' own metrics (EMF)."""
CHECK_DIMENSION = "Check"
VERDICT_DIMENSION = "Verdict"
OUTCOME_DIMENSIONS: tuple[str, ...] = (CLUSTER_DIMENSION, CHECK_DIMENSION, VERDICT_DIMENSION)
"""The record step's outcome metrics per check x verdict (the dashboard's table); the verdict
is always one of the contract's (``report.verdict_name``). Powertools adds ``service``."""


ALARM_PERIOD_SECONDS = 60
"""The period of the deployed SDC alarms: Metrics Insights evaluates minutes only (it
aggregates high-resolution data to one minute)."""
CONTRIBUTOR_EVENT = "CloudWatch Alarm Contributor State Change"
"""The EventBridge detail-type of one contributor (one job) of a Metrics Insights alarm changing
state: what starts the remediation workflow."""


def job_alarm_query(
    namespace: str,
    metric: str,
    cluster: str,
    *,
    only_job: str | None = None,
    except_job: str | None = None,
) -> str:
    """The Metrics Insights query of a per-job SDC alarm: ``metric`` on each job's
    {ClusterName, JobName} series of ``cluster``, one contributor per job (GROUP BY JobName).
    The job series carries every finding, also one that names no node (which has no per-node
    series).

    Each job is its own contributor, with its own ALARM/OK state, so one job's data cannot hold
    another job's alarm in ALARM. ``only_job`` / ``except_job`` keep one job to itself (the
    canary) or out (every training alarm). infra builds the alarms from this, and localize
    accepts an alarm event only when its query is exactly one of these.
    """
    where = [f"{CLUSTER_DIMENSION} = '{cluster}'"]
    if only_job is not None:
        where.append(f"{JOB_DIMENSION} = '{only_job}'")
    if except_job is not None:
        where.append(f"{JOB_DIMENSION} != '{except_job}'")
    schema = ", ".join([f'"{namespace}"', *JOB_SERIES])
    return (
        f"SELECT SUM({metric}) FROM SCHEMA({schema}) WHERE {' AND '.join(where)} "
        f"GROUP BY {JOB_DIMENSION} ORDER BY SUM() DESC"
    )


def job_count_query(
    namespace: str, metric: str, cluster: str, *, except_job: str | None = None
) -> str:
    """The Metrics Insights query of a flood alarm: how many data points ``metric`` has on all
    the job series {ClusterName, JobName} of ``cluster`` together (no GROUP BY: one series).

    Real findings give a few a minute; a pod that puts data under many made-up JobNames gives
    many, and such a flood can keep real jobs' contributors out of the per-job alarms
    (``job_alarm_query``: a Metrics Insights alarm puts at most 100 contributors in ALARM, a
    query returns at most 500 series and reads the first 10,000 metrics). This is the bound
    the pipeline checks: an alarm on it pages; it starts no remediation.
    """
    where = [f"{CLUSTER_DIMENSION} = '{cluster}'"]
    if except_job is not None:
        where.append(f"{JOB_DIMENSION} != '{except_job}'")
    schema = ", ".join([f'"{namespace}"', *JOB_SERIES])
    return f"SELECT COUNT({metric}) FROM SCHEMA({schema}) WHERE {' AND '.join(where)}"


def report_log_group(cluster: str) -> str:
    """The log group of a cluster's reports and rank maps, unless configured otherwise."""
    return f"/sdc/{cluster}"


REPORT_STREAM_JOB = "job"
"""Report streams named by the job (``<job>``): any pod the agent's policy covers may write any
job's stream (deployed with ``agentIdentity: shared``, the default)."""
REPORT_STREAM_POD = "pod"
"""Report streams named by the writing pod (``<namespace>/<job>/<pod>``): with EKS Pod
Identity's session tags the agent's policy lets a pod write only streams that end in its own
namespace and pod name, and localize reads a job's reports only from streams of the job's own
pods (``agentIdentity: pod-identity``)."""
REPORT_STREAM_MODES: tuple[str, ...] = (REPORT_STREAM_JOB, REPORT_STREAM_POD)


def pod_report_stream(namespace: str, job: str, pod: str) -> str:
    """The report stream of ``pod`` (of ``job``, in Kubernetes ``namespace``) when streams are
    named by the writing pod: ``<namespace>/<job>/<pod>``.

    The namespace and the pod are what IAM checks (the session tags ``kubernetes-namespace``
    and ``kubernetes-pod-name``); the job in the middle is what localize looks a job's reports
    up by, and it still checks that the pod is the job's."""
    if not is_label_name(namespace):
        raise ValueError(f"{namespace!r} is not a Kubernetes namespace name")
    if not is_subdomain_name(pod):
        raise ValueError(f"{pod!r} is not a Kubernetes pod name")
    if not job or "/" in job or ":" in job or "*" in job:
        raise ValueError(f"{job!r} cannot name a report stream (no '/', ':' or '*')")
    return f"{namespace}/{job}/{pod}"


def pod_stream_prefix(namespace: str, job: str) -> str:
    """The prefix every report stream of ``job``'s pods in ``namespace`` starts with."""
    return f"{namespace}/{job}/"


def pod_of_report_stream(stream: str, namespace: str, job: str) -> str | None:
    """The pod whose report stream ``stream`` is, when it is one of ``job``'s in ``namespace``
    (``pod_report_stream``); None for any other stream (another job's, another namespace's, a
    name with more parts, or one whose last part is not a pod name)."""
    prefix = pod_stream_prefix(namespace, job)
    if not stream.startswith(prefix):
        return None
    pod = stream[len(prefix) :]
    return pod if is_subdomain_name(pod) else None


__all__ = [
    "ALARM_PERIOD_SECONDS",
    "AUDIT_PASS_METRIC",
    "AUDIT_SKIPPED_METRIC",
    "CHECK_DIMENSION",
    "CLUSTER_DIMENSION",
    "CLUSTER_SERIES",
    "CONTRIBUTOR_EVENT",
    "DEFAULT_NAMESPACE",
    "DIVERGENT_TENSORS_METRIC",
    "JOB_DIMENSION",
    "JOB_SERIES",
    "NODE_DIMENSION",
    "NODE_SERIES",
    "NONFINITE_GRAD_METRIC",
    "OUTCOME_DIMENSIONS",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_SERVICE_NAME",
    "REPLAY_MISMATCH_METRIC",
    "REPORT_STREAM_JOB",
    "REPORT_STREAM_MODES",
    "REPORT_STREAM_POD",
    "SDC_ALARM_METRICS",
    "SDC_LIVENESS_METRICS",
    "UNCONFIRMED_SENSOR_FLAGS_METRIC",
    "VERDICT_DIMENSION",
    "WEIGHT_CHECK_PASS_METRIC",
    "job_alarm_query",
    "job_count_query",
    "pod_of_report_stream",
    "pod_report_stream",
    "pod_stream_prefix",
    "report_log_group",
]
