"""The alarm event, checked and normalised: this stack's alarm, in this stack's account, on one
of the agent's SDC metrics in this cluster; and which jobs' data the alarm may read."""

from __future__ import annotations

from datetime import timedelta

import sdc_contract as contract

from ... import clock
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


def alarm_from_event(event: AlarmStateChangeEvent, settings: Settings) -> Alarm:
    """Normalise the alarm event; reject non-ALARM states, foreign metrics and other clusters."""
    alarm_arn = check_source(event, settings)
    detail = event.detail
    if detail.state.value != "ALARM":
        raise InvalidAlarmEvent(
            f"alarm {detail.alarm_name!r} changed to {detail.state.value}, not ALARM"
        )
    namespace = settings.metric_namespace
    ours = [
        q.metric_stat.metric
        for q in detail.configuration.metrics
        if q.metric_stat is not None
        and q.metric_stat.metric.namespace == namespace
        and q.metric_stat.metric.name in contract.SDC_ALARM_METRICS
    ]
    if not ours:
        raise InvalidAlarmEvent(
            f"alarm {detail.alarm_name!r} watches no SDC metric in namespace {namespace!r}"
        )
    clusters = {m.dimensions.get(contract.CLUSTER_DIMENSION) for m in ours}
    expected = settings.hyperpod_cluster_name
    if clusters != {expected}:
        raise InvalidAlarmEvent(
            f"alarm {detail.alarm_name!r} is for cluster(s) {sorted(map(str, clusters))}, "
            f"this workflow guards {expected!r}"
        )
    names = {m.name for m in ours}
    jobs = {m.dimensions.get(contract.JOB_DIMENSION) for m in ours}
    end = detail.state.timestamp
    start = end - timedelta(seconds=settings.lookback_seconds)
    return Alarm(
        alarm_name=detail.alarm_name,
        alarm_arn=alarm_arn,
        state=detail.state.value,
        reason=detail.state.reason,
        time=clock.iso(end),
        metric_name=names.pop() if len(names) == 1 else None,
        namespace=namespace,
        cluster_name=expected,
        window_start=clock.iso(start),
        window_end=clock.iso(end + timedelta(seconds=GRACE_SECONDS)),
        canary=jobs == {contract.CANARY_JOB},
    )


def belongs_to(alarm: Alarm, job: str) -> bool:
    """The canary's alarm reads only the canary job; every other alarm only training jobs, so
    a canary never joins a real remediation (nor counts against its blast radius)."""
    return (job == contract.CANARY_JOB) == alarm.canary


__all__ = ["GRACE_SECONDS", "alarm_from_event", "belongs_to", "check_source"]
