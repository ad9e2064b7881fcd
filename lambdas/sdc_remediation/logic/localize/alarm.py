"""The alarm event, checked and normalised: one job's contributor of this stack's per-job SDC
alarm, in this stack's account, on one of the agent's SDC metrics in this cluster; and which
job's data the alarm may read (that job's only)."""

from __future__ import annotations

from datetime import timedelta

import sdc_contract as contract
from sdc_contract.names import is_job_name

from ... import clock, text
from ...config import Settings
from ...errors import InvalidAlarmEvent
from ...models import Alarm, AlarmStateChangeEvent

# The agent writes the report right after the metric; the alarm fires on the metric. A little
# grace after the alarm time catches a report that a retrying sender delivered a bit late.
GRACE_SECONDS = 120
ARN_PARTITIONS = ("aws", "aws-cn", "aws-us-gov")


def check_source(event: AlarmStateChangeEvent, settings: Settings) -> str:
    """The alarm's ARN, for this stack's alarms in this stack's account only (InvalidAlarmEvent
    otherwise).

    EventBridge sets ``account`` and ``resources`` (the alarm ARN); a rule, a cross-account bus
    or a StartExecution by hand could deliver anything else.
    """
    name = event.detail.alarm_name
    expected = settings.alarm_account_id
    if event.account != expected:
        raise InvalidAlarmEvent(
            f"alarm {name!r} comes from account {event.account!r}, this stack is {expected!r}"
        )
    prefix = settings.alarm_name_prefix
    if not name.startswith(prefix):
        raise InvalidAlarmEvent(f"alarm {name!r} is not one of this stack's ({prefix}*)")
    wanted = {
        f"arn:{partition}:cloudwatch:{event.region}:{expected}:alarm:{name}"
        for partition in ARN_PARTITIONS
    }
    found = sorted(wanted.intersection(event.resources))
    if not found:
        raise InvalidAlarmEvent(
            f"alarm {name!r}: the event's resources {event.resources[:3]} do not name this "
            f"alarm in account {expected} and region {event.region}"
        )
    return found[0]


def alarm_queries(settings: Settings) -> dict[str, tuple[str, str | None]]:
    """This stack's per-job alarm queries (``sdc_contract.metrics.job_alarm_query``): query ->
    (metric name, the reserved job whose alarm it is: the canary's, the idle screen's; None for
    the training jobs' alarms, which watch every job but the reserved ones)."""
    namespace, cluster = settings.metric_namespace, settings.hyperpod_cluster_name
    queries: dict[str, tuple[str, str | None]] = {
        contract.job_alarm_query(namespace, metric, cluster, except_job=contract.CANARY_JOB): (
            metric,
            None,
        )
        for metric in contract.SDC_ALARM_METRICS
    }
    for job, metric in reserved_metrics().items():
        query = contract.job_alarm_query(
            reserved_namespace(job, namespace), metric, cluster, only_job=job
        )
        queries[query] = (metric, job)
    return queries


def reserved_metrics() -> dict[str, str]:
    """Each reserved job's metric (the one datum its function puts)."""
    return {
        contract.CANARY_JOB: contract.CANARY_METRIC,
        contract.IDLE_SCREEN_JOB: contract.IDLE_SCREEN_METRIC,
    }


def reserved_namespace(job: str, namespace: str) -> str:
    """A reserved job's own namespace, apart from the training pods' ``namespace``."""
    if job == contract.CANARY_JOB:
        return contract.canary_namespace(namespace)
    return contract.idle_screen_namespace(namespace)


def reserved_job_of(alarm: Alarm) -> str | None:
    """The reserved job whose alarm ``alarm`` is (None: a training jobs' alarm)."""
    if alarm.canary:
        return contract.CANARY_JOB
    if alarm.metric_name == contract.IDLE_SCREEN_METRIC:
        return contract.IDLE_SCREEN_JOB
    return None


def alarm_from_event(event: AlarmStateChangeEvent, settings: Settings) -> Alarm:
    """Normalise the alarm event: one job's contributor of one of this stack's per-job SDC
    alarms entering ALARM. Anything else is ``InvalidAlarmEvent``: another state, another
    query (metric, namespace, cluster), an event without a contributor, a contributor whose
    job is not a job name (its attributes come from PutMetricData, which any pod can call)."""
    alarm_arn = check_source(event, settings)
    detail = event.detail
    name = detail.alarm_name
    if detail.state.value != "ALARM":
        raise InvalidAlarmEvent(f"alarm {name!r} changed to {detail.state.value}, not ALARM")
    known = alarm_queries(settings)
    matched = [known[q.expression] for q in detail.configuration.metrics if q.expression in known]
    if not matched:
        raise InvalidAlarmEvent(
            f"alarm {name!r} watches no per-job SDC query of namespace "
            f"{settings.metric_namespace!r} and cluster {settings.hyperpod_cluster_name!r} "
            "(this stack's alarms are Metrics Insights queries grouped by JobName)"
        )
    metric_name, reserved = matched[0]
    contributor = detail.alarm_contributor
    if contributor is None:
        raise InvalidAlarmEvent(
            f"alarm {name!r}: the event names no contributor; the workflow starts on one job's "
            f"contributor entering ALARM ({contract.CONTRIBUTOR_EVENT})"
        )
    job = contributor.attributes.get(contract.JOB_DIMENSION, "")
    if not is_job_name(job):
        raise InvalidAlarmEvent(
            f"alarm {name!r}: the contributor's {contract.JOB_DIMENSION} {job[:80]!r} is not a "
            "job name (a Kubernetes label value)"
        )
    if reserved != (job if job in contract.RESERVED_JOBS else None):
        raise InvalidAlarmEvent(
            f"alarm {name!r}: job {job!r} is not this alarm's (a reserved job's alarm, the "
            "canary's or the idle screen's, is that job's only, and no training alarm watches a "
            "reserved job)"
        )
    end = detail.state.timestamp
    start = end - timedelta(seconds=settings.lookback_seconds)
    return Alarm(
        alarm_name=name,
        alarm_arn=alarm_arn,
        state=detail.state.value,
        reason=text.printable(detail.state.reason, 2000),
        time=clock.iso(end),
        metric_name=metric_name,
        # A reserved job's series are in its own namespace (contract.canary_namespace, ...).
        namespace=(
            reserved_namespace(reserved, settings.metric_namespace)
            if reserved
            else settings.metric_namespace
        ),
        cluster_name=settings.hyperpod_cluster_name,
        window_start=clock.iso(start),
        window_end=clock.iso(end + timedelta(seconds=GRACE_SECONDS)),
        canary=reserved == contract.CANARY_JOB,
        job=job,
    )


def belongs_to(alarm: Alarm, job: str) -> bool:
    """Whether ``job``'s data is this alarm's: the contributor's job only (one job's data never
    joins, blocks or counts against another's remediation). A reserved job's alarm (the
    canary's, the idle screen's) reads only that job, every other alarm only training jobs, so
    a canary never joins a real remediation (nor counts against its blast radius)."""
    if alarm.job is not None and job != alarm.job:
        return False
    return (job if job in contract.RESERVED_JOBS else None) == reserved_job_of(alarm)


__all__ = [
    "GRACE_SECONDS",
    "alarm_from_event",
    "alarm_queries",
    "belongs_to",
    "check_source",
    "reserved_job_of",
    "reserved_namespace",
]
