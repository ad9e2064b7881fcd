"""What localize reads, in the alarm window: the per-node series with non-zero values, the
``sdc.alarm/v1`` reports, and a job's rank map; all of the alarm's job only.

Reports are parsed one event at a time (``parse_event``): the one place a report is accepted or
refused. A refused report is set aside with why (a ``Refusal``) and the others go on: one
malformed report can neither hide nor block another's finding.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

import sdc_contract as contract

from ... import clock
from ...clients import cloudwatch, logs
from ...errors import UntrustedReport
from ...models import Alarm, RankInfo, RankMap, Refusal, Report
from ...observability import logger
from .alarm import belongs_to
from .streams import ReportStreams


def nonzero_node_series(alarm: Alarm) -> dict[tuple[str, str], float]:
    """(job, node) -> the largest value of its per-node series in the alarm window, if > 0."""
    metric_names = [alarm.metric_name] if alarm.metric_name else list(contract.SDC_ALARM_METRICS)
    series = [
        metric
        for metric in cloudwatch.list_series(
            alarm.namespace, metric_names, alarm.cluster_name, job=alarm.job
        )
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


@dataclass
class Reading:
    """The alarm's reports that hold, oldest first, and the ones refused (with why)."""

    reports: list[Report] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


def read_reports(
    alarm: Alarm,
    group: str,
    jobs: Iterable[str] | None = None,
    streams: ReportStreams | None = None,
) -> Reading:
    """The ``sdc.alarm/v1`` reports of this cluster and the alarm's job in the alarm window,
    from the job's streams (``streams``: by job, or by the job's pods).

    Each is validated alone: one that claims the schema but does not hold (a reversed
    ``suspect_window``, a job that is not a job name, an unbounded name) is refused with the
    field and the reason, and so is one of a job whose streams do not include the one it is
    in (per-pod streams: a pod writes only its own); the others go on.
    """
    streams = streams or ReportStreams()
    start = int(clock.parse_iso(alarm.window_start).timestamp() * 1000)
    end = int(clock.parse_iso(alarm.window_end).timestamp() * 1000)
    reading = Reading()
    for event in _events(group, f'"{contract.ALARM_SCHEMA}"', streams, jobs, start, end):
        stream = event.get("logStreamName")
        try:
            report = parse_event(event, Report, contract.ALARM_SCHEMA)
            if report is not None and not streams.accepts(str(stream), report.job):
                raise UntrustedReport(
                    f"a report of job {report.job} is in stream {str(stream)[:120]!r}, which is not "
                    f"one of that job's (streams {streams.namespace}/<job>/<pod> are written "
                    "by their pod only)",
                    field="log_stream",
                )
        except UntrustedReport as exc:
            reading.refused.append(refusal(exc, stream=stream))
            continue
        if (
            report is not None
            and report.cluster == alarm.cluster_name
            and belongs_to(alarm, report.job)
        ):
            reading.reports.append(report.model_copy(update={"log_stream": stream}))
    reading.reports.sort(key=lambda r: r.time)
    return reading


def _events(
    group: str,
    pattern: str,
    streams: ReportStreams,
    jobs: Iterable[str] | None,
    start_ms: int | None,
    end_ms: int | None,
) -> list[dict[str, Any]]:
    """The events of ``jobs``' streams matching ``pattern`` (one FilterLogEvents selection
    after the other)."""
    events: list[dict[str, Any]] = []
    for selection in streams.filters(jobs):
        events.extend(
            logs.filter_events(
                group, pattern, selection.names, start_ms, end_ms, prefix=selection.prefix
            )
        )
    return events


def refusal(
    exc: Exception, *, stream: object = None, job: str | None = None, node: str | None = None
) -> Refusal:
    """A refused report or node, as localize's output carries it (bounded, printable)."""
    logger.warning(
        "refused", extra={"error": type(exc).__name__, "reason": str(exc)[:500], "job": job}
    )
    return Refusal(
        error=type(exc).__name__,
        field=getattr(exc, "field", ""),
        reason=str(exc),
        job=job,
        stream=None if stream is None else str(stream),
        node_name=node,
    )


def latest_rank_map(group: str, job: str, stream: str | None = None) -> RankMap | None:
    """The newest ``sdc.rankmap/v1`` map of a job (written once at job start), from the job's
    stream, or from ``stream`` when given (per-pod streams: the stream of the report being
    resolved, whose writer is checked; a map another pod wrote is not read).

    A large job's map arrives as several events of the same ``time``, each a part of the ranks
    (the agent splits it under the 1 MiB event limit): all parts of the newest map are merged.
    """
    schema = contract.RANKMAP_SCHEMA
    source = stream or job
    maps = []
    for event in logs.filter_events(group, f'"{schema}"', [source], None, None):
        if event.get("logStreamName", source) != source:
            continue  # a stand-in or a prefix match returned another stream's event
        try:
            maps.append(parse_event(event, RankMap, schema))
        except UntrustedReport as exc:
            # A damaged map part is left out; a rank only it placed is then refused on its own.
            logger.warning("rank map part refused", extra={"job": job, "reason": str(exc)[:300]})
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
        stream = str(event.get("logStreamName"))[:120]
        raise UntrustedReport(
            f"{schema} event in stream {stream!r} at {event.get('timestamp')} is malformed: "
            f"{str(first['msg'])[:300]}",
            field=where[:120],
        ) from exc


__all__ = [
    "Reading",
    "latest_rank_map",
    "nonzero_node_series",
    "parse_event",
    "read_reports",
    "refusal",
]
