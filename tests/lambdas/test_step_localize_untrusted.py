"""localize does not trust the agent's report: names, ids, pods and the alarm's origin are checked
against HyperPod, Kubernetes and this stack before any node is named a suspect. A claim that
does not hold is refused (``refused``, with the field), and nothing acts on it."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import (
    CLUSTER,
    REGION,
    TRAINING_NAMESPACE,
    alarm_event,
    grow_cluster,
    job_pods,
    put_report,
    rank,
    report,
)

from sdc_remediation.errors import InvalidAlarmEvent, InvalidStepInput

GROUP = f"/sdc/{CLUSTER}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _node(instance: str) -> str:
    return f"hyperpod-{instance}"


def _refused(out: dict, error: str = "UntrustedReport") -> dict:
    """The one refusal of a localize output, with no suspect named."""
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["error"] == error
    return refused


def test_a_node_name_with_a_path_in_it_is_refused(cloud, k8s, invoke):
    # Given a report whose rank names "../nodes/victim" (it would reach the Kubernetes URL path)
    t = _now()
    k8s.add_node("victim")
    instance = cloud.nodes[0]
    body = report(time=t, suspects=[1], ranks={"1": rank("../nodes/victim", instance, 1)})
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: refused, naming the field; Kubernetes was never asked anything
    assert _refused(out)["field"] == "ranks.1.node_name"
    assert k8s.requests == []


def test_an_instance_id_that_is_not_the_nodes_is_refused(cloud, cluster_pods, invoke):
    # Given a report that names node A but instance B (both real nodes of the cluster): an
    # approver would be asked about A while replace acts on B
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    body = report(time=t, suspects=[3], ranks={"3": rank(_node(a), b, 3)})
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: the on-call is told which field lied
    assert _refused(out)["field"] == "ranks.3.instance_id"


def test_a_malformed_instance_id_is_refused(cloud, k8s, invoke):
    # Given an instance id that is no EC2 id (it would be sent to HyperPod as is)
    t = _now()
    body = report(time=t, suspects=[3], ranks={"3": rank(_node("i-0abc"), "workers-0/x", 3)})
    put_report(cloud.client("logs"), GROUP, body, t)

    # When / Then
    out = invoke("localize", alarm_event(time=t))
    assert _refused(out)["field"] == "ranks.3.instance_id"


def test_a_pod_of_another_namespace_does_not_name_a_node(cloud, k8s, invoke):
    # Given the report knows rank 5 only by a pod name; a pod of that name exists, but in
    # another namespace, on another node: not the job's pod
    t = _now()
    victim = _node(cloud.nodes[4])
    k8s.add_pod("trainer-worker-5", victim, namespace="someone-else")
    ranks = {"5": rank(victim, None, 5, pod="trainer-worker-5", with_node=False)}
    put_report(cloud.client("logs"), GROUP, report(time=t, suspects=[5], ranks=ranks), t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: the pod is looked up in the job's namespace only, so nobody is named
    assert TRAINING_NAMESPACE in _refused(out, "NodeNotFound")["reason"]
    assert all(f"/namespaces/{TRAINING_NAMESPACE}/pods/" in r.path for r in k8s.requests)


def test_a_pod_on_another_node_than_the_report_says_is_refused(cloud, k8s, invoke):
    # Given the report puts rank 5 (pod trainer-worker-5) on node A; Kubernetes runs it on B
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    k8s.add_job_pod("llama-pretrain", _node(b), TRAINING_NAMESPACE, name="trainer-worker-5")
    ranks = {"5": rank(_node(a), a, 5, pod="trainer-worker-5")}
    put_report(cloud.client("logs"), GROUP, report(time=t, suspects=[5], ranks=ranks), t)

    # When / Then
    out = invoke("localize", alarm_event(time=t))
    assert _refused(out)["field"] == "ranks.5.node_name"


def test_a_pod_of_the_job_on_the_reported_node_is_accepted(cloud, k8s, invoke):
    # Given the report and Kubernetes agree on rank 5's pod and node
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod("llama-pretrain", _node(a), TRAINING_NAMESPACE, name="trainer-worker-5")
    ranks = {"5": rank(_node(a), a, 5, pod="trainer-worker-5")}
    put_report(cloud.client("logs"), GROUP, report(time=t, suspects=[5], ranks=ranks), t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: no false alarm
    assert [s["instance_id"] for s in out["suspects"]] == [a]


def test_one_suspect_per_instance_with_the_ranks_merged(cloud, cluster_pods, invoke):
    # Given two reports name ranks 3 and 4 of the same instance, one by node name only
    t = _now()
    a = cloud.nodes[2]
    logs = cloud.client("logs")
    first = report(time=t - timedelta(seconds=5), suspects=[3], ranks={"3": rank(_node(a), a, 3)})
    second = report(time=t, suspects=[4, 4], ranks={"4": rank(_node(a), None, 4)})
    put_report(logs, GROUP, first, t - timedelta(seconds=5))
    put_report(logs, GROUP, second, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: one Map item for the instance, carrying both ranks
    [suspect] = out["suspects"]
    assert suspect["instance_id"] == a
    assert sorted(suspect["ranks"]) == ["3", "4"]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"account": "999999999999"}, "account"),
        ({"alarm_name": "someone-elses-alarm"}, "not one of this stack's"),
    ],
)
def test_alarm_events_from_another_account_or_alarm_are_refused(cloud, invoke, change, match):
    # Given an alarm event that is not from this stack's account or alarms
    t = _now()
    event = alarm_event(time=t, **change)

    # When / Then: refused before anything is read
    with pytest.raises(InvalidAlarmEvent, match=match):
        invoke("localize", event)


def test_an_alarm_event_whose_arn_names_another_alarm_is_refused(cloud, invoke):
    # Given the detail names our alarm but the resource ARN is another account's alarm
    event = alarm_event(time=_now())
    event["resources"] = [f"arn:aws:cloudwatch:{REGION}:999999999999:alarm:sdc-replay-mismatch"]

    # When / Then
    with pytest.raises(InvalidAlarmEvent, match="resources"):
        invoke("localize", event)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda body: body.update(suspect_window=[]), "suspect_window"),
        (lambda body: body.update(suspect_window=[120, 100]), "suspect_window"),
        (lambda body: body["ranks"].update({"three": body["ranks"]["3"]}), "ranks"),
        # Bounded: what a report names is no longer than the name it stands for
        (lambda body: body.update(job="j" * 64), "job"),
        (lambda body: body.update(job="job\nBcc: x"), "job"),
        (lambda body: body["ranks"]["3"].update(gpu_uuid="GPU-\x1b[2J"), "ranks.3.gpu_uuid"),
        (lambda body: body["ranks"]["3"].update(gpu_uuid="G" * 65), "ranks.3.gpu_uuid"),
        (lambda body: body["ranks"]["3"].update(node_name="n" * 254), "ranks.3.node_name"),
        (lambda body: body["ranks"]["3"].update(pod_name="p" * 254), "ranks.3.pod_name"),
        (lambda body: body["verdicts"][0].update(kind="k" * 65), "verdicts.0.kind"),
        (lambda body: body.update(cluster="c" * 257), "cluster"),
    ],
)
def test_a_malformed_report_is_refused_before_anything_happens(cloud, k8s, invoke, edit, field):
    # Given a report that parses as JSON but has no usable window, or a rank key that is no rank
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[3], ranks={"3": rank(_node(a), a, 3)})
    edit(body)
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: refused at parse time, naming the field; nothing asked of Kubernetes
    assert _refused(out)["field"].startswith(field)
    assert k8s.requests == []


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"suspect_window": []}, "suspect_window"),
        ({"ranks": {"x3": {"gpu_uuid": "GPU-3", "local_rank": 3}}}, "ranks"),
        ({"node_name": "../nodes/victim"}, "node_name"),
        ({"instance_id": "i-../victim"}, "instance_id"),
        ({"node_name": "hyperpod-i-0fedcba9876543210"}, "not instance"),
    ],
)
def test_a_step_refuses_a_malformed_suspect_before_touching_the_node(
    cloud, k8s, invoke, change, match
):
    # Given a Map item whose suspect is malformed (a hand-started execution, a wiring error)
    k8s.add_node("victim")
    k8s.add_node(_node("i-0123456789abcdef0"))
    state = _item("i-0123456789abcdef0")
    state["suspect"].update(change)

    # When / Then: InvalidStepInput at parse time, and no node was patched
    with pytest.raises(InvalidStepInput, match=match):
        invoke("cordon", state)
    assert k8s.patches == []


def test_a_rank_map_split_in_parts_keeps_every_part(cloud, cluster_pods, invoke):
    # Given a large job's rank map written as two events of one time (the 1 MiB event limit),
    # and a report naming a rank of each part without details
    t = _now()
    a, b = cloud.nodes[5], cloud.nodes[6]
    logs = cloud.client("logs")
    for ranks in ({"7": rank(_node(a), a, 7)}, {"900": rank(_node(b), b, 4)}):
        part = {
            "schema": "sdc.rankmap/v1",
            "cluster": CLUSTER,
            "job": "llama-pretrain",
            "time": (t - timedelta(hours=5)).isoformat(),
            "ranks": ranks,
        }
        put_report(logs, GROUP, part, t - timedelta(hours=5))
    put_report(logs, GROUP, report(time=t, suspects=[7, 900], ranks={}), t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: both ranks were found
    assert sorted(s["instance_id"] for s in out["suspects"]) == sorted([a, b])


def _item(instance: str) -> dict:
    from remediation_factories import item_state

    return copy.deepcopy(item_state(instance))


def test_the_largest_alarm_stays_far_under_the_workflow_payload_limit(cloud, k8s, invoke):
    # Given the largest alarm the agent can produce: a 1,024-rank job on 64 nodes, every rank
    # named, hundreds of divergent tensors with long names
    t = _now()
    instances = grow_cluster(64)[:64]
    job_pods(k8s, instances)
    ranks = {
        str(r): rank(_node(instances[r // 16]), instances[r // 16], r % 16, pod=None)
        for r in range(1024)
    }
    for r, info in ranks.items():
        info["gpu_uuid"] = f"GPU-{int(r):08x}-1111-2222-3333-444444444444"
    body = report(time=t, suspects=list(range(1024)), ranks=ranks, check="weights")
    body["divergent_tensors"] = [
        f"model.layers.{i}.mlp.experts.{i % 64}.down_proj.weight" + "_shard" * 20
        for i in range(400)
    ]
    body["mismatched_pairs"] = []
    body["verdicts"] = []
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: 64 suspects, and the state stays under half of Step Functions' 256 KiB (each Map
    # item then carries one suspect: about 1.5 KiB)
    assert len(out["suspects"]) == 64
    size = len(json.dumps(out).encode())
    assert size < 128 * 1024, size
    assert max(len(json.dumps(s).encode()) for s in out["suspects"]) < 2 * 1024
    # ... with the count and a reference to the full report, not the names themselves
    suspect = out["suspects"][0]
    assert suspect["divergent_tensor_count"] == 400
    assert suspect["rank_count"] == 16
    assert len(suspect["ranks"]) == 8
    assert len(suspect["divergent_tensors"]) <= 3
    assert suspect["report_log_group"] == GROUP
    assert suspect["report_log_stream"] == "llama-pretrain"


def test_replace_refuses_a_suspect_whose_node_is_not_its_instance(cloud, invoke):
    # Given an approval of node A whose suspect carries instance B (the approver saw A)
    state = _item("i-0123456789abcdef0")
    state["suspect"]["node_name"] = "hyperpod-i-0fedcba9876543210"
    state["approval"] = {
        "decision": "approve",
        "release": False,
        "approver": "arn:aws:iam::123456789012:user/alice",
        "reason": "",
        "approval_id": "a-1",
    }

    # When / Then: refused at parse time, before any HyperPod call
    with pytest.raises(InvalidStepInput, match="not instance"):
        invoke("replace", state)


def test_the_on_call_message_names_the_field_that_lied(cloud, cluster_pods, invoke):
    # Given localize refused a report's claim (the workflow then records `refused`)
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    body = report(time=t, suspects=[3], ranks={"3": rank(_node(a), b, 3)})
    put_report(cloud.client("logs"), GROUP, body, t)
    located = invoke("localize", alarm_event(time=t))
    assert located["refused"]

    # When the refusal is recorded and notified, as the workflow does
    invoke(
        "record",
        {"transition": "refused", "notify": True, "state": located, "execution": "exec-1"},
    )

    # Then the on-call reads which report field did not hold, and about which instances
    [msg] = cloud.sns_messages()
    assert "refused" in msg["subject"]
    assert "ranks.3.instance_id" in msg["message"]
    assert b in msg["message"]


def test_a_setup_finding_that_names_a_node_is_refused_whole(cloud, k8s, invoke):
    # Given a pod of the job really runs on the node, and a report of that job naming rank 5
    # there, but whose verdict says the job's set-up (not a GPU) is at fault (an agent names
    # nobody in such a report: this one is forged or mixed up)
    t = _now()
    a = cloud.nodes[0]
    k8s.add_job_pod("llama-pretrain", _node(a), TRAINING_NAMESPACE, name="trainer-worker-5")
    ranks = {"5": rank(_node(a), a, 5, pod="trainer-worker-5")}
    verdicts = [{"pair": [5, 3], "third": None, "suspect": 5, "kind": "setup"}]
    body = report(time=t, suspects=[5], ranks=ranks, verdicts=verdicts)
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: refused like a reproducible finding, and no node is named
    assert "set-up finding" in _refused(out)["reason"]
