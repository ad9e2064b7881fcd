"""The real workflow definition, the real handlers and the real CLI, end to end on stand-ins.

Each scenario starts a fresh local pipeline (tests/e2e/harness): the template `cdk synth`
produces, on a moto server, with the Kubernetes API stand-in and the HyperPod simulator. Alarms
are published by the agent's own CloudWatch publisher and delivered by the local alarm evaluator.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import sdc_agent as sdc
from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.scenario import (
    culprit_alarm,
    ended_states,
    local_cluster,
    operator,
    pending_for,
    raise_alarm,
    rank_info,
    recorded,
)

pytestmark = pytest.mark.slow

CLUSTER = local_cluster()
SUSPECT = CLUSTER.instance_ids[1]
SUSPECT_NODE = CLUSTER.node_name(SUSPECT)


@pytest.fixture
def spool(tmp_path) -> str:
    return str(tmp_path / "spool")


def pipeline(**kwargs: Any) -> LocalPipeline:
    return LocalPipeline(CLUSTER, kwargs.pop("context", None), **kwargs)


def transitions(p: LocalPipeline) -> list[str]:
    return [r["transition"] for r in recorded(p)]


def test_approve_replaces_the_node(spool):
    with pipeline() as p:
        # Given the agent reports rank 3 (node 1) as the culprit of a replay mismatch
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        # When the node is cordoned, passes its deep health check and an operator approves
        approval = pending_for(p, execution)
        assert p.kube.nodes[SUSPECT_NODE]["spec"]["unschedulable"] is True
        code, out = operator(p, "approve", approval, "--reason", "replay mismatch confirmed")
        assert code == 0, out
        done = p.finish(execution)
        # Then HyperPod replaced the instance: the old node is gone, a new one joined the group
        assert done["status"] == "SUCCEEDED"
        assert p.hyperpod.replaced.keys() == {SUSPECT}
        assert SUSPECT_NODE not in p.kube.nodes
        assert CLUSTER.node_name(p.hyperpod.replaced[SUSPECT]) in p.kube.nodes
        # And the ledger holds the whole story, with who approved
        assert transitions(p) == [
            "cordoned",
            "health_check_passed",
            "awaiting_approval",
            "approved",
            "replaced",
        ]
        assert p.transitions(SUSPECT)[-2:] == ["approved", "replaced"]
        approved = next(
            c
            for c in p.invocations
            if c.folder == "record" and c.payload["transition"] == "approved"
        )
        assert approved.payload["state"]["approval"]["approver"].startswith("arn:aws:sts::")
        # And the health check ran on exactly that instance, with the configured checks
        (check,) = [c for c in p.hyperpod.calls if c["operation"] == "StartClusterHealthCheck"]
        assert check["DeepHealthCheckConfigurations"] == [
            {
                "InstanceGroupName": "workers",
                "InstanceIds": [SUSPECT],
                "DeepHealthChecks": ["InstanceStress"],
            }
        ]
        states = ended_states(p, execution)
        for state in (
            "Localize",
            "Admit",
            "Cordon",
            "StartHealthCheck",
            "PollHealthCheck",
            "RequestApproval",
            "Replace",
        ):
            assert state in states
        # And the approval message carried the command, never the task token
        messages = [n["message"] for n in p.notifications()]
        token = next(c for c in p.invocations if c.folder == "request_approval").payload[
            "task_token"
        ]
        assert any("sdc-remediation" in m and f" approve {approval} " in m for m in messages)
        assert not any(token in m for m in messages)


def test_reject_with_release_uncordons_the_node(spool):
    with pipeline() as p:
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        approval = pending_for(p, execution)
        # When the operator rejects and asks for the node back
        code, out = operator(p, "reject", approval, "--release", "--reason", "false alarm")
        assert code == 0, out
        assert p.finish(execution)["status"] == "SUCCEEDED"
        # Then it is schedulable again, not replaced, and the ledger says who released it
        node = p.kube.nodes[SUSPECT_NODE]
        assert not node["spec"].get("unschedulable")
        assert "sdc.guard/suspect" not in node["metadata"]["labels"]
        assert not [c for c in p.hyperpod.calls if c["operation"] == "BatchReplaceClusterNodes"]
        assert transitions(p) == [
            "cordoned",
            "health_check_passed",
            "awaiting_approval",
            "released",
        ]
        released = next(
            c
            for c in p.invocations
            if c.folder == "record" and c.payload["transition"] == "released"
        )
        assert released.payload["state"]["approval"]["approver"].startswith("arn:aws:sts::")
        assert released.payload["state"]["approval"]["reason"] == "false alarm"


def test_approval_timeout_leaves_the_node_cordoned_and_notifies(spool):
    with pipeline(approval_timeout_seconds=3) as p:
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        # When nobody decides within the approval timeout (no pending_for: on a busy machine
        # the 3 s may pass before a poll sees the request; the invocation record stays)
        assert p.finish(execution)["status"] == "SUCCEEDED"
        assert [c.folder for c in p.invocations].count("request_approval") == 1
        # Then the node stays cordoned, nothing is replaced, and humans are told
        assert p.kube.nodes[SUSPECT_NODE]["spec"]["unschedulable"] is True
        assert not [c for c in p.hyperpod.calls if c["operation"] == "BatchReplaceClusterNodes"]
        assert {"transition": "approval_timed_out", "notify": True} in recorded(p)
        assert any(
            "approval_timed_out" in (n["subject"] or "") + (n["message"] or "")
            or "timed out" in (n["subject"] or "").lower()
            for n in p.notifications()
        )


def test_failed_health_check_with_automatic_recovery_needs_no_approval(spool):
    with pipeline(health_check_outcome="failed", automatic_node_recovery=True) as p:
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        assert p.finish(execution)["status"] == "SUCCEEDED"
        # Then HyperPod replaced the node itself; the workflow recorded it and asked nobody
        assert p.hyperpod.replaced.keys() == {SUSPECT}
        assert "replaced_by_hyperpod" in transitions(p)
        assert not [c for c in p.invocations if c.folder == "request_approval"]
        assert not p.pending_approvals()
        assert not [c for c in p.hyperpod.calls if c["operation"] == "BatchReplaceClusterNodes"]


def test_a_duplicate_alarm_causes_one_remediation(spool):
    with pipeline() as p:
        first = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        pending_for(p, first)
        # When EventBridge delivers the same alarm event again (at-least-once delivery)
        second = p.start_execution(p.evaluator.delivered[-1])
        assert p.finish(second)["status"] == "SUCCEEDED"
        # Then the second execution stops at admission: one cordon PATCH in all
        assert {"transition": "duplicate", "notify": True} in recorded(
            p
        ) or "duplicate" in transitions(p)
        assert len([r for r in p.kube.patches if SUSPECT_NODE in r.path]) == 1
        assert (
            len([c for c in p.hyperpod.calls if c["operation"] == "StartClusterHealthCheck"]) == 1
        )


def test_an_alarm_storm_opens_the_circuit_and_cordons_nothing(spool):
    with pipeline() as p:
        # Given one alarm naming 4 nodes at once (MAX_NODES_PER_HOUR is 2): a software bug
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [1, 3, 5, 7]), spool)
        assert p.finish(execution)["status"] == "SUCCEEDED"
        # Then nothing is cordoned, no health check runs, and humans are told why
        assert p.kube.patches == []
        assert p.hyperpod.calls == []
        assert transitions(p).count("circuit_open") == 4
        assert all(r["notify"] for r in recorded(p) if r["transition"] == "circuit_open")


def test_kubernetes_api_down_is_retried_then_fails_notified_without_changes(spool):
    with pipeline(retry_interval_seconds=1) as p:
        # Given the Kubernetes API answers 503 to everything
        p.kube.down = True
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        p.finish(execution)
        # Then the first step that needs Kubernetes was retried (the state machine's Retry on
        # ClusterApiUnavailable): localize, which checks the report's pod before naming its node
        localizes = [c for c in p.invocations if c.folder == "localize"]
        assert len(localizes) > 1
        assert all(c.error and c.error.startswith("ClusterApiUnavailable") for c in localizes)
        assert [c for c in p.invocations if c.folder == "cordon"] == []
        # ... and the remediation ended failed and notified: no health check, no replacement
        assert {"transition": "failed", "notify": True} in recorded(p)
        assert p.hyperpod.calls == []
        assert SUSPECT_NODE in p.kube.nodes


def test_dry_run_writes_nothing_to_the_cluster(spool):
    with pipeline(context={"dryRun": True}) as p:
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        approval = pending_for(p, execution)
        code, out = operator(p, "approve", approval)
        assert code == 0, out
        assert p.finish(execution)["status"] == "SUCCEEDED"
        # Then every step ran, but no PATCH reached Kubernetes and nothing reached HyperPod
        assert p.kube.patches == []
        assert p.hyperpod.calls == []
        assert not p.kube.nodes[SUSPECT_NODE]["spec"].get("unschedulable")
        for folder in ("cordon", "start_health_check", "replace"):
            (call,) = [c for c in p.invocations if c.folder == folder]
            assert call.result["dry_run"] is True
        # And every notification says it was a rehearsal
        subjects = [n["subject"] for n in p.notifications()]
        assert subjects and all(s.startswith("[sdc-guard dry-run]") for s in subjects)


def test_a_nan_the_third_gpu_reproduces_names_nobody_and_notifies(spool):
    with pipeline() as p:
        # Given rank 3's gradient went NaN and a healthy third GPU got NaN on the same batch too
        # (bad data or a model bug, not a GPU): the agent blames nobody
        alarm = sdc.Alarm(
            step=7,
            check="compute",
            nonfinite=[3],
            verdicts=[sdc.Verdict(pair=(3, 3), third=5, suspect=None, kind="unattributable")],
            suspects=None,
            suspect_window=(6, 7),
            ranks={"3": rank_info(CLUSTER, 3)},
        )
        execution = raise_alarm(p, alarm, spool)
        # Then the workflow ends at once as ambiguous: humans told, nothing cordoned
        assert p.finish(execution)["status"] == "SUCCEEDED"
        assert transitions(p) == ["ambiguous"]
        assert recorded(p) == [{"transition": "ambiguous", "notify": True}]
        assert p.kube.patches == [] and p.hyperpod.calls == []
        assert not [c for c in p.invocations if c.error]


def test_after_a_failed_remediation_the_next_alarm_on_that_node_is_handled_again(spool):
    with pipeline(retry_interval_seconds=1) as p:
        # Given a remediation that failed after admission because cordon could not reach the
        # Kubernetes API (localize, which only reads pods, could)
        p.kube.nodes_down = True
        first = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
        p.finish(first)
        assert transitions(p)[-1] == "failed"
        # When the API is back and the node alarms again
        p.kube.nodes_down = False
        second = p.start_execution(p.evaluator.delivered[-1])
        pending_for(p, second)
        # Then it is admitted as a new remediation (not dropped as a duplicate) and cordoned
        assert "duplicate" not in transitions(p)
        assert p.kube.nodes[SUSPECT_NODE]["spec"]["unschedulable"] is True
        admissions = [c.result for c in p.invocations if c.folder == "admit"]
        assert [a["decision"] for a in admissions] == ["admitted", "admitted"]
        assert admissions[0]["remediation_id"] != admissions[1]["remediation_id"]


def test_the_process_environment_stays_still_while_a_remediation_runs(spool):
    with pipeline() as p:
        # Given a thread that reads the whole process environment over and over, as botocore's
        # proxy lookup does on every client it builds (it iterates os.environ)
        baseline = dict(os.environ)
        changed: list[set[str]] = []
        failed: list[BaseException] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                try:
                    now = dict(os.environ)
                except (KeyError, RuntimeError) as exc:  # changed while being read
                    failed.append(exc)
                    continue
                if now != baseline and len(changed) < 5:
                    changed.append(set(now.items()) ^ set(baseline.items()))
                time.sleep(0.001)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            # When a whole remediation runs: every step's handler, and the operator's approval
            execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), spool)
            approval = pending_for(p, execution)
            code, out = operator(p, "approve", approval, "--reason", "confirmed")
            assert code == 0, out
            assert p.finish(execution)["status"] == "SUCCEEDED"
        finally:
            stop.set()
            watcher.join(60)
        # Then no read ever saw the environment change: each function got its own settings
        # without os.environ being written
        assert len({c.folder for c in p.invocations}) >= 7
        assert not failed, failed
        assert changed == []
