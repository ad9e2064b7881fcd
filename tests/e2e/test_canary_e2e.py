"""The live canary through the real workflow definition on the local pipeline: one run closes
itself (nothing cordoned, checked or replaced, no person, no guard slot held, nothing paged,
precision untouched), and a run whose route is broken fires the canary alarm, whose message
names the step where it stopped."""

from __future__ import annotations

import json

import pytest

import sdc_contract as contract
from sdc_remediation.dal import keys
from sdc_remediation.logic import canary as canary_mod
from sdc_remediation.logic import outcomes
from tests.e2e.harness.canary import LocalCanary
from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.scenario import ended_states, local_cluster

pytestmark = pytest.mark.slow

CLUSTER = local_cluster(nodes=3)


def _run_record(p: LocalPipeline, run_id: str) -> dict:
    (run,) = [i for i in p.ledger() if i["sk"] == keys.run_sk(run_id)]
    return run


def test_a_canary_run_walks_the_chain_and_closes_itself():
    with LocalPipeline(CLUSTER, retry_interval_seconds=1) as p:
        canary = LocalCanary(p)
        # Given the schedule started a canary run
        run = canary.start()

        # When CloudWatch evaluates the canary's alarm and the rule starts the workflow
        (event,) = p.evaluator.evaluate()
        assert event["detail"]["alarmName"].endswith(contract.CANARY_ALARM_SUFFIX)
        (execution,) = p.executions
        done = p.finish(execution)

        # Then the execution went through cordon, health check, approval and replace, and ended
        assert done["status"] == "SUCCEEDED", done
        states = ended_states(p, execution)
        for state in ("Localize", "Admit", "Cordon", "StartHealthCheck", "PollHealthCheck",
                      "RequestApproval", "Replace", "RecordReplaced"):  # fmt: skip
            assert state in states, (state, states)
        # ... the run recorded every step and closed, approved by the canary (no person)
        record = _run_record(p, run.run_id)
        assert record["completed"] is True
        assert [s["step"] for s in record["steps"]] == [
            "scheduled", "published", "alarm", "workflow", "localized", "admitted", "cordoned", "health_checked",
            "approval_requested", "approved", "replaced", "closed",
        ]  # fmt: skip
        assert p.transitions(contract.CANARY_INSTANCE_ID) == [
            "cordoned", "health_check_passed", "awaiting_approval", "approved", "replaced"
        ]  # fmt: skip
        approvals = p.client("dynamodb").scan(TableName=p.tables["approvals"])["Items"]
        assert [a["approver"]["S"] for a in approvals] == [
            "sdc-guard canary (no person: a synthetic event on the reserved canary node)"
        ]
        # ... settled by the approve function (the only sender of task results), reached
        # through its URL (no role may invoke it otherwise), with the canary's own action for
        # that one approval, signed by request_approval's credentials
        (approval,) = approvals
        settled = [c for c in p.invocations if c.folder == "approve"]
        assert [c.error for c in settled] == [None]
        (event,) = p.function_url.events
        assert json.loads(event["body"]) == {
            "action": canary_mod.SETTLE_ACTION,
            "approval_id": approval["approval_id"]["S"],
        }
        assert event["requestContext"]["authorizer"]["iam"]["userArn"].startswith("arn:aws:")
        assert json.loads(settled[0].result["body"])["approver"] == canary_mod.APPROVER
        # ... nothing touched a node: no Kubernetes write, no HyperPod call
        assert p.kube.patches == []
        assert p.hyperpod.calls == []
        # ... no blast-radius slot held, no node STATE claimed
        guards = [i for i in p.ledger() if keys.is_guard(i)]
        assert all(not g.get("admissions") and not g.get("held") for g in guards)
        assert not [i for i in p.ledger() if keys.is_state(i)]
        # ... the precision ledger sees no remediation, and nobody was paged
        assert outcomes.summarise(p.ledger()) == []
        assert p.notifications() == []
        # ... and the not-completed alarm stays OK
        assert canary.completed_since(run.started) == 1.0
        assert canary.evaluate(run.started) is None


def test_a_canary_whose_rule_is_disabled_fires_the_alarm_naming_the_step():
    with LocalPipeline(CLUSTER) as p:
        canary = LocalCanary(p)
        # Given the EventBridge rule is disabled (alarms change state, nothing is delivered)
        p.evaluator.rule_enabled = False
        run = canary.start()
        assert p.evaluator.evaluate() == []
        assert p.executions == []

        # When the canary's window ends without a completed run
        answer = canary.evaluate(run.started)

        # Then the alarm fired to the topic, and the canary's message names the step: the
        # alarm fired, no workflow execution started
        assert answer is not None and answer["stopped_at"] == "workflow"
        messages = p.notifications()
        alarm = [m for m in messages if "canary-not-completed" in (m["subject"] or "")]
        assert alarm and json.loads(alarm[0]["message"])["NewStateValue"] == "ALARM"
        (stopped,) = [m for m in messages if "canary stopped at" in (m["subject"] or "")]
        assert stopped["subject"].endswith("canary stopped at workflow")
        summary = json.loads(stopped["message"])["summary"]
        assert "stopped at step 'workflow'" in summary and "EventBridge rule" in summary
        assert _run_record(p, run.run_id)["stopped_at"] == "workflow"
