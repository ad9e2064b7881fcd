"""Per-pod report streams (``agentIdentity: pod-identity``, REPORT_STREAMS=pod): a job's reports
count only from streams of the job's own pods (issue 32, "any pod speaks for any job").

Under Pod Identity, IAM lets a pod write only ``<namespace>/<job>/<pod>`` streams ending in its
own name (the session tag). The job in the middle is the pod's to write, so localize checks that
the pod is the job's: a compromised pod of another job, a bare pod a namespace editor labels
with an operator-run job, a pod that is gone, or a stream by the job's name only, speak for
nobody; the job's real pod still names its node (no false refusal)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from remediation_factories import (
    CLUSTER,
    JOB,
    TRAINING_NAMESPACE,
    alarm_event,
    put_report,
    rank,
    report,
)

import sdc_contract as contract
from sdc_remediation.config import Settings
from sdc_remediation.errors import ConfigurationError
from sdc_remediation.logic.localize.streams import ReportStreams, StreamFilter

GROUP = f"/sdc/{CLUSTER}"


@pytest.fixture(autouse=True)
def per_pod_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.REPORT_STREAMS, contract.REPORT_STREAM_POD)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _node(instance: str) -> str:
    return f"hyperpod-{instance}"


def _stream(pod: str, job: str = JOB) -> str:
    return contract.pod_report_stream(TRAINING_NAMESPACE, job, pod)


def _report_naming(cloud, t: datetime, instance: str, stream: str, **fields) -> None:
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(instance), instance, 0)}, **fields)
    put_report(cloud.client("logs"), GROUP, body, t, stream=stream)


def test_the_jobs_own_pod_names_its_node(cloud, k8s, invoke):
    # Given the job's operator-owned pod on node A writes its report into its own stream
    t = _now()
    a = cloud.nodes[0]
    pod = k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    _report_naming(cloud, t, a, _stream(pod))

    # When the job's contributor fires
    out = invoke("localize", alarm_event(time=t))

    # Then A is the suspect, its report's stream recorded; nothing refused (no false alarm)
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)]
    assert out["suspects"][0]["report_log_stream"] == _stream(pod)
    assert out["refused"] == []


def test_a_pod_of_another_job_cannot_speak_for_this_one(cloud, k8s, invoke):
    # Given the job runs on node A, and a compromised pod of another job (its own stream is
    # <ns>/<its job>/<its pod>: IAM lets it write under any job's part) forges a report of
    # this job naming node B, in a stream under this job's prefix ending in its own name
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE)
    intruder = k8s.add_job_pod("other-job", _node(b), TRAINING_NAMESPACE)
    _report_naming(cloud, t, b, _stream(intruder))

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then B is no suspect: the report is refused on its stream, naming the writer's job
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "log_stream" and refused["stream"] == _stream(intruder)
    assert f"is not job {JOB}'s" in refused["reason"]


def test_a_report_in_another_jobs_streams_is_not_this_jobs(cloud, k8s, invoke):
    # Given a pod of another job writes a report claiming this job in its own job's stream
    t = _now()
    b = cloud.nodes[1]
    k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE)
    intruder = k8s.add_job_pod("other-job", _node(b), TRAINING_NAMESPACE)
    _report_naming(cloud, t, b, _stream(intruder, job="other-job"))

    # When / Then: whatever CloudWatch returns for the job's prefix, that report names nobody
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == []
    assert {r["field"] for r in out["refused"]} <= {"log_stream"}


def test_a_stream_named_by_the_job_only_is_no_proof(cloud, k8s, invoke):
    # Given a report in the shared-mode stream <job>, which no pod may write under Pod Identity
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    _report_naming(cloud, t, a, JOB)

    # When / Then: no suspect (the stream is not one of the job's pods')
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == []
    assert {r["field"] for r in out["refused"]} <= {"log_stream"}


def test_a_bare_pod_labelled_with_an_operator_run_job_writes_for_nobody(cloud, k8s, invoke):
    # Given the training operator runs the job on node A, and a namespace editor's bare pod
    # with the job's label (no owner) writes a report naming node B into its own stream
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE)
    bare = k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE, name="llama-helper", bare=True)
    _report_naming(cloud, t, b, _stream(bare))

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then refused on its stream: the operator does not own its writer
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "log_stream" and "does not own it" in refused["reason"]


def test_a_report_whose_writer_is_gone_cannot_be_checked(cloud, k8s, invoke):
    # Given the job runs on node A, and a report arrives from a stream whose pod does not exist
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    _report_naming(cloud, t, a, _stream(f"{JOB}-worker-99"))

    # When / Then: refused, saying why
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "log_stream" and "no longer exists" in refused["reason"]


def test_the_rank_map_is_read_from_the_reports_own_stream(cloud, k8s, invoke):
    # Given a report that gives rank 0's instance but not its node, and the job's rank map in
    # the writer's own stream, while another pod's stream holds a map placing rank 0 elsewhere
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    writer = k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    other = k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE)
    logs = cloud.client("logs")

    def rank_map(instance: str) -> dict:
        return {
            "schema": contract.RANKMAP_SCHEMA,
            "cluster": CLUSTER,
            "job": JOB,
            "time": t.isoformat().replace("+00:00", "Z"),
            "ranks": {"0": rank(_node(instance), instance, 0)},
        }

    put_report(logs, GROUP, rank_map(a), t, stream=_stream(writer))
    put_report(logs, GROUP, rank_map(b), t, stream=_stream(other))
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(a), None, 0, with_node=False)})
    put_report(logs, GROUP, body, t, stream=_stream(writer))

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then rank 0 is placed by the writer's map: node A
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)]


def test_report_streams_setting_is_validated_by_name(monkeypatch):
    monkeypatch.setenv(contract.REPORT_STREAMS, "node")
    with pytest.raises(ConfigurationError, match="REPORT_STREAMS must be one of"):
        _ = Settings().report_streams


def test_the_filters_read_each_jobs_pod_prefix_and_the_canarys_own_stream():
    streams = ReportStreams(mode=contract.REPORT_STREAM_POD, namespace="training")
    assert streams.filters([contract.CANARY_JOB, JOB]) == [
        StreamFilter(prefix=f"training/{JOB}/"),
        StreamFilter(names=(contract.CANARY_JOB,)),
    ]
    assert streams.accepts(contract.CANARY_JOB, contract.CANARY_JOB)
    assert not streams.accepts(f"training/{contract.CANARY_JOB}/p", contract.CANARY_JOB)
    assert streams.writer(f"training/{JOB}/{JOB}-worker-0", JOB) == f"{JOB}-worker-0"
    assert streams.writer(f"training/{JOB}/a/b", JOB) is None
    assert streams.writer(f"other/{JOB}/{JOB}-worker-0", JOB) is None
    assert ReportStreams().filters([JOB]) == [StreamFilter(names=(JOB,))]
    assert ReportStreams().accepts("anything", JOB)


@pytest.mark.parametrize(
    ("namespace", "job", "pod"),
    [("Team_A", JOB, "p"), ("training", "a/b", "p"), ("training", JOB, "P*")],
)
def test_a_pod_stream_name_refuses_what_cannot_name_it(namespace, job, pod):
    with pytest.raises(ValueError):
        contract.pod_report_stream(namespace, job, pod)
