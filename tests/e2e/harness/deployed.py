"""The remediation chain on what CloudFormation created, not on the synthesized template.

After ``cdk deploy`` to an :class:`~.deployment.EmbeddedAws`, :class:`DeployedChain` drives the
deployed stack: the training job's alarm goes to the *deployed* CloudWatch alarms, the *deployed*
EventBridge rule's pattern and target decide which state machine starts, and that *deployed*
state machine (its definition as CloudFormation resolved it, its function ARNs) runs on moto's
executor. Each Lambda invoke runs the real handler named by the *deployed* function's Handler,
with the *deployed* function's environment (GetFunctionConfiguration), in this process.

Stood in, as in the template-built pipeline (tests/e2e/harness/pipeline.py): alarm evaluation
and EventBridge delivery (:class:`LocalAlarmEvaluator`; moto does neither), HyperPod's two
missing calls (:class:`HyperPodSimulator`), the Kubernetes API (KubeStandIn), whose endpoint
is the one value added to a function's environment, and the approve function's URL: the stack's
``AWS::Lambda::Url`` (output ``ApprovalUrl``, AWS_IAM auth) is served by :class:`ApprovalUrl` on a
loopback address, SigV4-checked, running the function that URL targets with its deployed handler
and environment. The operator CLI decides through it (``cli_env()``'s ``SDC_APPROVAL_URL``), so
the approver recorded is the principal the embedded STS authenticated.

The process environment is written once at start and restored at close, while no thread of the
chain runs (runtime.py says why). Running the handlers, and driving and reading the chain, is
shared with the template-built pipeline (:class:`~.runtime.LambdaRuntime`,
:class:`~.driver.Driver`); what is here is how the deployed stack is found and stood up.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from infra.app import STACK_ID
from infra.template import STEP_HANDLER_SUFFIX
from tests.e2e.harness.kube_jobs import JobsStandIn

from .account import Cluster, create_cluster, create_hyperpod_cluster
from .alarms import AlarmSpec, LocalAlarmEvaluator
from .deployment import (
    ACCOUNT,
    REGION,
    CdkCli,
    EmbeddedAws,
    rehearsal_context,
    stack_outputs,
    stack_resources,
)
from .driver import Driver
from .hyperpod import HyperPodSimulator
from .runtime import Function, process_environment, shared_runtime_env


class DeployedChain(Driver):
    """``with DeployedChain(aws, stack, cluster) as chain:`` — the deployed stack, driven."""

    closed_error = "DeployedChainClosed"

    def __init__(
        self, aws: EmbeddedAws, stack: str, cluster: Cluster, *, quiet_handlers: bool = False
    ) -> None:
        """Prepare; nothing starts before ``__enter__``. ``cluster`` must carry the names the
        stack was deployed for (hyperPodClusterName, eksClusterName). ``quiet_handlers`` keeps
        the handlers' logs and metrics off stdout (the demo's timeline)."""
        super().__init__(cluster, quiet_handlers=quiet_handlers)
        self.aws = aws
        self.endpoint = aws.endpoint
        self.stack = stack

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self.resources = stack_resources(self.aws, self.stack)
        self.functions = self._deployed_functions()
        shared = shared_runtime_env(
            {name: c["Environment"]["Variables"] for name, c in self.functions.items()},
            quiet=self.quiet_handlers,
        )
        self._exit.enter_context(process_environment({**self.aws.environment, **shared}))
        self.kube = self._exit.enter_context(JobsStandIn())
        self.hyperpod = HyperPodSimulator(self.kube, account_id=ACCOUNT, region=REGION).install()
        self._exit.callback(self.hyperpod.uninstall)
        # Served first: a function whose environment names the deployed URL calls the stand-in.
        self._start_function_url()
        self._start_runtime(
            {
                name: Function(
                    name=name,
                    arn=config["FunctionArn"],
                    handler=config["Handler"],
                    # The deployed environment, plus the stand-ins' endpoints.
                    environment=self._with_standins(config["Environment"]["Variables"]),
                )
                for name, config in self.functions.items()
            }
        )
        self._create_cluster()
        self.evaluator = self._deployed_evaluator()
        self._subscribe_deployed_inbox()
        self._close_on_exit()

    def _with_standins(self, variables: dict[str, str]) -> dict[str, str]:
        """A deployed environment with the stand-ins' endpoints: the Kubernetes API's, and the
        approval URL's in place of the deployed URL it names (checked to be that URL)."""
        env = {
            **variables,
            "K8S_API_ENDPOINT": self.kube.url,
            "K8S_API_CA_DATA": self.kube.ca_b64,
        }
        if "APPROVAL_URL" in env:
            if env["APPROVAL_URL"] != self.deployed_approval_url:
                raise ValueError(
                    f"a function's APPROVAL_URL is {env['APPROVAL_URL']!r}, not the stack's "
                    f"approval URL {self.deployed_approval_url!r}"
                )
            env["APPROVAL_URL"] = self.approval_url
        return env

    def client(self, service: str) -> Any:
        """A boto3 client for the embedded AWS the stack was deployed to."""
        return self.aws.client(service)

    @property
    def aws_environment(self) -> dict[str, str]:
        """The embedded AWS's endpoint and credentials."""
        return self.aws.environment

    def _deployed_functions(self) -> dict[str, dict[str, Any]]:
        """Function name -> its deployed configuration (GetFunctionConfiguration); the steps
        only, not the function CDK brings along for the cluster-ARN lookup."""
        lam = self.aws.client("lambda")
        configs = {
            r["physical_id"]: lam.get_function_configuration(FunctionName=r["physical_id"])
            for r in self.resources.values()
            if r["type"] == "AWS::Lambda::Function"
        }
        return {
            name: config
            for name, config in configs.items()
            if config["Handler"].endswith(STEP_HANDLER_SUFFIX)
        }

    def _create_cluster(self) -> None:
        create_cluster(self.aws.client, self.hyperpod, self.kube, self.cluster)

    def _deployed_evaluator(self) -> LocalAlarmEvaluator:
        """Evaluate the deployed alarms; deliver to the deployed rule's target."""
        events = self.aws.client("events")
        (rule_name,) = [
            r["physical_id"] for r in self.resources.values() if r["type"] == "AWS::Events::Rule"
        ]
        rule = events.describe_rule(Name=rule_name)
        (target,) = events.list_targets_by_rule(Rule=rule_name)["Targets"]
        self.state_machine_arn = target["Arn"]
        alarm_names = [
            r["physical_id"]
            for r in self.resources.values()
            if r["type"] == "AWS::CloudWatch::Alarm"
        ]
        cloudwatch = self.aws.client("cloudwatch")
        namespace = self.namespace
        specs = [
            AlarmSpec.from_properties(a)
            for a in cloudwatch.describe_alarms(AlarmNames=alarm_names)["MetricAlarms"]
            if AlarmSpec.is_evaluated(a, namespace)
        ]
        return LocalAlarmEvaluator(
            cloudwatch=cloudwatch,
            alarms=specs,
            rule_pattern=json.loads(rule["EventPattern"]),
            deliver=self.start_execution,
            account_id=ACCOUNT,
            region=REGION,
        )

    def _subscribe_deployed_inbox(self) -> None:
        """The deployed tables, and an inbox on the deployed topic."""
        outputs = stack_outputs(self.aws, self.stack)
        self.tables = {
            "ledger": outputs["LedgerTableName"],
            "approvals": outputs["ApprovalsTableName"],
        }
        self._subscribe_inbox(outputs["TopicArn"], "sdc-deployed-inbox")

    def _start_function_url(self) -> None:
        """Serve the deployed approval URL on a loopback address (``approval_url``; the
        stand-in is ``function_url``; what it stands in for is ``deployed_approval_url``).

        The function it runs is the one the stack's ``AWS::Lambda::Url`` targets, read back
        from the deployed URL's configuration; that URL must be the stack's ``ApprovalUrl``
        output and use AWS_IAM auth, the only kind the stand-in (and the CLI) speaks.
        """
        urls = [r for r in self.resources.values() if r["type"] == "AWS::Lambda::Url"]
        if len(urls) != 1:
            raise ValueError(f"the deployed stack has {len(urls)} function URLs, expected one")
        config = self.aws.client("lambda").get_function_url_config(
            FunctionName=urls[0]["physical_id"]
        )
        self.deployed_approval_url = config["FunctionUrl"]
        output = stack_outputs(self.aws, self.stack).get("ApprovalUrl")
        if output != self.deployed_approval_url:
            raise ValueError(
                f"the stack output ApprovalUrl is {output!r}, but its function URL is "
                f"{self.deployed_approval_url!r}"
            )
        if config["AuthType"] != "AWS_IAM":
            raise ValueError(
                f"the deployed approval URL's AuthType is {config['AuthType']!r}, not AWS_IAM"
            )
        self._serve_approval_url(config["FunctionArn"])

    # ------------------------------------------------------------------ reading
    def pending_approval(self, execution: str, table: str, timeout: float = 180.0) -> str:
        """Wait until ``execution`` asks for approval in the deployed approvals ``table``;
        returns the approval id. Raises if the execution ends first."""
        sfn, ddb = self.aws.client("stepfunctions"), self.aws.client("dynamodb")

        def find() -> str | None:
            status = sfn.describe_execution(executionArn=execution)["status"]
            if status != "RUNNING":
                failed = [c.error for c in self.invocations if c.error]
                raise AssertionError(f"execution {status} before asking for approval: {failed}")
            for item in ddb.scan(TableName=table)["Items"]:
                if item.get("status", {}).get("S") == "pending" and execution in json.dumps(item):
                    return item["approval_id"]["S"]
            return None

        return self.wait(find, timeout, "the approval request")


@contextlib.contextmanager
def deployed(
    cluster: Cluster, context: dict[str, Any] | None = None, *, quiet_handlers: bool = False
) -> Iterator[DeployedChain]:
    """Deploy the stack for ``cluster`` with the pinned CDK CLI on a fresh embedded AWS, and
    yield the chain on what CloudFormation created (``make demo ARGS=--deployed``).

    ``context`` overrides the README's context keys; the cluster's names and a 1 s health-check
    poll (the simulated deep health check takes a second) are set here.
    """
    full = rehearsal_context(
        {
            "hyperPodClusterName": cluster.hyperpod_name,
            "eksClusterName": cluster.eks_name,
            "healthCheckPollInterval": "1s",
            **(context or {}),
        }
    )
    stack = f"{STACK_ID}-{cluster.hyperpod_name}"
    with EmbeddedAws() as aws:
        cli = CdkCli(aws)
        cli.synth(full)
        cli.bootstrap()
        # The cluster exists before the stack: the stack looks its ARN up when it is deployed.
        create_hyperpod_cluster(aws.client, cluster)
        cli.deploy(stack)
        with DeployedChain(aws, stack, cluster, quiet_handlers=quiet_handlers) as chain:
            yield chain
