"""The Screen step in the synthesized workflow (moto's executor, stand-in steps): after the deep
health check's verdict, polled while ``in_progress``, its outcome in the approval's input; a
failure of the step itself caught and carried to the approval as a failed screen, the
workflow's transitions unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.constructs.workflow import ERROR_PATH
from infra.template import function_logical_ids, state_machine_definition
from tests.infra.infra_synth import Synth, synthesize
from tests.infra.test_infra_workflow import EVENT, decide, happy_steps
from tests.infra.workflow_harness import finish, start, workflow

pytestmark = pytest.mark.slow

APPROVE = {
    "decision": "approve",
    "release": False,
    "approver": "arn:aws:iam::1:user/op",
    "reason": "",
    "approval_id": "a-1",
}
HAPPY = ["cordoned", "health_check_passed", "awaiting_approval", "approved", "replaced"]


@pytest.fixture(scope="module")
def fast_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with a 1-second poll (the health check's and the screen's)."""
    return synthesize(tmp_path_factory, "fast-screen", {"healthCheckPollInterval": "1s"})


class ConfigurationError(Exception):
    """Stands in for sdc_remediation.errors.ConfigurationError (the class name is the contract)."""


def _approved_run(fast_synth: Synth, steps: dict[str, Any], name: str) -> tuple[Any, Any]:
    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        execution = start(sfn, machine, EVENT, name)
        decide(sfn, run, APPROVE)
        result = finish(sfn, execution)
    return result, run


def test_the_screen_is_polled_until_its_outcome_and_the_approval_carries_it(
    fast_synth: Synth,
) -> None:
    # Given a screen that runs for two polls, then reproduces on GPU 3
    outcomes = [
        {"status": "in_progress", "job": "sdc-screen-1", "namespace": "sdc-screen"},
        {"status": "in_progress", "job": "sdc-screen-1", "namespace": "sdc-screen"},
        {"status": "reproduced", "gpu_index": 3, "gpu_uuid": "GPU-3", "job": "sdc-screen-1"},
    ]
    steps = happy_steps(["passed"])
    steps["screen"] = lambda s: outcomes.pop(0)

    # When the alarm runs through and the operator approves
    result, run = _approved_run(fast_synth, steps, "screen-reproduced")

    # Then the screen ran after the health check, was polled with its own previous result,
    # and the approval saw its outcome; the transitions are the usual ones
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == HAPPY
    first, second, third = run.inputs("screen")
    assert "screen" not in first and first["health"]["status"] == "passed"
    assert second["screen"]["status"] == third["screen"]["status"] == "in_progress"
    (approval,) = run.inputs("request_approval")
    assert approval["screen"]["status"] == "reproduced" and approval["screen"]["gpu_index"] == 3
    (replace,) = run.inputs("replace")
    assert replace["screen"]["status"] == "reproduced"


def test_a_failing_screen_step_goes_on_to_the_approval_unchanged(fast_synth: Synth) -> None:
    # Given a Screen step that raises (RBAC denied, a bug)
    steps = happy_steps(["passed"])

    def broken(state: dict[str, Any]) -> Any:
        raise ConfigurationError("Kubernetes denied the request (403)")

    steps["screen"] = broken

    # When the alarm runs through
    result, run = _approved_run(fast_synth, steps, "screen-broken")

    # Then nothing failed: the approval was asked with the step's error as the screen's, and
    # the node was replaced after the approval as it would have been
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == HAPPY
    (approval,) = run.inputs("request_approval")
    assert approval["screen"]["Error"] == "ConfigurationError"
    assert "403" in approval["screen"]["Cause"]
    assert "error" not in approval  # not the item's failure: $.error stays the record step's


def test_a_screen_without_a_status_is_a_failed_screen(fast_synth: Synth) -> None:
    # Given a Screen step that answers nothing usable
    steps = happy_steps(["passed"])
    steps["screen"] = lambda s: {"job": "x"}

    # When
    result, run = _approved_run(fast_synth, steps, "screen-no-status")

    # Then
    assert result["status"] == "SUCCEEDED" and run.transitions() == HAPPY
    (approval,) = run.inputs("request_approval")
    assert approval["screen"] == {
        "status": "failed",
        "reason": "the Screen step returned no status",
    }


def test_no_screen_runs_when_hyperpod_already_replaced_the_node(fast_synth: Synth) -> None:
    # Given HyperPod's own recovery replaced the node during the health check
    steps = happy_steps(["replaced_by_hyperpod"])
    steps["screen"] = lambda s: pytest.fail("screened a node HyperPod replaced")

    with workflow(fast_synth.template, steps) as (sfn, machine, run):
        result = finish(sfn, start(sfn, machine, EVENT, "screen-replaced"))

    # Then
    assert result["status"] == "SUCCEEDED"
    assert run.inputs("screen") == []
    assert run.transitions() == ["cordoned", "replaced_by_hyperpod"]


def test_the_screen_task_catches_everything_into_its_own_key(fast_synth: Synth) -> None:
    # Given the definition as synthesized
    states = _states(fast_synth.template)
    for prefix in ("", "Late"):
        screen = states[f"{prefix}Screen"]
        # Then every error goes on to the approval, at $.screen (never $.error, which the
        # record steps read as the item's failure), after the transient retries
        assert screen["Catch"] == [
            {
                "ErrorEquals": ["States.ALL"],
                "ResultPath": "$.screen",
                "Next": f"{prefix}RecordAwaitingApproval",
            }
        ]
        assert ERROR_PATH not in json.dumps(screen["Catch"])
        assert any("ClusterApiUnavailable" in r["ErrorEquals"] for r in screen["Retry"])
        # and each health-check verdict leads to it
        for verdict in ("Passed", "Failed", "TimedOut"):
            assert states[f"{prefix}RecordHealthCheck{verdict}"]["Next"] == f"{prefix}Screen"


def _states(template: dict[str, Any]) -> dict[str, Any]:
    """Every state of the definition, Map item processors' included, by name."""
    arns = {
        folder: f"arn:aws:lambda:us-east-1:123456789012:function:{folder}"
        for folder in function_logical_ids(template)
    }
    text = state_machine_definition(template, arns)
    found: dict[str, Any] = {}

    def walk(states: dict[str, Any]) -> None:
        for name, state in states.items():
            found[name] = state
            for branch in state.get("Branches", []):
                walk(branch["States"])
            for key in ("ItemProcessor", "Iterator"):
                if key in state:
                    walk(state[key]["States"])

    walk(json.loads(text)["States"])
    return found
