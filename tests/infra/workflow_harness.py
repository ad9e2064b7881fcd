"""Run the synthesized state machine on moto's Step Functions executor with stand-in steps.

The definition comes from the template exactly as CloudFormation would receive it; only its
references are resolved (function ARNs, partition) by `infra.template`, the helper the
end-to-end harness uses too. Each Lambda invoke is dispatched to a Python
callable (tests/support/moto_lambda.py, as the end-to-end runtime's are); an exception raised
there becomes a Lambda function error whose `errorType` is the exception's class name, as the
Python runtime reports it, so Retry/Catch see the same names.
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
from moto import mock_aws

from infra.template import function_logical_ids, state_machine_definition
from tests.support.moto_lambda import function_error, route_invokes

REGION = "us-east-1"
Handler = Callable[[dict[str, Any]], Any]


@dataclass
class Run:
    """What one execution did: the calls each step received, in order."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def inputs(self, folder: str) -> list[dict[str, Any]]:
        """The payloads `folder` was invoked with."""
        return [payload for name, payload in self.calls if name == folder]

    def transitions(self) -> list[str]:
        """The transitions the record step was asked to record, in order."""
        return [payload["transition"] for payload in self.inputs("record")]


class UnhandledStepError(Exception):
    """Raised by the dispatcher for a step the scenario did not expect."""


@contextmanager
def workflow(
    template: dict[str, Any],
    handlers: dict[str, Handler],
    *,
    patch_definition: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[tuple[Any, str, Run]]:
    """Deploy the template's state machine on moto; yield (stepfunctions client, ARN, run).

    `handlers` maps a step folder to a callable(payload) -> result. `record` defaults to a
    stand-in that returns {"recorded": true}. `patch_definition` may edit the parsed ASL (only
    to shorten waits that would make a test slow).
    """
    run = Run()
    handlers = {"record": lambda payload: {"recorded": True}, **handlers}

    def invoke(function_name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        folder = function_name.rsplit(":", 1)[-1]
        payload = json.loads(body) if body else {}
        with run.lock:
            run.calls.append((folder, payload))
            if "task_token" in payload:
                run.tokens.append(payload["task_token"])
        try:
            handler = handlers.get(folder)
            if handler is None:
                raise UnhandledStepError(f"step {folder} was not expected in this scenario")
            return json.dumps(handler(payload)).encode()
        except Exception as error:
            return function_error(response_headers, type(error).__name__, str(error))

    config = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
    with mock_aws(config=config), route_invokes(invoke):
        iam = boto3.client("iam", region_name=REGION)
        role = iam.create_role(RoleName="sdc-test", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lambda_client = boto3.client("lambda", region_name=REGION)
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as archive:
            archive.writestr("handler.py", "def handler(event, context):\n    return event\n")
        arns = {
            folder: lambda_client.create_function(
                FunctionName=folder,
                Runtime="python3.12",
                Role=role,
                Handler=f"{folder}.handler.handler",
                Code={"ZipFile": code.getvalue()},
            )["FunctionArn"]
            for folder in function_logical_ids(template)
        }
        definition = state_machine_definition(template, arns)
        if patch_definition is not None:
            parsed = json.loads(definition)
            patch_definition(parsed)
            definition = json.dumps(parsed)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        machine = sfn.create_state_machine(name="sdc-test", definition=definition, roleArn=role)[
            "stateMachineArn"
        ]
        yield sfn, machine, run


def start(sfn: Any, machine: str, event: dict[str, Any], name: str) -> str:
    """Start an execution (always named: moto names unnamed ones "None")."""
    return sfn.start_execution(stateMachineArn=machine, name=name, input=json.dumps(event))[
        "executionArn"
    ]


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll until `condition()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the workflow")
        time.sleep(0.05)


def finish(sfn: Any, execution: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait for the execution to end; return describe_execution's answer."""
    wait_for(lambda: sfn.describe_execution(executionArn=execution)["status"] != "RUNNING", timeout)
    return sfn.describe_execution(executionArn=execution)
