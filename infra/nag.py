"""cdk-nag (AwsSolutionsChecks) wiring, and the one way this project acknowledges a finding.

cdk-nag 3.x runs as a CDK policy-validation plugin: synth fails with a report when a finding is
not acknowledged. Acknowledgments are recorded on the construct they concern, each with the
reason a reviewer would need (docs/deploy.md lists them).
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

ANY_RESOURCE = "AwsSolutions-IAM5[Resource::*]"
"""The IAM5 finding for a statement on `"Resource": "*"`."""


def add_checks(app: cdk.App) -> None:
    """Run the AWS Solutions rules on every stack of `app` at synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge finding `rule_id` (e.g. "AwsSolutions-IAM5[Resource::*]") on `scope` and
    everything below it.

    Several grants may need the same finding on one role (`*` for X-Ray, and for
    cloudwatch:GetMetricData): CDK keeps only the last reason given per scope and id, so each
    acknowledgment carries the earlier reasons too and the report shows every one.
    """
    earlier = [
        given
        for entry in scope.node.metadata
        if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for key, given in dict(entry.data or {}).items()
        if key == rule_id or key.endswith(f"::{rule_id}")
    ]
    if earlier and reason in earlier[-1]:
        return
    if earlier:
        reason = f"{earlier[-1]}; {reason}"
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def wildcard_resource_finding(scope: IConstruct, resource: str) -> str:
    """The id cdk-nag gives the IAM5 finding for `resource` (an ARN, possibly with tokens).

    IAM5 reports one finding per wildcard resource, rendered the way cdk-nag's
    flattenCfnReference renders intrinsics (Ref -> <X>, GetAtt -> <X.Attr>, Join -> joined);
    acknowledging that exact id keeps every other wildcard on the same policy a finding.
    """
    return f"AwsSolutions-IAM5[Resource::{_flatten(cdk.Stack.of(scope).resolve(resource))}]"


def _flatten(node: Any) -> str:
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict):
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return delimiter.join(_flatten(item) for item in items)
        if "Fn::Sub" in node:
            return _flatten(node["Fn::Sub"])
        if "Fn::GetAtt" in node:
            resource, attribute = node["Fn::GetAtt"]
            return f"<{_flatten(resource)}.{_flatten(attribute)}>"
        if "Fn::ImportValue" in node:
            return _flatten(node["Fn::ImportValue"])
        if "Ref" in node:
            return f"<{_flatten(node['Ref'])}>"
    return json.dumps(node, separators=(",", ":"))
