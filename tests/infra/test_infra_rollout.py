"""The rollout settings in the synthesized stack: `checkModes` and `autoApprove` reach every
function as CHECK_MODES / AUTO_APPROVE, and only an enabled policy gives RequestApproval the
right to resume the workflow (and to read every outcome for the precision rule)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.infra.infra_synth import Synth, synthesize
from tests.infra.infra_template import as_list, function_ids, resources, role_statements

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rollout_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Everything in shadow but compute/persistent, and both auto-approval rules on."""
    return synthesize(
        tmp_path_factory,
        "rollout",
        {
            "checkModes": {"*": "shadow", "compute/persistent": "enforce"},
            "autoApprove": {"onHealthCheckFailed": True, "minPrecision": 0.95, "minEvents": 30},
        },
    )


def _role_of(template: dict[str, Any], folder: str) -> str:
    function = template["Resources"][function_ids(template)[folder]]
    return function["Properties"]["Role"]["Fn::GetAtt"][0]


def test_modes_and_policy_reach_every_function(rollout_synth: Synth) -> None:
    # Then every function carries the same validated settings
    functions = resources(rollout_synth.template, "AWS::Lambda::Function")
    for logical_id in function_ids(rollout_synth.template).values():
        env = functions[logical_id]["Properties"]["Environment"]["Variables"]
        assert json.loads(env["CHECK_MODES"]) == {"*": "shadow", "compute/persistent": "enforce"}
        assert json.loads(env["AUTO_APPROVE"]) == {
            "onHealthCheckFailed": True,
            "minPrecision": 0.95,
            "minEvents": 30,
        }
    # And the stack still passes cdk-nag
    assert rollout_synth.nag_error is None, rollout_synth.nag_error


def test_an_enabled_policy_lets_request_approval_resume_the_workflow(rollout_synth: Synth) -> None:
    # Given RequestApproval's statements
    statements = role_statements(
        rollout_synth.template, _role_of(rollout_synth.template, "request_approval")
    )
    actions = {a for s in statements for a in as_list(s["Action"])}
    # Then it may send the task result and scan the ledger, nothing more of Step Functions
    assert "states:SendTaskSuccess" in actions and "dynamodb:Scan" in actions
    assert {a for a in actions if a.startswith("states:")} == {"states:SendTaskSuccess"}


def test_the_dashboard_tables_outcomes_per_check_and_verdict(rollout_synth: Synth) -> None:
    # Given the dashboard body
    (dashboard,) = resources(rollout_synth.template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    # Then a table sums the record step's outcome metrics by check and verdict
    assert "Outcomes per check x verdict" in body
    assert "{SDCRemediation,ClusterName,Check,Verdict,service}" in body
    assert '\\"view\\":\\"table\\",\\"table\\"' in body
