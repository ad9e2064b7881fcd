"""The per-node series localize turns into pending nodes (issue 32): a canary series naming a
real node never becomes that node's item, and a node HyperPod does not know never counts toward
the alarm's size (two data points on made-up nodes pushed a one-node alarm over the guard's
budget, and the corroborated suspect was refused `circuit_open`)."""

from __future__ import annotations

from datetime import UTC, datetime

from remediation_factories import (
    CLUSTER,
    alarm_event,
    put_node_metric,
)

import sdc_contract as contract

GROUP = f"/sdc/{CLUSTER}"
CANARY_ALARM = f"sdc-{contract.CANARY_ALARM_SUFFIX}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_a_canary_series_naming_a_real_node_is_no_item_of_that_node(cloud, invoke):
    # Given a canary run (its report names the reserved node), and a pod that put a datum under
    # the canary's job naming a real node
    started = invoke("canary", {"action": "start"})
    t = datetime.now(UTC)
    real = f"hyperpod-{cloud.nodes[0]}"
    put_node_metric(cloud.client("cloudwatch"), real, t, job=contract.CANARY_JOB)

    # When the canary alarm's contributor fires
    out = invoke("localize", alarm_event(time=t, alarm_name=CANARY_ALARM, job=contract.CANARY_JOB))

    # Then the canary's suspect is the reserved node alone; the real node is no pending item,
    # and the datum is refused on the series
    assert [s["node_name"] for s in out["suspects"]] == [contract.CANARY_NODE_NAME]
    assert out["suspects"][0]["canary_run"] == started["run"]
    assert out["pending"] == [] and out["suspect_count"] == 1
    (refused,) = out["refused"]
    assert refused["field"] == "series" and refused["node_name"] == real
