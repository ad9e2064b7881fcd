"""Localize: from an alarm to the nodes it names, with the evidence, or to "ambiguous".

Sources, all in the alarm window [alarm time - LOOKBACK_SECONDS, alarm time + grace]:
- the per-node series {ClusterName, JobName, NodeName} with non-zero values (ListMetrics, then
  GetMetricData MetricStat): which nodes the agent named;
- the ``sdc.alarm/v1`` reports in ``/sdc/<ClusterName>`` (FilterLogEvents): who, why, when;
- the Kubernetes API, only when a report has a rank's pod but not its node;
- HyperPod's DescribeClusterNode: instance id -> instance group, and proof the instance exists.

CloudWatch is eventually consistent, so "a node has a series but no report names it yet" and
"no report yet" are ``ReportNotYetVisible`` (retried), never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import botocore.exceptions
from pydantic import ValidationError

from . import aws, clock
from .config import Settings
from .errors import InstanceNotInCluster, InvalidAlarmEvent, NodeNotFound, ReportNotYetVisible
from .kube import KubeApi
from .models import (
    ALARM_SCHEMA,
    RANKMAP_SCHEMA,
    SDC_METRICS,
    Alarm,
    AlarmStateChangeEvent,
    LocalizeResult,
    RankInfo,
    RankMap,
    Report,
    Suspect,
)
from .observability import logger

# The agent writes the report right after the metric; the alarm fires on the metric. A little
# grace after the alarm time catches a report that a retrying sender delivered a bit late.
GRACE_SECONDS = 120
NODE_DIMENSIONS = {"ClusterName", "JobName", "NodeName"}
HYPERPOD_NODE_PREFIX = "hyperpod-"


def alarm_from_event(event: AlarmStateChangeEvent, settings: Settings) -> Alarm:
    """Normalise the alarm event; reject non-ALARM states, foreign metrics and other clusters."""
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
        and q.metric_stat.metric.name in SDC_METRICS
    ]
    if not ours:
        raise InvalidAlarmEvent(
            f"alarm {detail.alarm_name!r} watches no SDC metric in namespace {namespace!r}"
        )
    clusters = {m.dimensions.get("ClusterName") for m in ours}
    expected = settings.hyperpod_cluster_name
    if clusters != {expected}:
        raise InvalidAlarmEvent(
            f"alarm {detail.alarm_name!r} is for cluster(s) {sorted(map(str, clusters))}, "
            f"this workflow guards {expected!r}"
        )
    names = {m.name for m in ours}
    end = detail.state.timestamp
    start = end - timedelta(seconds=settings.lookback_seconds)
    return Alarm(
        alarm_name=detail.alarm_name,
        alarm_arn=event.resources[0] if event.resources else "",
        state=detail.state.value,
        reason=detail.state.reason,
        time=clock.iso(end),
        metric_name=names.pop() if len(names) == 1 else None,
        namespace=namespace,
        cluster_name=expected,
        window_start=clock.iso(start),
        window_end=clock.iso(end + timedelta(seconds=GRACE_SECONDS)),
    )


def nonzero_node_series(alarm: Alarm) -> dict[tuple[str, str], float]:
    """(job, node) -> the largest value of its per-node series in the alarm window, if > 0."""
    cw = aws.client("cloudwatch")
    metric_names = [alarm.metric_name] if alarm.metric_name else list(SDC_METRICS)
    series: list[dict[str, Any]] = []
    with aws.aws_errors("cloudwatch:ListMetrics"):
        for name in metric_names:
            pages = cw.get_paginator("list_metrics").paginate(
                Namespace=alarm.namespace,
                MetricName=name,
                Dimensions=[{"Name": "ClusterName", "Value": alarm.cluster_name}],
            )
            for page in pages:
                for metric in page.get("Metrics", []):
                    dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
                    if set(dims) == NODE_DIMENSIONS:
                        series.append(metric)
    if not series:
        return {}
    start, end = clock.parse_iso(alarm.window_start), clock.parse_iso(alarm.window_end)
    found: dict[tuple[str, str], float] = {}
    for offset in range(0, len(series), 500):  # GetMetricData takes at most 500 queries
        batch = series[offset : offset + 500]
        queries = [
            {
                "Id": f"m{i}",
                "MetricStat": {"Metric": metric, "Period": 60, "Stat": "Maximum"},
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
                    values = [v for v in result.get("Values", []) if v > 0]
                    if not values:
                        continue
                    metric = batch[int(result["Id"][1:])]
                    dims = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
                    key = (dims["JobName"], dims["NodeName"])
                    found[key] = max(found.get(key, 0.0), *values)
    return found


def _filter_events(
    group: str,
    pattern: str,
    streams: Iterable[str] | None,
    start_ms: int | None,
    end_ms: int | None,
) -> list[dict[str, Any]]:
    logs = aws.client("logs")
    kwargs: dict[str, Any] = {"logGroupName": group, "filterPattern": pattern}
    names = sorted(set(streams or []))
    if names:
        kwargs["logStreamNames"] = names[:100]  # the API's limit; one stream per job
    if start_ms is not None:
        kwargs["startTime"] = start_ms
    if end_ms is not None:
        kwargs["endTime"] = end_ms
    events: list[dict[str, Any]] = []
    with aws.aws_errors("logs:FilterLogEvents"):
        try:
            for page in logs.get_paginator("filter_log_events").paginate(**kwargs):
                events.extend(page.get("events", []))
        except logs.exceptions.ResourceNotFoundException:
            raise ReportNotYetVisible(f"log group {group} does not exist (yet)") from None
    return events


def read_reports(alarm: Alarm, group: str, jobs: Iterable[str] | None = None) -> list[Report]:
    """The ``sdc.alarm/v1`` reports of this cluster in the alarm window, oldest first."""
    start = int(clock.parse_iso(alarm.window_start).timestamp() * 1000)
    end = int(clock.parse_iso(alarm.window_end).timestamp() * 1000)
    reports = []
    for event in _filter_events(group, f'"{ALARM_SCHEMA}"', jobs, start, end):
        report = _parse_event(event, Report)
        if report is not None and report.cluster == alarm.cluster_name:
            reports.append(report)
    return sorted(reports, key=lambda r: r.time)


def latest_rank_map(group: str, job: str) -> RankMap | None:
    """The newest ``sdc.rankmap/v1`` event of a job (written once at job start)."""
    maps = [
        _parse_event(e, RankMap)
        for e in _filter_events(group, f'"{RANKMAP_SCHEMA}"', [job], None, None)
    ]
    valid = [m for m in maps if m is not None]
    return max(valid, key=lambda m: m.time) if valid else None


def _parse_event(event: dict[str, Any], model: type[Report] | type[RankMap]) -> Any:
    try:
        return model.model_validate(json.loads(event.get("message", "")))
    except (ValueError, ValidationError) as exc:
        # Other events in the stream (or a malformed one) are not ours to act on.
        logger.debug("skipping log event", extra={"error": str(exc)[:200]})
        return None


def verdict_for(report: Report, rank: int) -> str:
    """How the report came to name ``rank``: the confirmation's kind, or the check's reason."""
    kinds = [v.kind for v in report.verdicts if v.suspect == rank]
    if kinds:
        return kinds[-1]
    if rank in report.culprits:
        return "culprit"
    if rank in report.nonfinite:
        return "nonfinite"
    if report.check == "weights":
        return "weights_minority"
    return "named"


class _Resolver:
    """rank -> node (report, rank map, pod via Kubernetes) -> instance -> instance group."""

    def __init__(self, settings: Settings, kube: Callable[[], KubeApi]) -> None:
        self._settings = settings
        self._kube_factory = kube
        self._kube: KubeApi | None = None
        self._rank_maps: dict[str, RankMap | None] = {}
        self._groups: dict[str, str] = {}

    def rank_info(self, report: Report, rank: int) -> RankInfo:
        info = report.ranks.get(str(rank)) or RankInfo()
        if info.node_name and info.instance_id:
            return info
        if report.job not in self._rank_maps:
            self._rank_maps[report.job] = latest_rank_map(
                self._settings.report_log_group, report.job
            )
        mapped = self._rank_maps[report.job]
        fallback = mapped.ranks.get(str(rank)) if mapped else None
        if fallback is None:
            return info
        merged = fallback.model_dump() | {
            k: v for k, v in info.model_dump().items() if v is not None
        }
        return RankInfo.model_validate(merged)

    def node_name(self, info: RankInfo, rank: int, job: str) -> str:
        if info.node_name:
            return info.node_name
        if not info.pod_name:
            raise NodeNotFound(
                f"job {job} rank {rank}: neither the report nor the rank map gives its node or pod"
            )
        if self._kube is None:
            self._kube = self._kube_factory()
        return self._kube.node_of_pod(info.pod_name)

    def instance_group(self, instance_id: str) -> str:
        if instance_id not in self._groups:
            cluster = self._settings.hyperpod_cluster_name
            sm = aws.client("sagemaker")
            with aws.aws_errors("sagemaker:DescribeClusterNode"):
                try:
                    node = sm.describe_cluster_node(ClusterName=cluster, NodeId=instance_id)
                except botocore.exceptions.ClientError as exc:
                    # HyperPod answers ResourceNotFound, moto ValidationException ("Could not
                    # find node"): either way the instance is not in this cluster.
                    if aws.error_code(exc) in ("ResourceNotFound", "ValidationException"):
                        raise InstanceNotInCluster(
                            f"instance {instance_id} is not a node of HyperPod cluster {cluster}: {exc}"
                        ) from exc
                    raise
            group = node["NodeDetails"].get("InstanceGroupName")
            if not group:
                raise InstanceNotInCluster(
                    f"instance {instance_id} has no instance group in {cluster}"
                )
            self._groups[instance_id] = group
        return self._groups[instance_id]


def suspects_from_reports(
    reports: list[Report], settings: Settings, kube: Callable[[], KubeApi]
) -> list[Suspect]:
    """One suspect per node named by any report (the newest report's evidence wins)."""
    resolver = _Resolver(settings, kube)
    by_node: dict[str, Suspect] = {}
    for report in reports:  # oldest first, so later reports overwrite the evidence
        for rank in report.suspects or []:
            info = resolver.rank_info(report, rank)
            node = resolver.node_name(info, rank, report.job)
            instance_id = info.instance_id or node.removeprefix(HYPERPOD_NODE_PREFIX)
            ranks = dict(by_node[node].ranks) if node in by_node else {}
            ranks[str(rank)] = info.model_copy(
                update={"node_name": node, "instance_id": instance_id}
            )
            by_node[node] = Suspect(
                node_name=node,
                instance_id=instance_id,
                instance_group=resolver.instance_group(instance_id),
                job=report.job,
                ranks=ranks,
                check=report.check,
                verdict=verdict_for(report, rank),
                step=report.step,
                suspect_window=list(report.suspect_window),
                last_audit_pass=report.last_audit_pass,
                last_weight_check_pass=report.last_weight_check_pass,
                divergent_tensors=report.divergent_tensors,
            )
    return sorted(by_node.values(), key=lambda s: s.node_name)


def localize(
    event: AlarmStateChangeEvent, settings: Settings, kube: Callable[[], KubeApi]
) -> LocalizeResult:
    """The localize step: the alarm, the suspects it names, or ``ambiguous``."""
    alarm = alarm_from_event(event, settings)
    series = nonzero_node_series(alarm)
    jobs = {job for job, _ in series}
    reports = read_reports(alarm, settings.report_log_group, jobs or None)
    if not reports:
        raise ReportNotYetVisible(
            f"no {ALARM_SCHEMA} report in {settings.report_log_group} between "
            f"{alarm.window_start} and {alarm.window_end}"
        )
    suspects = suspects_from_reports(reports, settings, kube)
    named = {s.node_name for s in suspects}
    # A node a visible report mentions without blaming it (e.g. a non-finite rank whose batch a
    # third GPU also failed on: bad data, not a GPU) is explained, not missing: waiting for a
    # report naming it would only retry until the workflow gives up.
    mentioned = {info.node_name for r in reports for info in r.ranks.values() if info.node_name}
    unexplained = sorted(node for _, node in series if node not in named | mentioned)
    if unexplained:
        raise ReportNotYetVisible(
            f"node(s) {unexplained} have non-zero SDC series but no visible report names them yet"
        )
    logger.info(
        "localized",
        extra={
            "alarm": alarm.alarm_name,
            "reports": len(reports),
            "suspects": sorted(named),
            "series_nodes": sorted(node for _, node in series),
        },
    )
    return LocalizeResult(
        alarm=alarm, suspects=suspects, ambiguous=not suspects, reports=len(reports)
    )
