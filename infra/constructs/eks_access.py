"""Kubernetes access for the functions that read or patch nodes.

Each role gets an EKS access entry in the Kubernetes group `sdc-remediator`; what that group may
do is defined by infra/k8s/rbac.yaml (nodes get/list/patch, pods get/list), applied once with
kubectl. The cluster's authentication mode must include the EKS API (API or API_AND_CONFIG_MAP).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import aws_eks as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

KUBERNETES_GROUP = "sdc-remediator"
"""Bound to the ClusterRole in infra/k8s/rbac.yaml."""


class EksAccess(Construct):
    """One STANDARD access entry per role, all in the `sdc-remediator` group.

    `roles` is keyed by a stable name (the step folder): the construct id derives from it, so
    adding or removing a step never replaces another step's entry (EKS allows one entry per
    principal, and CloudFormation would create the replacement before deleting the old one).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        roles: Mapping[str, iam.IRole],
    ) -> None:
        super().__init__(scope, construct_id)
        self.entries = {
            name: eks.CfnAccessEntry(
                self,
                name,
                cluster_name=cluster_name,
                principal_arn=role.role_arn,
                kubernetes_groups=[KUBERNETES_GROUP],
                type="STANDARD",
            )
            for name, role in roles.items()
        }
