"""A local stand-in for CloudWatch alarm evaluation and EventBridge delivery.

moto stores alarms and metrics but never evaluates an alarm, and its EventBridge cannot target
Step Functions. This evaluator does both jobs for the alarms the CDK app synthesizes: it reads
each alarm's metric from (moto's) CloudWatch with GetMetricData, applies the alarm's statistic,
threshold, comparison and datapoints-to-alarm over its evaluation periods, records the state
change on the alarm (SetAlarmState), builds the state-change event exactly as EventBridge
delivers it, checks it against the rule's event pattern, and hands it to ``deliver`` (which
starts the state machine).

The SDC alarms are Metrics Insights alarms grouped by JobName (one contributor per job). moto
runs no Metrics Insights query, so the evaluator runs the stack's form of it
(:class:`InsightsQuery`: ``SELECT <FN>(metric) FROM SCHEMA("ns", dims...) WHERE d = 'v' AND
d != 'v' GROUP BY d``) over ListMetrics and GetMetricData itself, evaluates each contributor on
its own, and delivers a "CloudWatch Alarm Contributor State Change" event per contributor that
enters ALARM, with its ``alarmContributor`` (id, attributes), as AWS documents that event. The
alarm's own state is ALARM while any contributor is. A query without GROUP BY (the flood
alarms, ``SELECT COUNT(m) ... WHERE ...``) is one series over every series it selects, with no
contributors: the alarm itself changes state. COUNT is the data points of the period (each
series' SampleCount, summed), SUM the values summed.

With ``sns`` given, an alarm whose own state enters ALARM runs its SNS actions (resolved topic
ARNs) as CloudWatch does: one notification per topic, with the documented keys a person reads
(AlarmName, AlarmDescription, NewStateValue, NewStateReason); the local pipeline leaves actions
out. What it cannot prove: CloudWatch's own evaluation timing, missing-data edge cases beyond
"notBreaching", Metrics Insights beyond that query form and its limits (3 hours of data, the
first 10,000 metrics, 500 series, 100 contributors in ALARM: the evaluator reads every series
and puts every contributor in ALARM, so it cannot show a flood crowding real contributors out,
only that the flood alarm counts it), CloudWatch's delivery of alarm actions, or EventBridge's
retry/DLQ behaviour.

CloudWatch evaluates every period; this evaluator runs when a test calls it, however long after
the datapoints arrived (a busy machine, a slow training job). So each call catches up on every
round since the previous call: it alarms when any run of EvaluationPeriods periods since then
held DatapointsToAlarm breaching datapoints, never depending on how soon it was called.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
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


_QUERY = re.compile(
    r"^SELECT (?P<fn>SUM|MAX|MIN|AVG|COUNT)\((?P<metric>\w+)\) "
    r'FROM SCHEMA\("(?P<namespace>[^"]+)"(?P<dims>(?:, \w+)*)\)'
    r"(?: WHERE (?P<where>.+?))?(?: GROUP BY (?P<group>\w+)(?: ORDER BY \w+\(\) (?:ASC|DESC))?)?$"
)
_CONDITION = re.compile(r"^(?P<dim>\w+) (?P<op>=|!=) '(?P<value>[^']*)'$")
_AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "SUM": sum,
    "MAX": max,
    "MIN": min,
    "AVG": lambda values: sum(values) / len(values),
    # Over each series' SampleCount (_contributor_points): every data point of the period.
    "COUNT": sum,
}


@dataclass(frozen=True)
class InsightsQuery:
    """A Metrics Insights query of the form the stack's alarms use (see the module docstring)."""

    function: str
    metric: str
    namespace: str
    schema: tuple[str, ...]
    conditions: tuple[tuple[str, str, str], ...]
    """(dimension, "=" or "!=", value), all of which must hold."""
    group_by: str | None
    """None: no GROUP BY, one series over everything the query selects (the flood alarms)."""

    @classmethod
    def parse(cls, text: str) -> InsightsQuery:
        """Parse ``text``; ValueError for a query outside the supported form."""
        match = _QUERY.match(text)
        if not match:
            raise ValueError(f"not a Metrics Insights query this evaluator runs: {text!r}")
        conditions = []
        for part in filter(None, (match["where"] or "").split(" AND ")):
            cond = _CONDITION.match(part.strip())
            if not cond:
                raise ValueError(f"unsupported WHERE condition {part!r} in {text!r}")
            conditions.append((cond["dim"], cond["op"], cond["value"]))
        return cls(
            function=match["fn"],
            metric=match["metric"],
            namespace=match["namespace"],
            schema=tuple(d.strip() for d in match["dims"].split(",") if d.strip()),
            conditions=tuple(conditions),
            group_by=match["group"],
        )

    def selects(self, dimensions: dict[str, str]) -> bool:
        """Whether a series with ``dimensions`` is in the query (SCHEMA: exactly those
        dimensions; every WHERE condition holds)."""
        if set(dimensions) != set(self.schema):
            return False
        return all((dimensions.get(d) == v) == (op == "=") for d, op, v in self.conditions)


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
    query: InsightsQuery | None = None
    """A Metrics Insights alarm's query (None: a single-metric alarm)."""
    expression: str = ""
    """The query as the alarm holds it (what its events carry)."""
    contributors: dict[str, str] = field(default_factory=dict)
    """A Metrics Insights alarm's contributors by their GROUP BY value -> state."""
    actions: tuple[str, ...] = ()
    """The alarm's AlarmActions, resolved (SNS topic ARNs); run only with the evaluator's
    ``sns``."""
    description: str = ""
    """The AlarmDescription its notifications carry."""

    @classmethod
    def from_properties(cls, props: dict[str, Any]) -> AlarmSpec:
        """Build from a synthesized template's (resolved) alarm properties, or DescribeAlarms'
        (the same names)."""
        common = {
            "name": props["AlarmName"],
            "threshold": float(props["Threshold"]),
            "comparison": props["ComparisonOperator"],
            "evaluation_periods": int(props.get("EvaluationPeriods", 1)),
            "datapoints_to_alarm": int(
                props.get("DatapointsToAlarm") or props.get("EvaluationPeriods", 1)
            ),
            "actions": tuple(props.get("AlarmActions", [])),
            "description": str(props.get("AlarmDescription", "")),
        }
        expressions = [m for m in props.get("Metrics", []) if m.get("Expression")]
        if expressions:
            (metric,) = expressions
            query = InsightsQuery.parse(metric["Expression"])
            return cls(
                **common,
                namespace=query.namespace,
                metric_name=query.metric,
                dimensions={},
                period=int(metric["Period"]),
                statistic=query.function.title(),
                query=query,
                expression=metric["Expression"],
            )
        return cls(
            **common,
            namespace=props["Namespace"],
            metric_name=props["MetricName"],
            dimensions={d["Name"]: d["Value"] for d in props.get("Dimensions", [])},
            period=int(props["Period"]),
            statistic=props.get("Statistic", "Sum"),
        )

    @staticmethod
    def is_evaluated(props: dict[str, Any], namespace: str) -> bool:
        """Whether an alarm of the template is one this evaluator runs: a metric alarm in the
        SDC ``namespace``, or a Metrics Insights alarm on it or on the canary's
        ``<namespace>/Canary``."""
        if props.get("Namespace") == namespace and "MetricName" in props:
            return True
        return any(
            str(m.get("Expression", "")).startswith("SELECT ")
            and (
                f'"{namespace}"' in str(m.get("Expression", ""))
                or f'"{namespace}/Canary"' in str(m.get("Expression", ""))
            )
            for m in props.get("Metrics", [])
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
    sns: Any = None
    """(moto's) SNS client: when given, an alarm entering ALARM notifies its SNS actions (see
    the module docstring); None: actions are not run."""

    def create_in_cloudwatch(self) -> None:
        """Create the alarms in (moto's) CloudWatch so their state can be recorded there."""
        for a in self.alarms:
            if a.query is not None:
                self.cloudwatch.put_metric_alarm(
                    AlarmName=a.name,
                    Metrics=[
                        {
                            "Id": "m1",
                            "Expression": a.expression,
                            "Period": a.period,
                            "ReturnData": True,
                        }
                    ],
                    Threshold=a.threshold,
                    ComparisonOperator=a.comparison,
                    EvaluationPeriods=a.evaluation_periods,
                    DatapointsToAlarm=a.datapoints_to_alarm,
                    TreatMissingData="notBreaching",
                    AlarmActions=list(a.actions),
                )
                continue
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
                AlarmActions=list(a.actions),
            )

    def evaluate(self, now: datetime.datetime | None = None) -> list[dict[str, Any]]:
        """One evaluation round; returns (and delivers) the events of alarms that went to ALARM."""
        now = now or datetime.datetime.now(datetime.UTC)
        since, self.evaluated_until = self.evaluated_until, now
        fired = []
        for alarm in self.alarms:
            if alarm.query is not None and alarm.query.group_by is None:
                self._evaluate_aggregate(alarm, since, now)
                continue
            if alarm.query is not None:
                fired += self._evaluate_contributors(alarm, since, now)
                continue
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
            self._notify(alarm, reason)
            # Stamped with the round that would have fired, as CloudWatch's would have been.
            event = self._event(alarm, previous, reason, breaching, round_end)
            if self.rule_enabled and matches_pattern(event, self.rule_pattern):
                self.delivered.append(event)
                self.deliver(event)
                fired.append(event)
        return fired

    def _evaluate_contributors(
        self, alarm: AlarmSpec, since: datetime.datetime, now: datetime.datetime
    ) -> list[dict[str, Any]]:
        """One round of a Metrics Insights alarm: each contributor (a GROUP BY value) on its own;
        an event per contributor entering ALARM, the alarm in ALARM while any contributor is."""
        assert alarm.query is not None
        period = datetime.timedelta(seconds=alarm.period)
        span = period * max(alarm.evaluation_periods, 1)
        groups = self._contributor_points(alarm, since - span, now)
        fired = []
        for group in sorted(set(groups) | set(alarm.contributors)):
            points = groups.get(group, [])
            _values, breaching, round_end = self._run_of(alarm, points, now)
            new_state = "ALARM" if breaching else "OK"
            if new_state == alarm.contributors.get(group, "OK"):
                alarm.contributors[group] = new_state
                continue
            alarm.contributors[group] = new_state
            if new_state != "ALARM":
                continue
            reason = (
                f"Threshold Crossed: {len(breaching)} datapoint(s) {breaching[:5]} crossed the "
                f"threshold ({alarm.threshold})"
            )
            event = self._contributor_event(alarm, group, reason, round_end)
            if self.rule_enabled and matches_pattern(event, self.rule_pattern):
                self.delivered.append(event)
                self.deliver(event)
                fired.append(event)
        in_alarm = [g for g, state in alarm.contributors.items() if state == "ALARM"]
        new_alarm_state = "ALARM" if in_alarm else "OK"
        if new_alarm_state != alarm.state:
            alarm.state = new_alarm_state
            reason = (
                f"{len(in_alarm)} out of {len(alarm.contributors)} time series evaluated to ALARM"
            )
            self.cloudwatch.set_alarm_state(
                AlarmName=alarm.name, StateValue=new_alarm_state, StateReason=reason
            )
            if new_alarm_state == "ALARM":
                self._notify(alarm, reason)
        return fired

    def _evaluate_aggregate(
        self, alarm: AlarmSpec, since: datetime.datetime, now: datetime.datetime
    ) -> None:
        """One round of a Metrics Insights alarm without GROUP BY: one series, the query's
        function over every selected series per period (COUNT: their data points). Its state is
        recorded on the alarm and an ALARM runs its actions; no event goes to the workflow's
        rule, which matches the SDC alarms' contributor events only."""
        period = datetime.timedelta(seconds=alarm.period)
        span = period * max(alarm.evaluation_periods, 1)
        points = self._contributor_points(alarm, since - span, now).get("", [])
        _values, breaching, _round_end = self._run_of(alarm, points, now)
        new_state = "ALARM" if breaching else "OK"
        if new_state == alarm.state:
            return
        alarm.state = new_state
        reason = f"Threshold Crossed: {breaching[:5]} (threshold {alarm.threshold})"
        self.cloudwatch.set_alarm_state(
            AlarmName=alarm.name, StateValue=new_state, StateReason=reason
        )
        if new_state == "ALARM":
            self._notify(alarm, reason)

    def _notify(self, alarm: AlarmSpec, reason: str) -> None:
        """Run ``alarm``'s actions for its entering ALARM: the notification CloudWatch publishes
        to each SNS topic (nothing without ``sns``). Any other kind of action is refused, so a
        test cannot pass on an action that was never run."""
        if self.sns is None:
            return
        for action in alarm.actions:
            if not action.startswith("arn:aws:sns:"):
                raise ValueError(f"{alarm.name}: this evaluator runs SNS actions only: {action!r}")
            self.sns.publish(
                TopicArn=action,
                Subject=f'ALARM: "{alarm.name}" in {self.region}'[:100],
                Message=json.dumps(
                    {
                        "AlarmName": alarm.name,
                        "AlarmDescription": alarm.description,
                        "NewStateValue": "ALARM",
                        "NewStateReason": reason,
                    }
                ),
            )

    def _contributor_points(
        self, alarm: AlarmSpec, start: datetime.datetime, now: datetime.datetime
    ) -> dict[str, list[tuple[datetime.datetime, float]]]:
        """GROUP BY value -> (timestamp, the query's function over that group's series) per
        period: the query run over ListMetrics and GetMetricData."""
        query = alarm.query
        assert query is not None
        equal = [{"Name": d, "Value": v} for d, op, v in query.conditions if op == "="]
        listed = self.cloudwatch.list_metrics(
            Namespace=query.namespace, MetricName=query.metric, Dimensions=equal
        )["Metrics"]
        by_group: dict[str, dict[datetime.datetime, list[float]]] = {}
        for metric in listed:
            dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
            if not query.selects(dims):
                continue
            series = AlarmSpec(
                name=alarm.name,
                namespace=query.namespace,
                metric_name=query.metric,
                dimensions=dims,
                period=alarm.period,
                # COUNT counts data points: each series' SampleCount, summed (_AGGREGATE).
                statistic={"SUM": "Sum", "COUNT": "SampleCount"}.get(
                    query.function, query.function.title()
                ),
                threshold=alarm.threshold,
                comparison=alarm.comparison,
            )
            bucket = by_group.setdefault(dims[query.group_by] if query.group_by else "", {})
            for moment, value in self._datapoints(series, start, now):
                bucket.setdefault(moment, []).append(value)
        aggregate = _AGGREGATE[query.function]
        return {
            group: sorted((moment, aggregate(values)) for moment, values in points.items())
            for group, points in by_group.items()
        }

    def _breaching_run(
        self, alarm: AlarmSpec, since: datetime.datetime, now: datetime.datetime
    ) -> tuple[list[float], list[float], datetime.datetime]:
        """The datapoints of the rounds since ``since``, the breaching ones of the first run of
        EvaluationPeriods periods that held DatapointsToAlarm of them ([] when none did), and
        the end of the round that saw that run (``now`` when none did)."""
        period = datetime.timedelta(seconds=alarm.period)
        span = period * max(alarm.evaluation_periods, 1)
        return self._run_of(alarm, self._datapoints(alarm, since - span, now), now)

    def _run_of(
        self,
        alarm: AlarmSpec,
        points: list[tuple[datetime.datetime, float]],
        now: datetime.datetime,
    ) -> tuple[list[float], list[float], datetime.datetime]:
        """``_breaching_run`` over given datapoints."""
        period = datetime.timedelta(seconds=alarm.period)
        span = period * max(alarm.evaluation_periods, 1)
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

    def _envelope(
        self, detail_type: str, alarm: AlarmSpec, now: datetime.datetime
    ) -> dict[str, Any]:
        """The EventBridge envelope of one of ``alarm``'s state-change events."""
        return {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": "aws.cloudwatch",
            "account": self.account_id,
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": self.region,
            "resources": [f"arn:aws:cloudwatch:{self.region}:{self.account_id}:alarm:{alarm.name}"],
        }

    def _contributor_event(
        self, alarm: AlarmSpec, group: str, reason: str, now: datetime.datetime
    ) -> dict[str, Any]:
        """The "CloudWatch Alarm Contributor State Change" event EventBridge delivers for one
        contributor entering ALARM (AWS documents this shape: no previousState, no
        reasonData)."""
        assert alarm.query is not None
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
        attributes = {alarm.query.group_by: group}
        contributor_id = hashlib.sha256(json.dumps(attributes).encode()).hexdigest()[:16]
        return {
            **self._envelope("CloudWatch Alarm Contributor State Change", alarm, now),
            "detail": {
                "alarmName": alarm.name,
                "alarmContributor": {"id": contributor_id, "attributes": attributes},
                "state": {"value": "ALARM", "reason": reason, "timestamp": stamp},
                "configuration": {
                    "metrics": [
                        {
                            "id": "m1",
                            "expression": alarm.expression,
                            "returnData": True,
                            "period": alarm.period,
                        }
                    ],
                    "description": "",
                },
            },
        }

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
            **self._envelope("CloudWatch Alarm State Change", alarm, now),
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
