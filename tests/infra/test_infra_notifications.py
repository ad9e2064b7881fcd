"""The notification topic in AWS: the alarms on the pipeline itself can publish to it (topic
policy and key policy), and only this account's alarms of this stack can."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.infra_template import as_list, flatten, resources

pytestmark = pytest.mark.slow


def _statement(statements: list[dict[str, Any]], sid: str) -> dict[str, Any]:
    (found,) = [s for s in statements if s.get("Sid") == sid]
    return found


def _alarm_conditions(statement: dict[str, Any]) -> tuple[str, str]:
    conditions = statement["Condition"]
    return (
        flatten(conditions["StringEquals"]["aws:SourceAccount"]),
        flatten(conditions["ArnLike"]["aws:SourceArn"]),
    )


def test_cloudwatch_alarms_may_publish_to_the_topic_despite_the_tls_only_policy(
    default_synth: Any,
) -> None:
    # Given the stack as shipped: enforce_ssl makes the topic policy replace SNS's default one
    (policy,) = resources(default_synth.template, "AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (topic_id,) = resources(default_synth.template, "AWS::SNS::Topic")
    # Then next to the TLS Deny, CloudWatch may publish to this topic
    allow = _statement(statements, "AllowCloudWatchAlarmsToPublish")
    assert allow["Effect"] == "Allow"
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert as_list(allow["Action"]) == ["sns:Publish"]
    assert as_list(allow["Resource"]) == [{"Ref": topic_id}]
    # And only for this account's alarms named with the stack's prefix (no confused deputy)
    account, source = _alarm_conditions(allow)
    assert account == "<AWS::AccountId>"
    assert source == (
        "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:sdc-guard-"
        "example-hyperpod-cluster-*"
    )
    assert any(s["Effect"] == "Deny" for s in statements)  # TLS is still enforced


def test_cloudwatch_may_use_the_topic_key_only_for_this_stacks_alarms(default_synth: Any) -> None:
    # Given the topic's customer managed key (the tables and log groups have their own)
    (topic,) = resources(default_synth.template, "AWS::SNS::Topic").values()
    key = resources(default_synth.template, "AWS::KMS::Key")[
        topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    ]
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    # Then CloudWatch may encrypt for the topic, under the same conditions as the topic policy
    allow = _statement(statements, "AllowCloudWatchAlarmsToPublish")
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert sorted(as_list(allow["Action"])) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    account, source = _alarm_conditions(allow)
    assert account == "<AWS::AccountId>"
    assert source.endswith(":alarm:sdc-guard-example-hyperpod-cluster-*")


def test_every_alarm_that_notifies_the_topic_is_covered_by_the_policy(variant_synth: Any) -> None:
    # Given every alarm whose action is the topic (liveness on, in the variant)
    (topic_id,) = resources(variant_synth.template, "AWS::SNS::Topic")
    notifying = [
        a["Properties"]["AlarmName"]
        for a in resources(variant_synth.template, "AWS::CloudWatch::Alarm").values()
        if {"Ref": topic_id} in a["Properties"].get("AlarmActions", [])
    ]
    (policy,) = resources(variant_synth.template, "AWS::SNS::TopicPolicy").values()
    allow = _statement(
        policy["Properties"]["PolicyDocument"]["Statement"], "AllowCloudWatchAlarmsToPublish"
    )
    prefix = _alarm_conditions(allow)[1].rsplit(":alarm:", 1)[1].rstrip("*")
    # Then each of them matches the policy's alarm ARN pattern
    assert len(notifying) >= 3
    assert all(name.startswith(prefix) for name in notifying), notifying
