"""A verdict the contract does not list (a newer agent's) is kept in the report, but everything
the pipeline derives from it reads ``unknown``: the suspect, the approval's subject and body,
the notifications, the outcome metric's dimension, the mode lookup and the ledger."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import (
    CLUSTER,
    LEDGER,
    alarm_event,
    put_node_metric,
    put_report,
    rank,
    report,
)

from sdc_remediation.config import Settings
from sdc_remediation.dal.dynamo import from_item
from sdc_remediation.errors import ConfigurationError

NEWER_KIND = "flaky_interconnect"
"""A confirmation kind this deployment's contract does not know."""


def _report_with_newer_kind(cloud, k8s, instance: str) -> datetime:
    t = datetime.now(UTC).replace(microsecond=0)
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    put_node_metric(cloud.client("cloudwatch"), node, t - timedelta(seconds=10))
    body = report(
        time=t - timedelta(seconds=10),
        suspects=[3],
        ranks={"3": rank(node, instance, 3)},
        verdicts=[{"pair": [3, 4], "third": 5, "suspect": 3, "kind": NEWER_KIND}],
    )
    put_report(cloud.client("logs"), f"/sdc/{CLUSTER}", body, t - timedelta(seconds=10))
    return t


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_a_newer_verdict_reaches_the_approval_and_the_metrics_as_unknown(
    cloud, k8s, cluster_pods, invoke, capsys
):
    # Given a report whose confirmation kind is a newer agent's
    instance = cloud.nodes[4]
    t = _report_with_newer_kind(cloud, k8s, instance)

    # When the workflow localizes it, admits and cordons the node, records it and asks for
    # approval
    located = invoke("localize", alarm_event(time=t))
    state = {"alarm": located["alarm"], "suspect": located["suspects"][0], "execution": "e-new"}
    state["item"] = 0
    state["admission"] = invoke("admit", state)
    state["cordon"] = invoke("cordon", state)
    capsys.readouterr()
    invoke("record", {"transition": "cordoned", "notify": True, "state": state})
    emitted = capsys.readouterr().out
    invoke("request_approval", {**state, "task_token": "token-new"})

    # Then the suspect carries the contract's `unknown`, and the report still has the kind
    assert located["suspects"][0]["verdict"] == "unknown"
    events = cloud.client("logs").filter_log_events(logGroupName=f"/sdc/{CLUSTER}")["events"]
    assert [json.loads(e["message"])["verdicts"][0]["kind"] for e in events] == [NEWER_KIND]
    # And the approval's subject and body say `unknown`, and no message carries the newer kind
    messages = cloud.sns_messages()
    [approval] = [m for m in messages if "approve replacing" in m["subject"]]
    assert approval["subject"].endswith("(compute, unknown)")
    assert "verdict unknown" in approval["message"]
    assert not [m for m in messages if NEWER_KIND in m["subject"] + m["message"]]
    # And the outcome metric's Verdict dimension is `unknown`
    lines = [json.loads(line) for line in emitted.splitlines() if '"_aws"' in line]
    assert [(o["Check"], o["Verdict"]) for o in lines if "Check" in o] == [("compute", "unknown")]
    # And so is the precision ledger's verdict
    items = cloud.client("dynamodb").scan(TableName=LEDGER)["Items"]
    verdicts = {from_item(i).get("verdict") for i in items} - {None}
    assert verdicts == {"unknown"}


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_the_mode_of_a_newer_verdict_is_the_mode_of_unknown(
    cloud, k8s, cluster_pods, invoke, monkeypatch
):
    # Given verdicts this deployment does not know in shadow, everything else enforced
    monkeypatch.setenv("CHECK_MODES", json.dumps({"compute/unknown": "shadow"}))
    instance = cloud.nodes[6]
    t = _report_with_newer_kind(cloud, k8s, instance)

    # When the newer verdict's alarm is admitted
    located = invoke("localize", alarm_event(time=t))
    state = {"alarm": located["alarm"], "suspect": located["suspects"][0], "execution": "e-mode"}
    admission = invoke("admit", state)

    # Then it is shadowed: looked up as compute/unknown
    assert admission["mode"] == "shadow"


def test_a_mode_for_a_verdict_outside_the_contract_is_refused_naming_it():
    # A key naming a verdict the contract does not list could never match: refused
    settings = Settings({"CHECK_MODES": json.dumps({f"compute/{NEWER_KIND}": "shadow"})})
    with pytest.raises(ConfigurationError, match=f"'compute/{NEWER_KIND}' is not"):
        settings.mode_for("compute", NEWER_KIND)
