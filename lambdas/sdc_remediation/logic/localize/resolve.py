"""From a rank the report names to the node, instance and instance group it runs on, with
every claim of the report checked: names well-formed, the node HyperPod's name of the instance,
a named pod the job's (in TRAINING_NAMESPACE) and on that node, the instance in the cluster.
Anything else is ``UntrustedReport`` (or ``InstanceNotInCluster``, ``NodeNotFound``) naming the
field, before any node is touched."""

from __future__ import annotations

from collections.abc import Callable

from sdc_contract.names import (
    NODE_NAME_PREFIX,
    is_instance_id,
    is_subdomain_name,
    node_name_of,
)

from ...clients import hyperpod
from ...clients.kube import KubeApi
from ...config import Settings
from ...errors import InstanceNotInCluster, NodeNotFound, UntrustedReport
from ...models import RankInfo, RankMap, Report
from ...observability import logger
from . import evidence


class RankResolver:
    """rank -> node (report, rank map, pod via Kubernetes) -> instance -> instance group, each
    checked against the others, the pod and HyperPod. One per localize: it caches the rank maps
    and instance groups it read."""

    def __init__(self, settings: Settings, kube: Callable[[], KubeApi]) -> None:
        self._settings = settings
        self._kube_factory = kube
        self._kube: KubeApi | None = None
        self._rank_maps: dict[str, RankMap | None] = {}
        self._groups: dict[str, str] = {}

    def rank_info(self, report: Report, rank: int) -> RankInfo:
        """Where the report puts ``rank``, completed from the job's rank map."""
        info = report.ranks.get(str(rank)) or RankInfo()
        if info.node_name and info.instance_id:
            return info
        if report.job not in self._rank_maps:
            self._rank_maps[report.job] = evidence.latest_rank_map(
                self._settings.report_log_group, report.job
            )
        mapped = self._rank_maps[report.job]
        fallback = mapped.ranks.get(str(rank)) if mapped else None
        if fallback is None:
            return info
        merged = fallback.model_dump() | {
            k: v for k, v in info.model_dump().items() if v is not None
        }
        return RankInfo.model_validate(merged)

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
            node = self._verified_pod_node(pod, node, where, rank)
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

    def _verified_pod_node(self, pod: str, node: str | None, where: str, rank: int) -> str:
        """The node the job's pod runs on; it must be the node the report names, if any."""
        namespace = self._settings.training_namespace
        if not is_subdomain_name(pod):
            raise UntrustedReport(
                f"{where}: {pod!r} is not a pod name", field=f"ranks.{rank}.pod_name"
            )
        try:
            pod_node = self._kube_api().node_of_pod(pod, namespace)
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
        if node is not None and node != pod_node:
            raise UntrustedReport(
                f"{where}: the report puts pod {namespace}/{pod} on node {node!r}, Kubernetes "
                f"schedules it on {pod_node!r}",
                field=f"ranks.{rank}.node_name",
            )
        return pod_node

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
