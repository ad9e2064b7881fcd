"""Where moto's Lambda invokes go in this process, and how a function error looks on the wire.

moto's Step Functions executor invokes a task's function through ``LambdaSimpleBackend.invoke``;
patched, the invoke reaches a Python callable instead of a container. Both the workflow tests
(tests/infra/workflow_harness.py: stand-in steps) and the end-to-end runtime
(tests/e2e/harness/runtime.py: the real handlers) route invokes here, and both report an
exception as the Python runtime does: a function error whose ``errorType`` is the exception's
class name, which is what the workflow's Retry/Catch match.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from moto.awslambda_simple.models import LambdaSimpleBackend

SyncInvoke = Callable[[str, Any, dict[str, str]], bytes]
"""(function name or ARN, JSON body, response headers to set) -> the response payload."""
EventInvoke = Callable[[str, Any], bytes]
"""(function name or ARN, JSON body) -> the (empty) answer to a queued invoke."""


@contextlib.contextmanager
def route_invokes(invoke: SyncInvoke, invoke_event: EventInvoke | None = None) -> Iterator[None]:
    """Route moto's Lambda invokes to ``invoke`` for the block; ``InvocationType=Event`` ones to
    ``invoke_event`` when given (else to ``invoke``, as if the caller waited)."""

    def patched(
        backend: LambdaSimpleBackend,
        function_name: str,
        qualifier: Any,
        body: Any,
        headers: Any,
        response_headers: dict[str, str],
    ) -> bytes:
        if invoke_event is not None and headers.get("X-Amz-Invocation-Type") == "Event":
            return invoke_event(function_name, body)
        return invoke(function_name, body, response_headers)

    with mock.patch.object(LambdaSimpleBackend, "invoke", patched):
        yield


def function_error(response_headers: dict[str, str], error_type: str, message: str) -> bytes:
    """Mark the response a function error and return its payload, as the Python runtime writes
    an unhandled exception's."""
    response_headers["x-amz-function-error"] = "Unhandled"
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()
