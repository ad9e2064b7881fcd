"""The local alarm evaluator alarms on what CloudWatch would, however late a test calls it."""

from __future__ import annotations

import datetime
import json
from typing import Any

import sdc_contract as contract
from infra.config import SdcConfig
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


# --- per-job alarms (Metrics Insights, one contributor per job) -------------------------------

QUERY = (
    'SELECT SUM(sdc_replay_mismatch) FROM SCHEMA("SDC", ClusterName, JobName) '
    "WHERE ClusterName = 'c' AND JobName != 'sdc-canary' GROUP BY JobName ORDER BY SUM() DESC"
)


class SeriesCloudWatch:
    """ListMetrics and GetMetricData over fixed datapoints of several series (each keyed by its
    dimensions), as the agent publishes them: the per-node series and the cluster series."""

    def __init__(self) -> None:
        self.series: dict[tuple[tuple[str, str], ...], list[tuple[datetime.datetime, float]]] = {}
        self.states: list[str] = []

    def put(self, at: datetime.datetime, job: str, node: str) -> None:
        for dims in (
            {"ClusterName": "c", "JobName": job, "NodeName": node},
            {"ClusterName": "c", "JobName": job},
            {"ClusterName": "c"},
        ):
            self.series.setdefault(tuple(sorted(dims.items())), []).append((at, 1.0))

    def list_metrics(self, *, Dimensions: list[dict[str, str]], **_: Any) -> dict[str, Any]:
        wanted = {(d["Name"], d["Value"]) for d in Dimensions}
        return {
            "Metrics": [
                {"Dimensions": [{"Name": n, "Value": v} for n, v in key]}
                for key in self.series
                if wanted <= set(key)
            ]
        }

    def get_metric_data(
        self, *, MetricDataQueries: list[dict[str, Any]], StartTime: Any, EndTime: Any, **_: Any
    ) -> dict[str, Any]:
        dims = MetricDataQueries[0]["MetricStat"]["Metric"]["Dimensions"]
        key = tuple(sorted((d["Name"], d["Value"]) for d in dims))
        buckets: dict[datetime.datetime, float] = {}
        for t, v in self.series.get(key, []):
            if StartTime <= t < EndTime:
                minute = t.replace(second=0, microsecond=0)
                buckets[minute] = buckets.get(minute, 0.0) + v
        times = sorted(buckets)
        return {"MetricDataResults": [{"Timestamps": times, "Values": [buckets[t] for t in times]}]}

    def set_alarm_state(self, *, StateValue: str, **_: Any) -> None:
        self.states.append(StateValue)


def _insights(
    cw: SeriesCloudWatch, name: str, expression: str, threshold: float, **more: Any
) -> LocalAlarmEvaluator:
    """An evaluator of one Metrics Insights alarm as the stack synthesizes it (one minute, one
    datapoint to alarm), the rule listening to contributor events only; ``more``: AlarmActions
    in the properties, ``sns`` for the evaluator."""
    actions = more.pop("actions", None)
    props: dict[str, Any] = {
        "AlarmName": name,
        "Metrics": [{"Id": "m1", "Expression": expression, "Period": 60, "ReturnData": True}],
        "Threshold": threshold,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "EvaluationPeriods": 1,
        "DatapointsToAlarm": 1,
    }
    if actions:
        props["AlarmActions"] = actions
    return LocalAlarmEvaluator(
        cloudwatch=cw,
        alarms=[AlarmSpec.from_properties(props)],
        rule_pattern={"detail-type": ["CloudWatch Alarm Contributor State Change"]},
        deliver=lambda event: None,
        evaluated_until=T0,
        **more,
    )


def _per_job(cw: SeriesCloudWatch) -> LocalAlarmEvaluator:
    return _insights(cw, "sdc-guard-c-sdc_replay_mismatch", QUERY, 1)


def _cluster_level(cw: SeriesCloudWatch) -> LocalAlarmEvaluator:
    """The alarm the stack deployed before per-job alarms: one alarm on {ClusterName}."""
    alarm = AlarmSpec(
        name="cluster",
        namespace="SDC",
        metric_name="sdc_replay_mismatch",
        dimensions={"ClusterName": "c"},
        period=60,
        statistic="Sum",
        threshold=1.0,
        comparison="GreaterThanOrEqualToThreshold",
    )
    return LocalAlarmEvaluator(
        cloudwatch=cw,
        alarms=[alarm],
        rule_pattern={"source": ["aws.cloudwatch"]},
        deliver=lambda event: None,
        evaluated_until=T0,
    )


def test_one_job_holding_its_contributor_in_alarm_cannot_hide_another_jobs_finding():
    # Given one pod of attacker-job putting a datum every minute, and, at minute 5, a genuine
    # finding of victim-job on another node
    cw = SeriesCloudWatch()
    for minute in range(10):
        cw.put(T0 + minute * MINUTE + datetime.timedelta(seconds=5), "attacker-job", "node-a")
    cw.put(T0 + 5 * MINUTE + datetime.timedelta(seconds=7), "victim-job", "node-b")
    per_job, cluster = _per_job(cw), _cluster_level(cw)

    # When both alarms are evaluated every minute, as CloudWatch would
    fired_per_job, fired_cluster = [], []
    for minute in range(1, 11):
        fired_per_job += per_job.evaluate(now=T0 + minute * MINUTE + datetime.timedelta(seconds=30))
        fired_cluster += cluster.evaluate(now=T0 + minute * MINUTE + datetime.timedelta(seconds=30))

    # Then the per-job alarm delivers the victim's finding as its own contributor's event
    jobs = [e["detail"]["alarmContributor"]["attributes"]["JobName"] for e in fired_per_job]
    assert jobs == ["attacker-job", "victim-job"]
    (victim,) = [
        e for e in fired_per_job if "victim" in json.dumps(e["detail"]["alarmContributor"])
    ]
    assert victim["detail-type"] == "CloudWatch Alarm Contributor State Change"
    assert victim["detail"]["configuration"]["metrics"][0]["expression"] == QUERY
    # ... while the cluster-level alarm, held in ALARM by the attacker, said nothing of it
    assert len(fired_cluster) == 1


def test_the_canary_job_is_not_a_contributor_of_a_training_alarm():
    cw = SeriesCloudWatch()
    cw.put(T0 + MINUTE, "sdc-canary", "hyperpod-i-0000000000000c0de")
    assert _per_job(cw).evaluate(now=T0 + 3 * MINUTE) == []


TOPIC = "arn:aws:sns:us-east-1:123456789012:sdc-guard-notifications"


class RecordedSns:
    """Publish, recorded (what the alarm's SNS action sends)."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, **kwargs: Any) -> None:
        self.published.append(kwargs)


def _flood(cw: SeriesCloudWatch, sns: RecordedSns | None = None) -> LocalAlarmEvaluator:
    """The stack's flood alarm of sdc_replay_mismatch (infra SeriesFloodAlarms: the contract's
    query, the default floodThreshold, the topic as its action); tests/infra pins the template
    to the same."""
    return _insights(
        cw,
        "sdc-guard-c-sdc_replay_mismatch-flood",
        contract.job_count_query("SDC", "sdc_replay_mismatch", "c", except_job=contract.CANARY_JOB),
        SdcConfig(hyperpod_cluster_name="c", eks_cluster_name="e").flood_threshold,
        actions=[TOPIC],
        sns=sns or RecordedSns(),
    )


def test_a_flood_of_made_up_job_names_sets_off_the_flood_alarm():
    # Given one real job's finding and, in the same minute, 60 made-up JobNames' data from one
    # pod (the alarm pages before 100 of them could keep real contributors out of ALARM)
    cw = SeriesCloudWatch()
    cw.put(T0 + MINUTE + datetime.timedelta(seconds=3), "llama-pretrain", "node-a")
    for n in range(60):
        cw.put(T0 + MINUTE + datetime.timedelta(seconds=5), f"junk-{n}", "node-b")
    sns = RecordedSns()
    flood, per_job = _flood(cw, sns), _per_job(cw)

    # When the alarms are evaluated
    fired = flood.evaluate(now=T0 + 3 * MINUTE)
    recorded = list(cw.states)
    per_job.evaluate(now=T0 + 3 * MINUTE)

    # Then the flood alarm is in ALARM (it pages through its SNS action) and delivers nothing
    # to the workflow's rule; the per-job alarm still sees the real job (this evaluator has
    # no 100-contributor limit: that is what the flood alarm is there for)
    assert flood.alarms[0].state == "ALARM" and recorded == ["ALARM"]
    assert fired == []
    (page,) = sns.published
    assert page["TopicArn"] == TOPIC
    assert json.loads(page["Message"])["AlarmName"] == "sdc-guard-c-sdc_replay_mismatch-flood"
    assert per_job.alarms[0].contributors["llama-pretrain"] == "ALARM"


def test_real_findings_alone_leave_the_flood_alarm_ok():
    # Given three real jobs' findings in one minute (several GPUs failing at once is rare)
    cw = SeriesCloudWatch()
    for job in ("llama-pretrain", "mixtral-sft", "qwen-dpo"):
        cw.put(T0 + MINUTE + datetime.timedelta(seconds=3), job, "node-a")
    sns = RecordedSns()
    flood = _flood(cw, sns)
    # When evaluated / Then no false page
    assert flood.evaluate(now=T0 + 3 * MINUTE) == []
    assert flood.alarms[0].state == "OK" and cw.states == [] and sns.published == []
