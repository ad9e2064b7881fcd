"""The Screen step: the node screen (``python -m sdc_agent.screen``) as a Kubernetes Job on the
cordoned suspect node, then its verdict from the pod's termination message.

One function the workflow calls in a loop, as it polls the deep health check: the first call
(no ``$.screen`` yet) creates the Job and answers ``in_progress``; every later one reads the
Job and its pod, and once there is an outcome deletes the Job and answers it. The outcome is
the screen's own verdict (``reproduced`` with the GPU's index and UUID, ``clean`` with what it
ran, ``inconclusive``) or ``failed`` with why: the Job never started, or ran past, its
deadline; its message is missing, over the 4096 bytes Kubernetes keeps, or not an
``sdc.screen/v1`` document (``sdc_contract.screen.check_screen_result``). A failure fails
nothing: the workflow records it with the evidence and goes on to the approval. A ``clean``
screen is not an exoneration and never releases the node.

The Job (``job_manifest``): in ``SCREEN_NAMESPACE``, pinned to the node by a required node
affinity on its name (``matchFields`` on ``metadata.name``, as the DaemonSet controller pins
its pods: the node's own name, whatever its hostname label says), tolerating the cordon's
``node.kubernetes.io/unschedulable:NoSchedule`` taint so it runs although the node is
unschedulable, asking for every GPU the node has (its allocatable ``nvidia.com/gpu``),
``backoffLimit: 0``, ``restartPolicy: Never``, ``activeDeadlineSeconds`` from
``SCREEN_DEADLINE_SECONDS``. It is created on a cordoned node only (cordon ran first): a node
that is schedulable again is not screened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from sdc_contract.environment import SCREEN_GRACE_SECONDS
from sdc_contract.screen import TERMINATION_MESSAGE_BYTES, check_screen_result

from .. import clock, text
from ..clients.kube import JOB_NAME_LABEL, KubeApi, node_unschedulable
from ..config import Settings
from ..errors import ConfigurationError, InvalidStepInput, NodeNotFound, RemediationError
from ..models import ItemState, ScreenResult
from ..models.results import MAX_SCREEN_TEXT
from ..observability import logger

CONTAINER = "screen"
"""The Job's one container, whose termination message is the result."""
COMMAND = ("python", "-m", "sdc_agent.screen")
TERMINATION_LOG = "/dev/termination-log"
"""Where the container writes its result (Kubernetes' default ``terminationMessagePath``)."""
GPU_RESOURCE = "nvidia.com/gpu"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint Kubernetes puts on a cordoned node (``spec.unschedulable``)."""
JOB_PREFIX = "sdc-screen-"
APP_LABEL = "app.kubernetes.io/name"
APP = "sdc-screen"
NODE_LABEL = "sdc.guard/node"
REMEDIATION_ANNOTATION = "sdc.guard/remediation"
GRACE_SECONDS = SCREEN_GRACE_SECONDS
"""How long past the Job's deadline the step still waits for Kubernetes to end it (the Job
controller marks ``DeadlineExceeded`` and stops the pod) before it gives up by itself."""
TTL_AFTER_FINISHED_SECONDS = 3600
"""A Job the step could not delete is removed this long after it finished (the TTL controller)."""


def job_name(state: ItemState) -> str:
    """The Job's name for this Map item: the same on every call and retry of the step, so a
    create retried after a lost answer finds its Job instead of starting a second one."""
    key = f"{state.execution}#{state.item}#{state.suspect.instance_id}"
    return JOB_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]


def screen_budget_seconds(deadline_seconds: int) -> int:
    """The screen's own time budget (``--budget-s``: no new repetition after it): a third of the
    deadline, which also covers scheduling, the image pull and the screen's set-up."""
    return max(60, deadline_seconds // 3)


def job_manifest(
    *,
    name: str,
    namespace: str,
    node_name: str,
    image: str,
    gpus: int,
    deadline_seconds: int,
    remediation_id: str | None,
) -> dict[str, Any]:
    """The batch/v1 Job that screens ``node_name``'s ``gpus`` GPUs (module docstring)."""
    labels = {APP_LABEL: APP, NODE_LABEL: node_name}
    annotations = {REMEDIATION_ANNOTATION: remediation_id} if remediation_id else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_SECONDS,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": [node_name],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "tolerations": [
                        {
                            "key": UNSCHEDULABLE_TAINT,
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ],
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": image,
                            "command": list(COMMAND),
                            "args": [
                                "--termination-log",
                                TERMINATION_LOG,
                                "--budget-s",
                                str(screen_budget_seconds(deadline_seconds)),
                            ],
                            "resources": {
                                "requests": {GPU_RESOURCE: str(gpus)},
                                "limits": {GPU_RESOURCE: str(gpus)},
                            },
                            "terminationMessagePath": TERMINATION_LOG,
                            "terminationMessagePolicy": "File",
                        }
                    ],
                },
            },
        },
    }


def node_gpus(node: Mapping[str, Any]) -> int:
    """How many GPUs the node offers (its allocatable ``nvidia.com/gpu``; 0 when none or
    unreadable)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        return max(0, int(str(allocatable.get(GPU_RESOURCE, "0"))))
    except ValueError:
        return 0


def screen(state: ItemState, settings: Settings, kube: Callable[[], KubeApi]) -> ScreenResult:
    """One call of the Screen step: start the Job (no ``$.screen`` yet), else poll it."""
    previous = state.screen
    if previous is None:
        return start(state, settings, kube)
    if previous.done:
        return previous
    return poll(state, previous, kube)


def start(state: ItemState, settings: Settings, kube: Callable[[], KubeApi]) -> ScreenResult:
    """Create the screen Job on the cordoned suspect node (not configured, a dry run, a node
    that is not cordoned or has no GPU: an outcome at once, no Job)."""
    image = settings.screen_image
    if image is None:
        return ScreenResult(status="not_configured", reason="screenImage is not set")
    if settings.dry_run:
        return ScreenResult(status="skipped", reason="dry run: no screen Job created")
    namespace, deadline = settings.screen_namespace, settings.screen_deadline_seconds
    node_name = state.suspect.node_name
    api = kube()
    try:
        node = api.get_node(node_name)
    except NodeNotFound:
        return _failed(f"node {node_name} not found in Kubernetes")
    if not node_unschedulable(node):
        # The Screen step follows cordon: a node that is schedulable again (someone uncordoned
        # it) would take training pods beside the screen, and the screen would take their GPUs.
        return _failed(f"node {node_name} is not cordoned: the screen runs on a cordoned node only")
    gpus = node_gpus(node)
    if gpus < 1:
        return _failed(f"node {node_name} has no allocatable {GPU_RESOURCE}")
    name = job_name(state)
    manifest = job_manifest(
        name=name,
        namespace=namespace,
        node_name=node_name,
        image=image,
        gpus=gpus,
        deadline_seconds=deadline,
        remediation_id=state.admission.remediation_id if state.admission else None,
    )
    try:
        api.create_job(namespace, manifest)
    except (ConfigurationError, InvalidStepInput, NodeNotFound) as exc:
        # RBAC denied, the namespace missing, a manifest refused: no screen, nothing else lost.
        return _failed(f"Kubernetes refused the screen Job: {exc}")
    logger.info(
        "screen job created",
        extra={"job": name, "namespace": namespace, "node": node_name, "gpus": gpus},
    )
    return ScreenResult(
        status="in_progress",
        job=name,
        namespace=namespace,
        started_at=clock.iso(clock.now()),
        deadline_seconds=deadline,
        gpus=gpus,
    )


def poll(state: ItemState, previous: ScreenResult, kube: Callable[[], KubeApi]) -> ScreenResult:
    """Read the Job and its pod: the result once there is one (the Job then deleted), else
    ``in_progress`` until the deadline."""
    return poll_job(previous, kube())


def poll_job(previous: ScreenResult, api: KubeApi) -> ScreenResult:
    """Where the screen Job ``previous`` names stands: its outcome once there is one (the Job
    then deleted), else ``previous`` (``in_progress``) until its deadline and grace. Shared by
    the Screen step and the idle screener (``logic.idle_screen``)."""
    namespace, name = previous.namespace or "", previous.job or ""
    try:
        job = api.get_job(namespace, name)
    except NodeNotFound:
        return previous.model_copy(
            update={"status": "failed", "reason": "the screen Job disappeared before a result"}
        )
    pods = api.job_pods(namespace, name)
    terminated = _terminated(pods)
    condition = _final_condition(job)
    if terminated is not None and (
        terminated.get("message") or condition is None or condition[1] != "DeadlineExceeded"
    ):
        return _finish(api, previous, read_result(terminated))
    started = _ever_started(pods)
    deadline = previous.deadline_seconds
    if condition is not None:
        kind, reason, message = condition
        if reason == "DeadlineExceeded":
            why = (
                f"the screen Job exceeded its deadline ({deadline} s)"
                if started
                else f"the screen Job never started within its deadline ({deadline} s): "
                f"{_waiting(pods)}"
            )
        else:
            why = f"the screen Job ended {kind} ({reason}: {message}) without a result"
        return _finish(api, previous, _failed(why))
    begun = clock.parse_iso(previous.started_at) if previous.started_at else clock.now()
    if clock.now() >= begun + timedelta(seconds=deadline + GRACE_SECONDS):
        why = (
            f"no result {deadline + GRACE_SECONDS} s after the screen Job was created (deadline "
            f"{deadline} s): it "
            + ("is still running" if started else f"never started: {_waiting(pods)}")
        )
        return _finish(api, previous, _failed(why))
    return previous


def read_result(terminated: Mapping[str, Any]) -> ScreenResult:
    """The outcome a terminated screen container's state gives: its termination message
    checked as ``sdc.screen/v1`` (a bad one is ``failed``, with what was wrong)."""
    message = terminated.get("message")
    code = terminated.get("exitCode")
    if not isinstance(message, str) or not message.strip():
        return _failed(
            f"the screen left no termination message (exit code {code}, "
            f"{terminated.get('reason') or 'no reason'})"
        )
    size = len(message.encode())
    if size > TERMINATION_MESSAGE_BYTES:
        return _failed(
            f"oversized termination message: {size} bytes, over {TERMINATION_MESSAGE_BYTES}"
        )
    try:
        doc = check_screen_result(message)
    except ValueError as exc:
        return _failed(f"malformed termination message (not sdc.screen/v1): {exc}")
    verdict = doc["verdict"]
    summary = str(doc.get("summary") or "")
    if verdict == "reproduced":
        named = sorted(
            (d for d in doc["devices"] if d.get("status") == "reproduced"),
            key=lambda d: int(d["index"]),
        )
        first = named[0]
        more = f"; {len(named) - 1} more GPU(s) reproduced" if len(named) > 1 else ""
        return ScreenResult(
            status="reproduced",
            reason=summary + more,
            gpu_index=int(first["index"]),
            gpu_uuid=text.printable(first.get("uuid") or "unknown", 80),
            ran=ran_summary(doc),
        )
    if verdict == "clean":
        return ScreenResult(status="clean", reason=summary, ran=ran_summary(doc))
    if verdict == "inconclusive":
        return ScreenResult(status="inconclusive", reason=summary, ran=ran_summary(doc))
    return _failed(f"the screen could not run: {doc.get('error') or summary or 'no error given'}")


def ran_summary(doc: Mapping[str, Any]) -> str:
    """What the screen exercised (op kinds and counts, GPUs, repetitions) and the first things
    it did not, in one bounded line (the document is the pod's: every value is checked)."""
    exercised = doc.get("exercised")
    exercised = exercised if isinstance(exercised, Mapping) else {}
    kinds = exercised.get("kinds")
    parts = []
    if isinstance(kinds, Mapping) and kinds:
        parts.append(", ".join(f"{k} x{v}" for k, v in sorted(kinds.items(), key=str)))
    for key, unit in (("devices", "GPU(s)"), ("repetitions", "repetition(s)")):
        value = exercised.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{value} {unit}")
    missing = doc.get("not_exercised")
    if isinstance(missing, list) and missing:
        parts.append("not exercised: " + "; ".join(str(m) for m in missing[:3]))
    return text.printable("; ".join(parts) or "not stated", MAX_SCREEN_TEXT)


def _failed(reason: str) -> ScreenResult:
    return ScreenResult(status="failed", reason=text.printable(reason, MAX_SCREEN_TEXT))


def _finish(api: KubeApi, previous: ScreenResult, outcome: ScreenResult) -> ScreenResult:
    """The outcome with the Job's identity, after deleting the Job (its pods in the background).

    A failed delete loses nothing: the outcome stands, it says so, and the Job's
    ``ttlSecondsAfterFinished`` removes it later."""
    deleted = False
    try:
        api.delete_job(previous.namespace or "", previous.job or "")
        deleted = True
    except RemediationError as exc:
        logger.warning("screen job not deleted", extra={"job": previous.job, "error": str(exc)})
    logger.info("screen over", extra={"job": previous.job, "status": outcome.status})
    return outcome.model_copy(
        update={
            "job": previous.job,
            "namespace": previous.namespace,
            "started_at": previous.started_at,
            "deadline_seconds": previous.deadline_seconds,
            "gpus": previous.gpus,
            "deleted": deleted,
        }
    )


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(status, Mapping) and status.get("name") == CONTAINER:
            return status
    return None


def _terminated(pods: list[dict[str, Any]]) -> Mapping[str, Any] | None:
    """The screen container's ``state.terminated`` in the Job's pod, once it ended."""
    for pod in pods:
        status = _container(pod)
        terminated = ((status or {}).get("state") or {}).get("terminated")
        if isinstance(terminated, Mapping):
            return terminated
    return None


def _ever_started(pods: list[dict[str, Any]]) -> bool:
    """Whether the screen container started in any pod of the Job (it ran, or runs)."""
    for pod in pods:
        status = _container(pod) or {}
        state = status.get("state") or {}
        last = status.get("lastState") or {}
        if state.get("running") or state.get("terminated") or last.get("terminated"):
            return True
    return False


def _waiting(pods: list[dict[str, Any]]) -> str:
    """Why the pod did not start, as the kubelet or the scheduler put it."""
    if not pods:
        return "no pod left to say why"
    pod = pods[0]
    waiting = ((_container(pod) or {}).get("state") or {}).get("waiting") or {}
    if waiting:
        return f"{waiting.get('reason') or 'waiting'}: {waiting.get('message') or ''}".rstrip(": ")
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") != "True":
            return f"unschedulable: {condition.get('message') or condition.get('reason') or ''}"
    return f"pod phase {(pod.get('status') or {}).get('phase') or 'unknown'}"


def _final_condition(job: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(``Failed``/``Complete``, reason, message) when the Job has ended, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Failed", "Complete") and condition.get("status") == "True":
            return (
                str(condition["type"]),
                str(condition.get("reason") or ""),
                str(condition.get("message") or ""),
            )
    return None


__all__ = [
    "COMMAND",
    "CONTAINER",
    "GPU_RESOURCE",
    "JOB_NAME_LABEL",
    "UNSCHEDULABLE_TAINT",
    "job_manifest",
    "job_name",
    "node_gpus",
    "poll",
    "poll_job",
    "ran_summary",
    "read_result",
    "screen",
    "start",
]
