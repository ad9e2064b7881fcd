"""Every integer of a report is within the ledger's range (issue 32: ``step = 10**40`` was
admitted and cordoned, then the record steps raised ``decimal.Inexact``: no event, no message).
Refused at parse, with the field named; a report at the bound's edge is accepted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from remediation_factories import CLUSTER, alarm_event, item_state, put_report, rank, report

from sdc_remediation.errors import InvalidStepInput
from sdc_remediation.models.base import LEDGER_INT_LIMIT

GROUP = f"/sdc/{CLUSTER}"
HUGE = 10**40


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _set(body: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    target = body
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("step", HUGE, "step"),
        ("step", -1, "step"),
        ("step", LEDGER_INT_LIMIT, "step"),
        ("suspect_window.1", HUGE, "suspect_window.1"),
        ("last_audit_pass", HUGE, "last_audit_pass"),
        ("last_weight_check_pass", HUGE, "last_weight_check_pass"),
        ("nonfinite", [HUGE], "nonfinite.0"),
        ("nonfinite", [-HUGE], "nonfinite.0"),
        ("culprits", [HUGE], "culprits.0"),
        ("suspects", [0, HUGE], "suspects.1"),
        ("mismatched_pairs.0.1", HUGE, "mismatched_pairs.0.1"),
        ("verdicts.0.third", HUGE, "verdicts.0.third"),
        ("verdicts.0.pair.0", HUGE, "verdicts.0.pair.0"),
        ("metric.value", 1e300, "metric.value"),
    ],
)
def test_an_integer_beyond_the_ledgers_range_is_refused_naming_its_field(
    cloud, cluster_pods, invoke, path, value, field
):
    # Given a report naming node A whose field `path` is out of range
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[0], ranks={"0": rank(f"hyperpod-{a}", a, 0)})
    _set(body, path, value)
    put_report(cloud.client("logs"), GROUP, body, t)

    # When
    out = invoke("localize", alarm_event(time=t))

    # Then nothing is a suspect (so nothing is cordoned), and the refusal names the field
    assert out["suspects"] == []
    (refused,) = out["refused"]
    assert refused["field"] == field, refused


def test_a_rank_key_beyond_the_range_is_refused(cloud, cluster_pods, invoke):
    # Given a report whose rank map has a 40-digit rank
    t = _now()
    a = cloud.nodes[0]
    body = report(time=t, suspects=[0], ranks={"0": rank(f"hyperpod-{a}", a, 0)})
    body["ranks"][str(HUGE)] = rank(f"hyperpod-{a}", a, 1)
    put_report(cloud.client("logs"), GROUP, body, t)

    # When / Then
    out = invoke("localize", alarm_event(time=t))
    assert out["suspects"] == [] and out["refused"][0]["field"] == "ranks"


def test_the_largest_step_in_range_is_a_suspect_and_is_recorded(cloud, cluster_pods, invoke):
    # Given a report at step 2**63 - 1 (fault-free at the edge of the bound)
    t = _now()
    a = cloud.nodes[0]
    step = LEDGER_INT_LIMIT - 1
    body = report(time=t, suspects=[0], ranks={"0": rank(f"hyperpod-{a}", a, 0)}, step=step)
    put_report(cloud.client("logs"), GROUP, body, t)

    # When it is localized, admitted, and its cordon recorded
    out = invoke("localize", alarm_event(time=t))
    (suspect,) = out["suspects"]
    state = {**item_state(a), "alarm": out["alarm"], "suspect": suspect}
    state["admission"] = invoke("admit", state)
    recorded = invoke("record", {"transition": "cordoned", "state": state})

    # Then the ledger takes it (no decimal.Inexact)
    assert suspect["step"] == step and recorded == {"recorded": True}


def test_a_workflow_state_with_a_step_beyond_the_range_does_not_parse(cloud, invoke):
    # Given an item state whose suspect's step is out of range (a damaged or crafted state)
    state = item_state(cloud.nodes[0])
    state["suspect"]["step"] = HUGE

    # When / Then: the step refuses it at the edge, naming the field
    with pytest.raises(InvalidStepInput, match=r"suspect\.step"):
        invoke("admit", state)
