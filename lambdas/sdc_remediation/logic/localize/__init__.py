"""Localize: from an alarm to the nodes it names, with the evidence, or to "ambiguous".

Sources, all in the alarm window [alarm time - LOOKBACK_SECONDS, alarm time + grace]
(``evidence``):
- the per-node series {ClusterName, JobName, NodeName} with non-zero values (ListMetrics, then
  GetMetricData MetricStat): which nodes the agent named;
- the ``sdc.alarm/v1`` reports in ``/sdc/<ClusterName>`` (FilterLogEvents): who, why, when;
- the Kubernetes API, where a report names a rank's pod (in TRAINING_NAMESPACE only);
- HyperPod's DescribeClusterNode: instance id -> instance group, and proof the instance exists.

The modules, in the order localize uses them:
- ``alarm``: the alarm event must come from this stack's account and one of its alarms
  (ALARM_ACCOUNT_ID, ALARM_NAME_PREFIX), on an SDC metric of this cluster;
- ``evidence``: the series and the reports (one report parsed at a time: ``parse_event``);
- ``canary``: a canary report names the reserved node alone and an open run; a training report
  never names the reserved node;
- ``resolve``: rank -> node -> instance -> instance group, every claim of the report checked
  (reports are written by training pods and are not trusted: ``UntrustedReport``,
  ``InstanceNotInCluster`` or ``NodeNotFound`` before any node is touched);
- ``suspects``: one suspect per instance, whatever the reports say, bounded.

CloudWatch is eventually consistent, so "a node has a series but no report names it yet" and
"no report yet" are ``ReportNotYetVisible`` (retried), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable

import sdc_contract as contract

from ...clients.kube import KubeApi
from ...config import Settings
from ...errors import ReportNotYetVisible
from ...models import AlarmStateChangeEvent, LocalizeResult
from ...observability import logger
from ...targets import target_for
from .alarm import alarm_from_event
from .evidence import nonzero_node_series, read_reports
from .suspects import suspects_from_reports, verdict_for


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
            f"no {contract.ALARM_SCHEMA} report in {settings.report_log_group} between "
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
        target_for(suspect).localized(settings)
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


__all__ = ["localize", "verdict_for"]
