"""The live canary's functions on moto: a run starts, localize accepts its report only for the
reserved node and only for a run the ledger holds, a real alarm never picks a canary up, and the
canary alarm's check names the step where a run stopped."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from remediation_factories import CLUSTER, alarm_event, put_node_metric, put_report, rank, report

import sdc_contract as contract
from sdc_remediation import aws
from sdc_remediation.config import Settings
from sdc_remediation.dal import keys
from sdc_remediation.dal.canary_runs import RunStore
from sdc_remediation.dal.dynamo import to_item
from sdc_remediation.logic import canary
from sdc_remediation.models.canary import Run

GROUP = f"/sdc/{CLUSTER}"
CANARY_ALARM = f"sdc-{contract.CANARY_ALARM_SUFFIX}"  # the test environment's prefix is "sdc-"


def canary_alarm_event(time: datetime) -> dict:
    """The canary alarm's contributor (the canary job) entering ALARM."""
    return alarm_event(time=time, alarm_name=CANARY_ALARM, job=contract.CANARY_JOB)


def run_steps(run_id: str) -> list[str]:
    run = RunStore(Settings().ledger_table, CLUSTER).get(run_id)
    assert run is not None
    return run.reached


def test_a_canary_run_is_localized_to_the_reserved_node_only(cloud, invoke):
    # Given the schedule started a canary run (report, datum and run record written)
    started = invoke("canary", {"action": "start"})
    assert started["steps"] == ["scheduled", "published"]

    # When the canary alarm's event reaches localize
    out = invoke("localize", canary_alarm_event(datetime.now(UTC)))

    # Then the one suspect is the reserved canary node, carrying the run, and the run says so
    (suspect,) = out["suspects"]
    assert suspect["node_name"] == contract.CANARY_NODE_NAME
    assert suspect["instance_id"] == contract.CANARY_INSTANCE_ID
    assert suspect["canary_run"] == started["run"]
    assert out["alarm"]["canary"] is True
    assert run_steps(started["run"])[-3:] == ["alarm", "workflow", "localized"]


def test_a_canary_report_naming_a_real_node_is_refused(cloud, invoke):
    # Given a real canary run whose report (rewritten by a pod with log access) names a real node
    started = invoke("canary", {"action": "start"})
    t = datetime.now(UTC)
    forged = canary.canary_report(CLUSTER, started["run"], t)
    real = cloud.nodes[0]
    forged["ranks"] = {"0": rank(f"hyperpod-{real}", real)}
    cloud.client("logs").delete_log_stream(logGroupName=GROUP, logStreamName=contract.CANARY_JOB)
    put_report(cloud.client("logs"), GROUP, forged, t, stream=contract.CANARY_JOB)

    # When
    out = invoke("localize", canary_alarm_event(t))

    # Then: localize refuses it, naming the rank; a canary never names a real node
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == "ranks.0" and "reserved canary node" in refused["reason"]


def test_a_pod_cannot_pass_itself_off_as_a_canary(cloud, invoke):
    # Given a report for the canary job and node with a run id the canary function never
    # recorded (pods may write reports, not the ledger)
    t = datetime.now(UTC)
    fake = canary.canary_report(CLUSTER, "c-20260101T000000Z-deadbeef", t)
    put_report(cloud.client("logs"), GROUP, fake, t, stream=contract.CANARY_JOB)
    put_node_metric(cloud.client("cloudwatch"), contract.CANARY_NODE_NAME, t, job="sdc-canary")

    # When
    out = invoke("localize", canary_alarm_event(t))

    # Then
    assert out["suspects"] == []
    assert "not an open canary run" in out["refused"][0]["reason"]


def test_a_training_report_naming_the_canary_node_is_refused(cloud, invoke):
    # Given a training job's report that puts a rank on the reserved canary node
    t = datetime.now(UTC)
    node = contract.CANARY_NODE_NAME
    body = report(time=t, suspects=[2], ranks={"2": rank(node, contract.CANARY_INSTANCE_ID, 2)})
    put_report(cloud.client("logs"), GROUP, body, t)
    put_node_metric(cloud.client("cloudwatch"), node, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then: refused before HyperPod or Kubernetes are asked
    assert out["suspects"] == []
    assert "reserved canary node" in out["refused"][0]["reason"]


def test_a_real_alarm_never_picks_up_a_canary(cloud, cluster_pods, invoke):
    # Given a canary run in flight and, in the same window, a real finding on a real node
    invoke("canary", {"action": "start"})
    t = datetime.now(UTC)
    real = cloud.nodes[1]
    body = report(time=t, suspects=[4], ranks={"4": rank(f"hyperpod-{real}", real, 4)})
    put_report(cloud.client("logs"), GROUP, body, t)
    put_node_metric(cloud.client("cloudwatch"), f"hyperpod-{real}", t)

    # When the real SDC alarm is localized
    out = invoke("localize", alarm_event(time=t))

    # Then only the real node is a suspect (the canary neither joins nor counts against it)
    assert [s["instance_id"] for s in out["suspects"]] == [real]
    assert out["alarm"]["canary"] is False


def test_the_check_names_the_step_where_the_run_stopped(cloud, invoke):
    # Given a canary run that was published but whose alarm never fired
    started = invoke("canary", {"action": "start"})

    # When the canary alarm's action invokes the canary function
    stop = invoke(
        "canary",
        {"source": "aws.cloudwatch", "alarmArn": "arn:x", "alarmData": {"alarmName": "c"}},
    )

    # Then it names the step, writes it on the run and tells the topic
    assert stop["stopped_at"] == "alarm"
    assert stop["run"] == started["run"]
    run = RunStore(Settings().ledger_table, CLUSTER).get(started["run"])
    assert run is not None and run.stopped_at == "alarm"
    (message,) = cloud.sns_messages()
    assert message["subject"].endswith("canary stopped at alarm")
    assert "stopped at step 'alarm'" in json.loads(message["message"])["summary"]


def test_the_check_without_any_new_run_names_the_schedule(cloud, invoke):
    # Given no canary ever ran (the schedule is disabled or the function fails at start)
    # When the canary alarm's action runs
    stop = invoke("canary", {"alarmData": {}})

    # Then it points at the schedule
    assert stop["stopped_at"] == "scheduled"
    assert "schedule" in stop["summary"]


def _run(*steps: str, completed: bool = False, error: str | None = None) -> Run:
    at = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    return Run(
        run_id="c-1",
        started_at=at,
        steps=[{"step": s, "at": at} for s in steps],
        completed=completed,
        error=error,
    )


@pytest.mark.parametrize(
    ("steps", "fired", "started", "expected"),
    [
        (("scheduled",), False, False, "published"),
        (("scheduled", "published"), False, False, "alarm"),
        (("scheduled", "published"), True, False, "workflow"),
        (("scheduled", "published"), True, True, "localized"),
        (("scheduled", "published", "localized", "admitted", "cordoned"), False, False, "health_checked"),
        (("scheduled", "published", "localized", "admitted", "cordoned", "health_checked",
          "approval_requested", "approved", "replaced"), True, True, "closed"),
    ],
)  # fmt: skip
def test_stopped_at_is_the_step_after_the_furthest_reached(steps, fired, started, expected):
    # Given a run's recorded steps and what the check observed
    stop = canary.stopped_at(_run(*steps), alarm_fired=fired, execution_started=started)
    # Then the stop is the first step after the furthest one reached
    assert stop.step == expected
    assert f"'{expected}'" in stop.sentence()


def test_a_completed_run_means_no_new_run_was_scheduled():
    # Given the newest run completed (and the alarm fires a window later)
    stop = canary.stopped_at(_run("scheduled", "closed", completed=True), alarm_fired=False,
                             execution_started=False)  # fmt: skip
    # Then the canary stopped before a new run started
    assert stop.step == "scheduled" and stop.last_reached == "c-1"


def test_a_failed_step_is_named_with_its_error():
    # Given a run whose workflow recorded a failure after cordon
    run = _run("scheduled", "published", "localized", "admitted", "cordoned", "failed",
               error="HealthCheckRejected: no")  # fmt: skip
    # Then the stop names the next step and carries the error
    stop = canary.stopped_at(run, alarm_fired=True, execution_started=True)
    assert stop.step == "health_checked"
    assert "HealthCheckRejected" in stop.sentence()


def test_a_suspect_cannot_be_a_canary_on_a_real_node(cloud):
    # Given a state whose suspect claims a canary run on a real instance
    from sdc_remediation.models import Suspect

    real = cloud.nodes[0]
    # Then the model refuses it: no forged state can turn a real node into a canary
    with pytest.raises(ValueError, match="canary_run is reserved"):
        Suspect(
            node_name=f"hyperpod-{real}", instance_id=real, instance_group="workers",
            job=contract.CANARY_JOB, ranks={}, check="compute", verdict="culprit", step=0,
            suspect_window=[0, 0], canary_run="c-1",
        )  # fmt: skip


def test_the_cli_shows_the_newest_run_and_where_it_stopped(cloud, invoke):
    # Given a canary run the canary alarm found stopped before its alarm fired
    from click.testing import CliRunner

    from sdc_remediation.cli import main

    started = invoke("canary", {"action": "start"})
    invoke("canary", {"alarmData": {}})

    # When the on-call asks the CLI
    result = CliRunner().invoke(
        main, ["--ledger-table", Settings().ledger_table, "canary", "--cluster", CLUSTER]
    )

    # Then it names the run, where it stopped and the steps it reached
    assert result.exit_code == 0, result.output
    assert f"canary run {started['run']}" in result.output
    assert "stopped at alarm" in result.output
    assert "published" in result.output and "closed" in result.output


def test_a_canary_run_expires_after_its_timeout(cloud, invoke, monkeypatch):
    # Given a canary run started (it is open for CANARY_TIMEOUT_SECONDS, an hour by default)
    from datetime import timedelta as td

    from sdc_remediation import clock

    started = invoke("canary", {"action": "start"})
    run = RunStore(Settings().ledger_table, CLUSTER).get(started["run"])
    assert run is not None and run.open_until is not None
    # When its alarm is localized two hours later (superseded: a run stayed open forever, and
    # an old run's report or approval could be replayed)
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + td(hours=2))
    out = invoke("localize", canary_alarm_event(datetime.now(UTC)))
    # Then its report is refused: the run expired
    assert out["suspects"] == []
    assert "not an open canary run" in out["refused"][0]["reason"]
    # And the ledger will remove the run's item (TTL) a month after it started
    item = aws.client("dynamodb").get_item(
        TableName=Settings().ledger_table,
        Key=to_item(keys.run(CLUSTER, started["run"])),
    )["Item"]
    assert int(item["expires_at"]["N"]) > int(item["open_until"]["N"])
