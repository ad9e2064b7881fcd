"""The synthesized workflow, executed on moto's Step Functions interpreter with stand-in steps:
each path of the workflow in docs/architecture.md does what the contract says, and errors never uncordon or
replace."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.infra_synth import Synth, synthesize
from tests.infra.workflow_harness import finish, start, wait_for, workflow

pytestmark = pytest.mark.slow

ALARM = {
    "alarm_name": "sdc-guard-example-hyperpod-cluster-sdc_replay_mismatch",
    "alarm_arn": "arn:aws:cloudwatch:us-east-1:123456789012:alarm:sdc-guard-example-hyperpod-cluster-sdc_replay_mismatch",
    "state": "ALARM",
    "reason": "Threshold Crossed",
    "time": "2026-11-29T10:00:00Z",
    "metric_name": "sdc_replay_mismatch",
    "namespace": "SDC",
    "cluster_name": "example-hyperpod-cluster",
    "window_start": "2026-11-29T09:59:50Z",
    "window_end": "2026-11-29T10:00:00Z",
}
SUSPECT = {
    "node_name": "hyperpod-i-0123456789abcdef0",
    "instance_id": "i-0123456789abcdef0",
    "instance_group": "workers",
    "job": "llama",
    "ranks": [5],
    "check": "compute",
    "verdict": "persistent",
    "step": 1200,
    "suspect_window": [1190, 1200],
}
EVENT = {
    "source": "aws.cloudwatch",
    "detail-type": "CloudWatch Alarm State Change",
    "detail": {"state": {"value": "ALARM"}},
}


class NodeNotFound(Exception):
    """Stands in for sdc_remediation.errors.NodeNotFound (the class name is the contract)."""


@pytest.fixture(scope="module")
def fast_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with a 1-second health-check poll, so the loop runs in a test."""
    return synthesize(tmp_path_factory, "fast", {"healthCheckPollInterval": "1s"})


def localized(
    suspects: list[dict[str, Any]],
    ambiguous: bool = False,
    *,
    pending: list[dict[str, Any]] | None = None,
    refused: list[dict[str, Any]] | None = None,
) -> Any:
    return lambda event: {
        "alarm": ALARM,
        "suspects": suspects,
        "pending": pending or [],
        "suspect_count": len(suspects) + len(pending or []),
        "refused": refused or [],
        "refused_count": len(refused or []),
        "ambiguous": ambiguous,
        "reports": 1,
    }


def happy_steps(polls: list[str]) -> dict[str, Any]:
    """Stand-ins for an admitted suspect whose health check reports `polls` in turn."""
    remaining = list(polls)
    return {
        "localize": localized([SUSPECT]),
        "admit": lambda s: {"decision": "admitted", "remediation_id": "r-1", "reason": "first"},
        "cordon": lambda s: {
            "node_name": s["suspect"]["node_name"],
            "cordoned": True,
            "changed": True,
            "dry_run": False,
        },
        "start_health_check": lambda s: {
            "status": "in_progress",
            "started_at": "t0",
            "checks": ["InstanceStress"],
            "dry_run": False,
        },
        "poll_health_check": lambda s: {
            "status": remaining.pop(0),
            "started_at": "t0",
            "detail": "",
        },
        # A stack without screenImage: the Screen step answers at once.
        "screen": lambda s: {"status": "not_configured", "reason": "screenImage is not set"},
        "request_approval": lambda s: None,
        "replace": lambda s: {"mode": "api", "requested": True, "dry_run": False, "detail": ""},
        "uncordon": lambda s: {
            "node_name": s["suspect"]["node_name"],
            "cordoned": False,
            "changed": True,
            "dry_run": False,
        },
    }


def decide(sfn: Any, run: Any, decision: dict[str, Any]) -> None:
    wait_for(lambda: bool(run.tokens))
    sfn.send_task_success(taskToken=run.tokens[0], output=json.dumps(decision))


def test_approved_suspect_is_cordoned_checked_and_replaced(fast_synth: Synth) -> None:
    # Given an alarm with one suspect whose health check passes on the second poll
    with workflow(fast_synth.template, happy_steps(["in_progress", "passed"])) as (
        sfn,
        machine,
        run,
    ):
        execution = start(sfn, machine, EVENT, "approve")
        # When the operator approves
        decide(
            sfn,
            run,
            {
                "decision": "approve",
                "release": False,
                "approver": "arn:aws:iam::1:user/op",
                "reason": "",
                "approval_id": "a-1",
            },
        )
        result = finish(sfn, execution)
    # Then the workflow cordons, polls until done, waits, replaces, and records each transition
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == [
        "cordoned",
        "health_check_passed",
        "awaiting_approval",
        "approved",
        "replaced",
    ]
    assert len(run.inputs("poll_health_check")) == 2
    assert run.inputs("uncordon") == []
    # And each step saw the item state with the previous results under their contract keys
    (replace_input,) = run.inputs("replace")
    assert replace_input["suspect"] == SUSPECT and replace_input["alarm"] == ALARM
    assert replace_input["admission"]["decision"] == "admitted"
    assert replace_input["cordon"]["cordoned"] is True
    assert replace_input["health"]["status"] == "passed"
    assert replace_input["approval"]["decision"] == "approve"
    assert replace_input["execution"].endswith(":approve")
    (approval_input,) = run.inputs("request_approval")
    assert approval_input["task_token"] == run.tokens[0]
    assert set(approval_input) == {
        "alarm",
        "suspect",
        "execution",
        "admission",
        "cordon",
        "health",
        "screen",
        "task_token",
    }
    assert approval_input["screen"]["status"] == "not_configured"


def test_rejected_with_release_uncordons_and_without_stays_cordoned(fast_synth: Synth) -> None:
    outcomes = {}
    for release in (True, False):
        # Given a suspect waiting for approval
        with workflow(fast_synth.template, happy_steps(["failed"])) as (sfn, machine, run):
            execution = start(sfn, machine, EVENT, f"reject-{release}")
            # When the operator rejects, with or without asking for release
            decide(
                sfn,
                run,
                {
                    "decision": "reject",
                    "release": release,
                    "approver": "op",
                    "reason": "false alarm",
                    "approval_id": "a-1",
                },
            )
            assert finish(sfn, execution)["status"] == "SUCCEEDED"
            outcomes[release] = (
                run.transitions(),
                len(run.inputs("uncordon")),
                len(run.inputs("replace")),
            )
    # Then only the release uncordons, and nothing is replaced
    assert outcomes[True] == (
        ["cordoned", "health_check_failed", "awaiting_approval", "released"],
        1,
        0,
    )
    assert outcomes[False] == (
        ["cordoned", "health_check_failed", "awaiting_approval", "rejected"],
        0,
        0,
    )


def test_terminal_error_is_recorded_and_notified_and_nothing_is_undone(fast_synth: Synth) -> None:
    # Given a cordoned node whose health check start fails for good
    steps = happy_steps([])
    steps["start_health_check"] = lambda s: (_ for _ in ()).throw(NodeNotFound("node vanished"))
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "terminal"))
    # Then the failure is recorded with the error and a notification, once, and the node is
    # left cordoned: no retry of a terminal error, no uncordon, no replacement
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == ["cordoned", "failed"]
    failed = run.inputs("record")[-1]
    assert failed["notify"] is True
    assert failed["error"]["Error"] == "NodeNotFound"
    assert failed["state"]["cordon"]["cordoned"] is True
    assert len(run.inputs("start_health_check")) == 1
    assert run.inputs("uncordon") == [] and run.inputs("replace") == []


def test_duplicate_and_circuit_open_never_cordon(fast_synth: Synth) -> None:
    for decision, transition, notify in (
        ("duplicate", "duplicate", False),
        ("circuit_open", "circuit_open", True),
    ):
        # Given admit refusing the suspect
        steps = happy_steps([])
        steps["admit"] = lambda s, d=decision: {
            "decision": d,
            "remediation_id": None,
            "reason": "guard",
        }
        with workflow(fast_synth.template, steps) as (sfn, machine, run):
            assert finish(sfn, start(sfn, machine, EVENT, decision))["status"] == "SUCCEEDED"
        # Then it is recorded (circuit_open notifies) and the node is never touched
        assert run.transitions() == [transition]
        assert run.inputs("record")[0]["notify"] is notify
        assert run.inputs("cordon") == []


@pytest.mark.parametrize(
    ("suspects", "ambiguous", "transition"),
    [([SUSPECT], True, "ambiguous"), ([], False, "no_suspects")],
)
def test_nobody_is_named_when_localization_is_ambiguous_or_empty(
    fast_synth: Synth, suspects: list[dict[str, Any]], ambiguous: bool, transition: str
) -> None:
    # Given localize finding no attributable suspect
    with workflow(fast_synth.template, {"localize": localized(suspects, ambiguous)}) as (
        sfn,
        machine,
        run,
    ):
        result = finish(sfn, start(sfn, machine, EVENT, transition))
    # Then the alarm is recorded with a notification and no step after localize runs
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == [transition]
    assert run.inputs("record")[0]["notify"] is True
    assert [name for name, _ in run.calls] == ["localize", "record"]


def test_each_suspect_is_remediated_independently(fast_synth: Synth) -> None:
    # Given two suspects, the second of which is already in remediation
    other = {
        **SUSPECT,
        "node_name": "hyperpod-i-0fedcba9876543210",
        "instance_id": "i-0fedcba9876543210",
    }
    steps = happy_steps(["replaced_by_hyperpod"])
    steps["localize"] = localized([SUSPECT, other])
    steps["admit"] = lambda s: {
        "decision": "admitted"
        if s["suspect"]["instance_id"] == SUSPECT["instance_id"]
        else "duplicate",
        "remediation_id": "r-1",
        "reason": "",
    }
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "two"))
    # Then the first goes through cordon and HyperPod's own replacement (no approval needed),
    # and the second is only recorded as a duplicate
    assert result["status"] == "SUCCEEDED"
    assert sorted(run.transitions()) == ["cordoned", "duplicate", "replaced_by_hyperpod"]
    assert [s["suspect"]["instance_id"] for s in run.inputs("cordon")] == [SUSPECT["instance_id"]]
    assert run.inputs("request_approval") == []
    assert "remediations" not in json.loads(result["output"])


def test_approval_timeout_leaves_the_node_cordoned_and_notifies(fast_synth: Synth) -> None:
    # Given the approval wait shortened to 1 s (the config's minimum is a minute)
    def shorten(asl: dict[str, Any]) -> None:
        from tests.infra.infra_template import item_states

        item_states(asl)["RequestApproval"]["TimeoutSeconds"] = 1

    with workflow(fast_synth.template, happy_steps(["passed"]), patch_definition=shorten) as (
        sfn,
        machine,
        run,
    ):
        # When nobody decides
        result = finish(sfn, start(sfn, machine, EVENT, "timeout"))
    # Then approval_timed_out is recorded with a notification; no replace, no uncordon
    assert result["status"] == "SUCCEEDED"
    assert run.transitions()[-1] == "approval_timed_out"
    assert run.inputs("record")[-1]["notify"] is True
    assert run.inputs("replace") == [] and run.inputs("uncordon") == []


def largest_suspects(nodes: int = 64) -> list[dict[str, Any]]:
    """localize's suspects for the largest alarm the agent can produce (a 1,024-rank job, every
    rank of 64 nodes named, hundreds of long divergent tensor names), at the size localize
    bounds each suspect to (tests/lambdas/test_step_localize_untrusted.py measures that)."""
    out = []
    for n in range(nodes):
        instance = f"i-{n + 1:017x}"
        out.append(
            {
                **SUSPECT,
                "node_name": f"hyperpod-{instance}",
                "instance_id": instance,
                "ranks": {
                    str(n * 16 + r): {
                        "gpu_uuid": f"GPU-{n * 16 + r:08x}-1111-2222-3333-444444444444",
                        "local_rank": r,
                    }
                    for r in range(8)
                },
                "rank_count": 16,
                "divergent_tensors": [
                    f"model.layers.{i}.mlp.down_proj.weight".ljust(120, "_") for i in range(3)
                ],
                "divergent_tensor_count": 400,
                "report_log_group": "/sdc/example-hyperpod-cluster",
                "report_log_stream": "llama-pretrain",
                "last_audit_pass": 1190,
                "last_weight_check_pass": 1150,
            }
        )
    return out


def test_the_largest_alarm_runs_through_the_definition_under_the_payload_limit(
    fast_synth: Synth,
) -> None:
    # Given the largest alarm: 64 suspects; the guard admits two, the rest find the circuit open
    limit = 256 * 1024
    steps = happy_steps(["replaced_by_hyperpod"] * 2)
    steps["localize"] = localized(largest_suspects())
    admitted = {"i-00000000000000001", "i-00000000000000002"}
    steps["admit"] = lambda s: {
        "decision": "admitted" if s["suspect"]["instance_id"] in admitted else "circuit_open",
        "remediation_id": "r-" + s["suspect"]["instance_id"],
        "reason": "",
    }
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "largest"))

    # Then it ends, every state a step received and the execution's output stay under
    # Step Functions' 256 KiB (States.DataLimitExceeded cannot be caught)
    assert result["status"] == "SUCCEEDED"
    assert sorted(run.transitions()).count("circuit_open") == 62
    assert max(len(json.dumps(payload).encode()) for _, payload in run.calls) < limit
    # And the execution's output does not grow with the items' results (the Map discards them:
    # each item's outcome is in the ledger and the execution history)
    assert len(result["output"].encode()) < limit // 2, len(result["output"].encode()) // 1024


class UntrustedReport(Exception):
    """Stands in for sdc_remediation.errors.UntrustedReport (the class name is the contract)."""


def test_an_untrusted_report_ends_notified_with_nothing_cordoned(fast_synth: Synth) -> None:
    # Given localize finds a report whose instance id is not the node's
    steps = happy_steps([])
    steps["localize"] = lambda event: (_ for _ in ()).throw(
        UntrustedReport("ranks.3.instance_id: instance i-b is not node hyperpod-i-a")
    )
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "untrusted"))

    # Then it is recorded once as failed, notified with the field that lied, never retried, and
    # no node is admitted or cordoned
    assert result["status"] == "FAILED"
    assert run.transitions() == ["failed"]
    [failed] = run.inputs("record")
    assert failed["notify"] is True
    assert failed["error"]["Error"] == "UntrustedReport"
    assert "ranks.3.instance_id" in failed["error"]["Cause"]
    assert len(run.inputs("localize")) == 1
    assert run.inputs("admit") == [] and run.inputs("cordon") == []


def test_storms_are_bounded_and_retries_jittered(fast_synth: Synth) -> None:
    # Given the synthesized definition
    from tests.infra.infra_template import all_states, definition

    asl = definition(fast_synth.template)
    states = all_states(asl["States"])
    # Then each Map runs a bounded number of suspects at once
    for name in ("RemediateSuspects", "RemediateLateNodes"):
        assert 1 <= states[name]["MaxConcurrency"] <= 20
    # And every retry of a race (the guard's transaction, a throttled API) is fully jittered,
    # so the items that lost it do not retry together; the report wait is not a race (below)
    retries = [r for s in states.values() for r in s.get("Retry", [])]
    races = [r for r in retries if r["ErrorEquals"] != ["ReportNotYetVisible"]]
    assert races and all(r.get("JitterStrategy") == "FULL" for r in races)
    assert not any("ReportNotYetVisible" in r["ErrorEquals"] for r in races)


def test_the_wait_for_a_late_report_has_a_floor_of_five_minutes(fast_synth: Synth) -> None:
    # Given the retries of every task that may raise ReportNotYetVisible (localize's two)
    from tests.infra.infra_template import all_states, definition

    states = all_states(definition(fast_synth.template)["States"])
    for name in ("Localize", "LocalizeLate"):
        retries = states[name]["Retry"]
        # Then the first retrier for it is its own (Step Functions uses the first that matches)
        (first,) = [r for r in retries if "ReportNotYetVisible" in r["ErrorEquals"]]
        assert retries.index(first) == 0 and first["ErrorEquals"] == ["ReportNotYetVisible"]
        # And it waits without jitter: every wait is exactly interval * rate**n, so the whole
        # wait is bounded below (and above) by 5+10+20+40+80+160 = 315 s, never ~0 s
        assert first.get("JitterStrategy", "NONE") == "NONE", name
        assert "MaxDelaySeconds" not in first
        waits = [
            first["IntervalSeconds"] * first["BackoffRate"] ** n
            for n in range(first["MaxAttempts"])
        ]
        assert sum(waits) == 315, (name, waits)
        assert sum(waits) >= 300


def _missing_keys_steps(broken: str) -> dict[str, Any]:
    steps = happy_steps(["passed"])
    steps[broken] = lambda s: {"unexpected": True}
    return steps


@pytest.mark.parametrize("broken", ["admit", "start_health_check", "poll_health_check"])
def test_a_step_whose_output_lacks_its_keys_is_recorded_as_failed(
    fast_synth: Synth, broken: str
) -> None:
    # Given a step that answers without the key the next Choice reads
    with workflow(fast_synth.template, _missing_keys_steps(broken)) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, f"missing-{broken}"))
    # Then the item ends in the failure recorder (not a States.Runtime error that nothing sees),
    # which is given what keys the remediation: the execution id and the Map item index
    assert result["status"] == "SUCCEEDED", result
    assert run.transitions()[-1] == "failed"
    failed = run.inputs("record")[-1]
    assert failed["error"]["Error"] == "UnexpectedStepResult"
    assert failed["execution"].endswith(f":missing-{broken}")
    assert failed["state"]["item"] == 0
    assert run.inputs("replace") == [] and run.inputs("uncordon") == []


def test_an_approval_without_approver_is_recorded_as_failed_not_approved(fast_synth: Synth) -> None:
    # Given an approval sent without `approver` (straight to SendTaskSuccess, not via sdc-guard)
    with workflow(fast_synth.template, happy_steps(["passed"])) as (sfn, machine, run):
        execution = start(sfn, machine, EVENT, "no-approver")
        decide(sfn, run, {"decision": "approve", "approval_id": "a-1"})
        result = finish(sfn, execution)
    # Then nothing is replaced and the failure is recorded
    assert result["status"] == "SUCCEEDED", result
    assert run.transitions()[-2:] == ["awaiting_approval", "failed"]
    assert run.inputs("replace") == []


def test_a_step_that_keeps_failing_ends_recorded_on_every_path(fast_synth: Synth) -> None:
    # Given each step in turn raising an error nobody expected (a bug)
    for broken in ("admit", "cordon", "start_health_check", "poll_health_check", "replace"):
        steps = happy_steps(["passed"])
        steps[broken] = lambda s: (_ for _ in ()).throw(KeyError("bug"))
        with workflow(fast_synth.template, steps) as (sfn, machine, run):
            execution = start(sfn, machine, EVENT, f"bug-{broken}")
            if broken == "replace":
                decide(
                    sfn,
                    run,
                    {
                        "decision": "approve",
                        "approver": "arn:aws:iam::1:user/op",
                        "approval_id": "a",
                    },
                )
            result = finish(sfn, execution)
        # Then the item ends with `failed` recorded (which closes the remediation) every time
        assert result["status"] == "SUCCEEDED", (broken, result)
        assert run.transitions()[-1] == "failed", broken
        assert run.inputs("record")[-1]["error"]["Error"] == "KeyError", broken


def test_a_50_node_storm_runs_through_the_definition_without_a_failure_per_node(
    fast_synth: Synth,
) -> None:
    # Given one alarm naming 50 nodes, and admit answering circuit_open for each (the guard's
    # answer to an alarm larger than the blast radius; tests/lambdas checks the guard and the
    # once-per-execution message)
    suspects = [
        {**SUSPECT, "node_name": f"hyperpod-i-{n:017x}", "instance_id": f"i-{n:017x}"}
        for n in range(50)
    ]
    steps = happy_steps([])
    steps["localize"] = localized(suspects)
    steps["admit"] = lambda s: {
        "decision": "circuit_open",
        "remediation_id": None,
        "reason": f"one alarm names {s['suspects_in_alarm']} nodes",
    }
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "storm"), timeout=180)
    # Then every item ends as circuit_open (recorded with the execution and its own item index),
    # nothing is cordoned and nothing fails
    assert result["status"] == "SUCCEEDED", result
    assert run.transitions() == ["circuit_open"] * 50
    assert sorted(r["state"]["item"] for r in run.inputs("record")) == list(range(50))
    assert {r["state"]["suspects_in_alarm"] for r in run.inputs("record")} == {50}
    assert run.inputs("cordon") == []


REFUSAL = {
    "error": "UntrustedReport",
    "field": "job",
    "reason": "job: job attacker names node hyperpod-i-0aaaaaaaaaaaaaaa1, but no pod of it ran there",
    "job": "attacker",
    "node_name": "hyperpod-i-0aaaaaaaaaaaaaaa1",
}
LATE = {"job": "llama", "node_name": "hyperpod-i-0fedcba9876543210"}


class ReportNotYetVisible(Exception):
    """Stands in for sdc_remediation.errors.ReportNotYetVisible (retried by name)."""


def _late_localize(found_after: int | None) -> Any:
    """localize's stand-in: the alarm's output (SUSPECT, one pending node), then for the pending
    node's item ReportNotYetVisible `found_after` times before its suspect (None: never)."""
    calls = {"late": 0}
    first = localized([SUSPECT], pending=[LATE])

    def handler(payload: dict[str, Any]) -> Any:
        if "pending" not in payload:
            return first(payload)
        calls["late"] += 1
        if found_after is None or calls["late"] <= found_after:
            raise ReportNotYetVisible(f"no report names {payload['pending']['node_name']} yet")
        return {**SUSPECT, "node_name": LATE["node_name"], "instance_id": "i-0fedcba9876543210"}

    return handler


def _short_retries(asl: dict[str, Any]) -> None:
    from tests.infra.infra_template import all_states

    for state in all_states(asl["States"]).values():
        for retry in state.get("Retry", []):
            retry["IntervalSeconds"], retry["BackoffRate"] = 1, 1.0


def test_refused_claims_are_recorded_once_and_the_other_suspects_go_on(fast_synth: Synth) -> None:
    # Given localize refused one claim and named one genuine suspect
    steps = happy_steps(["replaced_by_hyperpod"])
    steps["localize"] = localized([SUSPECT], refused=[REFUSAL])
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "refused"))
    # Then the refusal is recorded and notified first, and the genuine suspect is remediated
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == ["refused", "cordoned", "replaced_by_hyperpod"]
    (refused,) = [r for r in run.inputs("record") if r["transition"] == "refused"]
    assert refused["notify"] is True and refused["state"]["refused"] == [REFUSAL]


def test_an_alarm_whose_only_claim_was_refused_ends_after_recording_it(fast_synth: Synth) -> None:
    steps = {"localize": localized([], refused=[REFUSAL])}
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "only-refused"))
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == ["refused"]  # not a second message for "no suspects"


def test_a_late_node_is_remediated_once_its_report_shows_without_holding_up_the_others(
    fast_synth: Synth,
) -> None:
    # Given one suspect and one node whose report shows only on the third look
    steps = happy_steps(["replaced_by_hyperpod", "replaced_by_hyperpod"])
    steps["localize"] = _late_localize(found_after=2)
    with workflow(fast_synth.template, steps, patch_definition=_short_retries) as (
        sfn,
        machine,
        run,
    ):
        result = finish(sfn, start(sfn, machine, EVENT, "late"))
    # Then both are cordoned (the late one after its report showed), each in its own item
    assert result["status"] == "SUCCEEDED"
    cordoned = sorted(s["suspect"]["instance_id"] for s in run.inputs("cordon"))
    assert cordoned == sorted([SUSPECT["instance_id"], "i-0fedcba9876543210"])
    late_looks = [p for p in run.inputs("localize") if "pending" in p]
    assert len(late_looks) == 3 and late_looks[0]["pending"] == LATE
    assert all(s["suspects_in_alarm"] == 2 for s in run.inputs("admit"))


def test_a_late_node_that_never_shows_is_recorded_and_the_others_are_not_held(
    fast_synth: Synth,
) -> None:
    steps = happy_steps(["replaced_by_hyperpod"])
    steps["localize"] = _late_localize(found_after=None)
    with workflow(fast_synth.template, steps, patch_definition=_short_retries) as (
        sfn,
        machine,
        run,
    ):
        result = finish(sfn, start(sfn, machine, EVENT, "late-never"), timeout=120)
    # Then the genuine suspect was remediated, and the late node's retries ended (bounded) in
    # a recorded, notified failure naming it
    assert result["status"] == "SUCCEEDED"
    assert [s["suspect"]["instance_id"] for s in run.inputs("cordon")] == [SUSPECT["instance_id"]]
    (failed,) = [r for r in run.inputs("record") if r["transition"] == "failed"]
    assert failed["error"]["Error"] == "ReportNotYetVisible" and failed["notify"] is True
    assert failed["state"]["pending"] == LATE
    late_looks = [p for p in run.inputs("localize") if "pending" in p]
    assert len(late_looks) == 1 + 6  # the first look and the workflow's 6 retries


class LedgerUnwritable(Exception):
    """A record step that cannot write (an error nobody expected: caught by States.ALL)."""


def test_an_item_whose_failure_cannot_be_recorded_ends_alone_and_the_others_go_on(
    fast_synth: Synth,
) -> None:
    # Given two admitted suspects, and a record step that cannot write anything about the
    # first (its `cordoned` raises, then RecordItemFailed raises too)
    other = {
        **SUSPECT,
        "node_name": "hyperpod-i-0fedcba9876543210",
        "instance_id": "i-0fedcba9876543210",
    }
    steps = happy_steps(["passed", "passed"])
    steps["localize"] = localized([SUSPECT, other])

    def record(payload: dict[str, Any]) -> Any:
        suspect = payload["state"].get("suspect") or {}
        if suspect.get("instance_id") == SUSPECT["instance_id"]:
            raise LedgerUnwritable("the ledger refuses this item")
        return {"recorded": True}

    steps["record"] = record
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        execution = start(sfn, machine, EVENT, "isolated")
        # When the second suspect reaches its approval and an operator approves it
        decide(
            sfn,
            run,
            {"decision": "approve", "approver": "arn:aws:iam::1:user/op", "approval_id": "a"},
        )
        result = finish(sfn, execution)
    # Then the second suspect was replaced: the first item's failure did not stop it
    (replaced,) = run.inputs("replace")
    assert replaced["suspect"]["instance_id"] == other["instance_id"]
    recorded = [
        (r["transition"], (r["state"].get("suspect") or {}).get("instance_id"))
        for r in run.inputs("record")
    ]
    assert ("replaced", other["instance_id"]) in recorded
    # And the first item tried to record its failure, and nothing else touched its node
    assert ("failed", SUSPECT["instance_id"]) in recorded
    assert [s["suspect"]["instance_id"] for s in run.inputs("start_health_check")] == [
        other["instance_id"]
    ]
    # And once every item ended, the loss is recorded and notified at the alarm's level and
    # the execution reports the failure (the sweeper closes the open remediation)
    assert result["status"] == "FAILED", result
    assert result.get("error") == "RemediationFailed"
    last = run.inputs("record")[-1]
    assert last["transition"] == "failed" and last["notify"] is True
    assert last["error"]["Error"] == "ItemFailureUnrecorded"
    assert "suspect" not in last["state"]


def test_every_item_succeeds_alone_without_a_fail_state_inside_a_map(fast_synth: Synth) -> None:
    # Given the synthesized definition
    from tests.infra.infra_template import all_states, definition

    states = definition(fast_synth.template)["States"]
    # Then no state inside either Map is a Fail (one would fail the Map and every sibling)
    for name in ("RemediateSuspects", "RemediateLateNodes"):
        inside = all_states(all_states(states)[name]["ItemProcessor"]["States"])
        assert [n for n, s in inside.items() if s["Type"] == "Fail"] == [], name
        # And every path of an item ends in one of the Pass states its Map reads
        ends = {n for n, s in inside.items() if s.get("End")}
        prefix = "Late" if name == "RemediateLateNodes" else ""
        failed = {"LateNodeFailed", "LateItemFailed"} if prefix else {"ItemFailed"}
        assert ends == {f"{prefix}ItemDone", *failed}, name
        assert all(inside[n]["Type"] == "Pass" for n in ends), name


def _record_failing_on(transition: str) -> Any:
    def record(payload: dict[str, Any]) -> Any:
        if payload["transition"] == transition:
            raise LedgerUnwritable(f"the ledger refuses {transition}")
        return {"recorded": True}

    return record


def test_a_refusal_notice_that_fails_never_blocks_the_corroborated_suspect(
    fast_synth: Synth,
) -> None:
    # Given localize refused one claim and named one genuine suspect, and recording the
    # refusal fails
    steps = happy_steps(["replaced_by_hyperpod"])
    steps["localize"] = localized([SUSPECT], refused=[REFUSAL])
    steps["record"] = _record_failing_on("refused")
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "refusal-fails"))
    # Then the genuine suspect is still cordoned and handled
    assert [s["suspect"]["instance_id"] for s in run.inputs("cordon")] == [SUSPECT["instance_id"]]
    assert run.transitions() == ["refused", "cordoned", "replaced_by_hyperpod", "failed"]
    # And afterwards the lost notice is recorded and notified as the execution's failure
    failed = run.inputs("record")[-1]
    assert failed["notify"] is True and failed["error"]["Error"] == "LedgerUnwritable"
    assert "suspect" not in failed["state"]
    assert result["status"] == "FAILED"


def test_a_refusal_notice_that_fails_alone_ends_recorded_as_failed(fast_synth: Synth) -> None:
    # Given an alarm whose only claim was refused, and recording the refusal fails
    steps = {"localize": localized([], refused=[REFUSAL]), "record": _record_failing_on("refused")}
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "refusal-fails-alone"))
    # Then the execution does not end as if it had been told: the failure is recorded
    assert run.transitions() == ["refused", "failed"]
    assert run.inputs("record")[-1]["error"]["Error"] == "LedgerUnwritable"
    assert result["status"] == "FAILED"
