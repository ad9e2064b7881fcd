"""The per-node series localize turns into pending nodes (issue 32): a canary series naming a
real node never becomes that node's item, and a node HyperPod does not know never counts toward
the alarm's size (two data points on made-up nodes pushed a one-node alarm over the guard's
budget, and the corroborated suspect was refused `circuit_open`)."""

from __future__ import annotations

from datetime import UTC, datetime

from remediation_factories import (
    CLUSTER,
    NAMESPACE,
    alarm_event,
    put_node_metric,
    put_report,
    rank,
    report,
)

import sdc_contract as contract

GROUP = f"/sdc/{CLUSTER}"
CANARY_ALARM = f"sdc-{contract.CANARY_ALARM_SUFFIX}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_a_canary_series_naming_a_real_node_is_no_item_of_that_node(cloud, invoke):
    # Given a canary run (its report names the reserved node), and a datum under the canary's
    # job naming a real node in the canary's namespace (which the agent's policy cannot write
    # since the canary moved apart: whoever could, it must still make no real node an item)
    started = invoke("canary", {"action": "start"})
    t = datetime.now(UTC)
    real = f"hyperpod-{cloud.nodes[0]}"
    put_node_metric(
        cloud.client("cloudwatch"),
        real,
        t,
        job=contract.CANARY_JOB,
        namespace=contract.canary_namespace(NAMESPACE),
    )

    # When the canary alarm's contributor fires
    out = invoke("localize", alarm_event(time=t, alarm_name=CANARY_ALARM, job=contract.CANARY_JOB))

    # Then the canary's suspect is the reserved node alone; the real node is no pending item,
    # and the datum is refused on the series
    assert [s["node_name"] for s in out["suspects"]] == [contract.CANARY_NODE_NAME]
    assert out["suspects"][0]["canary_run"] == started["run"]
    assert out["pending"] == [] and out["suspect_count"] == 1
    (refused,) = out["refused"]
    assert refused["field"] == "series" and refused["node_name"] == real


def test_series_on_nodes_hyperpod_does_not_know_do_not_make_a_storm(cloud, cluster_pods, invoke):
    # Given a genuine report naming node A (corroborated), a real node B whose report is late,
    # and a pod's data points on two nodes the cluster does not have (and one on no node name)
    t = _now()
    a, b = cloud.nodes[0], cloud.nodes[1]
    cw = cloud.client("cloudwatch")
    body = report(time=t, suspects=[0], ranks={"0": rank(f"hyperpod-{a}", a, 0)})
    put_report(cloud.client("logs"), GROUP, body, t)
    for node in (f"hyperpod-{a}", f"hyperpod-{b}", "hyperpod-i-0000000000000dead",
                 "hyperpod-i-00000000000000bad", "worker-7"):  # fmt: skip
        put_node_metric(cw, node, t)

    # When the job's contributor fires
    out = invoke("localize", alarm_event(time=t))

    # Then A is the suspect, B (HyperPod knows it) is pending and counts, the made-up nodes are
    # refused on the series and do not count
    assert [s["node_name"] for s in out["suspects"]] == [f"hyperpod-{a}"]
    assert out["pending"] == [{"job": "llama-pretrain", "node_name": f"hyperpod-{b}"}]
    assert out["suspect_count"] == 2
    refused = {r["node_name"]: r for r in out["refused"]}
    assert set(refused) == {"hyperpod-i-0000000000000dead", "hyperpod-i-00000000000000bad",
                            "worker-7"}  # fmt: skip
    assert all(r["field"] == "series" for r in refused.values())
    assert "not a node of HyperPod cluster" in refused["hyperpod-i-0000000000000dead"]["reason"]
    assert "not a HyperPod node name" in refused["worker-7"]["reason"]


def test_a_one_node_alarm_with_made_up_series_is_admitted_not_refused_as_a_storm(
    cloud, cluster_pods, invoke
):
    # Given a genuine one-node alarm, and two data points on nonexistent nodes (the budget is 2)
    t = _now()
    a = cloud.nodes[0]
    cw = cloud.client("cloudwatch")
    body = report(time=t, suspects=[0], ranks={"0": rank(f"hyperpod-{a}", a, 0)})
    put_report(cloud.client("logs"), GROUP, body, t)
    for node in ("hyperpod-i-0000000000000dead", "hyperpod-i-00000000000000bad"):
        put_node_metric(cw, node, t)

    # When localize runs and the suspect's item is admitted with the alarm's size
    out = invoke("localize", alarm_event(time=t))
    (suspect,) = out["suspects"]
    item = {
        "alarm": out["alarm"],
        "suspect": suspect,
        "execution": "exec-1",
        "suspects_in_alarm": out["suspect_count"],
        "item": 0,
    }
    admission = invoke("admit", item)

    # Then the alarm counts one node and the suspect is admitted (not circuit_open)
    assert out["suspect_count"] == 1
    assert admission["decision"] == "admitted", admission
