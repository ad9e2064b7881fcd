"""The examples do what the docs say: train_ddp.py under torchrun publishes its alarm and stops
with exit code 3; the PyTorchJob gives the agent its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer

from tests.agent.test_publish_cloudwatch import (  # noqa: F401  (aws_env is an autouse fixture)
    REGION,
    aws_env,
    stream_messages,
)

# How long this file's processes may run before the launcher kills them; the suite's conftest
# marks the file slow and gives pytest-timeout this plus a margin.
LAUNCH_DEADLINE_S = 480

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "agent" / "examples"


@pytest.fixture
def moto_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.mark.slow
def test_train_ddp_under_torchrun_publishes_and_exits_3_through_the_wrapper(
    tmp_path, moto_endpoint
):

    # Given the example on 6 CPU processes pretending to be 3 nodes, rank 3 faulty from step 25,
    # publishing to a CloudWatch stand-in, under the PyTorchJob's wrapper (torchrun itself exits
    # 1 when a worker fails)
    torchrun = Path(sys.executable).with_name("torchrun")
    termination_log = tmp_path / "termination-log"
    script = (
        f"{torchrun} --standalone --nproc-per-node 6 {EXAMPLES / 'train_ddp.py'} "
        "--simulate-nodes 3 --peer-offset 2 --steps 60 --audit-every 10 --check-every 10 "
        "--fault scale --fault-rank 3 --fault-step 25; rc=$?; "
        f"if grep -q '\"sdc.exit/v1\"' {termination_log}; then exit 3; fi; exit $rc"
    )
    env = {
        **os.environ,
        "SDC_TERMINATION_LOG": str(termination_log),
        "OMP_NUM_THREADS": "1",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "SDC_CLUSTER_NAME": "example-cluster",
        "SDC_JOB_NAME": "example-job",
        "SDC_SPOOL_DIR": str(tmp_path / "spool"),
    }
    # When it trains until the guard stops it
    done = subprocess.run(
        ["bash", "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=LAUNCH_DEADLINE_S,
    )
    # Then the container's exit code is 3 and the termination message names rank 3's node
    assert done.returncode == 3, done.stderr[-3000:]
    message = json.loads(termination_log.read_text())
    assert message["suspects"] == [3] and message["nodes"] == ["local-node-1"]
    assert message["metric"] == "sdc_replay_mismatch"
    # And rank 0 delivered the rank map and exactly one report before exiting
    logs = boto3.client("logs", region_name=REGION, endpoint_url=moto_endpoint)
    messages = stream_messages(logs, "/sdc/example-cluster", "example-job")
    assert [m["schema"] for m in messages] == ["sdc.rankmap/v1", "sdc.alarm/v1"]
    assert messages[1]["suspects"] == [3] and messages[1]["step"] == message["step"]


def test_pytorchjob_gives_the_agent_the_environment_it_reads():
    # Given the example PyTorchJob
    job = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    # Then the node comes from the downward API, the job from the Kubeflow label
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    label = env["SDC_JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert label == "metadata.labels['training.kubeflow.org/job-name']"
    # And the publisher's names, deterministic cuBLAS and a node-local spool are set
    assert env["SDC_CLUSTER_NAME"]["value"] and env["AWS_REGION"]["value"]
    assert env["CUBLAS_WORKSPACE_CONFIG"]["value"] == ":4096:8"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert env["SDC_SPOOL_DIR"]["value"] in mounts
    # And exit code 3 reaches a restart policy that treats it as permanent
    assert worker["restartPolicy"] == "ExitCode"
    assert "exit 3" in container["args"][0]
