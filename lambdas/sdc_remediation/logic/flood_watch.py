"""The sweeper's flood watch: tell the on-call when made-up JobNames may be blinding the SDC alarms.

Each SDC alarm is a Metrics Insights query over the job series {ClusterName, JobName} of the
cluster, one contributor per JobName (``sdc_contract.metrics.job_alarm_query``), and any
training pod may put any JobName on its metrics. AWS documents the bounds such an alarm works
within (CloudWatch User Guide, "Metrics Insights quotas",
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/cloudwatch-metrics-insights-limits.html,
and "Limits" of alarms on Metrics Insights queries,
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarm-limits.html):

- it evaluates the latest three hours of data;
- its query returns at most 500 series (``SERIES_LIMIT``; with ``ORDER BY SUM() DESC`` the 500
  highest sums) and processes only the first 10,000 metrics it matches; past either bound the
  alarm's evaluation state is ``PARTIAL_DATA``;
- at most 100 of its contributors are in ALARM at once.

So a pod that puts data under hundreds of made-up JobNames can keep a real job's contributor
out of ALARM, and so can one that keeps a hundred made-up JobNames breaching at once (far
below the series limit: the crowd). The flood alarms (infra's ``SeriesFloodAlarms``) page on many job data points in
one minute; this watch counts what the query matches over its whole three hours, so a slow
flood shows too. Every sweep it lists, per SDC metric, the cluster's series with data in the
past three hours (ListMetrics ``RecentlyActive=PT3H``, at most ``MAX_PAGES_PER_METRIC`` pages
of 500) and counts the job series among them (exactly {ClusterName, JobName}, as the query's
``SCHEMA`` matches; the canary's left out, as its ``WHERE`` does). When the largest count
reaches ``FLOOD_WATCH_FRACTION`` of ``SERIES_LIMIT`` (400 by default), or a listing did not end
within its pages, the alarm may be blind: one message to the topic names the counts, the limit
and the JobNames, their patterns and the nodes with the most series (the likely flooder), at
most once per ``NOTICE_EVERY_SECONDS`` (the ledger's ``due`` claim, ``keys.due``); the sweeper
counts ``series_flood`` and logs a warning on every such sweep.

The crowd: when a metric has at least ``FLOOD_WATCH_FRACTION`` of ``CONTRIBUTORS_IN_ALARM_LIMIT``
job series (80 by default), the watch also reads their latest ``CROWD_WINDOW_SECONDS`` of data
in the alarms' period (``ALARM_PERIOD``; GetMetricData, 500 series a call) and counts, per
period, the job series with a datum above zero: the contributors that may be in ALARM at once
(an upper bound: a datum under the alarm's threshold is counted too). When the largest count
reaches that same 80, the alarm may be crowded, and the same notice says so. Below 80 job series
nothing is read: a cluster of a few jobs pays for no GetMetricData.

It detects and tells; it prevents nothing: a pod may still put any JobName, and a report the
flood kept out of ALARM is started by the backstop (``logic/backstop.py``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sdc_contract as contract
from sdc_contract.metrics import CLUSTER_DIMENSION, JOB_DIMENSION, NODE_DIMENSION

from .. import clock, text
from ..clients.cloudwatch import dimensions_of, positive_points, recent_series
from ..config import Settings
from ..dal.ledger import Ledger
from ..observability import logger
from . import notify
from .periodic import publish_when_due

SERIES_LIMIT = 500
"""A Metrics Insights query returns at most this many series (AWS, "Metrics Insights quotas");
each JobName is one series of an SDC alarm's query."""
CONTRIBUTORS_IN_ALARM_LIMIT = 100
"""At most this many contributors of a Metrics Insights alarm are in ALARM at once (AWS,
"Limits" of alarms on Metrics Insights queries); quoted in the message."""
METRICS_PROCESSED_LIMIT = 10_000
"""A Metrics Insights query processes only the first this many metrics it matches (AWS)."""
CROWD_WINDOW_SECONDS = 1800
"""The crowd watch reads this much of the latest data: two sweep periods (15 minutes each), so a
crowd that began just after one sweep is seen by the next."""
MAX_PAGES_PER_METRIC = 4
"""ListMetrics pages (500 series each) read per SDC metric per sweep: 12 calls at most, and
2,000 series per metric, well past ``SERIES_LIMIT``."""
NOTICE = "series-flood"
"""The ledger's periodic claim (``Ledger.due``) of the flood notice."""
NOTICE_EVERY_SECONDS = 6 * 3600
"""At most one flood notice per this period, however many sweeps see the flood (a flood's
series stay recently active three hours after it stops)."""
TOP = 5
"""JobNames, patterns and nodes named in the notice (the most series first)."""
NAME_CHARS = 80
"""A JobName or node name is a pod's choice: it is shown cut to this many printable characters."""

_DIGITS = re.compile(r"[0-9]+")
_JOB_SERIES = frozenset(contract.JOB_SERIES)
_NODE_SERIES = frozenset(contract.NODE_SERIES)


@dataclass
class FloodWatchResult:
    """What one sweep's flood watch counted, and whether it told the on-call."""

    job_series: dict[str, int] = field(default_factory=dict)
    """Per SDC metric, its recently active job series (what its alarm's query matches)."""
    counted_all: bool = True
    """Every listing ended within its pages (else the counts are lower bounds)."""
    threshold: int = 0
    """The count at which the watch tells (``FLOOD_WATCH_FRACTION`` x ``SERIES_LIMIT``)."""
    at_once: dict[str, int] = field(default_factory=dict)
    """Per SDC metric whose data was read (the crowd watch), the most job series with a datum
    above zero in one alarm period of the latest ``CROWD_WINDOW_SECONDS``."""
    crowd_threshold: int = 0
    """The count of job series with data at once at which the watch tells
    (``FLOOD_WATCH_FRACTION`` x ``CONTRIBUTORS_IN_ALARM_LIMIT``); also the count of job series
    from which a metric's data is read."""
    crowded: bool = False
    """A metric had ``crowd_threshold`` job series with data at once."""
    blind: bool = False
    """A count reached its threshold, or a listing did not end: the alarm may be blind."""
    notified: bool = False
    """This sweep sent the flood notice (False within ``NOTICE_EVERY_SECONDS`` of the last)."""
    top_patterns: list[dict[str, Any]] = field(default_factory=list)
    top_jobs: list[dict[str, Any]] = field(default_factory=list)
    top_nodes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    """Why the watch did not finish (AWS unreachable, throttled, denied); the sweep went on."""

    @property
    def most(self) -> tuple[str, int]:
        """The SDC metric with the most job series, and their count."""
        if not self.job_series:
            return "", 0
        metric = max(self.job_series, key=lambda m: (self.job_series[m], m))
        return metric, self.job_series[metric]

    def as_dict(self) -> dict[str, Any]:
        """The sweeper's JSON answer's ``flood_watch``."""
        return {
            "job_series": dict(sorted(self.job_series.items())),
            "counted_all": self.counted_all,
            "limit": SERIES_LIMIT,
            "threshold": self.threshold,
            "at_once": dict(sorted(self.at_once.items())),
            "contributors_limit": CONTRIBUTORS_IN_ALARM_LIMIT,
            "crowd_threshold": self.crowd_threshold,
            "crowded": self.crowded,
            "blind": self.blind,
            "notified": self.notified,
            "top_patterns": self.top_patterns,
            "top_jobs": self.top_jobs,
            "top_nodes": self.top_nodes,
            "error": self.error,
        }


def flood_watch(settings: Settings, ledger: Ledger) -> FloodWatchResult:
    """Count the SDC alarms' recently active series and tell the on-call when one nears its
    limit (see the module). Raises what its calls raise; the sweeper catches it."""
    cluster = settings.hyperpod_cluster_name
    result = FloodWatchResult(
        threshold=threshold(settings.flood_watch_fraction),
        crowd_threshold=crowd_threshold(settings.flood_watch_fraction),
    )
    job_names: Counter[str] = Counter()
    series_per_job: Counter[str] = Counter()
    series_per_node: Counter[str] = Counter()
    for metric in contract.SDC_ALARM_METRICS:
        listed, more = recent_series(
            settings.metric_namespace, metric, cluster, max_pages=MAX_PAGES_PER_METRIC
        )
        result.counted_all = result.counted_all and not more
        jobs_of_metric: set[str] = set()
        job_series: list[dict[str, Any]] = []
        seen: set[frozenset[tuple[str, str]]] = set()
        for series in listed:
            dims = dimensions_of(series)
            if frozenset(dims.items()) in seen:
                continue  # a series listed twice counts once
            seen.add(frozenset(dims.items()))
            job = dims.get(JOB_DIMENSION)
            if job is None or job == contract.CANARY_JOB or dims.get(CLUSTER_DIMENSION) != cluster:
                continue
            if dims.keys() == _JOB_SERIES:
                jobs_of_metric.add(job)
                job_series.append(series)
            elif dims.keys() == _NODE_SERIES:
                series_per_node[dims[NODE_DIMENSION]] += 1
            else:
                continue  # no SDC alarm nor localize reads it
            series_per_job[job] += 1
        result.job_series[metric] = len(jobs_of_metric)
        job_names.update(jobs_of_metric)
        if len(job_series) >= result.crowd_threshold:
            result.at_once[metric] = most_at_once(job_series, settings.alarm_period_seconds)
    _, most = result.most
    result.crowded = any(n >= result.crowd_threshold for n in result.at_once.values())
    result.blind = most >= result.threshold or result.crowded or not result.counted_all
    if not result.blind:
        return result
    patterns = Counter(job_pattern(job) for job in job_names)
    result.top_patterns = [
        {"pattern": text.printable(p, NAME_CHARS), "job_names": n} for p, n in _top(patterns)
    ]
    result.top_jobs = [
        {"job": text.printable(j, NAME_CHARS), "series": n} for j, n in _top(series_per_job)
    ]
    result.top_nodes = [
        {"node": text.printable(n, NAME_CHARS), "series": c} for n, c in _top(series_per_node)
    ]
    logger.warning("flood watch: an SDC alarm may be blind", extra=result.as_dict())
    subject, body = flood_message(result, settings)
    try:
        result.notified = publish_when_due(
            ledger,
            cluster,
            NOTICE,
            NOTICE_EVERY_SECONDS,
            topic_arn=settings.topic_arn,
            subject=subject,
            message=body,
        )
    except Exception as exc:  # the claim was given back: the next sweep tries again
        logger.exception("flood watch: the notice was not sent")
        result.error = f"notice not sent: {type(exc).__name__}: {text.printable(exc, 300)}"
    return result


def threshold(fraction: float) -> int:
    """The job series count at which the watch tells: ``fraction`` of ``SERIES_LIMIT``, at
    least one."""
    return max(1, math.ceil(fraction * SERIES_LIMIT - 1e-9))


def crowd_threshold(fraction: float) -> int:
    """The count of job series with data at once at which the watch tells: ``fraction`` of
    ``CONTRIBUTORS_IN_ALARM_LIMIT``, at least one."""
    return max(1, math.ceil(fraction * CONTRIBUTORS_IN_ALARM_LIMIT - 1e-9))


def most_at_once(series: list[dict[str, Any]], period: int, now: datetime | None = None) -> int:
    """The most of ``series`` with a datum above zero in one ``period`` of the latest
    ``CROWD_WINDOW_SECONDS``: how many contributors may have been in ALARM at once."""
    end = now or clock.now()
    start = end - timedelta(seconds=CROWD_WINDOW_SECONDS)
    at_once: Counter[datetime] = Counter()
    for _, points in positive_points(series, start, end, period=period):
        at_once.update({at for at, _ in points})  # a series counts once per period
    return max(at_once.values(), default=0)


def job_pattern(job: str) -> str:
    """A JobName with each run of digits as ``*`` (``junk-17`` -> ``junk-*``): made-up names
    are mostly a prefix and a counter, so the flood's names share a pattern."""
    return _DIGITS.sub("*", job)


def _top(counts: Counter[str]) -> list[tuple[str, int]]:
    """The ``TOP`` entries with the most, ties by name (a stable message)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:TOP]


def flood_message(result: FloodWatchResult, settings: Settings) -> tuple[str, str]:
    """The flood notice: subject (fixed text and counts only: the names are a pod's) and body."""
    metric, most = result.most
    counted = "" if result.counted_all else "at least "
    unread = (
        ""
        if result.counted_all
        else (
            f"ListMetrics had more than {MAX_PAGES_PER_METRIC * 500:,} recently active series of "
            "one SDC metric on the cluster, more than the watch reads in a sweep: count them "
            "with `aws cloudwatch list-metrics --recently-active PT3H`. "
        )
    )
    crowd_metric, crowd = max(result.at_once.items(), key=lambda m: (m[1], m[0]), default=("", 0))
    if most >= result.threshold or not result.counted_all or not result.crowded:
        subject = (
            f"{notify.subject_prefix(settings.dry_run)} series flood: {counted}{most} job series "
            f"of {metric} in 3 h, alarm limit {SERIES_LIMIT}"
        )
    else:
        subject = (
            f"{notify.subject_prefix(settings.dry_run)} series flood: {crowd} job series of "
            f"{crowd_metric} at once, {CONTRIBUTORS_IN_ALARM_LIMIT} in ALARM max"
        )
    crowded = (
        f"{crowd} job series of {crowd_metric} had data in one alarm period of the past "
        f"{CROWD_WINDOW_SECONDS // 60} minutes (the watch tells at {result.crowd_threshold}): "
        "that many contributors may be in ALARM at once. "
        if result.crowded
        else ""
    )
    body = {
        "transition": "series_flood",
        "summary": (
            f"The SDC alarm on {metric} matched {counted}{most} recently active job series "
            f"(JobNames) of cluster {settings.hyperpod_cluster_name} in the past three hours; "
            f"the flood watch tells at {result.threshold} ({settings.flood_watch_fraction:g} of "
            f"{SERIES_LIMIT}). {crowded}{unread}A Metrics Insights alarm's query returns at most {SERIES_LIMIT} "
            f"series and processes the first {METRICS_PROCESSED_LIMIT:,} metrics, and at most "
            f"{CONTRIBUTORS_IN_ALARM_LIMIT} contributors are in ALARM at once: made-up JobNames "
            "may be keeping a real job's finding out of ALARM. Find the pod that puts them (the "
            "patterns, JobNames and nodes below have the most series) and stop it. Meanwhile the "
            "sweeper's backstop starts the workflow for reports no alarm took up (15 to 30 "
            f"minutes late). This notice comes at most once every "
            f"{NOTICE_EVERY_SECONDS // 3600} hours while the flood lasts."
        ),
        "cluster": settings.hyperpod_cluster_name,
        "namespace": settings.metric_namespace,
        "job_series": dict(sorted(result.job_series.items())),
        "counted_all": result.counted_all,
        "limit": SERIES_LIMIT,
        "threshold": result.threshold,
        "at_once": dict(sorted(result.at_once.items())),
        "contributors_limit": CONTRIBUTORS_IN_ALARM_LIMIT,
        "crowd_threshold": result.crowd_threshold,
        "top_job_name_patterns": result.top_patterns,
        "top_job_names": result.top_jobs,
        "top_nodes": result.top_nodes,
    }
    return subject, json.dumps(body, indent=2)


__all__ = [
    "CONTRIBUTORS_IN_ALARM_LIMIT",
    "CROWD_WINDOW_SECONDS",
    "MAX_PAGES_PER_METRIC",
    "METRICS_PROCESSED_LIMIT",
    "NOTICE",
    "NOTICE_EVERY_SECONDS",
    "SERIES_LIMIT",
    "FloodWatchResult",
    "crowd_threshold",
    "flood_message",
    "flood_watch",
    "job_pattern",
    "most_at_once",
    "threshold",
]
