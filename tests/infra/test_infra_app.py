"""The CDK entry point as the CLI runs it: `app.py` with cdk.json's context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.app import REPO_ROOT, SKIP_BUNDLING, example_context

pytestmark = pytest.mark.slow


def run_app(
    tmp_path: Path, extra_env: dict[str, str], command: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run app.py the way `npx cdk synth` does: context in CDK_CONTEXT_JSON, output in CDK_OUTDIR.
    ``command``: what runs it (this interpreter by default)."""
    env = {
        **os.environ,
        "CDK_OUTDIR": str(tmp_path),
        "CDK_CONTEXT_JSON": json.dumps({**example_context(), **SKIP_BUNDLING}),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        **extra_env,
    }
    return subprocess.run(
        command or [sys.executable, "app.py"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_app_synthesizes_the_shipped_config_with_nag(tmp_path: Path) -> None:
    # Given a fresh checkout's cdk.json / When the CLI would run the app
    result = run_app(tmp_path, {})
    # Then it writes the stack's template, cdk-nag passing
    assert result.returncode == 0, result.stderr[-3000:]
    template = json.loads(
        (tmp_path / "SdcGuard-example-hyperpod-cluster.template.json").read_text()
    )
    assert any(
        r["Type"] == "AWS::StepFunctions::StateMachine" for r in template["Resources"].values()
    )


def test_cdk_json_app_command_synthesizes_in_this_checkout(tmp_path: Path) -> None:
    # Given cdk.json's `app` command, which the CDK CLI runs in a shell in the repository's root
    command = json.loads((REPO_ROOT / "cdk.json").read_text())["app"]
    # When it runs as `npx cdk synth` runs it
    result = run_app(tmp_path, {}, ["/bin/sh", "-c", command])
    # Then it picks an interpreter with the CDK app's requirements and writes the template
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "SdcGuard-example-hyperpod-cluster.template.json").exists()


def test_app_stops_with_one_line_naming_a_bad_key(tmp_path: Path) -> None:
    # Given an environment override with an invalid value
    result = run_app(tmp_path, {"SDC_REPLACE_MODE": "reboot"})
    # Then synth fails with a one-line message naming the key, no traceback
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("sdc-guard: context key 'replaceMode' (SDC_REPLACE_MODE)")
    )
    assert "Traceback" not in result.stderr
