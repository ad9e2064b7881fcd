"""Lazily built boto3 clients and the one place AWS errors become typed errors.

Clients are created on first use and cached per process (a warm Lambda reuses them), never at
import, so moto and botocore's Stubber can attach in tests. They are built with boto3's standard
configuration chain, so AWS_REGION, AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> apply.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions
import botocore.loaders
import botocore.session
from botocore.config import Config

from .errors import AwsApiUnavailable, ConfigurationError

_CONFIG = Config(
    # Standard mode retries throttling and 5xx a few times with backoff before we see them;
    # what still fails becomes AwsApiUnavailable and the workflow retries the whole step.
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=5,
    read_timeout=20,
)

# Services called with ONE attempt per call. SendTaskSuccess may have resumed the workflow when
# its answer is lost (read timeout, closed connection); botocore's retry would then send it again
# and report the second attempt's TaskTimedOut as if the decision had never arrived. With one
# attempt the caller sees the ambiguity and can say so (approvals.py, status "sending").
# SageMaker likewise: StartClusterHealthCheck and BatchReplaceClusterNodes are not idempotent,
# and a client's retry policy is per client, not per call; its reads (DescribeClusterNode,
# ListClusterNodes) then fail as AwsApiUnavailable at once and the workflow retries the step.
_SINGLE_ATTEMPT_SERVICES = {"stepfunctions", "sagemaker"}
_SINGLE_ATTEMPT_CONFIG = _CONFIG.merge(
    Config(retries={"mode": "standard", "total_max_attempts": 1})
)

_clients: dict[tuple[str, str | None], Any] = {}
_region: contextvars.ContextVar[str | None] = contextvars.ContextVar("region", default=None)
"""A region chosen by the caller (the CLI's ``--region``), for this thread/context only: never
written to os.environ, which every thread of the process shares."""
# Parsed service models are shared by every session this process creates: parsing the JSON
# models is most of the cost of a new client, and they never change within a process.
_loader = botocore.loaders.create_loader()

_TRANSIENT_CODES = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "ProvisionedThroughputExceededException",
    "RequestThrottled",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalFailure",
    "InternalServerError",
    "InternalError",
    "LimitExceededException",
}
DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}
"""Error codes of a request the caller's IAM policy does not allow."""


def client(service: str) -> Any:
    """The process-wide boto3 client for ``service`` (in the region :func:`region` chose, if
    any), created on first use."""
    key = (service, _region.get())
    if key not in _clients:
        config = _SINGLE_ATTEMPT_CONFIG if service in _SINGLE_ATTEMPT_SERVICES else _CONFIG
        _clients[key] = session().client(service, config=config)
    return _clients[key]


def session() -> boto3.session.Session:
    """A new boto3 session (fresh credential chain) sharing the parsed service models."""
    core = botocore.session.get_session()
    core.register_component("data_loader", _loader)
    # botocore reads AWS_DEFAULT_REGION; Lambda also sets AWS_REGION, and so do most harnesses.
    region = _region.get() or (
        None if os.environ.get("AWS_DEFAULT_REGION") else os.environ.get("AWS_REGION")
    )
    return boto3.session.Session(botocore_session=core, region_name=region or None)


@contextlib.contextmanager
def region(name: str | None) -> Iterator[None]:
    """Clients and sessions made in this block (this context only) use region ``name``; None
    leaves the standard configuration chain alone."""
    token = _region.set(name or _region.get())
    try:
        yield
    finally:
        _region.reset(token)


def reset_clients() -> None:
    """Forget cached clients (tests switch moto contexts and environments between cases)."""
    _clients.clear()


def error_code(exc: botocore.exceptions.ClientError) -> str:
    """The AWS error code of a ClientError ('' when absent)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Translate throttling/5xx/network errors into ``AwsApiUnavailable``, denials into
    ``ConfigurationError``; any other ClientError propagates for the caller to interpret.

    ``what`` names the call in the message, e.g. "sagemaker:DescribeClusterNode".
    """
    try:
        yield
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _TRANSIENT_CODES or status >= 500:
            raise AwsApiUnavailable(f"{what} failed transiently ({code or status}): {exc}") from exc
        if code in DENIED_CODES:
            raise ConfigurationError(
                f"{what} was denied; check the function's IAM policy: {exc}"
            ) from exc
        raise
    except botocore.exceptions.NoCredentialsError as exc:
        raise ConfigurationError(f"{what}: no AWS credentials available") from exc
    except (
        botocore.exceptions.ConnectionError,
        botocore.exceptions.HTTPClientError,
    ) as exc:
        raise AwsApiUnavailable(f"{what} could not reach AWS: {exc}") from exc
