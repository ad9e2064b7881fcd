"""The local alarm evaluator alarms on what CloudWatch would, however late a test calls it."""

from __future__ import annotations

import datetime
from typing import Any

from tests.e2e.harness.alarms import AlarmSpec, LocalAlarmEvaluator

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
MINUTE = datetime.timedelta(minutes=1)


class RecordedCloudWatch:
    """GetMetricData over fixed datapoints (one per period, as CloudWatch aggregates them)."""

    def __init__(self, points: list[tuple[datetime.datetime, float]]) -> None:
        self.points = points
        self.states: list[str] = []

    def get_metric_data(self, *, StartTime: Any, EndTime: Any, **_: Any) -> dict[str, Any]:
        chosen = [(t, v) for t, v in self.points if StartTime <= t < EndTime]
        return {
            "MetricDataResults": [
                {"Timestamps": [t for t, _ in chosen], "Values": [v for _, v in chosen]}
            ]
        }

    def set_alarm_state(self, *, StateValue: str, **_: Any) -> None:
        self.states.append(StateValue)


def evaluator(points, *, periods: int = 1, to_alarm: int = 1) -> LocalAlarmEvaluator:
    alarm = AlarmSpec(
        name="sdc_replay_mismatch",
        namespace="SDC",
        metric_name="sdc_replay_mismatch",
        dimensions={"ClusterName": "c"},
        period=60,
        statistic="Sum",
        threshold=1.0,
        comparison="GreaterThanOrEqualToThreshold",
        evaluation_periods=periods,
        datapoints_to_alarm=to_alarm,
    )
    delivered: list[dict[str, Any]] = []
    return LocalAlarmEvaluator(
        cloudwatch=RecordedCloudWatch(points),
        alarms=[alarm],
        rule_pattern={"source": ["aws.cloudwatch"]},
        deliver=delivered.append,
        evaluated_until=T0,
    )


def test_a_breach_fires_even_when_evaluation_comes_long_after_it():
    # Given a breaching datapoint a minute after the evaluator started
    ev = evaluator([(T0 + MINUTE, 2.0)])
    # When the test gets to evaluate only 20 minutes later (a slow job on a busy machine)
    fired = ev.evaluate(now=T0 + 20 * MINUTE)
    # Then the alarm fires once, as CloudWatch's evaluation every period would have
    assert [e["detail"]["alarmName"] for e in fired] == ["sdc_replay_mismatch"]
    assert ev.delivered == fired
    # At the round that saw the datapoint: the period after it began
    assert fired[0]["time"] == "2026-12-01T12:02:00Z"
    # And the next round, with nothing new, returns it to OK without another event
    assert ev.evaluate(now=T0 + 21 * MINUTE) == []
    assert ev.cloudwatch.states == ["ALARM", "OK"]


def test_datapoints_to_alarm_count_within_the_evaluation_periods_only():
    # Given 2 of 3 periods must breach: two breaches 10 minutes apart, later two in a row
    apart = evaluator([(T0 + MINUTE, 1.0), (T0 + 11 * MINUTE, 1.0)], periods=3, to_alarm=2)
    close = evaluator([(T0 + MINUTE, 1.0), (T0 + 2 * MINUTE, 1.0)], periods=3, to_alarm=2)
    # Then only the two within three periods fire
    assert apart.evaluate(now=T0 + 30 * MINUTE) == []
    assert len(close.evaluate(now=T0 + 30 * MINUTE)) == 1


def test_below_the_threshold_nothing_fires():
    ev = evaluator([(T0 + MINUTE, 0.0)])
    assert ev.evaluate(now=T0 + 5 * MINUTE) == []
    assert ev.cloudwatch.states == []
