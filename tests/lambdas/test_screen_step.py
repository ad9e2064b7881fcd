"""The Screen step against the loopback HTTPS Kubernetes API with batch/v1 Jobs: the Job on the
cordoned node only, its result read from the pod's termination message, recorded in the ledger,
put in the approval message and `history`; a Job that never starts, runs past its deadline or
leaves a bad message is `failed`, the Job deleted, and nothing else is lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from remediation_factories import APPROVALS, LEDGER, item_state

from sdc_remediation import aws
from sdc_remediation.cli.commands import main
from sdc_remediation.config import Settings
from sdc_remediation.dal.dynamo import from_item
from sdc_remediation.errors import ClusterApiUnavailable, ConfigurationError
from sdc_remediation.logic import screen as screen_logic
from tests.e2e.harness.kube_jobs import JobsStandIn
from tests.support.screen_run import simulated_screen_message

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llama-train:2026.11"
NAMESPACE = "sdc-screen"
TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAeSecretTaskToken" * 3
HEALTH = {"status": "passed", "started_at": "2026-11-29T10:00:00.000Z", "detail": "Passed"}
UUID = "GPU-3b2a1c4d-0000-1111-2222-333344445555"


@pytest.fixture
def k8s(monkeypatch: pytest.MonkeyPatch) -> Iterator[JobsStandIn]:
    """The loopback Kubernetes API with Jobs, wired in through the override variables, and the
    screen configured (image, namespace, a 600 s deadline)."""
    with JobsStandIn() as api:
        monkeypatch.setenv("K8S_API_ENDPOINT", api.url)
        monkeypatch.setenv("K8S_API_CA_DATA", api.ca_b64)
        monkeypatch.setenv("SCREEN_IMAGE", IMAGE)
        monkeypatch.setenv("SCREEN_NAMESPACE", NAMESPACE)
        monkeypatch.setenv("SCREEN_DEADLINE_SECONDS", "600")
        yield api


def document(verdict: str = "clean", **overrides: Any) -> dict[str, Any]:
    """An ``sdc.screen/v1`` document as ``python -m sdc_agent.screen`` writes it (8 GPUs)."""
    devices = [
        {
            "index": i,
            "uuid": UUID if i == 3 else f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            "status": "reproduced" if verdict == "reproduced" and i == 3 else "agrees",
            "mismatches": 2 if verdict == "reproduced" and i == 3 else 0,
            "ops": ["gemm:bf16:4096x14336x4096"] if verdict == "reproduced" and i == 3 else [],
            "digest": "81d9be78e055e0e9",
        }
        for i in range(8)
    ]
    doc = {
        "schema": "sdc.screen/v1",
        "verdict": verdict,
        "summary": (
            "reproduced: device 3 (GPU-3b2a...) reproduced: 2 of 224 observations mismatched"
            if verdict == "reproduced"
            else "clean: 8 devices agreed on 224 observations of 14 ops (not an exoneration)"
        ),
        "devices": devices,
        "exercised": {
            "kinds": {"gemm": 6, "sdpa": 1, "norm": 1, "rmsnorm": 1, "softmax": 1, "reduction": 3},
            "devices": 8,
            "repetitions": 16,
        },
        "not_exercised": ["nccl: the collective is device-to-device copies"],
        "inconclusive_ops": [],
        "golden": {"store": False},
        "environment": None,
        "durations_s": {"total": 412.0},
        "error": None,
    }
    return {**doc, **overrides}


def _item(node_id: str, **results: Any) -> dict[str, Any]:
    admission = {"decision": "admitted", "remediation_id": "r-screen-1", "reason": "admitted"}
    return item_state(node_id, admission=admission, **results)


def _started(k8s: JobsStandIn, invoke: Any, node_id: str) -> tuple[dict[str, Any], str]:
    """The item state after the Screen step created its Job on the cordoned GPU node."""
    k8s.add_gpu_node(f"hyperpod-{node_id}", gpus=8)
    state = _item(node_id)
    state["screen"] = invoke("screen", state)
    assert state["screen"]["status"] == "in_progress"
    return state, state["screen"]["job"]


def _poll(invoke: Any, state: dict[str, Any]) -> dict[str, Any]:
    state["screen"] = invoke("screen", state)
    return state["screen"]


def _approval_message(cloud: Any, invoke: Any, state: dict[str, Any]) -> str:
    """Record awaiting_approval and request the approval: the message the approver reads."""
    invoke("record", {"transition": "awaiting_approval", "state": state})
    invoke("request_approval", {**state, "health": HEALTH, "task_token": TOKEN})
    (message,) = cloud.sns_messages()
    return message["message"]


def _events(node_id: str) -> list[dict[str, Any]]:
    items = aws.client("dynamodb").scan(TableName=LEDGER)["Items"]
    return [e for e in map(from_item, items) if e["pk"] == node_id and "transition" in e]


def test_the_job_runs_on_the_cordoned_node_only_with_the_toleration_and_every_gpu(
    cloud, k8s, invoke
):
    # Given a cordoned node with 8 GPUs, and another node
    node_id = cloud.nodes[0]
    node = f"hyperpod-{node_id}"
    k8s.add_gpu_node(node, gpus=8)
    k8s.add_gpu_node(f"hyperpod-{cloud.nodes[1]}", gpus=8, unschedulable=False)

    # When the Screen step starts
    out = invoke("screen", _item(node_id))

    # Then one Job is created in the screening namespace
    assert out["status"] == "in_progress" and out["namespace"] == NAMESPACE
    assert out["gpus"] == 8 and out["deadline_seconds"] == 600
    [job] = k8s.created_jobs
    assert job["metadata"]["name"] == out["job"]
    [post] = [r for r in k8s.requests if r.method == "POST"]
    assert post.path == f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    assert post.headers["content-type"] == "application/json"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # pinned to that node alone (a required affinity on the node's own name)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]
    assert "nodeSelector" not in pod and "nodeName" not in pod
    # tolerating the cordon's taint, so it runs although the node is unschedulable
    assert pod["tolerations"] == [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # asking for all 8 GPUs, running the screen from the configured image
    [container] = pod["containers"]
    assert container["image"] == IMAGE
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert container["command"] == ["python", "-m", "sdc_agent.screen"]
    assert container["args"][:2] == ["--termination-log", "/dev/termination-log"]
    assert container["terminationMessagePath"] == "/dev/termination-log"


def test_a_retried_start_finds_its_job_instead_of_creating_a_second(cloud, k8s, invoke):
    # Given the Screen step created its Job, and its answer was lost
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    state.pop("screen")

    # When the workflow retries the first call
    out = invoke("screen", state)

    # Then the same Job is found (409 AlreadyExists, then GET) and no second one exists
    assert out["status"] == "in_progress" and out["job"] == name
    assert len(k8s.created_jobs) == 2 and list(k8s.jobs) == [(NAMESPACE, name)]


def test_a_node_that_is_not_cordoned_is_not_screened(cloud, k8s, invoke):
    # Given the suspect node is schedulable (someone uncordoned it)
    node_id = cloud.nodes[0]
    k8s.add_gpu_node(f"hyperpod-{node_id}", unschedulable=False)

    # When
    out = invoke("screen", _item(node_id))

    # Then no Job is created: the step is over, failed, saying why
    assert out["status"] == "failed" and "not cordoned" in out["reason"]
    assert k8s.created_jobs == []


def test_a_reproduced_screen_is_recorded_and_named_in_the_approval_message(cloud, k8s, invoke):
    # Given the Job is running, then its pod ends with a reproduced result (exit code 3)
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.job_running(name)
    assert _poll(invoke, state)["status"] == "in_progress"
    k8s.run_job(name, json.dumps(document("reproduced")), exit_code=3)

    # When the step polls
    out = _poll(invoke, state)

    # Then the GPU is named by index and UUID, and the Job is deleted with its pods
    assert out["status"] == "reproduced" and out["gpu_index"] == 3 and out["gpu_uuid"] == UUID
    assert out["deleted"] is True
    assert k8s.deleted == [
        (
            NAMESPACE,
            name,
            {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )
    ]
    assert not [p for p in k8s.pods if p["metadata"]["labels"].get("job-name") == name]
    # and the approval message names it
    body = _approval_message(cloud, invoke, state)
    assert f"screen: reproduced on GPU 3 (UUID {UUID})" in body
    # and the ledger holds it with the evidence
    [event] = _events(node_id)
    assert event["screen"] == f"reproduced on GPU 3 (UUID {UUID})"
    assert json.loads(event["detail"])["screen"]["gpu_index"] == 3
    (stored,) = [from_item(i) for i in aws.client("dynamodb").scan(TableName=APPROVALS)["Items"]]
    assert json.loads(stored["evidence"])["screen"]["status"] == "reproduced"


def test_a_clean_screen_says_what_it_ran_and_history_shows_it(cloud, k8s, invoke):
    # Given the Job ended with a clean result
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.run_job(name, json.dumps(document("clean")))

    # When the step polls
    out = _poll(invoke, state)

    # Then clean, with what it ran; it is no exoneration and the node stays cordoned
    assert out["status"] == "clean" and "gemm x6" in out["ran"] and "8 GPU(s)" in out["ran"]
    assert k8s.nodes[f"hyperpod-{node_id}"]["spec"]["unschedulable"] is True
    body = _approval_message(cloud, invoke, state)
    assert "screen: clean (ran: " in body and "not exercised: nccl" in body
    # and `history` shows it, once per remediation
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "history"])
    assert result.exit_code == 0, result.output
    assert result.output.count("    screen: clean (ran: ") == 1
    table = CliRunner().invoke(main, ["--ledger-table", LEDGER, "history", node_id, "--json"])
    assert json.loads(table.output)[0]["screen"].startswith("clean (ran: ")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("{not json", "malformed termination message"),
        (json.dumps({"schema": "sdc.screen/v1", "verdict": "clean"}), "missing key"),
        (json.dumps(document("reproduced", devices=[])), "must name a reproduced device"),
        (json.dumps(document("bogus")), "verdict must be one of"),
        ("x" * 5000, "oversized termination message: 5000 bytes"),
        (None, "no termination message (exit code 1"),
    ],
    ids=["not-json", "missing-keys", "reproduced-without-gpu", "bad-verdict", "oversized", "none"],
)
def test_a_bad_message_is_a_failed_screen_and_the_workflow_goes_on(
    cloud, k8s, invoke, message, reason
):
    # Given the Job's pod ended with a message that is no sdc.screen/v1 document
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.run_job(name, message, exit_code=1)

    # When the step polls
    out = _poll(invoke, state)

    # Then the screen failed, saying why; its Job is deleted
    assert out["status"] == "failed" and reason in out["reason"], out
    assert out["deleted"] is True and k8s.jobs == {}
    # and the approval is requested as before, the failure in its message
    body = _approval_message(cloud, invoke, state)
    assert "screen: failed (" in body and "Health check:   passed" in body


def test_a_job_that_never_starts_is_a_failed_screen(cloud, k8s, invoke):
    # Given the Job's pod never starts (its image does not pull) and the Job controller ends it
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.job_pending(name)
    assert _poll(invoke, state)["status"] == "in_progress"
    k8s.job_deadline_exceeded(name)

    # When the step polls
    out = _poll(invoke, state)

    # Then
    assert out["status"] == "failed"
    assert "never started within its deadline (600 s): ImagePullBackOff" in out["reason"]
    assert out["deleted"] is True and k8s.jobs == {}


def test_a_job_past_its_deadline_is_a_failed_screen(cloud, k8s, invoke):
    # Given the screen ran but the Job controller stopped it at its deadline
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.job_running(name)
    k8s.job_deadline_exceeded(name)

    # When the step polls
    out = _poll(invoke, state)

    # Then
    assert out["status"] == "failed" and "exceeded its deadline (600 s)" in out["reason"]
    assert k8s.jobs == {}


def test_the_step_gives_up_by_itself_past_the_deadline(cloud, k8s, invoke):
    # Given a Job whose pod still waits long after the deadline (no controller ended it)
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.job_pending(name, reason="ContainerCreating")
    state["screen"]["started_at"] = "2026-01-01T00:00:00.000Z"

    # When the step polls
    out = _poll(invoke, state)

    # Then it fails the screen and deletes the Job
    assert out["status"] == "failed" and "never started: ContainerCreating" in out["reason"]
    assert k8s.jobs == {}


def test_an_unreachable_api_is_retried_and_loses_nothing(cloud, k8s, invoke):
    # Given a running screen, and the API down
    node_id = cloud.nodes[0]
    state, name = _started(k8s, invoke, node_id)
    k8s.down = True

    # When the step polls: the workflow's Retry sees ClusterApiUnavailable
    with pytest.raises(ClusterApiUnavailable):
        invoke("screen", state)

    # Then the Job is still there, and the next poll reads it
    k8s.down = False
    k8s.run_job(name, json.dumps(document("clean")))
    assert _poll(invoke, state)["status"] == "clean"


def test_without_an_image_the_screen_is_not_configured(cloud, k8s, invoke, monkeypatch):
    # Given no screenImage
    monkeypatch.delenv("SCREEN_IMAGE")
    node_id = cloud.nodes[0]
    k8s.add_gpu_node(f"hyperpod-{node_id}")
    state = _item(node_id)

    # When
    state["screen"] = invoke("screen", state)

    # Then nothing is asked of Kubernetes, and the approval message says so
    assert state["screen"]["status"] == "not_configured"
    assert k8s.requests == []
    assert "screen: not configured" in _approval_message(cloud, invoke, state)


def test_a_dry_run_creates_no_job(cloud, k8s, invoke, monkeypatch):
    # Given a dry run
    monkeypatch.setenv("DRY_RUN", "true")
    node_id = cloud.nodes[0]
    k8s.add_gpu_node(f"hyperpod-{node_id}")

    # When
    out = invoke("screen", _item(node_id))

    # Then
    assert out["status"] == "skipped" and k8s.created_jobs == []


def test_a_node_without_gpus_is_a_failed_screen(cloud, k8s, invoke):
    # Given a cordoned node that offers no nvidia.com/gpu
    node_id = cloud.nodes[0]
    k8s.add_gpu_node(f"hyperpod-{node_id}", gpus=0)

    # When
    out = invoke("screen", _item(node_id))

    # Then
    assert out["status"] == "failed" and "no allocatable nvidia.com/gpu" in out["reason"]
    assert k8s.created_jobs == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCREEN_IMAGE", "an image with spaces"),
        ("SCREEN_NAMESPACE", "Not_A_Namespace"),
        ("SCREEN_DEADLINE_SECONDS", "30"),
        ("SCREEN_DEADLINE_SECONDS", "100000"),
        ("SCREEN_DEADLINE_SECONDS", "soon"),
    ],
)
def test_screen_settings_are_validated_naming_the_variable(variable, value):
    settings = Settings({variable: value})
    attribute = variable.lower()
    with pytest.raises(ConfigurationError, match=variable):
        getattr(settings, attribute)


def test_screen_settings_defaults():
    settings = Settings({})
    assert settings.screen_image is None
    assert settings.screen_namespace == "sdc-screen"
    assert settings.screen_deadline_seconds == 1800


@pytest.mark.slow
def test_the_real_screens_termination_message_names_the_faulty_device(tmp_path):
    # Given the real screen on 4 simulated devices, a fault injected into device 2
    message = simulated_screen_message(tmp_path, 2, timeout=240)

    # When the step reads its termination log as the pod's message
    out = screen_logic.read_result({"exitCode": 3, "message": message})

    # Then
    assert out.status == "reproduced" and out.gpu_index == 2 and out.gpu_uuid == "cpu-2"
    assert "gemm x" in out.ran


def test_a_screen_step_the_workflow_caught_reads_as_a_failed_screen(cloud, invoke):
    # Given the workflow's Catch put the Screen step's error at $.screen (after its retries)
    node_id = cloud.nodes[0]
    state = _item(node_id)
    state["screen"] = {"Error": "ClusterApiUnavailable", "Cause": "Kubernetes answered 503"}

    # When the approval is requested and the transition recorded
    body = _approval_message(cloud, invoke, state)

    # Then it is a failed screen, saying why, and nothing else changed
    assert "screen: failed (the Screen step failed: ClusterApiUnavailable: " in body
    [event] = _events(node_id)
    assert event["transition"] == "awaiting_approval"
    assert event["screen"].startswith("failed (the Screen step failed: ClusterApiUnavailable")
