"""Compare the IAM and the logical ids of two trees' synthesized stacks.

    .venv/bin/python -m tests.infra.iam_diff --base main

synthesizes the stack of git ref `--base` (exported to a temporary folder) and of this working
tree, for each configuration in CONTEXTS, and prints per configuration:
- logical ids added or removed; a stateful resource among them (a table, the topic, the key, a
  log group) would be replaced by a deployed stack, and fails the comparison;
- every principal's statements that differ, Sids included (tests/infra/iam_permissions.py);
- every principal's atomic permissions (action x resource x condition) that differ, which is
  what a reordering, a split or a merge of statements leaves unchanged;
- anything else in the template that differs, besides the order of policy statements (a
  function's environment, a DependsOn, an output).
Exit status 1 when any of these differ. A refactor that must not change what anyone may do
(moving grants between constructs) runs this and shows an empty report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.infra.conftest import VARIANT_CONTEXT
from tests.infra.iam_permissions import diff, permissions

REPO = Path(__file__).resolve().parents[2]

CONTEXTS: dict[str, dict[str, Any]] = {
    "default": {},
    "variant": VARIANT_CONTEXT,
    "canary-off": {"canarySchedule": "off"},
    "auto-approve+shadow-health": {
        "autoApprove": {"onHealthCheckFailed": True, "minPrecision": 0.95, "minEvents": 30},
        "shadowHealthCheck": True,
        "securityGroupIds": ["sg-0123456789abcdef0"],
        "vpcId": "vpc-0123456789abcdef0",
        "subnetIds": ["subnet-0123456789abcdef0"],
    },
}
"""Configurations whose IAM differs: every optional grant is on in at least one of them."""

STATEFUL = (
    "AWS::DynamoDB::Table",
    "AWS::SNS::Topic",
    "AWS::KMS::Key",
    "AWS::Logs::LogGroup",
)
"""What a deployed stack would lose (data, subscriptions, the key, logs) if its id changed."""

_SYNTH = (
    "import json, sys\n"
    "from infra.app import synthesize_template\n"
    "json.dump(synthesize_template(json.loads(sys.argv[1])), sys.stdout)\n"
)


def synthesize(tree: Path, context: Mapping[str, Any]) -> dict[str, Any]:
    """`tree`'s stack for `context` (a subprocess: each tree imports its own `infra`)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    done = subprocess.run(
        [sys.executable, "-c", _SYNTH, json.dumps(context)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"synth failed in {tree}:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout))


def export(ref: str, into: Path) -> Path:
    """The files of git `ref` in `into` (git archive: nothing of this worktree is touched)."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", ref], cwd=REPO, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    # The CDK app reads cdk.json's context and the Lambda code folder from its own tree.
    return into / "tree"


def _sorted_statements(node: Any) -> Any:
    """`node` with every policy's Statement list in a canonical order (the order in which
    constructs add statements is no permission)."""
    if isinstance(node, list):
        return [_sorted_statements(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _sorted_statements(value) for key, value in node.items()}
    if isinstance(out.get("Statement"), list):
        out["Statement"] = sorted(out["Statement"], key=lambda s: json.dumps(s, sort_keys=True))
    return out


def template_differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Every path where the two templates differ, besides the order of policy statements: the
    rest of the template (functions, environments, dependencies, outputs) must not move either."""
    out: list[str] = []

    def walk(old: Any, new: Any, path: str) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for key in sorted(set(old) | set(new)):
                if key not in new:
                    out.append(f"{path}/{key}: removed")
                elif key not in old:
                    out.append(f"{path}/{key}: added")
                else:
                    walk(old[key], new[key], f"{path}/{key}")
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            for index, (a, b) in enumerate(zip(old, new, strict=True)):
                walk(a, b, f"{path}[{index}]")
        elif old != new:
            out.append(f"{path}: {json.dumps(old)[:120]} -> {json.dumps(new)[:120]}")

    walk(_sorted_statements(before), _sorted_statements(after), "")
    return out


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The report lines for one configuration, and whether anything differs."""
    lines: list[str] = []
    old_ids = {k: r["Type"] for k, r in before["Resources"].items()}
    new_ids = {k: r["Type"] for k, r in after["Resources"].items()}
    for logical_id in sorted(set(old_ids) - set(new_ids)):
        stateful = " (STATEFUL: a deployed stack would replace it)" * (
            old_ids[logical_id] in STATEFUL
        )
        lines.append(f"logical id removed: {logical_id} {old_ids[logical_id]}{stateful}")
    for logical_id in sorted(set(new_ids) - set(old_ids)):
        lines.append(f"logical id added: {logical_id} {new_ids[logical_id]}")
    lines += [f"template: {line}" for line in template_differences(before, after)]
    statements = diff(permissions(before), permissions(after))
    lines += [f"statements: {line}" for line in statements]
    atomic = diff(permissions(before, atomic=True), permissions(after, atomic=True))
    lines += [f"permissions: {line}" for line in atomic]
    return lines, bool(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when both trees grant exactly the same and keep every id."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git ref to compare against (main)")
    args = parser.parse_args(argv)
    differs = False
    with tempfile.TemporaryDirectory(prefix="iam-diff-") as tmp:
        base = export(args.base, Path(tmp))
        for name, context in CONTEXTS.items():
            before, after = synthesize(base, context), synthesize(REPO, context)
            lines, changed = compare(before, after)
            differs |= changed
            count = len(after["Resources"])
            principals = len(permissions(after))
            print(f"== {name}: {count} resources, {principals} principals compared")
            print(
                "\n".join(lines)
                if lines
                else "   identical IAM, logical ids and template (but statement order)"
            )
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
