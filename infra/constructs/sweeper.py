"""The sweeper's schedule: every SWEEP_RATE, close remediations whose execution ended."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from constructs import Construct


class SweeperSchedule(Construct):
    """An EventBridge schedule invoking the sweeper function.

    The sweeper is the backstop of "every admitted remediation ends": whatever ended an
    execution without its last record (timeout, abort, a runtime error), its open remediation
    is closed as `abandoned` within one period.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.IFunction,
        rate: cdk.Duration,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = events.Rule(
            self,
            "Rule",
            description="sdc-guard: close remediations whose workflow execution ended",
            schedule=events.Schedule.rate(rate),
        )
        self.rule.add_target(targets.LambdaFunction(function, retry_attempts=2))
