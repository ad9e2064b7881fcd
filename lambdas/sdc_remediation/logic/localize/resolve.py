"""From a rank the report names to the node, instance and instance group it runs on, with
every claim of the report checked: names well-formed, the node HyperPod's name of the instance,
a named pod the job's (in TRAINING_NAMESPACE) and on that node, the instance in the cluster, and
the cluster's corroboration that the job ran on that node (``RankResolver.corroborate``: a pod
of the job, by its job-name label and its training operator's owner reference where it has one,
on the node, that ran: Running, or ended with a started container within the lookback). Anything
else is ``UntrustedReport`` (or ``InstanceNotInCluster``, ``NodeNotFound``) naming the field,
before any node is touched."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import sdc_contract as contract
from sdc_contract.names import (
    NODE_NAME_PREFIX,
    is_instance_id,
    is_subdomain_name,
    node_name_of,
)

from ... import clock
from ...clients import hyperpod
from ...clients.kube import KubeApi, pod_ran_since, training_owner
from ...config import Settings
from ...errors import InstanceNotInCluster, NodeNotFound, UntrustedReport
from ...models import RankInfo, RankMap, Report
from ...observability import logger
from . import evidence
from .streams import ReportStreams


class RankResolver:
    """rank -> node (report, rank map, pod via Kubernetes) -> instance -> instance group, each
    checked against the others, the pod and HyperPod. One per localize: it caches the rank maps
    and instance groups it read."""

    def __init__(self, settings: Settings, kube: Callable[[], KubeApi]) -> None:
        self._settings = settings
        self._kube_factory = kube
        self._kube: KubeApi | None = None
        self._streams = ReportStreams.from_settings(settings)
        self._rank_maps: dict[tuple[str, str | None], RankMap | None] = {}
        self._writers: dict[tuple[str, str], str | None] = {}
        self._groups: dict[str, str] = {}
        self._corroborated: dict[tuple[str, str], bool] = {}
        self._operator_run: dict[str, bool] = {}

    def rank_info(self, report: Report, rank: int) -> RankInfo:
        """Where the report puts ``rank``, completed from the job's rank map."""
        info = report.ranks.get(str(rank)) or RankInfo()
        if info.node_name and info.instance_id:
            return info
        # Per-pod streams: the map the report's own (checked) writer wrote, none other.
        stream = report.log_stream if self._streams.per_pod else None
        key = (report.job, stream)
        if key not in self._rank_maps:
            self._rank_maps[key] = evidence.latest_rank_map(
                self._settings.report_log_group, report.job, stream
            )
        mapped = self._rank_maps[key]
        fallback = mapped.ranks.get(str(rank)) if mapped else None
        if fallback is None:
            return info
        merged = fallback.model_dump() | {
            k: v for k, v in info.model_dump().items() if v is not None
        }
        return RankInfo.model_validate(merged)

    def verify_writer(self, report: Report) -> None:
        """Per-pod streams: the pod that wrote the report's stream is a pod of the report's
        job (``UntrustedReport``, field ``log_stream``, otherwise). IAM proved which pod wrote
        the stream (its name is in the stream, from EKS Pod Identity's session tag); this
        proves the pod is the job's: it exists in TRAINING_NAMESPACE, carries the job's
        job-name label, and where a training operator runs the job, the operator owns it. A
        writer that no longer exists cannot be checked and is refused. Streams named by the
        job prove nothing about their writer: nothing to check."""
        if not self._streams.per_pod or report.job in contract.RESERVED_JOBS:
            return
        stream = report.log_stream or ""
        pod = self._streams.writer(stream, report.job)
        key = (report.job, stream)
        if key not in self._writers:
            self._writers[key] = self._writer_problem(report.job, stream, pod)
        problem = self._writers[key]
        if problem is not None:
            raise UntrustedReport(
                f"the report of job {report.job} in stream {stream[:160]!r}: {problem}",
                field="log_stream",
            )

    def _writer_problem(self, job: str, stream: str, pod: str | None) -> str | None:
        """Why the stream's pod is not ``job``'s, or None when it is."""
        namespace, label = self._settings.training_namespace, self._settings.job_label
        if pod is None:
            return f"not a stream of job {job}'s pods ({namespace}/{job}/<pod>)"
        try:
            found = self._kube_api().get_pod(pod, namespace)
        except NodeNotFound:
            return (
                f"its writer, pod {namespace}/{pod}, no longer exists: whose pod it was cannot "
                "be checked"
            )
        pod_job = ((found.get("metadata") or {}).get("labels") or {}).get(label)
        if pod_job != job:
            return f"its writer, pod {namespace}/{pod}, is not job {job}'s ({label}={str(pod_job)[:80]!r})"
        owner = training_owner(found)
        if owner is not None and owner[1] != job:
            return f"its writer, pod {namespace}/{pod}, is owned by {owner[0]} {owner[1][:80]!r}"
        if owner is None and self._run_by_operator(job):
            return (
                f"its writer, pod {namespace}/{pod}, carries the job's label but the training "
                f"operator that runs job {job} does not own it"
            )
        return None

    def _kube_api(self) -> KubeApi:
        if self._kube is None:
            self._kube = self._kube_factory()
        return self._kube

    def verified_node(self, info: RankInfo, rank: int, job: str) -> tuple[str, str]:
        """(node name, instance id) of a rank, each checked against the other, the pod and
        HyperPod; ``UntrustedReport`` names the field that does not hold."""
        where = f"job {job} rank {rank}"
        node, instance_id, pod = info.node_name, info.instance_id, info.pod_name
        if node is not None and not is_subdomain_name(node):
            raise UntrustedReport(
                f"{where}: {node!r} is not a Kubernetes node name", field=f"ranks.{rank}.node_name"
            )
        if instance_id is not None and not is_instance_id(instance_id):
            raise UntrustedReport(
                f"{where}: {instance_id!r} is not an instance id",
                field=f"ranks.{rank}.instance_id",
            )
        if pod is not None:
            node = self._verified_pod_node(pod, node, where, rank, job)
        if node is None:
            raise NodeNotFound(
                f"{where}: neither the report nor the rank map gives its node or pod"
            )
        if instance_id is None:
            instance_id = node.removeprefix(NODE_NAME_PREFIX)
            if not node.startswith(NODE_NAME_PREFIX) or not is_instance_id(instance_id):
                raise UntrustedReport(
                    f"{where}: node {node!r} is not a HyperPod node (hyperpod-<instance id>)",
                    field=f"ranks.{rank}.node_name",
                )
        elif node != node_name_of(instance_id):
            raise UntrustedReport(
                f"{where}: the report puts instance {instance_id} on node {node!r}, but HyperPod "
                f"names that instance's node {node_name_of(instance_id)!r}",
                field=f"ranks.{rank}.instance_id",
            )
        return node, instance_id

    def _verified_pod_node(
        self, pod: str, node: str | None, where: str, rank: int, job: str
    ) -> str:
        """The node the job's pod runs on; it must be the node the report names, if any, and
        carry the job's job-name label."""
        namespace = self._settings.training_namespace
        if not is_subdomain_name(pod):
            raise UntrustedReport(
                f"{where}: {pod!r} is not a pod name", field=f"ranks.{rank}.pod_name"
            )
        try:
            found = self._kube_api().get_pod(pod, namespace)
        except NodeNotFound as exc:
            if node is None:
                raise NodeNotFound(
                    f"{where}: no scheduled pod {pod!r} in namespace {namespace!r} "
                    "(TRAINING_NAMESPACE) to find the rank's node by"
                ) from exc
            # The job's pod may be gone by now (a job that stopped on the alarm); the node and
            # instance are still checked against each other and against HyperPod.
            logger.info("reported pod no longer exists", extra={"pod": pod, "node": node})
            return node
        label = self._settings.job_label
        pod_job = ((found.get("metadata") or {}).get("labels") or {}).get(label)
        if pod_job != job:
            raise UntrustedReport(
                f"{where}: pod {namespace}/{pod} is not job {job}'s (its {label} label is "
                f"{str(pod_job)[:80]!r})",
                field=f"ranks.{rank}.pod_name",
            )
        pod_node = (found.get("spec") or {}).get("nodeName")
        if not pod_node:
            if node is None:
                raise NodeNotFound(f"{where}: pod {namespace}/{pod} is not scheduled on a node")
            return node
        if node is not None and node != pod_node:
            raise UntrustedReport(
                f"{where}: the report puts pod {namespace}/{pod} on node {node!r}, Kubernetes "
                f"schedules it on {pod_node!r}",
                field=f"ranks.{rank}.node_name",
            )
        return pod_node

    def corroborate(self, job: str, node: str, since: datetime) -> None:
        """The cluster confirms that ``job`` ran on ``node``: a pod in TRAINING_NAMESPACE on
        that node whose job-name label (JOB_LABEL) is the job and that ran (``pod_ran_since``:
        Running, or ended with a started container at or after ``since``, the alarm's
        lookback). Otherwise ``UntrustedReport`` (field ``job``): a report is a claim by a pod,
        and a job may not name a node it did not run on.

        Where a training operator runs the job (a pod of the job in the namespace has a
        controller owner reference to a ``PyTorchJob``, ``TrainJob``, ... named the job), only
        a pod with that owner counts: a bare pod that a namespace editor labels with the job
        and binds to a node by ``spec.nodeName`` is not the operator's. A pod whose training
        owner names another job never counts (its label and its owner disagree). Labels and
        owner references are still whatever the namespace's editors write (lambdas/README)."""
        key = (job, node)
        if key not in self._corroborated:
            namespace, label = self._settings.training_namespace, self._settings.job_label
            pods = self._kube_api().list_pods(
                namespace, label_selector={label: job}, node_name=node
            )
            ran = [pod for pod in pods if pod_ran_since(pod, since)]
            owners = [training_owner(pod) for pod in ran]
            if any(owner is not None and owner[1] == job for owner in owners):
                self._corroborated[key] = True
            elif any(owner is None for owner in owners):
                # Only pods without a training owner ran here: they count unless the operator
                # runs this job (then they are not its pods).
                self._corroborated[key] = not self._run_by_operator(job)
            else:
                self._corroborated[key] = False
        if not self._corroborated[key]:
            namespace, label = self._settings.training_namespace, self._settings.job_label
            raise UntrustedReport(
                f"job {job} names node {node}, but no pod of it ({label}={job}) ran there in "
                f"namespace {namespace} since {clock.iso(since)}: a job may only name nodes "
                "it runs on (a pod that never started, or one the job's training operator does "
                "not own, is no proof)",
                field="job",
            )

    def _run_by_operator(self, job: str) -> bool:
        """Whether a training operator runs ``job``: one of the job's pods in the namespace
        (any node, any phase) has a controller owner reference to an operator's job of that
        name."""
        if job not in self._operator_run:
            namespace, label = self._settings.training_namespace, self._settings.job_label
            pods = self._kube_api().list_pods(
                namespace, label_selector={label: job}, node_name=None
            )
            self._operator_run[job] = any(
                (owner := training_owner(pod)) is not None and owner[1] == job for pod in pods
            )
        return self._operator_run[job]

    def instance_group(self, instance_id: str) -> str:
        """The instance's group; ``InstanceNotInCluster`` when HyperPod does not know it."""
        if instance_id not in self._groups:
            cluster = self._settings.hyperpod_cluster_name
            node = hyperpod.require_node(cluster, instance_id)
            group = node.get("InstanceGroupName")
            if not group:
                raise InstanceNotInCluster(
                    f"instance {instance_id} has no instance group in {cluster}"
                )
            self._groups[instance_id] = group
        return self._groups[instance_id]


__all__ = ["RankResolver"]
