"""The examples do what the docs say: train_ddp.py under torchrun stops with exit code 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "agent" / "examples"


@pytest.mark.slow
def test_train_ddp_under_torchrun_exits_3_through_the_wrapper(tmp_path):
    # Given the example on 6 CPU processes pretending to be 3 nodes, rank 3 faulty from step 25,
    # and the PyTorchJob's wrapper (torchrun itself exits 1 when a worker fails)
    torchrun = Path(sys.executable).with_name("torchrun")
    termination_log = tmp_path / "termination-log"
    script = (
        f"{torchrun} --standalone --nproc-per-node 6 {EXAMPLES / 'train_ddp.py'} "
        "--simulate-nodes 3 --peer-offset 2 --steps 60 --audit-every 10 --check-every 10 "
        "--fault scale --fault-rank 3 --fault-step 25 --publish none; rc=$?; "
        f"if grep -q '\"sdc.exit/v1\"' {termination_log}; then exit 3; fi; exit $rc"
    )
    env = {**os.environ, "SDC_TERMINATION_LOG": str(termination_log), "OMP_NUM_THREADS": "1"}
    # When it trains until the guard stops it
    done = subprocess.run(
        ["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    # Then the container's exit code is 3 and the termination message names rank 3's node
    assert done.returncode == 3, done.stderr[-3000:]
    message = json.loads(termination_log.read_text())
    assert message["suspects"] == [3] and message["nodes"] == ["local-node-1"]
    assert message["metric"] == "sdc_replay_mismatch"


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
