"""The notification topic: encrypted SNS with the configured email subscriptions, and the grant
to publish on it."""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.grants import allow


class Notifications(Construct):
    """SNS topic for humans: cordons, approval requests, failures, alarms on the pipeline itself.

    Encrypted with a customer managed key because CloudWatch alarms (liveness, workflow
    failures, the rule's dead-letter queue) publish to it too, and the AWS managed `aws/sns` key
    cannot grant that to the CloudWatch service.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        emails: Sequence[str],
        alarm_name_prefix: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        # Only this account's alarms whose names carry the stack's prefix (every alarm the stack
        # makes: infra/constructs/alarms.py) may make CloudWatch publish here: the service
        # principal alone would let any account's alarm use the topic (confused deputy).
        from_our_alarms = {
            "StringEquals": {"aws:SourceAccount": stack.account},
            "ArnLike": {
                "aws:SourceArn": stack.format_arn(
                    service="cloudwatch",
                    resource="alarm",
                    resource_name=f"{alarm_name_prefix}-*",
                    arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                )
            },
        }
        self.key = kms.Key(
            self,
            "Key",
            description="sdc-guard notification topic",
            enable_key_rotation=True,
            # SNS keeps no messages at rest; nothing needs the key once the stack is gone.
            removal_policy=cdk.RemovalPolicy.DESTROY,
            pending_window=cdk.Duration.days(7),
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy "*" means this key
                conditions=from_our_alarms,
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            display_name="sdc-guard",
            master_key=self.key,
            enforce_ssl=True,
        )
        # enforce_ssl makes CDK emit an AWS::SNS::TopicPolicy that replaces the topic's default
        # policy and holds only the TLS Deny: without this statement the alarms on the pipeline
        # itself (workflow failed, undelivered events, liveness) could not publish. The
        # functions publish with their own roles (same account: their IAM policy is enough).
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions=from_our_alarms,
            )
        )
        for email in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))

    def grant_publish(self, grantee: iam.IGrantable) -> list[iam.PolicyStatement]:
        """Publish to the topic, and use its key for that: the two actions SNS needs of an
        encrypted topic's publisher, on this topic and this key only (CDK's
        `topic.grant_publish` would add `kms:GenerateDataKey*`)."""
        return [
            allow(
                grantee,
                sid="Notify",
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
            ),
            allow(
                grantee,
                sid="EncryptNotifications",
                actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=[self.key.key_arn],
            ),
        ]
