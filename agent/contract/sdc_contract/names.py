"""Names and identifiers that more than one part validates: Kubernetes names, HyperPod's node
names, EC2 instance ids, and the fixed values of the deployment's settings.

infra validates the deployment's settings at synth (``infra/config.py``), the functions validate
their environment when they read it (``sdc_remediation.config``) and every name a report carries
before they use it (localize): the same rule in each place, from here.
"""

from __future__ import annotations

import re
from typing import Literal

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
"""Node and pod names (Kubernetes' IsDNS1123Subdomain), at most ``MAX_SUBDOMAIN_CHARS``."""
DNS1123_LABEL = re.compile(rf"^{_DNS1123_LABEL}$")
"""Namespace names (IsDNS1123Label), at most ``MAX_LABEL_CHARS``."""
MAX_SUBDOMAIN_CHARS = 253
MAX_LABEL_CHARS = 63

INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
"""An EC2 instance id, as HyperPod reports its nodes: ``i-`` and 8 or 17 hex digits."""
NODE_NAME_PREFIX = "hyperpod-"
"""HyperPod names an instance's Kubernetes node ``hyperpod-<instance id>``."""

JOB_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""A training job's name as the pipeline accepts it in a report: a Kubernetes label value
(at most ``MAX_JOB_NAME_CHARS``), because the pipeline corroborates a report by the job-name
label of the job's pods (``DEFAULT_JOB_LABEL``), whose value the agent's job name follows."""
MAX_JOB_NAME_CHARS = 63
DEFAULT_JOB_LABEL = "training.kubeflow.org/job-name"
"""The pod label that names a pod's training job: the Kubeflow training operator's, set on every
pod of a PyTorchJob (context key ``jobLabel`` / ``JOB_LABEL`` names another)."""
_LABEL_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
GPU_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
"""A GPU's identifier in a report: ``GPU-<uuid>`` (NVIDIA), ``cuda:<n>`` or ``cpu`` as the agent
writes it; at most 64 characters of letters, digits and ``. _ : -``."""

IMAGE_REFERENCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")
"""A container image reference (``registry/path:tag`` or ``...@sha256:<digest>``): printable,
no spaces, at most 512 characters (the screen Job's image, ``screenImage`` / ``SCREEN_IMAGE``)."""

HEALTH_CHECK_TYPES: tuple[str, ...] = (
    "InstanceStress",
    "InstanceConnectivity",
    "MultiNodeTrainingValidation",
)
"""The DeepHealthChecks values StartClusterHealthCheck accepts (botocore 1.44's model)."""
DEFAULT_HEALTH_CHECKS: tuple[str, ...] = ("InstanceStress",)
REPLACE_MODES: tuple[Literal["api", "label"], ...] = ("api", "label")
"""How an approved node is replaced: BatchReplaceClusterNodes, or HyperPod's node label."""


def is_subdomain_name(value: str) -> bool:
    """Whether ``value`` is a valid node or pod name (DNS-1123 subdomain)."""
    return len(value) <= MAX_SUBDOMAIN_CHARS and bool(DNS1123_SUBDOMAIN.match(value))


def is_label_name(value: str) -> bool:
    """Whether ``value`` is a valid namespace name (DNS-1123 label)."""
    return len(value) <= MAX_LABEL_CHARS and bool(DNS1123_LABEL.match(value))


def is_instance_id(value: str) -> bool:
    """Whether ``value`` has the shape of an EC2 instance id."""
    return bool(INSTANCE_ID.match(value))


def is_job_name(value: str) -> bool:
    """Whether ``value`` is a job name the pipeline accepts (a Kubernetes label value)."""
    return 0 < len(value) <= MAX_JOB_NAME_CHARS and bool(JOB_NAME.match(value))


def is_label_key(value: str) -> bool:
    """Whether ``value`` is a Kubernetes label key: ``[prefix/]name``, the prefix a DNS-1123
    subdomain, the name at most 63 of letters, digits and ``- _ .``."""
    prefix, _, name = value.rpartition("/")
    if prefix and not is_subdomain_name(prefix):
        return False
    return 0 < len(name) <= MAX_LABEL_CHARS and bool(_LABEL_KEY_NAME.match(name))


def is_gpu_uuid(value: str) -> bool:
    """Whether ``value`` is a GPU identifier as a report may carry it (``GPU_UUID``)."""
    return bool(GPU_UUID.match(value))


def is_image_reference(value: str) -> bool:
    """Whether ``value`` has the shape of a container image reference (``IMAGE_REFERENCE``)."""
    return bool(IMAGE_REFERENCE.match(value))


def node_name_of(instance_id: str) -> str:
    """The Kubernetes node name HyperPod gives ``instance_id``."""
    return NODE_NAME_PREFIX + instance_id


APPROVAL_DECISION_ATTRIBUTES: tuple[str, ...] = (
    "approval_id",
    "status",
    "decision",
    "approver",
    "release",
    "decided_at",
    "decide_by",
    "expires_at",
    "node_name",
    "instance_id",
    "execution",
    "remediation_id",
)
"""The approvals table's attributes a step that acts on a decision reads (replace verifies the
decision it was sent against them): never the task token. The functions read exactly these
(a ProjectionExpression) and infra conditions that grant on them (``dynamodb:Attributes``)."""

__all__ = [
    "APPROVAL_DECISION_ATTRIBUTES",
    "DEFAULT_HEALTH_CHECKS",
    "DEFAULT_JOB_LABEL",
    "DNS1123_LABEL",
    "DNS1123_SUBDOMAIN",
    "GPU_UUID",
    "HEALTH_CHECK_TYPES",
    "IMAGE_REFERENCE",
    "INSTANCE_ID",
    "JOB_NAME",
    "MAX_JOB_NAME_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_SUBDOMAIN_CHARS",
    "NODE_NAME_PREFIX",
    "REPLACE_MODES",
    "is_gpu_uuid",
    "is_image_reference",
    "is_instance_id",
    "is_job_name",
    "is_label_key",
    "is_label_name",
    "is_subdomain_name",
    "node_name_of",
]
