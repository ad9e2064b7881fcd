"""The Lambda functions: one base construct with the shared defaults, the nine steps of
docs/CONTRACT.md and the functions outside the workflow.

Every function gets its own role (no AWS managed policies), its own log group (retention set,
write access only to it), JSON logs, X-Ray tracing, the Powertools settings and the contract's
environment. Code is the `lambdas/` folder; dependencies come from one locally bundled layer.
This module builds functions only: what a function may do with another construct's resources
is granted by that construct (`ledger.grant_admit(fn)`, ...), wired by the stack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

import sdc_contract as contract
from infra import bundling, nag
from infra.config import LOG_RETENTION_DAYS, SdcConfig
from infra.grants import allow

RUNTIME = lambda_.Runtime.PYTHON_3_14  # the newest: cdk-nag L1 asks for it
ARCHITECTURE = lambda_.Architecture.ARM_64  # Graviton: cheaper per ms; every wheel we need exists
POWERTOOLS_SERVICE_NAME = contract.POWERTOOLS_SERVICE_NAME
POWERTOOLS_METRICS_NAMESPACE = contract.POWERTOOLS_METRICS_NAMESPACE

assert RUNTIME.name == f"python{bundling.PYTHON_VERSION}", "layer wheels must match the runtime"


@dataclass(frozen=True)
class StepSpec:
    """What differs between the step functions."""

    description: str
    timeout_seconds: int = 30
    memory_mb: int = 256
    kubernetes: bool = False
    """Talks to the EKS API: gets eks:DescribeCluster, an access entry, the VPC if configured."""
    reserved_concurrency: int | None = None


# docs/CONTRACT.md "Lambdas: layout": folder -> spec. The handler is `<folder>.handler.handler`.
STEPS: dict[str, StepSpec] = {
    "localize": StepSpec(
        "Map an SDC alarm to suspect nodes (per-node metrics, reports, Kubernetes, HyperPod)",
        timeout_seconds=120,
        memory_mb=512,
        kubernetes=True,
    ),
    "admit": StepSpec(
        # No reserved concurrency: the guard's DynamoDB transaction (conditioned on the guard
        # item's version) already serialises concurrent admissions; a limit of one only turned
        # a storm into throttling and a failure per node.
        "Dedupe per node and apply the blast-radius guard before any cordon",
    ),
    "cordon": StepSpec("Cordon and label the suspect node", kubernetes=True),
    "uncordon": StepSpec("Uncordon a node an approver released", kubernetes=True),
    "start_health_check": StepSpec(
        # Reads a shadowed (not cordoned) node's deep-health-check label before its check.
        "Start a HyperPod deep health check on the suspect",
        kubernetes=True,
    ),
    "poll_health_check": StepSpec(
        "Poll the deep health check (HyperPod and the node label)", kubernetes=True
    ),
    "screen": StepSpec(
        # Creates, polls and deletes the node screen's Job on the cordoned node (its own group:
        # Jobs and pods in the screening namespace, nodes read).
        "Screen the cordoned node's GPUs with a Kubernetes Job and read its verdict",
        kubernetes=True,
    ),
    "request_approval": StepSpec("Store the task token under an approval id and notify"),
    "replace": StepSpec("Replace the node (BatchReplaceClusterNodes or the health label)"),
    "record": StepSpec("Record a transition in the ledger, emit a metric, notify"),
}


# Functions outside the workflow (same defaults, their own roles): folder -> spec.
SERVICES: dict[str, StepSpec] = {
    "approve": StepSpec(
        # Reads a node before releasing it from the guard: only an uncordoned node is released.
        "Decide approvals and release nodes as the IAM caller its function URL authenticated",
        kubernetes=True,
    ),
    "sweeper": StepSpec(
        "Close remediations whose workflow execution ended; start it for reports none took up",
        timeout_seconds=120,
    ),
}

CANARY = StepSpec(
    "Start a canary run on the schedule; say where it stopped when the canary alarm fires",
    timeout_seconds=60,
)
"""The canary function (only when the canary is on: `canarySchedule`)."""

SCREEN_IDLE = StepSpec(
    # A run starts and collects Jobs, it never waits for a screen (a screen's deadline is longer
    # than Lambda's 15 minutes): two minutes cover listing a large cluster's nodes and pods.
    "Screen idle HyperPod nodes on a schedule; a reproduced screen raises the idle-screen alarm",
    timeout_seconds=120,
    kubernetes=True,
)
"""The idle screener (only where idle screening is on: `screenImage` and `screenIdleSchedule`;
infra/constructs/idle_screen.py)."""

SWEEP_RATE = cdk.Duration.minutes(15)
"""How often the sweeper looks for remediations whose execution ended without closing them."""


class StepFunction(Construct):
    """One step's Lambda with the project's defaults (its own role and log group)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        folder: str,
        spec: StepSpec,
        code: lambda_.Code,
        layer: lambda_.ILayerVersion,
        environment: Mapping[str, str],
        retention: logs.RetentionDays,
        logs_key: kms.IKey | None = None,
        vpc: ec2.IVpc | None = None,
        subnets: Sequence[ec2.ISubnet] = (),
        security_groups: Sequence[ec2.ISecurityGroup] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.folder = folder
        self.in_vpc = vpc is not None
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"sdc-guard {folder} step",
        )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention,
            encryption_key=logs_key,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.log_group.grant_write(self.role)
        # Active tracing (below) adds these two X-Ray actions to the role.
        nag.acknowledge(
            self.role,
            nag.ANY_RESOURCE,
            "X-Ray PutTraceSegments/PutTelemetryRecords (active tracing) have no resource-level permissions",
        )
        if vpc is not None:
            # What AWSLambdaVPCAccessExecutionRole grants, inline: the ENI calls have no
            # resource-level permissions for Describe*, and the others act on ENIs Lambda names.
            allow(
                self.role,
                sid="LambdaVpcNetworkInterfaces",
                actions=[
                    "ec2:CreateNetworkInterface",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeSubnets",
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                ],
                resources=["*"],
                wildcard_reason=(
                    "the Lambda VPC network-interface calls have no resource-level permissions for Describe*"
                ),
            )
        self.function = lambda_.Function(
            self,
            "Function",
            description=f"sdc-guard: {spec.description}",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            code=code,
            handler=f"{folder}.handler.handler",
            layers=[layer],
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            tracing=lambda_.Tracing.ACTIVE,
            timeout=cdk.Duration.seconds(spec.timeout_seconds),
            memory_size=spec.memory_mb,
            reserved_concurrent_executions=spec.reserved_concurrency,
            environment=dict(environment),
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=list(subnets)) if vpc is not None else None,
            security_groups=list(security_groups) if vpc is not None else None,
        )


class Functions(Construct):
    """The step functions (`self.steps[folder]`) and the others (`self.services[folder]`), each
    with its role, log group and environment; no grant on another construct's resources."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        ledger: dynamodb.ITable,
        approvals: dynamodb.ITable,
        topic: sns.ITopic,
        state_machine_arn: str,
        logs_key: kms.IKey | None = None,
    ) -> None:
        """`ledger`, `approvals`, `topic` and `state_machine_arn` are named in the environment
        (`environment`); nothing is granted on them here. `logs_key` encrypts every function's
        log group (its policy lets CloudWatch Logs use it: infra/constructs/encryption.py)."""
        super().__init__(scope, construct_id)
        self.layer = lambda_.LayerVersion(
            self,
            "Dependencies",
            code=bundling.dependencies_layer_code(ARCHITECTURE),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="sdc-guard Lambda dependencies (boto3 with HyperPod APIs, Powertools, kubernetes)",
        )
        code = bundling.handlers_code()
        environment = self.environment(
            config,
            ledger=ledger,
            approvals=approvals,
            topic=topic,
            state_machine_arn=state_machine_arn,
        )

        vpc, subnets, security_groups = self._network(config)
        retention = log_retention(config.log_retention_days)
        # The label replace mode patches the node through Kubernetes instead of the API.
        services = {
            **SERVICES,
            **({"canary": CANARY} if config.canary_enabled else {}),
            **({"screen_idle": SCREEN_IDLE} if config.idle_screen_enabled else {}),
        }
        self.kubernetes_steps = [
            folder
            for folder, spec in {**STEPS, **services}.items()
            if spec.kubernetes or (folder == "replace" and config.replace_mode == "label")
        ]
        """The functions that talk to the EKS API (in the VPC if configured; an access entry
        each)."""
        self.steps: dict[str, StepFunction] = {}
        """The workflow's step functions, by contract folder."""
        self.services: dict[str, StepFunction] = {}
        """The functions outside the workflow (SERVICES), by folder."""
        for folder, spec in {**STEPS, **services}.items():
            in_vpc = folder in self.kubernetes_steps and vpc is not None
            into = self.steps if folder in STEPS else self.services
            into[folder] = StepFunction(
                self,
                _pascal(folder),
                folder=folder,
                spec=spec,
                code=code,
                layer=self.layer,
                environment=environment,
                retention=retention,
                logs_key=logs_key,
                vpc=vpc if in_vpc else None,
                subnets=subnets if in_vpc else (),
                security_groups=security_groups if in_vpc else (),
            )

        # The screen function alone knows the screen's image, namespace and deadline.
        for name, value in screen_environment(config).items():
            self.steps["screen"].function.add_environment(name, value)
        # The auto-approval policy (request_approval) may require a reproduced screen.
        self.steps["request_approval"].function.add_environment(
            contract.AUTO_APPROVE_REQUIRES_SCREEN,
            "true" if config.auto_approve_requires_screen else "false",
        )

    def function(self, folder: str) -> lambda_.Function:
        """A step's or a service's function (a KeyError names an unknown or disabled folder)."""
        step = self.steps.get(folder) or self.services.get(folder)
        if step is None:
            raise KeyError(
                f"no function {folder!r}; have {sorted({**self.steps, **self.services})}"
            )
        return step.function

    @staticmethod
    def environment(
        config: SdcConfig,
        *,
        ledger: dynamodb.ITable,
        approvals: dynamodb.ITable,
        topic: sns.ITopic,
        state_machine_arn: str,
    ) -> dict[str, str]:
        """The environment docs/CONTRACT.md ("Lambdas: environment") promises every handler."""
        env = {
            contract.HYPERPOD_CLUSTER_NAME: config.hyperpod_cluster_name,
            contract.EKS_CLUSTER_NAME: config.eks_cluster_name,
            contract.METRIC_NAMESPACE: config.namespace,
            contract.REPORT_LOG_GROUP: config.report_log_group,
            contract.LOOKBACK_SECONDS: str(contract.DEFAULT_LOOKBACK_SECONDS),
            contract.LEDGER_TABLE: ledger.table_name,
            contract.APPROVALS_TABLE: approvals.table_name,
            contract.TOPIC_ARN: topic.topic_arn,
            contract.MAX_NODES_PER_HOUR: str(config.max_nodes_per_hour),
            contract.MAX_FRACTION: str(config.max_fraction),
            contract.HEALTH_CHECKS: ",".join(config.health_checks),
            contract.HEALTH_CHECK_TIMEOUT_SECONDS: str(config.health_check_timeout_seconds),
            contract.REPLACE_MODE: config.replace_mode,
            contract.APPROVAL_TTL_SECONDS: str(config.approval_ttl_seconds),
            contract.APPROVAL_TIMEOUT_SECONDS: str(config.approval_timeout_seconds),
            contract.DRY_RUN: "true" if config.dry_run else "false",
            contract.STATE_MACHINE_ARN: state_machine_arn,
            contract.CHECK_MODES: config.check_modes_json,
            contract.AUTO_APPROVE: config.auto_approve.as_json(),
            contract.TRAINING_NAMESPACE: config.training_namespace,
            contract.JOB_LABEL: config.job_label,
            contract.REPORT_STREAMS: config.report_streams,
            contract.SHADOW_HEALTH_CHECK: "true" if config.shadow_health_check else "false",
        }
        return {
            **env,
            "POWERTOOLS_SERVICE_NAME": POWERTOOLS_SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": POWERTOOLS_METRICS_NAMESPACE,
            "LOG_LEVEL": "INFO",
            # localize accepts alarm events only from this stack's account and alarms
            # (infra/constructs/alarms.py names them "<resource prefix>-<metric>").
            contract.ALARM_ACCOUNT_ID: cdk.Aws.ACCOUNT_ID,
            contract.ALARM_NAME_PREFIX: f"{config.resource_prefix}-",
        }

    def _network(
        self, config: SdcConfig
    ) -> tuple[ec2.IVpc | None, list[ec2.ISubnet], list[ec2.ISecurityGroup]]:
        """The VPC placement for private EKS endpoints, from ids only (no lookup at synth)."""
        if config.vpc_id is None:
            return None, [], []
        vpc = ec2.Vpc.from_vpc_attributes(
            self, "Vpc", vpc_id=config.vpc_id, availability_zones=cdk.Fn.get_azs()
        )
        subnets = [
            ec2.Subnet.from_subnet_id(self, f"Subnet{i}", subnet_id)
            for i, subnet_id in enumerate(config.subnet_ids)
        ]
        groups: list[ec2.ISecurityGroup] = [
            ec2.SecurityGroup.from_security_group_id(self, f"SecurityGroup{i}", group_id)
            for i, group_id in enumerate(config.security_group_ids)
        ]
        if not groups:
            # Outbound only: HTTPS to the EKS endpoint and the AWS APIs; nothing calls in.
            groups = [
                ec2.SecurityGroup(
                    self,
                    "SecurityGroup",
                    vpc=vpc,
                    description="sdc-guard functions calling the EKS API",
                    allow_all_outbound=True,
                )
            ]
        return vpc, subnets, groups


def screen_environment(config: SdcConfig) -> dict[str, str]:
    """What the screen function reads besides the common environment (an empty SCREEN_IMAGE:
    the screen is not configured, and the step records so)."""
    return {
        contract.SCREEN_IMAGE: config.screen_image or "",
        contract.SCREEN_NAMESPACE: config.screen_namespace,
        contract.SCREEN_DEADLINE_SECONDS: str(config.screen_deadline_seconds),
    }


def _pascal(folder: str) -> str:
    return "".join(part.capitalize() for part in folder.split("_"))


def log_retention(days: int) -> logs.RetentionDays:
    """The RetentionDays member for a day count config already checked against the allowed set."""
    return logs.RetentionDays[RETENTION_NAMES[LOG_RETENTION_DAYS.index(days)]]


# CloudWatch Logs' allowed retentions, in the order of logs.RetentionDays' members.
RETENTION_NAMES: tuple[str, ...] = (
    "ONE_DAY", "THREE_DAYS", "FIVE_DAYS", "ONE_WEEK", "TWO_WEEKS", "ONE_MONTH", "TWO_MONTHS",
    "THREE_MONTHS", "FOUR_MONTHS", "FIVE_MONTHS", "SIX_MONTHS", "ONE_YEAR", "THIRTEEN_MONTHS",
    "EIGHTEEN_MONTHS", "TWO_YEARS", "THREE_YEARS", "FIVE_YEARS", "SIX_YEARS", "SEVEN_YEARS",
    "EIGHT_YEARS", "NINE_YEARS", "TEN_YEARS",
)  # fmt: skip
