"""HyperPod on moto: a cluster whose node ids are EC2 instance ids, plus the two calls moto lacks.

moto 5.2.5 models SageMaker clusters and their nodes (DescribeClusterNode, ListClusterNodes) but
not StartClusterHealthCheck or BatchReplaceClusterNodes. This documented in-test extension adds
both to moto's SageMaker responses (the same request parsing and error shapes moto uses), with the
state a real cluster shows:
- a deep health check sets the node's InstanceStatus to DeepHealthCheckInProgress and the
  Kubernetes label ``sagemaker.amazonaws.com/deep-health-check-status=InProgress``; after
  ``health_check_seconds`` it ends Passed (back to Running) or Failed; a failed node with automatic
  node recovery is replaced by HyperPod itself (a new instance id, a new Kubernetes node);
- BatchReplaceClusterNodes replaces each node: the old instance and Kubernetes node disappear, a
  new instance id joins the same instance group; unknown ids come back in Failed[] with
  InstanceIdNotFound.
What it cannot prove: the real service's timings, its validation beyond the service model, or
what the deep health check actually tests on a GPU.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from moto.sagemaker.models import ClusterNode, sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse

from tests.support.kube_standin import KubeStandIn

HEALTH_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
NODE_HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"

Outcome = Literal["passed", "failed"]


@dataclass
class HyperPodSimulator:
    """Owns the simulated cluster's behaviour; install() patches moto's SageMaker responses."""

    kube: KubeStandIn
    account_id: str = "123456789012"
    region: str = "us-east-1"
    health_check_seconds: float = 1.0
    health_check_outcome: Outcome = "passed"
    automatic_node_recovery: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)
    replaced: dict[str, str] = field(default_factory=dict)
    """Old instance id -> the instance id that replaced it."""
    _ids: Any = field(default_factory=lambda: itertools.count(0xA000))
    _timers: list[threading.Timer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _saved: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ set-up
    def install(self) -> HyperPodSimulator:
        """Add the two operations to moto's SageMaker responses (undo with uninstall())."""
        simulator = self

        def start_cluster_health_check(response: SageMakerResponse) -> str:
            return json.dumps(simulator.start_health_check(json.loads(response.body)))

        def batch_replace_cluster_nodes(response: SageMakerResponse) -> str:
            return json.dumps(simulator.batch_replace(json.loads(response.body)))

        for name, fn in (
            ("start_cluster_health_check", start_cluster_health_check),
            ("batch_replace_cluster_nodes", batch_replace_cluster_nodes),
        ):
            self._saved[name] = getattr(SageMakerResponse, name, None)
            setattr(SageMakerResponse, name, fn)
        return self

    def uninstall(self) -> None:
        """Remove the patches and stop pending health checks."""
        for timer in self._timers:
            timer.cancel()
        for name, original in self._saved.items():
            if original is None:
                delattr(SageMakerResponse, name)
            else:
                setattr(SageMakerResponse, name, original)
        self._saved.clear()

    def _backend(self) -> Any:
        return sagemaker_backends[self.account_id][self.region]

    def _cluster(self, name: str) -> Any:
        cluster = self._backend().clusters.get(name.split("/")[-1])
        if cluster is None:
            raise KeyError(f"no cluster {name!r}")
        return cluster

    def adopt_instance_ids(self, cluster_name: str, instance_ids: list[str]) -> None:
        """Give moto's nodes (``workers-0``, ...) real-looking instance ids, and mirror them in
        Kubernetes as ``hyperpod-<instance id>`` nodes, as HyperPod names them."""
        cluster = self._cluster(cluster_name)
        old = list(cluster.nodes.values())
        if len(old) != len(instance_ids):
            raise ValueError(f"cluster has {len(old)} nodes, got {len(instance_ids)} instance ids")
        cluster.nodes.clear()
        for node, instance_id in zip(old, instance_ids, strict=True):
            node.instance_id = instance_id
            cluster.nodes[instance_id] = node
            self._add_kube_node(instance_id, node.instance_group_name)

    # ------------------------------------------------------------------ the two operations
    def start_health_check(self, request: dict[str, Any]) -> dict[str, Any]:
        """StartClusterHealthCheck: every listed instance goes DeepHealthCheckInProgress."""
        self.calls.append({"operation": "StartClusterHealthCheck", **request})
        cluster = self._cluster(request["ClusterName"])
        for config in request["DeepHealthCheckConfigurations"]:
            for instance_id in config["InstanceIds"]:
                node = cluster.nodes.get(instance_id)
                if node is None:
                    raise ValueError(f"instance {instance_id} is not in the cluster")
                node.status = "DeepHealthCheckInProgress"
                self._label(
                    instance_id, {HEALTH_LABEL: "InProgress", NODE_HEALTH_LABEL: "Unschedulable"}
                )
                self._later(lambda i=instance_id: self._finish_health_check(cluster, i))
        return {"ClusterArn": cluster.arn}

    def batch_replace(self, request: dict[str, Any]) -> dict[str, Any]:
        """BatchReplaceClusterNodes: Successful[] and Failed[] as the service model has them."""
        self.calls.append({"operation": "BatchReplaceClusterNodes", **request})
        cluster = self._cluster(request["ClusterName"])
        successful, failed = [], []
        for instance_id in request.get("NodeIds", []):
            if instance_id not in cluster.nodes:
                failed.append(
                    {
                        "NodeId": instance_id,
                        "ErrorCode": "InstanceIdNotFound",
                        "Message": f"Node {instance_id} not found in the cluster",
                    }
                )
                continue
            self._replace(cluster, instance_id)
            successful.append(instance_id)
        return {"Successful": successful, "Failed": failed}

    # ------------------------------------------------------------------ behaviour
    def _later(self, action: Callable[[], None]) -> None:
        timer = threading.Timer(self.health_check_seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _label(self, instance_id: str, labels: dict[str, str]) -> None:
        self.kube.set_labels(f"hyperpod-{instance_id}", labels)

    def _add_kube_node(self, instance_id: str, instance_group: str) -> None:
        self.kube.add_node(
            f"hyperpod-{instance_id}",
            labels={
                "sagemaker.amazonaws.com/instance-group-name": instance_group,
                NODE_HEALTH_LABEL: "Schedulable",
            },
        )

    def _finish_health_check(self, cluster: Any, instance_id: str) -> None:
        with self._lock:
            node = cluster.nodes.get(instance_id)
            if node is None:
                return
            node.status = "Running"
            if self.health_check_outcome == "passed":
                self._label(instance_id, {HEALTH_LABEL: "Passed", NODE_HEALTH_LABEL: "Schedulable"})
                return
            self._label(
                instance_id,
                {HEALTH_LABEL: "Failed", NODE_HEALTH_LABEL: "UnschedulablePendingReplacement"},
            )
            if self.automatic_node_recovery:
                self._replace(cluster, instance_id)

    def _replace(self, cluster: Any, instance_id: str) -> str:
        old = cluster.nodes.pop(instance_id)
        new_id = f"i-{next(self._ids):017x}"
        cluster.nodes[new_id] = ClusterNode(
            region_name=old.region_name,
            account_id=old.account_id,
            cluster_name=old.cluster_name,
            instance_group_name=old.instance_group_name,
            instance_type=old.instance_type,
            life_cycle_config=old.life_cycle_config,
            execution_role=old.execution_role,
            node_id=new_id,
            threads_per_core=old.threads_per_core,
        )
        self.replaced[instance_id] = new_id
        self.kube.remove_node(f"hyperpod-{instance_id}")
        self._add_kube_node(new_id, old.instance_group_name)
        return new_id
