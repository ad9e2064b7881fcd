"""Least privilege, pinned: every function's role and each managed policy people attach grant
exactly the statements of tests/infra/pinned_permissions.json, no more and no fewer.

The other infra tests check properties (who may write the ledger, that a wildcard has a reason);
this one catches what they do not name: a refactor that moves grants between constructs and adds
an action on the way, a new statement on a role that should not have it, a condition dropped.
A change that means to grant differently rewrites the table
(`.venv/bin/python -m tests.infra.iam_permissions --write`) and the review reads its diff.
"""

from __future__ import annotations

import json

import pytest

from tests.infra.iam_permissions import (
    CDK_PROVIDERS,
    PINNED,
    diff,
    pinned_principals,
    statement_lines,
)
from tests.infra.infra_synth import Synth


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default", "variant"])
def test_each_function_role_and_managed_policy_grants_exactly_the_pinned_statements(
    which: str, request: pytest.FixtureRequest
) -> None:
    # Given the stack as synthesized (cdk.json's defaults, or every option on)
    template = request.getfixturevalue(f"{which}_synth").template
    expected = json.loads(PINNED.read_text(encoding="utf-8"))[which]
    # When its roles' and managed policies' statements are read as text
    found = pinned_principals(template)
    # Then they are exactly the pinned ones, principal by principal
    assert found == expected, "\n".join(
        ["granted differently than pinned:", *diff(expected, found)]
    )


@pytest.mark.slow
def test_the_pinned_table_covers_every_function_and_both_managed_policies(
    default_synth: Synth,
) -> None:
    # Given the default stack's functions (their handler folders)
    template = default_synth.template
    folders = {
        CDK_PROVIDERS.get(module, module)
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
        for module in [r["Properties"]["Handler"].split(".", 1)[0]]
    }
    # Then each has a pinned role, and the operators' and agent's policies are pinned too
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))["default"]
    assert {n.split(":", 1)[1] for n in pinned if n.startswith("function:")} == folders
    assert {n for n in pinned if n.startswith("managed:")} == {
        "managed:OperatorsPolicy",
        "managed:AgentPolicy",
    }


def test_a_widened_statement_is_reported_line_by_line() -> None:
    # Given a pinned statement and the same statement with one more action
    pinned = {
        "function:record": statement_lines(
            {"Sid": "Notify", "Action": "sns:Publish", "Resource": "t"}
        )
    }
    widened = {
        "function:record": statement_lines(
            {"Sid": "Notify", "Action": ["sns:Publish", "sns:Subscribe"], "Resource": "t"}
        )
    }
    # When they are compared, then the difference names the principal and both lines
    assert diff(pinned, widened) == [
        "function:record: - [Notify] Allow sns:Publish on t",
        "function:record: + [Notify] Allow sns:Publish,sns:Subscribe on t",
    ]
    # And the atomic form shows the one new permission
    atomic = statement_lines(
        {"Action": ["sns:Publish", "sns:Subscribe"], "Resource": ["t", "u"]}, atomic=True
    )
    assert atomic == [
        "Allow sns:Publish on t",
        "Allow sns:Publish on u",
        "Allow sns:Subscribe on t",
        "Allow sns:Subscribe on u",
    ]
