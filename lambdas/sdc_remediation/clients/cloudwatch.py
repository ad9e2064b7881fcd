"""CloudWatch metrics: the per-node series localize lists and reads, the series the sweeper's
flood watch counts (and, in a crowd, reads), the data the canary puts, and whether an alarm changed state."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sdc_contract.metrics import CLUSTER_DIMENSION, JOB_DIMENSION

from .. import aws

GET_METRIC_DATA_QUERIES = 500
"""GetMetricData takes at most this many queries per request."""


def dimensions_of(metric: dict[str, Any]) -> dict[str, str]:
    """A ListMetrics metric's dimensions as a name -> value mapping."""
    return {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}


RECENTLY_ACTIVE = "PT3H"
"""ListMetrics' ``RecentlyActive``, its only valid value: series with data points in the past
three hours (AWS: an approximation, a series may show up to about 50 minutes longer)."""


def _series_pages(
    namespace: str,
    name: str,
    cluster: str,
    *,
    job: str | None = None,
    recently_active: bool = False,
) -> Iterator[dict[str, Any]]:
    """ListMetrics' pages (at most 500 series each) of ``name``'s series in ``namespace`` with
    this cluster's ClusterName (and ``job``'s JobName when given), any other dimensions; lazily,
    so a caller may stop after a few. The caller wraps the iteration in ``aws.aws_errors``."""
    dimensions = [{"Name": CLUSTER_DIMENSION, "Value": cluster}]
    if job is not None:
        dimensions.append({"Name": JOB_DIMENSION, "Value": job})
    request: dict[str, Any] = {"Namespace": namespace, "MetricName": name, "Dimensions": dimensions}
    if recently_active:
        request["RecentlyActive"] = RECENTLY_ACTIVE
    yield from aws.client("cloudwatch").get_paginator("list_metrics").paginate(**request)


def list_series(
    namespace: str, metric_names: Sequence[str], cluster: str, *, job: str | None = None
) -> list[dict[str, Any]]:
    """Every series of ``metric_names`` in ``namespace`` with this cluster's ClusterName (and
    ``job``'s JobName when given), any other dimensions, as ListMetrics returns them."""
    series: list[dict[str, Any]] = []
    with aws.aws_errors("cloudwatch:ListMetrics"):
        for name in metric_names:
            for page in _series_pages(namespace, name, cluster, job=job):
                series.extend(page.get("Metrics", []))
    return series


def recent_series(
    namespace: str, name: str, cluster: str, *, max_pages: int
) -> tuple[list[dict[str, Any]], bool]:
    """The series of ``name`` in ``namespace`` with this cluster's ClusterName that had data in
    the past three hours (``RECENTLY_ACTIVE``), any other dimensions, from at most
    ``max_pages`` pages of ListMetrics; and whether more were left unread."""
    series: list[dict[str, Any]] = []
    with aws.aws_errors("cloudwatch:ListMetrics"):
        for read, page in enumerate(
            _series_pages(namespace, name, cluster, recently_active=True), start=1
        ):
            series.extend(page.get("Metrics", []))
            if read >= max_pages:
                return series, bool(page.get("NextToken"))
    return series, False


def positive_points(
    series: Sequence[dict[str, Any]], start: datetime, end: datetime, *, period: int = 60
) -> Iterator[tuple[dict[str, Any], list[tuple[datetime, float]]]]:
    """Each series with the (period start, value) points above zero of its per-``period``
    Maximum between ``start`` and ``end`` (GetMetricData MetricStat, in batches of
    ``GET_METRIC_DATA_QUERIES``); series without one are left out."""
    cw = aws.client("cloudwatch")
    for offset in range(0, len(series), GET_METRIC_DATA_QUERIES):
        batch = series[offset : offset + GET_METRIC_DATA_QUERIES]
        queries = [
            {
                "Id": f"m{i}",
                "MetricStat": {"Metric": metric, "Period": period, "Stat": "Maximum"},
                "ReturnData": True,
            }
            for i, metric in enumerate(batch)
        ]
        with aws.aws_errors("cloudwatch:GetMetricData"):
            pages = cw.get_paginator("get_metric_data").paginate(
                MetricDataQueries=queries, StartTime=start, EndTime=end
            )
            for page in pages:
                for result in page.get("MetricDataResults", []):
                    points = [
                        (at, value)
                        for at, value in zip(
                            result.get("Timestamps", []), result.get("Values", []), strict=False
                        )
                        if value > 0
                    ]
                    if points:
                        yield batch[int(result["Id"][1:])], points


def positive_values(
    series: Sequence[dict[str, Any]], start: datetime, end: datetime, *, period: int = 60
) -> Iterator[tuple[dict[str, Any], list[float]]]:
    """Each series with the values above zero of its per-``period`` Maximum between ``start``
    and ``end`` (``positive_points`` without the times); series without one are left out."""
    for metric, points in positive_points(series, start, end, period=period):
        yield metric, [value for _, value in points]


def put_metric_data(namespace: str, data: Sequence[dict[str, Any]]) -> None:
    """PutMetricData of ``data`` (entries as the API takes them) in ``namespace``."""
    with aws.aws_errors("cloudwatch:PutMetricData"):
        aws.client("cloudwatch").put_metric_data(Namespace=namespace, MetricData=list(data))


def changed_since(alarm_name: str, started: datetime, states: Sequence[str]) -> bool:
    """Whether ``alarm_name`` is in one of ``states`` and entered it at or after ``started``
    (DescribeAlarms keeps the state and when it last changed)."""
    with aws.aws_errors("cloudwatch:DescribeAlarms"):
        alarms = aws.client("cloudwatch").describe_alarms(AlarmNames=[alarm_name])["MetricAlarms"]
    return any(a["StateUpdatedTimestamp"] >= started and a["StateValue"] in states for a in alarms)


__all__ = [
    "RECENTLY_ACTIVE",
    "changed_since",
    "dimensions_of",
    "list_series",
    "positive_points",
    "positive_values",
    "put_metric_data",
    "recent_series",
]
