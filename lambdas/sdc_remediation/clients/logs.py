"""CloudWatch Logs: reading the agent's reports and rank maps, writing the canary's report."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from .. import aws
from ..errors import ReportNotYetVisible

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


def put_event(group: str, stream: str, message: str, timestamp_ms: int) -> None:
    """Write one event, creating the stream (and the group, when no agent created it yet)."""
    logs = aws.client("logs")
    exists = logs.exceptions.ResourceAlreadyExistsException
    with aws.aws_errors("logs:CreateLogStream"):
        try:
            with contextlib.suppress(exists):
                logs.create_log_stream(logGroupName=group, logStreamName=stream)
        except logs.exceptions.ResourceNotFoundException:
            # No agent published yet: the group is the agent's to create, and the canary's too.
            with contextlib.suppress(exists):
                logs.create_log_group(logGroupName=group)
            with contextlib.suppress(exists):
                logs.create_log_stream(logGroupName=group, logStreamName=stream)
    with aws.aws_errors("logs:PutLogEvents"):
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": timestamp_ms, "message": message}],
        )


__all__ = ["filter_events", "put_event"]
