"""CloudWatchPublisher against moto: exactly what an alarm, the rank map and liveness publish."""

from __future__ import annotations

import copy
import itertools
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer

from sdc_agent.alarm import Alarm, RankInfo, Verdict
from sdc_agent.publish import CloudWatchPublisher

REGION = "us-east-1"


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region; no real AWS, no instance metadata lookups."""
    for name in (
        "AWS_PROFILE",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "SDC_CLUSTER_NAME",
        "SDC_JOB_NAME",
        "SDC_SPOOL_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def info(rank: int, node: int) -> RankInfo:
    name = f"hyperpod-i-{node:017x}"
    return RankInfo(
        rank, name, name.removeprefix("hyperpod-"), f"GPU-{rank}", rank % 2, f"p-{rank}"
    )


RANKS = {r: info(r, r // 2) for r in range(6)}
NODE1 = "hyperpod-i-00000000000000001"
NODE2 = "hyperpod-i-00000000000000002"


def replay_alarm() -> Alarm:
    """Rank 3 (node 1) wrong as target and as replayer; rank 5 (node 2) named too."""
    return Alarm(
        step=10,
        check="compute",
        mismatched_pairs=[(3, 1), (5, 3)],
        culprits=[3],
        verdicts=[Verdict(pair=(5, 3), third=1, suspect=3, kind="persistent")],
        suspects=[3, 5],
        suspect_window=(5, 10),
        last_audit_pass=5,
        ranks={"3": RANKS[3], "5": RANKS[5]},
    )


def recorded_clients() -> tuple[Any, Any, list[dict[str, Any]]]:
    """boto3 clients that record every PutMetricData request as the publisher made it."""
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    logs = boto3.client("logs", region_name=REGION)
    calls: list[dict[str, Any]] = []
    cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.PutMetricData",
        lambda params, **_: calls.append(copy.deepcopy(params)),
    )
    return cloudwatch, logs, calls


def recorded_publisher(
    tmp_path: Any, job: str = "llama", **options: Any
) -> tuple[CloudWatchPublisher, Any, Any, list[dict[str, Any]]]:
    """A publisher for cluster "ml" on :func:`recorded_clients` (inside ``mock_aws``): the
    publisher, its CloudWatch and Logs clients, and the recorded PutMetricData requests."""
    cloudwatch, logs, calls = recorded_clients()
    publisher = CloudWatchPublisher(
        cluster_name="ml",
        job_name=job,
        cloudwatch_client=cloudwatch,
        logs_client=logs,
        spool_dir=str(tmp_path),
        **options,
    )
    return publisher, cloudwatch, logs, calls


def stream_messages(logs: Any, group: str, stream: str) -> list[dict[str, Any]]:
    events = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)
    return [json.loads(e["message"]) for e in events["events"]]


def metric_sum(cloudwatch: Any, name: str, dimensions: dict[str, str]) -> tuple[float, float]:
    """(Sum, SampleCount) of one exact metric series over the last hour (GetMetricData)."""
    now = datetime.now(UTC)
    metric = {
        "Namespace": "SDC",
        "MetricName": name,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
    }
    results = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {"Id": stat.lower(), "MetricStat": {"Metric": metric, "Period": 60, "Stat": stat}}
            for stat in ("Sum", "SampleCount")
        ],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
    )["MetricDataResults"]
    by_id = {r["Id"]: sum(r["Values"]) for r in results}
    return by_id["sum"], by_id["samplecount"]


def test_alarm_publishes_its_metrics_and_report_and_the_rank_map(tmp_path):
    with mock_aws():
        # Given a publisher for cluster "ml" and job "llama" (log group and stream do not exist)
        publisher, cloudwatch, logs, calls = recorded_publisher(tmp_path)
        alarm = replay_alarm()
        # When the guard publishes the rank map at start, then an alarm, then flushes
        publisher.publish_rank_map(RANKS)
        publisher.publish_alarm(alarm)
        assert publisher.flush(10) is True

        # Then the stream /sdc/ml / llama holds the rank map, then the report
        rankmap, report = stream_messages(logs, "/sdc/ml", "llama")
        assert rankmap["schema"] == "sdc.rankmap/v1"
        assert (rankmap["cluster"], rankmap["job"]) == ("ml", "llama")
        assert rankmap["ranks"] == {str(r): RANKS[r].to_dict() for r in range(6)}
        time_field = report.pop("time")
        assert report == {**alarm.to_dict(), "cluster": "ml", "job": "llama"}
        assert datetime.fromisoformat(time_field).tzinfo is not None and time_field.endswith("Z")

        # And exactly one PutMetricData: the cluster series, the job series (what the per-job
        # alarms watch) and one series per named node, high resolution, unit Count, the
        # alarm's count (2 mismatched pairs)
        (call,) = calls
        assert call["Namespace"] == "SDC"
        data = call["MetricData"]
        assert [d["Dimensions"] for d in data] == [
            [{"Name": "ClusterName", "Value": "ml"}],
            [{"Name": "ClusterName", "Value": "ml"}, {"Name": "JobName", "Value": "llama"}],
            [
                {"Name": "ClusterName", "Value": "ml"},
                {"Name": "JobName", "Value": "llama"},
                {"Name": "NodeName", "Value": NODE1},
            ],
            [
                {"Name": "ClusterName", "Value": "ml"},
                {"Name": "JobName", "Value": "llama"},
                {"Name": "NodeName", "Value": NODE2},
            ],
        ]
        for d in data:
            assert (d["MetricName"], d["Value"], d["Unit"], d["StorageResolution"]) == (
                "sdc_replay_mismatch",
                2.0,
                "Count",
                1,
            )
        # And CloudWatch holds those values on those series
        assert metric_sum(cloudwatch, "sdc_replay_mismatch", {"ClusterName": "ml"}) == (2.0, 1.0)
        node_series = {"ClusterName": "ml", "JobName": "llama", "NodeName": NODE1}
        assert metric_sum(cloudwatch, "sdc_replay_mismatch", node_series) == (2.0, 1.0)
        assert list(tmp_path.iterdir()) == []  # nothing spooled
        publisher.close(1)


@pytest.mark.parametrize(
    ("group_exists", "expected_calls"),
    [
        # The infrastructure created the log group: only the job's stream is created.
        (True, ["PutLogEvents", "CreateLogStream", "PutLogEvents"]),
        # No stack made /sdc/ml: the stream is tried, found to lack its group, and both made.
        (
            False,
            [
                "PutLogEvents",
                "CreateLogStream",
                "CreateLogGroup",
                "CreateLogStream",
                "PutLogEvents",
            ],
        ),
    ],
    ids=["existing-group", "missing-group"],
)
def test_only_what_is_missing_is_created_for_a_jobs_reports(tmp_path, group_exists, expected_calls):
    with mock_aws():
        # Given a job's first publish, with or without the stack's log group
        cloudwatch, logs, _ = recorded_clients()
        if group_exists:
            logs.create_log_group(logGroupName="/sdc/ml")
        logs_calls: list[str] = []
        logs.meta.events.register(
            "before-call.logs.*", lambda model, **_: logs_calls.append(model.name)
        )
        publisher = CloudWatchPublisher(
            cluster_name="ml",
            job_name="job-2",
            cloudwatch_client=cloudwatch,
            logs_client=logs,
            spool_dir=str(tmp_path),
        )
        # When an alarm is published
        publisher.publish_alarm(replay_alarm())
        assert publisher.flush(10)
        # Then the stream holds the report, and only what was missing was created (no
        # CreateLogGroup, nor its permission, where the group exists)
        assert logs_calls == expected_calls
        (report,) = stream_messages(logs, "/sdc/ml", "job-2")
        assert report["schema"] == "sdc.alarm/v1" and report["job"] == "job-2"
        publisher.close(1)


def liveness_calls(calls: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [
        {d["MetricName"]: d["Value"] for d in c["MetricData"]}
        for c in calls
        if c["MetricData"][0]["MetricName"] == "sdc_audit_pass"
    ]


def test_liveness_is_batched_to_one_call_per_minute(tmp_path):
    with mock_aws():
        publisher, cloudwatch, _logs, calls = recorded_publisher(tmp_path)
        # Given a first passing audit, sent at once (a new job shows up within seconds)
        publisher.publish_liveness(0, 1, 0)
        deadline = time.monotonic() + 5
        while not liveness_calls(calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness_calls(calls) == [{"sdc_audit_pass": 1.0, "sdc_weight_check_pass": 0.0}]
        # When 99 more audits and 10 weight checks pass within the next second
        for step in range(1, 100):
            publisher.publish_liveness(step, 1, 1 if step % 10 == 9 else 0)
        time.sleep(0.5)
        # Then no further PutMetricData went out (the next batch waits for the minute)
        assert len(liveness_calls(calls)) == 1
        # When the publisher is flushed (the exit path)
        assert publisher.flush(10)
        # Then the remaining counts went out in one more call, and the totals are exact
        batches = liveness_calls(calls)
        assert len(batches) == 2
        assert sum(b["sdc_audit_pass"] for b in batches) == 100
        assert sum(b["sdc_weight_check_pass"] for b in batches) == 10
        # On the {ClusterName, JobName} series
        series = {"ClusterName": "ml", "JobName": "llama"}
        assert metric_sum(cloudwatch, "sdc_audit_pass", series)[0] == 100
        assert metric_sum(cloudwatch, "sdc_weight_check_pass", series)[0] == 10
        publisher.close(1)


def test_liveness_after_the_interval_goes_out_without_a_flush(tmp_path):
    with mock_aws():
        publisher, _cloudwatch, _logs, calls = recorded_publisher(tmp_path, liveness_interval=0.4)
        sent_at: list[float] = []  # when each PutMetricData left (recorded as it is made)
        _cloudwatch.meta.events.register(
            "provide-client-params.cloudwatch.PutMetricData",
            lambda params, **_: (
                sent_at.append(time.monotonic())
                if params["MetricData"][0]["MetricName"] == "sdc_audit_pass"
                else None
            ),
        )
        # Given one pass (sent at once), then three more just after
        publisher.publish_liveness(0, 1, 0)
        deadline = time.monotonic() + 30
        while not liveness_calls(calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert liveness_calls(calls) == [{"sdc_audit_pass": 1.0, "sdc_weight_check_pass": 0.0}]
        for step in (1, 2, 3):
            publisher.publish_liveness(step, 1, 0)
        # When the sender goes on without a flush until all three went out (a busy machine may
        # split them over more than one interval: then over more than one batch)
        deadline = time.monotonic() + 60
        while sum_after_first(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Then they went out, exactly once each, and no batch left before its interval had
        # passed since the previous one
        assert sum_after_first(calls) == 3
        assert len(sent_at) == len(liveness_calls(calls)) >= 2
        gaps = [later - earlier for earlier, later in itertools.pairwise(sent_at)]
        assert min(gaps) >= 0.3, gaps
        publisher.close(1)


def sum_after_first(calls: list[dict[str, Any]]) -> float:
    """Audit passes in every liveness batch after the first."""
    return sum(b["sdc_audit_pass"] for b in liveness_calls(calls)[1:])


@pytest.fixture(scope="module")
def moto_server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_through_a_moto_server_with_boto3_standard_configuration(
    tmp_path, monkeypatch, moto_server
):
    # Given only the environment a pod would have: endpoint, region, credentials, SDC_* names
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("SDC_CLUSTER_NAME", "server-cluster")
    monkeypatch.setenv("SDC_JOB_NAME", "server-job")
    monkeypatch.setenv("SDC_SPOOL_DIR", str(tmp_path))
    publisher = CloudWatchPublisher()
    alarm = Alarm(
        step=7,
        check="compute",
        nonfinite=[3],
        suspects=[3],
        suspect_window=(6, 7),
        ranks={"3": RANKS[3]},
    )
    # When the alarm is published over HTTP
    publisher.publish_alarm(alarm)
    assert publisher.flush(10)
    # Then the server holds the report and the metric on both series
    logs = boto3.client("logs", region_name=REGION, endpoint_url=moto_server)
    cloudwatch = boto3.client("cloudwatch", region_name=REGION, endpoint_url=moto_server)
    (report,) = stream_messages(logs, "/sdc/server-cluster", "server-job")
    report.pop("time")
    assert report == {**alarm.to_dict(), "cluster": "server-cluster", "job": "server-job"}
    cluster = {"ClusterName": "server-cluster"}
    node = {**cluster, "JobName": "server-job", "NodeName": NODE1}
    assert metric_sum(cloudwatch, "sdc_nonfinite_grad", cluster) == (1.0, 1.0)
    assert metric_sum(cloudwatch, "sdc_nonfinite_grad", node) == (1.0, 1.0)
    publisher.close(1)


def test_missing_region_is_a_clear_error(monkeypatch, tmp_path):
    from sdc_agent.publish import PublishConfigError

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(PublishConfigError, match="AWS_REGION"):
        CloudWatchPublisher(cluster_name="c", job_name="j", spool_dir=str(tmp_path))


def test_without_boto3_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ImportError, match=r"pip install boto3 .*\./agent\[aws\]"):
        CloudWatchPublisher(cluster_name="c", job_name="j", spool_dir=str(tmp_path))


def test_aws_region_alone_is_enough(monkeypatch, tmp_path):
    # Given only AWS_REGION (boto3 by itself would find no region)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    # When the publisher builds its clients; Then they are in that region
    publisher = CloudWatchPublisher(cluster_name="c", job_name="j", spool_dir=str(tmp_path))
    assert publisher.region == "eu-west-1"
