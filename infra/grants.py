"""The one way a construct grants on what it owns: a statement with a Sid on the grantee's policy,
and, next to it, the acknowledgment of any wildcard resource it needs.

Each construct's `grant_*` methods call `allow`; the stack decides who gets which grant
(docs/architecture.md, "The stack"). CDK's own `table.grant_read_write_data()` and
`topic.grant_publish()` are not used: they add `index/*` and `kms:GenerateDataKey*` wildcards,
where these grants name the exact actions and resources the functions use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import nag


def allow(
    grantee: iam.IGrantable,
    *,
    sid: str,
    actions: Sequence[str],
    resources: Sequence[str],
    conditions: Mapping[str, Any] | None = None,
    wildcard_reason: str | None = None,
) -> iam.PolicyStatement:
    """Add `actions` on `resources` to `grantee`'s policy under `sid`; returns the statement.

    A resource with a `*` in it (an ARN pattern, or `*` for actions without resource-level
    permissions) is a cdk-nag IAM5 finding: `wildcard_reason` is then required, and the finding
    is acknowledged with it on the grantee (a role, or a managed policy), that exact resource
    only. Raises ValueError for a wildcard without a reason.
    """
    wildcards = [resource for resource in resources if "*" in resource]
    if wildcards and not wildcard_reason:
        raise ValueError(f"grant {sid!r}: wildcard resource(s) {wildcards} need a wildcard_reason")
    statement = iam.PolicyStatement(
        sid=sid,
        actions=list(actions),
        resources=list(resources),
        conditions=dict(conditions) if conditions else None,
    )
    grantee.grant_principal.add_to_principal_policy(statement)
    scope = acknowledgment_scope(grantee)
    for resource in wildcards:
        finding = (
            nag.ANY_RESOURCE if resource == "*" else nag.wildcard_resource_finding(scope, resource)
        )
        nag.acknowledge(scope, finding, wildcard_reason or "")
    return statement


def deny(
    grantee: iam.IGrantable,
    *,
    sid: str,
    actions: Sequence[str],
    resources: Sequence[str],
) -> iam.PolicyStatement:
    """Deny `actions` on `resources` in `grantee`'s policy under `sid` (an explicit deny wins
    over any allow, of this policy or another); returns the statement. For a carve-out of a
    wildcard grant: the resources are named exactly."""
    statement = iam.PolicyStatement(
        sid=sid, effect=iam.Effect.DENY, actions=list(actions), resources=list(resources)
    )
    grantee.grant_principal.add_to_principal_policy(statement)
    return statement


def acknowledgment_scope(grantee: iam.IGrantable) -> Construct:
    """Where a finding on `grantee`'s policy is acknowledged: its role (a function's grant
    principal), else the grantee itself (a managed policy, whose principal is not a construct)."""
    principal = grantee.grant_principal
    if isinstance(principal, Construct):
        return principal
    if isinstance(grantee, Construct):
        return grantee
    raise TypeError(
        f"cannot acknowledge a finding on {grantee!r}: neither it nor its principal is a construct"
    )
