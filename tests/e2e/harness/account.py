"""The embedded AWS account both harnesses start from: a reset moto, and the HyperPod + EKS
cluster with one pod per rank (the in-process pipeline and the deployed rehearsal alike)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from tests.support.kube_standin import KubeStandIn

    from .hyperpod import HyperPodSimulator

ACCOUNT = "123456789012"
REGION = "us-east-1"


@dataclass
class Cluster:
    """The simulated HyperPod cluster: instance ids, and the training job's pods on them."""

    hyperpod_name: str
    eks_name: str
    instance_ids: list[str]
    instance_group: str = "workers"
    job: str = "llama-pretrain"
    ranks_per_node: int = 2

    def node_name(self, instance_id: str) -> str:
        """HyperPod names each Kubernetes node after its instance."""
        return f"hyperpod-{instance_id}"

    def pod_name(self, rank: int) -> str:
        """The pod of global ``rank`` (a PyTorchJob names its workers like this)."""
        return f"{self.job}-worker-{rank}"


def embedded_aws_environment(endpoint: str, port: int) -> dict[str, str]:
    """What a process needs to talk to the embedded AWS at ``endpoint``: the endpoint, fake
    credentials, region. ``MOTO_PORT``: moto's Step Functions executor calls Lambda at
    localhost:$MOTO_PORT."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "MOTO_PORT": str(port),
    }


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


def create_hyperpod_cluster(client: Callable[[str], Any], cluster: Cluster) -> None:
    """The HyperPod cluster itself, unless the account has it already: it exists before the
    stack is deployed (the stack looks its ARN up at deploy time)."""
    c = cluster
    sagemaker = client("sagemaker")
    try:
        sagemaker.describe_cluster(ClusterName=c.hyperpod_name)
        return
    except sagemaker.exceptions.ClientError:
        pass  # not there yet
    sagemaker.create_cluster(
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


def create_cluster(
    client: Callable[[str], Any],
    hyperpod: HyperPodSimulator,
    kube: KubeStandIn,
    cluster: Cluster,
) -> None:
    """Create ``cluster`` in the embedded account (``client(service)`` gives its boto3 clients):
    the HyperPod cluster with its instance ids (or adopt it, when it was created before the
    stack was deployed), the EKS cluster, and each rank's pod on its node."""
    c = cluster
    create_hyperpod_cluster(client, c)
    hyperpod.adopt_instance_ids(c.hyperpod_name, c.instance_ids)
    client("eks").create_cluster(
        name=c.eks_name,
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )
    for node, instance_id in enumerate(c.instance_ids):
        for local in range(c.ranks_per_node):
            rank = node * c.ranks_per_node + local
            # Each rank's pod carries the job's job-name label (the PyTorchJob's), which
            # localize's corroboration looks for on the node a report names.
            kube.add_job_pod(c.job, c.node_name(instance_id), name=c.pod_name(rank))
