"""Human approval: the approvals table, the task that waits for a decision, and the managed
policy operators need to decide with `sdc-remediation approve|reject`.

The task token never leaves AWS: request_approval stores it in the approvals table under an
opaque approval id and notifies with that id only; the CLI reads the token back and calls
SendTaskSuccess with the caller's identity as approver (docs/CONTRACT.md).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

TTL_ATTRIBUTE = "expires_at"

# The keys of a Map item's state when RequestApproval runs (docs/CONTRACT.md "Workflow state").
# JSONPath Parameters cannot merge `$` with the token, so the keys are listed.
ITEM_KEYS_AT_APPROVAL: tuple[str, ...] = (
    "alarm",
    "suspect",
    "execution",
    "admission",
    "cordon",
    "health",
)


class Approvals(Construct):
    """Pending decisions keyed by `approval_id`, removed by TTL after the decision window."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(
                name="approval_id", type=dynamodb.AttributeType.STRING
            ),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TTL_ATTRIBUTE,
            # Task tokens of finished executions are worthless; nothing to keep.
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )


def request_approval_task(
    scope: Construct, function: lambda_.IFunction, *, timeout: cdk.Duration
) -> tasks.LambdaInvoke:
    """RequestApproval: invoke request_approval with the task token and wait for the decision.

    The task's output is what the CLI sends with SendTaskSuccess ({decision, release, approver,
    reason, approval_id}), stored at `$.approval`. After `timeout` the task fails with
    States.Timeout (the workflow records approval_timed_out and leaves the node cordoned).
    """
    payload = {key: sfn.JsonPath.object_at(f"$.{key}") for key in ITEM_KEYS_AT_APPROVAL}
    payload["task_token"] = sfn.JsonPath.task_token
    return tasks.LambdaInvoke(
        scope,
        "RequestApproval",
        lambda_function=function,
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        payload=sfn.TaskInput.from_object(payload),
        task_timeout=sfn.Timeout.duration(timeout),
        result_path="$.approval",
        retry_on_service_exceptions=False,  # the workflow's jittered retry covers them
        comment="Store the token under an approval id, notify, wait for `sdc-remediation approve|reject`",
    )


class OperatorPolicy(Construct):
    """Managed policy for the people who approve: attach it to their role or group.

    Covers `sdc-remediation pending|approve|reject|release` (through the approve function's
    AWS_IAM URL: the function records the authenticated caller and alone sends task results)
    and `history` (reads the ledger). It grants no Step Functions action and no access to the
    approvals table: an operator can neither read a task token nor resume the workflow without
    the function's deadline and single-use claim.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        approve_function: lambda_.IFunction,
        ledger: dynamodb.ITable,
    ) -> None:
        super().__init__(scope, construct_id)
        function_arns = [approve_function.function_arn]  # the URL is on the unqualified function
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="sdc-guard operators: list, approve or reject pending node replacements",
            statements=[
                iam.PolicyStatement(
                    sid="CallTheApproveFunctionUrl",
                    actions=["lambda:InvokeFunctionUrl"],
                    resources=function_arns,
                    conditions={"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}},
                ),
                iam.PolicyStatement(
                    # Function URLs created since October 2025 also need lambda:InvokeFunction;
                    # only through the URL, or an operator could invoke the function directly
                    # with an event naming any caller.
                    sid="InvokeOnlyThroughTheUrl",
                    actions=["lambda:InvokeFunction"],
                    resources=function_arns,
                    conditions={"Bool": {"lambda:InvokedViaFunctionUrl": "true"}},
                ),
                iam.PolicyStatement(
                    sid="ReadLedger",
                    # `history` without --node scans the (small) ledger.
                    actions=["dynamodb:GetItem", "dynamodb:Query", "dynamodb:Scan"],
                    resources=[ledger.table_arn],
                ),
            ],
        )
