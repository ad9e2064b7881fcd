"""The precision ledger: every terminal path of a remediation, recorded through the real record
and sweeper handlers on moto, comes back from the ledger as its outcome against the check and
verdict that raised it; `sdc-remediation stats` counts a seeded ledger exactly."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from remediation_factories import CLUSTER, JOB, LEDGER, approved, item_state

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import to_item
from sdc_remediation.dal.ledger import Ledger
from sdc_remediation.logic import outcomes

ALICE = "arn:aws:iam::123456789012:user/alice"
HEALTH = {"started_at": "2026-11-29T10:00:00.000Z", "checks": ["InstanceStress"], "detail": ""}


@pytest.fixture(autouse=True)
def roomy_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for every path's admission in one test (the guard is tested elsewhere)."""
    monkeypatch.setenv("MAX_NODES_PER_HOUR", "50")
    monkeypatch.setenv("MAX_FRACTION", "1")


def _approval(
    decision: str, node: str, execution: str, *, release: bool = False, reason: str = ""
) -> dict[str, Any]:
    """Alice's decision as the approve function claims it in the approvals table: the record
    step records the table's approver (issue 32), so a decision must be there."""
    return approved(
        node, execution, approver=ALICE, decision=decision, release=release, reason=reason
    )


def _run(invoke, node: str, execution: str, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Admit ``node`` and record ``steps`` (transition, state additions) as the workflow does."""
    state = {**item_state(node, execution=execution), "item": 0}
    state["admission"] = invoke("admit", state)
    for transition, additions in steps:
        state.update(additions)
        payload = {"transition": transition, "notify": False, "state": state}
        if transition == "failed":
            payload["error"] = {"Error": "ReplaceFailed", "Cause": "InvalidInstanceStatus"}
        invoke("record", payload)


def _remediation(node: str) -> outcomes.Remediation:
    (only,) = outcomes.summarise(Ledger(LEDGER).events(node))
    return only


def test_every_terminal_path_is_recorded_against_its_check_and_verdict(cloud, invoke):
    # Given one remediation per terminal path, each raised by compute/persistent
    confirmed, rejected, released, timed_out, failed = cloud.nodes[:5]
    failed_check = {"health": {**HEALTH, "status": "failed"}}
    passed_check = {"health": {**HEALTH, "status": "passed"}}
    _run(
        invoke,
        confirmed,
        "e-confirmed",
        [
            ("cordoned", {}),
            ("health_check_failed", failed_check),
            ("awaiting_approval", {}),
            ("approved", {"approval": _approval("approve", confirmed, "e-confirmed")}),
            (
                "replaced",
                {"replacement": {"mode": "api", "requested": True, "dry_run": False, "detail": ""}},
            ),
        ],
    )
    _run(
        invoke,
        rejected,
        "e-rejected",
        [
            ("cordoned", {}),
            ("health_check_passed", passed_check),
            (
                "rejected",
                {"approval": _approval("reject", rejected, "e-rejected", reason="flaky kernel")},
            ),
        ],
    )
    _run(
        invoke,
        released,
        "e-released",
        [
            ("cordoned", {}),
            ("health_check_passed", passed_check),
            (
                "released",
                {
                    "approval": _approval(
                        "reject", released, "e-released", release=True, reason="not the GPU"
                    )
                },
            ),
        ],
    )
    _run(invoke, timed_out, "e-timeout", [("cordoned", {}), ("approval_timed_out", {})])
    _run(invoke, failed, "e-failed", [("failed", {})])

    # When the ledger is read back
    got = {node: _remediation(node) for node in cloud.nodes[:5]}

    # Then each remediation names the check and verdict that raised it, its job, and its outcome
    assert {(r.check, r.verdict, r.job) for r in got.values()} == {("compute", "persistent", JOB)}
    assert {node: r.outcome for node, r in got.items()} == {
        confirmed: "replaced",
        rejected: "rejected",
        released: "released",
        timed_out: "approval_timed_out",
        failed: "failed",
    }
    # And the health check confirmed the hardware of the first only
    assert [node for node, r in got.items() if r.confirmed] == [confirmed]
    # And the person's decision and reason are kept with the transition
    decided = [t for t in got[rejected].transitions if t["transition"] == "rejected"]
    assert decided[0]["decision"] == "reject" and decided[0]["reason"] == "flaky kernel"
    assert decided[0]["approver"] == ALICE
    # And whether each alarm was right: confirmed right, rejected/released wrong, others unknown
    assert {node: outcomes.classify(r) for node, r in got.items()} == {
        confirmed: "right",
        rejected: "wrong",
        released: "wrong",
        timed_out: "undecided",
        failed: "undecided",
    }


def test_an_abandoned_remediation_keeps_its_check_and_verdict(cloud, invoke):
    # Given a cordoned remediation whose execution is unknown to Step Functions
    node = cloud.nodes[0]
    gone = "arn:aws:states:us-east-1:123456789012:execution:sdc-guard-test:gone"
    _run(invoke, node, gone, [("cordoned", {})])

    # When the sweeper closes it (its event names no check)
    invoke("sweeper", {})

    # Then the remediation is abandoned, still counted against compute/persistent
    remediation = _remediation(node)
    assert remediation.outcome == "abandoned"
    assert (remediation.check, remediation.verdict) == ("compute", "persistent")


def test_the_same_instance_alarming_again_makes_a_repeat_offender(cloud, invoke):
    # Given a rejected remediation, then a second alarm on the same node
    node = cloud.nodes[0]
    _run(
        invoke,
        node,
        "e-1",
        [("cordoned", {}), ("rejected", {"approval": _approval("reject", node, "e-1")})],
    )
    _run(invoke, node, "e-2", [("cordoned", {})])

    # When the ledger is summarised with the default window
    first, second = outcomes.mark_recurrences(outcomes.summarise(Ledger(LEDGER).events(node)))

    # Then the rejected one was a repeat offender; a person's rejection still decides it
    # (superseded: a recurrence made it "right", and a pod can write another report at will)
    assert first.repeat_same_instance and first.repeat
    assert outcomes.classify(first) == "wrong"
    assert not second.repeat


# --- stats on a seeded ledger ----------------------------------------------------------------


def _seed(pk: str, rid: str, at: Any, transition: str, **attrs: Any) -> None:
    item = {
        **keys.event(pk, clock.iso(at), rid),
        "remediation_id": rid,
        "transition": transition,
        "at": clock.iso(at),
        "cluster": CLUSTER,
        **attrs,
    }
    aws.client("dynamodb").put_item(TableName=LEDGER, Item=to_item(item))


def _seed_remediation(
    pk: str, rid: str, at: Any, check: str, verdict: str, job: str, transitions: list[Any]
) -> None:
    for n, step in enumerate(transitions):
        transition, extra = step if isinstance(step, tuple) else (step, {})
        _seed(
            pk,
            rid,
            at + timedelta(minutes=n),
            transition,
            check=check,
            verdict=verdict,
            job=job,
            node_name=f"hyperpod-{pk}",
            **extra,
        )


def _seeded_ledger() -> None:
    """8 remediations with known outcomes (see each line); R8 is 40 days old."""
    base = clock.now() - timedelta(days=20)
    reject = ("rejected", {"decision": "reject", "approver": ALICE})
    approve = ("approved", {"decision": "approve", "approver": ALICE})
    cp = ("compute", "persistent")
    # Every remediation starts with the admission the guard wrote (only admitted ones count).
    # R1 job-a2: health check failed, replaced -> right (confirmed, replaced)
    _seed_remediation("i-00000000000000001", "r1", base, *cp, "job-a2",
                      ["admitted", "cordoned", "health_check_failed", approve, "replaced"])  # fmt: skip
    # R2 job-a: approved, replaced, then R3 (another node of job-a) a day later -> wrong, repeat
    _seed_remediation("i-00000000000000002", "r2", base, *cp, "job-a",
                      ["admitted", "cordoned", "health_check_passed", approve, "replaced"])  # fmt: skip
    # R3 job-a: rejected, never again -> wrong
    _seed_remediation("i-00000000000000003", "r3", base + timedelta(days=1), *cp, "job-a",
                      ["admitted", "cordoned", "health_check_passed", reject])  # fmt: skip
    # R4 job-b: rejected, and the same node alarms again 3 days later (R5) -> a repeat offender,
    # still wrong: a person decided, and a recurrence never makes an alarm right
    _seed_remediation("i-00000000000000004", "r4", base + timedelta(days=2), *cp, "job-b",
                      ["admitted", "cordoned", reject])  # fmt: skip
    # R5 job-b: approval timed out -> undecided
    _seed_remediation("i-00000000000000004", "r5", base + timedelta(days=5), *cp, "job-b",
                      ["admitted", "cordoned", "approval_timed_out"])  # fmt: skip
    # R6 compute/transient: rejected with release -> wrong (released)
    _seed_remediation("i-00000000000000005", "r6", base, "compute", "transient", "job-c",
                      ["admitted", "cordoned",
                       ("released", {"decision": "reject", "approver": ALICE})])  # fmt: skip
    # R7 compute/transient: failed -> undecided
    _seed_remediation("i-00000000000000006", "r7", base, "compute", "transient", "job-c",
                      ["admitted", "failed"])  # fmt: skip
    # R8 reduced_gradient/culprit, 40 days ago: a person approved, replaced -> right
    _seed_remediation("i-00000000000000007", "r8", clock.now() - timedelta(days=40),
                      "reduced_gradient", "culprit", "job-d",
                      ["admitted", "cordoned", approve, "replaced"])  # fmt: skip
    # A cluster-level event names no node: not a remediation
    _seed(keys.cluster_pk(CLUSTER), "x-e9", base, "ambiguous")


def _stats(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "stats", "--json", *args])
    assert result.exit_code == 0, result.output
    return {f"{r['check']}/{r['verdict']}": r for r in json.loads(result.output)["rows"]}


def test_stats_counts_a_seeded_ledger_exactly(cloud):
    # Given a ledger with 8 remediations of known outcomes
    _seeded_ledger()

    # When
    rows = _stats()

    # Then per check x verdict: the counts, the repeat offenders and the precision (superseded:
    # R4 counted "right" by its recurrence alone)
    persistent = rows["compute/persistent"]
    assert {k: persistent[k] for k in (
        "alarms", "confirmed", "replaced", "rejected", "released", "timed_out",
        "repeat_offenders", "right", "wrong", "decided", "jobs",
    )} == {
        "alarms": 5, "confirmed": 1, "replaced": 2, "rejected": 2, "released": 0,
        "timed_out": 1, "repeat_offenders": 2, "right": 1, "wrong": 3, "decided": 4, "jobs": 3,
    }  # fmt: skip
    assert persistent["precision"] == 0.25
    # Wilson 95 % for 1 of 4: 0.046 .. 0.699, and 4 decided events are "few"
    assert persistent["low"] == pytest.approx(0.0456, abs=5e-4)
    assert persistent["high"] == pytest.approx(0.6994, abs=5e-4)
    assert persistent["few_events"] is True
    transient = rows["compute/transient"]
    assert (transient["alarms"], transient["released"], transient["rejected"]) == (2, 1, 1)
    assert (transient["right"], transient["wrong"], transient["precision"]) == (0, 1, 0.0)
    culprit = rows["reduced_gradient/culprit"]
    assert (culprit["alarms"], culprit["replaced"], culprit["precision"]) == (1, 1, 1.0)
    assert set(rows) == {"compute/persistent", "compute/transient", "reduced_gradient/culprit"}


def test_stats_since_leaves_older_remediations_out(cloud):
    # Given the seeded ledger, one remediation of which is 40 days old
    _seeded_ledger()

    # When only the last 30 days are asked for
    rows = _stats("--since", "30d")

    # Then the old one is not counted
    assert set(rows) == {"compute/persistent", "compute/transient"}


def test_stats_prints_a_table_with_the_definition_and_a_few_events_warning(cloud):
    # Given the seeded ledger
    _seeded_ledger()

    # When
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "stats"])

    # Then a table with a row per check x verdict, the interval, the warning and the definition
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("compute") and "persistent" in line)
    assert row.split()[:12] == [
        "compute", "persistent", "5", "1", "2", "2", "0", "1", "0", "2", "25%", "5%-70%",
    ]  # fmt: skip
    assert "few events (4 decided < 10)" in row
    assert (
        "Wilson score" in result.output and "precision = right / (right + wrong)" in result.output
    )


def test_stats_refuses_a_malformed_since(cloud):
    # When
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "stats", "--since", "thirty"])

    # Then a usage error naming the option
    assert result.exit_code == 2
    assert "--since" in result.output and "30d" in result.output


def test_history_of_a_node_shows_each_remediation_with_its_transitions(cloud):
    # Given the seeded ledger: node 4 was remediated twice
    _seeded_ledger()

    # When
    result = CliRunner().invoke(
        main, ["--ledger-table", LEDGER, "history", "hyperpod-i-00000000000000004"]
    )
    as_json = CliRunner().invoke(
        main, ["--ledger-table", LEDGER, "history", "i-00000000000000004", "--json"]
    )

    # Then both remediations, in order, with their transitions, who decided, and the outcome
    assert result.exit_code == 0, result.output
    assert result.output.index("r4") < result.output.index("r5")
    assert f"rejected by {ALICE}" in result.output
    assert "approval_timed_out" in result.output
    rows = json.loads(as_json.output)
    assert [(r["remediation_id"], r["outcome"], r["repeat_offender"]) for r in rows] == [
        ("r4", "rejected", True),
        ("r5", "approval_timed_out", False),
    ]
    assert [t["transition"] for t in rows[0]["transitions"]] == ["admitted", "cordoned", "rejected"]


def test_record_counts_outcomes_per_check_and_verdict_for_the_dashboard(cloud, invoke, capsys):
    # Given an admitted remediation
    node = cloud.nodes[0]
    state = {**item_state(node, execution="e-metric"), "item": 0}
    state["admission"] = invoke("admit", state)
    capsys.readouterr()

    # When its rejection is recorded
    state["approval"] = _approval("reject", node, "e-metric")
    invoke("record", {"transition": "rejected", "notify": False, "state": state})

    # Then one EMF metric "rejected" carries the cluster, check and verdict as dimensions
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    outcome = [line for line in lines if "Check" in line]
    # (the dimension set the dashboard's table searches: Powertools adds `service`)
    assert [o["_aws"]["CloudWatchMetrics"][0]["Dimensions"] for o in outcome] == [
        [["ClusterName", "Check", "Verdict", "service"]]
    ]
    assert [(o["Check"], o["Verdict"], o["rejected"]) for o in outcome] == [
        ("compute", "persistent", [1.0])
    ], lines
