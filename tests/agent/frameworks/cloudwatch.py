"""The CloudWatch stand-in of the integration tests: a moto server in the test process, which
every rank's CloudWatchPublisher() reaches through AWS_ENDPOINT_URL."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.agent.test_publish_cloudwatch import REGION, metric_sum, stream_messages

CLUSTER = "integrations"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto's backends are per process, not per server: a server started by another test file
    # of this run kept its metrics (the cluster series every framework's job adds to). Start
    # each file from an empty account.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
    yield endpoint
    server.stop()


def published(endpoint: str, job: str) -> dict[str, Any]:
    """What the job's publisher delivered: the alarm reports of its log stream, and the
    cluster series and liveness sums of the metrics."""
    logs = boto3.client("logs", region_name=REGION, endpoint_url=endpoint)
    cloudwatch = boto3.client("cloudwatch", region_name=REGION, endpoint_url=endpoint)
    messages = stream_messages(logs, f"/sdc/{CLUSTER}", job)
    reports = [m for m in messages if m["schema"] == "sdc.alarm/v1"]
    return {
        "reports": reports,
        "metric": lambda name, **dims: metric_sum(
            cloudwatch, name, {"ClusterName": CLUSTER, **dims}
        ),
    }
