"""benchmarks/cost.py: its call counter counts what a known call sequence sends, and its monthly
arithmetic gives the figures worked out by hand for a tiny case."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("sdc_cost", REPO / "benchmarks" / "cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sdc_cost"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


cost = _load()

REGION = "us-east-1"


def test_the_counter_counts_a_known_call_sequence_by_caller():
    counter = cost.CallCounter(default="harness")
    with mock_aws():
        with counter.installed():
            cloudwatch = boto3.client("cloudwatch", region_name=REGION)
            logs = boto3.client("logs", region_name=REGION)
            ddb = boto3.client("dynamodb", region_name=REGION)
            sns = boto3.client("sns", region_name=REGION)
        outside = boto3.client("cloudwatch", region_name=REGION)  # made after: not hooked
        ddb.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        logs.create_log_group(logGroupName="g")
        logs.create_log_stream(logGroupName="g", logStreamName="s")
        topic = sns.create_topic(Name="n")["TopicArn"]
        cost.register_table_keys("t", ("pk",))
        with counter.labelled("localize"):
            datum = {"MetricName": "m", "Value": 1.0, "Dimensions": [{"Name": "A", "Value": "a"}]}
            cloudwatch.put_metric_data(
                Namespace="SDC", MetricData=[datum, {**datum, "Dimensions": []}]
            )
            cloudwatch.put_metric_data(Namespace="SDC", MetricData=[datum])
            cloudwatch.get_metric_data(
                MetricDataQueries=[
                    {"Id": "a", "MetricStat": {"Metric": {"Namespace": "SDC", "MetricName": "m"},
                                               "Period": 60, "Stat": "Sum"}},
                    {"Id": "b", "Expression": "a * 2"},
                ],
                StartTime="2026-01-01T00:00:00Z",
                EndTime="2026-01-01T01:00:00Z",
            )  # fmt: skip
            logs.put_log_events(
                logGroupName="g",
                logStreamName="s",
                logEvents=[
                    {"timestamp": 1, "message": "x" * 100},
                    {"timestamp": 2, "message": "é"},
                ],
            )
            ddb.put_item(TableName="t", Item={"pk": {"S": "k"}, "v": {"S": "y" * 5000}})
            ddb.get_item(TableName="t", Key={"pk": {"S": "k"}})
            ddb.scan(
                TableName="t",
                FilterExpression="pk = :none",
                ExpressionAttributeValues={":none": {"S": "none"}},
                ConsistentRead=True,
            )
            sns.publish(TopicArn=topic, Message="hello")
        outside.put_metric_data(Namespace="SDC", MetricData=[datum])

    fn, harness = counter.by_label["localize"], counter.by_label["harness"]
    assert fn.operations == {
        "cloudwatch:PutMetricData": 2,
        "cloudwatch:GetMetricData": 1,
        "logs:PutLogEvents": 1,
        "dynamodb:PutItem": 1,
        "dynamodb:GetItem": 1,
        "dynamodb:Scan": 1,
        "sns:Publish": 1,
    }
    assert fn.datapoints == 3
    assert len(fn.series) == 2  # {A=a} twice, {} once
    assert fn.series[("SDC", "m", (("A", "a"),))] == 2
    assert fn.metrics_requested == 2
    assert (fn.log_events, fn.log_bytes) == (2, (100 + 26) + (2 + 26))  # "é" is 2 bytes
    assert fn.sns_publishes == 1
    assert fn.ddb_writes == [("t", '{"pk": {"S": "k"}}', False)]
    # An eventually consistent GetItem of a 5,007-byte item: 2 units of 4 KB, halved
    assert fn.ddb_rru == 1.0
    # A Scan is billed on the table it reads, not on what its filter kept: kept for later
    assert fn.scans == [("t", True)]
    # Setup calls went to the default label; the client made after the block was never hooked
    assert harness.operations["dynamodb:CreateTable"] == 1
    assert "cloudwatch:PutMetricData" not in harness.operations
    before = counter.snapshot()
    assert cost.diff(counter.snapshot(), before) == {}


def test_dynamodb_units_follow_the_sizing_rules():
    item = {"pk": {"S": "abc"}, "n": {"N": "12345"}, "m": {"M": {"x": {"BOOL": True}}}}
    # pk: 2 + 3; n: 1 + (ceil(5/2) + 1); m: 1 + 3 + (1 + 1)
    assert cost.dynamo_item_size(item) == 5 + 5 + 6
    assert cost.write_units(1024, transactional=False) == 1
    assert cost.write_units(1025, transactional=True) == 4
    assert cost.read_units([4096, 1], consistent=True) == 2.0
    assert cost.read_units([], consistent=False) == 0.5
    assert cost.read_units([10], consistent=True, transactional=True) == 2.0


def test_transitions_count_every_state_entered_and_every_retry():
    history = [
        {"type": "ExecutionStarted"},
        {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": "Localize"}},
        {"type": "LambdaFunctionScheduled"},
        {"type": "LambdaFunctionFailed"},
        {"type": "LambdaFunctionScheduled"},  # the retry: billed as a transition
        {"type": "TaskStateExited"},
        {"type": "ChoiceStateEntered", "stateEnteredEventDetails": {"name": "Any"}},
        {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": "Localize"}},
        {"type": "LambdaFunctionScheduled"},
        {"type": "ExecutionSucceeded"},
    ]
    assert cost.transitions_of(history) == {
        "transitions": 4,
        "states": {"Localize": 2, "Any": 1},
    }


def test_monthly_dollars_of_a_tiny_case_match_the_hand_computation():
    a = cost.Assumptions(nodes_per_job=64, gpus_per_node=8, job_starts_per_day=1.0)
    agent = {
        "liveness_interval_s": 60.0,
        "liveness": {"series": ["audit", "weights"]},
        "alarm": {"series": ["c", "j", "n"], "operations": {"cloudwatch:PutMetricData": 1},
                  "log_bytes": 1000},
        "rank_map_bytes_per_rank": 400.0,
    }  # fmt: skip
    # 128 nodes: 2 jobs of 64 nodes, 512 ranks each; no alarm
    idle = cost.monthly(agent, None, nodes=128, alarms_per_day=0, a=a)["agents"]
    # 2 jobs x 2 liveness series x $0.30
    assert idle["CloudWatch metrics"] == pytest.approx(1.20)
    # 2 jobs x 60 sends an hour x 730 hours = 87,600 PutMetricData at $0.01 per 1,000
    assert idle["CloudWatch API"] == pytest.approx(0.876)
    # 2 starts a day x 30.4167 days x 512 ranks x 400 bytes = 12.459 GB-millionths...
    gb = 2 * (730 / 24) * 512 * 400 / 1e9
    assert gb == pytest.approx(0.0124587, rel=1e-4)
    # ... at $0.50 ingested, and kept 30 of 30.4167 days at $0.03 per GB-month
    assert idle["CloudWatch Logs"] == pytest.approx(gb * 0.50 + gb * (30 / 30.41667) * 0.03)
    assert idle["Lambda"] == idle["Step Functions"] == 0.0

    # One alarm a day adds its 3 series for one hour each, one PutMetricData and its report
    busy = cost.monthly(agent, None, nodes=128, alarms_per_day=1, a=a)["agents"]
    alarms = 730 / 24
    assert busy["CloudWatch metrics"] - idle["CloudWatch metrics"] == pytest.approx(
        alarms * 3 / 730 * 0.30
    )
    assert busy["CloudWatch API"] - idle["CloudWatch API"] == pytest.approx(alarms * 0.01 / 1000)


def test_stack_arithmetic_of_a_tiny_measured_stack():
    a = cost.Assumptions(health_check_minutes=20, lambda_seconds=1.0, ledger_months=12)
    phase = {
        "executions": 1, "transitions": 10, "states": {"PollHealthCheck": 2},
        "state_log_bytes": 0, "lambda_log_bytes": 0, "invocations": 2,
        "invocations_outside_workflows": 0,
        "functions": {"poll_health_check": {"invocations": 2, "seconds": 0.2, "log_bytes": 0}},
        "emf_series": {}, "put_metric_data_series": {}, "operations": {},
        "get_metric_data_metrics": 0, "sns_publishes": 0, "ddb_wru": 4, "ddb_rru": 2,
        "scans": 0, "scan_rru": 0.0, "ledger_bytes_before": 0, "ledger_kept_added": 1000,
        "ledger_expiring_added": 0,
    }  # fmt: skip
    stack = {
        "production": {
            "memory_mb": {"poll_health_check": 512},
            "health_check_poll_s": 300,
            "schedules_s": {"sweeper": 86400},
            "alarms": [{"metrics": 3, "period": 300}, {"metrics": 0, "period": 10}],
            "dashboards": 1,
            "kms_keys": 0,
            "log_retention_days": 30,
        },
        "alarm": phase,
        "sweep": {
            **phase,
            "transitions": 0,
            "executions": 0,
            "ddb_wru": 0,
            "ddb_rru": 1.0,
            "scans": 1,
            "scan_rru": 1.0,
        },
        "poll_loop_transitions": 4,
        "canary_run_retention_s": 30 * 86400,
    }
    # A 20-minute check polled every 300 s: 4 polls, 2 measured, 2 more of 4 transitions
    extra = cost.poll_extrapolation(stack, a)
    assert (extra["real_polls"], extra["invocations"], extra["transitions"]) == (4, 2, 8)
    # ... each billed 1 s (the floor) at 0.5 GB
    assert extra["gb_seconds"] == pytest.approx(1.0)

    idle = cost.monthly({**_quiet_agent()}, stack, nodes=64, alarms_per_day=0, a=a)["stack"]
    # Alarms: 3 standard metrics and 1 high-resolution (an empty query counts as one)
    assert idle["CloudWatch alarms"] == pytest.approx(3 * 0.10 + 1 * 0.30)
    assert idle["CloudWatch dashboard"] == pytest.approx(3.00)
    # The daily sweep (30.4167 a month): 2 invocations, each billed 1 s at 0.5 GB
    sweeps = 730 / 24
    assert idle["Lambda"] == pytest.approx(sweeps * (2 * 0.20 / 1e6 + 2 * 0.5 * 0.0000133334))

    busy = cost.monthly({**_quiet_agent()}, stack, nodes=64, alarms_per_day=1, a=a)["stack"]
    # One alarm a day: (10 measured + 8 extrapolated) transitions at $0.025 per 1,000
    assert busy["Step Functions"] - idle["Step Functions"] == pytest.approx(
        sweeps * 18 * 0.025 / 1000
    )
    # ... 4 WRU and 2 RRU each; and the daily sweep's consistent Scan now reads a ledger of
    # 12 months x 30.4167 days x 1,000 bytes = 365,000 bytes: 90 units instead of 1
    assert busy["DynamoDB"] - idle["DynamoDB"] == pytest.approx(
        sweeps * (4 * 1.25 + 2 * 0.25) / 1e6 + sweeps * (90 - 1) * 0.25 / 1e6
    )


def _quiet_agent():
    return {
        "liveness_interval_s": 60.0,
        "liveness": {"series": []},
        "alarm": {"series": [], "operations": {}, "log_bytes": 0},
        "rank_map_bytes_per_rank": 0.0,
    }


def test_assumptions_name_the_bad_field():
    with pytest.raises(ValueError, match="nodes_per_job"):
        cost.Assumptions(nodes_per_job=0)
    with pytest.raises(ValueError, match="lambda_seconds"):
        cost.Assumptions(lambda_seconds=-1)


def test_the_agent_publishes_per_job_and_names_only_the_alarmed_node(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    agent = cost.measure_agent(ranks_per_job=16, gpus_per_node=8)
    live, alarm = agent["liveness"], agent["alarm"]
    # Liveness: two per-job series, at most one send per interval (plus the first at once and
    # the closing flush), however many steps reported passes
    assert len(live["series"]) == 2
    assert all("NodeName" not in s for s in live["series"])
    sends = live["operations"]["cloudwatch:PutMetricData"]
    assert 1 <= sends <= live["intervals"] + 2 < live["steps"]
    assert live["datapoints_per_send"] == 2
    # An alarm naming one node: the cluster's, the job's and that node's series, one call
    assert alarm["operations"] == {"cloudwatch:PutMetricData": 1, "logs:PutLogEvents": 1}
    assert len(alarm["series"]) == 3
    assert sum("NodeName" in s for s in alarm["series"]) == 1
    # The rank map: every rank's placement in the job's log stream
    assert agent["ranks"] == 16
    assert agent["rank_map"]["log_bytes"] > 16 * len("hyperpod-i-00000000000000000")
