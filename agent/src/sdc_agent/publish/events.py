"""What goes to CloudWatch, as plain data: the report and rank-map log events, the metric data.

Pure functions, no AWS: the sender delivers a :class:`Delivery` and the spool stores one, so a
spooled alarm is re-sent exactly as it was built. Names follow docs/CONTRACT.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Literal

from sdc_contract.metrics import (
    AUDIT_PASS_METRIC,
    AUDIT_SKIPPED_METRIC,
    CLUSTER_DIMENSION,
    JOB_DIMENSION,
    NODE_DIMENSION,
    UNCONFIRMED_SENSOR_FLAGS_METRIC,
    WEIGHT_CHECK_PASS_METRIC,
)
from sdc_contract.report import RANKMAP_SCHEMA

from ..alarm import Alarm, RankInfo

logger = logging.getLogger(__name__)

SPOOL_SCHEMA = "sdc.spool/v1"

# PutMetricData takes at most 1000 metrics per request.
MAX_METRICS_PER_CALL = 1000
# A log event may be at most 1 MiB including 26 bytes of overhead; stay well below it.
MAX_EVENT_BYTES = 900 * 1024

DeliveryKind = Literal["alarm", "rankmap"]


def utc_now_iso(now: datetime | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a ``Z``: the ``time`` field of every event."""
    now = now or datetime.now(timezone.utc)
    return now.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def named_ranks(alarm: Alarm) -> list[int]:
    """The ranks an alarm blames (its suspects), sorted.

    Not every non-finite rank: when a third GPU also gets a non-finite result on that rank's
    batch, the batch or the model is at fault and the agent blames nobody. A per-node series for
    such a rank would have the pipeline look for a suspect that no report names.
    """
    return sorted(set(alarm.suspects or []))


def named_nodes(alarm: Alarm) -> list[str]:
    """The nodes of the ranks an alarm names, sorted, from the alarm's own rank map."""
    nodes = set()
    for rank in named_ranks(alarm):
        info = alarm.ranks.get(str(rank))
        if info is None:
            # The report still carries the rank; only its per-node series cannot be written.
            logger.warning("sdc: alarm names rank %s but carries no placement for it", rank)
            continue
        nodes.add(info.node_name)
    return sorted(nodes)


def report_event(alarm: Alarm, cluster: str, job: str, time: str) -> dict[str, Any]:
    """The report: ``Alarm.to_dict()`` plus ``cluster``, ``job`` and ``time``."""
    return {**alarm.to_dict(), "cluster": cluster, "job": job, "time": time}


def rankmap_events(
    ranks: dict[int, RankInfo], cluster: str, job: str, time: str
) -> list[dict[str, Any]]:
    """The ``sdc.rankmap/v1`` event(s) for every rank's placement.

    One event up to ~2,400 ranks (about 390 bytes a rank with HyperPod node names and GPU UUIDs); a larger job's map is split into several complete events of
    the same schema (each a subset of ``ranks``) because a log event is limited to 1 MiB.
    """
    entries = [(str(rank), ranks[rank].to_dict()) for rank in sorted(ranks)]
    events: list[dict[str, Any]] = []
    part: dict[str, Any] = {}
    size = 0
    for key, value in entries:
        entry_size = len(json.dumps({key: value})) + 2
        if part and size + entry_size > MAX_EVENT_BYTES:
            events.append(part)
            part, size = {}, 0
        part[key] = value
        size += entry_size
    events.append(part)
    return [
        {"schema": RANKMAP_SCHEMA, "cluster": cluster, "job": job, "time": time, "ranks": part}
        for part in events
    ]


def alarm_metric_data(alarm: Alarm, cluster: str, job: str) -> list[dict[str, Any]]:
    """PutMetricData entries (without Timestamp) for one alarm.

    The alarm's count on the {ClusterName} series (the dashboard's), on the job's
    {ClusterName, JobName} series, which the deployed per-job alarms watch (one contributor per
    job: one job's findings never hold another's alarm), and on {ClusterName, JobName,
    NodeName} for every node the alarm names, which the localize step lists. High resolution
    (1 s): the dashboard reads it at 10 s.
    """
    base = {
        "MetricName": alarm.metric_name,
        "Value": float(alarm.metric_value),
        "Unit": "Count",
        "StorageResolution": 1,
    }
    data = [
        {**base, "Dimensions": [{"Name": CLUSTER_DIMENSION, "Value": cluster}]},
        {
            **base,
            "Dimensions": [
                {"Name": CLUSTER_DIMENSION, "Value": cluster},
                {"Name": JOB_DIMENSION, "Value": job},
            ],
        },
    ]
    for node in named_nodes(alarm):
        dimensions = [
            {"Name": CLUSTER_DIMENSION, "Value": cluster},
            {"Name": JOB_DIMENSION, "Value": job},
            {"Name": NODE_DIMENSION, "Value": node},
        ]
        data.append({**base, "Dimensions": dimensions})
    return data


def liveness_metric_data(
    cluster: str,
    job: str,
    audit_passes: int,
    weight_check_passes: int,
    unconfirmed_sensor_flags: int = 0,
    audits_skipped: int = 0,
) -> list[dict[str, Any]]:
    """PutMetricData entries (without Timestamp) for a batch of passing checks; the counts of
    unconfirmed sensor flags and of skipped audits (``sdc_audit_skipped``) are added only when
    nonzero.

    Standard resolution: the batch covers a minute, and a dashboard reads it per minute.
    """
    dimensions = [
        {"Name": CLUSTER_DIMENSION, "Value": cluster},
        {"Name": JOB_DIMENSION, "Value": job},
    ]
    return [
        {
            "MetricName": name,
            "Value": float(value),
            "Unit": "Count",
            "StorageResolution": 60,
            "Dimensions": dimensions,
        }
        for name, value in (
            (AUDIT_PASS_METRIC, audit_passes),
            (WEIGHT_CHECK_PASS_METRIC, weight_check_passes),
            *(
                [(UNCONFIRMED_SENSOR_FLAGS_METRIC, unconfirmed_sensor_flags)]
                if unconfirmed_sensor_flags
                else []
            ),
            *([(AUDIT_SKIPPED_METRIC, audits_skipped)] if audits_skipped else []),
        )
    ]


@dataclass(frozen=True)
class Delivery:
    """One thing to deliver: a log event and/or metric data, and what is still to send.

    ``message`` is the log event's JSON text; ``metrics`` the PutMetricData entries without a
    Timestamp. The sender stamps both with the time it actually sends them: a spooled alarm
    re-sent an hour later must still reach the alarm's current evaluation window (the report's
    own ``time`` keeps the moment of detection). A part already delivered is set to None / ().
    """

    kind: DeliveryKind
    log_group: str
    log_stream: str
    namespace: str
    message: str | None = None
    metrics: tuple[dict[str, Any], ...] = ()

    @property
    def done(self) -> bool:
        """True when nothing is left to send."""
        return self.message is None and not self.metrics

    def without_message(self) -> Delivery:
        """This delivery once its log event went through."""
        return replace(self, message=None)

    def to_record(self) -> dict[str, Any]:
        """The spool's JSON record (``sdc.spool/v1``)."""
        return {
            "schema": SPOOL_SCHEMA,
            "kind": self.kind,
            "log_group": self.log_group,
            "log_stream": self.log_stream,
            "namespace": self.namespace,
            "message": self.message,
            "metrics": list(self.metrics),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Delivery:
        """Parse a spool record; ValueError when it is not one."""
        if not isinstance(record, dict) or record.get("schema") != SPOOL_SCHEMA:
            raise ValueError(f"not an {SPOOL_SCHEMA} record")
        kind = record.get("kind")
        if kind not in ("alarm", "rankmap"):
            raise ValueError(f"unknown spool record kind {kind!r}")
        message = record.get("message")
        metrics = record.get("metrics") or []
        if message is not None and not isinstance(message, str):
            raise ValueError("spool record message must be a string or null")
        if not isinstance(metrics, list) or not all(isinstance(m, dict) for m in metrics):
            raise ValueError("spool record metrics must be a list of objects")
        for key in ("log_group", "log_stream", "namespace"):
            if not isinstance(record.get(key), str) or not record[key]:
                raise ValueError(f"spool record {key} must be a non-empty string")
        return cls(
            kind=kind,
            log_group=record["log_group"],
            log_stream=record["log_stream"],
            namespace=record["namespace"],
            message=message,
            metrics=tuple(metrics),
        )


def alarm_delivery(
    alarm: Alarm,
    *,
    cluster: str,
    job: str,
    namespace: str,
    log_group: str,
    time: str,
    log_stream: str | None = None,
) -> Delivery:
    """Everything one alarm publishes: its report event and its metric data.

    ``log_stream`` is the publisher's stream (``PublishSettings.log_stream``); None means the
    job name, the stream of the default report stream mode.
    """
    return Delivery(
        kind="alarm",
        log_group=log_group,
        log_stream=log_stream or job,
        namespace=namespace,
        message=json.dumps(report_event(alarm, cluster, job, time), separators=(",", ":")),
        metrics=tuple(alarm_metric_data(alarm, cluster, job)),
    )


def rankmap_deliveries(
    ranks: dict[int, RankInfo],
    *,
    cluster: str,
    job: str,
    namespace: str,
    log_group: str,
    time: str,
    log_stream: str | None = None,
) -> list[Delivery]:
    """The rank map's log event(s); no metrics. ``log_stream`` as in :func:`alarm_delivery`:
    the rank map goes where the reports go, since localize reads both from one stream."""
    return [
        Delivery(
            kind="rankmap",
            log_group=log_group,
            log_stream=log_stream or job,
            namespace=namespace,
            message=json.dumps(event, separators=(",", ":")),
        )
        for event in rankmap_events(ranks, cluster, job, time)
    ]
