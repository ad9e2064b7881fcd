"""What localize reads, in the alarm window: the per-node series with non-zero values, the
``sdc.alarm/v1`` reports, and a job's rank map.

Reports are parsed one event at a time (``parse_event``): the one place a report is accepted or
refused, so what a refused report does to the others is decided there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

import sdc_contract as contract

from ... import clock
from ...clients import cloudwatch, logs
from ...errors import UntrustedReport
from ...models import Alarm, RankInfo, RankMap, Report
from .alarm import belongs_to


def nonzero_node_series(alarm: Alarm) -> dict[tuple[str, str], float]:
    """(job, node) -> the largest value of its per-node series in the alarm window, if > 0."""
    metric_names = [alarm.metric_name] if alarm.metric_name else list(contract.SDC_ALARM_METRICS)
    series = [
        metric
        for metric in cloudwatch.list_series(alarm.namespace, metric_names, alarm.cluster_name)
        if set(cloudwatch.dimensions_of(metric)) == set(contract.NODE_SERIES)
    ]
    if not series:
        return {}
    start, end = clock.parse_iso(alarm.window_start), clock.parse_iso(alarm.window_end)
    found: dict[tuple[str, str], float] = {}
    for metric, values in cloudwatch.positive_values(series, start, end):
        dims = cloudwatch.dimensions_of(metric)
        key = (dims[contract.JOB_DIMENSION], dims[contract.NODE_DIMENSION])
        if belongs_to(alarm, key[0]):
            found[key] = max(found.get(key, 0.0), *values)
    return found


def read_reports(alarm: Alarm, group: str, jobs: Iterable[str] | None = None) -> list[Report]:
    """The ``sdc.alarm/v1`` reports of this cluster in the alarm window, oldest first.

    A report that claims the schema but does not validate (an empty ``suspect_window``, a rank
    key that is not a number) is ``UntrustedReport``: acting on part of it is not an option, and
    skipping it would hide the node it names.
    """
    start = int(clock.parse_iso(alarm.window_start).timestamp() * 1000)
    end = int(clock.parse_iso(alarm.window_end).timestamp() * 1000)
    reports = []
    for event in logs.filter_events(group, f'"{contract.ALARM_SCHEMA}"', jobs, start, end):
        report = parse_event(event, Report, contract.ALARM_SCHEMA)
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
    schema = contract.RANKMAP_SCHEMA
    maps = [
        parse_event(e, RankMap, schema)
        for e in logs.filter_events(group, f'"{schema}"', [job], None, None)
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


def parse_event(event: dict[str, Any], model: type[Report] | type[RankMap], schema: str) -> Any:
    """One log event as ``model``: None when it is not ``schema`` at all (another writer's
    line), ``UntrustedReport`` naming the field when it claims the schema and does not hold."""
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


__all__ = ["latest_rank_map", "nonzero_node_series", "parse_event", "read_reports"]
