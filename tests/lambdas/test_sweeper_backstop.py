"""The sweeper's backstop (issue 32): a report in the report group that no remediation took up
starts the workflow, once, through the same localize and admission; a report the admission
refused or claimed is not started; the work per sweep is bounded; under Pod Identity only
reports in the job's pods' streams count.

moto's Step Functions records executions (a Wait state: nothing runs); what an execution would
do is shown by giving its input to the real localize handler.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from remediation_factories import (
    CLUSTER,
    JOB,
    LEDGER,
    TRAINING_NAMESPACE,
    item_state,
    ledger_item,
    put_report,
    rank,
    report,
)

from sdc_remediation import aws, clock
from sdc_remediation.dal import keys
from sdc_remediation.logic import backstop
from sdc_remediation.models.state import report_identity

GROUP = f"/sdc/{CLUSTER}"


def _executions(machine: str) -> list[dict[str, Any]]:
    sfn = aws.client("stepfunctions")
    return sfn.list_executions(stateMachineArn=machine)["executions"]


def _input(execution_arn: str) -> dict[str, Any]:
    described = aws.client("stepfunctions").describe_execution(executionArn=execution_arn)
    return json.loads(described["input"])


def _real_report(
    cloud: Any, at: datetime, *, node: int = 0, step: int = 120, stream: str = JOB
) -> dict[str, Any]:
    """A report of the job naming one node (rank 3), written as the agent does."""
    instance = cloud.nodes[node]
    body = report(
        time=at, suspects=[3], ranks={"3": rank(f"hyperpod-{instance}", instance, 3)}, step=step
    )
    put_report(cloud.client("logs"), GROUP, body, at, stream=stream)
    return body


def _flood_of_junk_series(cloud: Any, at: datetime, count: int = 600) -> None:
    """Made-up JobNames on the job series: what crowds the real contributor out of ALARM."""
    cw = cloud.client("cloudwatch")
    for first in range(0, count, 20):
        cw.put_metric_data(
            Namespace="SDC",
            MetricData=[
                {
                    "MetricName": "sdc_replay_mismatch",
                    "Dimensions": [
                        {"Name": "ClusterName", "Value": CLUSTER},
                        {"Name": "JobName", "Value": f"junk-{n}"},
                    ],
                    "Timestamp": at,
                    "Value": 1.0,
                }
                for n in range(first, min(first + 20, count))
            ],
        )


def _suspect_of(body: dict[str, Any], instance: str) -> dict[str, Any]:
    """localize's suspect for a report, with the report's identity (its time as localize
    writes it)."""
    state = item_state(instance)
    state["suspect"]["report_time"] = clock.iso(datetime.fromisoformat(body["time"]))
    state["suspect"]["step"] = body["step"]
    return state


def test_a_flood_cannot_hide_a_real_report_the_backstop_starts_it_exactly_once(
    cloud, machine, cluster_pods, invoke
):
    # Given a flood of made-up JobNames and one real report no alarm took up 20 minutes ago
    at = datetime.now(UTC) - timedelta(minutes=20)
    _flood_of_junk_series(cloud, at)
    body = _real_report(cloud, at)

    # When the sweeper runs three times
    answers = [invoke("sweeper", {}) for _ in range(3)]

    # Then it started the workflow for the report exactly once, named after the report
    (execution,) = _executions(machine)
    assert execution["name"].startswith("backstop-")
    assert [len(a["backstop"]["started"]) for a in answers] == [1, 0, 0]
    identity = report_identity(JOB, 120, "compute", clock.iso(at))
    assert answers[0]["backstop"]["started"][0]["report"] == identity
    assert (
        ledger_item(keys.backstop_start(CLUSTER, identity))["execution"]
        == (execution["executionArn"])
    )
    # And its input is an alarm event localize accepts: the real localize names the real node
    event = _input(execution["executionArn"])
    assert "backstop" in event["detail"]["state"]["reason"]
    localized = invoke("localize", event)
    assert [s["node_name"] for s in localized["suspects"]] == [f"hyperpod-{cloud.nodes[0]}"]
    assert localized["suspects"][0]["report_time"] == clock.iso(at)
    assert localized["suspects"][0]["step"] == body["step"]


def test_a_report_the_admission_refused_is_not_started(cloud, machine, invoke):
    # Given a report whose admission the blast-radius guard refused (an alarm of 50 nodes)
    at = datetime.now(UTC) - timedelta(minutes=20)
    body = _real_report(cloud, at)
    state = {**_suspect_of(body, cloud.nodes[0]), "item": 0, "suspects_in_alarm": 50}
    assert invoke("admit", state)["decision"] == "circuit_open"
    identity = report_identity(JOB, 120, "compute", clock.iso(at))
    assert ledger_item(keys.report_refusal(CLUSTER, identity))["instance_id"] == cloud.nodes[0]

    # When the sweeper runs twice
    answers = [invoke("sweeper", {}) for _ in range(2)]

    # Then nothing is started: the refusal stands for the report
    assert _executions(machine) == []
    assert answers[0]["backstop"]["skipped"] == {"refused": 1}


def test_a_report_a_remediation_claimed_is_not_started(cloud, machine, invoke):
    # Given a report an admission took up (its claim on the node)
    at = datetime.now(UTC) - timedelta(minutes=20)
    body = _real_report(cloud, at)
    assert invoke("admit", {**_suspect_of(body, cloud.nodes[0]), "item": 0})["decision"] == (
        "admitted"
    )

    # When the sweeper runs
    answer = invoke("sweeper", {})

    # Then nothing is started
    assert _executions(machine) == []
    assert answer["backstop"]["skipped"] == {"claimed": 1}


def test_the_work_of_a_sweep_is_bounded_and_the_next_sweep_goes_on(
    cloud, machine, invoke, monkeypatch
):
    # Given ten reports no remediation took up, and one too young (the alarm path's still)
    now = datetime.now(UTC)
    for n in range(10):
        _real_report(cloud, now - timedelta(minutes=60 - n), node=n, step=100 + n)
    _real_report(cloud, now - timedelta(minutes=2), node=11, step=999)
    # And pages of 3 events, at most 2 pages and 2 starts a sweep
    monkeypatch.setattr(backstop, "PAGE_EVENTS", 3)
    monkeypatch.setattr(backstop, "MAX_PAGES", 2)
    monkeypatch.setattr(backstop, "MAX_STARTS", 2)

    # When the sweeper runs until its backstop has nothing left (at most 10 sweeps)
    answers = []
    for _ in range(10):
        answers.append(invoke("sweeper", {})["backstop"])
        if not answers[-1]["behind"]:
            break

    # Then no sweep read more than 2 pages of 3 events or started more than 2
    assert all(a["pages"] <= 2 and a["read"] <= 6 and len(a["started"]) <= 2 for a in answers)
    assert answers[0]["behind"] is True
    # And over the sweeps each old report was started exactly once, the young one not
    names = [e["name"] for e in _executions(machine)]
    assert len(names) == len(set(names)) == 10
    started = [s["report"] for a in answers for s in a["started"]]
    assert sorted(started) == sorted(
        report_identity(JOB, 100 + n, "compute", clock.iso(now - timedelta(minutes=60 - n)))
        for n in range(10)
    )


def test_under_pod_identity_only_reports_in_the_jobs_pods_streams_count(
    cloud, machine, invoke, monkeypatch
):
    # Given per-pod report streams (agentIdentity: pod-identity)
    monkeypatch.setenv("REPORT_STREAMS", "pod")
    at = datetime.now(UTC) - timedelta(minutes=20)
    # And a report in the job's own pod stream, one in a stream named by the job only (which no
    # pod may write under Pod Identity), and one in another job's pods' stream
    pod_stream = f"{TRAINING_NAMESPACE}/{JOB}/{JOB}-worker-0"
    _real_report(cloud, at, node=0, step=120, stream=pod_stream)
    _real_report(cloud, at, node=1, step=121, stream=JOB)
    _real_report(cloud, at, node=2, step=122, stream=f"{TRAINING_NAMESPACE}/other/other-0")

    # When the sweeper runs
    answer = invoke("sweeper", {})["backstop"]

    # Then only the pod stream's report is started
    assert [s["report"] for s in answer["started"]] == [
        report_identity(JOB, 120, "compute", clock.iso(at))
    ]
    # (AWS returns only the `<namespace>/` streams; moto ignores logStreamNamePrefix, so the
    # job-named stream is read here too and refused by its name, as it would be anyway)
    assert set(answer["skipped"]) == {"not in a stream of its job"}
    assert answer["skipped"]["not in a stream of its job"] in (1, 2)
    assert len(_executions(machine)) == 1


def test_without_a_state_machine_the_backstop_is_off(cloud, invoke):
    # Given a report no remediation took up, and no STATE_MACHINE_ARN (as the other sweeper
    # tests run)
    _real_report(cloud, datetime.now(UTC) - timedelta(minutes=20))
    # When the sweeper runs / Then its backstop says it is off and read nothing
    assert invoke("sweeper", {})["backstop"] == {
        "enabled": False,
        "pages": 0,
        "read": 0,
        "started": [],
        "skipped": {},
        "behind": False,
    }


def test_a_start_repeated_after_a_crash_is_the_same_execution(cloud, machine, invoke):
    # Given a report the backstop started, whose mark was then lost (the sweeper died between
    # StartExecution and writing it)
    at = datetime.now(UTC) - timedelta(minutes=20)
    _real_report(cloud, at)
    first = invoke("sweeper", {})["backstop"]["started"]
    identity = report_identity(JOB, 120, "compute", clock.iso(at))
    aws.client("dynamodb").delete_item(
        TableName=LEDGER,
        Key={k: {"S": v} for k, v in keys.backstop_start(CLUSTER, identity).items()},
    )
    aws.client("dynamodb").delete_item(
        TableName=LEDGER,
        Key={k: {"S": v} for k, v in keys.backstop_cursor(CLUSTER).items()},
    )

    # When the sweeper reads the report again
    again = invoke("sweeper", {})["backstop"]["started"]

    # Then it names the same execution, and Step Functions holds one
    assert [s["execution"] for s in again] == [s["execution"] for s in first]
    assert len(_executions(machine)) == 1
