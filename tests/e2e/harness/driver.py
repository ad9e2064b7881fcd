"""What both drivers share: the Lambda runtime, closing, and everything a test or the demo reads.

:class:`~.pipeline.LocalPipeline` (built from the synthesized template) and
:class:`~.deployed.DeployedChain` (what ``cdk deploy`` created) differ only in how they stand the
stack up. Once up, each has an embedded AWS (``client``), a :class:`~.runtime.LambdaRuntime`
running the real handlers, the ledger and approvals tables, the notification topic's inbox and
the approve function's URL; driving the workflow and reading what it did is this class, the same
for both, so the demo runs unchanged on either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import botocore.exceptions

from .account import ACCOUNT, REGION, Cluster
from .function_url import ApprovalUrl
from .runtime import Function, Invocation, LambdaRuntime


class Driver(ABC):
    """The shared half of a driver; a subclass stands the stack up in ``_start``."""

    closed_error = "DriverClosed"
    """The errorType of an invocation refused after close (the subclass names itself)."""

    def __init__(self, cluster: Cluster, *, quiet_handlers: bool = False) -> None:
        """Prepare; nothing starts before ``__enter__``. ``quiet_handlers`` keeps the handlers'
        logs and metrics off stdout (the demo's timeline)."""
        self.cluster = cluster
        self.quiet_handlers = quiet_handlers
        self.endpoint = ""
        """The embedded AWS's endpoint (AWS_ENDPOINT_URL), once started."""
        self.executions: list[str] = []
        self.tables: dict[str, str] = {}
        self.state_machine_arn = ""
        self.namespace = "SDC"
        self.runtime: LambdaRuntime | None = None
        self._exit = contextlib.ExitStack()
        self._inbox = ""
        self._seen: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Any:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    @abstractmethod
    def _start(self) -> None:
        """Stand the stack up (the part each driver does its own way)."""

    @abstractmethod
    def client(self, service: str) -> Any:
        """A boto3 client for the embedded AWS."""

    @property
    @abstractmethod
    def aws_environment(self) -> dict[str, str]:
        """The endpoint and credentials of the embedded AWS, for a process of its own."""

    def _start_runtime(self, functions: dict[str, Function]) -> LambdaRuntime:
        """Import the handlers and route moto's Lambda invokes to them. ``quiet_handlers``
        lowers the handlers' shared logger for the driver's lifetime. The process environment
        must already hold the settings the functions share (``shared_runtime_env``)."""
        runtime = LambdaRuntime(functions, closed_error=self.closed_error)
        runtime.import_handlers()
        if self.quiet_handlers:
            from sdc_remediation.observability import logger

            self._exit.callback(logger.setLevel, logger.log_level)
            logger.setLevel("ERROR")
        from sdc_remediation import aws as remediation_aws

        remediation_aws.reset_clients()  # clients cached for an earlier endpoint
        self._exit.callback(remediation_aws.reset_clients)
        self._exit.enter_context(runtime.installed())
        self.runtime = runtime
        return runtime

    def _close_on_exit(self) -> None:
        """Register the close; call it last in ``_start`` so that it is unwound first: nothing
        of this driver may still run when the rest is torn down."""
        assert self.runtime is not None
        self._exit.callback(self.runtime.close, self._stop_executions)

    def _stop_executions(self) -> None:
        """Stop what still runs (an execution waiting for approval, a retry loop)."""
        sfn = self.client("stepfunctions")
        for arn in self.executions:
            try:
                if self.execution(arn)["status"] == "RUNNING":
                    sfn.stop_execution(executionArn=arn, error=self.closed_error)
            except botocore.exceptions.ClientError as exc:
                logging.getLogger(__name__).warning("could not stop %s: %s", arn, exc)

    @property
    def invocations(self) -> list[Invocation]:
        """Every Lambda invocation so far, in the order they ended."""
        return self.runtime.invocations if self.runtime is not None else []

    # ------------------------------------------------------------------ the topic and the URL
    def _subscribe_inbox(self, topic_arn: str, queue_name: str) -> None:
        """An SQS inbox on the topic: what the operators' email subscriptions would receive."""
        sqs = self.client("sqs")
        self._inbox = sqs.create_queue(QueueName=queue_name)["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._inbox, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.client("sns").subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)

    def _serve_approval_url(self, function: str) -> None:
        """Serve the approve function's URL on a loopback address (``approval_url``; the
        stand-in is ``function_url``), running ``function`` (its name or ARN) on the runtime
        once it runs (the URL is served first: request_approval's environment names it)."""
        self.approvals = self._exit.enter_context(
            ApprovalUrl(
                endpoint=self.endpoint,
                region=REGION,
                account=ACCOUNT,
                function=function,
                invoke=self._invoke_via_url,
            )
        )
        self.function_url = self.approvals.standin
        self.approval_url = self.approvals.url

    def _invoke_via_url(self, function: str, body: Any, headers: dict[str, str]) -> bytes:
        if self.runtime is None:
            raise RuntimeError("the approval URL was called before the Lambda runtime started")
        return self.runtime.invoke_url(function, body, headers)

    def operator_environment(self, role: str, session: str) -> dict[str, str]:
        """Credentials of an operator who assumed ``role`` (for a CLI in its own process): the
        approve function's URL then authenticates them as
        ``arn:aws:sts::<account>:assumed-role/<role>/<session>``."""
        return self.approvals.operator_environment(role, session)

    # ------------------------------------------------------------------ driving
    def start_execution(self, event: dict[str, Any]) -> str:
        """Start the workflow with ``event`` (what the rule's target does); returns its ARN."""
        arn = self.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn,
            name=f"alarm-{len(self.executions)}-{uuid.uuid4().hex[:8]}",
            input=json.dumps(event),
        )["executionArn"]
        self.executions.append(arn)
        return arn

    def publish(self, alarm: Any, *, spool_dir: str, namespace: str | None = None) -> None:
        """Publish an ``sdc_agent.Alarm`` with the agent's real CloudWatch publisher, as the
        training job's DP rank 0 would, and wait until it is delivered."""
        from sdc_agent.publish import CloudWatchPublisher

        publisher = CloudWatchPublisher(
            cluster_name=self.cluster.hyperpod_name,
            job_name=self.cluster.job,
            namespace=namespace or self.namespace,
            spool_dir=spool_dir,
            # A busy machine may keep the embedded AWS from answering within the production
            # timeouts (2 s / 5 s); a late answer is not what these tests are about.
            connect_timeout=30.0,
            read_timeout=60.0,
        )
        publisher.publish_alarm(alarm)
        if not publisher.flush(240):
            raise RuntimeError("the agent's publisher could not deliver the alarm to local AWS")
        publisher.close(5)

    def wait(self, condition: Callable[[], Any], timeout: float = 180.0, what: str = "") -> Any:
        """Poll until ``condition()`` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout:.0f} s waiting for {what or condition}"
                )
            time.sleep(0.1)

    # ------------------------------------------------------------------ reading
    def execution(self, arn: str) -> dict[str, Any]:
        """describe_execution."""
        return self.client("stepfunctions").describe_execution(executionArn=arn)

    def finish(self, arn: str, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until the execution ends; returns describe_execution."""
        return self.wait(
            lambda: (d := self.execution(arn))["status"] != "RUNNING" and d,
            timeout,
            f"execution {arn.rsplit(':', 1)[-1]} to end",
        )

    def pending_approvals(self) -> list[dict[str, Any]]:
        """Items of the approvals table still pending."""
        items = self.client("dynamodb").scan(TableName=self.tables["approvals"])["Items"]
        return [i for i in items if i.get("status", {}).get("S") == "pending"]

    def ledger(self) -> list[dict[str, Any]]:
        """Every ledger item, plain values."""
        from boto3.dynamodb.types import TypeDeserializer

        d = TypeDeserializer()
        items = self.client("dynamodb").scan(TableName=self.tables["ledger"])["Items"]
        return [{k: d.deserialize(v) for k, v in item.items()} for item in items]

    def transitions(self, instance_id: str) -> list[str]:
        """The ledger's recorded transitions for one instance, in time order."""
        from sdc_remediation.dal import keys

        events = sorted(
            (i for i in self.ledger() if i["pk"] == instance_id and keys.is_event(i)),
            key=lambda i: i["sk"],
        )
        return [e.get("transition") or e.get("status") for e in events]

    def notifications(self) -> list[dict[str, Any]]:
        """Messages published to the topic so far (drained from its inbox queue)."""
        sqs = self.client("sqs")
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

    # ------------------------------------------------------------------ the operator CLI
    def cli_env(self) -> dict[str, str]:
        """Environment for the operator CLI (its own process): decisions through the approve
        function's URL, ``history`` on the ledger; no approvals table, as an operator has no
        access to it (its task tokens). In this process, pass :meth:`cli_options` instead:
        os.environ is shared by the driver's threads."""
        return {
            **self.aws_environment,
            "SDC_APPROVAL_URL": self.approval_url,
            "SDC_LEDGER_TABLE": self.tables["ledger"],
        }

    def cli_options(self) -> list[str]:
        """The operator CLI's options for this driver (its AWS settings are already in this
        process's environment), as :meth:`cli_env` says them."""
        return ["--approval-url", self.approval_url, "--ledger-table", self.tables["ledger"]]
