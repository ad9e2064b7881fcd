"""localize: alarm event -> suspects, against moto CloudWatch/Logs/SageMaker and the k8s stand-in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import (
    CLUSTER,
    TRAINING_NAMESPACE,
    alarm_event,
    put_node_metric,
    put_report,
    rank,
    report,
)

from sdc_remediation.errors import InvalidAlarmEvent, ReportNotYetVisible

GROUP = f"/sdc/{CLUSTER}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_localize_names_the_reported_node_with_its_instance_group(cloud, cluster_pods, invoke):
    # Given: the agent published a per-node series and a report naming rank 3 on workers-1
    t = _now()
    instance = cloud.nodes[1]
    node = f"hyperpod-{instance}"
    put_node_metric(cloud.client("cloudwatch"), node, t - timedelta(seconds=20))
    body = report(
        time=t - timedelta(seconds=20), suspects=[3], ranks={"3": rank(node, instance, 3)}
    )
    put_report(cloud.client("logs"), GROUP, body, t - timedelta(seconds=20))

    # When: the alarm's state-change event arrives
    out = invoke("localize", alarm_event(time=t))

    # Then: one suspect, with the node, instance, group and evidence from the report
    assert out["ambiguous"] is False
    assert out["reports"] == 1
    [suspect] = out["suspects"]
    assert suspect["node_name"] == node
    assert suspect["instance_id"] == instance
    assert suspect["instance_group"] == "workers"
    assert suspect["verdict"] == "persistent"
    assert suspect["suspect_window"] == [100, 120]
    assert suspect["ranks"]["3"]["gpu_uuid"] == f"GPU-{node}-3"
    assert out["alarm"]["cluster_name"] == CLUSTER
    assert out["alarm"]["metric_name"] == "sdc_replay_mismatch"
    assert out["alarm"]["job"] == "llama-pretrain"
    assert out["refused"] == [] and out["pending"] == [] and out["suspect_count"] == 1


def test_localize_maps_rank_to_node_through_the_pod_when_the_report_lacks_it(cloud, k8s, invoke):
    # Given: the report knows rank 5's pod but not its node; Kubernetes schedules that pod on a node
    t = _now()
    instance = cloud.nodes[2]
    node = f"hyperpod-{instance}"
    k8s.add_job_pod("llama-pretrain", node, TRAINING_NAMESPACE, name="trainer-worker-1")
    body = report(
        time=t,
        suspects=[5],
        ranks={"5": rank(node, None, 5, pod="trainer-worker-1", with_node=False)},
    )
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: the pod lookup (in the jobs' namespace) named the node, and the instance id came
    # from the node name
    [suspect] = out["suspects"]
    assert suspect["node_name"] == node
    assert suspect["instance_id"] == instance
    paths = [r.path.split("?")[0] for r in k8s.requests]
    assert paths == [
        "/api/v1/namespaces/training/pods/trainer-worker-1",
        "/api/v1/namespaces/training/pods",  # the corroboration: the job's pods on the node
    ]


def test_localize_uses_the_rank_map_when_the_report_has_no_entry_for_the_rank(
    cloud, cluster_pods, invoke
):
    # Given: a rank-map event from job start, and a report that names rank 7 without details
    t = _now()
    instance = cloud.nodes[3]
    node = f"hyperpod-{instance}"
    logs = cloud.client("logs")
    rank_map = {
        "schema": "sdc.rankmap/v1",
        "cluster": CLUSTER,
        "job": "llama-pretrain",
        "time": t.isoformat(),
        "ranks": {"7": rank(node, instance, 7)},
    }
    put_report(logs, GROUP, rank_map, t - timedelta(hours=5))
    put_report(logs, GROUP, report(time=t, suspects=[7], ranks={}), t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then
    assert [s["node_name"] for s in out["suspects"]] == [node]


def test_localize_reports_ambiguous_when_no_report_names_anybody(cloud, invoke):
    # Given: a weights disagreement without a strict majority: suspects null
    t = _now()
    body = report(time=t, suspects=None, ranks={}, check="weights", verdicts=[])
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: nobody is named
    assert out["ambiguous"] is True
    assert out["suspects"] == []


def test_localize_refuses_an_instance_hyperpod_does_not_know(cloud, cluster_pods, invoke):
    # Given: a report naming a node whose instance is not in the HyperPod cluster
    t = _now()
    body = report(
        time=t,
        suspects=[1],
        ranks={"1": rank("hyperpod-i-0badbadbadbadbad0", "i-0badbadbadbadbad0", 1)},
    )
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: refused with the reason, never a guess (and not ambiguous: it named somebody)
    assert out["suspects"] == [] and out["ambiguous"] is False
    (refused,) = out["refused"]
    assert refused["error"] == "InstanceNotInCluster"
    assert "i-0badbadbadbadbad0" in refused["reason"]
    assert refused["node_name"] == "hyperpod-i-0badbadbadbadbad0"


def test_localize_refuses_a_rank_whose_pod_kubernetes_does_not_know(cloud, k8s, invoke):
    # Given: the report only knows a pod that Kubernetes does not have
    t = _now()
    body = report(time=t, suspects=[2], ranks={"2": {"pod_name": "gone-pod", "local_rank": 2}})
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then
    (refused,) = out["refused"]
    assert refused["error"] == "NodeNotFound" and "gone-pod" in refused["reason"]
    assert out["suspects"] == []


def test_localize_waits_for_a_report_that_is_not_visible_yet(cloud, invoke):
    # Given: the per-node series is there but no report (CloudWatch Logs lags)
    t = _now()
    put_node_metric(
        cloud.client("cloudwatch"), f"hyperpod-{cloud.nodes[0]}", t - timedelta(seconds=5)
    )

    # When / Then: a transient error the workflow retries
    with pytest.raises(ReportNotYetVisible):
        invoke("localize", alarm_event(time=t))


def test_a_node_whose_report_is_not_visible_yet_does_not_hold_up_the_others(
    cloud, cluster_pods, invoke
):
    # Given: two nodes have non-zero series, the only visible report names one of them
    t = _now()
    a, b = (f"hyperpod-{i}" for i in cloud.nodes[:2])
    cw = cloud.client("cloudwatch")
    put_node_metric(cw, a, t - timedelta(seconds=5))
    put_node_metric(cw, b, t - timedelta(seconds=5))
    put_report(
        cloud.client("logs"),
        GROUP,
        report(time=t, suspects=[0], ranks={"0": rank(a, cloud.nodes[0])}),
        t,
    )

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: the named node is a suspect now; the other one is pending (looked for again in its
    # own Map item), and both count towards the alarm's size
    assert [s["node_name"] for s in out["suspects"]] == [a]
    assert out["pending"] == [{"job": "llama-pretrain", "node_name": b}]
    assert out["suspect_count"] == 2


def test_a_pending_node_is_localized_once_its_report_is_visible(cloud, cluster_pods, invoke):
    # Given: a pending node of the alarm's job, and (later) the report naming it
    t = _now()
    node = f"hyperpod-{cloud.nodes[1]}"
    located = {
        "alarm": alarm_event_state(t),
        "pending": {"job": "llama-pretrain", "node_name": node},
        "execution": "exec-1",
    }
    with pytest.raises(ReportNotYetVisible, match=node):
        invoke("localize", located)
    put_report(
        cloud.client("logs"),
        GROUP,
        report(time=t, suspects=[4], ranks={"4": rank(node, cloud.nodes[1], 4)}),
        t,
    )

    # When
    suspect = invoke("localize", located)

    # Then: its suspect, checked and corroborated as every other
    assert suspect["node_name"] == node and suspect["instance_group"] == "workers"


def alarm_event_state(t: datetime) -> dict:
    """localize's ``alarm`` for an event at ``t`` (what a pending node's Map item carries)."""
    from remediation_factories import alarm_state

    return alarm_state(t)


def test_localize_treats_a_node_a_report_mentions_but_does_not_blame_as_explained(
    cloud, cluster_pods, invoke
):
    # Given: a non-finite rank whose batch a third GPU also failed on (bad data): the report
    # lists the rank and its node but blames nobody, and an older agent still published a
    # per-node series for that node
    t = _now()
    node = f"hyperpod-{cloud.nodes[0]}"
    put_node_metric(cloud.client("cloudwatch"), node, t - timedelta(seconds=5))
    body = report(time=t, suspects=None, ranks={"3": rank(node, cloud.nodes[0], 3)})
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: ambiguous at once (humans told), not retried until the workflow gives up
    assert out["ambiguous"] is True and out["suspects"] == []


def test_localize_ignores_reports_outside_the_alarm_window(cloud, invoke):
    # Given: only an old report (an hour before the alarm)
    t = _now()
    old = t - timedelta(hours=1)
    put_report(
        cloud.client("logs"),
        GROUP,
        report(time=old, suspects=[0], ranks={"0": rank("hyperpod-x", cloud.nodes[0])}),
        old,
    )

    # When / Then
    with pytest.raises(ReportNotYetVisible):
        invoke("localize", alarm_event(time=t))


def _without_contributor() -> dict:
    event = alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC))
    event["detail-type"] = "CloudWatch Alarm State Change"
    del event["detail"]["alarmContributor"]
    return event


def _cluster_metric_alarm() -> dict:
    """A single-metric alarm on the cluster series (what the stack deployed before per-job
    alarms): one job's data would hold it in ALARM for every other job."""
    event = _without_contributor()
    event["detail"]["configuration"]["metrics"] = [
        {
            "id": "m1",
            "metricStat": {
                "metric": {
                    "namespace": "SDC",
                    "name": "sdc_replay_mismatch",
                    "dimensions": {"ClusterName": CLUSTER},
                },
                "period": 10,
                "stat": "Sum",
            },
            "returnData": True,
        }
    ]
    return event


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ({"hello": "world"}, "not a CloudWatch Alarm State Change"),
        ({**alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC)), "source": "aws.ec2"}, "source"),
        (alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC), state="OK"), "not ALARM"),
        (
            alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC), cluster="someone-else"),
            "no per-job SDC query",
        ),
        (
            alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC), metric="CPUUtilization"),
            "no per-job SDC query",
        ),
        (
            alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC), namespace="AWS/EC2"),
            "no per-job SDC query",
        ),
        (_without_contributor(), "names no contributor"),
        (alarm_event(time=datetime(2026, 1, 1, tzinfo=UTC), job="evil\nBcc: x"), "not a job"),
        (_cluster_metric_alarm(), "no per-job SDC query"),
    ],
    ids=[
        "not-eventbridge",
        "foreign-source",
        "state-ok",
        "other-cluster",
        "other-metric",
        "other-namespace",
        "no-contributor",
        "job-not-a-name",
        "cluster-level-alarm",
    ],
)
def test_localize_rejects_malformed_and_foreign_events(invoke, event, match):
    # Given an event that is not one of this cluster's SDC alarms going to ALARM
    # When / Then: a typed, terminal error naming the problem
    with pytest.raises(InvalidAlarmEvent, match=match):
        invoke("localize", event)
