"""The whole remediation pipeline on embedded stand-ins, built from the synthesized CDK template.

What is ours runs for real: the CloudFormation template `cdk synth` produces (its state machine
definition, its Lambda handler strings and environment, its tables, topic, alarms and event
rule), the Lambda handler code, and the operator CLI. What AWS and Kubernetes would provide is
stood in for:
- AWS: a moto server on 127.0.0.1 (one process, threads), so training processes can publish to it
  through ``AWS_ENDPOINT_URL`` like they would to CloudWatch. Its Step Functions executor runs the
  real definition; each Lambda invoke is dispatched in-process to the real handler of that
  folder, with that function's environment from the template (see :meth:`LocalPipeline._invoke`:
  the only adapter, documented there). Handlers learn nothing but endpoints: AWS_ENDPOINT_URL and
  K8S_API_ENDPOINT / K8S_API_CA_DATA, their documented endpoint configuration.

- HyperPod: :class:`HyperPodSimulator` (moto lacks StartClusterHealthCheck and
  BatchReplaceClusterNodes).
- Kubernetes: the loopback HTTPS API stand-in of tests/support.
- CloudWatch alarm evaluation + EventBridge delivery: :class:`LocalAlarmEvaluator`.
- The approve function's URL (AWS_IAM auth): :class:`FunctionUrlStandIn` on a loopback address.
  The operator CLI decides through it as it would in an account (SigV4-signed, the approver the
  principal STS names for the signing key); see that module for what it does and does not prove.
What this cannot prove: IAM (every call is allowed), KMS, Lambda packaging and cold starts,
real service latencies and eventual consistency, and EventBridge/Step Functions quotas.

The process environment is shared by every thread here (the test's, moto's request and execution
threads, the handlers'), and botocore and requests iterate it whenever they build a client. So
it is written only while no thread of the pipeline runs: once at start (the endpoint, fake
credentials, the Powertools settings every function shares) and once at exit, after every
execution was stopped and every invocation returned. What differs per function (its template
environment) reaches its handler through ``sdc_remediation.config.environment``, never through
``os.environ``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import botocore.exceptions
from botocore.credentials import Credentials
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.server import ThreadedMotoServer

from infra.app import synthesize_template
from infra.template import function_logical_ids, state_machine_definition
from tests.support.kube_standin import KubeStandIn

from .account import ACCOUNT, REGION, create_cluster, reset_embedded_aws
from .alarms import AlarmSpec, LocalAlarmEvaluator
from .function_url import ApprovalUrl
from .hyperpod import HyperPodSimulator

REPO = Path(__file__).resolve().parents[3]
LAMBDAS = REPO / "lambdas"

_TEMPLATES: dict[str, dict[str, Any]] = {}
_INVOKE_LOCK = threading.RLock()

QUIESCE_SECONDS = 120.0
"""How long closing a pipeline waits for the invocations in flight to return (a busy machine)."""


@contextlib.contextmanager
def process_environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back exactly what was there.

    Only for moments when no other thread of ours runs (see the module docstring): a thread that
    iterates os.environ while a key is added or removed fails with KeyError or RuntimeError.
    Only the given keys are touched, unlike ``mock.patch.dict``, which clears and refills all.
    """
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def shared_runtime_env(
    environments: Mapping[str, Mapping[str, str]], *, quiet: bool = False
) -> dict[str, str]:
    """The settings every function must share when all run in this one process.

    ``environments`` maps each function (by any name) to its environment. Powertools reads its
    ``POWERTOOLS_*`` settings and ``LOG_LEVEL`` from the process environment when its singletons
    are built (POWERTOOLS_METRICS_DISABLED at each flush), so they are set once for a whole
    chain; raises ValueError naming the variable and two functions that disagree on it (the
    template gives them all the same). Adds POWERTOOLS_TRACE_DISABLED (no X-Ray daemon here)
    and, when ``quiet``, POWERTOOLS_METRICS_DISABLED (EMF lines on stdout would interleave with
    the demo's timeline).
    """
    values: dict[str, str] = {}
    owner: dict[str, str] = {}
    for function, variables in environments.items():
        for key, value in variables.items():
            if not (key.startswith("POWERTOOLS_") or key == "LOG_LEVEL"):
                continue
            if values.setdefault(key, value) != value:
                raise ValueError(
                    f"the functions run in one process here, so they must share {key}; "
                    f"{owner[key]} has {values[key]!r}, {function} {value!r}"
                )
            owner.setdefault(key, function)
    values["POWERTOOLS_TRACE_DISABLED"] = "true"
    if quiet:
        values["POWERTOOLS_METRICS_DISABLED"] = "true"
    return values


def template_for(context: dict[str, Any]) -> dict[str, Any]:
    """The synthesized template for ``context`` (cached: a synth costs seconds)."""
    key = json.dumps(context, sort_keys=True)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = synthesize_template(context)
    return _TEMPLATES[key]


def compress_timings(
    definition: dict[str, Any],
    *,
    approval_timeout_seconds: int | None = None,
    retry_interval_seconds: int | None = None,
) -> dict[str, Any]:
    """Shorten waits the config will not let a real deployment shorten; nothing else changes.

    The approval timeout has a 1-minute floor and retries back off from 5 s for minutes (both
    right for production, too slow for a test): a scenario may shrink the RequestApproval task's
    TimeoutSeconds and every Retry's interval (backoff 1, same MaxAttempts). States, transitions,
    error names and attempt counts stay exactly as synthesized.
    """

    def visit(states: dict[str, Any]) -> None:
        for name, state in states.items():
            if approval_timeout_seconds and name == "RequestApproval":
                state["TimeoutSeconds"] = approval_timeout_seconds
            if retry_interval_seconds:
                for retry in state.get("Retry", []):
                    retry["IntervalSeconds"] = retry_interval_seconds
                    retry["BackoffRate"] = 1.0
            for nested in ("ItemProcessor", "Iterator"):
                if nested in state:
                    visit(state[nested]["States"])

    visit(definition["States"])
    return definition


@dataclass
class LambdaContext:
    """The attributes of the Lambda context object that Powertools reads."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int = 256
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""

    def get_remaining_time_in_millis(self) -> int:
        """Plenty: local invocations are not cut off."""
        return 300_000


@dataclass
class Invocation:
    """One Lambda invocation the workflow made."""

    folder: str
    payload: dict[str, Any]
    started: float
    ended: float = 0.0
    result: Any = None
    error: str | None = None


@dataclass
class Cluster:
    """The simulated HyperPod cluster: instance ids, and the training job's pods on them."""

    hyperpod_name: str
    eks_name: str
    instance_ids: list[str]
    instance_group: str = "workers"
    job: str = "llama-pretrain"
    ranks_per_node: int = 2

    def node_name(self, instance_id: str) -> str:
        """HyperPod names each Kubernetes node after its instance."""
        return f"hyperpod-{instance_id}"

    def pod_name(self, rank: int) -> str:
        """The pod of global ``rank`` (a PyTorchJob names its workers like this)."""
        return f"{self.job}-worker-{rank}"


class LocalPipeline:
    """Start with ``with LocalPipeline(cluster, context) as pipeline:``.

    ``context`` is CDK context (as in cdk.json) that overrides the example configuration; the
    cluster names are taken from ``cluster``.
    """

    def __init__(
        self,
        cluster: Cluster,
        context: dict[str, Any] | None = None,
        *,
        health_check_outcome: str = "passed",
        automatic_node_recovery: bool = False,
        health_check_seconds: float = 1.0,
        quiet_handlers: bool = False,
        approval_timeout_seconds: int | None = None,
        retry_interval_seconds: int | None = None,
    ) -> None:
        """Prepare; nothing starts before ``__enter__``."""
        self.cluster = cluster
        self.context = {
            "hyperPodClusterName": cluster.hyperpod_name,
            "eksClusterName": cluster.eks_name,
            "healthCheckPollInterval": "1s",
            **(context or {}),
        }
        self.health_check_outcome = health_check_outcome
        self.automatic_node_recovery = automatic_node_recovery
        self.health_check_seconds = health_check_seconds
        self.quiet_handlers = quiet_handlers
        self.approval_timeout_seconds = approval_timeout_seconds
        self.retry_interval_seconds = retry_interval_seconds
        self.invocations: list[Invocation] = []
        self.executions: list[str] = []
        self._stack = contextlib.ExitStack()
        self._function_env: dict[str, dict[str, str]] = {}
        self._in_flight = threading.Condition()
        self._running_invokes = 0
        self._closing = False
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self._physical: dict[str, str] = {}
        self._arns: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalPipeline:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        self.template = template_for(self.context)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        runtime_env = self._shared_runtime_env()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            self.endpoint = f"http://{host}:{port}"
            self.aws_env = {
                "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_SESSION_TOKEN": "testing",
                "AWS_DEFAULT_REGION": REGION,
                "AWS_REGION": REGION,
                # moto's Step Functions executor calls Lambda at localhost:$MOTO_PORT.
                "MOTO_PORT": str(port),
            }
            # The one write at start: the server thread only waits for connections until the
            # first request below, and nothing else of this pipeline runs yet.
            self._stack.enter_context(process_environment({**self.aws_env, **runtime_env}))
        finally:
            # Registered after the environment, so unwound before it: the server has stopped
            # when the environment is put back.
            self._stack.callback(server.stop)
        self._import_handlers()
        self._session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
        )
        # moto's executor threads build a Lambda client from boto3's default session for each
        # task, concurrently under a Map; build one here first, so that the session's lazily
        # created parts (loaders, resolvers) exist before they race to create them.
        boto3.client(
            "lambda",
            region_name=REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id="ak",
            aws_secret_access_key="sk",
        )
        # moto's backends are process globals: start every pipeline from an empty account.
        reset_embedded_aws(self.endpoint, timeout=10)
        self.kube = self._stack.enter_context(KubeStandIn())
        self.hyperpod = HyperPodSimulator(
            self.kube,
            account_id=ACCOUNT,
            region=REGION,
            health_check_seconds=self.health_check_seconds,
            health_check_outcome=self.health_check_outcome,  # type: ignore[arg-type]
            automatic_node_recovery=self.automatic_node_recovery,
        ).install()
        self._stack.callback(self.hyperpod.uninstall)
        self._stack.enter_context(
            mock.patch.object(LambdaSimpleBackend, "invoke", self._invoke_method())
        )
        from sdc_remediation import aws as remediation_aws

        remediation_aws.reset_clients()  # clients cached for an earlier endpoint
        self._stack.callback(remediation_aws.reset_clients)
        self._create_cluster()
        self._create_resources()
        self._create_state_machine()
        self._create_evaluator()
        self._start_function_url()
        # Unwound first: nothing of this pipeline may still run when the rest is torn down.
        self._stack.callback(self._quiesce)

    def _shared_runtime_env(self) -> dict[str, str]:
        """The Powertools settings the template's functions share (see shared_runtime_env)."""
        functions = self._resources("AWS::Lambda::Function")
        return shared_runtime_env(
            {
                logical_id: functions[logical_id]["Properties"]
                .get("Environment", {})
                .get("Variables", {})
                for logical_id in function_logical_ids(self.template).values()
            },
            quiet=self.quiet_handlers,
        )

    def _import_handlers(self) -> None:
        """Import every handler now, in this thread, with the environment just set: Powertools
        builds its singletons at import, and an import inside an invocation's thread would race
        another's. ``quiet_handlers`` lowers the shared logger for the pipeline's lifetime."""
        if str(LAMBDAS) not in sys.path:
            sys.path.insert(0, str(LAMBDAS))
        for folder in function_logical_ids(self.template):
            importlib.import_module(f"{folder}.handler")
        self._config = importlib.import_module("sdc_remediation.config")
        if self.quiet_handlers:
            from sdc_remediation.observability import logger

            level = logger.log_level
            logger.setLevel("ERROR")
            self._stack.callback(logger.setLevel, level)

    def _quiesce(self) -> None:
        """Stop what still runs (an execution waiting for approval, a retry loop), refuse new
        invocations and wait for those in flight, so the process environment can be restored
        with no thread of this pipeline left to read it."""
        with self._in_flight:
            self._closing = True
        sfn = self.client("stepfunctions")
        for arn in self.executions:
            try:
                if self.execution(arn)["status"] == "RUNNING":
                    sfn.stop_execution(executionArn=arn, error="LocalPipelineClosed")
            except botocore.exceptions.ClientError as exc:
                logging.getLogger(__name__).warning("could not stop %s: %s", arn, exc)
        with self._in_flight:
            if not self._in_flight.wait_for(
                lambda: self._running_invokes == 0, timeout=QUIESCE_SECONDS
            ):
                raise TimeoutError(
                    f"{self._running_invokes} Lambda invocation(s) still running "
                    f"{QUIESCE_SECONDS:.0f} s after the pipeline was closed"
                )

    def client(self, service: str) -> Any:
        """A boto3 client for the embedded AWS (one per service, made on first use).

        From a session of the pipeline's own with its credentials given, not boto3's default
        session: a boto3 session is not thread-safe, and moto's executor threads build their
        clients from the default one.
        """
        with self._clients_lock:
            if service not in self._clients:
                self._clients[service] = self._session.client(service, endpoint_url=self.endpoint)
            return self._clients[service]

    # ------------------------------------------------------------------ the cluster
    def _create_cluster(self) -> None:
        create_cluster(self.client, self.hyperpod, self.kube, self.cluster)

    # ------------------------------------------------------------------ template resources
    def _resources(self, kind: str) -> dict[str, dict[str, Any]]:
        return {k: r for k, r in self.template["Resources"].items() if r["Type"] == kind}

    def resolve(self, value: Any) -> Any:
        """Resolve a template value (Ref, Fn::GetAtt Arn, Fn::Join, nested) to local values."""
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1 and next(iter(value)).startswith(("Ref", "Fn::")):
            ((fn, arg),) = value.items()
            pseudo = {
                "AWS::Region": REGION,
                "AWS::AccountId": ACCOUNT,
                "AWS::Partition": "aws",
                "AWS::URLSuffix": "amazonaws.com",
            }
            if fn == "Ref" and (arg in pseudo or arg in self._physical):
                return pseudo.get(arg) or self._physical[arg]
            if fn == "Fn::GetAtt" and arg[1] == "Arn" and arg[0] in self._arns:
                return self._arns[arg[0]]
            if fn == "Fn::Join":
                return arg[0].join(str(self.resolve(p)) for p in arg[1])
            raise ValueError(f"the local pipeline cannot resolve {value!r}")
        return {k: self.resolve(v) for k, v in value.items()}

    def _create_resources(self) -> None:
        ddb = self.client("dynamodb")
        for logical_id, table in self._resources("AWS::DynamoDB::Table").items():
            props = table["Properties"]
            name = f"{logical_id}-local"
            ddb.create_table(
                TableName=name,
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
                **(
                    {"GlobalSecondaryIndexes": props["GlobalSecondaryIndexes"]}
                    if "GlobalSecondaryIndexes" in props
                    else {}
                ),
            )
            if "TimeToLiveSpecification" in props:
                ddb.update_time_to_live(
                    TableName=name, TimeToLiveSpecification=props["TimeToLiveSpecification"]
                )
            self._physical[logical_id] = name
            self._arns[logical_id] = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"
        sns, sqs = self.client("sns"), self.client("sqs")
        for logical_id in self._resources("AWS::SNS::Topic"):
            arn = sns.create_topic(Name=f"{logical_id}-local")["TopicArn"]
            self._physical[logical_id] = self._arns[logical_id] = arn
            # An inbox: what the operators' email subscriptions would receive.
            queue = sqs.create_queue(QueueName=f"{logical_id}-inbox")["QueueUrl"]
            queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
            self._inbox = queue
            self.topic_arn = arn
        for logical_id, alarm in self._resources("AWS::CloudWatch::Alarm").items():
            name = alarm["Properties"].get("AlarmName", logical_id)
            self._arns[logical_id] = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{name}"
        ((machine_id, machine),) = self._resources("AWS::StepFunctions::StateMachine").items()
        name = machine["Properties"].get("StateMachineName", "sdc-guard")
        self._physical[machine_id] = self._arns[machine_id] = (
            f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{name}"
        )
        self._machine_id, self._machine_name = machine_id, name
        self.tables = {
            "ledger": next(v for k, v in self._physical.items() if k.startswith("Ledger")),
            "approvals": next(v for k, v in self._physical.items() if k.startswith("Approvals")),
        }
        folders = function_logical_ids(self.template)
        functions = self._resources("AWS::Lambda::Function")
        for folder, logical_id in folders.items():
            # A function's name is its folder here (what `_invoke` dispatches on), e.g. the
            # approve function request_approval invokes for the canary (APPROVE_FUNCTION).
            self._physical[logical_id] = folder
            self._arns[logical_id] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{folder}"
        for folder, logical_id in folders.items():
            variables = (
                functions[logical_id]["Properties"].get("Environment", {}).get("Variables", {})
            )
            env = {k: str(self.resolve(v)) for k, v in variables.items()}
            env.update(K8S_API_ENDPOINT=self.kube.url, K8S_API_CA_DATA=self.kube.ca_b64)
            self._function_env[folder] = env

    def _create_state_machine(self) -> None:
        arns = {
            f: f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{f}"
            for f in function_logical_ids(self.template)
        }
        self.definition = compress_timings(
            json.loads(state_machine_definition(self.template, arns)),
            approval_timeout_seconds=self.approval_timeout_seconds,
            retry_interval_seconds=self.retry_interval_seconds,
        )
        definition = json.dumps(self.definition)
        sfn = self.client("stepfunctions")
        self.state_machine_arn = sfn.create_state_machine(
            name=self._machine_name,
            definition=definition,
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/sdc-workflow",
        )["stateMachineArn"]

    def _create_evaluator(self) -> None:
        namespace = self.context.get("namespace", "SDC")
        specs = []
        for alarm in self._resources("AWS::CloudWatch::Alarm").values():
            raw = alarm["Properties"]
            if raw.get("Namespace") != namespace or "MetricName" not in raw:
                continue  # the pipeline's own health alarms (failed executions, DLQ)
            props = {
                k: self.resolve(v) for k, v in alarm["Properties"].items() if k != "AlarmActions"
            }
            specs.append(AlarmSpec.from_properties(props))
        (rule,) = self._resources("AWS::Events::Rule").values()
        self.evaluator = LocalAlarmEvaluator(
            cloudwatch=self.client("cloudwatch"),
            alarms=specs,
            rule_pattern=self.resolve(rule["Properties"]["EventPattern"]),
            deliver=self.start_execution,
            account_id=ACCOUNT,
            region=REGION,
        )
        self.evaluator.create_in_cloudwatch()

    # ------------------------------------------------------------------ the approval URL
    def _start_function_url(self) -> None:
        """Serve the approve function's URL on a loopback address (``self.approval_url``; the
        stand-in is ``self.function_url``), running the approve handler as ``_invoke`` does."""
        self.approvals = self._stack.enter_context(
            ApprovalUrl(
                endpoint=self.endpoint,
                region=REGION,
                account=ACCOUNT,
                function="approve",
                invoke=self._invoke,
            )
        )
        self.function_url = self.approvals.standin
        self.approval_url = self.approvals.url

    def add_credentials(self, credentials: Credentials) -> None:
        """Let the embedded AWS authenticate requests signed with ``credentials`` (what IAM knows
        of a key: its secret). The process's own test credentials are known from the start."""
        self.approvals.add_credentials(credentials)

    def operator_environment(self, role: str, session: str) -> dict[str, str]:
        """Credentials of an operator who assumed ``role`` (for a CLI in its own process): the
        approve function's URL then authenticates them as
        ``arn:aws:sts::<account>:assumed-role/<role>/<session>``."""
        return self.approvals.operator_environment(role, session)

    # ------------------------------------------------------------------ the Lambda adapter
    def _invoke_method(self) -> Callable[..., bytes]:
        pipeline = self

        def invoke(
            backend: LambdaSimpleBackend,
            function_name: str,
            qualifier: Any,
            body: Any,
            headers: Any,
            response_headers: dict[str, str],
        ) -> bytes:
            if headers.get("X-Amz-Invocation-Type") == "Event":
                return pipeline._invoke_event(function_name, body)
            return pipeline._invoke(function_name, body, response_headers)

        return invoke

    def _invoke_event(self, function_name: str, body: Any) -> bytes:
        """An asynchronous invoke (``InvocationType=Event``, how request_approval asks the
        approve function to settle a canary's approval): answered at once (moto answers 202),
        and run afterwards on a thread of its own, as Lambda queues it and runs it once the
        caller went on. Counted as running from now, so closing the pipeline waits for it. Its
        outcome is only in ``self.invocations`` (a function error there, as in the function's
        logs); Lambda's two retries of a failed asynchronous invocation are not stood in."""
        folder = function_name.rsplit(":", 1)[-1]
        payload = json.loads(body) if body else {}
        with self._in_flight:
            if self._closing:
                return b""
            self._running_invokes += 1

        def run() -> None:
            try:
                self._run_handler(folder, payload, {})
            finally:
                with self._in_flight:
                    self._running_invokes -= 1
                    self._in_flight.notify_all()

        threading.Thread(target=run, name=f"lambda-event-{folder}", daemon=True).start()
        return b""

    def _invoke(self, function_name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        """Run the real handler of ``function_name`` in this process, as the Lambda runtime would:
        its environment from the template, a context object, and an unhandled exception reported
        as a function error whose errorType is the exception's class name (what Retry/Catch
        match).

        The function's environment reaches its settings through ``config.environment`` (this
        thread only); ``os.environ`` is never written here. Invocations are still serialised: the
        handlers share Powertools' metrics and logger singletons, and one Lambda execution
        environment never runs two invocations at once either. After the pipeline closed, an
        invocation (a straggling execution's) is refused as a function error.
        """
        folder = function_name.rsplit(":", 1)[-1]
        payload = json.loads(body) if body else {}
        with self._in_flight:
            if self._closing:
                response_headers["x-amz-function-error"] = "Unhandled"
                return json.dumps(
                    {"errorType": "LocalPipelineClosed", "errorMessage": "the pipeline closed"}
                ).encode()
            self._running_invokes += 1
        try:
            return self._run_handler(folder, payload, response_headers)
        finally:
            with self._in_flight:
                self._running_invokes -= 1
                self._in_flight.notify_all()

    def _run_handler(self, folder: str, payload: Any, response_headers: dict[str, str]) -> bytes:
        call = Invocation(folder=folder, payload=payload, started=time.time())
        with _INVOKE_LOCK, self._config.environment(self._function_env[folder]):
            try:
                module = importlib.import_module(f"{folder}.handler")
                context = LambdaContext(
                    folder, f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{folder}"
                )
                call.result = module.handler(payload, context)
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

    # ------------------------------------------------------------------ driving and reading
    def invoke(self, folder: str, payload: Any) -> Any:
        """Invoke a function of the template as its trigger would (a schedule, an alarm
        action), through the same adapter the workflow's invokes take; returns its result, and
        raises RuntimeError with the function's error."""
        headers: dict[str, str] = {}
        out = json.loads(self._invoke(folder, json.dumps(payload), headers))
        if "x-amz-function-error" in headers:
            raise RuntimeError(f"{folder} failed: {out['errorType']}: {out['errorMessage']}")
        return out

    def start_execution(self, event: dict[str, Any]) -> str:
        """Start the workflow with ``event`` (what the rule's target does); returns its ARN."""
        arn = self.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn,
            name=f"alarm-{len(self.executions)}-{uuid.uuid4().hex[:8]}",
            input=json.dumps(event),
        )["executionArn"]
        self.executions.append(arn)
        return arn

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

    def history(self, arn: str) -> list[dict[str, Any]]:
        """The execution's events (get_execution_history, all pages)."""
        sfn = self.client("stepfunctions")
        events, token = [], None
        while True:
            page = sfn.get_execution_history(
                executionArn=arn, **({"nextToken": token} if token else {})
            )
            events += page["events"]
            token = page.get("nextToken")
            if not token:
                return events

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
        events = sorted(
            (i for i in self.ledger() if i["pk"] == instance_id and i["sk"].startswith("EVENT#")),
            key=lambda i: i["sk"],
        )
        return [e.get("transition") or e.get("status") for e in events]

    def notifications(self) -> list[dict[str, Any]]:
        """Messages published to the topic so far (drained from its inbox queue)."""
        sqs = self.client("sqs")
        out = []
        while True:
            batch = sqs.receive_message(QueueUrl=self._inbox, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not batch:
                break
            for message in batch:
                envelope = json.loads(message["Body"])
                out.append({"subject": envelope.get("Subject"), "message": envelope.get("Message")})
                sqs.delete_message(QueueUrl=self._inbox, ReceiptHandle=message["ReceiptHandle"])
        self._seen_notifications = getattr(self, "_seen_notifications", []) + out
        return list(self._seen_notifications)

    def publish(self, alarm: Any, *, spool_dir: str) -> None:
        """Publish an ``sdc_agent.Alarm`` with the agent's real CloudWatch publisher, as the
        training job's DP rank 0 would, and wait until it is delivered."""
        from sdc_agent.publish import CloudWatchPublisher

        publisher = CloudWatchPublisher(
            cluster_name=self.cluster.hyperpod_name,
            job_name=self.cluster.job,
            namespace=self.context.get("namespace", "SDC"),
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

    def cli_env(self) -> dict[str, str]:
        """Environment for the operator CLI against the embedded AWS, for a CLI run in its own
        process (in this one, pass :meth:`cli_options` instead: os.environ is shared)."""
        return {
            **self.aws_env,
            "SDC_APPROVAL_URL": self.approval_url,
            "SDC_LEDGER_TABLE": self.tables["ledger"],
        }

    def cli_options(self) -> list[str]:
        """The operator CLI's options for this pipeline (its AWS settings are already in this
        process's environment): decisions go through the approve function's URL, as an
        operator's do; ``history`` reads the ledger. No approvals table: an operator has no
        access to it (its task tokens)."""
        return ["--approval-url", self.approval_url, "--ledger-table", self.tables["ledger"]]


@contextlib.contextmanager
def running(
    cluster: Cluster, context: dict[str, Any] | None = None, **kwargs: Any
) -> Iterator[LocalPipeline]:
    """``with running(cluster) as pipeline:`` — a LocalPipeline started and stopped."""
    with LocalPipeline(cluster, context, **kwargs) as pipeline:
        yield pipeline
