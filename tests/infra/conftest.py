"""Fixtures for the CDK tests: each configuration is synthesized once per session, without
asset bundling (the stack is the same; only the layer's pip step is skipped)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra.app import synthesize_template

# Everything optional switched on: VPC placement, a scoped HyperPod ARN, label replacement,
# the liveness alarm, email subscriptions, a short approval timeout.
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
}


@dataclass
class Synth:
    """One synthesized configuration."""

    template: dict[str, Any]
    outdir: Path
    nag_error: str | None
    """None when cdk-nag passed; else the validation failure with its report."""


def _synth(
    tmp_path_factory: pytest.TempPathFactory, name: str, context: dict[str, Any] | None
) -> Synth:
    outdir = tmp_path_factory.mktemp(name)
    try:
        template = synthesize_template(context, with_nag=True, outdir=str(outdir))
        return Synth(template, outdir, None)
    except RuntimeError as error:
        if "ValidationFailed" not in str(error):
            raise
        report = (outdir / "validation-report.json").read_text(encoding="utf-8")
        # Keep the other tests meaningful: synthesize again without the checks.
        fallback = tmp_path_factory.mktemp(f"{name}-nonag")
        template = synthesize_template(context, with_nag=False, outdir=str(fallback))
        return Synth(template, fallback, report)


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The stack as cdk.json ships it (placeholder cluster names, defaults)."""
    return _synth(tmp_path_factory, "default", None)


@pytest.fixture(scope="session")
def variant_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The stack with every optional setting on (VARIANT_CONTEXT)."""
    return _synth(tmp_path_factory, "variant", VARIANT_CONTEXT)
