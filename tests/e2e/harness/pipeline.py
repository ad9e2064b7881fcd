"""The whole remediation pipeline on embedded stand-ins, built from the synthesized CDK template.

What is ours runs for real: the CloudFormation template `cdk synth` produces (its state machine
definition, its Lambda handler strings and environment, its tables, topic, alarms and event
rule), the Lambda handler code, and the operator CLI. What AWS and Kubernetes would provide is
stood in for:
- AWS: a moto server on 127.0.0.1 (one process, threads), so training processes can publish to it
  through ``AWS_ENDPOINT_URL`` like they would to CloudWatch. Its Step Functions executor runs the
  real definition; each Lambda invoke runs the real handler of that folder, with that function's
  environment from the template, on the Lambda runtime both drivers share
  (:class:`~.runtime.LambdaRuntime`: the only adapter, documented there). Handlers learn nothing
  but endpoints: AWS_ENDPOINT_URL and K8S_API_ENDPOINT / K8S_API_CA_DATA, their documented
  endpoint configuration.

- HyperPod: :class:`HyperPodSimulator` (moto lacks StartClusterHealthCheck and
  BatchReplaceClusterNodes).
- Kubernetes: the loopback HTTPS API stand-in of tests/support.
- CloudWatch alarm evaluation + EventBridge delivery: :class:`LocalAlarmEvaluator`.
- The approve function's URL (AWS_IAM auth): :class:`FunctionUrlStandIn` on a loopback address.
  The operator CLI decides through it as it would in an account (SigV4-signed, the approver the
  principal STS names for the signing key); see that module for what it does and does not prove.
What this cannot prove: IAM (every call is allowed), KMS, Lambda packaging and cold starts,
real service latencies and eventual consistency, and EventBridge/Step Functions quotas.

The process environment is written only while no thread of the pipeline runs (runtime.py says
why): once at start (the endpoint, fake credentials, the Powertools settings every function
shares) and once at exit, after every execution was stopped and every invocation returned. What
differs per function (its template environment) reaches its handler through
``sdc_remediation.config.environment``, never through ``os.environ``. Driving the workflow and
reading what it did is :class:`~.driver.Driver`, shared with the deployed rehearsal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.credentials import Credentials
from moto.server import ThreadedMotoServer

from infra.app import synthesize_template
from infra.template import function_logical_ids, state_machine_definition
from tests.e2e.harness.kube_jobs import JobsStandIn

from .account import (
    ACCOUNT,
    REGION,
    Cluster,
    create_cluster,
    embedded_aws_environment,
    reset_embedded_aws,
)
from .alarms import AlarmSpec, LocalAlarmEvaluator
from .driver import Driver
from .hyperpod import HyperPodSimulator
from .runtime import Function, process_environment, shared_runtime_env

_TEMPLATES: dict[str, dict[str, Any]] = {}


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
            # The late nodes' Map has its own copy of the chain ("LateRequestApproval").
            if approval_timeout_seconds and name.endswith("RequestApproval"):
                state["TimeoutSeconds"] = approval_timeout_seconds
            if retry_interval_seconds:
                for retry in state.get("Retry", []):
                    retry["IntervalSeconds"] = retry_interval_seconds
                    retry["BackoffRate"] = 1.0
            for nested in ("ItemProcessor", "Iterator"):
                if nested in state:
                    visit(state[nested]["States"])
            for branch in state.get("Branches", []):
                visit(branch["States"])

    visit(definition["States"])
    return definition


class LocalPipeline(Driver):
    """Start with ``with LocalPipeline(cluster, context) as pipeline:``.

    ``context`` is CDK context (as in cdk.json) that overrides the example configuration; the
    cluster names are taken from ``cluster``.
    """

    closed_error = "LocalPipelineClosed"

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
        super().__init__(cluster, quiet_handlers=quiet_handlers)
        self.context = {
            "hyperPodClusterName": cluster.hyperpod_name,
            "eksClusterName": cluster.eks_name,
            "healthCheckPollInterval": "1s",
            **(context or {}),
        }
        self.namespace = self.context.get("namespace", "SDC")
        self.health_check_outcome = health_check_outcome
        self.automatic_node_recovery = automatic_node_recovery
        self.health_check_seconds = health_check_seconds
        self.approval_timeout_seconds = approval_timeout_seconds
        self.retry_interval_seconds = retry_interval_seconds
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self._physical: dict[str, str] = {}
        self._arns: dict[str, str] = {}
        self._urls: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self.template = template_for(self.context)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        # moto's ASL interpreter evaluates a Choice's IsPresent by catching the path lookup's
        # exception and logs it as an ERROR ("NoSuchJsonPathError ... $.refused[0]") although the
        # choice then goes the right way, as AWS's does; an execution's real failures are in its
        # history, which the driver reads.
        logging.getLogger("moto.stepfunctions.parser.asl.component.eval_component").setLevel(
            logging.CRITICAL
        )
        runtime_env = self._shared_runtime_env()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            self.endpoint = f"http://{host}:{port}"
            self.aws_env = embedded_aws_environment(self.endpoint, int(port))
            # The one write at start: the server thread only waits for connections until the
            # first request below, and nothing else of this pipeline runs yet.
            self._exit.enter_context(process_environment({**self.aws_env, **runtime_env}))
        finally:
            # Registered after the environment, so unwound before it: the server has stopped
            # when the environment is put back.
            self._exit.callback(server.stop)
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
        self.kube = self._exit.enter_context(JobsStandIn())
        self.hyperpod = HyperPodSimulator(
            self.kube,
            account_id=ACCOUNT,
            region=REGION,
            health_check_seconds=self.health_check_seconds,
            health_check_outcome=self.health_check_outcome,  # type: ignore[arg-type]
            automatic_node_recovery=self.automatic_node_recovery,
        ).install()
        self._exit.callback(self.hyperpod.uninstall)
        self._create_cluster()
        self._create_resources()
        # Served before the functions' environments are resolved: request_approval's names it.
        # A function's name is its folder here (what the runtime dispatches on).
        self._serve_approval_url("approve")
        for logical_id in self._resources("AWS::Lambda::Url"):
            self._urls[logical_id] = self.approval_url
        self._start_runtime(self._template_functions())
        self._create_state_machine()
        self._create_evaluator()
        self._close_on_exit()

    @property
    def aws_environment(self) -> dict[str, str]:
        """The embedded AWS's endpoint and test credentials."""
        return self.aws_env

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
            if fn == "Fn::GetAtt" and arg[1] == "FunctionUrl" and arg[0] in self._urls:
                return self._urls[arg[0]]  # the URL's stand-in
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
        logs = self.client("logs")
        for logical_id, group in self._resources("AWS::Logs::LogGroup").items():
            # The groups the stack names (the agent's report group, /sdc/<cluster>): nobody else
            # may create them, so the local pipeline does, as the deploy would (with their
            # retention; the key is the deploy's business, not the workflow's).
            props = group["Properties"]
            if "LogGroupName" not in props:
                continue
            name = self.resolve(props["LogGroupName"])
            logs.create_log_group(logGroupName=name)
            if "RetentionInDays" in props:
                logs.put_retention_policy(
                    logGroupName=name, retentionInDays=int(props["RetentionInDays"])
                )
            self._physical[logical_id] = name
            self._arns[logical_id] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}"
        for logical_id in self._resources("AWS::SNS::Topic"):
            arn = self.client("sns").create_topic(Name=f"{logical_id}-local")["TopicArn"]
            self._physical[logical_id] = self._arns[logical_id] = arn
            self._subscribe_inbox(arn, f"{logical_id}-inbox")
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
        for logical_id in self._resources("AWS::IAM::Role"):
            # A role's name (approve is told request_approval's); the functions here run as the
            # embedded AWS's own credentials, never as these roles.
            self._physical[logical_id] = f"{logical_id}-local"
        for folder, logical_id in function_logical_ids(self.template).items():
            # A function's name is its folder here (what the runtime dispatches on).
            self._physical[logical_id] = folder
            self._arns[logical_id] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{folder}"

    def _template_functions(self) -> dict[str, Function]:
        """Each function of the template as the runtime runs it: named by its folder, with its
        template environment resolved, plus the Kubernetes stand-in's endpoint."""
        functions = self._resources("AWS::Lambda::Function")
        out = {}
        for folder, logical_id in function_logical_ids(self.template).items():
            props = functions[logical_id]["Properties"]
            variables = props.get("Environment", {}).get("Variables", {})
            env = {k: str(self.resolve(v)) for k, v in variables.items()}
            env.update(K8S_API_ENDPOINT=self.kube.url, K8S_API_CA_DATA=self.kube.ca_b64)
            out[folder] = Function(
                name=folder,
                arn=self._arns[logical_id],
                handler=props["Handler"],
                environment=env,
            )
        return out

    def _create_state_machine(self) -> None:
        arns = {
            folder: self._arns[logical_id]
            for folder, logical_id in function_logical_ids(self.template).items()
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
        specs = []
        for alarm in self._resources("AWS::CloudWatch::Alarm").values():
            raw = alarm["Properties"]
            if not AlarmSpec.is_evaluated(raw, self.namespace):
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

    def add_credentials(self, credentials: Credentials) -> None:
        """Let the embedded AWS authenticate requests signed with ``credentials`` (what IAM knows
        of a key: its secret). The process's own test credentials are known from the start."""
        self.approvals.add_credentials(credentials)

    # ------------------------------------------------------------------ driving and reading
    def invoke(self, folder: str, payload: Any) -> Any:
        """Invoke a function of the template as its trigger would (a schedule, an alarm
        action), through the same runtime the workflow's invokes take; returns its result, and
        raises RuntimeError with the function's error."""
        assert self.runtime is not None
        return self.runtime.call(folder, payload)

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


@contextlib.contextmanager
def running(
    cluster: Cluster, context: dict[str, Any] | None = None, **kwargs: Any
) -> Iterator[LocalPipeline]:
    """``with running(cluster) as pipeline:`` — a LocalPipeline started and stopped."""
    with LocalPipeline(cluster, context, **kwargs) as pipeline:
        yield pipeline
