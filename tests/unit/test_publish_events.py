"""What an alarm, the rank map and liveness become in CloudWatch (pure builders, no AWS)."""

from __future__ import annotations

import json

import pytest

from sdc_agent.alarm import Alarm, RankInfo, Verdict
from sdc_agent.publish.events import (
    MAX_EVENT_BYTES,
    Delivery,
    alarm_delivery,
    alarm_metric_data,
    liveness_metric_data,
    named_nodes,
    rankmap_events,
    report_event,
    utc_now_iso,
)


def info(rank: int, node: int) -> RankInfo:
    name = f"hyperpod-i-{node:017x}"
    return RankInfo(
        rank, name, name.removeprefix("hyperpod-"), f"GPU-{rank}", rank % 2, f"p-{rank}"
    )


def nonfinite_alarm() -> Alarm:
    return Alarm(
        step=7,
        check="compute",
        nonfinite=[3, 2],
        suspects=[2, 3],
        verdicts=[Verdict(pair=(3, 3), third=5, suspect=3, kind="transient")],
        suspect_window=(6, 7),
        ranks={"2": info(2, 1), "3": info(3, 1)},
    )


def test_nonfinite_alarm_publishes_on_the_cluster_and_job_series_and_once_per_named_node():
    # Given two non-finite ranks on the same node
    data = alarm_metric_data(nonfinite_alarm(), "c", "j")
    # Then one datum on {ClusterName}, one on the job's {ClusterName, JobName} (what the per-job
    # alarms watch) and one on that node's {ClusterName, JobName, NodeName}
    assert data == [
        {
            "MetricName": "sdc_nonfinite_grad",
            "Value": 2.0,
            "Unit": "Count",
            "StorageResolution": 1,
            "Dimensions": [{"Name": "ClusterName", "Value": "c"}],
        },
        {
            "MetricName": "sdc_nonfinite_grad",
            "Value": 2.0,
            "Unit": "Count",
            "StorageResolution": 1,
            "Dimensions": [
                {"Name": "ClusterName", "Value": "c"},
                {"Name": "JobName", "Value": "j"},
            ],
        },
        {
            "MetricName": "sdc_nonfinite_grad",
            "Value": 2.0,
            "Unit": "Count",
            "StorageResolution": 1,
            "Dimensions": [
                {"Name": "ClusterName", "Value": "c"},
                {"Name": "JobName", "Value": "j"},
                {"Name": "NodeName", "Value": "hyperpod-i-00000000000000001"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("alarm", "name", "value", "nodes"),
    [
        (
            Alarm(
                step=10,
                check="compute",
                mismatched_pairs=[(3, 1), (5, 3)],
                culprits=[3],
                suspects=[3],
                ranks={"3": info(3, 1)},
            ),
            "sdc_replay_mismatch",
            2.0,
            ["hyperpod-i-00000000000000001"],
        ),
        (
            Alarm(
                step=9,
                check="weights",
                divergent_tensors=["a.weight", "b.bias", "c.weight"],
                suspects=[0, 4],
                ranks={"0": info(0, 0), "4": info(4, 2)},
            ),
            "sdc_divergent_tensors",
            3.0,
            ["hyperpod-i-00000000000000000", "hyperpod-i-00000000000000002"],
        ),
        (Alarm(step=4, check="reduced_gradient"), "sdc_nonfinite_grad", 1.0, []),
    ],
)
def test_each_check_publishes_its_metric_count_and_nodes(alarm, name, value, nodes):
    data = alarm_metric_data(alarm, "c", "j")
    assert {d["MetricName"] for d in data} == {name}
    assert {d["Value"] for d in data} == {value}
    assert all(d["StorageResolution"] == 1 and d["Unit"] == "Count" for d in data)
    per_node = [d["Dimensions"][2]["Value"] for d in data if len(d["Dimensions"]) == 3]
    assert per_node == nodes
    assert data[0]["Dimensions"] == [{"Name": "ClusterName", "Value": "c"}]


def test_a_named_rank_without_placement_still_publishes_the_cluster_and_job_series(caplog):
    # Given an alarm naming rank 9 without its RankInfo
    alarm = Alarm(step=1, check="compute", nonfinite=[9], suspects=[9])
    # Then no node series, a warning, and the cluster and job series
    assert named_nodes(alarm) == []
    assert len(alarm_metric_data(alarm, "c", "j")) == 2
    assert "rank 9" in caplog.text


def test_report_is_the_alarm_dict_plus_cluster_job_time():
    alarm = nonfinite_alarm()
    report = report_event(alarm, "c", "j", "2026-11-29T10:00:00.000Z")
    assert report == {
        **alarm.to_dict(),
        "cluster": "c",
        "job": "j",
        "time": "2026-11-29T10:00:00.000Z",
    }
    assert report["schema"] == "sdc.alarm/v1"
    assert report["ranks"]["3"]["instance_id"] == "i-00000000000000001"


def test_alarm_delivery_carries_the_report_as_compact_json_and_its_metrics():
    alarm = nonfinite_alarm()
    delivery = alarm_delivery(
        alarm, cluster="c", job="j", namespace="SDC", log_group="/sdc/c", time="t"
    )
    assert (delivery.log_group, delivery.log_stream, delivery.namespace) == ("/sdc/c", "j", "SDC")
    assert json.loads(delivery.message) == report_event(alarm, "c", "j", "t")
    assert list(delivery.metrics) == alarm_metric_data(alarm, "c", "j")


def test_rank_map_event_lists_every_rank():
    ranks = {r: info(r, r // 2) for r in (1, 0, 2)}
    (event,) = rankmap_events(ranks, "c", "j", "t")
    assert event == {
        "schema": "sdc.rankmap/v1",
        "cluster": "c",
        "job": "j",
        "time": "t",
        "ranks": {str(r): ranks[r].to_dict() for r in (0, 1, 2)},
    }


def test_a_huge_rank_map_is_split_into_complete_events_under_the_size_limit():
    # Given 20,000 ranks (more than one 1 MiB log event holds)
    ranks = {r: info(r, r // 8) for r in range(20_000)}
    events = rankmap_events(ranks, "c", "j", "t")
    # Then several events of the same schema, each small enough, together every rank once
    assert len(events) > 1
    assert all(len(json.dumps(e)) < MAX_EVENT_BYTES + 1024 for e in events)
    merged = {k: v for e in events for k, v in e["ranks"].items()}
    assert len(merged) == 20_000 and merged["19999"] == ranks[19999].to_dict()


def test_liveness_counts_go_on_the_cluster_job_series():
    data = liveness_metric_data("c", "j", 3, 1)
    assert [(d["MetricName"], d["Value"]) for d in data] == [
        ("sdc_audit_pass", 3.0),
        ("sdc_weight_check_pass", 1.0),
    ]
    assert all(
        d["Dimensions"]
        == [{"Name": "ClusterName", "Value": "c"}, {"Name": "JobName", "Value": "j"}]
        for d in data
    )


def test_spool_record_round_trips_and_rejects_what_is_not_one():
    delivery = alarm_delivery(
        nonfinite_alarm(), cluster="c", job="j", namespace="SDC", log_group="/g", time="t"
    )
    record = json.loads(json.dumps(delivery.to_record()))
    assert Delivery.from_record(record) == delivery
    for bad in (
        {},
        {**record, "kind": "other"},
        {**record, "log_group": ""},
        {**record, "message": 5},
    ):
        with pytest.raises(ValueError):
            Delivery.from_record(bad)


def test_time_is_iso_8601_utc_with_z():
    from datetime import UTC, datetime

    assert (
        utc_now_iso(datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)) == "2026-01-02T03:04:05.678Z"
    )


def test_a_nonfinite_rank_nobody_is_blamed_for_gets_no_per_node_series():
    # Given a NaN that a healthy third GPU reproduced on the same batch (bad data, not a GPU)
    alarm = Alarm(
        step=7,
        check="compute",
        nonfinite=[3],
        suspects=None,
        verdicts=[Verdict(pair=(3, 3), third=5, suspect=None, kind="unattributable")],
        suspect_window=(6, 7),
        ranks={"3": info(3, 1)},
    )
    # Then only the cluster and job series are published: the pipeline is told (the job's
    # alarm fires), and looks for no node
    data = alarm_metric_data(alarm, "c", "j")
    assert [d["Dimensions"] for d in data] == [
        [{"Name": "ClusterName", "Value": "c"}],
        [{"Name": "ClusterName", "Value": "c"}, {"Name": "JobName", "Value": "j"}],
    ]
    assert named_nodes(alarm) == []
