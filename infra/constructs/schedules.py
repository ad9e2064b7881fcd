"""A function invoked on an EventBridge Scheduler schedule, with a role of its own that may
invoke that function only (the canary's and the idle screener's schedules)."""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from infra import nag


def invoke_on_schedule(
    scope: Construct,
    function: lambda_.IFunction,
    *,
    what: str,
    description: str,
    schedule: scheduler.ScheduleExpression,
    payload: dict[str, Any],
) -> tuple[iam.Role, scheduler.Schedule]:
    """The role (``ScheduleRole``) and the schedule (``Schedule``) in ``scope`` that invoke
    ``function`` (``what`` names it in the role's description and nag note) with ``payload``,
    retrying twice: each run is idempotent and the next comes within one period anyway."""
    role = iam.Role(
        scope,
        "ScheduleRole",
        assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
        description=f"sdc-guard: the {what}'s schedule invokes the {what}",
    )
    nag.acknowledge(
        role,
        nag.wildcard_resource_finding(scope, f"{function.function_arn}:*"),
        f"lambda:InvokeFunction on the {what} and its versions/aliases (`:*`), as the "
        "Scheduler target grants; no other function",
    )
    return role, scheduler.Schedule(
        scope,
        "Schedule",
        description=description,
        schedule=schedule,
        target=targets.LambdaInvoke(
            function,
            input=scheduler.ScheduleTargetInput.from_object(payload),
            retry_attempts=2,
            role=role,
        ),
    )


__all__ = ["invoke_on_schedule"]
