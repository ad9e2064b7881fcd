"""The sweeper's backstop: a report no remediation took up starts the workflow anyway.

The SDC alarms are Metrics Insights queries grouped by ``JobName``, and any training pod may put
any ``JobName`` on its metrics: a flood of made-up ones can keep a real job's contributor out of
ALARM (at most 100 contributors in ALARM, 500 series returned, 10,000 metrics processed; AWS's
documented limits). The flood alarm pages; this reads the report group itself, which the flood
does not touch: every ``sdc.alarm/v1`` report of the cluster written between ``BACKSTOP_WINDOW``
ago and ``BACKSTOP_DELAY`` ago (the alarm path's time to take it up) that

- is a training job's report of this cluster, in a stream localize reads for its job (the job's
  stream; under ``agentIdentity: pod-identity`` one of the job's pods' streams,
  ``ReportStreams.accepts``: what IAM lets only that pod write),
- names a node (a report naming nobody starts nothing here),
- no admission claimed on any node it names (``keys.report``), the admission did not refuse
  (``keys.report_refusal``: the guard's circuit was open), and the backstop did not start yet
  (``keys.backstop_start``),

starts the workflow with the event of the stack's alarm for that report's metric and job, at the
report's time (``backstop_event``): the same localize, admission guard, dedupe and blast-radius
budget as an alarm. The execution is named after the report, so a start repeated after a crash
starts nothing twice. Bounded per sweep: ``MAX_PAGES`` pages of ``PAGE_EVENTS`` events and
``MAX_STARTS`` starts; a cursor in the ledger (``keys.backstop_cursor``) says where the next
sweep goes on, so a report group busier than that is read over several sweeps, never skipped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

import sdc_contract as contract
from sdc_contract.names import NODE_NAME_PREFIX, is_instance_id

from .. import aws, clock
from ..clients import logs
from ..clients.stepfunctions import start_execution
from ..config import Settings
from ..dal.ledger import Ledger
from ..errors import UntrustedReport
from ..models import Report
from ..models.state import report_identity
from ..observability import logger
from .localize.evidence import parse_event
from .localize.streams import ReportStreams

BACKSTOP_DELAY_SECONDS = 900
"""A report younger than this is left to the alarm path (one sweep period)."""
BACKSTOP_WINDOW_SECONDS = 6 * 3600
"""How far back a fresh cursor starts (the first sweep, or after the window was read)."""
MAX_PAGES = 5
"""FilterLogEvents pages read per sweep."""
PAGE_EVENTS = 100
"""Events per page."""
MAX_STARTS = 4
"""Workflow executions started per sweep."""
MAX_NODES_CHECKED = 16
"""Claims looked up per report (one per node it names)."""


@dataclass
class BackstopResult:
    """What one sweep's backstop did."""

    enabled: bool = True
    pages: int = 0
    read: int = 0
    started: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    behind: bool = False
    """The window was not read to its end: the next sweep goes on from the cursor."""

    def skip(self, why: str) -> None:
        """Count one event left alone, by why."""
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """The sweeper's JSON answer's ``backstop``."""
        return {
            "enabled": self.enabled,
            "pages": self.pages,
            "read": self.read,
            "started": self.started,
            "skipped": dict(sorted(self.skipped.items())),
            "behind": self.behind,
        }


def backstop(settings: Settings, ledger: Ledger) -> BackstopResult:
    """Start the workflow for the reports no remediation took up (see the module)."""
    machine = settings.state_machine_arn
    if not machine or not machine.startswith("arn:"):
        logger.info("backstop off: no STATE_MACHINE_ARN")
        return BackstopResult(enabled=False)
    cluster = settings.hyperpod_cluster_name
    streams = ReportStreams.from_settings(settings)
    prefix = f"{streams.namespace}/" if streams.per_pod else None
    now_ms = int(clock.now().timestamp() * 1000)
    cursor = ledger.backstop_cursor(cluster) or {}
    if cursor and not cursor.get("done"):
        start, end, token = int(cursor["start_ms"]), int(cursor["end_ms"]), cursor.get("token")
    else:
        oldest = now_ms - BACKSTOP_WINDOW_SECONDS * 1000
        start = max(int(cursor.get("end_ms", oldest)), oldest)
        end, token = now_ms - BACKSTOP_DELAY_SECONDS * 1000, None
    result = BackstopResult()
    if end <= start:
        return result
    pattern = f'"{contract.ALARM_SCHEMA}"'
    while True:
        if result.pages == MAX_PAGES:
            result.behind = True
            ledger.save_backstop_cursor(
                cluster, start_ms=start, end_ms=end, token=token, done=False
            )
            return result
        page_token = token
        try:
            events, token = logs.filter_page(
                settings.report_log_group,
                pattern,
                start,
                end,
                prefix=prefix,
                token=page_token,
                limit=PAGE_EVENTS,
            )
        except botocore.exceptions.ClientError as exc:
            if page_token is None or aws.error_code(exc) != "InvalidParameterException":
                raise
            # A page token expires (24 h): read the window again from its start; the reports
            # started meanwhile are skipped by their marks.
            token = None
            continue
        result.pages += 1
        for n, event in enumerate(events):
            if len(result.started) == MAX_STARTS:
                # This page again next sweep: what was started on it is skipped then.
                result.behind = True
                ledger.save_backstop_cursor(
                    cluster, start_ms=start, end_ms=end, token=page_token, done=False
                )
                logger.info("backstop: start bound reached", extra={"left": len(events) - n})
                return result
            result.read += 1
            _examine(event, settings, ledger, streams, machine, result)
        if token is None:
            ledger.save_backstop_cursor(cluster, start_ms=start, end_ms=end, token=None, done=True)
            return result


def _examine(
    event: dict[str, Any],
    settings: Settings,
    ledger: Ledger,
    streams: ReportStreams,
    machine: str,
    result: BackstopResult,
) -> None:
    """Start the workflow for one log event's report, or count why not."""
    cluster = settings.hyperpod_cluster_name
    stream = str(event.get("logStreamName", ""))
    try:
        report = parse_event(event, Report, contract.ALARM_SCHEMA)
    except UntrustedReport:
        result.skip("malformed")  # localize would refuse it too; nothing to start
        return
    if report is None:
        result.skip("not a report")
        return
    if report.cluster != cluster or report.job == contract.CANARY_JOB or report.canary_run:
        result.skip("not a training report of this cluster")
        return
    # Localize reads a job's reports from the job's stream (shared) or its pods' (pod-identity):
    # a report anywhere else would start a workflow that cannot find it.
    if not streams.accepts(stream, report.job) or (not streams.per_pod and stream != report.job):
        result.skip("not in a stream of its job")
        return
    instances = named_instances(report)
    if not instances:
        result.skip("names no node")
        return
    identity = report_identity(report.job, report.step, report.check, clock.iso(report.time))
    if ledger.backstop_started(cluster, identity):
        result.skip("started")
        return
    if ledger.report_refusal(cluster, identity):
        result.skip("refused")
        return
    if any(ledger.report_taken(i, identity) for i in instances[:MAX_NODES_CHECKED]):
        result.skip("claimed")
        return
    name = execution_name(cluster, identity)
    payload = json.dumps(backstop_event(report, settings, machine, name), sort_keys=True)
    execution = start_execution(machine, name, payload)
    ledger.mark_backstop_started(cluster, identity, execution=execution)
    logger.warning(
        "backstop: started the workflow for a report no remediation took up",
        extra={"job": report.job, "report": identity[:300], "execution": execution},
    )
    result.started.append({"job": report.job, "report": identity, "execution": execution})


def named_instances(report: Report) -> list[str]:
    """The instance ids of the nodes a report's ranks name (its own instance id, else its
    node's name minus ``hyperpod-``), sorted, shapes checked (the report is a pod's claim)."""
    found = set()
    for info in report.ranks.values():
        instance = info.instance_id or (
            info.node_name.removeprefix(NODE_NAME_PREFIX)
            if info.node_name and info.node_name.startswith(NODE_NAME_PREFIX)
            else None
        )
        if instance and is_instance_id(instance):
            found.add(instance)
    return sorted(found)


def execution_name(cluster: str, identity: str) -> str:
    """The backstop's execution for a report (Step Functions names: at most 80 of
    ``[A-Za-z0-9-_]``): the same report, the same execution."""
    return "backstop-" + hashlib.sha256(f"{cluster}#{identity}".encode()).hexdigest()[:40]


def alarm_metric(report: Report) -> str:
    """The SDC metric whose alarm would have taken the report up: the one it says it
    incremented, else the check's."""
    if report.metric is not None and report.metric.name in contract.SDC_ALARM_METRICS:
        return report.metric.name
    if report.check == "weights":
        return contract.DIVERGENT_TENSORS_METRIC
    if report.check == "reduced_gradient" or report.nonfinite:
        return contract.NONFINITE_GRAD_METRIC
    return contract.REPLAY_MISMATCH_METRIC


def backstop_event(report: Report, settings: Settings, machine: str, name: str) -> dict[str, Any]:
    """The event of this stack's alarm for ``report``'s metric, its job's contributor entering
    ALARM at the report's time: what localize accepts from the alarm path (this account, an
    alarm named ``ALARM_NAME_PREFIX<metric>``, the stack's own query), so everything after it
    is the alarm path's. Its reason says the backstop started it."""
    metric = alarm_metric(report)
    alarm_name = f"{settings.alarm_name_prefix}{metric}"
    partition, region = machine.split(":")[1], machine.split(":")[3]
    account = settings.alarm_account_id
    at = report.time.astimezone(UTC) if report.time.tzinfo else report.time.replace(tzinfo=UTC)
    return {
        "version": "0",
        "id": name,
        "detail-type": contract.CONTRIBUTOR_EVENT,
        "source": "aws.cloudwatch",
        "account": account,
        "time": clock.iso(at),
        "region": region,
        "resources": [f"arn:{partition}:cloudwatch:{region}:{account}:alarm:{alarm_name}"],
        "detail": {
            "alarmName": alarm_name,
            "alarmContributor": {
                "id": name,
                "attributes": {contract.JOB_DIMENSION: report.job},
            },
            "state": {
                "value": "ALARM",
                "reason": (
                    "sdc-guard backstop: this report was in the report group and no remediation "
                    f"took it up within {BACKSTOP_DELAY_SECONDS // 60} minutes (its alarm "
                    "contributor may have been crowded out); started by the sweeper"
                ),
                "timestamp": _stamp(at),
            },
            "configuration": {
                "description": "sdc-guard backstop",
                "metrics": [
                    {
                        "id": "m1",
                        "expression": contract.job_alarm_query(
                            settings.metric_namespace,
                            metric,
                            settings.hyperpod_cluster_name,
                            except_job=contract.CANARY_JOB,
                        ),
                        "returnData": True,
                        "period": 60,
                    }
                ],
            },
        },
    }


def _stamp(at: datetime) -> str:
    """CloudWatch's alarm timestamp form (``2026-12-03T01:02:03.456+0000``)."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


__all__ = [
    "BACKSTOP_DELAY_SECONDS",
    "BACKSTOP_WINDOW_SECONDS",
    "MAX_PAGES",
    "MAX_STARTS",
    "PAGE_EVENTS",
    "BackstopResult",
    "alarm_metric",
    "backstop",
    "backstop_event",
    "execution_name",
    "named_instances",
]
