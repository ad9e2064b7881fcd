"""A flood of made-up JobNames on the local pipeline: the stack's flood alarm, evaluated over
what moto holds as CloudWatch would, pages the stack's topic and starts no workflow, while a
real finding alone pages nobody.

What stands in: the evaluator (``harness/alarms.py``: its query, its SNS notification) for
CloudWatch's evaluation and its running of the alarm's action. What is the stack's: the alarm's
query, threshold and action (resolved from the template), the topic, the rule's pattern.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from sdc_contract.metrics import CLUSTER_DIMENSION, JOB_DIMENSION, REPLAY_MISMATCH_METRIC
from tests.e2e.harness.alarms import AlarmSpec, LocalAlarmEvaluator
from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.scenario import culprit_alarm, local_cluster

pytestmark = pytest.mark.slow

CLUSTER = local_cluster(nodes=3)
JUNK_JOBS = 60
"""More made-up JobNames in one minute than the default floodThreshold (50)."""


def _flood_evaluator(p: LocalPipeline, metric: str) -> LocalAlarmEvaluator:
    """The template's flood alarm of ``metric`` with its actions resolved as the stack wired
    them (the pipeline's own evaluator leaves actions out), evaluated from now on."""
    name = f"sdc-guard-{CLUSTER.hyperpod_name}-{metric}-flood"
    (props,) = [
        r["Properties"]
        for r in p.template["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("AlarmName") == name
    ]
    evaluator = LocalAlarmEvaluator(
        cloudwatch=p.client("cloudwatch"),
        alarms=[AlarmSpec.from_properties(p.resolve(props))],
        rule_pattern=p.evaluator.rule_pattern,
        deliver=p.start_execution,
        sns=p.client("sns"),
        evaluated_until=datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5),
    )
    evaluator.create_in_cloudwatch()
    return evaluator


def _put_junk(p: LocalPipeline, metric: str, count: int) -> None:
    """What one pod with the agent's policy may do: put ``metric`` under ``count`` made-up
    JobNames of this cluster (PutMetricData conditions on the namespace only)."""
    now = datetime.datetime.now(datetime.UTC)
    p.client("cloudwatch").put_metric_data(
        Namespace="SDC",
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [
                    {"Name": CLUSTER_DIMENSION, "Value": CLUSTER.hyperpod_name},
                    {"Name": JOB_DIMENSION, "Value": f"junk-{n:03d}"},
                ],
                "Value": 1.0,
                "Timestamp": now,
            }
            for n in range(count)
        ],
    )


def test_a_flood_of_made_up_job_names_pages_the_on_call_and_starts_no_workflow(
    tmp_path: Path,
) -> None:
    with LocalPipeline(CLUSTER) as p:
        flood = _flood_evaluator(p, REPLAY_MISMATCH_METRIC)
        (alarm,) = flood.alarms
        assert alarm.actions == (p.topic_arn,)  # the stack's one topic

        # Given a real job's finding, published by the agent's publisher
        p.publish(culprit_alarm(CLUSTER, [3]), spool_dir=str(tmp_path / "spool"))
        # When CloudWatch evaluates the flood alarm / Then it stays OK: no false page
        assert flood.evaluate() == []
        assert alarm.state == "OK" and p.notifications() == []

        # Given, in one minute, one pod's data under 60 made-up JobNames
        _put_junk(p, REPLAY_MISMATCH_METRIC, JUNK_JOBS)
        # When CloudWatch evaluates the flood alarm
        fired = flood.evaluate()

        # Then it is in ALARM, with the stack's topic as its action
        (described,) = p.client("cloudwatch").describe_alarms(AlarmNames=[alarm.name])[
            "MetricAlarms"
        ]
        assert described["StateValue"] == "ALARM"
        assert described["AlarmActions"] == [p.topic_arn]
        # ... the on-call got its notification through that topic
        (page,) = p.notifications()
        message = json.loads(page["message"])
        assert message["AlarmName"] == alarm.name and message["NewStateValue"] == "ALARM"
        assert "out of the SDC alarms" in message["AlarmDescription"]
        # ... and nothing went to the workflow: the rule does not listen to the flood alarm
        assert fired == [] and p.executions == []
