"""Kubernetes access for the functions that read or patch nodes, each with the least it needs.

Each role gets an EKS access entry in ONE Kubernetes group, by what its step does:
- `sdc-reader` (localize, poll_health_check, start_health_check): read nodes, and pods in the
  training namespace. localize parses reports that training pods write (it lists a job's pods
  on a node to corroborate one); it must not be able to change anything in the cluster.
  start_health_check reads a shadowed node's health-check label before its check.
- `sdc-releaser` (approve): reads that a released node is uncordoned, then takes sdc-guard's
  label and annotations off it; the admission policy lets it change nothing else (not even
  spec.unschedulable).
- `sdc-cordoner` (cordon, uncordon): patch nodes, limited by the admission policy to
  spec.unschedulable and sdc-guard's own labels, taints and annotations.
- `sdc-replacer` (replace, only in REPLACE_MODE `label`): the one group allowed to set HyperPod's
  node-health-status label, which makes HyperPod replace the node.
- `sdc-screener` (screen): reads nodes (is the suspect cordoned, how many GPUs), and in the
  screening namespace only creates, reads and deletes Jobs and reads their pods
  (infra/k8s/screen-rbac.yaml); it can change no node.
- `sdc-idle-screener` (screen_idle, only where idle screening is on): lists nodes, and pods of
  every namespace (a node runs no training pod of any tenant before it is screened, and still
  runs none before its result counts), and in the screening namespace creates, reads, lists and
  deletes the screen Jobs and reads their pods. Everything of it is in
  infra/k8s/idle-screen-rbac.yaml, applied only where idle screening is on: a deployment
  without it grants nobody the cluster-wide pod read. It can change no node.
infra/k8s/rbac.yaml binds the groups; infra/k8s/admission-policy.yaml (a
ValidatingAdmissionPolicy) limits which fields the writers may change. Both are applied once
with kubectl. The cluster's authentication mode must include the EKS API (API or
API_AND_CONFIG_MAP).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_eks as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import SdcConfig
from infra.grants import allow

READER_GROUP = "sdc-reader"
CORDON_GROUP = "sdc-cordoner"
REPLACE_GROUP = "sdc-replacer"
RELEASE_GROUP = "sdc-releaser"
SCREEN_GROUP = "sdc-screener"
IDLE_SCREEN_GROUP = "sdc-idle-screener"

STEP_GROUPS: dict[str, str] = {
    "localize": READER_GROUP,
    "poll_health_check": READER_GROUP,
    "start_health_check": READER_GROUP,
    "approve": RELEASE_GROUP,
    "cordon": CORDON_GROUP,
    "uncordon": CORDON_GROUP,
    "replace": REPLACE_GROUP,
    "screen": SCREEN_GROUP,
    "screen_idle": IDLE_SCREEN_GROUP,
}
"""Step folder -> its Kubernetes group (infra/k8s/rbac.yaml; the idle screener's in
infra/k8s/idle-screen-rbac.yaml)."""

K8S_DIR = "infra/k8s"
"""Where the manifests are, relative to the repository root (the command runs there)."""


def kubernetes_rbac_command(config: SdcConfig) -> str:
    """The one command (stack output KubernetesRbacCommand) that binds every group the stack's
    access entries use: rbac.yaml and the admission policy in the training namespace; where
    the node screen is configured (`screenImage`), the screening namespace (created if
    missing) and screen-rbac.yaml in it, and where idle screening is on, idle-screen-rbac.yaml
    there too. Without an image the screen creates no Job, so no namespace is made for it."""
    command = (
        f"kubectl apply -n {config.training_namespace} -f {K8S_DIR}/rbac.yaml "
        f"-f {K8S_DIR}/admission-policy.yaml"
    )
    if config.screen_image is None:
        return command
    namespace = config.screen_namespace
    # `create --dry-run | apply` creates the namespace once and is a no-op on a rerun.
    command += (
        f" && kubectl create namespace {namespace} --dry-run=client -o yaml | kubectl apply -f -"
        f" && kubectl apply -n {namespace} -f {K8S_DIR}/screen-rbac.yaml"
    )
    if config.idle_screen_enabled:
        command += f" -f {K8S_DIR}/idle-screen-rbac.yaml"
    return command


KUBERNETES_GROUP = CORDON_GROUP
"""The group that may cordon (kept for importers; each step now has its own, STEP_GROUPS)."""


class EksAccess(Construct):
    """The EKS cluster the functions talk to (not created here): one STANDARD access entry per
    granted role, in the group of its step (`STEP_GROUPS`), and eks:DescribeCluster on it.

    Entries are keyed by a stable name (the step folder): the construct id derives from it, so
    adding or removing a step never replaces another step's entry (EKS allows one entry per
    principal, and CloudFormation would create the replacement before deleting the old one).
    A step without a group here is a wiring error, refused at synthesis.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str) -> None:
        super().__init__(scope, construct_id)
        self.cluster_name = cluster_name
        self.arn = cdk.Stack.of(self).format_arn(
            service="eks", resource="cluster", resource_name=cluster_name
        )
        self.entries: dict[str, eks.CfnAccessEntry] = {}

    def grant_kubernetes(self, step: str, grantee: iam.IGrantable) -> eks.CfnAccessEntry:
        """Let `grantee` (a role, or a function through its role) call the cluster's Kubernetes
        API as `step`: find the endpoint (eks:DescribeCluster on this cluster) and authenticate
        into `step`'s group, whose RBAC and admission policy say what it may read or change.
        Raises ValueError for a step without a group, or a second grant for one step."""
        if step not in STEP_GROUPS:
            raise ValueError(f"no Kubernetes group for step(s) {[step]}; add them to STEP_GROUPS")
        if step in self.entries:
            raise ValueError(f"step {step!r} already has an access entry")
        role_arn = getattr(grantee.grant_principal, "role_arn", None)
        if role_arn is None:  # jsii interfaces allow no isinstance check
            raise TypeError(f"an access entry needs a role; step {step!r} has no role")
        allow(
            grantee,
            sid="DescribeEksCluster",
            actions=["eks:DescribeCluster"],
            resources=[self.arn],
        )
        self.entries[step] = eks.CfnAccessEntry(
            self,
            step,
            cluster_name=self.cluster_name,
            principal_arn=role_arn,
            kubernetes_groups=[STEP_GROUPS[step]],
            type="STANDARD",
        )
        return self.entries[step]
