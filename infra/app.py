"""Building the CDK app: the one place that turns context into a config and a synthesized stack.

`app.py` (what `npx cdk` runs) calls `build_app()`; tests and the end-to-end harness call
`synthesize_template()` to get the CloudFormation template as a dict without bundling assets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk

from infra import nag
from infra.config import KEYS, SdcConfig, load_config
from infra.stack import SdcGuardStack

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_JSON = REPO_ROOT / "cdk.json"
STACK_ID = "SdcGuard"
SKIP_BUNDLING: dict[str, list[str]] = {"aws:cdk:bundling-stacks": []}
"""Context that makes CDK skip asset bundling: the CLI sets this key to the stacks it will bundle,
and an empty list bundles none (the layer's pip step is the only bundling in this app)."""


def stack_name(config: SdcConfig) -> str:
    """One stack per protected cluster, so several clusters can share an account."""
    return f"{STACK_ID}-{config.hyperpod_cluster_name}"


def example_context() -> dict[str, Any]:
    """The context values cdk.json ships with (placeholder cluster names)."""
    return dict(json.loads(CDK_JSON.read_text(encoding="utf-8"))["context"])


def build_app(
    app: cdk.App,
    *,
    environ: Mapping[str, str] | None = None,
    with_nag: bool = True,
) -> SdcGuardStack:
    """Validate `app`'s context into a config and add the stack (and cdk-nag) to it."""
    environ = os.environ if environ is None else environ
    context_keys = {key: app.node.try_get_context(key) for key in KEYS}
    config = load_config({k: v for k, v in context_keys.items() if v is not None}, environ)
    stack = SdcGuardStack(
        app,
        stack_name(config),
        config=config,
        description=f"sdc-guard: silent-data-corruption remediation for HyperPod cluster {config.hyperpod_cluster_name}",
        env=cdk.Environment(
            account=environ.get("CDK_DEFAULT_ACCOUNT"), region=environ.get("CDK_DEFAULT_REGION")
        ),
    )
    if with_nag:
        nag.add_checks(app)
    return stack


def synthesize_template(
    context: Mapping[str, Any] | None = None, *, with_nag: bool = False, outdir: str | None = None
) -> dict[str, Any]:
    """Synthesize the stack without bundling assets and return its CloudFormation template.

    `context` overrides cdk.json's example context (e.g. {"healthCheckPollInterval": "1s"}).
    `infra.template.state_machine_definition` turns the result into runnable ASL.
    """
    merged = {**example_context(), **(context or {}), **SKIP_BUNDLING}
    app = cdk.App(context=merged, outdir=outdir)
    stack = build_app(app, environ={}, with_nag=with_nag)
    assembly = app.synth()
    return assembly.get_stack_artifact(stack.artifact_id).template
