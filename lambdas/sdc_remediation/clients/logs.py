"""CloudWatch Logs: reading the agent's reports and rank maps, writing the canary's report."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from .. import aws
from ..errors import ConfigurationError, ReportNotYetVisible

MAX_STREAMS_PER_FILTER = 100
"""FilterLogEvents takes at most this many stream names."""


def filter_events(
    group: str,
    pattern: str,
    streams: Iterable[str] | None,
    start_ms: int | None,
    end_ms: int | None,
    *,
    prefix: str | None = None,
) -> list[dict[str, Any]]:
    """Every event of ``group`` matching ``pattern`` (in ``streams``, or in the streams whose
    name starts with ``prefix``, when given; between the two times when given);
    ``ReportNotYetVisible`` when the group does not exist yet. The caller still checks each
    event's stream: the prefix narrows what CloudWatch returns, it proves nothing."""
    logs = aws.client("logs")
    kwargs: dict[str, Any] = {"logGroupName": group, "filterPattern": pattern}
    names = sorted(set(streams or []))
    if names and prefix is not None:
        raise ValueError("FilterLogEvents takes stream names or a stream name prefix, not both")
    if names:
        kwargs["logStreamNames"] = names[:MAX_STREAMS_PER_FILTER]  # one stream per job
    if prefix is not None:
        kwargs["logStreamNamePrefix"] = prefix
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


def filter_page(
    group: str,
    pattern: str,
    start_ms: int,
    end_ms: int,
    *,
    prefix: str | None = None,
    token: str | None = None,
    limit: int = 100,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page (at most ``limit`` events) of ``group``'s events matching ``pattern`` between
    the two times (in the streams starting with ``prefix``, when given), from ``token``; the
    events and the next page's token (None: the last page). A missing group is no events."""
    logs = aws.client("logs")
    kwargs: dict[str, Any] = {
        "logGroupName": group,
        "filterPattern": pattern,
        "startTime": start_ms,
        "endTime": end_ms,
        "limit": limit,
    }
    if prefix is not None:
        kwargs["logStreamNamePrefix"] = prefix
    if token is not None:
        kwargs["nextToken"] = token
    with aws.aws_errors("logs:FilterLogEvents"):
        try:
            page = logs.filter_log_events(**kwargs)
        except logs.exceptions.ResourceNotFoundException:
            return [], None
    return list(page.get("events", [])), page.get("nextToken") or None


def put_event(group: str, stream: str, message: str, timestamp_ms: int) -> None:
    """Write one event, creating the stream when missing. The group is the stack's (created
    with its retention and key, or adopted): a missing group is a ``ConfigurationError``,
    never created here without them."""
    logs = aws.client("logs")
    exists = logs.exceptions.ResourceAlreadyExistsException
    with aws.aws_errors("logs:CreateLogStream"):
        try:
            with contextlib.suppress(exists):
                logs.create_log_stream(logGroupName=group, logStreamName=stream)
        except logs.exceptions.ResourceNotFoundException:
            raise ConfigurationError(
                f"log group {group} does not exist: the stack creates it (with "
                "adoptReportLogGroup it must exist before the deploy)"
            ) from None
    with aws.aws_errors("logs:PutLogEvents"):
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": timestamp_ms, "message": message}],
        )


__all__ = ["filter_events", "filter_page", "put_event"]
