"""The precision ledger as a pod would try to game it: one report read by several alarms, alarms
the guard refused or shadowed, the auto-approval policy's own decisions, and one job's reports
standing in for many jobs. Only what the guard admitted and the health check or a person decided
counts, one remediation per report, one job once for the auto-approval policy."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from remediation_factories import APPROVALS, CLUSTER, LEDGER, item_state

from sdc_remediation import aws, clock
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import from_item, to_item
from sdc_remediation.dal.ledger import Ledger
from sdc_remediation.logic import outcomes, stats

ALICE = "arn:aws:iam::123456789012:user/alice"
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
HEALTH = {"started_at": "2026-11-29T10:00:00.000Z", "checks": ["InstanceStress"], "detail": ""}
REPORT_TIME = "2026-12-01T10:00:00Z"


@pytest.fixture(autouse=True)
def roomy_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_NODES_PER_HOUR", "50")
    monkeypatch.setenv("MAX_FRACTION", "1")


def _state(node: str, execution: str, **extra: Any) -> dict[str, Any]:
    state = {**item_state(node, execution=execution), "item": 0, **extra}
    state["suspect"]["report_time"] = REPORT_TIME
    return state


def test_one_report_read_by_three_alarms_is_one_remediation(cloud, invoke):
    # Given one report naming node A, read by three executions (its three metrics' alarms, or
    # one contributor flapping) within the lookback
    node = cloud.nodes[0]
    decisions = []
    for execution in ("arn:exec:nonfinite", "arn:exec:mismatch", "arn:exec:divergent"):
        state = _state(node, execution)
        state["admission"] = admission = invoke("admit", state)
        decisions.append(admission["decision"])
        invoke("record", {"transition": admission["decision"] if admission["decision"] !=
                          "admitted" else "cordoned", "notify": False, "state": state})  # fmt: skip

    # Then one admission, two duplicates of it, and one remediation in the ledger, no recurrence
    assert decisions == ["admitted", "duplicate", "duplicate"]
    remediations = outcomes.mark_recurrences(outcomes.summarise(Ledger(LEDGER).events(node)))
    assert len(remediations) == 1 and not remediations[0].repeat


def _seed(pk: str, rid: str, at: Any, transitions: list[Any], job: str, report: str) -> None:
    for n, step in enumerate(transitions):
        transition, extra = step if isinstance(step, tuple) else (step, {})
        moment = clock.iso(at + timedelta(minutes=n))
        item = {
            **keys.event(pk, moment, rid),
            "remediation_id": rid,
            "transition": transition,
            "at": moment,
            "cluster": CLUSTER,
            "check": "compute",
            "verdict": "persistent",
            "job": job,
            "report": report,
            **extra,
        }
        aws.client("dynamodb").put_item(TableName=LEDGER, Item=to_item(item))


def test_refused_and_shadowed_alarms_are_no_recurrence(cloud):
    # Given a remediation a person rejected, then a circuit_open and a shadow on the same node
    # from other reports within the window
    base = clock.now() - timedelta(days=3)
    node = "i-0000000000000000a"
    reject = ("rejected", {"decision": "reject", "approver": ALICE})
    _seed(node, "r-1", base, ["admitted", "cordoned", reject], "job-a", "job-a#1#compute#t1")
    _seed(node, "x-2", base + timedelta(hours=1), ["circuit_open"], "job-a", "job-a#2#compute#t2")
    _seed(node, "s-3", base + timedelta(hours=2), ["shadow"], "job-a", "job-a#3#compute#t3")

    # When
    every = outcomes.mark_recurrences(outcomes.summarise(Ledger(LEDGER).all_events()))

    # Then no repeat offender (superseded: both counted, making the rejection "right"), and only
    # the admitted, person-decided remediation is decided
    (rejected,) = [r for r in every if r.remediation_id == "r-1"]
    assert not rejected.repeat and outcomes.classify(rejected) == "wrong"
    assert [outcomes.classify(r) for r in every if r.remediation_id != "r-1"] == [
        "undecided",
        "undecided",
    ]


def test_the_policys_own_approvals_decide_nothing(cloud):
    # Given a replacement the auto-approval policy approved on precision (no health failure)
    base = clock.now() - timedelta(days=2)
    policy = ("approved", {"decision": "approve",
                           "approver": "policy:sdc-guard-auto-approve/precision"})  # fmt: skip
    _seed("i-0000000000000000b", "r-1", base, ["admitted", "cordoned", policy, "replaced"],
          "job-b", "job-b#1#compute#t")  # fmt: skip

    # Then it is undecided: counting it would let the policy feed its own precision
    (r,) = outcomes.summarise(Ledger(LEDGER).all_events())
    assert outcomes.classify(r) == "undecided"


def _seed_right(count: int, job: str | None = None) -> None:
    start = clock.now() - timedelta(days=30)
    for n in range(count):
        _seed(f"i-{0xB00 + n:017x}", f"r-{n}", start + timedelta(hours=n),
              ["admitted", "cordoned", "health_check_failed"], job or f"job-{n}",
              f"{job or n}#{n}#compute#t")  # fmt: skip


def _request(invoke, node: str) -> dict[str, Any]:
    admission = invoke("admit", item_state(node))
    state = item_state(node, admission=admission, health={**HEALTH, "status": "passed"})
    invoke("request_approval", {**state, "task_token": TOKEN})
    (stored,) = [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]
    return stored


def test_one_jobs_reports_cannot_make_a_check_look_precise(cloud, invoke, monkeypatch):
    # Given 25 confirmed remediations of compute/persistent, all raised by one job's reports
    _seed_right(25, job="attacker-job")
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 0.9, "minEvents": 20}))

    # When a compute/persistent remediation reaches RequestApproval (no SendTaskSuccess allowed)
    with Stubber(aws.client("stepfunctions")) as sfn:
        stored = _request(invoke, cloud.nodes[0])
        sfn.assert_no_pending_responses()

    # Then the policy counts that job once, and a person decides
    assert stored["status"] == "pending"
    reason = json.loads(stored["evidence"])["auto_approval"]["reason"]
    assert "has 1 decided remediation(s) of distinct jobs" in reason


def test_precision_never_approves_a_node_a_person_rejected_within_the_window(
    cloud, invoke, monkeypatch
):
    # Given a precise check (25 of 25, distinct jobs), and a person who rejected node A 2 days ago
    _seed_right(25)
    node = cloud.nodes[0]
    reject = ("rejected", {"decision": "reject", "approver": ALICE})
    _seed(node, "r-old", clock.now() - timedelta(days=2), ["admitted", "cordoned", reject],
          "job-x", "job-x#1#compute#t")  # fmt: skip
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 0.9, "minEvents": 20}))

    # When node A alarms again and reaches RequestApproval
    with Stubber(aws.client("stepfunctions")) as sfn:
        stored = _request(invoke, node)
        sfn.assert_no_pending_responses()

    # Then the policy does not approve it by precision: a person decides
    assert stored["status"] == "pending"
    assert "a person rejected" in json.loads(stored["evidence"])["auto_approval"]["reason"]


def test_precision_from_distinct_jobs_still_approves(cloud, invoke, monkeypatch):
    # Given the same precise check and no rejection of this node: the policy approves (the
    # refusals above are about the evidence, not a policy that never fires)
    _seed_right(25)
    monkeypatch.setenv("AUTO_APPROVE", json.dumps({"minPrecision": 0.9, "minEvents": 20}))
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": ANY})
        stored = _request(invoke, cloud.nodes[0])
        sfn.assert_no_pending_responses()
    assert stored["status"] == "approved"
    assert stats.FEW_EVENTS <= 25


def test_a_flapping_alarm_sends_one_message_per_episode(cloud, invoke, monkeypatch, capsys):
    # Given one job's contributor flapping: an execution every 20 s whose report localize
    # refuses (a pod writing malformed reports)
    from remediation_factories import alarm_state

    refusal = {"error": "UntrustedReport", "field": "suspect_window", "reason": "reversed"}
    state = {"alarm": alarm_state(), "suspects": [], "refused": [refusal], "refused_count": 1}
    real_now = clock.now
    # When 30 executions record their refusal over ten minutes
    for n in range(30):
        monkeypatch.setattr(clock, "now", lambda n=n: real_now() + timedelta(seconds=20 * n))
        invoke("record", {"transition": "refused", "notify": True, "state": state,
                          "execution": f"arn:exec:flap-{n}"})  # fmt: skip
    # Then the on-call got one message (superseded: one per execution), and every refusal is
    # still in the ledger
    assert len(cloud.sns_messages()) == 1
    events = Ledger(LEDGER).events(keys.cluster_pk(CLUSTER))
    assert [e["transition"] for e in events].count("refused") == 30
    # And after a quiet hour the next refusal starts a new episode, with its own message
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(hours=2))
    invoke("record", {"transition": "refused", "notify": True, "state": state,
                      "execution": "arn:exec:later"})  # fmt: skip
    assert len(cloud.sns_messages()) == 2
    # And the outcome metrics' dimensions come from fixed values only: the deployment's cluster
    capsys.readouterr()


def test_a_flapping_alarm_whose_remediation_keeps_failing_pages_once(cloud, invoke):
    # Given a genuine report naming node A, and a cordon that cannot run (RBAC denied): each
    # failure gives the report back, so every flap of the contributor admits it again
    node = cloud.nodes[0]
    denied = {"Error": "ConfigurationError", "Cause": "403 from the Kubernetes API"}
    # When 10 executions (one per flap) admit it and record the same failure
    for n in range(10):
        state = _state(node, f"arn:exec:flap-{n}")
        state["admission"] = admission = invoke("admit", state)
        assert admission["decision"] == "admitted"
        invoke("record", {"transition": "failed", "notify": True, "state": state,
                          "error": denied})  # fmt: skip
    # Then the on-call got one message (superseded: one per execution), and the ledger has all
    assert len(cloud.sns_messages()) == 1
    failed = [e for e in Ledger(LEDGER).events(node) if e["transition"] == "failed"]
    assert len(failed) == 10
    # And another failure of that report, or a failure of another report, is told at once
    state = _state(node, "arn:exec:other-error")
    state["admission"] = invoke("admit", state)
    invoke("record", {"transition": "failed", "notify": True, "state": state,
                      "error": {"Error": "NodeNotFound", "Cause": "gone"}})  # fmt: skip
    state = _state(node, "arn:exec:other-report")
    state["suspect"]["report_time"] = "2026-12-01T11:00:00Z"
    state["admission"] = invoke("admit", state)
    invoke("record", {"transition": "failed", "notify": True, "state": state,
                      "error": denied})  # fmt: skip
    assert len(cloud.sns_messages()) == 3


def test_metric_dimensions_come_from_fixed_values(cloud, invoke, capsys):
    # Given a state whose alarm names another cluster, with text in it (a hand-started
    # execution, a damaged state)
    state = _state(cloud.nodes[0], "arn:exec:m")
    state["alarm"]["cluster_name"] = "evil\ncluster"
    state["admission"] = invoke("admit", state)
    capsys.readouterr()
    # When its rejection is recorded
    state["approval"] = {"decision": "reject", "release": False, "approver": ALICE,
                         "reason": "", "approval_id": "a-1"}  # fmt: skip
    invoke("record", {"transition": "rejected", "notify": False, "state": state})
    # Then every EMF line's ClusterName is the deployment's, never the state's text
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if '"_aws"' in x]
    assert lines and {line["ClusterName"] for line in lines} == {CLUSTER}


def test_a_report_whose_remediation_failed_undecided_may_raise_one_again(cloud, invoke):
    # Given a report's remediation that failed before anyone decided (cordon could not run)
    node = cloud.nodes[0]
    first = _state(node, "arn:exec:1")
    first["admission"] = invoke("admit", first)
    invoke("record", {"transition": "failed", "notify": False, "state": first,
                      "error": {"Error": "ClusterApiUnavailable", "Cause": "down"}})  # fmt: skip
    # When the next alarm reads the same report
    again = invoke("admit", _state(node, "arn:exec:2"))
    # Then it is admitted as a new remediation (the evidence was never acted on)
    assert again["decision"] == "admitted"
    assert again["remediation_id"] != first["admission"]["remediation_id"]
