"""Localize: from an alarm to the nodes it names, with the evidence, or to "ambiguous".

Sources, all in the alarm window [alarm time - LOOKBACK_SECONDS, alarm time + grace]:
- the per-node series {ClusterName, JobName, NodeName} with non-zero values (ListMetrics, then
  GetMetricData MetricStat): which nodes the agent named;
- the ``sdc.alarm/v1`` reports in ``/sdc/<ClusterName>`` (FilterLogEvents): who, why, when;
- the Kubernetes API, where a report names a rank's pod (in TRAINING_NAMESPACE only);
- HyperPod's DescribeClusterNode: instance id -> instance group, and proof the instance exists.

Reports are written by training pods and are not trusted: every suspect's node name and instance
id must be well-formed and agree with each other (HyperPod names an instance's node
``hyperpod-<instance id>``), the instance must be in this HyperPod cluster, and a pod the report
names must be the job's (in TRAINING_NAMESPACE) and run on that node. Anything else is
``UntrustedReport`` (or ``InstanceNotInCluster``) before any node is touched. The alarm event
itself must come from this stack's account and one of its alarms (ALARM_ACCOUNT_ID,
ALARM_NAME_PREFIX). Each instance is one suspect, whatever the reports say.

The suspects carry what the later steps need, bounded: a few divergent tensor names and a count,
at most ``MAX_RANKS_PER_SUSPECT`` ranks, and where the full report is in CloudWatch Logs.

CloudWatch is eventually consistent, so "a node has a series but no report names it yet" and
"no report yet" are ``ReportNotYetVisible`` (retried), never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from . import aws, canary, clock, contract, hyperpod
from .config import Settings
from .errors import (
    InstanceNotInCluster,
    InvalidAlarmEvent,
    NodeNotFound,
    ReportNotYetVisible,
    UntrustedReport,
)
from .hyperpod import NODE_NAME_PREFIX, is_instance_id
from .kube import KubeApi, is_subdomain_name
from .models import (
    ALARM_SCHEMA,
    MAX_TENSOR_NAME_CHARS,
    MAX_TENSOR_NAMES,
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
HYPERPOD_NODE_PREFIX = NODE_NAME_PREFIX  # kept for importers of the old name
ARN_PARTITIONS = ("aws", "aws-cn", "aws-us-gov")
MAX_RANKS_PER_SUSPECT = 8
"""Ranks listed per suspect in the workflow state (a GPU node runs 8; the report has them all,
and ``rank_count`` says how many the reports named on the node)."""


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
    jobs = {m.dimensions.get("JobName") for m in ours}
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
                    if not belongs_to(alarm, key[0]):
                        continue
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
    """The ``sdc.alarm/v1`` reports of this cluster in the alarm window, oldest first.

    A report that claims the schema but does not validate (an empty ``suspect_window``, a rank
    key that is not a number) is ``UntrustedReport``: acting on part of it is not an option, and
    skipping it would hide the node it names.
    """
    start = int(clock.parse_iso(alarm.window_start).timestamp() * 1000)
    end = int(clock.parse_iso(alarm.window_end).timestamp() * 1000)
    reports = []
    for event in _filter_events(group, f'"{ALARM_SCHEMA}"', jobs, start, end):
        report = _parse_event(event, Report, ALARM_SCHEMA)
        if (
            report is not None
            and report.cluster == alarm.cluster_name
            and belongs_to(alarm, report.job)
        ):
            reports.append(report.model_copy(update={"log_stream": event.get("logStreamName")}))
    return sorted(reports, key=lambda r: r.time)


def latest_rank_map(group: str, job: str) -> RankMap | None:
    """The newest ``sdc.rankmap/v1`` map of a job (written once at job start).

    A large job's map arrives as several events of the same ``time``, each a part of the ranks
    (the agent splits it under the 1 MiB event limit): all parts of the newest map are merged.
    """
    maps = [
        _parse_event(e, RankMap, RANKMAP_SCHEMA)
        for e in _filter_events(group, f'"{RANKMAP_SCHEMA}"', [job], None, None)
    ]
    valid = [m for m in maps if m is not None and m.job == job]
    if not valid:
        return None
    newest = max(m.time for m in valid)
    ranks: dict[str, RankInfo] = {}
    for part in valid:
        if part.time == newest:
            ranks.update(part.ranks)
    return valid[0].model_copy(update={"time": newest, "ranks": ranks})


def _parse_event(event: dict[str, Any], model: type[Report] | type[RankMap], schema: str) -> Any:
    try:
        body = json.loads(event.get("message", ""))
    except ValueError:
        return None  # not JSON: another writer's line in the stream, not ours to act on
    if not isinstance(body, dict) or body.get("schema") != schema:
        return None
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UntrustedReport(
            f"{schema} event in stream {event.get('logStreamName')!r} at "
            f"{event.get('timestamp')} is malformed: {first['msg']}",
            field=where,
        ) from exc


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

    def _kube_api(self) -> KubeApi:
        if self._kube is None:
            self._kube = self._kube_factory()
        return self._kube

    def verified_node(self, info: RankInfo, rank: int, job: str) -> tuple[str, str]:
        """(node name, instance id) of a rank, each checked against the other, the pod and
        HyperPod; ``UntrustedReport`` names the field that does not hold."""
        where = f"job {job} rank {rank}"
        node, instance_id, pod = info.node_name, info.instance_id, info.pod_name
        if node is not None and not is_subdomain_name(node):
            raise UntrustedReport(
                f"{where}: {node!r} is not a Kubernetes node name", field=f"ranks.{rank}.node_name"
            )
        if instance_id is not None and not is_instance_id(instance_id):
            raise UntrustedReport(
                f"{where}: {instance_id!r} is not an instance id",
                field=f"ranks.{rank}.instance_id",
            )
        if pod is not None:
            node = self._verified_pod_node(pod, node, where, rank)
        if node is None:
            raise NodeNotFound(
                f"{where}: neither the report nor the rank map gives its node or pod"
            )
        if instance_id is None:
            instance_id = node.removeprefix(NODE_NAME_PREFIX)
            if not node.startswith(NODE_NAME_PREFIX) or not is_instance_id(instance_id):
                raise UntrustedReport(
                    f"{where}: node {node!r} is not a HyperPod node (hyperpod-<instance id>)",
                    field=f"ranks.{rank}.node_name",
                )
        elif node != hyperpod.node_name_of(instance_id):
            raise UntrustedReport(
                f"{where}: the report puts instance {instance_id} on node {node!r}, but HyperPod "
                f"names that instance's node {hyperpod.node_name_of(instance_id)!r}",
                field=f"ranks.{rank}.instance_id",
            )
        return node, instance_id

    def _verified_pod_node(self, pod: str, node: str | None, where: str, rank: int) -> str:
        """The node the job's pod runs on; it must be the node the report names, if any."""
        namespace = self._settings.training_namespace
        if not is_subdomain_name(pod):
            raise UntrustedReport(
                f"{where}: {pod!r} is not a pod name", field=f"ranks.{rank}.pod_name"
            )
        try:
            pod_node = self._kube_api().node_of_pod(pod, namespace)
        except NodeNotFound as exc:
            if node is None:
                raise NodeNotFound(
                    f"{where}: no scheduled pod {pod!r} in namespace {namespace!r} "
                    "(TRAINING_NAMESPACE) to find the rank's node by"
                ) from exc
            # The job's pod may be gone by now (a job that stopped on the alarm); the node and
            # instance are still checked against each other and against HyperPod.
            logger.info("reported pod no longer exists", extra={"pod": pod, "node": node})
            return node
        if node is not None and node != pod_node:
            raise UntrustedReport(
                f"{where}: the report puts pod {namespace}/{pod} on node {node!r}, Kubernetes "
                f"schedules it on {pod_node!r}",
                field=f"ranks.{rank}.node_name",
            )
        return pod_node

    def instance_group(self, instance_id: str) -> str:
        """The instance's group; ``InstanceNotInCluster`` when HyperPod does not know it."""
        if instance_id not in self._groups:
            cluster = self._settings.hyperpod_cluster_name
            node = hyperpod.require_node(cluster, instance_id)
            group = node.get("InstanceGroupName")
            if not group:
                raise InstanceNotInCluster(
                    f"instance {instance_id} has no instance group in {cluster}"
                )
            self._groups[instance_id] = group
        return self._groups[instance_id]


def _tensor_names(report: Report) -> list[str]:
    """A few of the report's divergent tensors, for the message (the report has them all)."""
    return [name[:MAX_TENSOR_NAME_CHARS] for name in report.divergent_tensors[:MAX_TENSOR_NAMES]]


def suspects_from_reports(
    reports: list[Report], settings: Settings, kube: Callable[[], KubeApi]
) -> list[Suspect]:
    """One suspect per instance named by any report (the newest report's evidence wins; the
    ranks of every report naming the instance are merged)."""
    resolver = _Resolver(settings, kube)
    by_instance: dict[str, Suspect] = {}
    for report in reports:  # oldest first, so later reports overwrite the evidence
        if report.job == contract.CANARY_JOB or report.canary_run is not None:
            suspect = _canary_suspect(report, settings)
            by_instance[suspect.instance_id] = suspect
            continue
        canary.refuse_reserved_node(report)
        for rank in sorted(set(report.suspects or [])):
            info = resolver.rank_info(report, rank)
            node, instance_id = resolver.verified_node(info, rank, report.job)
            group = resolver.instance_group(instance_id)
            previous = by_instance.get(instance_id)
            ranks = dict(previous.ranks) if previous else {}
            named = (previous.rank_count if previous else 0) + (str(rank) not in ranks)
            if len(ranks) < MAX_RANKS_PER_SUSPECT or str(rank) in ranks:
                # Where the rank runs is the suspect's node; only what tells ranks apart stays.
                ranks[str(rank)] = RankInfo(gpu_uuid=info.gpu_uuid, local_rank=info.local_rank)
            by_instance[instance_id] = Suspect(
                node_name=node,
                instance_id=instance_id,
                instance_group=group,
                job=report.job,
                ranks=ranks,
                rank_count=named,
                check=report.check,
                verdict=verdict_for(report, rank),
                step=report.step,
                suspect_window=list(report.suspect_window),
                last_audit_pass=report.last_audit_pass,
                last_weight_check_pass=report.last_weight_check_pass,
                divergent_tensors=_tensor_names(report),
                divergent_tensor_count=len(report.divergent_tensors),
                nonfinite_count=len(report.nonfinite),
                report_log_group=settings.report_log_group,
                report_log_stream=report.log_stream,
            )
    return sorted(by_instance.values(), key=lambda s: s.node_name)


def _canary_suspect(report: Report, settings: Settings) -> Suspect:
    """The reserved canary node as a suspect, for a report ``canary.verify_report`` accepts
    (it is no HyperPod instance: nothing asks HyperPod or Kubernetes about it)."""
    run_id = canary.verify_report(report, settings)
    ranks = sorted(set(report.suspects or []))
    return Suspect(
        node_name=contract.CANARY_NODE_NAME,
        instance_id=contract.CANARY_INSTANCE_ID,
        instance_group=contract.CANARY_INSTANCE_GROUP,
        job=report.job,
        ranks={str(rank): RankInfo() for rank in ranks[:MAX_RANKS_PER_SUSPECT]},
        rank_count=len(ranks),
        check=report.check,
        verdict=verdict_for(report, ranks[0]) if ranks else "named",
        step=report.step,
        suspect_window=list(report.suspect_window),
        report_log_group=settings.report_log_group,
        report_log_stream=report.log_stream,
        canary_run=run_id,
    )


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
    for suspect in suspects:
        if suspect.canary_run is not None:
            # The alarm fired and the rule started this execution: localize is the first of
            # ours to see either, so it writes them on the run with its own step.
            for step in ("alarm", "workflow", "localized"):
                canary.reach(settings, suspect, step)
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
