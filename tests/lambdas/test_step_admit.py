"""admit: one open remediation per node and the blast-radius guard (moto DynamoDB)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import CLUSTER, item_state, ledger_item

from sdc_remediation import clock
from sdc_remediation.dal import keys
from sdc_remediation.dal.admission_store import AdmissionStore
from sdc_remediation.errors import InvalidStepInput


def test_first_alarm_for_a_node_is_admitted_and_opens_a_remediation(cloud, invoke):
    # Given a node with no remediation
    node = cloud.nodes[0]

    # When
    out = invoke("admit", item_state(node))

    # Then: admitted, and the ledger holds the open remediation and the guard's count
    assert out["decision"] == "admitted"
    state = ledger_item(keys.state(node))
    assert state["open"] is True
    assert state["remediation_id"] == out["remediation_id"]
    assert state["cluster"] == CLUSTER
    guard = ledger_item(keys.guard(CLUSTER))
    assert guard["open_instances"] == [node]


def test_a_duplicate_event_is_a_no_op_and_causes_no_second_cordon(cloud, k8s, invoke):
    # Given a node that an earlier alarm already admitted and cordoned
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}")
    first = invoke("admit", item_state(node, execution="exec-1"))
    invoke("cordon", item_state(node, execution="exec-1", admission=first))

    # When the same alarm arrives again (a second execution), and even if cordon ran again
    second = invoke("admit", item_state(node, execution="exec-2"))
    again = invoke("cordon", item_state(node, execution="exec-1", admission=first))

    # Then: duplicate pointing at the open remediation, and exactly one PATCH reached Kubernetes
    assert second["decision"] == "duplicate"
    assert second["remediation_id"] == first["remediation_id"]
    assert again["changed"] is False
    assert len(k8s.patches) == 1
    assert ledger_item(keys.guard(CLUSTER))["version"] == 1  # the duplicate wrote nothing


def test_a_retried_admission_of_the_same_execution_returns_the_same_remediation(cloud, invoke):
    # Given an admission whose Lambda was retried by the workflow
    node = cloud.nodes[0]
    first = invoke("admit", item_state(node, execution="exec-1"))

    # When the same execution admits again
    retry = invoke("admit", item_state(node, execution="exec-1"))

    # Then: same answer, not "duplicate" (which would stop this execution's remediation)
    assert retry == {**first, "reason": "already admitted by this execution"}


def test_a_storm_of_20_alarms_on_10_nodes_admits_only_max_nodes_per_hour(
    cloud, invoke, monkeypatch
):
    # Given: the per-hour cap is the binding limit (2), the fraction limit is out of the way
    monkeypatch.setenv("MAX_FRACTION", "1.0")
    nodes = cloud.nodes[:10]

    # When 20 alarms arrive, two per node
    decisions = [
        invoke("admit", item_state(node, execution=f"exec-{i}"))["decision"]
        for i, node in enumerate(nodes * 2)
    ]

    # Then: two nodes admitted; the others tripped the circuit or were duplicates
    assert decisions.count("admitted") == 2
    assert decisions.count("duplicate") == 2
    assert decisions.count("circuit_open") == 16
    assert len(ledger_item(keys.guard(CLUSTER))["open_instances"]) == 2


def test_the_fraction_limit_caps_open_remediations_until_one_closes(cloud, invoke, monkeypatch):
    # Given: 40 nodes, MAX_FRACTION 0.05 -> at most 2 open at once; no hourly cap in the way
    monkeypatch.setenv("MAX_NODES_PER_HOUR", "100")
    a, b, c = cloud.nodes[:3]
    adm_a = invoke("admit", item_state(a, execution="e-a"))
    invoke("admit", item_state(b, execution="e-b"))

    # When a third node alarms, then after the first node is replaced
    blocked = invoke("admit", item_state(c, execution="e-c1"))
    invoke(
        "record",
        {
            "transition": "replaced",
            "notify": False,
            "state": item_state(a, execution="e-a", admission=adm_a),
        },
    )
    after_close = invoke("admit", item_state(c, execution="e-c2"))

    # Then
    assert blocked["decision"] == "circuit_open"
    assert "MAX_FRACTION" in blocked["reason"]
    assert after_close["decision"] == "admitted"
    assert ledger_item(keys.state(a))["open"] is False


def test_the_hourly_cap_rolls_over_after_an_hour(cloud, invoke, monkeypatch):
    # Given two admissions an hour and a bit ago (and their nodes since replaced: a node left
    # cordoned would keep counting until released)
    monkeypatch.setenv("MAX_FRACTION", "1.0")
    past = datetime.now(UTC) - timedelta(minutes=61)
    monkeypatch.setattr(clock, "now", lambda: past)
    for i in (0, 1):
        admission = invoke("admit", item_state(cloud.nodes[i], execution=f"e{i}"))
        invoke(
            "record",
            {
                "transition": "replaced",
                "state": item_state(cloud.nodes[i], execution=f"e{i}", admission=admission),
            },
        )
    blocked_then = invoke("admit", item_state(cloud.nodes[2], execution="e2"))
    monkeypatch.setattr(clock, "now", lambda: datetime.now(UTC))

    # When a new node alarms now
    now = invoke("admit", item_state(cloud.nodes[2], execution="e3"))

    # Then
    assert blocked_then["decision"] == "circuit_open"
    assert now["decision"] == "admitted"


@pytest.mark.filterwarnings("ignore:No application metrics")  # the nested rival flushes first
def test_concurrent_admissions_cannot_both_pass_the_guard(cloud, invoke, monkeypatch):
    # Given: a cap of one per hour, and a second admission that commits between our read of the
    # guard and our write (the race a GSI count would lose)
    monkeypatch.setenv("MAX_NODES_PER_HOUR", "1")
    monkeypatch.setenv("MAX_FRACTION", "1.0")
    real_guard = AdmissionStore.guard
    raced: list[dict] = []
    started = []

    def guard_then_race(self, cluster):
        seen = real_guard(self, cluster)
        if not started:
            started.append(True)
            raced.append(invoke("admit", item_state(cloud.nodes[1], execution="rival")))
        return seen

    monkeypatch.setattr(AdmissionStore, "guard", guard_then_race)

    # When
    ours = invoke("admit", item_state(cloud.nodes[0], execution="ours"))

    # Then: the rival won, our stale write was refused, and the re-read tripped the circuit
    assert raced[0]["decision"] == "admitted"
    assert ours["decision"] == "circuit_open"
    assert ledger_item(keys.state(cloud.nodes[0])) is None
    assert ledger_item(keys.guard(CLUSTER))["open_instances"] == [cloud.nodes[1]]


@pytest.mark.filterwarnings("ignore:No application metrics")  # it fails before any metric
def test_admit_rejects_a_state_without_a_suspect(cloud, invoke):
    # Given a wiring error: the Map item lacks the suspect
    # When / Then
    with pytest.raises(InvalidStepInput, match="suspect"):
        invoke("admit", {"alarm": item_state("x")["alarm"], "execution": "e"})


def test_an_alarm_naming_more_nodes_than_the_guard_allows_cordons_none_of_them(cloud, invoke):
    # Given one alarm whose report names 3 nodes, with MAX_NODES_PER_HOUR=2
    outcomes = [
        invoke("admit", {**item_state(node, execution="exec-storm"), "suspects_in_alarm": 3})
        for node in cloud.nodes[:3]
    ]
    # Then every one of them is refused (the first two are not picked arbitrarily) and no
    # remediation is opened
    assert [o["decision"] for o in outcomes] == ["circuit_open"] * 3
    assert "one alarm names 3 nodes" in outcomes[0]["reason"]
    assert all(ledger_item(keys.state(node)) is None for node in cloud.nodes[:3])
