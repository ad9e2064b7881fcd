"""Per-pod report streams (SDC_REPORT_STREAM=pod): the report and the rank map go to the pod's
own stream ``<namespace>/<job>/<pod>``, the only one the stack's pod-identity policy lets the pod
write, and the spool sends only what is addressed to that stream."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from moto import mock_aws

from sdc_agent.publish import CloudWatchPublisher, PublishConfigError, PublishSettings, Spool
from sdc_agent.publish.events import alarm_delivery
from sdc_agent.publish.spool import FOREIGN
from tests.agent.test_publish_cloudwatch import (  # noqa: F401  (aws_env is an autouse fixture)
    RANKS,
    aws_env,
    recorded_clients,
    replay_alarm,
    stream_messages,
)

POD_STREAM = "team-a/llama/llama-master-0"
POD_ENV = {
    "SDC_CLUSTER_NAME": "ml",
    "SDC_JOB_NAME": "llama",
    "SDC_REPORT_STREAM": "pod",
    "POD_NAMESPACE": "team-a",
    "POD_NAME": "llama-master-0",
}


@pytest.fixture(autouse=True)
def no_pod_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the pod's own variables leak in from the machine running the tests."""
    for name in ("SDC_REPORT_STREAM", "POD_NAMESPACE", "POD_NAME"):
        monkeypatch.delenv(name, raising=False)


def pod_env(monkeypatch: pytest.MonkeyPatch, **changes: str | None) -> None:
    """Set the environment of pod llama-master-0 of job llama in namespace team-a, with
    ``changes`` (None removes a variable)."""
    for name, value in {**POD_ENV, **changes}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def publisher_on_moto(tmp_path: Any, **options: Any) -> tuple[CloudWatchPublisher, Any]:
    """A publisher configured by the environment alone, on moto's clients: it and its Logs
    client."""
    cloudwatch, logs, _ = recorded_clients()
    publisher = CloudWatchPublisher(
        cloudwatch_client=cloudwatch, logs_client=logs, spool_dir=str(tmp_path), **options
    )
    return publisher, logs


def streams(logs: Any, group: str = "/sdc/ml") -> list[str]:
    return [s["logStreamName"] for s in logs.describe_log_streams(logGroupName=group)["logStreams"]]


def test_in_pod_mode_the_report_and_the_rank_map_go_to_the_pods_own_stream(tmp_path, monkeypatch):
    pod_env(monkeypatch)
    with mock_aws():
        # Given a publisher of pod llama-master-0 (job llama, namespace team-a) in pod mode
        publisher, logs = publisher_on_moto(tmp_path)
        assert publisher.settings.log_stream == POD_STREAM
        # When it publishes the rank map and an alarm
        publisher.publish_rank_map(RANKS)
        publisher.publish_alarm(replay_alarm())
        assert publisher.flush(10) is True
        # Then both are in the pod's stream, and there is no stream named by the job
        rankmap, report = stream_messages(logs, "/sdc/ml", POD_STREAM)
        assert rankmap["schema"] == "sdc.rankmap/v1" and report["schema"] == "sdc.alarm/v1"
        # And the events still name the job (localize reads the job from them)
        assert (rankmap["job"], report["job"], report["cluster"]) == ("llama", "llama", "ml")
        assert streams(logs) == [POD_STREAM]
        publisher.close(1)


def test_the_default_mode_still_writes_the_jobs_stream(tmp_path, monkeypatch):
    # Given the pod's variables but no SDC_REPORT_STREAM
    pod_env(monkeypatch, SDC_REPORT_STREAM=None)
    with mock_aws():
        publisher, logs = publisher_on_moto(tmp_path)
        assert publisher.settings.report_stream == "job"
        # When it publishes the rank map and an alarm
        publisher.publish_rank_map(RANKS)
        publisher.publish_alarm(replay_alarm())
        assert publisher.flush(10) is True
        # Then both are in the stream named by the job, as before
        assert [m["schema"] for m in stream_messages(logs, "/sdc/ml", "llama")] == [
            "sdc.rankmap/v1",
            "sdc.alarm/v1",
        ]
        assert streams(logs) == ["llama"]
        publisher.close(1)


def test_arguments_choose_the_pod_stream_over_the_environment(tmp_path, monkeypatch):
    # Given an environment in the default mode with no pod variables
    pod_env(monkeypatch, SDC_REPORT_STREAM=None, POD_NAMESPACE=None, POD_NAME=None)
    with mock_aws():
        # When the publisher is told the mode, the namespace and the pod
        publisher, _ = publisher_on_moto(
            tmp_path, report_stream="pod", pod_namespace="team-b", pod_name="llama-worker-3"
        )
        # Then it writes that pod's stream
        assert publisher.settings.log_stream == "team-b/llama/llama-worker-3"
        publisher.close(1)


def test_a_spooled_alarm_is_resent_into_the_pods_stream(tmp_path, monkeypatch):
    pod_env(monkeypatch)
    with mock_aws():
        # Given an alarm spooled by a pod-mode publisher (published after close: spooled directly)
        first, logs = publisher_on_moto(tmp_path)
        first.close(1)
        first.publish_alarm(replay_alarm())
        (path,) = first.spool.records()
        assert first.spool.read(path).log_stream == POD_STREAM
        # When a later publisher of the same pod starts and flushes
        second, _ = publisher_on_moto(tmp_path)
        assert second.flush(10) is True
        # Then the report went to the pod's stream, and the spool is empty
        (report,) = stream_messages(logs, "/sdc/ml", POD_STREAM)
        assert report["schema"] == "sdc.alarm/v1" and report["job"] == "llama"
        assert streams(logs) == [POD_STREAM]
        assert second.spool.records() == []
        second.close(1)


def test_in_pod_mode_a_record_addressed_to_the_jobs_stream_is_foreign(tmp_path, monkeypatch):
    pod_env(monkeypatch)
    settings = PublishSettings.from_env(spool_dir=str(tmp_path))
    spool = Spool.for_job(settings)
    # Given, in the pod's spool, a record of the same job addressed to the stream "llama"
    # (written in job mode, or planted: the pod-identity policy would refuse it anyway)
    job_stream = alarm_delivery(
        replay_alarm(), cluster="ml", job="llama", namespace="SDC", log_group="/sdc/ml", time="t"
    )
    assert job_stream.log_stream == "llama"
    assert spool.put(job_stream)
    with mock_aws():
        # When a pod-mode publisher starts and flushes
        publisher, logs = publisher_on_moto(tmp_path)
        publisher.flush(10)
        # Then the record was set aside unsent, and nothing was written anywhere
        assert publisher.spool.records() == []
        (kept,) = spool.directory.glob(f"*{FOREIGN}")
        assert json.loads(kept.read_text())["log_stream"] == "llama"
        assert logs.describe_log_groups()["logGroups"] == []
        publisher.close(1)


def test_in_job_mode_a_record_addressed_to_a_pod_stream_is_foreign(tmp_path):
    settings = PublishSettings(cluster_name="ml", job_name="llama", spool_dir=str(tmp_path))
    pod_record = alarm_delivery(
        replay_alarm(),
        cluster="ml",
        job="llama",
        namespace="SDC",
        log_group="/sdc/ml",
        time="t",
        log_stream=POD_STREAM,
    )
    spool = Spool.for_job(settings)
    assert spool.owner is not None
    assert spool.owner.mismatch(pod_record) == f"its log stream is /sdc/ml/{POD_STREAM}"
    assert spool.owner.mismatch(replace(pod_record, log_stream="llama")) is None


def test_each_pod_stream_spools_apart_from_the_job_stream(tmp_path):
    # A pod's records wait for that pod (only it may write its stream), not for another pod of
    # the job on the same node; the job mode's directory is unchanged
    job_mode = Spool.for_job(
        PublishSettings(cluster_name="ml", job_name="llama", spool_dir=str(tmp_path))
    )
    pods = [
        Spool.for_job(
            PublishSettings.from_env({**POD_ENV, "POD_NAME": pod}, spool_dir=str(tmp_path))
        )
        for pod in ("llama-master-0", "llama-worker-0")
    ]
    assert job_mode.directory.name.startswith("job-ml-llama-")
    assert pods[0].directory.name.startswith("job-ml-team-a_llama_llama-master-0-")
    assert len({job_mode.directory, *(p.directory for p in pods)}) == 3


# --- settings errors name the variable


def from_env(**changes: str | None) -> PublishSettings:
    env = {k: v for k, v in {**POD_ENV, **changes}.items() if v is not None}
    return PublishSettings.from_env(env, spool_dir="/tmp/unused")


def test_pod_mode_builds_the_stream_from_namespace_job_and_pod():
    settings = from_env()
    assert (settings.report_stream, settings.log_stream) == ("pod", POD_STREAM)
    assert settings.job_name == "llama"


def test_pod_mode_without_pod_namespace_names_the_variable():
    with pytest.raises(PublishConfigError, match="POD_NAMESPACE") as error:
        from_env(POD_NAMESPACE=None)
    assert "metadata.namespace" in str(error.value) and "pod-identity" in str(error.value)


def test_pod_mode_without_pod_name_does_not_fall_back_to_hostname():
    # HOSTNAME is cut to 63 characters; IAM checks the full pod name
    with pytest.raises(PublishConfigError, match="POD_NAME") as error:
        from_env(POD_NAME=None, HOSTNAME="llama-master-0")
    assert "HOSTNAME is not used" in str(error.value) and "metadata.name" in str(error.value)


def test_pod_mode_with_an_invalid_namespace_names_the_variable():
    with pytest.raises(PublishConfigError, match="POD_NAMESPACE") as error:
        from_env(POD_NAMESPACE="Team_A")
    assert "'Team_A'" in str(error.value)


def test_pod_mode_with_an_invalid_pod_name_names_the_variable():
    with pytest.raises(PublishConfigError, match=r"POD_NAME.*'Llama_0'"):
        from_env(POD_NAME="Llama_0")


def test_pod_mode_with_a_job_name_that_cannot_be_in_the_stream_names_the_variable():
    with pytest.raises(PublishConfigError, match="SDC_JOB_NAME"):
        from_env(SDC_JOB_NAME="team/llama")


def test_an_unknown_mode_names_the_variable():
    with pytest.raises(PublishConfigError, match=r"SDC_REPORT_STREAM.*'job', 'pod'.*'node'"):
        from_env(SDC_REPORT_STREAM="node")
    with pytest.raises(PublishConfigError, match="report_stream"):
        PublishSettings(cluster_name="ml", job_name="llama", report_stream="node")


@pytest.mark.parametrize("stream", ["a:b", "a*", "x" * 513])
def test_an_invalid_explicit_log_stream_is_refused(stream):
    with pytest.raises(PublishConfigError, match="log_stream"):
        PublishSettings(cluster_name="ml", job_name="llama", log_stream=stream)


def test_an_explicit_log_stream_must_be_one_of_the_jobs_pod_streams_in_pod_mode():
    # The stack's pod-identity policy would refuse any other stream, later, in the background
    with pytest.raises(PublishConfigError, match="POD_NAMESPACE/SDC_JOB_NAME/POD_NAME"):
        PublishSettings(
            cluster_name="ml", job_name="llama", report_stream="pod", log_stream="team-a/gpt/p-0"
        )
    with pytest.raises(PublishConfigError, match="log_stream"):
        PublishSettings(cluster_name="ml", job_name="llama", report_stream="pod")
    settings = PublishSettings(
        cluster_name="ml", job_name="llama", report_stream="pod", log_stream=POD_STREAM
    )
    assert settings.log_stream == POD_STREAM


def test_the_default_mode_names_the_stream_by_the_job():
    settings = from_env(SDC_REPORT_STREAM=None, POD_NAMESPACE=None, POD_NAME=None)
    assert (settings.report_stream, settings.log_stream) == ("job", "llama")
    explicit = PublishSettings(cluster_name="ml", job_name="llama", log_stream="custom/stream")
    assert explicit.log_stream == "custom/stream"
