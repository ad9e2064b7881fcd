"""The workflow's input: the EventBridge event of one of the stack's SDC alarms changing state.

The SDC alarms are Metrics Insights alarms with one contributor per job (docs/deploy.md, "The
alarms"): the event that starts the workflow is "CloudWatch Alarm Contributor State Change",
whose ``alarmContributor.attributes`` name the job and whose metric is the alarm's query. A
"CloudWatch Alarm State Change" event (a single-metric alarm) parses too; localize decides
whether it is one of this stack's alarms.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field, ValidationError

from ..errors import InvalidAlarmEvent
from .base import Model as _Model
from .base import first_errors


class MetricRef(_Model):
    """``configuration.metrics[].metricStat.metric`` of the alarm event."""

    namespace: str
    name: str
    dimensions: dict[str, str] = Field(default_factory=dict)


class MetricStat(_Model):
    """``metricStat``: the metric, its period and statistic."""

    metric: MetricRef
    period: int | None = None
    stat: str | None = None


class MetricQuery(_Model):
    """One entry of ``configuration.metrics``; math expressions have no metricStat."""

    id: str
    metric_stat: MetricStat | None = Field(default=None, alias="metricStat")
    expression: str | None = Field(default=None, max_length=2048)
    period: int | None = None


class AlarmConfiguration(_Model):
    """``detail.configuration``."""

    description: str | None = None
    metrics: list[MetricQuery] = Field(default_factory=list)


class AlarmStateValue(_Model):
    """``detail.state`` / ``detail.previousState``."""

    value: str
    reason: str = ""
    timestamp: datetime


class AlarmContributor(_Model):
    """``detail.alarmContributor`` of a contributor's state change: which time series (for the
    SDC alarms: which job) changed state."""

    id: str = Field(max_length=1024)
    attributes: dict[str, str] = Field(default_factory=dict)


class AlarmDetail(_Model):
    """``detail`` of a CloudWatch Alarm (Contributor) State Change event."""

    alarm_name: str = Field(alias="alarmName", max_length=255)
    alarm_contributor: AlarmContributor | None = Field(default=None, alias="alarmContributor")
    state: AlarmStateValue
    previous_state: AlarmStateValue | None = Field(default=None, alias="previousState")
    configuration: AlarmConfiguration = Field(default_factory=AlarmConfiguration)


class AlarmStateChangeEvent(EventBridgeModel):
    """The workflow input: Powertools' EventBridge envelope with a typed alarm detail."""

    source: Literal["aws.cloudwatch"]
    detail_type: Literal[
        "CloudWatch Alarm State Change", "CloudWatch Alarm Contributor State Change"
    ] = Field(alias="detail-type")
    detail: AlarmDetail


def parse_alarm_event(event: Any) -> AlarmStateChangeEvent:
    """Parse the workflow input; anything but a CloudWatch alarm state change is rejected."""
    try:
        return parse(event=event, model=AlarmStateChangeEvent)
    except (ValidationError, ValueError, TypeError) as exc:
        raise InvalidAlarmEvent(
            f"not a CloudWatch Alarm State Change event: {first_errors(exc)}"
        ) from exc


__all__ = [
    "AlarmConfiguration",
    "AlarmContributor",
    "AlarmDetail",
    "AlarmStateChangeEvent",
    "AlarmStateValue",
    "MetricQuery",
    "MetricRef",
    "MetricStat",
    "parse_alarm_event",
]
