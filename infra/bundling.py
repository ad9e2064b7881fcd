"""Lambda assets without Docker.

The handlers' code is the `lambdas/` folder as is (pure Python, no build step). Their
dependencies go into one Lambda layer that `pip` fills on this machine with wheels for the Lambda
platform (`--platform manylinux2014_<arch> --only-binary=:all:`), so `cdk synth` needs neither
Docker nor a Linux host. The layer's asset hash is the requirement list plus the target, so it is
rebuilt only when one of those changes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

REPO_ROOT = Path(__file__).resolve().parent.parent
LAMBDAS_DIR = REPO_ROOT / "lambdas"

PYTHON_VERSION = "3.14"
"""Python of the Lambda runtime; the layer's wheels are resolved for it."""

# boto3 1.44.8 is the release verified to know StartClusterHealthCheck and
# BatchReplaceClusterNodes (the runtime's bundled boto3 lags behind the HyperPod APIs).
EXTRA_REQUIREMENTS: tuple[str, ...] = ("boto3>=1.44.8",)

# Not part of the function code: tests, build metadata, caches.
CODE_EXCLUDES: tuple[str, ...] = (
    "tests",
    "**/tests",
    "**/__pycache__",
    "**/*.pyc",
    "*.egg-info",
    "**/*.egg-info",
    ".pytest_cache",
    "build",
    "dist",
    "pyproject.toml",
)


def lambda_requirements(pyproject: Path = LAMBDAS_DIR / "pyproject.toml") -> tuple[str, ...]:
    """The runtime dependencies of the Lambda package, read from its pyproject.toml (the one
    list the handlers' author maintains) plus the boto3 floor the HyperPod calls need."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    declared = tuple(data["project"]["dependencies"])
    return (*declared, *EXTRA_REQUIREMENTS)


def pip_platform(architecture: lambda_.Architecture) -> str:
    """The manylinux wheel tag matching a Lambda architecture."""
    return "manylinux2014_aarch64" if architecture.name == "arm64" else "manylinux2014_x86_64"


def pip_command(requirements: Sequence[str], target: str, platform: str) -> list[str]:
    """The `pip install` that fills a layer directory with wheels for the Lambda platform."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",  # the runtime writes its own caches; .pyc here would only add size
        "--only-binary=:all:",
        "--platform",
        platform,
        "--implementation",
        "cp",
        "--python-version",
        PYTHON_VERSION,
        "--target",
        target,
        *requirements,
    ]


@jsii.implements(cdk.ILocalBundling)
class PipLayerBundling:
    """Local bundling that pip-installs requirements into `<output>/python` (a layer's layout).

    CDK calls `try_bundle` instead of starting a container; returning True tells it the output
    is ready, so the Docker image named in the bundling options is never pulled.
    """

    def __init__(self, requirements: Sequence[str], platform: str) -> None:
        self._requirements = tuple(requirements)
        self._platform = platform

    def try_bundle(self, output_dir: str, *_options: Any, **_keywords: Any) -> bool:
        """Install the requirements into `output_dir/python`; raise with pip's output on error.

        jsii passes the BundlingOptions as one positional struct (not as keywords, as the
        generated interface suggests); they are unused either way.
        """
        target = str(Path(output_dir) / "python")
        command = pip_command(self._requirements, target, self._platform)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"pip could not build the Lambda dependencies layer ({' '.join(command)}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return True


def dependencies_layer_code(architecture: lambda_.Architecture) -> lambda_.Code:
    """Code of the dependencies layer, bundled locally (pip) for `architecture`."""
    requirements = lambda_requirements()
    platform = pip_platform(architecture)
    digest = hashlib.sha256(
        "\n".join([PYTHON_VERSION, platform, *requirements]).encode("utf-8")
    ).hexdigest()
    return lambda_.Code.from_asset(
        str(LAMBDAS_DIR),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        asset_hash=digest,
        bundling=cdk.BundlingOptions(
            # Required by the API; never pulled because local bundling always succeeds or raises.
            image=cdk.DockerImage.from_registry(f"public.ecr.aws/sam/build-python{PYTHON_VERSION}"),
            local=PipLayerBundling(requirements, platform),
        ),
    )


def handlers_code() -> lambda_.Code:
    """Code of every function: the `lambdas/` folder (handler folders + domain package)."""
    return lambda_.Code.from_asset(str(LAMBDAS_DIR), exclude=list(CODE_EXCLUDES))
