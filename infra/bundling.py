"""Lambda assets without Docker.

The handlers' code is the `lambdas/` folder (pure Python, no build step) with the contract
package `sdc_contract` (agent/contract/, standard library only) beside the domain package, so
the functions import it as the agent and infra do: both are copied into one staging directory
named after their content, which becomes the code asset. Their dependencies go into one Lambda
layer that `pip` fills on this machine with wheels for the Lambda
platform (`--platform manylinux2014_<arch> --only-binary=:all:`), so `cdk synth` needs neither
Docker nor a Linux host. The layer's asset hash is the requirement list plus the target, so it is
rebuilt only when one of those changes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

REPO_ROOT = Path(__file__).resolve().parent.parent
LAMBDAS_DIR = REPO_ROOT / "lambdas"
CONTRACT_DIR = REPO_ROOT / "agent" / "contract" / "sdc_contract"
"""The contract package (one source: the agent's wheel, requirements.txt and the Lambda asset
all take it from here)."""
STAGING_DIR = REPO_ROOT / "build" / "lambda-code"
"""Where the code asset is assembled (gitignored), one directory per content digest."""
STALE_STAGING_SECONDS = 3600
"""Staged directories of other contents older than this are removed (CDK copied them into its
cloud assembly long ago)."""

PYTHON_VERSION = "3.14"
"""Python of the Lambda runtime; the layer's wheels are resolved for it."""

# boto3 1.44.8 is the release verified to know StartClusterHealthCheck and
# BatchReplaceClusterNodes (the runtime's bundled boto3 lags behind the HyperPod APIs).
EXTRA_REQUIREMENTS: tuple[str, ...] = ("boto3>=1.44.8",)

# Not part of the function code: tests, build metadata, caches (names, at any depth).
CODE_EXCLUDES: tuple[str, ...] = (
    "tests",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
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


def _code_files() -> Iterator[tuple[str, Path]]:
    """(path in the asset, source file) of every file of the function code, sorted: the
    `lambdas/` folder and the contract package as `sdc_contract/`."""
    for root, prefix in ((LAMBDAS_DIR, ""), (CONTRACT_DIR, f"{CONTRACT_DIR.name}/")):
        found = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not _excluded(d)]
            for name in files:
                if not _excluded(name):
                    path = Path(folder) / name
                    found.append((prefix + path.relative_to(root).as_posix(), path))
        yield from sorted(found)


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in CODE_EXCLUDES)


def stage_handlers_code(staging: Path = STAGING_DIR) -> Path:
    """The function code assembled in `staging/<content digest>` (reused when that content was
    staged before); returns its directory.

    Content-addressed, so a synth never picks up another content's directory, and concurrent
    syntheses agree: each assembles in a private temporary directory and renames it into place.
    """
    files = list(_code_files())
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
    target = staging / digest.hexdigest()[:32]
    if not target.is_dir():
        staging.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".staging-", dir=staging))
        scratch.chmod(0o755)  # mkdtemp's 0700 would become the asset root's mode
        for name, path in files:
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, scratch / name)
        try:
            scratch.rename(target)
        except OSError:  # another synth staged the same content first
            shutil.rmtree(scratch, ignore_errors=True)
    _remove_stale(staging, keep=target)
    return target


def _remove_stale(staging: Path, *, keep: Path) -> None:
    cutoff = time.time() - STALE_STAGING_SECONDS
    for entry in staging.iterdir():
        if entry != keep and entry.is_dir() and entry.stat().st_mtime < cutoff:
            shutil.rmtree(entry, ignore_errors=True)


def handlers_code() -> lambda_.Code:
    """Code of every function: the `lambdas/` folder (handler folders + domain package) and
    the contract package beside them (`stage_handlers_code`)."""
    return lambda_.Code.from_asset(str(stage_handlers_code()))
