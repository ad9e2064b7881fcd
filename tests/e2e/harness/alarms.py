"""A local stand-in for CloudWatch alarm evaluation and EventBridge delivery.

moto stores alarms and metrics but never evaluates an alarm, and its EventBridge cannot target
Step Functions. This evaluator does both jobs for the alarms the CDK app synthesizes: it reads
each alarm's metric from (moto's) CloudWatch with GetMetricData, applies the alarm's statistic,
threshold, comparison and datapoints-to-alarm over its evaluation periods, records the state
change on the alarm (SetAlarmState), builds the "CloudWatch Alarm State Change" event exactly as
EventBridge delivers it, checks it against the rule's event pattern, and hands it to ``deliver``
(which starts the state machine). What it cannot prove: CloudWatch's own evaluation timing,
missing-data edge cases beyond "notBreaching", or EventBridge's retry/DLQ behaviour.

CloudWatch evaluates every period; this evaluator runs when a test calls it, however long after
the datapoints arrived (a busy machine, a slow training job). So each call catches up on every
round since the previous call: it alarms when any run of EvaluationPeriods periods since then
held DatapointsToAlarm breaching datapoints, never depending on how soon it was called.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


def matches_pattern(event: Any, pattern: Any) -> bool:
    """EventBridge pattern matching for the subset CDK rules use (values listed, nested maps)."""
    if isinstance(pattern, dict):
        if not isinstance(event, dict):
            return False
        return all(
            key in event and matches_pattern(event[key], sub) for key, sub in pattern.items()
        )
    if isinstance(pattern, list):
        candidates = event if isinstance(event, list) else [event]
        return any(c == p for c in candidates for p in pattern)
    return event == pattern


@dataclass
class AlarmSpec:
    """The properties of one AWS::CloudWatch::Alarm that evaluation needs."""

    name: str
    namespace: str
    metric_name: str
    dimensions: dict[str, str]
    period: int
    statistic: str
    threshold: float
    comparison: str
    evaluation_periods: int = 1
    datapoints_to_alarm: int = 1
    state: str = "OK"

    @classmethod
    def from_properties(cls, props: dict[str, Any]) -> AlarmSpec:
        """Build from a synthesized template's (resolved) alarm properties."""
        return cls(
            name=props["AlarmName"],
            namespace=props["Namespace"],
            metric_name=props["MetricName"],
            dimensions={d["Name"]: d["Value"] for d in props.get("Dimensions", [])},
            period=int(props["Period"]),
            statistic=props.get("Statistic", "Sum"),
            threshold=float(props["Threshold"]),
            comparison=props["ComparisonOperator"],
            evaluation_periods=int(props.get("EvaluationPeriods", 1)),
            datapoints_to_alarm=int(
                props.get("DatapointsToAlarm", props.get("EvaluationPeriods", 1))
            ),
        )


@dataclass
class LocalAlarmEvaluator:
    """Evaluates the alarms on demand (``evaluate``) and delivers state-change events."""

    cloudwatch: Any
    alarms: list[AlarmSpec]
    rule_pattern: dict[str, Any]
    deliver: Callable[[dict[str, Any]], None]
    account_id: str = "123456789012"
    region: str = "us-east-1"
    delivered: list[dict[str, Any]] = field(default_factory=list)
    evaluated_until: datetime.datetime = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC)
    )
    """The end of the last evaluation round (at first, when the evaluator was made)."""
    rule_enabled: bool = True
    """False stands for `aws events disable-rule`: alarms still change state, nothing is
    delivered (what a broken route into the workflow looks like)."""

    def create_in_cloudwatch(self) -> None:
        """Create the alarms in (moto's) CloudWatch so their state can be recorded there."""
        for a in self.alarms:
            self.cloudwatch.put_metric_alarm(
                AlarmName=a.name,
                Namespace=a.namespace,
                MetricName=a.metric_name,
                Dimensions=[{"Name": k, "Value": v} for k, v in a.dimensions.items()],
                Period=a.period,
                Statistic=a.statistic,
                Threshold=a.threshold,
                ComparisonOperator=a.comparison,
                EvaluationPeriods=a.evaluation_periods,
                DatapointsToAlarm=a.datapoints_to_alarm,
                TreatMissingData="notBreaching",
            )

    def evaluate(self, now: datetime.datetime | None = None) -> list[dict[str, Any]]:
        """One evaluation round; returns (and delivers) the events of alarms that went to ALARM."""
        now = now or datetime.datetime.now(datetime.UTC)
        since, self.evaluated_until = self.evaluated_until, now
        fired = []
        for alarm in self.alarms:
            values, breaching, round_end = self._breaching_run(alarm, since, now)
            new_state = "ALARM" if breaching else "OK"
            if new_state == alarm.state:
                continue
            previous, alarm.state = alarm.state, new_state
            reason = (
                f"Threshold Crossed: {len(breaching)} out of the last {len(values)} datapoints "
                f"{breaching[:5]} crossed the threshold ({alarm.threshold})"
            )
            self.cloudwatch.set_alarm_state(
                AlarmName=alarm.name, StateValue=new_state, StateReason=reason
            )
            if new_state != "ALARM":
                continue
            # Stamped with the round that would have fired, as CloudWatch's would have been.
            event = self._event(alarm, previous, reason, breaching, round_end)
            if self.rule_enabled and matches_pattern(event, self.rule_pattern):
                self.delivered.append(event)
                self.deliver(event)
                fired.append(event)
        return fired

    def _breaching_run(
        self, alarm: AlarmSpec, since: datetime.datetime, now: datetime.datetime
    ) -> tuple[list[float], list[float], datetime.datetime]:
        """The datapoints of the rounds since ``since``, the breaching ones of the first run of
        EvaluationPeriods periods that held DatapointsToAlarm of them ([] when none did), and
        the end of the round that saw that run (``now`` when none did)."""
        period = datetime.timedelta(seconds=alarm.period)
        span = period * max(alarm.evaluation_periods, 1)
        points = self._datapoints(alarm, since - span, now)
        breaching = [
            (t, v) for t, v in points if _COMPARISONS[alarm.comparison](v, alarm.threshold)
        ]
        for i, (start, _) in enumerate(breaching):
            run = [(t, v) for t, v in breaching[i:] if t < start + span]
            if len(run) >= alarm.datapoints_to_alarm:
                seen_at = run[alarm.datapoints_to_alarm - 1][0] + period
                return [v for _, v in points], [v for _, v in run], min(seen_at, now)
        return [v for _, v in points], [], now

    def _datapoints(
        self, alarm: AlarmSpec, start: datetime.datetime, now: datetime.datetime
    ) -> list[tuple[datetime.datetime, float]]:
        """(timestamp, value) of the alarm's statistic per period from ``start``, oldest first."""
        result = self.cloudwatch.get_metric_data(
            MetricDataQueries=[
                {
                    "Id": "m",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": alarm.namespace,
                            "MetricName": alarm.metric_name,
                            "Dimensions": [
                                {"Name": k, "Value": v} for k, v in alarm.dimensions.items()
                            ],
                        },
                        "Period": alarm.period,
                        "Stat": alarm.statistic,
                    },
                }
            ],
            StartTime=start,
            EndTime=now + datetime.timedelta(seconds=alarm.period),
            ScanBy="TimestampAscending",
        )
        series = result["MetricDataResults"][0]
        return sorted(zip(series["Timestamps"], (float(v) for v in series["Values"]), strict=True))

    def _event(
        self,
        alarm: AlarmSpec,
        previous: str,
        reason: str,
        breaching: list[float],
        now: datetime.datetime,
    ) -> dict[str, Any]:
        """The event EventBridge delivers for an alarm state change (AWS documents this shape)."""
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "CloudWatch Alarm State Change",
            "source": "aws.cloudwatch",
            "account": self.account_id,
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self.region,
            "resources": [f"arn:aws:cloudwatch:{self.region}:{self.account_id}:alarm:{alarm.name}"],
            "detail": {
                "alarmName": alarm.name,
                "state": {
                    "value": "ALARM",
                    "reason": reason,
                    "reasonData": json.dumps(
                        {
                            "version": "1.0",
                            "queryDate": stamp,
                            "statistic": alarm.statistic,
                            "period": alarm.period,
                            "recentDatapoints": breaching,
                            "threshold": alarm.threshold,
                            "evaluatedDatapoints": [],
                        }
                    ),
                    "timestamp": stamp,
                },
                "previousState": {"value": previous, "reason": "", "timestamp": stamp},
                "configuration": {
                    "description": "",
                    "metrics": [
                        {
                            "id": "m1",
                            "metricStat": {
                                "metric": {
                                    "namespace": alarm.namespace,
                                    "name": alarm.metric_name,
                                    "dimensions": dict(alarm.dimensions),
                                },
                                "period": alarm.period,
                                "stat": alarm.statistic,
                            },
                            "returnData": True,
                        }
                    ],
                },
            },
        }
