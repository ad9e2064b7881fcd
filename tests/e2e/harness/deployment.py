"""Rehearse ``cdk deploy`` on this machine: the real pinned CDK CLI against an embedded AWS.

:class:`EmbeddedAws` is a moto server in this process (threads) on ``http://localhost:PORT``,
with the CloudFormation models and CLI-path fixes of :mod:`.moto_cloudformation`. :class:`CdkCli`
runs the repository's pinned CDK CLI (``npx cdk``, package.json) against it, exactly as a user
runs it against an account: ``synth``, ``bootstrap --app <cloud assembly>``, ``deploy``,
``destroy``. The CLI finds the embedded AWS through ``AWS_ENDPOINT_URL``, the endpoint setting
every AWS SDK honours; nothing else is redirected.

Why ``localhost`` and not 127.0.0.1: moto's CloudFormation reads a change set's TemplateURL from
its own S3 only when the URL is path-style and names ``localhost``; with an IP address the
change set fails with "The specified bucket does not exist".

Why bootstrap takes ``--app <cloud assembly>``: bootstrapping with ``--app "python app.py"``
synthesizes without bundling, and the layer's asset would then be the raw ``lambdas/`` folder.

What this cannot prove: IAM and KMS enforcement (every call is allowed, key policies are
stored), EKS access entries (recorded, not applied to a cluster), service quotas, and real
timings (moto creates everything at once and emits stack-level events only).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from infra.app import example_context
from infra.config import KEYS

from . import moto_cloudformation
from .account import ACCOUNT, REGION, embedded_aws_environment, reset_embedded_aws

REPO = Path(__file__).resolve().parents[3]
WORK_DIR = REPO / ".deploy-local"
"""Gitignored: the cloud assembly the rehearsal deploys and the CLI's logs."""
CDK_CLI = REPO / "node_modules" / ".bin" / "cdk"
"""The pinned CDK CLI (package.json), installed by `make cdk-cli`."""

CDK_TIMEOUT_SECONDS = 900.0
"""One CLI command's limit: a first synth builds the Lambda layer with pip (a busy machine)."""


class CdkCommandFailed(RuntimeError):
    """A CDK CLI command exited non-zero; the message ends with its output's tail."""


class EmbeddedAws:
    """A moto server on ``http://localhost:PORT`` that CloudFormation can deploy this stack to.

    ``with EmbeddedAws() as aws:`` starts it from an empty account with Step Functions really
    executing (state machines the stack creates run their definition) and Lambda invokes served
    in-process (no Docker); leaving the block stops it.
    """

    def __init__(self, port: int = 0) -> None:
        """Prepare; nothing starts before ``__enter__``. ``port=0`` picks a free port."""
        self._port = port
        self._server: ThreadedMotoServer | None = None
        self.endpoint = ""
        self.patches: list[str] = []

    def __enter__(self) -> EmbeddedAws:
        self.patches = moto_cloudformation.install()
        _quiet_known_skips()
        moto_cloudformation.ACCESS_ENTRIES.clear()  # like moto's reset below: an empty account
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="localhost", port=self._port, verbose=False)
        self._server.start()
        _, port = self._server.get_host_and_port()
        self.port = int(port)
        self.endpoint = f"http://localhost:{self.port}"
        reset_embedded_aws(self.endpoint, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def environment(self) -> dict[str, str]:
        """What a process needs to talk to this AWS (``embedded_aws_environment``)."""
        return embedded_aws_environment(self.endpoint, self.port)

    def client(self, service: str) -> Any:
        """A boto3 client for this AWS (its own session: boto3's default one is not shared)."""
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
        )
        return session.client(service, endpoint_url=self.endpoint)


SKIPPED_ON_PURPOSE = ("AWS::CDK::Metadata", "AWS::S3::BucketPolicy")
"""Types moto creates nothing for and nothing here reads: CDK's metadata, and the bootstrap
bucket's policy (IAM is not enforced anyway). moto's warning for them is noise at every deploy;
any other skipped type still warns."""


class _DropKnownSkips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(t in record.getMessage() for t in SKIPPED_ON_PURPOSE)


def _quiet_known_skips() -> None:
    moto_logger = logging.getLogger("moto")
    if not any(isinstance(f, _DropKnownSkips) for f in moto_logger.filters):
        moto_logger.addFilter(_DropKnownSkips())
    for kind in SKIPPED_ON_PURPOSE:
        warnings.filterwarnings("ignore", message=f"Tried to parse {kind}")


def context_arguments(context: Mapping[str, Any]) -> list[str]:
    """``-c key=value`` for each key (JSON for lists, maps and booleans, as cdk.json holds them).

    Raises ValueError naming a key the app does not know (a typo would be ignored by CDK).
    """
    args: list[str] = []
    for key, value in context.items():
        if key not in KEYS:
            raise ValueError(f"unknown context key {key!r}; the app reads {sorted(KEYS)}")
        text = value if isinstance(value, str) else json.dumps(value)
        args += ["-c", f"{key}={text}"]
    return args


@dataclass
class CdkCli:
    """The repository's pinned CDK CLI (``npx cdk``), pointed at ``aws``.

    ``assembly`` is where synth writes the cloud assembly that bootstrap and deploy read.
    """

    aws: EmbeddedAws
    assembly: Path = WORK_DIR / "cdk.out"
    log: list[str] = field(default_factory=list)
    """Every command run and its combined output, for a report when something fails."""

    def run(self, *args: str) -> str:
        """Run ``npx cdk <args>`` in the repository root; returns stdout, raises on failure."""
        if not CDK_CLI.exists():
            raise CdkCommandFailed(
                f"the pinned CDK CLI is not installed ({CDK_CLI.relative_to(REPO)} is missing): "
                "run `make cdk-cli` (npm ci from package-lock.json; needs the npm registry)"
            )
        env = {
            **os.environ,
            **self.aws.environment,
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            "CDK_DISABLE_VERSION_CHECK": "1",  # no network: the CLI would ask npm for news
        }
        env.pop("AWS_PROFILE", None)  # a user's profile must not redirect the rehearsal
        command = ["npx", "--no-install", "cdk", *args, "--no-notices", "--ci"]
        result = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=CDK_TIMEOUT_SECONDS,
            check=False,
        )
        self.log.append(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-4000:]
            raise CdkCommandFailed(f"`cdk {args[0]}` exited {result.returncode}:\n{tail}")
        return result.stdout

    def synth(self, context: Mapping[str, Any]) -> None:
        """Synthesize (with bundling: the real layer) into :attr:`assembly`."""
        self.run("synth", "--quiet", "--output", str(self.assembly), *context_arguments(context))

    def bootstrap(self) -> None:
        """``cdk bootstrap`` the embedded account from the synthesized assembly."""
        self.run("bootstrap", "--app", str(self.assembly), f"aws://{ACCOUNT}/{REGION}")

    def deploy(self, stack: str) -> None:
        """``cdk deploy`` the synthesized stack (no approval prompt)."""
        self.run("deploy", "--app", str(self.assembly), "--require-approval", "never", stack)

    def destroy(self, stack: str) -> None:
        """``cdk destroy`` the stack (no prompt)."""
        self.run("destroy", "--app", str(self.assembly), "--force", stack)


def rehearsal_context(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The README's context keys (cdk.json's example) with ``overrides``, only the app's keys."""
    context = {k: v for k, v in example_context().items() if k in KEYS}
    return {**context, **(overrides or {})}


def stack_outputs(aws: EmbeddedAws, stack: str) -> dict[str, str]:
    """The deployed stack's Outputs, key -> value."""
    (description,) = aws.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    return {o["OutputKey"]: o["OutputValue"] for o in description.get("Outputs", [])}


def stack_resources(aws: EmbeddedAws, stack: str) -> dict[str, dict[str, str]]:
    """Logical id -> {"type", "physical_id"} of every resource CloudFormation created."""
    resources = aws.client("cloudformation").describe_stack_resources(StackName=stack)
    return {
        r["LogicalResourceId"]: {"type": r["ResourceType"], "physical_id": r["PhysicalResourceId"]}
        for r in resources["StackResources"]
        # moto lists the resources it has no model for (CDK's metadata) without a logical id.
        if "LogicalResourceId" in r
    }
