"""Throttling and 5xx from CloudWatch (botocore Stubber): retried with backoff, then spooled."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.stub import ANY, Stubber

from sdc_agent.publish import CloudWatchPublisher, RetryPolicy
from tests.agent.test_publish_cloudwatch import REGION, aws_env  # noqa: F401  (autouse fixture)
from tests.agent.test_publish_unreachable import nonfinite_alarm

RETRY = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)


def stubbed_publisher(tmp_path: Any) -> tuple[CloudWatchPublisher, Stubber, Stubber]:
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    logs = boto3.client("logs", region_name=REGION)
    publisher = CloudWatchPublisher(
        cluster_name="ml",
        job_name="llama",
        spool_dir=str(tmp_path),
        cloudwatch_client=cloudwatch,
        logs_client=logs,
        retry=RETRY,
    )
    return publisher, Stubber(cloudwatch), Stubber(logs)


def put_log_params() -> dict[str, Any]:
    return {"logGroupName": "/sdc/ml", "logStreamName": "llama", "logEvents": ANY}


def test_throttling_is_retried_until_it_goes_through(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    # Given CloudWatch Logs throttles twice, then accepts; CloudWatch answers 503 once, then accepts
    logs.add_client_error("put_log_events", "ThrottlingException", http_status_code=400)
    logs.add_client_error("put_log_events", "ThrottlingException", http_status_code=400)
    logs.add_response("put_log_events", {}, put_log_params())
    cloudwatch.add_client_error("put_metric_data", "ServiceUnavailable", http_status_code=503)
    cloudwatch.add_response("put_metric_data", {}, {"Namespace": "SDC", "MetricData": ANY})
    with logs, cloudwatch:
        # When an alarm is published
        publisher.publish_alarm(nonfinite_alarm())
        # Then it is delivered after the retries: every stubbed answer was used, nothing spooled
        assert publisher.flush(10) is True
        logs.assert_no_pending_responses()
        cloudwatch.assert_no_pending_responses()
    assert publisher.spool.records() == []
    publisher.close(1)


def test_persistent_5xx_is_retried_then_only_the_unsent_part_is_spooled(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    # Given the report goes through but PutMetricData fails with 500 on every attempt
    logs.add_response("put_log_events", {}, put_log_params())
    for _ in range(RETRY.attempts):
        cloudwatch.add_client_error("put_metric_data", "InternalFailure", http_status_code=500)
    with logs, cloudwatch:
        publisher.publish_alarm(nonfinite_alarm())
        # When the exit path flushes
        assert publisher.flush(10) is False
        # Then PutMetricData was tried exactly `attempts` times
        cloudwatch.assert_no_pending_responses()
    # And the spool holds the metrics only: the report is not sent twice
    spool = publisher.spool
    (record,) = [spool.read(p) for p in spool.records()]
    assert record.message is None
    # the cluster, job and node series
    assert [m["MetricName"] for m in record.metrics] == ["sdc_nonfinite_grad"] * 3
    publisher.close(1)


def test_a_refusal_is_not_retried_and_the_alarm_is_kept(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    # Given the role may not put metrics (a configuration error, not a transient one)
    logs.add_response("put_log_events", {}, put_log_params())
    cloudwatch.add_client_error("put_metric_data", "AccessDenied", http_status_code=403)
    with logs, cloudwatch:
        publisher.publish_alarm(nonfinite_alarm())
        assert publisher.flush(10) is False
        # Then one attempt only (retrying a refusal helps nobody) ...
        cloudwatch.assert_no_pending_responses()
    # ... and the metrics wait in the spool for a fixed role
    spool = publisher.spool
    (record,) = [spool.read(p) for p in spool.records()]
    assert record.message is None and len(record.metrics) == 3
    publisher.close(1)


def test_after_a_transient_failure_queued_alarms_get_one_attempt_each(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    calls: list[int] = []
    logs.client.meta.events.register(
        "provide-client-params.logs.PutLogEvents", lambda **_: calls.append(1)
    )
    # Given CloudWatch Logs throttles every call
    for _ in range(RETRY.attempts + 2):
        logs.add_client_error("put_log_events", "ThrottlingException", http_status_code=400)
    with logs, cloudwatch:
        # When two alarms are published back to back, then the exit path flushes
        publisher.publish_alarm(nonfinite_alarm(7))
        publisher.publish_alarm(nonfinite_alarm(8))
        assert publisher.flush(10) is False
    # Then the first alarm got the full retry schedule, the second one attempt (AWS was known to
    # be out of reach), and the flush tried the spool once: 3 + 1 + 1 calls
    assert len(calls) == RETRY.attempts + 2
    # And both alarms wait in the spool
    spool = publisher.spool
    steps = sorted(json.loads(spool.read(p).message)["step"] for p in spool.records())
    assert steps == [7, 8]
    publisher.close(1)


def test_when_logs_refuse_the_report_the_metrics_still_fire_the_alarm(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    # Given a role that may put metrics but not log events
    logs.add_client_error("put_log_events", "AccessDeniedException", http_status_code=400)
    cloudwatch.add_response("put_metric_data", {}, {"Namespace": "SDC", "MetricData": ANY})
    with logs, cloudwatch:
        publisher.publish_alarm(nonfinite_alarm())
        assert publisher.flush(10) is False
        # Then the metrics went out (the CloudWatch alarm fires) ...
        cloudwatch.assert_no_pending_responses()
    # ... and only the report waits in the spool
    spool = publisher.spool
    (record,) = [spool.read(p) for p in spool.records()]
    assert json.loads(record.message)["step"] == 7 and record.metrics == ()
    publisher.close(1)


def test_an_alarm_aws_rejects_as_invalid_is_kept_aside_and_not_sent_again(tmp_path):
    publisher, cloudwatch, logs = stubbed_publisher(tmp_path)
    # Given CloudWatch rejects the alarm's metric data as invalid (not a permission, not an outage)
    logs.add_response("put_log_events", {}, put_log_params())
    cloudwatch.add_client_error("put_metric_data", "InvalidParameterValue", http_status_code=400)
    with logs, cloudwatch:
        publisher.publish_alarm(nonfinite_alarm())
        # When the exit path flushes, twice (no further answer is stubbed: a re-send would fail)
        assert publisher.flush(10) is False
        assert publisher.flush(10) is True
        # Then it was sent once: no retry, no re-send from the spool
        cloudwatch.assert_no_pending_responses()
    # And the unsent metrics are kept aside with the reason, out of the drained spool
    assert publisher.spool.records() == []
    (kept,) = publisher.spool.rejected_directory.glob("*.jsonl")
    record = publisher.spool.read(kept)
    assert record.message is None and len(record.metrics) == 3
    assert "InvalidParameterValue" in kept.with_name(kept.name + ".reason").read_text()
    publisher.close(1)
