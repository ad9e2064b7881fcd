"""Helpers to read a synthesized CloudFormation template in the infra tests."""

from __future__ import annotations

import json
from typing import Any

from infra.template import function_logical_ids


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resource, for one resource type."""
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def flatten(node: Any) -> str:
    """A CloudFormation value as text: GetAtt -> <Id.Attr>, Ref -> <Id>, Join joined."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return delimiter.join(flatten(item) for item in items)
        if "Fn::GetAtt" in node:
            return "<{}.{}>".format(*node["Fn::GetAtt"])
        if "Ref" in node:
            return f"<{node['Ref']}>"
    return json.dumps(node)


def definition(template: dict[str, Any]) -> dict[str, Any]:
    """The state machine's ASL, with references rendered as <LogicalId.Arn> strings."""
    (machine,) = resources(template, "AWS::StepFunctions::StateMachine").values()
    return json.loads(flatten(machine["Properties"]["DefinitionString"]))


def all_states(states: dict[str, Any]) -> dict[str, Any]:
    """Every state of an ASL `States` map by name, with those nested in a Map's ItemProcessor
    or a Parallel's Branches (state names are unique across the whole definition)."""
    out: dict[str, Any] = {}
    for name, state in states.items():
        out[name] = state
        nested = [state.get("ItemProcessor"), state.get("Iterator"), *state.get("Branches", [])]
        for graph in nested:
            if graph:
                out.update(all_states(graph["States"]))
    return out


def item_states(asl: dict[str, Any], map_name: str = "RemediateSuspects") -> dict[str, Any]:
    """The states of one Map's item processor (the per-suspect chain by default)."""
    return all_states(asl["States"])[map_name]["ItemProcessor"]["States"]


def function_ids(template: dict[str, Any]) -> dict[str, str]:
    """Step folder (from the handler string) -> the function's logical id; the project's
    functions only (not CDK's cluster-ARN lookup provider)."""
    return function_logical_ids(template)


def role_statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """Every statement of the inline policies attached to a role."""
    statements = []
    for policy in resources(template, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def as_list(value: Any) -> list[Any]:
    """An IAM Action/Resource value as a list."""
    return value if isinstance(value, list) else [value]


def matches(pattern: str, value: str) -> bool:
    """IAM's wildcard match (``*`` any run of characters, ``?`` one), case-sensitive."""
    import fnmatch

    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def evaluate_for(
    statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, str]
) -> bool:
    """Whether ``statements`` allow ``action`` on ``resource`` for a request whose context keys
    are ``context`` (``aws:PrincipalTag/...``, ``cloudwatch:namespace``): policy variables
    ``${key}`` in a resource are replaced by the context's value (a statement whose variable
    has none matches nothing, as IAM does), and StringEquals conditions must hold (any other
    operator is refused here, so a test cannot pass by not evaluating it). Deny wins."""
    import re

    def rendered(pattern: str) -> str | None:
        missing = [key for key in re.findall(r"\$\{([^}]+)\}", pattern) if key not in context]
        if missing:
            return None
        return re.sub(r"\$\{([^}]+)\}", lambda m: context[m.group(1)], pattern)

    def holds(statement: dict[str, Any]) -> bool:
        for operator, pairs in (statement.get("Condition") or {}).items():
            if operator != "StringEquals":
                raise AssertionError(f"evaluate_for does not read condition {operator}")
            for key, wanted in pairs.items():
                if context.get(key) not in as_list(wanted):
                    return False
        return True

    def covers(statement: dict[str, Any]) -> bool:
        actions = as_list(statement.get("Action", []))
        patterns = [rendered(flatten(r)) for r in as_list(statement.get("Resource", []))]
        return (
            any(matches(a.lower(), action.lower()) for a in actions)
            and any(p is not None and matches(p, resource) for p in patterns)
            and holds(statement)
        )

    if any(s.get("Effect") == "Deny" and covers(s) for s in statements):
        return False
    return any(s.get("Effect", "Allow") == "Allow" and covers(s) for s in statements)


def evaluate(statements: list[dict[str, Any]], action: str, resource: str) -> bool:
    """Whether ``statements`` (rendered with ``flatten``) allow ``action`` on ``resource``:
    an explicit Deny matching both wins, else any Allow matching both (conditions are not
    evaluated: a conditioned statement counts as matching, the strict reading for a test that
    something is NOT allowed)."""

    def covers(statement: dict[str, Any]) -> bool:
        actions = as_list(statement.get("Action", []))
        resources = [flatten(r) for r in as_list(statement.get("Resource", []))]
        return any(matches(a.lower(), action.lower()) for a in actions) and any(
            matches(r, resource) for r in resources
        )

    if any(s.get("Effect") == "Deny" and covers(s) for s in statements):
        return False
    return any(s.get("Effect", "Allow") == "Allow" and covers(s) for s in statements)
