"""Screening idle and standby nodes: the node screen on HyperPod nodes no training pod is on.

One run (the schedule's ``{"action": "run"}``, ``run``):
1. every screen the ledger holds as running is looked at: a training pod on its node now
   (``is_training_pod``) deletes the Job and records ``aborted`` (its result never counts: the
   screen shared the node's GPUs with a job); otherwise the Job is polled as the Screen step
   polls it (``screen.poll_job``) and, once there is an outcome, the Job is deleted and the
   outcome recorded. A ``reproduced`` outcome, the node checked once more for a training pod,
   is published as a finding of the reserved job ``IDLE_SCREEN_JOB`` naming the node (the
   canary's ``publish_finding``): from there the alarm, admission guard, cordon, health check,
   approval and replacement follow as for an agent's alarm;
2. then candidates are picked: HyperPod nodes (``hyperpod-<instance id>``), schedulable, with
   no training pod and no running screen, whose last screen is older than the rescreen age or
   who never had one, never-screened first then oldest first, up to ``SCREEN_IDLE_MAX_NODES``
   screens running in all; each gets the Screen step's Job (``screen.job_manifest``);
3. the counts are put as metrics (``IDLE_SCREEN_METRICS``).

``{"action": "screen", "node": N}`` (``screen_node``) screens one node now, with the same checks.
A Kubernetes or AWS error about one node is logged and counted and the run goes on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

import sdc_contract as contract
from sdc_contract.names import NODE_NAME_PREFIX, is_instance_id

from .. import clock
from ..clients.kube import KubeApi, node_unschedulable
from ..config import Settings
from ..dal.screens import NodeScreen, ScreenStore
from ..errors import ConfigurationError, InvalidStepInput, RemediationError
from ..models import ScreenResult
from ..observability import logger, metrics
from . import screen as screen_step
from .canary.start import datum, publish_finding, reserved_job_report

TERMINAL_PHASES = ("Succeeded", "Failed")
OUTCOME_METRICS = {
    "clean": contract.SCREEN_CLEAN_METRIC,
    "reproduced": contract.SCREEN_REPRODUCED_METRIC,
    "inconclusive": contract.SCREEN_INCONCLUSIVE_METRIC,
    "failed": contract.SCREEN_FAILED_METRIC,
    "aborted": contract.SCREEN_ABORTED_METRIC,
}
"""The metric each recorded outcome counts in."""


class ScreenRefused(InvalidStepInput):
    """A node the manual ``screen`` action may not screen now (named, with why)."""


@dataclass
class RunSummary:
    """What one run did (the function's JSON answer)."""

    started: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    """node -> the outcome recorded this run."""
    running: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    """node -> the error that left it alone this run."""
    unscreened: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values."""
        return {
            "started": sorted(self.started),
            "outcomes": dict(sorted(self.outcomes.items())),
            "running": sorted(self.running),
            "errors": dict(sorted(self.errors.items())),
            "unscreened": self.unscreened,
        }


def is_training_pod(pod: Mapping[str, Any], screen_namespace: str) -> bool:
    """Whether ``pod`` keeps a node from being screened: a pod that has not ended (its phase
    is not Succeeded/Failed), outside the screening namespace (the screens' own pods), not a
    DaemonSet's (device plugins, log agents and the like run on every node and take no GPU
    work) and asking for a GPU (``nvidia.com/gpu`` in any container's requests or limits: an
    extended resource is requested through its limit alone)."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return False
    if metadata.get("namespace") == screen_namespace:
        return False
    if any(
        ref.get("kind") == "DaemonSet" and ref.get("controller")
        for ref in metadata.get("ownerReferences") or []
    ):
        return False
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            if str((resources.get(kind) or {}).get(screen_step.GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False


def hyperpod_instance(node: Mapping[str, Any]) -> str | None:
    """The instance id of a HyperPod node (named ``hyperpod-<instance id>``, as HyperPod
    names them and the rest of the code reads them), None for any other node."""
    name = str((node.get("metadata") or {}).get("name") or "")
    instance_id = name.removeprefix(NODE_NAME_PREFIX)
    if name.startswith(NODE_NAME_PREFIX) and is_instance_id(instance_id):
        return instance_id
    return None


def idle_job_name(node_name: str, at: datetime) -> str:
    """A screen Job's name for ``node_name`` started at ``at`` (one per node and start)."""
    key = f"idle#{node_name}#{clock.iso(at)}"
    return screen_step.JOB_PREFIX + "idle-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def screen_report(
    cluster: str, node_name: str, instance_id: str, result: ScreenResult, at: datetime
) -> dict[str, Any]:
    """The ``sdc.alarm/v1`` report of a reproduced idle screen: rank 0 of ``IDLE_SCREEN_JOB``
    on the node, named a culprit by the compute check, with the GPU the screen named."""
    rank: dict[str, Any] = {"node_name": node_name, "instance_id": instance_id}
    if result.gpu_uuid:
        rank["gpu_uuid"] = result.gpu_uuid
    if result.gpu_index is not None:
        rank["local_rank"] = result.gpu_index
    return reserved_job_report(
        cluster, contract.IDLE_SCREEN_JOB, at, rank, contract.IDLE_SCREEN_METRIC
    )


class IdleScreener:
    """One invocation of the idle screener over one cluster."""

    def __init__(self, settings: Settings, kube: Callable[[], KubeApi]) -> None:
        image = settings.screen_image
        if image is None:
            raise ConfigurationError(
                "idle screening needs SCREEN_IMAGE (context key screenImage): no image to screen with"
            )
        self.settings = settings
        self.image = image
        self.cluster = settings.hyperpod_cluster_name
        self.namespace = settings.screen_namespace
        self.store = ScreenStore(settings.ledger_table, self.cluster)
        self._kube = kube
        self._api: KubeApi | None = None

    @property
    def api(self) -> KubeApi:
        """The Kubernetes API, connected on first use."""
        if self._api is None:
            self._api = self._kube()
        return self._api

    def training_pods(self, node_name: str) -> list[str]:
        """The training pods on the node now (namespace/name)."""
        return [
            f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
            for p in self.api.pods_on_node(node_name)
            if is_training_pod(p, self.namespace)
        ]

    # -- running screens ------------------------------------------------------------------------

    def follow(self, entry: NodeScreen, summary: RunSummary) -> None:
        """Look at one running screen: abort it, record its outcome, or leave it running."""
        node, job = entry.node_name, entry.running_job or ""
        running = ScreenResult(
            status="in_progress",
            job=job,
            namespace=self.namespace,
            started_at=entry.running_since,
            deadline_seconds=self.settings.screen_deadline_seconds,
        )
        if self.training_pods(node):
            self._delete(job)
            self._record(node, job, "aborted", "a training pod appeared on the node", summary)
            return
        outcome = screen_step.poll_job(running, self.api)
        if outcome.status == "in_progress":
            summary.running.append(node)
            return
        status = outcome.status
        if status == "reproduced":
            # Checked again: a job that arrived while the Job ended shared the node's GPUs.
            if self.training_pods(node):
                self._record(node, job, "aborted", "a training pod appeared on the node", summary)
                return
            # Recorded at the report's own time first: localize accepts the report only for
            # the node whose reproduced screen the ledger holds at that time.
            now = clock.now()
            if self._record(node, job, status, outcome.reason, summary, at=now):
                self.publish(node, outcome, now)
            return
        self._record(node, job, status, outcome.reason, summary)

    def publish(self, node_name: str, result: ScreenResult, now: datetime) -> None:
        """A reproduced screen as a finding of ``IDLE_SCREEN_JOB`` at ``now``: the report, then
        the datum in the idle screen's namespace (which no training pod may put into)."""
        instance_id = node_name.removeprefix(NODE_NAME_PREFIX)
        publish_finding(
            self.settings,
            screen_report(self.cluster, node_name, instance_id, result, now),
            contract.idle_screen_namespace(self.settings.metric_namespace),
            datum(
                self.cluster,
                now,
                job=contract.IDLE_SCREEN_JOB,
                node=node_name,
                metric=contract.IDLE_SCREEN_METRIC,
            ),
            now,
        )
        logger.warning(
            "idle screen reproduced",
            extra={"node": node_name, "gpu": result.gpu_index, "uuid": result.gpu_uuid},
        )

    def _delete(self, job: str) -> None:
        try:
            self.api.delete_job(self.namespace, job)
        except RemediationError as exc:
            # ttlSecondsAfterFinished removes it later; the outcome is recorded either way.
            logger.warning("idle screen job not deleted", extra={"job": job, "error": str(exc)})

    def _record(
        self,
        node: str,
        job: str,
        outcome: str,
        reason: str,
        summary: RunSummary,
        *,
        at: datetime | None = None,
    ) -> bool:
        """Record ``job``'s outcome (False: another run recorded it first; nothing counted)."""
        if not self.store.finish(node, job, outcome, at or clock.now(), reason):
            return False
        summary.outcomes[node] = outcome
        metrics.add_metric(name=OUTCOME_METRICS[outcome], unit=MetricUnit.Count, value=1)
        return True

    # -- starting screens -----------------------------------------------------------------------

    def refusal(self, node: Mapping[str, Any], entry: NodeScreen | None) -> str | None:
        """Why ``node`` may not be screened now (None: it may)."""
        name = str((node.get("metadata") or {}).get("name") or "")
        if hyperpod_instance(node) is None:
            return f"node {name} is not a HyperPod node (hyperpod-<instance id>)"
        if node_unschedulable(dict(node)):
            return f"node {name} is cordoned: idle screening runs on schedulable nodes only"
        if entry is not None and entry.running_job:
            return f"node {name} already has a running screen ({entry.running_job})"
        if screen_step.node_gpus(node) < 1:
            return f"node {name} has no allocatable {screen_step.GPU_RESOURCE}"
        pods = self.training_pods(name)
        if pods:
            return f"node {name} runs training pod(s) {', '.join(pods[:3])}"
        return None

    def start(self, node: Mapping[str, Any]) -> str | None:
        """Create the screen Job on ``node`` (the node claimed first in the ledger); the Job's
        name, or None when a concurrent run claimed the node first."""
        name = str(node["metadata"]["name"])
        now = clock.now()
        job = idle_job_name(name, now)
        if not self.store.begin(name, job, now):
            return None
        manifest = screen_step.job_manifest(
            name=job,
            namespace=self.namespace,
            node_name=name,
            image=self.image,
            gpus=screen_step.node_gpus(node),
            deadline_seconds=self.settings.screen_deadline_seconds,
            remediation_id=None,
        )
        try:
            self.api.create_job(self.namespace, manifest)
        except RemediationError as exc:
            self.store.finish(name, job, "failed", clock.now(), f"Job not created: {exc}")
            raise
        metrics.add_metric(name=contract.SCREEN_STARTED_METRIC, unit=MetricUnit.Count, value=1)
        logger.info("idle screen started", extra={"node": name, "job": job})
        return job

    def due(self, entry: NodeScreen | None, now: datetime) -> bool:
        """Whether the node's last screen is older than the rescreen age (or there is none)."""
        if entry is None or entry.last_at is None:
            return True
        age = timedelta(days=self.settings.screen_rescreen_days)
        return clock.parse_iso(entry.last_at) <= now - age

    def run(self) -> RunSummary:
        """One scheduled run (module docstring)."""
        summary = RunSummary()
        screens = self.store.all()
        for entry in screens.values():
            if entry.running_job:
                try:
                    self.follow(entry, summary)
                except RemediationError as exc:
                    summary.errors[entry.node_name] = str(exc)[:300]
                    summary.running.append(entry.node_name)
                    logger.warning("idle screen not followed", extra={"node": entry.node_name,
                                   "error": str(exc)})  # fmt: skip
        screens = self.store.all()
        nodes = [n for n in self.api.list_nodes() if hyperpod_instance(n) is not None]
        now = clock.now()
        summary.unscreened = sum(1 for n in nodes if self.due(screens.get(_name(n)), now))
        slots = self.settings.screen_idle_max_nodes - sum(
            1 for e in screens.values() if e.running_job
        )

        def age(node: Mapping[str, Any]) -> str:
            entry = screens.get(_name(node))
            return (entry.last_at or "") if entry else ""  # "" sorts first: never screened

        for node in sorted(nodes, key=lambda n: (age(n), _name(n))):
            if slots <= 0:
                break
            name = _name(node)
            screened = screens.get(name)
            if not self.due(screened, now):
                continue
            try:
                if self.refusal(node, screened) is not None:
                    continue
                if self.start(node) is not None:
                    summary.started.append(name)
                    slots -= 1
            except RemediationError as exc:
                summary.errors[name] = str(exc)[:300]
                logger.warning("idle screen not started", extra={"node": name, "error": str(exc)})
        metrics.add_metric(
            name=contract.NODES_UNSCREENED_METRIC, unit=MetricUnit.Count, value=summary.unscreened
        )
        return summary

    def screen_node(self, node_name: str) -> str:
        """Screen ``node_name`` now (the manual action): the Job's name, or ``ScreenRefused``
        saying why not."""
        node = self.api.get_node(node_name)
        entry = self.store.get(node_name)
        why = self.refusal(node, entry)
        if why is not None:
            raise ScreenRefused(f"not screening: {why}")
        job = self.start(node)
        if job is None:
            raise ScreenRefused(f"not screening: node {node_name} already has a running screen")
        return job


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def handle(
    event: Mapping[str, Any], settings: Settings, kube: Callable[[], KubeApi]
) -> dict[str, Any]:
    """The screener's event: ``{"action": "run"}`` or ``{"action": "screen", "node": N}``;
    anything else is ``InvalidStepInput`` naming what is wrong."""
    action = event.get("action") if isinstance(event, Mapping) else None
    if action in ("run", "screen"):
        metrics.add_dimension(name=contract.CLUSTER_DIMENSION, value=settings.hyperpod_cluster_name)
    if action == "run":
        return IdleScreener(settings, kube).run().as_dict()
    if action == "screen":
        node = event.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidStepInput('the "screen" action needs "node": a node name')
        job = IdleScreener(settings, kube).screen_node(node)
        return {"node": node, "job": job}
    raise InvalidStepInput(
        f'the idle screener takes {{"action": "run"}} or {{"action": "screen", "node": N}}, '
        f"got action {str(action)[:80]!r}"
    )


__all__ = [
    "IdleScreener",
    "RunSummary",
    "ScreenRefused",
    "handle",
    "hyperpod_instance",
    "idle_job_name",
    "is_training_pod",
    "screen_report",
]
