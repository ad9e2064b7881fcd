"""The AWS calls, one attempt each: a log event (creating its group and stream when missing)
and metric data. Retries, timing and spooling are the sender's business."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ..errors import SdcAgentError
from .events import MAX_METRICS_PER_CALL
from .retry import error_code

logger = logging.getLogger(__name__)


class LogEventRejected(SdcAgentError):
    """CloudWatch Logs accepted the call but rejected the event (clock skew, expired)."""


class CloudWatchTransport:
    """PutLogEvents and PutMetricData over two boto3 clients built by the caller."""

    def __init__(self, cloudwatch: Any, logs: Any) -> None:
        self.cloudwatch = cloudwatch
        self.logs = logs

    def put_log_event(self, group: str, stream: str, message: str, timestamp_ms: int) -> None:
        """Write one event; create the group and stream when CloudWatch says they are missing.

        Putting first and creating only on ResourceNotFoundException means a job whose log group
        was created by the infrastructure needs no logs:CreateLogGroup permission. No sequence
        token: PutLogEvents has ignored it since January 2023.
        """
        event = {"timestamp": timestamp_ms, "message": message}
        try:
            response = self.logs.put_log_events(
                logGroupName=group, logStreamName=stream, logEvents=[event]
            )
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
            self._create(group, stream)
            response = self.logs.put_log_events(
                logGroupName=group, logStreamName=stream, logEvents=[event]
            )
        rejected = response.get("rejectedLogEventsInfo")
        if rejected:
            raise LogEventRejected(f"CloudWatch Logs rejected the event: {rejected}")

    def put_metric_data(
        self, namespace: str, metrics: list[dict[str, Any]], timestamp: datetime
    ) -> None:
        """Send at most MAX_METRICS_PER_CALL entries, each stamped with ``timestamp``."""
        if len(metrics) > MAX_METRICS_PER_CALL:
            raise ValueError(f"at most {MAX_METRICS_PER_CALL} metrics per call, got {len(metrics)}")
        stamped = [{**m, "Timestamp": timestamp} for m in metrics]
        self.cloudwatch.put_metric_data(Namespace=namespace, MetricData=stamped)

    def _create(self, group: str, stream: str) -> None:
        """Create the stream, and the group only when CloudWatch says the group is missing.

        Most deployments have the stack's ``/sdc/<cluster>`` group already: trying the stream
        first spends no CreateLogGroup call (and needs no permission for it) there.
        """
        try:
            self._create_stream(group, stream)
            return
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
        try:
            self.logs.create_log_group(logGroupName=group)
            logger.info("sdc: created log group %s", group)
        except Exception as exc:
            # Another rank may have created it in between; anything else (AccessDenied: the
            # group is missing and may not be created here) fails this write, which the
            # publisher retries and spools.
            if error_code(exc) != "ResourceAlreadyExistsException":
                raise
        self._create_stream(group, stream)

    def _create_stream(self, group: str, stream: str) -> None:
        try:
            self.logs.create_log_stream(logGroupName=group, logStreamName=stream)
            logger.info("sdc: created log stream %s in %s", stream, group)
        except Exception as exc:
            if error_code(exc) != "ResourceAlreadyExistsException":
                raise
