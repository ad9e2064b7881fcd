"""Docker-free bundling of the Lambda dependencies layer (the pip step itself is exercised by
`npx cdk synth`; these check what it is asked to do)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import aws_lambda as lambda_

from infra import bundling
from infra.constructs.functions import ARCHITECTURE, RUNTIME


def test_layer_requirements_are_the_lambda_package_dependencies_plus_the_boto3_floor() -> None:
    # Given lambdas/pyproject.toml / When the layer's requirements are read
    requirements = bundling.lambda_requirements()
    # Then they include its runtime dependencies and a boto3 that knows the HyperPod APIs
    assert any(r.startswith("aws-lambda-powertools[tracer,parser]") for r in requirements)
    assert any(r.startswith("urllib3") for r in requirements)  # the Kubernetes API client
    assert "boto3>=1.44.8" in requirements


def test_pip_targets_the_lambda_platform_not_this_machine() -> None:
    # Given the functions' runtime and architecture
    command = bundling.pip_command(
        ["boto3>=1.44.8"], "/out/python", bundling.pip_platform(ARCHITECTURE)
    )
    # Then pip resolves binary wheels for that platform and Python into the layer directory
    assert command[command.index("--platform") + 1] == "manylinux2014_aarch64"
    assert f"python{command[command.index('--python-version') + 1]}" == RUNTIME.name
    assert "--only-binary=:all:" in command
    assert command[command.index("--target") + 1] == "/out/python"
    assert bundling.pip_platform(lambda_.Architecture.X86_64) == "manylinux2014_x86_64"


def test_bundling_installs_into_the_layer_python_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given pip succeeding
    seen: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bundling.subprocess, "run", fake_run)
    # When CDK asks the local bundler (jsii passes the options positionally)
    done = bundling.PipLayerBundling(["pydantic>=2.7"], "manylinux2014_aarch64").try_bundle(
        str(tmp_path), object()
    )
    # Then it reports the asset as built, installed under python/ as Lambda layers expect
    assert done is True
    assert seen[0][seen[0].index("--target") + 1] == str(tmp_path / "python")


def test_bundling_failure_shows_pip_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Given pip failing (no wheel for the platform, index unreachable...)
    monkeypatch.setattr(
        bundling.subprocess,
        "run",
        lambda command, **_: subprocess.CompletedProcess(
            command, 1, "", "No matching distribution found for nope"
        ),
    )
    # When bundling / Then synth stops with pip's own explanation
    with pytest.raises(RuntimeError, match="No matching distribution found for nope"):
        bundling.PipLayerBundling(["nope"], "manylinux2014_aarch64").try_bundle(str(tmp_path))


def test_the_code_asset_carries_the_contract_beside_the_domain_package(default_synth: Any) -> None:
    # Given the staged function code asset
    staged = [p for p in default_synth.outdir.glob("asset.*") if (p / "sdc_remediation").is_dir()]
    assert len(staged) == 1
    # Then the contract package sits beside the domain package, as the source has it
    source = bundling.CONTRACT_DIR
    for path in source.glob("*.py"):
        assert (staged[0] / "sdc_contract" / path.name).read_bytes() == path.read_bytes()
    assert not list(staged[0].glob("sdc_contract/*.egg-info"))


def test_the_staged_code_is_named_after_its_content(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a handlers folder and a contract package
    lambdas, contract = tmp_path / "lambdas", tmp_path / "contract" / "sdc_contract"
    (lambdas / "step").mkdir(parents=True)
    (lambdas / "step" / "handler.py").write_text("x = 1\n")
    (lambdas / "tests").mkdir()
    (lambdas / "tests" / "test_x.py").write_text("")
    contract.mkdir(parents=True)
    (contract / "__init__.py").write_text("NAME = 'a'\n")
    monkeypatch.setattr(bundling, "LAMBDAS_DIR", lambdas)
    monkeypatch.setattr(bundling, "CONTRACT_DIR", contract)
    staging = tmp_path / "staging"

    # When it is staged twice, then again after the contract changed
    first = bundling.stage_handlers_code(staging)
    again = bundling.stage_handlers_code(staging)
    (contract / "__init__.py").write_text("NAME = 'b'\n")
    changed = bundling.stage_handlers_code(staging)

    # Then the same content is one directory, new content another, and tests stay out
    assert first == again != changed
    assert (changed / "sdc_contract" / "__init__.py").read_text() == "NAME = 'b'\n"
    assert (first / "step" / "handler.py").is_file()
    assert not (first / "tests").exists()
