"""The remediation ledger: one DynamoDB table keyed by instance id (docs/CONTRACT.md)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct


class Ledger(Construct):
    """Every node's current remediation (`sk="STATE"`) and each transition (`sk="EVENT#..."`).

    Retained on stack deletion: it is the repeat-offender history of the fleet's GPUs. No
    secondary index: the guard counts from its own item (an index is eventually consistent), and
    the sweeper and `history` scan the small table.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
