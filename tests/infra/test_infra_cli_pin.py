"""The pinned CDK CLI can deploy what the pinned aws-cdk-lib synthesizes.

The library writes cloud assemblies of a schema version that only CLIs from some release on can
read (``Manifest.cli_version()``); a library bumped past the CLI in package.json would synthesize
fine and fail at ``cdk deploy``. Both are pinned; this keeps them a pair.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_pinned_cli_reads_the_assemblies_the_pinned_library_writes():
    # Given the CLI version package.json pins and the library requirements.txt pins
    from aws_cdk.cloud_assembly_schema import Manifest

    pinned_cli = json.loads((REPO / "package.json").read_text())["devDependencies"]["aws-cdk"]
    requirement = next(
        line
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.startswith("aws-cdk-lib")
    )
    # When the installed library says which CLI its assembly schema needs
    needed = Manifest.cli_version()
    # Then the library is pinned exactly, and the pinned CLI is at least that release
    assert "==" in requirement, f"aws-cdk-lib must be pinned with the CLI, got {requirement!r}"
    assert needed is not None
    assert _version(pinned_cli) >= _version(needed), (
        f"aws-cdk-lib's cloud assembly needs CDK CLI >= {needed}; package.json pins {pinned_cli}"
    )
