"""``sdc-remediation screen NODE``: one synchronous Invoke of the idle screener with the
``screen`` action, its answer printed, its refusal a one-line error and exit 1. Lambda Invoke
through botocore's Stubber: moto runs a function's code only in Docker."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from click.testing import CliRunner

from sdc_remediation import aws
from sdc_remediation.cli.commands import main

FUNCTION = "sdc-guard-screen-idle"
NODE = "hyperpod-i-00000000000000001"


def body(value: object) -> StreamingBody:
    raw = json.dumps(value).encode()
    return StreamingBody(io.BytesIO(raw), len(raw))


@pytest.fixture
def lam(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws.reset_clients()
    with Stubber(aws.client("lambda")) as stub:
        yield stub
    aws.reset_clients()


def expected() -> dict[str, object]:
    payload = json.dumps({"action": "screen", "node": NODE}).encode()
    return {"FunctionName": FUNCTION, "InvocationType": "RequestResponse", "Payload": payload}


def test_screen_invokes_the_screener_and_prints_the_job(lam):
    # Given a screener that starts the screen
    lam.add_response(
        "invoke", {"StatusCode": 200, "Payload": body({"node": NODE, "job": "sdc-screen-idle-1"})},
        expected(),
    )  # fmt: skip
    # When the operator asks for a screen
    result = CliRunner().invoke(main, ["screen", NODE, "--function", FUNCTION])
    # Then the request carried the screen action and the answer names the Job
    assert result.exit_code == 0, result.output
    assert "screening hyperpod-i-00000000000000001: job sdc-screen-idle-1" in result.output
    lam.assert_no_pending_responses()


def test_a_refusal_is_one_line_and_exit_1(lam):
    refusal = {
        "errorType": "ScreenRefused",
        "errorMessage": f"not screening: node {NODE} runs training pod(s) default/trainer-0",
    }
    lam.add_response(
        "invoke",
        {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": body(refusal)},
        expected(),
    )
    result = CliRunner().invoke(main, ["screen", NODE, "--function", FUNCTION])
    assert result.exit_code == 1
    assert "ScreenRefused: not screening" in result.output and "training pod" in result.output
    assert "Traceback" not in result.output


def test_the_function_is_required():
    result = CliRunner().invoke(main, ["screen", NODE], env={"SDC_SCREENER_FUNCTION": ""})
    assert result.exit_code != 0 and "--function" in result.output
