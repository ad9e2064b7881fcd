"""The sweeper's schedule: every SWEEP_RATE, close remediations whose execution ended, watch
the SDC alarms' series for a flood of made-up JobNames, start the backstop; and its settings."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from infra import nag
from sdc_contract.environment import ALARM_PERIOD, FLOOD_WATCH_FRACTION
from sdc_contract.metrics import ALARM_PERIOD_SECONDS


class SweeperSchedule(Construct):
    """An EventBridge Scheduler schedule invoking the sweeper function.

    The sweeper is the backstop of "every admitted remediation ends": whatever ended an
    execution without its last record (timeout, abort, a runtime error), its open remediation
    is closed as `abandoned` within one period. Each sweep also counts the SDC alarms' recently
    active job series (the flood watch: `FLOOD_WATCH_FRACTION`, set here on the function) and,
    when they are many, how many had data at once in one alarm period (`ALARM_PERIOD`).
    (A Scheduler schedule, not a second EventBridge rule: the stack's one rule is the alarms'
    route into the workflow.)
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.Function,
        rate: cdk.Duration,
        flood_watch_fraction: float,
        alarm_period_seconds: int = ALARM_PERIOD_SECONDS,
    ) -> None:
        super().__init__(scope, construct_id)
        # The flood watch tells the topic at this share of an SDC alarm's 500-series limit (and
        # of its 100 contributors in ALARM at once, counted per alarm period).
        function.add_environment(FLOOD_WATCH_FRACTION, repr(flood_watch_fraction))
        function.add_environment(ALARM_PERIOD, str(alarm_period_seconds))
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
            description="sdc-guard: the sweeper's schedule invokes the sweeper",
        )
        nag.acknowledge(
            self.role,
            nag.wildcard_resource_finding(self, f"{function.function_arn}:*"),
            "lambda:InvokeFunction on the sweeper and its versions/aliases (`:*`), as the "
            "Scheduler target grants; no other function",
        )
        self.schedule = scheduler.Schedule(
            self,
            "Schedule",
            description="sdc-guard: close remediations whose workflow execution ended",
            schedule=scheduler.ScheduleExpression.rate(rate),
            target=targets.LambdaInvoke(function, retry_attempts=2, role=self.role),
        )
