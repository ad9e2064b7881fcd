"""Fixtures for the CDK tests: each configuration is synthesized once per session, without
asset bundling (the stack is the same; only the layer's pip step is skipped)."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from tests.infra.infra_synth import Synth, synthesize

# Everything optional switched on: VPC placement, a scoped HyperPod ARN, label replacement,
# the liveness alarm, email subscriptions, a short approval timeout, the agent's grants scoped by
# EKS Pod Identity's session tags to its own namespace and pod streams.
VARIANT_CONTEXT: dict[str, Any] = {
    "hyperPodClusterName": "ml-prod",
    "eksClusterName": "ml-prod-eks",
    "hyperPodClusterArn": "arn:aws:sagemaker:us-west-2:123456789012:cluster/abcdef123456",
    "vpcId": "vpc-0123456789abcdef0",
    "subnetIds": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"],
    "replaceMode": "label",
    "livenessJobName": "llama-70b",
    "notificationEmails": ["oncall@example.com", "ml-platform@example.com"],
    "approvalTimeout": "2h",
    "alarmThresholds": {"sdc_replay_mismatch": 2},
    "agentIdentity": "pod-identity",
    "trainingNamespace": "ml-training",
}


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The stack as cdk.json ships it (placeholder cluster names, defaults)."""
    return synthesize(tmp_path_factory, "default", None)


@pytest.fixture(scope="session")
def variant_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The stack with every optional setting on (VARIANT_CONTEXT)."""
    return synthesize(tmp_path_factory, "variant", VARIANT_CONTEXT)
