"""A real 6-process gloo DDP job with an injected fault publishes exactly one alarm report.

Every rank builds a CloudWatchPublisher (as docs/agent-install.md says to); the guard calls it
from DP rank 0 only. The CloudWatch stand-in is a moto server in this test process.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
import pytest
import torch.distributed as dist
from moto.server import ThreadedMotoServer

from sdc_agent.drills.job import build, make_batch, make_fault
from sdc_agent.drills.launch import launch, node_name
from sdc_agent.publish import CloudWatchPublisher
from tests.agent.test_publish_cloudwatch import (  # noqa: F401  (aws_env is an autouse fixture)
    REGION,
    aws_env,
    metric_sum,
    stream_messages,
)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 480


FAULTY = 3
SCHEDULE = {"audit_every": 5, "check_every": 0, "ckpt_every": 0, "peer_offset": 2}


def publishing_job(*, endpoint: str, spool_root: str, steps: int) -> dict[str, Any]:
    """Runs on every rank: train under the guard with the CloudWatch publisher, then flush."""
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        SDC_CLUSTER_NAME="ddp-cluster",
        SDC_JOB_NAME="ddp-job",
        SDC_SPOOL_DIR=os.path.join(spool_root, f"rank{dist.get_rank()}"),
    )
    publisher = CloudWatchPublisher()
    _, _, guard = build(SCHEDULE, publisher=publisher)
    fault = {"kind": "ScaleOutputElement", "layer": "net.4", "factor": 1000.0}
    make_fault({**fault, "rank": FAULTY, "step": 7}).attach(guard)
    batches = (make_batch(s, dist.get_rank()) for s in range(steps))
    alarm = guard.train(batches)
    flushed = publisher.flush(20)
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "flushed": flushed,
        "spooled": len(publisher.spool.records()),
    }


@pytest.fixture(scope="module")
def moto_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.mark.slow
def test_a_gloo_job_with_a_fault_publishes_exactly_one_alarm_report(moto_endpoint, tmp_path):
    # Given 3 nodes x 2 ranks, rank 3 computing x1000 on one element from step 7, audits every 5
    job = (
        f"{__name__}:publishing_job",
        {"endpoint": moto_endpoint, "spool_root": str(tmp_path), "steps": 14},
    )
    # When the job trains until the guard stops it
    (results,) = launch([job], world=6, ranks_per_node=2, timeout_s=LAUNCH_DEADLINE_S)
    errors = [r["trace"] for r in results if "error" in r]
    assert not errors, errors[0]
    alarm = results[0]["alarm"]
    assert alarm is not None and alarm["suspects"] == [FAULTY]
    assert all(r["alarm"] == alarm for r in results)
    assert all(r["flushed"] and r["spooled"] == 0 for r in results)

    # Then the stream holds one rank map (every rank) and exactly one report, the alarm's
    logs = boto3.client("logs", region_name=REGION, endpoint_url=moto_endpoint)
    messages = stream_messages(logs, "/sdc/ddp-cluster", "ddp-job")
    rankmaps = [m for m in messages if m["schema"] == "sdc.rankmap/v1"]
    reports = [m for m in messages if m["schema"] == "sdc.alarm/v1"]
    assert len(rankmaps) == 1 and len(reports) == 1
    assert sorted(rankmaps[0]["ranks"], key=int) == [str(r) for r in range(6)]
    assert rankmaps[0]["ranks"]["3"]["node_name"] == node_name(1)
    report = reports[0]
    report.pop("time")
    assert report == {**alarm, "cluster": "ddp-cluster", "job": "ddp-job"}

    # And the metric went out once, on the cluster series and on the faulty rank's node
    cloudwatch = boto3.client("cloudwatch", region_name=REGION, endpoint_url=moto_endpoint)
    name, value = alarm["metric"]["name"], float(alarm["metric"]["value"])
    assert metric_sum(cloudwatch, name, {"ClusterName": "ddp-cluster"}) == (value, 1.0)
    node = {"ClusterName": "ddp-cluster", "JobName": "ddp-job", "NodeName": node_name(1)}
    assert metric_sum(cloudwatch, name, node) == (value, 1.0)
    # And the audits that passed before the fault (steps 0 and 5) were counted once each
    liveness = {"ClusterName": "ddp-cluster", "JobName": "ddp-job"}
    assert metric_sum(cloudwatch, "sdc_audit_pass", liveness)[0] == 2.0
