"""The Screen step end to end: the real workflow definition and handlers, a stack with a
``screenImage``, the Kubernetes stand-in serving the Job, whose pod's termination message is
what the real screen (``python -m sdc_agent.screen`` on simulated CPU devices, one with an
injected fault) wrote. The verdict reaches the approval message and the ledger; the Job is
deleted; the rest of the workflow is what it always is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.scenario import culprit_alarm, local_cluster, operator, pending_for, raise_alarm
from tests.support.screen_run import simulated_screen_message

pytestmark = pytest.mark.slow

CLUSTER = local_cluster()
SUSPECT = CLUSTER.instance_ids[1]
SUSPECT_NODE = CLUSTER.node_name(SUSPECT)
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llama-train:2026.11"


def _real_screen(tmp_path: Path) -> str:
    """The termination message of the real screen of 4 simulated devices, device 3 faulty."""
    return simulated_screen_message(tmp_path, 3)


def test_the_screen_reproduces_on_the_suspect_node_before_the_approval(tmp_path):
    message = _real_screen(tmp_path)
    with LocalPipeline(CLUSTER, {"screenImage": IMAGE}) as p:
        # Given the screen Job's pod ends with the real screen's result (exit code 3)
        jobs: list[dict[str, Any]] = []

        def run(job: dict[str, Any]) -> tuple[str | None, int]:
            jobs.append(job)
            return message, 3

        p.kube.screen_result = run
        # When the agent reports rank 3 (node 1) and the workflow reaches the approval
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), str(tmp_path / "spool"))
        approval = pending_for(p, execution)

        # Then one Job ran on the cordoned suspect node only, with all its GPUs, and is gone
        (job,) = jobs
        pod = job["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [SUSPECT_NODE]
        assert pod["containers"][0]["image"] == IMAGE
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert p.kube.nodes[SUSPECT_NODE]["spec"]["unschedulable"] is True
        assert p.kube.jobs == {} and len(p.kube.deleted) == 1
        # and the approval message names the GPU the screen reproduced on
        messages = [n["message"] for n in p.notifications()]
        assert any(
            f" approve {approval} " in m and "screen: reproduced on GPU 3 (UUID cpu-3)" in m
            for m in messages
        )
        # When the operator approves / Then the workflow ends as it always does
        code, out = operator(p, "approve", approval, "--reason", "screen reproduced")
        assert code == 0, out
        assert p.finish(execution)["status"] == "SUCCEEDED"
        assert p.transitions(SUSPECT)[-2:] == ["approved", "replaced"]
        # and `history` shows the screen's verdict
        code, out = operator(p, "history", "--node", SUSPECT)
        assert code == 0, out
        assert "screen: reproduced on GPU 3 (UUID cpu-3)" in out


def test_without_a_screen_image_the_approval_says_not_configured(tmp_path):
    with LocalPipeline(CLUSTER) as p:
        # Given the shipped configuration (no screenImage)
        execution = raise_alarm(p, culprit_alarm(CLUSTER, [3]), str(tmp_path / "spool"))
        approval = pending_for(p, execution)
        # Then no Job was created and the approval message says the screen is not configured
        assert [r for r in p.kube.requests if "/apis/batch/" in r.path] == []
        messages = [n["message"] for n in p.notifications()]
        assert any(f" approve {approval} " in m and "screen: not configured" in m for m in messages)
        code, out = operator(p, "reject", approval, "--reason", "not now")
        assert code == 0, out
        assert p.finish(execution)["status"] == "SUCCEEDED"
