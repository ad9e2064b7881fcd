"""record (ledger + EMF metric + SNS) and dry-run mode across the writing steps."""

from __future__ import annotations

import json

import pytest
from botocore.stub import Stubber
from remediation_factories import CLUSTER, LEDGER, alarm_state, approved, item_state, ledger_item

from sdc_remediation import aws
from sdc_remediation.dal import keys
from sdc_remediation.dal.ledger import Ledger
from sdc_remediation.errors import InvalidStepInput


def _events(pk: str) -> list[dict]:
    return Ledger(LEDGER).events(pk)


def _emf(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"_aws"')]


def test_record_appends_the_transition_emits_its_metric_and_notifies(cloud, invoke, capsys):
    # Given an admitted, cordoned node
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    cordon = {"node_name": f"hyperpod-{node}", "cordoned": True, "changed": True, "dry_run": False}
    capsys.readouterr()

    # When the workflow records the transition and asks for a notification
    out = invoke(
        "record",
        {
            "transition": "cordoned",
            "notify": True,
            "state": item_state(node, admission=admission, cordon=cordon),
        },
    )

    # Then: the ledger has it under the node with the remediation id, the STATE follows it
    assert out == {"recorded": True}
    cordoned = [e for e in _events(node) if e["transition"] == "cordoned"]
    assert len(cordoned) == 1
    assert cordoned[0]["remediation_id"] == admission["remediation_id"]
    assert json.loads(cordoned[0]["detail"])["cordon"]["changed"] is True
    state = ledger_item(keys.state(node))
    assert state["status"] == "cordoned" and state["open"] is True
    # and an EMF metric named after the transition, per cluster (beside the same count per
    # check and verdict, for the dashboard's outcomes table: test_precision_ledger.py)
    [emf] = [e for e in _emf(capsys.readouterr().out) if "Check" not in e]
    assert emf["cordoned"] == [1.0]
    assert emf["ClusterName"] == CLUSTER
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "SDCRemediation"
    # and a notification
    [msg] = cloud.sns_messages()
    assert msg["subject"] == f"[sdc-guard] cordoned: hyperpod-{node}"


def test_record_of_a_cluster_level_outcome_uses_the_cluster_partition(cloud, invoke):
    # Given localize's output for an ambiguous alarm (no node named)
    state = {
        "alarm": alarm_state(),
        "suspects": [],
        "ambiguous": True,
        "reports": 1,
        "execution": "exec-9",
    }

    # When
    invoke("record", {"transition": "ambiguous", "notify": True, "state": state})

    # Then
    [event] = _events(keys.cluster_pk(CLUSTER))
    assert event["transition"] == "ambiguous" and event["execution"] == "exec-9"
    assert cloud.sns_messages()[0]["subject"] == f"[sdc-guard] ambiguous: cluster {CLUSTER}"


def test_record_of_a_failure_keeps_the_error_and_closes_the_remediation(cloud, invoke):
    # Given a cordoned node whose health check could not be started
    node = cloud.nodes[0]
    admission = invoke("admit", item_state(node))
    error = {"Error": "HealthCheckRejected", "Cause": '{"errorMessage": "instance busy"}'}

    # When
    invoke(
        "record",
        {
            "transition": "failed",
            "notify": True,
            "state": item_state(node, admission=admission),
            "error": error,
        },
    )

    # Then: recorded with the error and notified; the remediation is closed (the node stays
    # cordoned for the humans, but the next alarm on it is not swallowed as a duplicate)
    [failed] = [e for e in _events(node) if e["transition"] == "failed"]
    assert failed["error"].startswith("HealthCheckRejected")
    assert "HealthCheckRejected" in cloud.sns_messages()[0]["message"]
    state = ledger_item(keys.state(node))
    assert state["open"] is False and state["status"] == "failed"


def test_record_accepts_the_raw_event_when_localize_never_ran(cloud, invoke):
    # Given a failure before localize produced anything: the state is the EventBridge event
    raw = {
        "version": "0",
        "detail-type": "CloudWatch Alarm State Change",
        "detail": {"alarmName": "x"},
    }

    # When
    invoke(
        "record",
        {
            "transition": "failed",
            "notify": False,
            "state": raw,
            "error": {"Error": "InvalidAlarmEvent", "Cause": "bad"},
        },
    )

    # Then
    [event] = _events(keys.cluster_pk(CLUSTER))
    assert event["error"] == "InvalidAlarmEvent: bad"


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_record_rejects_an_unknown_transition(cloud, invoke):
    with pytest.raises(InvalidStepInput, match="transition"):
        invoke("record", {"transition": "exploded", "state": {}})


def test_dry_run_runs_every_step_but_writes_nothing_to_the_cluster(
    cloud, k8s, invoke, monkeypatch, caplog
):
    # Given DRY_RUN=true, a schedulable node, and SageMaker stubbed with no responses (any
    # StartClusterHealthCheck or BatchReplaceClusterNodes call would fail the test)
    monkeypatch.setenv("DRY_RUN", "true")
    node_id = cloud.nodes[0]
    node = f"hyperpod-{node_id}"
    k8s.add_node(node)
    approve = approved(node_id)  # a person's decision, in the approvals table
    release = approved(node_id, decision="reject", release=True)

    with Stubber(aws.client("sagemaker")):
        # When every writing step runs
        cordon = invoke("cordon", item_state(node_id))
        started = invoke("start_health_check", item_state(node_id))
        polled = invoke("poll_health_check", item_state(node_id, health=started))
        replaced = invoke("replace", item_state(node_id, approval=approve))
        monkeypatch.setenv("REPLACE_MODE", "label")
        labelled = invoke("replace", item_state(node_id, approval=approve))
        # as if this remediation had cordoned it (its label and its remediation id)
        k8s.nodes[node]["metadata"]["labels"]["sdc.guard/suspect"] = "true"
        k8s.nodes[node]["metadata"]["annotations"]["sdc.guard/remediation"] = "r-dry"
        admission = {"decision": "admitted", "remediation_id": "r-dry", "reason": "admitted"}
        released = invoke("uncordon", item_state(node_id, admission=admission, approval=release))

    # Then: no PATCH reached Kubernetes, every result says dry_run, and the logs say what it would do
    assert k8s.patches == []
    assert (
        cordon["dry_run"]
        and started["dry_run"]
        and replaced["dry_run"]
        and labelled["dry_run"]
        and released["dry_run"]
    )
    assert cordon["cordoned"] is False
    assert polled["status"] == "passed" and "dry run" in polled["detail"]
    assert replaced["requested"] is False and "would BatchReplaceClusterNodes" in replaced["detail"]
    logs = caplog.text
    for expected in (
        "dry run: would cordon node",
        "dry run: would start deep health check",
        "dry run: would replace node",
        "dry run: would uncordon node",
    ):
        assert expected in logs


def test_recording_a_duplicate_keeps_the_open_remediations_status(cloud, invoke):
    # Given a node with an open, cordoned remediation, and a duplicate alarm for it
    node = cloud.nodes[0]
    first = invoke("admit", item_state(node, execution="e1"))
    invoke(
        "record",
        {"transition": "cordoned", "state": item_state(node, execution="e1", admission=first)},
    )
    dup = invoke("admit", item_state(node, execution="e2"))

    # When the workflow records the duplicate
    invoke(
        "record",
        {
            "transition": "duplicate",
            "notify": False,
            "state": item_state(node, execution="e2", admission=dup),
        },
    )

    # Then: it is in the node's history, but the open remediation is still "cordoned"
    assert [e["transition"] for e in _events(node)][-1] == "duplicate"
    state = ledger_item(keys.state(node))
    assert state["status"] == "cordoned" and state["open"] is True
