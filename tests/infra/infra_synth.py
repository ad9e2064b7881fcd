"""Synthesizing the stack for the infra tests (one place, imported by conftest and tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.app import synthesize_template


@dataclass
class Synth:
    """One synthesized configuration."""

    template: dict[str, Any]
    outdir: Path
    nag_error: str | None
    """None when cdk-nag passed; else the validation failure with its report."""


def synthesize(
    tmp_path_factory: pytest.TempPathFactory, name: str, context: dict[str, Any] | None
) -> Synth:
    """Synthesize `context` over cdk.json's, with cdk-nag; on a nag failure keep the report and
    synthesize again without it, so the other tests still see the template."""
    outdir = tmp_path_factory.mktemp(name)
    try:
        template = synthesize_template(context, with_nag=True, outdir=str(outdir))
        return Synth(template, outdir, None)
    except RuntimeError as error:
        if "ValidationFailed" not in str(error):
            raise
        report = (outdir / "validation-report.json").read_text(encoding="utf-8")
        fallback = tmp_path_factory.mktemp(f"{name}-nonag")
        template = synthesize_template(context, with_nag=False, outdir=str(fallback))
        return Synth(template, fallback, report)
