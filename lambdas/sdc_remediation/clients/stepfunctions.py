"""Step Functions: an execution's status and the backstop's start (the sweeper), recent
executions (the canary).

SendTaskSuccess is the approvals table's (``dal.approvals``): its claim and its send are one
operation.
"""

from __future__ import annotations

from datetime import datetime

import botocore.exceptions

from .. import aws

MISSING = "DOES_NOT_EXIST"
"""The status of an execution Step Functions does not know (any more)."""


def execution_status(execution: str) -> str:
    """DescribeExecution's status (RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, ...), or
    ``MISSING`` when Step Functions does not know the execution."""
    sfn = aws.client("stepfunctions")
    try:
        with aws.aws_errors("states:DescribeExecution"):
            return str(sfn.describe_execution(executionArn=execution)["status"])
    except botocore.exceptions.ClientError as exc:
        if aws.error_code(exc) == "ExecutionDoesNotExist":
            return MISSING
        raise


def start_execution(state_machine_arn: str, name: str, payload: str) -> str:
    """Start an execution named ``name`` with input ``payload``; its ARN. A name already
    used is that execution (Step Functions answers a repeated StartExecution of a running one
    with it, and ``ExecutionAlreadyExists`` once it ended: names are unique for 90 days), so a
    retried start starts nothing twice."""
    sfn = aws.client("stepfunctions")
    try:
        with aws.aws_errors("states:StartExecution"):
            started = sfn.start_execution(
                stateMachineArn=state_machine_arn, name=name, input=payload
            )
    except botocore.exceptions.ClientError as exc:
        if aws.error_code(exc) != "ExecutionAlreadyExists":
            raise
        return f"{state_machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"
    return str(started["executionArn"])


def started_since(state_machine_arn: str, started: datetime, *, newest: int = 50) -> bool:
    """Whether one of the state machine's ``newest`` executions started at or after
    ``started``."""
    with aws.aws_errors("states:ListExecutions"):
        page = aws.client("stepfunctions").list_executions(
            stateMachineArn=state_machine_arn, maxResults=newest
        )
    return any(e["startDate"] >= started for e in page.get("executions", []))


__all__ = ["MISSING", "execution_status", "start_execution", "started_since"]
