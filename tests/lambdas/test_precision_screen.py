"""The precision ledger records whether the node screen agreed with the job's finding (issue 35):
``reproduced`` agreed, ``clean`` disagreed (not an exoneration: it makes nothing right or wrong),
any other outcome (inconclusive, failed, not configured, skipped, none) is no screen evidence.
Recorded through the real record handler on moto; `sdc-remediation stats` (and --json) counts
them per check x verdict, and the record step counts them once per remediation, at
awaiting_approval, as outcome metrics with the outcome dimensions."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from remediation_factories import LEDGER, approved, item_state

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import to_item
from sdc_remediation.dal.ledger import Ledger
from sdc_remediation.logic import outcomes, stats
from sdc_remediation.logic.recording import SCREEN_AGREEMENT_METRICS

ALICE = "arn:aws:iam::123456789012:user/alice"
HEALTH = {"started_at": "2026-11-29T10:00:00.000Z", "checks": ["InstanceStress"], "detail": ""}
UUID = "GPU-3b2a1c4d-0000-1111-2222-333344445555"
OUTCOMES = ["reproduced", "clean", "inconclusive", "failed", "not_configured", "skipped", None]


@pytest.fixture(autouse=True)
def roomy_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for every remediation's admission in one test (the guard is tested elsewhere)."""
    monkeypatch.setenv("MAX_NODES_PER_HOUR", "50")
    monkeypatch.setenv("MAX_FRACTION", "1")


def _screen(status: str) -> dict[str, Any]:
    result: dict[str, Any] = {"status": status, "job": "sdc-screen-0123456789abcdef"}
    if status == "reproduced":
        result.update(gpu_index=3, gpu_uuid=UUID)
    if status == "clean":
        result.update(ran="gemm x6; 8 GPU(s)")
    return result


def _run(
    invoke, node: str, execution: str, screen: str | None, *, decision: str = "reject"
) -> None:
    """Admit ``node``, cordon it, pass its health check, screen it (``screen``), wait for the
    approval and record Alice's ``decision``, as the workflow does."""
    state = {**item_state(node, execution=execution), "item": 0}
    state["admission"] = invoke("admit", state)
    steps: list[tuple[str, dict[str, Any]]] = [
        ("cordoned", {}),
        ("health_check_passed", {"health": {**HEALTH, "status": "passed"}}),
        ("awaiting_approval", {"screen": _screen(screen)} if screen else {}),
        (
            "approved" if decision == "approve" else "rejected",
            {
                "approval": approved(
                    node, execution, approver=ALICE, decision=decision, release=False
                )
            },
        ),
    ]
    for transition, additions in steps:
        state.update(additions)
        invoke("record", {"transition": transition, "notify": False, "state": state})


def _stats_json() -> dict[str, Any]:
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "stats", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_each_screen_outcome_is_agreed_disagreed_or_no_evidence(cloud, invoke):
    # Given one remediation of compute/persistent per screen outcome, each rejected by Alice
    for index, outcome in enumerate(OUTCOMES):
        _run(invoke, cloud.nodes[index], f"e-{index}", outcome)

    # Then the ledger says, per remediation, whether the screen agreed with the job
    agreement = {
        node: outcomes.summarise(Ledger(LEDGER).events(node))[0].screen_agreement
        for node in cloud.nodes[: len(OUTCOMES)]
    }
    assert list(agreement.values()) == [
        "agreed",
        "disagreed",
        "no_evidence",
        "no_evidence",
        "no_evidence",
        "no_evidence",
        "no_evidence",
    ]
    # And `stats --json` counts them in the check x verdict's row
    payload = _stats_json()
    (row,) = payload["rows"]
    assert (row["check"], row["verdict"], row["alarms"]) == ("compute", "persistent", 7)
    assert (row["screen_agreed"], row["screen_disagreed"], row["screen_no_evidence"]) == (1, 1, 5)
    assert "agreed = the node screen reproduced" in payload["screen_agreement_definition"]


def test_the_stats_table_shows_the_agreement_counts(cloud, invoke):
    # Given two reproduced screens, one clean one, and one remediation without a screen
    for index, outcome in enumerate(["reproduced", "reproduced", "clean", None]):
        _run(invoke, cloud.nodes[index], f"e-{index}", outcome)

    # When stats prints its table
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "stats"])

    # Then the row carries agreed/disagreed/no evidence, and the definition is stated
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.startswith("compute")]
    assert " 2/1/1 " in row
    assert "no evidence" in result.output
    assert "the screen ran clean (not an" in result.output


def test_a_clean_screen_is_no_exoneration_and_changes_no_precision(cloud, invoke):
    # Given the same two decisions, once with a clean screen and once with none
    _run(invoke, cloud.nodes[0], "e-0", "clean", decision="approve")
    _run(invoke, cloud.nodes[1], "e-1", None, decision="approve")

    # Then both approvals count as right: the clean screen disagreed, and decided nothing
    every = outcomes.mark_recurrences(outcomes.summarise(Ledger(LEDGER).all_events()))
    assert [outcomes.classify(r) for r in every] == ["right", "right"]
    row = stats.check_stats("compute", "persistent", every)
    assert (row.right, row.wrong, row.precision) == (2, 0, 1.0)
    assert (row.screen_agreed, row.screen_disagreed, row.screen_no_evidence) == (0, 1, 1)


def test_history_json_says_whether_the_screen_agreed(cloud, invoke):
    node = cloud.nodes[0]
    _run(invoke, node, "e-0", "reproduced")

    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "history", node, "--json"])

    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["screen_agreement"] == "agreed"
    assert row["screen"] == f"reproduced on GPU 3 (UUID {UUID})"


def test_an_event_recorded_before_screen_status_is_read_from_its_line(cloud):
    # Given ledger events written before the ledger kept `screen_status` (only the line)
    ddb = aws.client("dynamodb")
    start = clock.now() - timedelta(days=3)
    lines = {
        "r-a": f"reproduced on GPU 3 (UUID {UUID})",
        "r-b": "clean (ran: gemm x6; not an exoneration)",
        "r-c": "not configured (no screenImage)",
    }
    for n, (rid, line) in enumerate(lines.items()):
        pk = f"i-{0xB00 + n:017x}"
        for k, transition in enumerate(["admitted", "awaiting_approval"]):
            at = clock.iso(start + timedelta(hours=n, minutes=k))
            item = {
                **keys.event(pk, at, rid),
                "remediation_id": rid,
                "transition": transition,
                "at": at,
                "check": "weights",
                "verdict": "weights_minority",
                "job": f"job-{n}",
            }
            if transition == "awaiting_approval":
                item["screen"] = line
            ddb.put_item(TableName=LEDGER, Item=to_item(item))

    # Then each is counted from its line
    (row,) = _stats_json()["rows"]
    assert (row["screen_agreed"], row["screen_disagreed"], row["screen_no_evidence"]) == (1, 1, 1)


def test_the_agreement_rule_is_pure():
    assert outcomes.screen_agreement("reproduced") == "agreed"
    assert outcomes.screen_agreement("clean") == "disagreed"
    for status in ["inconclusive", "failed", "not_configured", "skipped", "in_progress", None]:
        assert outcomes.screen_agreement(status) == "no_evidence"
    assert outcomes.screen_status_of_line("skipped (dry run)") == "skipped"
    assert outcomes.screen_status_of_line("something else") is None


def _outcome_lines(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if '"_aws"' in line]
    return [line for line in lines if "Check" in line]


@pytest.mark.parametrize(
    ("screen", "metric"),
    [
        ("reproduced", "screen_agreed"),
        ("clean", "screen_disagreed"),
        ("inconclusive", "screen_no_evidence"),
        ("failed", "screen_no_evidence"),
        (None, "screen_no_evidence"),
    ],
)
def test_awaiting_approval_counts_the_agreement_once_as_an_outcome_metric(
    cloud, invoke, capsys, screen, metric
):
    # Given an admitted remediation whose screen is over
    node = cloud.nodes[0]
    state = {**item_state(node, execution="e-metric"), "item": 0}
    state["admission"] = invoke("admit", state)
    if screen:
        state["screen"] = _screen(screen)
    capsys.readouterr()

    # When awaiting_approval is recorded
    invoke("record", {"transition": "awaiting_approval", "notify": False, "state": state})

    # Then one outcome metric, named for the agreement, with the outcome metrics' dimensions
    (line,) = _outcome_lines(capsys.readouterr().out)
    assert line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["ClusterName", "Check", "Verdict", "service"]
    ]
    assert line["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": metric, "Unit": "Count"}]
    assert (line["Check"], line["Verdict"], line[metric]) == ("compute", "persistent", [1.0])
    assert metric in SCREEN_AGREEMENT_METRICS.values()


def test_no_agreement_metric_at_any_other_transition(cloud, invoke, capsys):
    # Given an admitted remediation with a reproduced screen
    node = cloud.nodes[0]
    state = {**item_state(node, execution="e-other"), "item": 0}
    state["admission"] = invoke("admit", state)
    state["screen"] = _screen("reproduced")
    state["approval"] = approved(node, "e-other", approver=ALICE, decision="reject")
    capsys.readouterr()

    # When its rejection is recorded
    invoke("record", {"transition": "rejected", "notify": False, "state": state})

    # Then only the rejection's outcome metric is counted
    names = [
        m["Name"]
        for o in _outcome_lines(capsys.readouterr().out)
        for m in o["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    ]
    assert names == ["rejected"]
