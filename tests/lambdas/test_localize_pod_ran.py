"""Corroboration by a pod that ran: a pod that never started, or one that a namespace editor
labels with an operator-run job and binds to a node, is no proof that the job ran there (issue
32: a bare Pending pod with the job's label, bound to a victim node by ``spec.nodeName`` with an
image that does not exist, had its node cordoned)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import (
    CLUSTER,
    TRAINING_NAMESPACE,
    alarm_event,
    put_report,
    rank,
    report,
)

from sdc_remediation.clients.kube import pod_ran_since, training_owner

GROUP = f"/sdc/{CLUSTER}"
JOB = "llama-pretrain"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _node(instance: str) -> str:
    return f"hyperpod-{instance}"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _report_naming(cloud, t: datetime, instance: str) -> None:
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(instance), instance, 0)})
    put_report(cloud.client("logs"), GROUP, body, t)


@pytest.mark.parametrize("phase", ["Pending", "Unknown"])
def test_a_pod_that_never_ran_on_the_node_does_not_corroborate(cloud, k8s, invoke, phase):
    # Given the job runs on node A (operator-owned pod) and a bare pod with the job's label is
    # bound to victim node B by nodeName with an image that never pulls: it stays Pending
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE, phase=phase, started=False, bare=True)
    _report_naming(cloud, t, b)

    # When the job's contributor fires with a report naming node B
    out = invoke("localize", alarm_event(time=t))

    # Then node B is no suspect: the claim is refused on the job, nothing is cordoned
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "job" and refused["node_name"] == _node(b)
    assert "never started" in refused["reason"]


def test_an_ended_pod_whose_container_never_started_does_not_corroborate(cloud, k8s, invoke):
    # Given the job's only pod on node A failed a minute ago without ever starting a container
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE, phase="Failed", started=False)
    _report_naming(cloud, t, a)

    # When / Then: refused
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == [] and out["refused"][0]["field"] == "job"


def test_a_bare_pod_labelled_with_an_operator_run_job_does_not_corroborate(cloud, k8s, invoke):
    # Given the training operator runs the job (its PyTorchJob owns the pod on node A), and a
    # namespace editor runs a bare pod with the job's label on node B (Running: a real image)
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE)
    k8s.add_job_pod(JOB, _node(b), TRAINING_NAMESPACE, bare=True)
    _report_naming(cloud, t, b)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then B is refused: the operator runs the job, and that pod is not the operator's
    assert out["suspects"] == []
    assert [(r["field"], r["node_name"]) for r in out["refused"]] == [("job", _node(b))]


def test_a_pod_owned_by_another_jobs_operator_does_not_corroborate(cloud, k8s, invoke):
    # Given node A's only pod carries the job's label but another PyTorchJob controls it
    t = _now()
    a = cloud.nodes[0]
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "other-job"}
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE, owner=owner)
    _report_naming(cloud, t, a)

    # When / Then: refused (its label and its owner disagree)
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == [] and out["refused"][0]["field"] == "job"


def test_a_job_of_bare_pods_only_is_corroborated_by_a_running_one(cloud, k8s, invoke):
    # Given a job no operator runs (bare pods with its label, e.g. a StatefulSet-less launcher),
    # with a running pod on node A
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod(JOB, _node(a), TRAINING_NAMESPACE, bare=True)
    _report_naming(cloud, t, a)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then A is a suspect (fault-free: no false refusal), after one look at the job's pods
    # across the namespace to see whether an operator owns them
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)] and out["refused"] == []
    listings = [
        r.path for r in k8s.requests if r.path.startswith("/api/v1/namespaces/training/pods?")
    ]
    assert len(listings) == 2 and "fieldSelector" not in listings[1]


def test_pod_ran_since_reads_phase_start_and_container_times():
    # Given pods as the API returns them
    since = _now() - timedelta(minutes=30)
    start = _iso(since + timedelta(minutes=1))
    end = _iso(since + timedelta(minutes=5))
    old = _iso(since - timedelta(minutes=5))

    def ended(terminated: dict, start_time: str | None = start) -> dict:
        status = {
            "phase": "Succeeded",
            "containerStatuses": [{"state": {"terminated": terminated}}],
        }
        if start_time:
            status["startTime"] = start_time
        return {"status": status}

    # When / Then: Running counts; Pending, Unknown and no phase do not
    assert pod_ran_since({"status": {"phase": "Running"}}, since)
    for phase in ("Pending", "Unknown", None):
        assert not pod_ran_since({"status": {"phase": phase}}, since)
    # an ended pod counts only with a start time, a started container, and an end in the lookback
    assert pod_ran_since(ended({"startedAt": start, "finishedAt": end}), since)
    assert not pod_ran_since(ended({"startedAt": start, "finishedAt": end}, None), since)
    assert not pod_ran_since(ended({"finishedAt": end}), since)
    assert not pod_ran_since(ended({"startedAt": "1970-01-01T00:00:00Z", "finishedAt": end}), since)
    assert not pod_ran_since(ended({"startedAt": old, "finishedAt": old}, old), since)


def test_training_owner_is_the_controller_reference_of_an_operator_kind():
    # Given owner references of several shapes / When / Then
    def pod(*refs: dict) -> dict:
        return {"metadata": {"ownerReferences": list(refs)}}

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "controller": True}
    assert training_owner(pod(job)) == ("PyTorchJob", "j")
    trainer = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "t",
               "controller": True}  # fmt: skip
    assert training_owner(pod(trainer)) == ("TrainJob", "t")
    assert training_owner(pod({**job, "controller": False})) is None
    assert training_owner(pod({**job, "apiVersion": "evil.example.com/v1"})) is None
    assert training_owner(pod({"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                               "controller": True})) is None  # fmt: skip
    assert training_owner({"metadata": {}}) is None
