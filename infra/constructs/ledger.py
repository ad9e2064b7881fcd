"""The remediation ledger: one DynamoDB table keyed by instance id (docs/CONTRACT.md), and every
grant on it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

import sdc_contract as contract
from infra.constructs.encryption import grant_table_key, table_key
from infra.grants import allow

# TransactWriteItems (the guard's transaction) is authorized per item as PutItem/UpdateItem/
# ConditionCheckItem, so it needs no action of its own.
READ_WRITE: tuple[str, ...] = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
    "dynamodb:ConditionCheckItem",
)
READ: tuple[str, ...] = ("dynamodb:GetItem", "dynamodb:Query")
WRITES = frozenset({"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"})
"""A grant with one of these uses the table's key to write (`grant_table_key`)."""
TTL_ATTRIBUTE = "expires_at"


class Ledger(Construct):
    """Every node's current remediation (`sk="STATE"`) and each transition (`sk="EVENT#..."`);
    the canary's runs under `pk="CANARY#<cluster>"`.

    Retained on stack deletion: it is the repeat-offender history of the fleet's GPUs. No
    secondary index: the guard counts from its own item (an index is eventually consistent), and
    the sweeper and `history` scan the small table.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str) -> None:
        super().__init__(scope, construct_id)
        self.cluster_name = cluster_name
        # Retained with the table: the history outlives the stack, and so must its key.
        self.key = table_key(self, "Key", description="sdc-guard remediation ledger", retain=True)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=self.key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Only what is meant to go away carries it: canary runs, alarm-episode notices.
            # The remediations and their events (the repeat-offender history) never do.
            time_to_live_attribute=TTL_ATTRIBUTE,
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )

    # ---- the remediation items -----------------------------------------------------------------
    def grant_admit(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Dedupe per node and run the blast-radius guard's transaction (admit)."""
        return self._allow(grantee, "Ledger", READ_WRITE)

    def grant_record(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Record transitions and close remediations, and give a report back when its
        remediation failed before anyone decided (record)."""
        return self._allow(grantee, "Ledger", (*READ_WRITE, "dynamodb:DeleteItem"))

    def grant_release(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Release a node from the guard on an approver's decision (approve)."""
        return self._allow(grantee, "ReleaseNodes", READ_WRITE)

    def grant_sweep(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Find open remediations (a scan of the small table) and close them (the sweeper)."""
        return self._allow(grantee, "Ledger", (*READ_WRITE, "dynamodb:Scan"))

    def grant_read(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read one node's remediation and its events (request_approval's evidence)."""
        return self._allow(grantee, "ReadLedger", READ)

    def grant_read_outcomes(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Scan every check's outcomes (the precision auto-approval decides on)."""
        return self._allow(grantee, "ReadOutcomes", ("dynamodb:Scan",))

    def grant_history(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """`sdc-remediation history` (operators): without --node it scans the small table."""
        return self._allow(grantee, "ReadLedger", (*READ, "dynamodb:Scan"))

    # ---- the canary's items only ---------------------------------------------------------------
    def grant_canary_runs(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Start, read and list canary runs: the `CANARY#<cluster>` items only, never a node's
        STATE or the guard (the canary function)."""
        return self._allow(
            grantee,
            "CanaryRuns",
            ("dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"),
            only_partition=contract.canary_runs_key(self.cluster_name),
        )

    def grant_canary_progress(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Write a canary run's progress: the `CANARY#<cluster>` items only (the steps a canary
        passes)."""
        return self._allow(
            grantee,
            "CanaryProgress",
            ("dynamodb:GetItem", "dynamodb:UpdateItem"),
            only_partition=contract.canary_runs_key(self.cluster_name),
        )

    # ---- the node screens' items only ----------------------------------------------------------
    def grant_screens(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read and write the node screens: the `SCREEN#<cluster>` items only (one per node,
        its last screen and any running one), never a node's STATE or the guard (the idle
        screener; a reproduced screen reaches the guard through its alarm, as a job's does)."""
        return self._allow(
            grantee,
            "NodeScreens",
            ("dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"),
            only_partition=contract.screens_key(self.cluster_name),
        )

    def _allow(
        self,
        grantee: iam.IGrantable,
        sid: str,
        actions: tuple[str, ...],
        *,
        only_partition: str | None = None,
    ) -> iam.PolicyStatement:
        """`actions` on the table (and its key); with `only_partition`, on that partition
        key's items only (DynamoDB's LeadingKeys condition)."""
        partition_items = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [only_partition]}}
        # Every grant on the table grants its key, to read or to write as the grant does.
        write = bool(WRITES.intersection(actions))
        grant_table_key(
            grantee, self.key, sid="WriteLedgerKey" if write else "ReadLedgerKey", write=write
        )
        return allow(
            grantee,
            sid=sid,
            actions=actions,
            resources=[self.table.table_arn],
            conditions=partition_items if only_partition is not None else None,
        )
