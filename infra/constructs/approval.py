"""Human approval: the approvals table, the task that waits for a decision, the approve
function's URL, and the managed policy operators need to decide with
`sdc-remediation approve|reject`; every grant on the table and on the URL.

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

import sdc_contract as contract
from infra.constructs.encryption import grant_table_key, table_key
from infra.grants import allow

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
    "screen",
)


class Approvals(Construct):
    """Pending decisions keyed by `approval_id`, removed by TTL after the decision window."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        # The table holds task tokens: its own key, granted only with a grant on the table.
        self.key = table_key(self, "Key", description="sdc-guard approvals", retain=False)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(
                name="approval_id", type=dynamodb.AttributeType.STRING
            ),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=self.key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TTL_ATTRIBUTE,
            # Task tokens of finished executions are worthless; nothing to keep.
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

    def grant_request(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Store a task token under a new approval id and read it back, and withdraw it when
        its announcement could not be sent (request_approval)."""
        grant_table_key(grantee, self.key, sid="WriteApprovalsKey", write=True)
        return allow(
            grantee,
            sid="Approvals",
            actions=[
                "dynamodb:PutItem",
                "dynamodb:GetItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
            ],
            resources=[self.table.table_arn],
        )

    def grant_decide(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read a token, claim its approval once, list the pending ones (approve alone: the
        only role that may read task tokens)."""
        grant_table_key(grantee, self.key, sid="WriteApprovalsKey", write=True)
        return allow(
            grantee,
            sid="DecideApprovals",
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Scan"],
            resources=[self.table.table_arn],
        )

    def grant_read_decision(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read an approval's decision, never its task token (replace verifies the decision it
        was sent against the table): GetItem of the contract's decision attributes only, by a
        ProjectionExpression (``dynamodb:Attributes``, ``dynamodb:Select``)."""
        grant_table_key(grantee, self.key, sid="ReadApprovalsKey", write=False)
        return allow(
            grantee,
            sid="ReadApprovalDecision",
            actions=["dynamodb:GetItem"],
            resources=[self.table.table_arn],
            conditions={
                "ForAllValues:StringEquals": {
                    "dynamodb:Attributes": list(contract.names.APPROVAL_DECISION_ATTRIBUTES)
                },
                "StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"},
            },
        )


def request_approval_task(
    scope: Construct,
    function: lambda_.IFunction,
    *,
    timeout: cdk.Duration,
    name: str = "RequestApproval",
) -> tasks.LambdaInvoke:
    """RequestApproval: invoke request_approval with the task token and wait for the decision.

    The task's output is what the CLI sends with SendTaskSuccess ({decision, release, approver,
    reason, approval_id}), stored at `$.approval`. After `timeout` the task fails with
    States.Timeout (the workflow records approval_timed_out and leaves the node cordoned).
    """
    payload: dict[str, cdk.IResolvable | str] = {
        key: sfn.JsonPath.object_at(f"$.{key}") for key in ITEM_KEYS_AT_APPROVAL
    }
    payload["task_token"] = sfn.JsonPath.task_token
    return tasks.LambdaInvoke(
        scope,
        name,
        lambda_function=function,
        integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
        payload=sfn.TaskInput.from_object(payload),
        task_timeout=sfn.Timeout.duration(timeout),
        result_path="$.approval",
        retry_on_service_exceptions=False,  # the workflow's jittered retry covers them
        comment="Store the token under an approval id, notify, wait for `sdc-remediation approve|reject`",
    )


class ApprovalUrl(Construct):
    """The approve function's AWS_IAM function URL: the one way operators reach a decision.

    Lambda authenticates the SigV4 signature and hands the function the caller's ARN, which the
    function records as the approver. The URL is added to the function itself (so its logical id
    is the function's), and every grant to invoke the function is made here.
    """

    def __init__(self, scope: Construct, construct_id: str, *, function: lambda_.Function) -> None:
        super().__init__(scope, construct_id)
        self.function = function
        self.function_url = function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)

    @property
    def url(self) -> str:
        """The URL operators call (the stack's `ApprovalUrl` output, `SDC_APPROVAL_URL`)."""
        return self.function_url.url

    def grant_invoke_url(self, grantee: iam.IGrantable) -> list[iam.PolicyStatement]:
        """Call the URL, and invoke the function only through it (operators; request_approval
        for the canary). The only grants of the function there are: a direct invoke could carry
        an event naming any caller, and the function cannot tell it from a URL request."""
        function_arns = [self.function.function_arn]  # the URL is on the unqualified function
        url = allow(
            grantee,
            sid="CallTheApproveFunctionUrl",
            actions=["lambda:InvokeFunctionUrl"],
            resources=function_arns,
            conditions={"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}},
        )
        invoke = allow(
            # Function URLs created since October 2025 also need lambda:InvokeFunction; only
            # through the URL, or an operator could invoke the function directly with an event
            # naming any caller.
            grantee,
            sid="InvokeOnlyThroughTheUrl",
            actions=["lambda:InvokeFunction"],
            resources=function_arns,
            conditions={"Bool": {"lambda:InvokedViaFunctionUrl": "true"}},
        )
        return [url, invoke]

    def announce_url(self, function: lambda_.Function) -> None:
        """Give request_approval the URL (`APPROVAL_URL`): its messages name it in the command
        to approve, and the canary's approval is settled through it. The approve function is
        told request_approval's role (`APPROVAL_REQUESTER_ROLE`): calls signed with it may
        settle the canary's approval and nothing else (IAM cannot tell one action of the URL
        from another)."""
        function.add_environment(contract.APPROVAL_URL, self.url)
        if function.role is not None:
            self.function.add_environment(contract.APPROVAL_REQUESTER_ROLE, function.role.role_name)

    def grant_settle_canary(self, grantee: iam.IGrantable) -> list[iam.PolicyStatement]:
        """Call the URL to settle a canary's approval (request_approval, only when the canary
        is on), exactly as an operator calls it: through the URL only. The function settles
        canary approvals alone on that action, so approve stays the only role that sends task
        results unless autoApprove is on."""
        return self.grant_invoke_url(grantee)


class OperatorPolicy(Construct):
    """Managed policy for the people who approve: attach it to their role or group.

    The stack grants it `sdc-remediation pending|approve|reject|release` (through the approve
    function's AWS_IAM URL: the function records the authenticated caller and alone sends task
    results) and `history` (reads the ledger). It gets no Step Functions action and no access to
    the approvals table: an operator can neither read a task token nor resume the workflow
    without the function's deadline and single-use claim.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="sdc-guard operators: list, approve or reject pending node replacements",
        )
