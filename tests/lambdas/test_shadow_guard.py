"""`shadowHealthCheck` through the shadow guard: a shadowed alarm runs its deep health check on
the uncordoned node only within a fraction of the cluster of its own (never the enforced checks'
budget), a storm runs none, and the check reads the node's earlier verdict label first."""

from __future__ import annotations

import json

import pytest
from botocore.stub import Stubber
from remediation_factories import NODES, item_state

from sdc_remediation import aws
from sdc_remediation.dal import ledger

DHC = "sagemaker.amazonaws.com/deep-health-check-status"


@pytest.fixture
def shadow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check shadowed, with the deep health check in shadow on."""
    monkeypatch.setenv("CHECK_MODES", json.dumps({"*": "shadow"}))
    monkeypatch.setenv("SHADOW_HEALTH_CHECK", "true")


def _admit(invoke, instance: str, execution: str, *, item: int = 0, in_alarm: int = 1) -> dict:
    state = {**item_state(instance, execution=execution), "item": item}
    state["suspects_in_alarm"] = in_alarm
    state["suspect"]["report_time"] = f"2026-12-01T00:00:{item:02d}Z"
    state["suspect"]["job"] = "job-" + execution.rsplit(":", 1)[-1]
    return invoke("admit", state)


def test_a_storm_in_shadow_runs_no_health_check(cloud, shadow, invoke):
    # Given one shadowed alarm naming 40 nodes (the cluster's fraction allows 2)
    # When each of its items is admitted
    out = [_admit(invoke, node, "arn:exec:storm", item=i, in_alarm=NODES) for i, node in
           enumerate(cloud.nodes)]  # fmt: skip
    # Then every one is recorded in shadow, and none runs a deep health check
    assert {(a["decision"], a["mode"]) for a in out} == {("admitted", "shadow")}
    assert not any(a["shadow_health_check"] for a in out)
    assert "more than the shadow checks' fraction" in out[0]["reason"]


def test_shadow_checks_have_a_fraction_of_their_own_and_free_it_when_recorded(
    cloud, shadow, invoke, monkeypatch
):
    # Given three shadowed alarms, one node each (the fraction allows 2 checks at once)
    a, b, c = cloud.nodes[:3]
    first, second, third = (
        _admit(invoke, node, f"arn:exec:{n}") for n, node in enumerate((a, b, c))
    )
    # Then the first two run their check, the third does not
    assert [x["shadow_health_check"] for x in (first, second, third)] == [True, True, False]
    assert "limit" in third["reason"]

    # And an enforced alarm is still admitted: the shadow checks used none of its budget
    monkeypatch.setenv("CHECK_MODES", "{}")
    enforced = _admit(invoke, cloud.nodes[5], "arn:exec:real")
    assert (enforced["decision"], enforced["mode"]) == ("admitted", "enforce")
    monkeypatch.setenv("CHECK_MODES", json.dumps({"*": "shadow"}))

    # When the first shadow is recorded, its slot is free for the next alarm
    state = {**item_state(a, execution="arn:exec:0", admission=first), "item": 0}
    invoke("record", {"transition": "shadow", "notify": False, "state": state})
    fourth = _admit(invoke, cloud.nodes[3], "arn:exec:4")
    assert fourth["shadow_health_check"] is True


def test_a_shadowed_report_is_recorded_once(cloud, shadow, invoke):
    # Given a shadowed alarm admitted for a report
    first = _admit(invoke, cloud.nodes[0], "arn:exec:a")
    # When a second execution reads the same report (the contributor flapped)
    state = {**item_state(cloud.nodes[0], execution="arn:exec:b"), "item": 0}
    state["suspect"]["report_time"] = "2026-12-01T00:00:00Z"
    state["suspect"]["job"] = "job-a"
    again = invoke("admit", state)
    # Then it is a duplicate of the first (no second "would have cordoned" message)
    assert again["decision"] == "duplicate"
    assert again["remediation_id"] == first["remediation_id"]


def test_a_shadow_health_check_reads_the_nodes_earlier_verdict_first(cloud, shadow, k8s, invoke):
    # Given an uncordoned node that still carries the Failed verdict of an earlier check
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node, labels={DHC: "Failed"})
    admission = _admit(invoke, instance, "arn:exec:shadow")
    state = item_state(instance, execution="arn:exec:shadow", admission=admission)

    # When its shadow health check starts (no cordon ran: nobody read the label before)
    with Stubber(aws.client("sagemaker")) as stub:
        node_details = {
            "NodeDetails": {
                "InstanceGroupName": "workers",
                "InstanceId": instance,
                "InstanceStatus": {"Status": "Running", "Message": ""},
            }
        }
        stub.add_response("describe_cluster_node", node_details)
        stub.add_response("start_cluster_health_check", {"ClusterArn": "arn:aws:sagemaker:x"})
        started = invoke("start_health_check", state)
        # ... and its first poll finds the old label, the instance still Running
        stub.add_response("describe_cluster_node", node_details)
        polled = invoke("poll_health_check", {**state, "health": started})

    # Then the old verdict is label_before, and it is not taken for this check's
    assert started["label_before"] == "Failed"
    assert polled["status"] == "in_progress"
    assert k8s.patches == []  # nothing cordoned


def test_the_enforced_guard_is_untouched_by_shadow(cloud, shadow, invoke):
    _admit(invoke, cloud.nodes[0], "arn:exec:s")
    guard = ledger.Ledger(ledger_table()).guard("hp-test")
    assert guard["open_instances"] == [] and guard["held"] == []


def ledger_table() -> str:
    from remediation_factories import LEDGER

    return LEDGER


def test_a_suspect_and_a_late_node_with_the_same_map_index_take_a_slot_each(cloud, shadow, invoke):
    # Given one shadowed alarm of two nodes whose suspect (suspects' Map, index 0) and late
    # node (late nodes' Map, also index 0) are admitted, and another alarm's node after them
    # (the fraction allows 2 shadow checks at once)
    a, b, c = cloud.nodes[:3]
    suspect = _admit(invoke, a, "arn:exec:one", item=0, in_alarm=2)
    late = _admit(invoke, b, "arn:exec:one", item=0, in_alarm=2)
    other = _admit(invoke, c, "arn:exec:two", item=0)

    # Then the suspect and the late node each hold a slot, and the third check does not run:
    # 2 is the limit, not 3
    assert [x["shadow_health_check"] for x in (suspect, late, other)] == [True, True, False]
    assert "limit" in other["reason"]
    # And a retried admission of the suspect's item is still its own slot
    assert _admit(invoke, a, "arn:exec:one", item=0, in_alarm=2)["shadow_health_check"] is True
