"""StartClusterHealthCheck and BatchReplaceClusterNodes are not idempotent: each is sent once, and
an answer that is lost (timeout, closed connection, 5xx) is settled by describing the node.

The Stubber answers before botocore's retry loop, so these tests answer at ``before-send``
instead: the code's real client, its real retry policy, no network.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import botocore.exceptions
import pytest
from botocore.awsrequest import AWSResponse
from remediation_factories import approved, item_state

from sdc_remediation import aws
from sdc_remediation.errors import AwsApiUnavailable

INSTANCE = "i-0123456789abcdef0"


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _response(request: Any, status: int, body: dict[str, Any]) -> AWSResponse:
    headers = {"x-amzn-RequestId": "r-1", "Content-Type": "application/x-amz-json-1.1"}
    return AWSResponse(request.url, status, headers, _Raw(json.dumps(body).encode()))


def _node(status: str) -> dict[str, Any]:
    return {
        "NodeDetails": {
            "InstanceGroupName": "workers",
            "InstanceId": INSTANCE,
            "InstanceStatus": {"Status": status, "Message": ""},
        }
    }


class SageMakerWire:
    """Answers the code's SageMaker client on the wire: scripted statuses, lost actions."""

    def __init__(self, statuses: list[str]) -> None:
        self.statuses = statuses  # DescribeClusterNode answers, in order (the last repeats)
        self.sent: Counter[str] = Counter()
        self.action: Callable[[Any], AWSResponse] = self._lost

    @staticmethod
    def _lost(request: Any) -> AWSResponse:
        # The request left; its answer never came back.
        raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)

    def __call__(self, request: Any, **kwargs: Any) -> AWSResponse:
        operation = request.headers.get("X-Amz-Target", b"")
        operation = operation.decode() if isinstance(operation, bytes) else operation
        name = operation.rsplit(".", 1)[-1]
        self.sent[name] += 1
        if name == "DescribeClusterNode":
            status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            if status == "gone":
                return _response(
                    request, 400, {"__type": "ResourceNotFound", "message": "no such node"}
                )
            return _response(request, 200, _node(status))
        return self.action(request)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], SageMakerWire]]:
    # No moto here: every request is answered by the hook, nothing reaches a network.
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", "https://sagemaker.invalid")
    aws.reset_clients()
    hooks: list[SageMakerWire] = []

    def install(statuses: list[str]) -> SageMakerWire:
        hook = SageMakerWire(statuses)
        aws.client("sagemaker").meta.events.register_first("before-send.sagemaker", hook)
        hooks.append(hook)
        return hook

    yield install
    aws.reset_clients()


def test_a_lost_start_health_check_answer_is_sent_once_and_settled_as_started(wire, invoke):
    # Given a running instance whose StartClusterHealthCheck answer is lost, and HyperPod then
    # shows the check running (the request did arrive)
    sm = wire(["Running", "DeepHealthCheckInProgress"])

    # When
    out = invoke("start_health_check", item_state(INSTANCE))

    # Then: the call left exactly once, and the step reports the check as started
    assert sm.sent["StartClusterHealthCheck"] == 1
    assert out["status"] == "in_progress"
    assert out["seen_in_progress"] is True


def test_a_lost_start_health_check_answer_with_no_check_running_is_transient(wire, invoke):
    # Given the answer is lost and HyperPod shows no check (the request never arrived)
    sm = wire(["Running"])

    # When / Then: retried by the workflow (AwsApiUnavailable), never re-sent by botocore
    with pytest.raises(AwsApiUnavailable):
        invoke("start_health_check", item_state(INSTANCE))
    assert sm.sent["StartClusterHealthCheck"] == 1


def test_a_start_health_check_answered_5xx_is_sent_once(wire, invoke):
    # Given HyperPod answers 500 (it may or may not have acted) and shows no check afterwards
    sm = wire(["Running"])
    sm.action = lambda request: _response(
        request, 500, {"__type": "InternalFailure", "message": "boom"}
    )

    # When / Then
    with pytest.raises(AwsApiUnavailable):
        invoke("start_health_check", item_state(INSTANCE))
    assert sm.sent["StartClusterHealthCheck"] == 1


@pytest.mark.parametrize("after", ["ShuttingDown", "gone"])
def test_a_lost_replace_answer_is_settled_as_replaced_when_the_instance_is_leaving(
    cloud, wire, invoke, after
):
    # Given an approved suspect (its decision in the approvals table: moto) whose
    # BatchReplaceClusterNodes answer is lost, and HyperPod then
    # shows the instance shutting down (or no longer in the cluster)
    sm = wire(["Running", after])

    # When
    out = invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))

    # Then: sent once, recorded as requested (not failed)
    assert sm.sent["BatchReplaceClusterNodes"] == 1
    assert out["requested"] is True
    assert "already leaving" in out["detail"]


def test_a_lost_replace_answer_with_the_instance_still_running_is_transient(cloud, wire, invoke):
    # Given the answer is lost and the instance still runs
    sm = wire(["Running"])

    # When / Then: the workflow retries the step, which describes the node before sending again
    with pytest.raises(AwsApiUnavailable):
        invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))
    assert sm.sent["BatchReplaceClusterNodes"] == 1
