"""The embedded AWS account both harnesses start from: a reset moto, and the HyperPod + EKS
cluster with one pod per rank (the in-process pipeline and the deployed rehearsal alike)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from tests.support.kube_standin import KubeStandIn

    from .hyperpod import HyperPodSimulator
    from .pipeline import Cluster

ACCOUNT = "123456789012"
REGION = "us-east-1"


def reset_embedded_aws(endpoint: str, *, timeout: float) -> None:
    """Empty moto's account (its backends are process globals) and configure it to execute
    state machines and run Lambdas in-process (no Docker)."""
    requests.post(f"{endpoint}/moto-api/reset", timeout=timeout).raise_for_status()
    requests.post(
        f"{endpoint}/moto-api/config",
        json={
            "stepfunctions": {"execute_state_machine": True},
            "lambda": {"use_docker": False},
        },
        timeout=timeout,
    ).raise_for_status()


def create_cluster(
    client: Callable[[str], Any],
    hyperpod: HyperPodSimulator,
    kube: KubeStandIn,
    cluster: Cluster,
) -> None:
    """Create ``cluster`` in the embedded account (``client(service)`` gives its boto3 clients):
    the HyperPod cluster with its instance ids, the EKS cluster, and each rank's pod on its node."""
    c = cluster
    client("sagemaker").create_cluster(
        ClusterName=c.hyperpod_name,
        InstanceGroups=[
            {
                "InstanceCount": len(c.instance_ids),
                "InstanceGroupName": c.instance_group,
                "InstanceType": "ml.p5.48xlarge",
                "LifeCycleConfig": {
                    "SourceS3Uri": "s3://sagemaker-lifecycle/",
                    "OnCreate": "on_create.sh",
                },
                "ExecutionRole": f"arn:aws:iam::{ACCOUNT}:role/hyperpod-nodes",
                "ThreadsPerCore": 1,
            }
        ],
    )
    hyperpod.adopt_instance_ids(c.hyperpod_name, c.instance_ids)
    client("eks").create_cluster(
        name=c.eks_name,
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )
    for node, instance_id in enumerate(c.instance_ids):
        for local in range(c.ranks_per_node):
            rank = node * c.ranks_per_node + local
            kube.add_pod(c.pod_name(rank), c.node_name(instance_id))
