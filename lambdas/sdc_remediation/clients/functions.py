"""Lambda: invoking another of this stack's functions (request_approval asks the approve
function to settle the canary's approval)."""

from __future__ import annotations

import json
from typing import Any

from .. import aws


def invoke_event(function: str, payload: dict[str, Any]) -> int:
    """Invoke ``function`` asynchronously (``InvocationType=Event``) with ``payload``; returns
    the status Lambda answered (202: queued)."""
    with aws.aws_errors("lambda:InvokeFunction"):
        resp = aws.client("lambda").invoke(
            FunctionName=function, InvocationType="Event", Payload=json.dumps(payload).encode()
        )
    return int(resp.get("StatusCode", 0))


__all__ = ["invoke_event"]
