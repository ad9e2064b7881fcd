"""The one way a construct grants (infra/grants.py): a wildcard needs a reason, the reason is
acknowledged on the grantee for that resource only, and several reasons on one role all stay in
cdk-nag's report."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import aws_iam as iam

from infra import nag
from infra.constructs.eks_access import EksAccess
from infra.grants import allow


def _role() -> tuple[cdk.Stack, iam.Role]:
    stack = cdk.Stack(cdk.App(), "Test")
    return stack, iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))


def _acknowledged(role: iam.Role) -> dict[str, str]:
    """The newest reason per finding id recorded on `role` (what cdk-nag's report shows)."""
    found: dict[str, str] = {}
    for entry in role.node.metadata:
        if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
            found.update(dict(entry.data or {}))
    return found


def test_a_wildcard_resource_without_a_reason_is_refused() -> None:
    # Given a role
    _, role = _role()
    # When a grant names "*" without saying why, then it is refused naming the grant
    with pytest.raises(ValueError, match=r"grant 'Broad'.*wildcard_reason"):
        allow(role, sid="Broad", actions=["cloudwatch:ListMetrics"], resources=["*"])


def test_each_wildcard_reason_is_kept_on_the_role() -> None:
    # Given two grants on one role that each need "*" for their own reason
    stack, role = _role()
    allow(
        role,
        sid="Metrics",
        actions=["cloudwatch:ListMetrics"],
        resources=["*"],
        wildcard_reason="ListMetrics has no resource-level permissions",
    )
    allow(
        role,
        sid="Datum",
        actions=["cloudwatch:PutMetricData"],
        resources=["*"],
        wildcard_reason="PutMetricData has no resource-level permissions",
    )
    # Then the one finding id on the role carries both reasons
    (reason,) = [r for k, r in _acknowledged(role).items() if k.endswith(nag.ANY_RESOURCE)]
    assert "ListMetrics has" in reason and "PutMetricData has" in reason
    # And an ARN pattern is acknowledged as that exact resource, not as "*"
    pattern = stack.format_arn(service="states", resource="execution", resource_name="m:*")
    allow(role, sid="Runs", actions=["states:DescribeExecution"], resources=[pattern],
          wildcard_reason="execution names are made at run time")  # fmt: skip
    exact = nag.wildcard_resource_finding(role, pattern)
    assert any(k.endswith(exact) for k in _acknowledged(role))
    assert exact != nag.ANY_RESOURCE


def test_eks_access_refuses_a_step_without_a_group_and_a_second_entry() -> None:
    # Given the EKS access construct and a role
    stack, role = _role()
    access = EksAccess(stack, "EksAccess", cluster_name="eks")
    # When a step without a Kubernetes group asks for access, then it is refused by name
    with pytest.raises(ValueError, match=r"no Kubernetes group for step\(s\) \['admit'\]"):
        access.grant_kubernetes("admit", role)
    # And one step gets one entry (EKS allows one per principal)
    access.grant_kubernetes("cordon", role)
    with pytest.raises(ValueError, match="'cordon' already has an access entry"):
        access.grant_kubernetes("cordon", role)
