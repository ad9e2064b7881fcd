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
chain runs (the pipeline module's docstring says why).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from moto.awslambda_simple.models import LambdaSimpleBackend

from infra.app import STACK_ID
from tests.support.kube_standin import KubeStandIn

from .account import create_cluster
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
from .function_url import ApprovalUrl
from .hyperpod import HyperPodSimulator
from .pipeline import (
    LAMBDAS,
    Cluster,
    Invocation,
    LambdaContext,
    process_environment,
    shared_runtime_env,
)

QUIESCE_SECONDS = 120.0
"""How long closing waits for the invocations in flight to return (a busy machine)."""


class DeployedChain:
    """``with DeployedChain(aws, stack, cluster) as chain:`` — the deployed stack, driven."""

    def __init__(
        self, aws: EmbeddedAws, stack: str, cluster: Cluster, *, quiet_handlers: bool = False
    ) -> None:
        """Prepare; nothing starts before ``__enter__``. ``cluster`` must carry the names the
        stack was deployed for (hyperPodClusterName, eksClusterName). ``quiet_handlers`` keeps
        the handlers' logs and metrics off stdout (the demo's timeline)."""
        self.aws = aws
        self.endpoint = aws.endpoint
        self.stack = stack
        self.cluster = cluster
        self.quiet_handlers = quiet_handlers
        self.invocations: list[Invocation] = []
        self.executions: list[str] = []
        self._exit = contextlib.ExitStack()
        self._lock = threading.RLock()
        self._in_flight = threading.Condition()
        self._running = 0
        self._closing = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> DeployedChain:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    def _start(self) -> None:
        self.resources = stack_resources(self.aws, self.stack)
        self.functions = self._deployed_functions()
        shared = shared_runtime_env(
            {name: c["Environment"]["Variables"] for name, c in self.functions.items()},
            quiet=self.quiet_handlers,
        )
        self._exit.enter_context(process_environment({**self.aws.environment, **shared}))
        if str(LAMBDAS) not in sys.path:
            sys.path.insert(0, str(LAMBDAS))
        for config in self.functions.values():
            importlib.import_module(self._module_of(config))  # Powertools builds singletons now
        self._config = importlib.import_module("sdc_remediation.config")
        if self.quiet_handlers:
            from sdc_remediation.observability import logger

            self._exit.callback(logger.setLevel, logger.log_level)
            logger.setLevel("ERROR")
        from sdc_remediation import aws as remediation_aws

        remediation_aws.reset_clients()  # clients cached for an earlier endpoint
        self._exit.callback(remediation_aws.reset_clients)
        self.kube = self._exit.enter_context(KubeStandIn())
        self.hyperpod = HyperPodSimulator(self.kube, account_id=ACCOUNT, region=REGION).install()
        self._exit.callback(self.hyperpod.uninstall)
        self._exit.enter_context(
            mock.patch.object(LambdaSimpleBackend, "invoke", _dispatcher(self))
        )
        self._create_cluster()
        self.evaluator = self._deployed_evaluator()
        self._subscribe_inbox()
        self._start_function_url()
        self._exit.callback(self._quiesce)  # unwound first: the URL stops after it

    def _deployed_functions(self) -> dict[str, dict[str, Any]]:
        """Function name -> its deployed configuration (GetFunctionConfiguration)."""
        lam = self.aws.client("lambda")
        return {
            r["physical_id"]: lam.get_function_configuration(FunctionName=r["physical_id"])
            for r in self.resources.values()
            if r["type"] == "AWS::Lambda::Function"
        }

    @staticmethod
    def _module_of(config: dict[str, Any]) -> str:
        """``localize.handler.handler`` -> ``localize.handler`` (the module the runtime imports)."""
        return config["Handler"].rsplit(".", 1)[0]

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
        specs = [
            AlarmSpec(
                name=a["AlarmName"],
                namespace=a["Namespace"],
                metric_name=a["MetricName"],
                dimensions={d["Name"]: d["Value"] for d in a.get("Dimensions", [])},
                period=int(a["Period"]),
                statistic=a["Statistic"],
                threshold=float(a["Threshold"]),
                comparison=a["ComparisonOperator"],
                evaluation_periods=int(a["EvaluationPeriods"]),
                datapoints_to_alarm=int(a.get("DatapointsToAlarm") or a["EvaluationPeriods"]),
            )
            for a in cloudwatch.describe_alarms(AlarmNames=alarm_names)["MetricAlarms"]
            if a.get("MetricName") and a.get("Statistic")
        ]
        return LocalAlarmEvaluator(
            cloudwatch=cloudwatch,
            alarms=specs,
            rule_pattern=json.loads(rule["EventPattern"]),
            deliver=self.start_execution,
            account_id=ACCOUNT,
            region=REGION,
        )

    def _subscribe_inbox(self) -> None:
        """An SQS inbox on the deployed topic: what the operators' email would receive."""
        outputs = stack_outputs(self.aws, self.stack)
        self.tables = {
            "ledger": outputs["LedgerTableName"],
            "approvals": outputs["ApprovalsTableName"],
        }
        sqs = self.aws.client("sqs")
        self._inbox = sqs.create_queue(QueueName="sdc-deployed-inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._inbox, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.aws.client("sns").subscribe(
            TopicArn=outputs["TopicArn"], Protocol="sqs", Endpoint=queue_arn
        )
        self._seen: list[dict[str, Any]] = []

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
        self.approvals = self._exit.enter_context(
            ApprovalUrl(
                endpoint=self.endpoint,
                region=REGION,
                account=ACCOUNT,
                function=config["FunctionArn"],
                invoke=self.invoke,
            )
        )
        self.function_url = self.approvals.standin
        self.approval_url = self.approvals.url

    def operator_environment(self, role: str, session: str) -> dict[str, str]:
        """Credentials of an operator who assumed ``role`` (for a CLI in its own process): the
        approval URL then authenticates them as
        ``arn:aws:sts::<account>:assumed-role/<role>/<session>``."""
        return self.approvals.operator_environment(role, session)

    def _quiesce(self) -> None:
        with self._in_flight:
            self._closing = True
        sfn = self.aws.client("stepfunctions")
        for arn in self.executions:
            if sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
                sfn.stop_execution(executionArn=arn, error="DeployedChainClosed")
        with self._in_flight:
            if not self._in_flight.wait_for(lambda: self._running == 0, QUIESCE_SECONDS):
                raise TimeoutError(f"{self._running} invocation(s) still running at close")

    # ------------------------------------------------------------------ Lambda, as deployed
    def invoke(self, function_name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        """Run the deployed function's handler with its deployed environment (plus the
        Kubernetes stand-in's endpoint); an exception is a function error named by its class,
        what the workflow's Retry/Catch match. Serialised, as one execution environment is."""
        name = function_name.rsplit(":", 1)[-1]
        with self._in_flight:
            if self._closing:
                response_headers["x-amz-function-error"] = "Unhandled"
                return b'{"errorType": "DeployedChainClosed", "errorMessage": "closed"}'
            self._running += 1
        try:
            config = self.functions.get(name)
            if config is None:  # not a function of the deployed stack
                response_headers["x-amz-function-error"] = "Unhandled"
                return json.dumps(
                    {"errorType": "ResourceNotFoundException", "errorMessage": name}
                ).encode()
            payload = json.loads(body) if body else {}
            env = {
                **config["Environment"]["Variables"],
                "K8S_API_ENDPOINT": self.kube.url,
                "K8S_API_CA_DATA": self.kube.ca_b64,
            }
            folder = config["Handler"].split(".", 1)[0]
            call = Invocation(folder=folder, payload=payload, started=time.time())
            with self._lock, self._config.environment(env):
                try:
                    module = importlib.import_module(self._module_of(config))
                    handler = getattr(module, config["Handler"].rsplit(".", 1)[1])
                    call.result = handler(payload, LambdaContext(name, config["FunctionArn"]))
                    out = json.dumps(call.result).encode()
                except Exception as error:
                    call.error = f"{type(error).__name__}: {error}"
                    response_headers["x-amz-function-error"] = "Unhandled"
                    out = json.dumps(
                        {"errorType": type(error).__name__, "errorMessage": str(error)}
                    ).encode()
                finally:
                    call.ended = time.time()
                    self.invocations.append(call)
            return out
        finally:
            with self._in_flight:
                self._running -= 1
                self._in_flight.notify_all()

    def invoke_event(self, function_name: str, body: Any) -> bytes:
        """An asynchronous invoke (``InvocationType=Event``): answered at once, run afterwards on
        a thread of its own as Lambda queues it (the template-built pipeline's
        ``_invoke_event`` says what that does and does not stand in for). Counted as running
        from now, so closing the chain waits for it."""
        with self._in_flight:
            if self._closing:
                return b""
            self._running += 1

        def run() -> None:
            try:
                self.invoke(function_name, body, {})
            finally:
                with self._in_flight:
                    self._running -= 1
                    self._in_flight.notify_all()

        threading.Thread(target=run, name="lambda-event", daemon=True).start()
        return b""

    # ------------------------------------------------------------------ driving and reading
    def start_execution(self, event: dict[str, Any]) -> str:
        """What the deployed rule's target does with a matching event; returns the ARN."""
        arn = self.aws.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn,
            name=f"alarm-{len(self.executions)}-{uuid.uuid4().hex[:8]}",
            input=json.dumps(event),
        )["executionArn"]
        self.executions.append(arn)
        return arn

    def publish(self, alarm: Any, *, spool_dir: str, namespace: str = "SDC") -> None:
        """Publish an ``sdc_agent.Alarm`` with the agent's CloudWatch publisher, as the
        training job's DP rank 0 does, and wait until it is delivered."""
        from sdc_agent.publish import CloudWatchPublisher

        publisher = CloudWatchPublisher(
            cluster_name=self.cluster.hyperpod_name,
            job_name=self.cluster.job,
            namespace=namespace,
            spool_dir=spool_dir,
            connect_timeout=30.0,  # a busy machine; late answers are not what this is about
            read_timeout=60.0,
        )
        publisher.publish_alarm(alarm)
        if not publisher.flush(240):
            raise RuntimeError("the agent's publisher could not deliver the alarm")
        publisher.close(5)

    def wait(self, condition: Callable[[], Any], timeout: float = 180.0, what: str = "") -> Any:
        """Poll until ``condition()`` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.2)
        return value

    # What the demo reads (the same names as the template-built LocalPipeline's).
    def execution(self, arn: str) -> dict[str, Any]:
        """describe_execution."""
        return self.aws.client("stepfunctions").describe_execution(executionArn=arn)

    def finish(self, arn: str, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until the execution ends; returns describe_execution."""
        return self.wait(
            lambda: (d := self.execution(arn))["status"] != "RUNNING" and d,
            timeout,
            f"execution {arn.rsplit(':', 1)[-1]} to end",
        )

    def pending_approvals(self) -> list[dict[str, Any]]:
        """Items of the deployed approvals table still pending."""
        items = self.aws.client("dynamodb").scan(TableName=self.tables["approvals"])["Items"]
        return [i for i in items if i.get("status", {}).get("S") == "pending"]

    def transitions(self, instance_id: str) -> list[str]:
        """The deployed ledger's transitions for one instance, in time order."""
        from boto3.dynamodb.types import TypeDeserializer

        d = TypeDeserializer()
        items = self.aws.client("dynamodb").scan(TableName=self.tables["ledger"])["Items"]
        rows = [{k: d.deserialize(v) for k, v in item.items()} for item in items]
        events = sorted(
            (i for i in rows if i["pk"] == instance_id and i["sk"].startswith("EVENT#")),
            key=lambda i: i["sk"],
        )
        return [e.get("transition") or e.get("status") for e in events]

    def notifications(self) -> list[dict[str, Any]]:
        """Messages the deployed topic delivered so far (drained from the inbox)."""
        sqs = self.aws.client("sqs")
        while batch := sqs.receive_message(QueueUrl=self._inbox, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            for message in batch:
                envelope = json.loads(message["Body"])
                self._seen.append(
                    {"subject": envelope.get("Subject"), "message": envelope.get("Message")}
                )
                sqs.delete_message(QueueUrl=self._inbox, ReceiptHandle=message["ReceiptHandle"])
        return list(self._seen)

    def cli_env(self) -> dict[str, str]:
        """Environment for the operator CLI (its own process): decisions through the deployed
        approval URL's stand-in, ``history`` on the deployed ledger; no approvals table, as an
        operator has no access to it (its task tokens). In this process, pass
        :meth:`cli_options` instead: os.environ is shared by the chain's threads."""
        return {
            **self.aws.environment,
            "SDC_APPROVAL_URL": self.approval_url,
            "SDC_LEDGER_TABLE": self.tables["ledger"],
        }

    def cli_options(self) -> list[str]:
        """The operator CLI's options for this chain (its AWS settings are already in this
        process's environment), as :meth:`cli_env` says them."""
        return ["--approval-url", self.approval_url, "--ledger-table", self.tables["ledger"]]

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


def _dispatcher(chain: DeployedChain) -> Callable[..., bytes]:
    """moto's in-process Lambda invoke, routed to :meth:`DeployedChain.invoke`."""

    def invoke(
        backend: LambdaSimpleBackend,
        function_name: str,
        qualifier: Any,
        body: Any,
        headers: Any,
        response_headers: dict[str, str],
    ) -> bytes:
        if headers.get("X-Amz-Invocation-Type") == "Event":
            return chain.invoke_event(function_name, body)
        return chain.invoke(function_name, body, response_headers)

    return invoke


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
        cli.deploy(stack)
        with DeployedChain(aws, stack, cluster, quiet_handlers=quiet_handlers) as chain:
            yield chain
