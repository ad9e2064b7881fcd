"""The CLI's side of the approve function: SigV4-signed requests to its function URL.

The URL is the stack output ``ApprovalUrl`` (``--approval-url`` or ``SDC_APPROVAL_URL``). Each
request is signed with the caller's AWS credentials for the service ``lambda`` (botocore's
``SigV4Auth``); Lambda authenticates the signature and hands the function the caller's ARN,
which is what the workflow and the ledger record. The body never names the approver.

``send`` is the one place that talks HTTP; ``function_url_event`` builds the event Lambda would
give the function for a signed request, so a local stand-in (the end-to-end harness) can serve
the CLI's requests with the real handler.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest

from .. import aws, errors
from ..config import check_approval_url
from ..errors import AwsApiUnavailable, ConfigurationError, NoCredentials, RemediationError

_URL_REGION = re.compile(r"\.lambda-url\.([a-z0-9-]+)\.on\.aws$")
TIMEOUT = urllib3.Timeout(connect=10.0, read=60.0)


class ApprovalServiceError(RemediationError):
    """The approve function answered with an error this CLI does not know by name."""


def _send(request: AWSPreparedRequest) -> tuple[int, bytes]:
    """POST the signed request; (HTTP status, body). Only network failures raise."""
    http = urllib3.PoolManager(timeout=TIMEOUT, retries=False)
    response = http.request(
        request.method, request.url, body=request.body, headers=dict(request.headers)
    )
    return response.status, response.data


Transport = Callable[[AWSPreparedRequest], tuple[int, bytes]]


class ApprovalService:
    """Calls the approve function's URL as the caller's IAM identity."""

    def __init__(self, url: str, *, region: str | None = None, send: Transport | None = None):
        check_approval_url(url)
        host = urlsplit(url).hostname or ""
        self.url = url
        match = _URL_REGION.search(host)
        self.region = (match.group(1) if match else None) or region or aws.session().region_name
        if not self.region:
            raise ConfigurationError("the approval URL's region is unknown: pass --region")
        self._send = send

    def sign(self, body: dict[str, Any]) -> AWSPreparedRequest:
        """The request, signed with the caller's credentials for the service ``lambda``."""
        credentials = aws.session().get_credentials()
        if credentials is None:
            raise NoCredentials(
                "no AWS credentials found (configure a profile, SSO login or AWS_* variables)"
            )
        request = AWSRequest(
            method="POST",
            url=self.url,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        SigV4Auth(credentials.get_frozen_credentials(), "lambda", self.region).add_auth(request)
        return request.prepare()

    def call(self, action: str, **fields: Any) -> dict[str, Any]:
        """Send one request; the JSON result, or the function's error raised by its class."""
        request = self.sign({"action": action, **fields})
        send = self._send or _send
        try:
            status, raw = send(request)
        except urllib3.exceptions.HTTPError as exc:
            raise AwsApiUnavailable(
                f"the approval URL could not be reached or did not answer ({type(exc).__name__}); "
                "repeating the same command is safe"
            ) from exc
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"message": raw[:200].decode(errors="replace")}
        if status == 200:
            return body
        name = str(body.get("error") or "")
        message = str(body.get("message") or body.get("Message") or raw[:200])
        if status == 403 and not name:
            raise ConfigurationError(
                f"the approval URL refused your credentials ({message}): attach the stack's "
                "operator policy (OperatorPolicyArn) to your role"
            )
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, RemediationError)):
            cls = ApprovalServiceError
            message = f"{name or status}: {message}"
        raise cls(message)


def function_url_event(request: AWSPreparedRequest, caller_arn: str) -> dict[str, Any]:
    """The payload-2.0 event Lambda gives the function for ``request``, once it authenticated
    the signature as ``caller_arn`` (for local stand-ins of the function URL)."""
    parts = urlsplit(request.url)
    body = request.body
    if isinstance(body, bytes):
        body = body.decode()
    return {
        "version": "2.0",
        "rawPath": parts.path or "/",
        "rawQueryString": parts.query,
        "headers": {k.lower(): v for k, v in request.headers.items()},
        "requestContext": {
            "http": {"method": request.method, "path": parts.path or "/"},
            "authorizer": {"iam": {"userArn": caller_arn}},
        },
        "body": body or "",
        "isBase64Encoded": False,
    }
