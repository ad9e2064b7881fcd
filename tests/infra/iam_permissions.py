"""The IAM of a synthesized template as plain, comparable text: who may do what, on what.

    .venv/bin/python -m tests.infra.iam_permissions --write

rewrites tests/infra/pinned_permissions.json (what test_infra_permissions.py pins) from the
stack as this tree synthesizes it; the diff of that file is then the review of the change.

Two syntheses of the stack (before and after a refactor, or today's and a pinned table) are
compared on this, never on the raw template: logical ids lose their hash suffix, references are
rendered as `<Id>` / `<Id.Attr>`, and each principal's statements become sorted lines, so the
order in which constructs add statements does not matter but every action, resource, condition
and Sid does.

Principals: a function's role is `function:<folder>` (its handler's folder), any other role
`role:<Id>`, a managed policy `managed:<Id>`; resource policies (key, topic, queue policies and
Lambda permissions) are `resource:<Id>`. A role's trust policy is listed under the role as
`assume ...` lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_HASH = re.compile(r"[0-9A-F]{8}$")

PINNED = Path(__file__).with_name("pinned_permissions.json")
"""Per configuration: each function's role's and each managed policy's statements."""


def normalise_id(logical_id: str) -> str:
    """A logical id without CDK's 8-character hash suffix (readable; stable across a move only
    if the construct path is, which the caller checks separately)."""
    return _HASH.sub("", logical_id)


def render(node: Any) -> str:
    """A CloudFormation value as text: Ref -> <Id>, GetAtt -> <Id.Attr>, Join joined, pseudo
    parameters kept by name; anything else as canonical JSON."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref":
            return f"<{value if value.startswith('AWS::') else normalise_id(value)}>"
        if key == "Fn::GetAtt":
            return f"<{normalise_id(value[0])}.{value[1]}>"
        if key == "Fn::Join":
            delimiter, parts = value
            return delimiter.join(render(part) for part in parts)
    return json.dumps(_resolve(node), sort_keys=True, separators=(",", ":"))


def _resolve(node: Any) -> Any:
    """Render references inside a nested value (conditions, principals)."""
    if isinstance(node, list):
        return [_resolve(item) for item in node]
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in ("Ref", "Fn::GetAtt", "Fn::Join"):
            return render(node)
        return {key: _resolve(value) for key, value in node.items()}
    return node


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statement_lines(statement: Mapping[str, Any], *, atomic: bool = False) -> list[str]:
    """One statement as text: `[Sid] Allow a1,a2 on r1,r2 if {...}`; with `atomic`, one line per
    (action, resource) pair and no Sid, which is what the statement permits however it is split."""
    effect = statement.get("Effect", "Allow")
    action_key = "Action" if "Action" in statement else "NotAction"
    resource_key = "NotResource" if "NotResource" in statement else "Resource"
    actions = sorted(render(a) for a in _as_list(statement.get(action_key, [])))
    # A trust policy's statement names no resource: the role itself.
    resources = sorted(render(r) for r in _as_list(statement.get(resource_key, ["(the role)"])))
    extra = ""
    if "Principal" in statement:
        extra += f" by {render(statement['Principal'])}"
    if "Condition" in statement:
        extra += f" if {render(statement['Condition'])}"
    verb = effect if action_key == "Action" else f"{effect} all but"
    where = "on" if resource_key == "Resource" else "on all but"
    if atomic:
        return [f"{verb} {a} {where} {r}{extra}" for a in actions for r in resources]
    sid = f"[{statement['Sid']}] " if "Sid" in statement else ""
    return [f"{sid}{verb} {','.join(actions)} {where} {','.join(resources)}{extra}"]


def _lines(statements: Iterable[Mapping[str, Any]], *, atomic: bool) -> list[str]:
    out = [line for s in statements for line in statement_lines(s, atomic=atomic)]
    return sorted(set(out)) if atomic else sorted(out)


CDK_PROVIDERS = {"index": "cdk-aws-custom-resource"}
"""Functions that are CDK's own (not a folder of lambdas/), by their handler's module: the
AwsCustomResource provider that looks the HyperPod cluster's ARN up at deploy time."""


def _function_roles(resources: Mapping[str, Any]) -> dict[str, str]:
    """Role logical id -> the folder of the function that runs as it (or CDK's provider)."""
    out = {}
    for fn in resources.values():
        if fn["Type"] != "AWS::Lambda::Function" or "Fn::GetAtt" not in fn["Properties"]["Role"]:
            continue
        module = fn["Properties"]["Handler"].split(".", 1)[0]
        out[fn["Properties"]["Role"]["Fn::GetAtt"][0]] = CDK_PROVIDERS.get(module, module)
    return out


def _lambda_permission(props: Mapping[str, Any]) -> dict[str, Any]:
    """An AWS::Lambda::Permission written as the statement it adds to the function's policy."""
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Action": props["Action"],
        "Resource": props["FunctionName"],
        "Principal": props["Principal"],
    }
    condition = {
        key: props[key]
        for key in ("SourceArn", "SourceAccount", "FunctionUrlAuthType", "PrincipalOrgID")
        if key in props
    }
    if condition:
        statement["Condition"] = condition
    return statement


def permissions(template: Mapping[str, Any], *, atomic: bool = False) -> dict[str, list[str]]:
    """Every principal's permissions in `template` (see the module docstring), as sorted lines."""
    resources = template["Resources"]
    function_roles = _function_roles(resources)

    def role_name(logical_id: str) -> str:
        folder = function_roles.get(logical_id)
        return f"function:{folder}" if folder else f"role:{normalise_id(logical_id)}"

    statements: dict[str, list[Mapping[str, Any]]] = {}
    trust: dict[str, list[str]] = {}
    for logical_id, resource in resources.items():
        kind, props = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::IAM::Role":
            name = role_name(logical_id)
            statements.setdefault(name, [])
            for policy in props.get("Policies", []):
                statements[name] += policy["PolicyDocument"]["Statement"]
            trust[name] = [
                f"assume {line}"
                for line in _lines(props["AssumeRolePolicyDocument"]["Statement"], atomic=atomic)
            ]
            trust[name] += [f"managed {render(arn)}" for arn in props.get("ManagedPolicyArns", [])]
        elif kind == "AWS::IAM::Policy":
            for role in props.get("Roles", []):
                statements.setdefault(role_name(role["Ref"]), [])
                statements[role_name(role["Ref"])] += props["PolicyDocument"]["Statement"]
        elif kind == "AWS::IAM::ManagedPolicy":
            statements[f"managed:{normalise_id(logical_id)}"] = props["PolicyDocument"]["Statement"]
        elif kind in ("AWS::SNS::TopicPolicy", "AWS::SQS::QueuePolicy"):
            statements[f"resource:{normalise_id(logical_id)}"] = props["PolicyDocument"][
                "Statement"
            ]
        elif kind == "AWS::KMS::Key":
            statements[f"resource:{normalise_id(logical_id)}"] = props["KeyPolicy"]["Statement"]
        elif kind == "AWS::Lambda::Permission":
            statements[f"resource:{normalise_id(logical_id)}"] = [_lambda_permission(props)]
    return {
        name: trust.get(name, []) + _lines(found, atomic=atomic)
        for name, found in sorted(statements.items())
    }


def function_permissions(template: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each function's role's statements (folder -> sorted lines, Sids kept)."""
    return {
        name.split(":", 1)[1]: lines
        for name, lines in permissions(template).items()
        if name.startswith("function:")
    }


def diff(before: Mapping[str, list[str]], after: Mapping[str, list[str]]) -> list[str]:
    """`- line` / `+ line` per principal where `before` and `after` differ (empty: the same)."""
    out = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None or new is None:
            out.append(f"{name}: {'added' if old is None else 'removed'}")
        removed = sorted(set(old or []) - set(new or []))
        added = sorted(set(new or []) - set(old or []))
        if not (removed or added):  # the same lines, a different count (a duplicated statement)
            out.append(f"{name}: the same statements, repeated differently")
        out += [f"{name}: - {line}" for line in removed]
        out += [f"{name}: + {line}" for line in added]
    return out


def pinned_principals(template: Mapping[str, Any]) -> dict[str, list[str]]:
    """What the pinned table holds of a template: every function's role (the functions act on
    untrusted input) and the managed policies people attach (operators, the training pods)."""
    return {
        name: lines
        for name, lines in permissions(template).items()
        if name.startswith(("function:", "managed:"))
    }


def main(argv: list[str] | None = None) -> int:
    """Write PINNED from this tree's stack (default and variant configurations)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {PINNED.name}")
    args = parser.parse_args(argv)
    if not args.write:
        parser.error("nothing to do without --write")
    from infra.app import synthesize_template
    from tests.infra.conftest import VARIANT_CONTEXT

    pinned = {
        name: pinned_principals(synthesize_template(context))
        for name, context in (("default", {}), ("variant", VARIANT_CONTEXT))
    }
    PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {PINNED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
