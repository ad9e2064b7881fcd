"""The sweeper's flood watch (issue 32): a flood of made-up JobNames on the SDC metrics, which
can keep a real job's contributor out of ALARM (a Metrics Insights alarm's query returns at most
500 series), is told to the on-call once per period, naming the count, the limit and the likely
flooder; so is a crowd (far fewer JobNames, but about 100 with data at once: at most 100
contributors are in ALARM at once); a normal cluster is not; the watch's failure never stops the
reminders or the backstop.

moto's ListMetrics ignores ``RecentlyActive`` (it lists every series it holds) and pages by 500,
as AWS does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions
import pytest
from remediation_factories import (
    CLUSTER,
    JOB,
    held_after_rejection,
    item_state,
    ledger_item,
    put_node_metric,
    put_report,
    rank,
    report,
)

from sdc_remediation import aws, clock
from sdc_remediation.config import Settings
from sdc_remediation.dal import keys
from sdc_remediation.errors import ConfigurationError
from sdc_remediation.logic import flood_watch

GROUP = f"/sdc/{CLUSTER}"
METRIC = "sdc_replay_mismatch"


def _put(cloud: Any, data: list[dict[str, Any]]) -> None:
    cw = cloud.client("cloudwatch")
    for first in range(0, len(data), 20):
        cw.put_metric_data(Namespace="SDC", MetricData=data[first : first + 20])


def _flood(
    cloud: Any, count: int, *, prefix: str = "junk-", node: str | None = None, per_node: int = 0
) -> None:
    """One pod's flood: ``count`` made-up JobNames on the job series of the replay metric (what
    the alarm's query matches), the first ``per_node`` of them also on a per-node series of
    ``node``."""
    at = datetime.now(UTC) - timedelta(minutes=5)
    data = [
        {
            "MetricName": METRIC,
            "Dimensions": [
                {"Name": "ClusterName", "Value": CLUSTER},
                {"Name": "JobName", "Value": f"{prefix}{n}"},
            ],
            "Timestamp": at,
            "Value": 5.0,
        }
        for n in range(count)
    ]
    data += [
        {
            "MetricName": METRIC,
            "Dimensions": [
                {"Name": "ClusterName", "Value": CLUSTER},
                {"Name": "JobName", "Value": f"{prefix}{n}"},
                {"Name": "NodeName", "Value": node},
            ],
            "Timestamp": at,
            "Value": 5.0,
        }
        for n in range(per_node if node else 0)
    ]
    _put(cloud, data)


def _crowd(cloud: Any, count: int, *, per_minute: int, prefix: str = "crowd-") -> None:
    """``count`` made-up JobNames with data on the replay metric's job series, ``per_minute`` of
    them in each minute (the latest minute 5 minutes ago): at most that many at once."""
    latest = (datetime.now(UTC) - timedelta(minutes=5)).replace(second=0, microsecond=0)
    _put(
        cloud,
        [
            {
                "MetricName": METRIC,
                "Dimensions": [
                    {"Name": "ClusterName", "Value": CLUSTER},
                    {"Name": "JobName", "Value": f"{prefix}{n}"},
                ],
                "Timestamp": latest - timedelta(minutes=n // per_minute),
                "Value": 1.0,
            }
            for n in range(count)
        ],
    )


def _count_get_metric_data() -> list[dict[str, Any]]:
    """Every GetMetricData request the code's CloudWatch client sends from now on."""
    calls: list[dict[str, Any]] = []
    aws.client("cloudwatch").meta.events.register(
        "provide-client-params.cloudwatch.GetMetricData",
        lambda params, **_: calls.append(dict(params)),
    )
    return calls


def _a_real_finding(cloud: Any, nodes: int = 3) -> None:
    """The real job's finding on a few nodes: its per-node, job and cluster series."""
    at = datetime.now(UTC) - timedelta(minutes=5)
    for instance in cloud.nodes[:nodes]:
        put_node_metric(cloud.client("cloudwatch"), f"hyperpod-{instance}", at)


def _flood_notices(cloud: Any) -> list[dict[str, Any]]:
    return [m for m in cloud.sns_messages() if "series flood" in m["subject"]]


def _count_list_metrics() -> list[dict[str, Any]]:
    """Every ListMetrics request the code's CloudWatch client sends from now on."""
    calls: list[dict[str, Any]] = []
    aws.client("cloudwatch").meta.events.register(
        "provide-client-params.cloudwatch.ListMetrics",
        lambda params, **_: calls.append(dict(params)),
    )
    return calls


def _list_metrics_fails(code: str) -> None:
    """The code's ListMetrics answers ``code`` (throttled, denied)."""

    def refuse(**_: Any) -> None:
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": code, "Message": "refused"}, "ResponseMetadata": {}}, "ListMetrics"
        )

    aws.client("cloudwatch").meta.events.register("before-call.cloudwatch.ListMetrics", refuse)


def test_a_flood_of_junk_job_names_gives_one_notice_naming_the_flooder_and_the_limit(
    cloud: Any, invoke: Callable[[str, Any], Any]
) -> None:
    # Given a real job's finding on three nodes, and one pod's flood of 450 made-up JobNames
    # (30 of them also on a per-node series of the node it runs on)
    _a_real_finding(cloud)
    _flood(cloud, 450, node="hyperpod-flooder", per_node=30)
    # And ListMetrics counted
    calls = _count_list_metrics()

    # When the sweeper runs
    watch = invoke("sweeper", {})["flood_watch"]

    # Then the watch counted the replay alarm's job series (450 junk + the real job's one),
    # past 80 % of the 500 its query returns, and told the on-call
    assert watch["job_series"] == {
        "sdc_divergent_tensors": 0,
        "sdc_nonfinite_grad": 0,
        METRIC: 451,
    }
    assert (watch["limit"], watch["threshold"], watch["blind"], watch["notified"]) == (
        500,
        400,
        True,
        True,
    )
    assert watch["error"] is None and watch["counted_all"] is True
    # And it named the flood's pattern first, the JobNames with the most series, the node
    assert watch["top_patterns"][0] == {"pattern": "junk-*", "job_names": 450}
    # (the real job has the most series of one name, 4: the flood is the pattern's 450 names)
    assert watch["top_jobs"][:2] == [
        {"job": JOB, "series": 4},
        {"job": "junk-0", "series": 2},
    ]
    assert watch["top_nodes"][0] == {"node": "hyperpod-flooder", "series": 30}
    # And it read one page per SDC metric, recently active series of this cluster only
    assert len(calls) == 3
    assert all(c["RecentlyActive"] == "PT3H" for c in calls)
    assert all(c["Dimensions"] == [{"Name": "ClusterName", "Value": CLUSTER}] for c in calls)
    # And one message went to the topic, the count and the limit in its subject (no name a pod
    # chose), the flooder in its body
    (notice,) = _flood_notices(cloud)
    assert "451 job series of sdc_replay_mismatch" in notice["subject"]
    assert "alarm limit 500" in notice["subject"] and "junk" not in notice["subject"]
    body = json.loads(notice["message"])
    assert body["top_job_name_patterns"][0] == {"pattern": "junk-*", "job_names": 450}
    assert (body["limit"], body["threshold"], body["job_series"][METRIC]) == (500, 400, 451)
    assert "backstop" in body["summary"]


def test_a_second_sweep_within_the_period_sends_no_second_notice(
    cloud: Any, invoke: Callable[[str, Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a flood the first sweep told
    _flood(cloud, 450)
    assert invoke("sweeper", {})["flood_watch"]["notified"] is True

    # When the sweeper runs again 15 minutes later, the flood still there
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(minutes=15))
    again = invoke("sweeper", {})["flood_watch"]

    # Then it still sees the flood, and sends nothing more
    assert again["blind"] is True and again["notified"] is False
    assert len(_flood_notices(cloud)) == 1

    # And once the period is over, a flood that lasts is told again
    monkeypatch.setattr(
        clock, "now", lambda: real_now() + timedelta(seconds=flood_watch.NOTICE_EVERY_SECONDS + 60)
    )
    assert invoke("sweeper", {})["flood_watch"]["notified"] is True
    assert len(_flood_notices(cloud)) == 2


def test_a_normal_cluster_gives_no_notice(cloud: Any, invoke: Callable[[str, Any], Any]) -> None:
    # Given a real finding on three nodes and a few other jobs' findings, well under the bound
    _a_real_finding(cloud)
    _flood(cloud, 12, prefix="team-a-run-")
    # When the sweeper runs
    watch = invoke("sweeper", {})["flood_watch"]
    # Then it counted them and told nobody
    assert watch["job_series"][METRIC] == 13
    assert (watch["blind"], watch["notified"], watch["top_jobs"]) == (False, False, [])
    assert _flood_notices(cloud) == []


def test_a_crowd_of_job_names_with_data_at_once_is_told_far_below_the_series_limit(
    cloud: Any, invoke: Callable[[str, Any], Any]
) -> None:
    # Given a real job's finding, and one pod keeping 120 made-up JobNames breaching in the
    # same minute: 121 job series, far below the 400 the series watch tells at, but more
    # contributors than the 100 a Metrics Insights alarm holds in ALARM at once
    _a_real_finding(cloud)
    _crowd(cloud, 120, per_minute=120)
    reads = _count_get_metric_data()

    # When the sweeper runs
    watch = invoke("sweeper", {})["flood_watch"]

    # Then the series count is under its threshold, but the crowd is seen and told
    assert watch["job_series"][METRIC] == 121 and watch["threshold"] == 400
    # (120 in one minute; the real finding's datum may fall in that minute too)
    assert watch["at_once"].keys() == {METRIC} and watch["at_once"][METRIC] >= 120
    assert (watch["crowd_threshold"], watch["contributors_limit"]) == (80, 100)
    assert (watch["crowded"], watch["blind"], watch["notified"]) == (True, True, True)
    assert watch["top_patterns"][0] == {"pattern": "crowd-*", "job_names": 120}
    # And the data read was the replay metric's job series only (the others have none), in
    # the alarms' one-minute period, in one GetMetricData call of 121 queries
    (read,) = reads
    assert len(read["MetricDataQueries"]) == 121
    assert {q["MetricStat"]["Period"] for q in read["MetricDataQueries"]} == {60}
    # And the notice says it is a crowd, the count and the limit in its subject
    (notice,) = _flood_notices(cloud)
    assert "job series of sdc_replay_mismatch at once" in notice["subject"]
    assert notice["subject"].endswith("100 in ALARM max") and "crowd-" not in notice["subject"]
    body = json.loads(notice["message"])
    assert (body["at_once"], body["crowd_threshold"]) == (watch["at_once"], 80)
    assert "may be in ALARM at once" in body["summary"]


def test_as_many_job_names_spread_over_minutes_are_no_crowd(
    cloud: Any, invoke: Callable[[str, Any], Any]
) -> None:
    # Given 120 JobNames with data, but at most 40 of them in any one minute (a busy cluster)
    _crowd(cloud, 120, per_minute=40)
    # When the sweeper runs
    watch = invoke("sweeper", {})["flood_watch"]
    # Then it read their data, counted 40 at once, and told nobody
    assert watch["at_once"] == {METRIC: 40}
    assert (watch["crowded"], watch["blind"], watch["notified"]) == (False, False, False)
    assert _flood_notices(cloud) == []


def test_the_crowd_is_counted_in_the_alarms_period(
    cloud: Any, invoke: Callable[[str, Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 160 JobNames with data, 40 a minute over 4 minutes: no crowd in 1-minute alarms
    _crowd(cloud, 160, per_minute=40)
    assert invoke("sweeper", {})["flood_watch"]["at_once"] == {METRIC: 40}
    # When the alarms' period is 30 minutes (ALARM_PERIOD 1800 s): a contributor then holds
    # everything of its 30 minutes, and those 4 minutes lie in at most two such periods
    monkeypatch.setenv("ALARM_PERIOD", "1800")
    watch = invoke("sweeper", {})["flood_watch"]
    # Then the watch counted per 30 minutes: at least 80 at once, a crowd
    assert watch["at_once"][METRIC] >= 80 and watch["crowded"] is True


def test_a_cluster_of_few_jobs_reads_no_data(cloud: Any, invoke: Callable[[str, Any], Any]) -> None:
    # Given 79 job series with data at once (under the 80 from which the crowd is read)
    _crowd(cloud, 79, per_minute=79)
    reads = _count_get_metric_data()
    # When the sweeper runs / Then no GetMetricData call was made: the watch costs nothing here
    watch = invoke("sweeper", {})["flood_watch"]
    assert reads == [] and watch["at_once"] == {} and watch["blind"] is False


@pytest.mark.parametrize("raw", ["0", "90", "-60", "sixty"])
def test_an_invalid_alarm_period_is_a_clear_error_naming_the_variable(raw: str) -> None:
    # Given an ALARM_PERIOD that is not whole minutes up to 3 hours / Then the error names it
    with pytest.raises(ConfigurationError, match="ALARM_PERIOD"):
        _ = Settings({"ALARM_PERIOD": raw}).alarm_period_seconds
    # And unset, it is the alarms' default minute
    assert Settings({}).alarm_period_seconds == 60


def test_the_fraction_is_configurable(
    cloud: Any, invoke: Callable[[str, Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given FLOOD_WATCH_FRACTION 0.5 (250 of 500) and 300 made-up JobNames
    monkeypatch.setenv("FLOOD_WATCH_FRACTION", "0.5")
    _flood(cloud, 300)
    # When the sweeper runs / Then 300 is past the bound
    watch = invoke("sweeper", {})["flood_watch"]
    assert (watch["threshold"], watch["blind"], watch["notified"]) == (250, True, True)


@pytest.mark.parametrize("raw", ["0", "-0.2", "1.5", "eighty", "nan"])
def test_an_invalid_fraction_is_a_clear_error_naming_the_variable(raw: str) -> None:
    # Given a FLOOD_WATCH_FRACTION outside (0, 1] / When it is read / Then the error names it
    with pytest.raises(ConfigurationError, match="FLOOD_WATCH_FRACTION"):
        _ = Settings({"FLOOD_WATCH_FRACTION": raw}).flood_watch_fraction
    # And unset, it is 0.8
    assert Settings({}).flood_watch_fraction == 0.8


def test_the_listing_is_bounded_and_a_listing_cut_short_is_told(
    cloud: Any, invoke: Callable[[str, Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one page per metric a sweep, and 600 made-up JobNames (more than one page of 500)
    monkeypatch.setattr(flood_watch, "MAX_PAGES_PER_METRIC", 1)
    _flood(cloud, 600)
    calls = _count_list_metrics()
    # When the sweeper runs
    watch = invoke("sweeper", {})["flood_watch"]
    # Then it read one page of each metric, says it did not count them all, and tells
    assert len(calls) == 3
    assert watch["counted_all"] is False and watch["job_series"][METRIC] == 500
    (notice,) = _flood_notices(cloud)
    assert "at least 500 job series" in notice["subject"]


@pytest.mark.parametrize("code", ["Throttling", "AccessDenied", "ValidationError"])
def test_a_failing_list_metrics_never_stops_the_reminders_or_the_backstop(
    cloud: Any,
    machine: str,
    cluster_pods: Any,
    invoke: Callable[[str, Any], Any],
    monkeypatch: pytest.MonkeyPatch,
    code: str,
) -> None:
    # Given a node held for two days (a reminder is due) and a real report no alarm took up
    node = cloud.nodes[0]
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() - timedelta(days=2))
    held_after_rejection(invoke, node)
    monkeypatch.setattr(clock, "now", real_now)
    at = datetime.now(UTC) - timedelta(minutes=20)
    instance = cloud.nodes[1]
    body = report(time=at, suspects=[3], ranks={"3": rank(f"hyperpod-{instance}", instance, 3)})
    put_report(cloud.client("logs"), GROUP, body, at, stream=JOB)
    # And a flood, which the watch cannot see: ListMetrics is throttled, denied or refused
    _flood(cloud, 450)
    _list_metrics_fails(code)

    # When the sweeper runs
    answer = invoke("sweeper", {})

    # Then the watch says why it did not finish, and told nobody
    assert code in answer["flood_watch"]["error"]
    assert answer["flood_watch"]["notified"] is False and _flood_notices(cloud) == []
    # And the reminder went out and the backstop started the report's workflow
    assert answer["reminded"] == [f"hyperpod-{node}"]
    assert len(answer["backstop"]["started"]) == 1
    executions = aws.client("stepfunctions").list_executions(stateMachineArn=machine)
    assert len(executions["executions"]) == 1


def _sns_refuses(about: str) -> Callable[[], None]:
    """The code's SNS Publish is throttled for messages whose subject has ``about`` in it;
    returns what makes SNS accept them again."""

    def refuse(params: dict[str, Any], **_: Any) -> None:
        if about in str(params.get("Subject", "")):
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "Publish"
            )

    events = aws.client("sns").meta.events
    events.register("provide-client-params.sns.Publish", refuse)
    return lambda: events.unregister("provide-client-params.sns.Publish", refuse)


def _a_long_held_node_and_a_lost_report(cloud: Any, invoke: Callable[[str, Any], Any]) -> str:
    """A node held for two days (a reminder is due) and a real report no alarm took up (the
    backstop's); the held node's name."""
    node = cloud.nodes[0]
    real_now = clock.now
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(clock, "now", lambda: real_now() - timedelta(days=2))
        held_after_rejection(invoke, node)
    at = datetime.now(UTC) - timedelta(minutes=20)
    instance = cloud.nodes[1]
    body = report(time=at, suspects=[3], ranks={"3": rank(f"hyperpod-{instance}", instance, 3)})
    put_report(cloud.client("logs"), GROUP, body, at, stream=JOB)
    return f"hyperpod-{node}"


def test_a_refused_flood_notice_is_sent_by_the_next_sweep_and_stops_nothing(
    cloud: Any,
    machine: str,
    cluster_pods: Any,
    invoke: Callable[[str, Any], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a flood, a reminder due and a lost report, and SNS throttling the flood notice
    held = _a_long_held_node_and_a_lost_report(cloud, invoke)
    _flood(cloud, 450)
    accept = _sns_refuses("series flood")

    # When the sweeper runs
    answer = invoke("sweeper", {})

    # Then the watch saw the flood and says its notice was not sent, and why
    watch = answer["flood_watch"]
    assert watch["blind"] is True and watch["notified"] is False
    assert watch["error"].startswith("notice not sent:") and "Throttling" in watch["error"]
    assert _flood_notices(cloud) == []
    # And the reminder went out and the backstop started the report's workflow
    assert answer["reminded"] == [held]
    assert len(answer["backstop"]["started"]) == 1

    # When SNS accepts again and the next sweep runs 15 minutes later
    accept()
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(minutes=15))
    again = invoke("sweeper", {})["flood_watch"]

    # Then the notice goes out then, not 6 hours later (the claim was given back)
    assert again["notified"] is True and again["error"] is None
    assert len(_flood_notices(cloud)) == 1


def test_a_refused_reminder_is_sent_by_the_next_sweep_and_stops_nothing(
    cloud: Any,
    machine: str,
    cluster_pods: Any,
    invoke: Callable[[str, Any], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a reminder due, a lost report and a flood, and SNS throttling the reminder
    held = _a_long_held_node_and_a_lost_report(cloud, invoke)
    _flood(cloud, 450)
    accept = _sns_refuses("reminder")

    # When the sweeper runs
    answer = invoke("sweeper", {})

    # Then nobody is said to be reminded, and the flood watch and the backstop still ran
    assert answer["reminded"] == []
    assert answer["flood_watch"]["notified"] is True
    assert len(answer["backstop"]["started"]) == 1
    assert not [m for m in cloud.sns_messages() if "reminder" in m["subject"]]

    # When SNS accepts again and the next sweep runs 15 minutes later
    accept()
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(minutes=15))

    # Then the reminder goes out then, not a day later, once
    assert invoke("sweeper", {})["reminded"] == [held]
    assert len([m for m in cloud.sns_messages() if "reminder" in m["subject"]]) == 1


def test_a_refused_abandoned_notice_stops_neither_the_watch_nor_the_backstop(
    cloud: Any, machine: str, cluster_pods: Any, invoke: Callable[[str, Any], Any]
) -> None:
    # Given an open remediation whose execution Step Functions does not know, a lost report and
    # a flood, and SNS throttling the abandoned notice
    gone = "arn:aws:states:us-east-1:123456789012:execution:sdc-guard-test:gone"
    invoke("admit", item_state(cloud.nodes[2], execution=gone))
    _a_long_held_node_and_a_lost_report(cloud, invoke)
    _flood(cloud, 450)
    _sns_refuses("abandoned")

    # When the sweeper runs
    answer = invoke("sweeper", {})

    # Then the remediation is closed as abandoned (in the ledger: nothing lost), and the flood
    # watch and the backstop ran after the refused notice
    assert [a["execution_status"] for a in answer["abandoned"]] == ["DOES_NOT_EXIST"]
    assert ledger_item(keys.state(cloud.nodes[2]))["status"] == "abandoned"
    assert answer["flood_watch"]["notified"] is True
    assert len(answer["backstop"]["started"]) == 1
    assert not [m for m in cloud.sns_messages() if "abandoned" in m["subject"]]
