"""The EventBridge rule that turns one job's contributor of an SDC alarm entering ALARM into a
workflow execution."""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra import nag
from sdc_contract.metrics import CONTRIBUTOR_EVENT

DETAIL_TYPE = CONTRIBUTOR_EVENT
"""The SDC alarms are Metrics Insights alarms with a contributor per job: the workflow starts on
a contributor's state change (the alarm-level change says only how many contributors are in
ALARM, and stays in ALARM while any is)."""


class AlarmRule(Construct):
    """Matches exactly `alarms`' contributors entering ALARM; the event is the workflow's input.

    Events that cannot be delivered (throttling, a deleted state machine) go to an encrypted
    dead-letter queue after EventBridge's retries, instead of being lost.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        alarms: Sequence[cloudwatch.IAlarm],
        state_machine: sfn.IStateMachine,
    ) -> None:
        super().__init__(scope, construct_id)
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=cdk.Duration.days(14),
        )
        nag.acknowledge(
            self.dead_letter_queue,
            "AwsSolutions-SQS3",
            "This queue is the EventBridge target's dead-letter queue; a DLQ of a DLQ would only move "
            "the problem. Its depth has an alarm that notifies (PipelineAlarms).",
        )
        self.rule = events.Rule(
            self,
            "Rule",
            description="sdc-guard: an SDC alarm's job contributor in ALARM -> remediation workflow",
            event_pattern=events.EventPattern(
                source=["aws.cloudwatch"],
                detail_type=[DETAIL_TYPE],
                resources=[alarm.alarm_arn for alarm in alarms],
                detail={"state": {"value": ["ALARM"]}},
            ),
        )
        self.rule.add_target(
            targets.SfnStateMachine(
                state_machine,
                dead_letter_queue=self.dead_letter_queue,
                retry_attempts=10,
                # An alarm older than this describes a job that has moved on; better to land in
                # the DLQ (and alarm) than to cordon on stale evidence.
                max_event_age=cdk.Duration.hours(1),
            )
        )
