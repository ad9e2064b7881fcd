"""Localize: from an alarm to the nodes it names, with the evidence, or to "ambiguous".

Sources, all in the alarm window [alarm time - LOOKBACK_SECONDS, alarm time + grace]
(``evidence``), for the job the alarm's contributor names only (one job's data never decides
another job's remediation):
- the job's per-node series {ClusterName, JobName, NodeName} with non-zero values
  (ListMetrics, then GetMetricData MetricStat): which nodes the agent named;
- the job's ``sdc.alarm/v1`` reports in ``/sdc/<ClusterName>`` (FilterLogEvents), parsed and
  checked one at a time: who, why, when;
- the Kubernetes API, in TRAINING_NAMESPACE only: the pod a report names, and the job's pods
  on each named node (``JOB_LABEL`` = the report's job, running or ended within the lookback),
  which corroborate that the job ran there;
- HyperPod's DescribeClusterNode: instance id -> instance group, and proof the instance exists.

The modules, in the order localize uses them:
- ``alarm``: the alarm event must come from this stack's account and one of its alarms
  (ALARM_ACCOUNT_ID, ALARM_NAME_PREFIX), on an SDC metric of this cluster;
- ``evidence``: the series and the reports (one report parsed at a time: ``parse_event``);
- ``canary``: a canary report names the reserved node alone and an open run; a training report
  never names the reserved node;
- ``resolve``: rank -> node -> instance -> instance group, every claim of the report checked
  and the node corroborated by a pod of the job (reports are written by training pods and are
  not trusted: a claim that fails is refused on its own, ``UntrustedReport``,
  ``InstanceNotInCluster`` or ``NodeNotFound``, and no node is touched for it);
- ``suspects``: one suspect per instance, whatever the reports say, bounded.

CloudWatch is eventually consistent: "no report yet" is ``ReportNotYetVisible`` (the step is
retried), and "a node has a series but no report names it yet" is a ``pending`` node, looked
for again in its own Map item (``localize_late``, retried, bounded), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable

import sdc_contract as contract
from sdc_contract.names import NODE_NAME_PREFIX, is_instance_id, is_job_name, is_subdomain_name

from ... import errors
from ...clients import hyperpod
from ...clients.kube import KubeApi
from ...config import Settings
from ...errors import ReportNotYetVisible, UntrustedReport
from ...models import (
    AlarmStateChangeEvent,
    LateInput,
    LocalizeResult,
    PendingNode,
    Refusal,
    Suspect,
)
from ...models.state import MAX_REFUSALS, MAX_SUSPECTS
from ...observability import logger
from ...targets import target_for
from .alarm import alarm_from_event
from .evidence import nonzero_node_series, read_reports, refusal
from .streams import ReportStreams
from .suspects import suspects_from_reports, verdict_for


def localize(
    event: AlarmStateChangeEvent, settings: Settings, kube: Callable[[], KubeApi]
) -> LocalizeResult:
    """The localize step: the alarm, the suspects it names, the nodes whose report is not
    visible yet, the refused reports and claims, or ``ambiguous``.

    Only ``ReportNotYetVisible`` (nothing visible at all yet) and the alarm's own problems
    (``InvalidAlarmEvent``) fail the whole step: a refused report or claim is one entry of
    ``refused``, and a node whose report is late is one entry of ``pending``.
    """
    alarm = alarm_from_event(event, settings)
    series = nonzero_node_series(alarm)
    jobs = {alarm.job} if alarm.job else {job for job, _ in series}
    streams = ReportStreams.from_settings(settings)
    reading = read_reports(alarm, settings.report_log_group, jobs or None, streams)
    if not reading.reports and not reading.refused:
        raise ReportNotYetVisible(
            f"no {contract.ALARM_SCHEMA} report of job {alarm.job or '(any)'} in "
            f"{settings.report_log_group} between {alarm.window_start} and {alarm.window_end}"
        )
    resolution = suspects_from_reports(reading.reports, settings, kube, alarm)
    refused = [*reading.refused, *resolution.refused]
    named = {s.node_name for s in resolution.suspects} | {r.node_name for r in refused}
    # A node a visible report mentions without blaming it (e.g. a non-finite rank whose batch a
    # third GPU also failed on: bad data, not a GPU) is explained, not missing.
    pending: list[PendingNode] = []
    for job, node in sorted(series):
        if node in named or node in resolution.mentioned:
            continue
        if not (is_job_name(job) and is_subdomain_name(node)):
            refused.append(
                refusal(
                    UntrustedReport(
                        f"a series names job {job[:80]!r} and node {node[:80]!r}, which are not "
                        "a job and a node name",
                        field="series",
                    ),
                )
            )
            continue
        if job == contract.CANARY_JOB and node != contract.CANARY_NODE_NAME:
            # The canary's series are the canary's: a datum under its job that names a real node
            # (a pod may put any JobName on its metrics) never becomes that node's item.
            refused.append(
                refusal(
                    UntrustedReport(
                        f"a series of the canary job {job} names node {node[:80]!r}, not the "
                        f"canary's reserved node {contract.CANARY_NODE_NAME}: not a real node's "
                        "evidence",
                        field="series",
                    ),
                    job=job,
                    node=node,
                )
            )
            continue
        pending.append(PendingNode(job=job, node_name=node))
    pending, unknown = _known_to_hyperpod(pending, settings)
    refused.extend(unknown)
    suspects = resolution.suspects
    total = len(suspects) + len(pending)
    for suspect in suspects:
        target_for(suspect).localized(settings)
    logger.info(
        "localized",
        extra={
            "alarm": alarm.alarm_name,
            "job": alarm.job,
            "reports": len(reading.reports),
            "suspects": sorted(s.node_name for s in suspects),
            "pending": [p.node_name for p in pending],
            "refused": len(refused),
            "series_nodes": sorted(node for _, node in series)[:MAX_SUSPECTS],
        },
    )
    listed = suspects[:MAX_SUSPECTS]
    return LocalizeResult(
        alarm=alarm,
        suspects=listed,
        pending=pending[: MAX_SUSPECTS - len(listed)],
        suspect_count=total,
        ambiguous=bool(reading.reports) and total == 0 and not resolution.refused,
        reports=len(reading.reports),
        refused=refused[:MAX_REFUSALS],
        refused_count=len(refused),
    )


def _known_to_hyperpod(
    candidates: list[PendingNode], settings: Settings
) -> tuple[list[PendingNode], list[Refusal]]:
    """The pending nodes HyperPod knows (DescribeClusterNode of the node's instance), and a
    refusal for each other one.

    A series is a datum any pod can put: only a node of the cluster may count toward the
    alarm's size (``suspect_count``, which the guard compares with its budget), or two data
    points on made-up nodes refuse a genuine one-node alarm as a storm. At most
    ``MAX_SUSPECTS`` candidates are described (enough to exceed any budget when they are real);
    the rest are not counted, in one refusal. The canary's reserved node, pending for the canary
    job only, is the canary's (no HyperPod node) and stays.
    """
    cluster = settings.hyperpod_cluster_name
    known: list[PendingNode] = []
    refused: list[Refusal] = []
    checked = 0
    for candidate in candidates:
        node, job = candidate.node_name, candidate.job
        if job == contract.CANARY_JOB and node == contract.CANARY_NODE_NAME:
            known.append(candidate)
            continue
        if checked == MAX_SUSPECTS:
            left = len(candidates) - len(known) - len(refused)
            reason = (
                f"{left} more nodes with a series of the alarm were not checked against "
                f"HyperPod (at most {MAX_SUSPECTS} are) and do not count"
            )
            refused.append(refusal(UntrustedReport(reason, field="series"), job=job))
            break
        checked += 1
        instance_id = node.removeprefix(NODE_NAME_PREFIX)
        if not node.startswith(NODE_NAME_PREFIX) or not is_instance_id(instance_id):
            problem = "is not a HyperPod node name (hyperpod-<instance id>)"
        elif hyperpod.describe_node(cluster, instance_id) is None:
            problem = f"is not a node of HyperPod cluster {cluster}"
        else:
            known.append(candidate)
            continue
        exc = UntrustedReport(
            f"a series of job {job} names node {node[:80]!r}, which {problem}: not counted",
            field="series",
        )
        refused.append(refusal(exc, job=job, node=node))
    return known, refused


def localize_late(state: LateInput, settings: Settings, kube: Callable[[], KubeApi]) -> Suspect:
    """One pending node, looked for again (its own Map item, retried by the workflow while the
    report is ``ReportNotYetVisible``): the suspect once a visible report of its job names it.
    A refused claim about it is raised (``UntrustedReport`` and the like: recorded, nothing
    touched); a visible report that only mentions it explains it: ``ReportNotYetVisible``
    ends after the workflow's retries as a recorded failure naming it."""
    alarm, wanted = state.alarm, state.pending
    reading = read_reports(
        alarm, settings.report_log_group, [wanted.job], ReportStreams.from_settings(settings)
    )
    resolution = suspects_from_reports(reading.reports, settings, kube, alarm)
    for suspect in resolution.suspects:
        if suspect.node_name == wanted.node_name and suspect.job == wanted.job:
            target_for(suspect).localized(settings)
            return suspect
    for refused in [*reading.refused, *resolution.refused]:
        if refused.node_name == wanted.node_name:
            raise _as_error(refused)
    raise ReportNotYetVisible(
        f"node {wanted.node_name} has a non-zero series of job {wanted.job} but no visible "
        f"report names it (between {alarm.window_start} and {alarm.window_end})"
    )


def _as_error(refused: Refusal) -> Exception:
    """A refusal as the error it stands for (the workflow's terminal errors, by name)."""
    cls = getattr(errors, refused.error, UntrustedReport)
    if cls is UntrustedReport:
        return UntrustedReport(refused.reason)
    return cls(refused.reason)


__all__ = ["localize", "localize_late", "verdict_for"]
