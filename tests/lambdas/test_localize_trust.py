"""localize as an attacker who controls one training pod would try it: a job naming a node it
does not run on, one tenant's bad report or late node holding up another's finding, unbounded
text in a report. Each was reproduced on the code before this check existed (see the commit)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import (
    CLUSTER,
    TRAINING_NAMESPACE,
    alarm_event,
    grow_cluster,
    job_pods,
    put_node_metric,
    put_report,
    rank,
    report,
)

from sdc_remediation.errors import ReportNotYetVisible

GROUP = f"/sdc/{CLUSTER}"
ATTACKER = "attacker-job"
VICTIM = "victim-job"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _node(instance: str) -> str:
    return f"hyperpod-{instance}"


def test_a_job_cannot_name_a_node_it_does_not_run_on(cloud, k8s, invoke):
    # Given attacker-job's only pod runs on node A; another team's job runs on node B; the
    # attacker's report names node B with a pod that does not exist
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod(ATTACKER, _node(a), TRAINING_NAMESPACE, name="attacker-job-worker-0")
    k8s.add_job_pod(VICTIM, _node(b), TRAINING_NAMESPACE, name="victim-job-worker-0")
    put_node_metric(cloud.client("cloudwatch"), _node(b), t, job=ATTACKER)
    forged = report(
        time=t,
        suspects=[0],
        ranks={"0": rank(_node(b), b, 0, pod="attacker-job-worker-9")},
        job=ATTACKER,
    )
    put_report(cloud.client("logs"), GROUP, forged, t, stream=ATTACKER)

    # When the attacker's job's contributor fires
    out = invoke("localize", alarm_event(time=t, job=ATTACKER))

    # Then node B is not a suspect: no pod of attacker-job ran there; the claim is refused
    assert out["suspects"] == [] and out["pending"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "job" and refused["node_name"] == _node(b)
    assert "no pod of it" in refused["reason"] and ATTACKER in refused["reason"]
    # ... and the cluster was asked about the job's pods on that node, by label and field
    (listing,) = [
        r
        for r in k8s.requests
        if r.path.startswith(f"/api/v1/namespaces/{TRAINING_NAMESPACE}/pods?")
    ]
    assert "labelSelector=training.kubeflow.org%2Fjob-name%3Dattacker-job" in listing.path
    assert f"fieldSelector=spec.nodeName%3D{_node(b)}" in listing.path


def test_a_job_that_claims_another_jobs_name_in_its_own_stream_is_refused(cloud, k8s, invoke):
    # Given attacker-job writes, into its own stream, a report claiming to be victim-job (which
    # does run on node B)
    t = _now()
    b = cloud.nodes[1]
    k8s.add_job_pod(VICTIM, _node(b), TRAINING_NAMESPACE)
    put_node_metric(cloud.client("cloudwatch"), _node(b), t, job=VICTIM)
    forged = report(time=t, suspects=[0], ranks={"0": rank(_node(b), b, 0)}, job=VICTIM)
    put_report(cloud.client("logs"), GROUP, forged, t, stream=ATTACKER)

    # When victim-job's contributor fires (the attacker put the datum under its name) / Then
    # the report is not read as victim-job's: localize reads victim-job's own stream only, finds
    # no report there and waits (retried, then recorded): nothing is cordoned
    with pytest.raises(ReportNotYetVisible):
        invoke("localize", alarm_event(time=t, job=VICTIM))


def test_a_pod_that_ended_within_the_lookback_corroborates_and_an_older_one_does_not(
    cloud, k8s, invoke
):
    # Given the job's pod on node A ended a minute before the alarm (the job stopped on it), and
    # its pod on node B ended two hours before
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    minute_ago = (t - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    hours_ago = (t - timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    k8s.add_job_pod("llama-pretrain", _node(a), TRAINING_NAMESPACE, phase="Failed",
                    finished_at=minute_ago)  # fmt: skip
    k8s.add_job_pod("llama-pretrain", _node(b), TRAINING_NAMESPACE, phase="Succeeded",
                    finished_at=hours_ago)  # fmt: skip
    body = report(
        time=t, suspects=[0, 8], ranks={"0": rank(_node(a), a, 0), "8": rank(_node(b), b, 0)}
    )
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then A is a suspect, B is refused (its pod ended before the alarm's lookback)
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)]
    assert [r["node_name"] for r in out["refused"]] == [_node(b)]


def test_pods_of_another_namespace_or_job_do_not_corroborate(cloud, k8s, invoke):
    # Given node A runs a pod labelled with the job in another namespace, and a pod of another
    # job in the training namespace
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod("llama-pretrain", _node(a), "someone-else")
    k8s.add_job_pod(VICTIM, _node(a), TRAINING_NAMESPACE)
    put_report(
        cloud.client("logs"),
        GROUP,
        report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)}),
        t,
    )

    # When / Then: not corroborated
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == [] and out["refused"][0]["field"] == "job"


def test_a_named_pod_of_another_job_on_the_node_is_refused(cloud, k8s, invoke):
    # Given the report names rank 0's pod, which is on that node but another job's
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod(VICTIM, _node(a), TRAINING_NAMESPACE, name="victim-job-worker-0")
    k8s.add_job_pod("llama-pretrain", _node(a), TRAINING_NAMESPACE)
    ranks = {"0": rank(_node(a), a, 0, pod="victim-job-worker-0")}
    put_report(cloud.client("logs"), GROUP, report(time=t, suspects=[0], ranks=ranks), t)

    # When / Then
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == [] and out["refused"][0]["field"] == "ranks.0.pod_name"


def test_a_malformed_report_does_not_block_a_genuine_suspect(cloud, cluster_pods, invoke):
    # Given, in the alarm's window, a report with a reversed suspect_window (one pod's doing)
    # and a genuine report naming node A
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    logs, cw = cloud.client("logs"), cloud.client("cloudwatch")
    bad = report(time=t - timedelta(seconds=5), suspects=[3], ranks={"3": rank(_node(b), b, 3)})
    bad["suspect_window"] = [120, 100]
    put_report(logs, GROUP, bad, t - timedelta(seconds=5))
    put_report(logs, GROUP, report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)}), t)
    put_node_metric(cw, _node(a), t)
    put_node_metric(cw, _node(b), t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then A goes on to be remediated, and the bad report is refused and recorded, not silent;
    # B (named only by the refused report) is not waited for either
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)]
    (refused,) = out["refused"]
    assert refused["field"] == "suspect_window" and refused["stream"] == "llama-pretrain"
    assert out["pending"] == [{"job": "llama-pretrain", "node_name": _node(b)}]


def test_another_jobs_reports_and_series_are_not_read(cloud, cluster_pods, invoke):
    # Given another job's stream holds a malformed report and its series names node B, while
    # the alarm's job names node A
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    logs, cw = cloud.client("logs"), cloud.client("cloudwatch")
    other = report(time=t, suspects=[3], ranks={"3": rank(_node(b), b, 3)}, job="other-job")
    other["suspect_window"] = []
    put_report(logs, GROUP, other, t, stream="other-job")
    put_node_metric(cw, _node(b), t, job="other-job")
    put_report(logs, GROUP, report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)}), t)
    put_node_metric(cw, _node(a), t)

    # When the alarm's job's contributor fires
    out = invoke("localize", alarm_event(time=t))

    # Then only that job's data was read: nothing of other-job is refused, pending or named
    assert [s["node_name"] for s in out["suspects"]] == [_node(a)]
    assert out["refused"] == [] and out["pending"] == []


def test_an_unbounded_job_name_is_refused_and_the_output_stays_small(cloud, cluster_pods, invoke):
    # Given a report whose job is 350,000 characters (what once gave 351,077 bytes of localize
    # output, over Step Functions' 256 KiB) and verdict text with a line break
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)})
    body["job"] = "x" * 350_000
    body["verdicts"][0]["kind"] = "persistent\nBcc: x"
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then refused (the job is no job name), and the whole output is a few KiB of printable text
    (refused,) = out["refused"]
    assert refused["field"] == "job"
    size = len(json.dumps(out).encode())
    assert size < 8 * 1024, size
    assert "\n" not in refused["reason"]


def test_a_verdict_with_a_line_break_reaches_nobody_as_text(cloud, cluster_pods, invoke):
    # Given a genuine report whose confirmation kind is "persistent\nBcc: x"
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)})
    body["verdicts"][0]["kind"] = "persistent\nBcc: x"
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then the suspect's verdict is the contract's `unknown`, never the text
    assert out["suspects"][0]["verdict"] == "unknown"


def test_an_alarm_naming_more_nodes_than_the_output_lists_stays_bounded(cloud, k8s, invoke):
    # Given one report naming 100 real nodes of the job (each corroborated), more than localize
    # lists in one output
    t = _now()
    instances = grow_cluster(100)[:100]
    job_pods(k8s, instances)
    ranks = {str(r): rank(_node(i), i, 0) for r, i in enumerate(instances)}
    put_report(
        cloud.client("logs"), GROUP, report(time=t, suspects=list(range(100)), ranks=ranks), t
    )

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then 64 are listed and the count says 100 (the guard refuses the whole alarm by it)
    assert len(out["suspects"]) == 64 and out["suspect_count"] == 100
    assert len(json.dumps(out).encode()) < 128 * 1024


def test_a_huge_report_of_a_real_job_gives_a_small_output(cloud, cluster_pods, invoke):
    # Given a report of the alarm's job, well-formed, naming node A, that carries everything a
    # pod could pad it with: 2,000 tensor names of 500 characters (with escape sequences),
    # 20,000 non-finite ranks, 5,000 verdicts, a 60,000-character metric name and stray keys
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[0], ranks={"0": rank(_node(a), a, 0)})
    body["divergent_tensors"] = [f"layer.{n}.\x1b[2J" + "w" * 490 for n in range(2000)]
    body["nonfinite"] = list(range(20_000))
    body["verdicts"] = [
        {"pair": [n, n + 1], "third": n + 2, "suspect": 7, "kind": "persistent"}
        for n in range(5000)
    ] + [{"pair": [0, 1], "third": 2, "suspect": 0, "kind": "persistent"}]
    body["metric"] = {"name": "m" * 60_000, "value": 1.0}
    body["padding"] = "p" * 100_000
    assert len(json.dumps(body)) > 1_000_000
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then node A is the suspect with the counts, a few bounded printable names, and the whole
    # output is a few KiB (the report itself stays in CloudWatch Logs)
    (suspect,) = out["suspects"]
    assert suspect["node_name"] == _node(a) and suspect["verdict"] == "persistent"
    assert suspect["divergent_tensor_count"] == 2000 and suspect["nonfinite_count"] == 20_000
    assert len(suspect["divergent_tensors"]) <= 3
    assert all(len(n) <= 120 and "\x1b" not in n for n in suspect["divergent_tensors"])
    size = len(json.dumps(out).encode())
    assert size < 8 * 1024, size
