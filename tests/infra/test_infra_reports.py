"""The agent's report group `/sdc/<cluster>` is the stack's (issue 33): created with a retention
(`reportRetentionDays`), under the stack's logs key, retained when the stack is deleted (and so
is the key); an existing group is adopted (`adoptReportLogGroup`); nobody may create it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.app import example_context
from infra.config import ConfigError, load_config
from tests.infra.infra_synth import Synth, synthesize
from tests.infra.infra_template import as_list, flatten, matches, resources

GROUP_ARN = "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{name}"


def test_report_retention_defaults_to_400_days_and_the_group_is_created() -> None:
    # Given the shipped context / When it is loaded
    config = load_config(example_context(), {})
    # Then the reports are kept 400 days (a year for an audit, plus a month to run it)
    assert config.report_retention_days == 400
    # And the stack creates the group (nothing adopted)
    assert config.adopt_report_log_group is False


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("reportRetentionDays", 10, "CloudWatch Logs accepts"),
        ("reportRetentionDays", 14, "at least 30"),
        ("reportRetentionDays", "a year", "expected an integer"),
        ("adoptReportLogGroup", "maybe", "expected true or false"),
    ],
)
def test_bad_report_group_settings_are_refused_naming_the_key(
    key: str, value: object, message: str
) -> None:
    # Given one bad value / When loaded / Then the one-line error names the key and the problem
    with pytest.raises(
        ConfigError, match=rf"^context key '{key}' \(SDC_\w+\): .*{re.escape(message)}"
    ):
        load_config({**example_context(), key: value}, {})


def test_report_retention_is_read_from_the_environment_too() -> None:
    # Given the override variable / When loaded / Then it wins over cdk.json
    config = load_config(example_context(), {"SDC_REPORT_RETENTION_DAYS": "731"})
    assert config.report_retention_days == 731


def _report_group(synth: Synth, name: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (logical_id, group)
        for logical_id, group in resources(synth.template, "AWS::Logs::LogGroup").items()
        if group["Properties"].get("LogGroupName") == name
    ]
    return found


def _logs_key_patterns(template: dict[str, Any], key_id: str) -> list[str]:
    key = resources(template, "AWS::KMS::Key")[key_id]["Properties"]
    (statement,) = [s for s in key["KeyPolicy"]["Statement"] if "Service" in s.get("Principal", {})]
    condition = statement["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    return [flatten(p) for p in as_list(condition)]


def _actions(template: dict[str, Any]) -> set[str]:
    """Every action any role or managed policy of the stack is allowed."""
    out: set[str] = set()
    for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for policy in resources(template, kind).values():
            for s in policy["Properties"]["PolicyDocument"]["Statement"]:
                if s.get("Effect", "Allow") == "Allow":
                    out.update(as_list(s["Action"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("which", "name"),
    [("default_synth", "/sdc/example-hyperpod-cluster"), ("variant_synth", "/sdc/ml-prod")],
)
def test_the_stack_creates_the_report_group_with_retention_key_and_retain(
    which: str, name: str, request: pytest.FixtureRequest
) -> None:
    # Given a synthesized stack
    synth: Synth = request.getfixturevalue(which)
    template = synth.template
    # When its report group is read
    _, group = _report_group(synth, name)
    # Then it has the configured retention
    assert group["Properties"]["RetentionInDays"] == 400
    # And it survives deleting the stack (and a replacement)
    assert group["DeletionPolicy"] == "Retain"
    assert group["UpdateReplacePolicy"] == "Retain"
    # And it is encrypted under the logs key, whose policy lets CloudWatch Logs use it for this
    # group, and which is retained too: a retained group whose key went could not be read
    key_id, attribute = group["Properties"]["KmsKeyId"]["Fn::GetAtt"]
    assert attribute == "Arn"
    key = resources(template, "AWS::KMS::Key")[key_id]
    assert key["DeletionPolicy"] == "Retain"
    assert key["Properties"]["EnableKeyRotation"] is True
    arn = GROUP_ARN.format(name=name)
    assert any(matches(p, arn) for p in _logs_key_patterns(template, key_id))
    # And the key's ARN is an output (what an adopted group is associated with)
    assert template["Outputs"]["LogsKeyArn"]["Value"] == {"Fn::GetAtt": [key_id, "Arn"]}
    # And no principal may create a log group: the group is the stack's alone
    assert not {a for a in _actions(template) if a in ("logs:CreateLogGroup", "logs:*")}
    assert synth.nag_error is None


@pytest.fixture(scope="module")
def adopt_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The stack adopting an existing report group, with a longer retention."""
    return synthesize(
        tmp_path_factory, "adopt", {"adoptReportLogGroup": True, "reportRetentionDays": 731}
    )


@pytest.mark.slow
def test_an_adopted_report_group_is_not_created_but_its_key_and_grants_stay(
    adopt_synth: Synth, default_synth: Synth
) -> None:
    # Given the stack adopting /sdc/<cluster> (an agent of an earlier release created it)
    template = adopt_synth.template
    name = "/sdc/example-hyperpod-cluster"
    # Then CloudFormation creates no group of that name (it would fail on the existing one)
    named = [
        g["Properties"].get("LogGroupName")
        for g in resources(template, "AWS::Logs::LogGroup").values()
    ]
    assert name not in named
    # And the logs key may still be used by CloudWatch Logs for it (associate-kms-key)
    (key_id,) = {
        g["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]
        for g in resources(template, "AWS::Logs::LogGroup").values()
    }
    assert any(
        matches(p, GROUP_ARN.format(name=name)) for p in _logs_key_patterns(template, key_id)
    )
    assert "LogsKeyArn" in template["Outputs"]

    # And every grant on the group is the same as when the stack creates it
    def report_statements(t: dict[str, Any]) -> list[str]:
        return sorted(
            flatten(s)
            for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
            for p in resources(t, kind).values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if ":log-group:/sdc/" in flatten(s.get("Resource", ""))
        )

    assert report_statements(template) == report_statements(default_synth.template)
    assert adopt_synth.nag_error is None
