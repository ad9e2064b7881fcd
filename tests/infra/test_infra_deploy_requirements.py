"""Deploying needs requirements.txt only: a fresh virtual environment with nothing else (no
torch, no agent, no test tools) synthesizes the stack with `python app.py`, given what the CDK
CLI gives it (cdk.json's context, an output directory), so the check needs no npm.

Slow (a fresh venv of aws-cdk-lib and the Lambda runtime's dependencies, then a synth that
bundles the layer): about 4 minutes on the 2-core CI machine under load, most of it pip; pip's
cache makes it no more network than the bootstrap's own install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, (
        f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fresh_venv_with_only_requirements_txt_synthesizes_the_stack(tmp_path: Path) -> None:
    # Given a new virtual environment with requirements.txt installed, and nothing else
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
         "requirements.txt"],
        cwd=REPO,
    )  # fmt: skip
    missing = _run(
        [
            python,
            "-c",
            "import importlib.util as u; "
            "print([m for m in ('torch', 'sdc_agent', 'sdc_remediation', 'pytest', 'moto') "
            "if u.find_spec(m) is None])",
        ]
    )
    assert missing.stdout.strip() == "['torch', 'sdc_agent', 'sdc_remediation', 'pytest', 'moto']"

    # When `python app.py` runs in it as the CDK CLI runs it: cdk.json's context in
    # CDK_CONTEXT_JSON, the cloud assembly's directory in CDK_OUTDIR (assets bundled)
    out = tmp_path / "cdk.out"
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "CDK_CONTEXT_JSON": json.dumps(context),
        "CDK_OUTDIR": str(out),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    _run([python, "app.py"], cwd=REPO, env=env)

    # Then the stack's template is there, and the functions' code asset carries the contract
    # beside the domain package (the layer: the Lambda runtime's dependencies)
    manifest = json.loads((out / "manifest.json").read_text())
    templates = [
        a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"
    ]
    assert len(templates) == 1
    code = [p for p in out.glob("asset.*") if (p / "sdc_remediation").is_dir()]
    assert len(code) == 1
    assert (code[0] / "sdc_contract" / "__init__.py").is_file()
    assert [p for p in out.glob("asset.*") if (p / "python" / "pydantic").is_dir()]
