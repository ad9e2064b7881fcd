"""Every admitted remediation ends: a step killed mid-way, a step result missing keys, a damaged
approval, or an execution that is no longer running never leaves the node open (moto ledger)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from click.testing import CliRunner
from remediation_factories import CLUSTER, LEDGER, held_after_rejection, item_state, ledger_item

from sdc_remediation import aws
from sdc_remediation.cli import main
from sdc_remediation.dal import keys, ledger

MOTO_CALLER = "arn:aws:sts::123456789012:user/moto"
FAILURE = {"Error": "States.TaskFailed", "Cause": "the Lambda timed out"}


def _events(node: str) -> list[dict[str, Any]]:
    return ledger.Ledger(LEDGER).events(node)


def test_an_admission_that_committed_but_never_answered_is_closed_by_the_failure_recorder(
    cloud, invoke
):
    # Given admit committed the node, then its Lambda timed out: the state has no $.admission
    node = cloud.nodes[0]
    invoke("admit", {**item_state(node, execution="arn:exec:e1"), "item": 0})
    state = {**item_state(node, execution="arn:exec:e1"), "item": 0}
    state.pop("admission", None)

    # When the Catch records the failure
    invoke("record", {"transition": "failed", "notify": True, "state": state, "error": FAILURE})

    # Then the remediation is closed (keyed by the execution and item), the event names it
    st = ledger_item(keys.state(node))
    assert st["open"] is False and st["status"] == "failed"
    assert [e["remediation_id"] for e in _events(node) if e["transition"] == "failed"] == [
        st["remediation_id"]
    ]
    assert ledger_item(keys.guard(CLUSTER))["open_instances"] == []


def test_an_approval_without_approver_is_recorded_and_closes(cloud, invoke):
    # Given an approval output that lacks `approver` (sent by hand, or by a broken client)
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node, execution="arn:exec:e1"))
    damaged = {
        **item_state(node, execution="arn:exec:e1", admission=admission),
        "approval": {"decision": "approve", "approval_id": "a-1"},
    }

    # When RecordApproved raises on it and the Catch's RecordItemFailed gets the same state
    out = invoke(
        "record", {"transition": "failed", "notify": True, "state": damaged, "error": FAILURE}
    )

    # Then the failure recorder did not raise, closed the remediation, and says what was damaged
    assert out == {"recorded": True}
    assert ledger_item(keys.state(node))["open"] is False
    (failed,) = [e for e in _events(node) if e["transition"] == "failed"]
    assert "approval" in failed["error"] and "approver" in failed["error"]
    assert failed["node_name"] == f"hyperpod-{node}"


def test_the_failure_recorder_salvages_a_state_whose_suspect_does_not_parse(cloud, invoke):
    # Given a state whose suspect lost required keys (only the instance id is left)
    node = cloud.nodes[0]
    invoke("admit", item_state(node, execution="arn:exec:e1"))
    state = item_state(node, execution="arn:exec:e1")
    state["suspect"] = {"instance_id": node}

    # When the failure is recorded
    invoke("record", {"transition": "failed", "notify": True, "state": state, "error": FAILURE})

    # Then the node's remediation is closed and the failure recorded under the node
    assert ledger_item(keys.state(node))["open"] is False
    assert [e["transition"] for e in _events(node)][-1] == "failed"


def test_a_failure_of_the_second_naming_of_a_node_does_not_close_the_first(cloud, invoke):
    # Given one alarm naming the same instance in two Map items: item 0 admitted, item 1 not
    node = cloud.nodes[0]
    first = invoke("admit", {**item_state(node, execution="arn:exec:e1"), "item": 0})
    second = invoke("admit", {**item_state(node, execution="arn:exec:e1"), "item": 1})

    # When item 1's path fails (its state lost its admission)
    state = {**item_state(node, execution="arn:exec:e1"), "item": 1}
    invoke("record", {"transition": "failed", "notify": True, "state": state, "error": FAILURE})

    # Then it was one admission, and item 0's remediation is still open
    assert first["decision"] == "admitted"
    assert second["decision"] == "duplicate"
    assert second["remediation_id"] == first["remediation_id"]
    assert ledger_item(keys.state(node))["open"] is True


def test_release_records_the_callers_identity_and_frees_the_guard(cloud, k8s, invoke):
    # Given a node kept cordoned after a rejection, which the operator has since uncordoned
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}")
    held_after_rejection(invoke, node)
    held_before = ledger.Ledger(LEDGER).held(CLUSTER)

    # When an operator releases it with the CLI, and tries again
    runner = CliRunner()
    args = ["--ledger-table", LEDGER, "release", f"hyperpod-{node}", "--reason", "GPU swapped"]
    first = runner.invoke(main, args)
    again = runner.invoke(main, args)

    # Then the guard no longer holds it and the ledger says who released it and why
    assert [h["instance_id"] for h in held_before] == [node]
    assert first.exit_code == 0, first.output
    assert ledger.Ledger(LEDGER).held(CLUSTER) == []
    (released,) = [e for e in _events(node) if e["transition"] == "released"]
    assert released["approver"] == MOTO_CALLER
    assert released["reason"] == "GPU swapped"
    # And a second release is a clear one-line error
    assert again.exit_code == 1
    assert "NodeNotHeld" in again.output


def test_release_refuses_a_node_that_is_still_cordoned(cloud, k8s, invoke):
    # Given a node kept cordoned after a rejection, still cordoned in Kubernetes
    node = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{node}", unschedulable=True)
    held_after_rejection(invoke, node)

    # When an operator releases it before uncordoning it
    args = ["--ledger-table", LEDGER, "release", f"hyperpod-{node}"]
    refused = CliRunner().invoke(main, args)

    # Then it is refused (superseded: release freed the guard whatever the node's state), and
    # the guard still holds the node
    assert refused.exit_code == 1 and "NodeStillCordoned" in refused.output
    assert [h["instance_id"] for h in ledger.Ledger(LEDGER).held(CLUSTER)] == [node]

    # And once the node is gone from Kubernetes (replaced), it is released
    k8s.remove_node(f"hyperpod-{node}")
    assert CliRunner().invoke(main, args).exit_code == 0
    assert ledger.Ledger(LEDGER).held(CLUSTER) == []


def test_the_sweeper_reminds_once_a_day_of_nodes_held_longer_than_a_day(cloud, invoke, monkeypatch):
    # Given a node admitted (and cordoned) two days ago and never released
    from sdc_remediation import clock

    node = cloud.nodes[0]
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() - timedelta(days=2))
    held_after_rejection(invoke, node)
    monkeypatch.setattr(clock, "now", real_now)

    # When the sweeper runs twice (every 15 minutes)
    first = invoke("sweeper", {})
    second = invoke("sweeper", {})

    # Then the first sweep reminds the on-call, naming the node; the second does not repeat it
    assert first["reminded"] == [f"hyperpod-{node}"] and second["reminded"] == []
    (message,) = [m for m in cloud.sns_messages() if "reminder" in m["subject"]]
    assert (
        f"hyperpod-{node}" in message["message"] and "sdc-remediation release" in message["message"]
    )

    # And a day later it reminds again
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(days=1, minutes=1))
    assert invoke("sweeper", {})["reminded"] == [f"hyperpod-{node}"]


def test_nodes_forgotten_for_days_do_not_jam_the_guard(cloud, invoke, monkeypatch):
    # Given two nodes admitted three days ago, left cordoned after a rejection and never
    # released, in a 40-node cluster whose fraction allows 4 out of service (2 an hour)
    from sdc_remediation import clock

    monkeypatch.setenv("MAX_FRACTION", "0.1")
    real_now = clock.now
    for n, node in enumerate(cloud.nodes[:2]):
        monkeypatch.setattr(
            clock, "now", lambda n=n: real_now() - timedelta(days=3, hours=2 - 2 * n)
        )
        held_after_rejection(invoke, node, execution=f"arn:exec:old-{n}")
    monkeypatch.setattr(clock, "now", real_now)
    assert len(ledger.Ledger(LEDGER).held(CLUSTER)) == 2

    # When a new alarm names a third node
    fresh = invoke("admit", item_state(cloud.nodes[2], execution="arn:exec:new"))

    # Then it is admitted (superseded: held nodes counted against MAX_NODES_PER_HOUR too, so
    # these two made every new alarm circuit_open)
    assert fresh["decision"] == "admitted", fresh["reason"]

    # And the held nodes still count against the fraction: with room for 2, the circuit opens
    monkeypatch.setenv("MAX_FRACTION", "0.05")
    refused = invoke("admit", item_state(cloud.nodes[3], execution="arn:exec:newer"))
    assert refused["decision"] == "circuit_open"
    assert "cordoned and not released" in refused["reason"]


def test_a_50_node_storm_ends_with_circuit_open_and_one_message(cloud, invoke):
    # Given one alarm naming 50 nodes (40-node moto cluster: the guard allows 2)
    nodes = [f"i-{n:017x}" for n in range(50)]
    # When every Map item is admitted and recorded as the workflow does (circuit_open notifies)
    decisions = []
    for index, node in enumerate(nodes):
        state = {
            **item_state(node, execution="arn:exec:storm"),
            "item": index,
            "suspects_in_alarm": 50,
        }
        admission = invoke("admit", state)
        decisions.append(admission["decision"])
        invoke(
            "record",
            {
                "transition": admission["decision"],
                "notify": True,
                "state": {**state, "admission": admission},
                "execution": "arn:exec:storm",
            },
        )
    # Then nothing is admitted, and the on-call gets one message, not fifty
    assert set(decisions) == {"circuit_open"}
    messages = cloud.sns_messages()
    assert len(messages) == 1
    assert "50 nodes" in messages[0]["message"]
    assert ledger_item(keys.guard(CLUSTER)) is None  # nothing was written to the guard


def _machine_and_execution(name: str) -> tuple[Any, str]:
    sfn = aws.client("stepfunctions")
    machine = sfn.create_state_machine(
        name="sdc-guard-test",
        definition='{"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 3600, "End": true}}}',
        roleArn="arn:aws:iam::123456789012:role/sfn",
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine, name=name)["executionArn"]
    return sfn, execution


def _abort(sfn: Any, execution: str, deadline_s: float = 120.0) -> None:
    """Stop ``execution`` and wait until Step Functions reports it ABORTED. moto runs executions
    in threads of its own: on a busy machine a stop can land before that thread marks the
    execution RUNNING, which then overwrites it; stop again until the status holds."""
    give_up = time.monotonic() + deadline_s
    while True:
        sfn.stop_execution(executionArn=execution)
        if sfn.describe_execution(executionArn=execution)["status"] == "ABORTED":
            time.sleep(0.5)  # and still ABORTED once moto's thread has run
            if sfn.describe_execution(executionArn=execution)["status"] == "ABORTED":
                return
        if time.monotonic() > give_up:
            raise AssertionError(f"{execution} never reported ABORTED")
        time.sleep(0.5)


def test_the_sweeper_closes_remediations_whose_execution_ended(cloud, invoke):
    # Given two admitted remediations: one whose execution was aborted mid-way, one still running
    sfn, aborted = _machine_and_execution("aborted")
    running = sfn.start_execution(
        stateMachineArn=aborted.rsplit(":", 1)[0].replace(":execution:", ":stateMachine:"),
        name="running",
    )["executionArn"]
    dead, alive = cloud.nodes[:2]
    invoke("admit", {**item_state(dead, execution=aborted), "item": 0})
    invoke("admit", {**item_state(alive, execution=running), "item": 0})
    _abort(sfn, aborted)

    # When the scheduled sweeper runs (twice: the second finds nothing left to do)
    first = invoke("sweeper", {"source": "aws.events", "detail-type": "Scheduled Event"})
    second = invoke("sweeper", {})

    # Then the aborted one is closed as abandoned with the execution's status, notified once,
    # and still counts against the guard (nobody released the cordoned node); the other is open
    assert [(a["instance_id"], a["execution_status"]) for a in first["abandoned"]] == [
        (dead, "ABORTED")
    ]
    assert second["abandoned"] == []
    assert ledger_item(keys.state(dead))["open"] is False
    assert ledger_item(keys.state(dead))["status"] == "abandoned"
    assert ledger_item(keys.state(alive))["open"] is True
    (event,) = [e for e in _events(dead) if e["transition"] == "abandoned"]
    assert "ABORTED" in event["error"]
    assert len(cloud.sns_messages()) == 1
    assert dead in cloud.sns_messages()[0]["message"]
    guard = ledger_item(keys.guard(CLUSTER))
    assert guard["open_instances"] == [alive]
    assert dead in [h["instance_id"] for h in guard["held"]]


def test_the_sweeper_closes_a_remediation_whose_execution_step_functions_does_not_know(
    cloud, invoke
):
    # Given an open remediation naming an execution that does not exist (any more)
    node = cloud.nodes[0]
    gone = "arn:aws:states:us-east-1:123456789012:execution:sdc-guard-test:gone"
    invoke("admit", item_state(node, execution=gone))

    # When the sweeper runs
    out = invoke("sweeper", {})

    # Then it is closed as abandoned
    assert [a["execution_status"] for a in out["abandoned"]] == ["DOES_NOT_EXIST"]
    assert ledger_item(keys.state(node))["open"] is False
