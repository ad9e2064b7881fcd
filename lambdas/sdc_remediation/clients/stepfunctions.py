"""Step Functions reads: an execution's status (the sweeper), recent executions (the canary).

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


def started_since(state_machine_arn: str, started: datetime, *, newest: int = 50) -> bool:
    """Whether one of the state machine's ``newest`` executions started at or after
    ``started``."""
    with aws.aws_errors("states:ListExecutions"):
        page = aws.client("stepfunctions").list_executions(
            stateMachineArn=state_machine_arn, maxResults=newest
        )
    return any(e["startDate"] >= started for e in page.get("executions", []))


__all__ = ["MISSING", "execution_status", "started_since"]
