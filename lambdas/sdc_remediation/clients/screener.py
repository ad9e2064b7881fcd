"""The idle screener function, invoked by the operator CLI (``sdc-remediation screen NODE``):
one synchronous Lambda Invoke with ``{"action": "screen", "node": N}``, its answer parsed."""

from __future__ import annotations

import json
from typing import Any

from .. import aws
from ..errors import InvalidStepInput


class ScreenerError(InvalidStepInput):
    """The screener function answered with an error (its type and message)."""


def screen_node(function_name: str, node_name: str) -> dict[str, Any]:
    """Ask the screener function ``function_name`` to screen ``node_name`` now: its answer
    (``{node, job}``), or ``ScreenerError`` carrying the function's own error (a refusal
    names why: the node is cordoned, runs a training pod, already has a screen)."""
    payload = json.dumps({"action": "screen", "node": node_name}).encode()
    with aws.aws_errors("lambda:Invoke"):
        resp = aws.client("lambda").invoke(
            FunctionName=function_name, InvocationType="RequestResponse", Payload=payload
        )
    body = resp["Payload"].read()
    try:
        answer = json.loads(body or b"null")
    except ValueError:
        raise ScreenerError(
            f"the screener answered something that is not JSON: {body[:200]!r}"
        ) from None
    if resp.get("FunctionError"):
        kind = answer.get("errorType", "Error") if isinstance(answer, dict) else "Error"
        message = answer.get("errorMessage", "") if isinstance(answer, dict) else str(answer)
        raise ScreenerError(f"{kind}: {str(message)[:500]}")
    if not isinstance(answer, dict):
        raise ScreenerError(f"the screener answered {str(answer)[:200]!r}, not an object")
    return answer


__all__ = ["ScreenerError", "screen_node"]
