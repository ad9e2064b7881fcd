"""Customer managed keys for what the stack keeps at rest: the ledger's and the approvals'
tables (each its own key, each grant of a table granting its key) and the stack's log groups,
the agent's report group among them (one key, usable by CloudWatch Logs for those log groups
only), as the notification topic has
its own (infra/constructs/notifications.py).

A customer managed key, unlike the AWS managed ``aws/dynamodb`` key, is one whose policy and
rotation the account controls, whose use CloudTrail attributes to this stack, and which can be
disabled to make the data unreadable at once. Its default policy lets the account's IAM
policies grant it (the CDK default); each grant here names this key, exact actions, and the one
service through which the key may be used (``kms:ViaService``), so a function that may read a
table cannot call KMS with its key for anything else.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from infra.grants import allow

TABLE_READ_KEY_ACTIONS: tuple[str, ...] = ("kms:Decrypt", "kms:DescribeKey")
"""What DynamoDB needs of a reader of a table under a customer managed key."""
TABLE_WRITE_KEY_ACTIONS: tuple[str, ...] = (
    *TABLE_READ_KEY_ACTIONS,
    "kms:Encrypt",
    "kms:GenerateDataKey",
)
"""What DynamoDB needs of a writer (CDK's `grant_write_data` asks the same, with its
`kms:ReEncrypt*`/`kms:GenerateDataKey*` wildcards spelled as the actions DynamoDB calls)."""

# AWS's documented statement for a key that encrypts log groups ("Encrypt log data in
# CloudWatch Logs using AWS KMS", step 2): the actions CloudWatch Logs calls with it.
LOGS_SERVICE_ACTIONS: tuple[str, ...] = (
    "kms:Encrypt*",
    "kms:Decrypt*",
    "kms:ReEncrypt*",
    "kms:GenerateDataKey*",
    "kms:Describe*",
)


def table_key(scope: Construct, construct_id: str, *, description: str, retain: bool) -> kms.Key:
    """A rotating key for one table; kept on stack deletion when the table is (`retain`): a
    retained table whose key went with the stack could never be read again."""
    return kms.Key(
        scope,
        construct_id,
        description=description,
        enable_key_rotation=True,
        removal_policy=cdk.RemovalPolicy.RETAIN if retain else cdk.RemovalPolicy.DESTROY,
        pending_window=cdk.Duration.days(30 if retain else 7),
    )


def grant_table_key(
    grantee: iam.IGrantable, key: kms.IKey, *, sid: str, write: bool
) -> iam.PolicyStatement:
    """Use `key` through DynamoDB only (``kms:ViaService``), to read (`write` False) or to read
    and write the table it encrypts. One statement per Sid and level: a role given the same
    grant twice gets one statement (CDK drops the duplicate)."""
    stack = cdk.Stack.of(key)
    return allow(
        grantee,
        sid=sid,
        actions=TABLE_WRITE_KEY_ACTIONS if write else TABLE_READ_KEY_ACTIONS,
        resources=[key.key_arn],
        conditions={
            "StringEquals": {"kms:ViaService": f"dynamodb.{stack.region}.{stack.url_suffix}"}
        },
    )


class LogsKey(Construct):
    """The key of the stack's log groups (the functions', the state machine's, the agent's
    report group).

    Its policy lets CloudWatch Logs of this region use it, and only for a log group whose ARN
    (the ``aws:logs:arn`` encryption context CloudWatch Logs passes on every call) matches one
    of `log_group_names` (patterns: CloudFormation names a log group without a name
    ``<stack name>-<logical id>-<suffix>``). Nobody's IAM policy needs the key: CloudWatch Logs
    encrypts and decrypts with its own service principal, for writers and readers alike.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, log_group_names: Sequence[str]
    ) -> None:
        super().__init__(scope, construct_id)
        if not log_group_names:
            raise ValueError("LogsKey: log_group_names is empty; name the log groups it encrypts")
        stack = cdk.Stack.of(self)
        self.log_group_arns = [
            stack.format_arn(
                service="logs",
                resource="log-group",
                resource_name=name,
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            )
            for name in log_group_names
        ]
        self.key = kms.Key(
            self,
            "Key",
            description="sdc-guard log groups",
            enable_key_rotation=True,
            # Kept on stack deletion: the report group (/sdc/<cluster>) is retained with the
            # evidence of past alarms, and a retained group whose key went with the stack could
            # never be read again (as a retained table's key: `table_key`).
            removal_policy=cdk.RemovalPolicy.RETAIN,
            pending_window=cdk.Duration.days(30),
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchLogsForTheStacksLogGroups",
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.{stack.url_suffix}")],
                actions=list(LOGS_SERVICE_ACTIONS),
                resources=["*"],  # in a key policy "*" means this key
                conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": self.log_group_arns}},
            )
        )
