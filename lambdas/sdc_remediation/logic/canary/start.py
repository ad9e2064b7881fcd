"""Starting a canary run (the schedule's ``{"action": "start"}``): record the run, write its
``sdc.alarm/v1`` report for the reserved canary job and node, and put its datum on the series
the canary's alarm watches, as the agent publishes a finding."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import sdc_contract as contract

from ... import clock
from ...clients import cloudwatch, logs
from ...config import Settings
from ...dal.canary_runs import RunStore
from ...models.canary import Run
from ...observability import logger


def new_run_id(now: datetime) -> str:
    """A run id that sorts by its start time."""
    return f"c-{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


def reserved_job_report(
    cluster: str, job: str, at: datetime, rank: dict[str, Any], metric: str
) -> dict[str, Any]:
    """The ``sdc.alarm/v1`` report of a reserved job's finding (the canary's, a reproduced
    idle screen's): rank 0 (``rank``: where it runs) named a culprit by the compute check."""
    return {
        "schema": contract.ALARM_SCHEMA,
        "cluster": cluster,
        "job": job,
        "time": clock.iso(at),
        "step": 0,
        "check": "compute",
        "culprits": [0],
        "suspects": [0],
        "suspect_window": [0, 0],
        "ranks": {"0": rank},
        "metric": {"name": metric, "value": 1},
    }


def canary_report(cluster: str, run_id: str, at: datetime) -> dict[str, Any]:
    """The synthetic ``sdc.alarm/v1`` report: rank 0 of the canary job on the canary node,
    named a culprit by the compute check."""
    rank = {"node_name": contract.CANARY_NODE_NAME, "instance_id": contract.CANARY_INSTANCE_ID}
    report = reserved_job_report(cluster, contract.CANARY_JOB, at, rank, contract.CANARY_METRIC)
    return {**report, "canary_run": run_id}


def datum(
    cluster: str,
    at: datetime,
    *,
    job: str = contract.CANARY_JOB,
    node: str = contract.CANARY_NODE_NAME,
    metric: str = contract.CANARY_METRIC,
) -> list[dict[str, Any]]:
    """A reserved job's datum (the canary's by default) on the series its alarm watches
    ({ClusterName, JobName}) and on its per-node series (which localize lists), as
    PutMetricData entries."""
    on_job = [
        {"Name": contract.CLUSTER_DIMENSION, "Value": cluster},
        {"Name": contract.JOB_DIMENSION, "Value": job},
    ]
    on_node = [*on_job, {"Name": contract.NODE_DIMENSION, "Value": node}]
    return [
        {"MetricName": metric, "Dimensions": dims, "Timestamp": at, "Value": 1.0,
         "Unit": "Count", "StorageResolution": 1}
        for dims in (on_job, on_node)
    ]  # fmt: skip


def publish_finding(
    settings: Settings,
    report: dict[str, Any],
    namespace: str,
    data: list[dict[str, Any]],
    at: datetime,
) -> None:
    """Publish a reserved job's finding as the agent publishes one: its ``sdc.alarm/v1``
    ``report`` into the report log group, in the stream named by the report's job (localize
    reads a reserved job from that stream only), then its datum into ``namespace``, one the
    training pods' policy cannot put into (the canary's, the idle screen's)."""
    logs.put_event(
        settings.report_log_group,
        str(report["job"]),
        json.dumps(report),
        int(at.timestamp() * 1000),
    )
    cloudwatch.put_metric_data(namespace, data)


def start_run(settings: Settings) -> Run:
    """Start a canary run: record it, write its report, put its datum."""
    now = clock.now()
    cluster = settings.hyperpod_cluster_name
    store = RunStore(settings.ledger_table, cluster)
    run = store.start(new_run_id(now), now, settings.canary_timeout_seconds)
    publish_finding(
        settings,
        canary_report(cluster, run.run_id, now),
        contract.canary_namespace(settings.metric_namespace),
        datum(cluster, now),
        now,
    )
    store.reach(run.run_id, "published")
    logger.info("canary started", extra={"run": run.run_id})
    return store.get(run.run_id) or run


__all__ = ["canary_report", "datum", "new_run_id", "publish_finding", "start_run"]
