"""Each gap the CloudFormation patches fill, shown on a small template through CloudFormation's
API (no CDK CLI): the change-set path the CLI takes, and the models moto lacks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import botocore.exceptions
import moto
import pytest

from tests.e2e.harness import moto_cloudformation
from tests.e2e.harness.deployment import EmbeddedAws


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws() as embedded:
        yield embedded


def deploy_by_change_set(
    aws: EmbeddedAws, stack: str, template: dict[str, Any], kind: str = "CREATE", **extra: Any
) -> None:
    """What the CDK CLI does: CreateChangeSet, then ExecuteChangeSet."""
    cfn = aws.client("cloudformation")
    cfn.create_change_set(
        StackName=stack,
        ChangeSetName=f"cs-{kind.lower()}",
        TemplateBody=json.dumps(template),
        ChangeSetType=kind,
        **extra,
    )
    cfn.execute_change_set(StackName=stack, ChangeSetName=f"cs-{kind.lower()}")


ALARM_AND_OUTPUT = {
    "Resources": {
        "Alarm": {
            "Type": "AWS::CloudWatch::Alarm",
            "Properties": {
                "AlarmName": "sdc-test-alarm",
                "Namespace": "SDC",
                "MetricName": "sdc_replay_mismatch",
                "Dimensions": [{"Name": "ClusterName", "Value": "c"}],
                "Statistic": "Maximum",
                "Period": 10,
                "EvaluationPeriods": 1,
                "DatapointsToAlarm": 1,
                "Threshold": 1,
                "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                "TreatMissingData": "notBreaching",
            },
        }
    },
    "Outputs": {"AlarmArn": {"Value": {"Fn::GetAtt": ["Alarm", "Arn"]}}},
}


def test_a_stack_created_by_change_set_has_its_alarm_and_outputs(aws):
    # Given a template with an alarm and an output on the alarm's ARN
    # When it is deployed the way the CDK CLI deploys (a change set)
    deploy_by_change_set(aws, "alarm-stack", ALARM_AND_OUTPUT)
    # Then the alarm exists as synthesized and the output resolves to its ARN
    (alarm,) = aws.client("cloudwatch").describe_alarms(AlarmNames=["sdc-test-alarm"])[
        "MetricAlarms"
    ]
    assert (alarm["Threshold"], alarm["Period"], alarm["Dimensions"]) == (
        1.0,
        10,
        [{"Name": "ClusterName", "Value": "c"}],
    )
    (stack,) = aws.client("cloudformation").describe_stacks(StackName="alarm-stack")["Stacks"]
    assert stack["Outputs"][0]["OutputValue"] == alarm["AlarmArn"]


def test_unknown_change_sets_answer_change_set_not_found(aws):
    # Given no change set named "nope"
    cfn = aws.client("cloudformation")
    for operation in (cfn.describe_change_set, cfn.delete_change_set):
        # When the CLI describes or deletes it
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            operation(StackName="alarm-stack", ChangeSetName="nope")
        # Then it gets ChangeSetNotFound (404), which the CLI waits for, not a 500
        assert caught.value.response["Error"]["Code"] == "ChangeSetNotFound"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_an_update_reusing_an_ssm_parameter_keeps_its_name(aws):
    # Given a stack whose parameter is an SSM parameter name (CDK's BootstrapVersion)
    aws.client("ssm").put_parameter(Name="/cdk-bootstrap/test/version", Value="30", Type="String")
    template = {
        "Parameters": {
            "BootstrapVersion": {
                "Type": "AWS::SSM::Parameter::Value<String>",
                "Default": "/cdk-bootstrap/test/version",
            }
        },
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"Version": {"Value": {"Ref": "BootstrapVersion"}}},
    }
    deploy_by_change_set(aws, "ssm-stack", template)
    # When an update passes UsePreviousValue for it, as the CLI does
    template["Resources"]["Other"] = {"Type": "AWS::SNS::Topic"}
    deploy_by_change_set(
        aws,
        "ssm-stack",
        template,
        kind="UPDATE",
        Parameters=[{"ParameterKey": "BootstrapVersion", "UsePreviousValue": True}],
    )
    # Then the update completes with the parameter still read from SSM
    (stack,) = aws.client("cloudformation").describe_stacks(StackName="ssm-stack")["Stacks"]
    assert stack["StackStatus"] == "UPDATE_COMPLETE"
    assert stack["Outputs"][0]["OutputValue"] == "30"


def test_the_pinned_moto_is_required(monkeypatch):
    # Given another moto version than the one the patches were written against
    monkeypatch.setattr(moto, "__version__", "9.9.9")
    # When the patches are checked, Then a clear error names both versions and the pin
    with pytest.raises(RuntimeError, match=r"moto 5\.2\.5.*requirements-dev\.txt.*9\.9\.9"):
        moto_cloudformation._require_pinned_moto()
