"""Which AWS failures are retried, and the jittered backoff between tries."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from sdc_agent.publish import RetryPolicy
from sdc_agent.publish.retry import backoff_delay, is_transient


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutMetricData",
    )


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        NoCredentialsError(),
        client_error("Throttling", 400),
        client_error("ThrottlingException", 400),
        client_error("InternalFailure", 500),
        client_error("Whatever", 503),
    ],
)
def test_network_throttling_and_server_errors_are_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        client_error("AccessDeniedException", 400),
        client_error("InvalidParameterValue", 400),
        client_error("ResourceNotFoundException", 400),
        ValueError("bug"),
    ],
)
def test_refusals_and_bugs_are_not(exc):
    assert not is_transient(exc)


def test_backoff_grows_exponentially_under_a_cap_with_full_jitter():
    policy = RetryPolicy(attempts=8, base_delay=0.5, max_delay=4.0)
    rng = random.Random(7)
    for index, cap in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        delays = [backoff_delay(policy, index, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > cap * 0.8  # jitter covers the range, not a constant
        assert min(delays) < cap * 0.2
