"""``make deploy-local``: rehearse ``cdk deploy`` of this stack on an embedded AWS, on this machine.

    make deploy-local                       # synth, bootstrap, deploy; print the outputs
    make deploy-local ARGS=--update         # ... then change one context key and redeploy
    make deploy-local ARGS=--destroy        # ... then destroy (the retained ledger stays)
    make deploy-local ARGS="--update --serve"   # ... and keep the embedded AWS running

The embedded AWS (a moto server, see tests/e2e/harness/deployment.py) keeps its state in this
process's memory, so every run starts from an empty account and rehearses the whole sequence:
deploy, then the update or the destroy. With ``--serve`` it stays up after the last step until
Ctrl-C, and ``.deploy-local/endpoint.json`` says where (``AWS_ENDPOINT_URL``), so the AWS CLI or
boto3 can look at what CloudFormation created; the file is removed when it stops.

This is a rehearsal, not AWS: see docs/deploy.md, "Rehearse the deploy on this machine".
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from infra.app import STACK_ID
from infra.config import KEYS
from tests.e2e.harness.account import Cluster, create_hyperpod_cluster
from tests.e2e.harness.deployment import (
    WORK_DIR,
    CdkCli,
    CdkCommandFailed,
    EmbeddedAws,
    rehearsal_context,
    stack_outputs,
    stack_resources,
)

ENDPOINT_FILE = WORK_DIR / "endpoint.json"


def parse_setting(text: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value); the value is JSON when it parses as JSON, else a string."""
    key, sep, raw = text.partition("=")
    if not sep or key not in KEYS:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with KEY one of the app's context keys, got {text!r}"
        )
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def build_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(
        prog="make deploy-local ARGS=...",
        description="Rehearse `cdk deploy` of the stack with the pinned CDK CLI on an embedded AWS.",
    )
    then = parser.add_mutually_exclusive_group()
    then.add_argument(
        "--update",
        action="store_true",
        help="after the deploy, change one context key (--set) and deploy again",
    )
    then.add_argument("--destroy", action="store_true", help="after the deploy, destroy the stack")
    parser.add_argument(
        "--set",
        type=parse_setting,
        default=("maxNodesPerHour", 3),
        metavar="KEY=VALUE",
        help="the context change --update deploys (default: maxNodesPerHour=3)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep the embedded AWS running after the last step, until Ctrl-C "
        f"(its endpoint in {ENDPOINT_FILE.relative_to(WORK_DIR.parent)})",
    )
    return parser


def _print_outputs(aws: EmbeddedAws, stack: str) -> None:
    print(f"\nOutputs of {stack}:")
    for key, value in sorted(stack_outputs(aws, stack).items()):
        print(f"  {key} = {value}")


def function_environments(aws: EmbeddedAws, stack: str) -> dict[str, dict[str, str]]:
    """Each deployed function's environment (GetFunctionConfiguration), by logical id."""
    lam = aws.client("lambda")
    return {
        logical_id: lam.get_function_configuration(FunctionName=r["physical_id"])
        .get("Environment", {})
        .get("Variables", {})
        for logical_id, r in stack_resources(aws, stack).items()
        if r["type"] == "AWS::Lambda::Function"
    }


def rehearse(args: argparse.Namespace) -> None:
    """Deploy, then update or destroy, printing what a user would look at."""
    context = rehearsal_context()
    stack = f"{STACK_ID}-{context['hyperPodClusterName']}"
    with EmbeddedAws() as aws:
        cli = CdkCli(aws)
        print(f"embedded AWS at {aws.endpoint} (moto, patched: {', '.join(aws.patches)})")
        started = time.monotonic()
        print("cdk synth ...", flush=True)
        cli.synth(context)
        print("cdk bootstrap ...", flush=True)
        cli.bootstrap()
        # The HyperPod cluster exists before the stack (the stack looks its ARN up at deploy).
        print(f"HyperPod cluster {context['hyperPodClusterName']} (4 nodes) ...", flush=True)
        create_hyperpod_cluster(aws.client, _example_cluster(context))
        print(f"cdk deploy {stack} ...", flush=True)
        cli.deploy(stack)
        created = stack_resources(aws, stack)
        print(f"deployed {len(created)} resources in {time.monotonic() - started:.0f} s")
        _print_outputs(aws, stack)
        if args.update:
            key, value = args.set
            before = function_environments(aws, stack)
            print(f"\ncdk deploy with {key}={json.dumps(value)} ...", flush=True)
            cli.synth({**context, key: value})
            cli.deploy(stack)
            _print_outputs(aws, stack)
            print("\nwhat the update changed in the deployed functions' environment:")
            for fn, env in sorted(function_environments(aws, stack).items()):
                for var, new in sorted(env.items()):
                    if before.get(fn, {}).get(var) != new:
                        print(f"  {fn}: {var} {before.get(fn, {}).get(var)} -> {new}")
        if args.destroy:
            print(f"\ncdk destroy {stack} ...", flush=True)
            cli.destroy(stack)
            tables = aws.client("dynamodb").list_tables()["TableNames"]
            print(f"destroyed; kept (DeletionPolicy Retain): {', '.join(tables) or 'nothing'}")
        if args.serve:
            serve(aws)


def _example_cluster(context: dict[str, Any]) -> Cluster:
    """The cluster the context names, as a small HyperPod cluster of the embedded account."""
    return Cluster(
        hyperpod_name=context["hyperPodClusterName"],
        eks_name=context["eksClusterName"],
        instance_ids=[f"i-{n:017x}" for n in range(4)],
    )


def serve(aws: EmbeddedAws) -> None:
    """Keep the embedded AWS up until Ctrl-C (or SIGTERM); its endpoint is in ENDPOINT_FILE
    meanwhile."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the same clean stop as Ctrl-C

    signal.signal(signal.SIGTERM, stop)
    ENDPOINT_FILE.parent.mkdir(parents=True, exist_ok=True)
    ENDPOINT_FILE.write_text(json.dumps(aws.environment, indent=2) + "\n", encoding="utf-8")
    print(f"\nserving at {aws.endpoint} until Ctrl-C (environment in {ENDPOINT_FILE})")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ENDPOINT_FILE.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; a failed CDK command ends with its output's tail and exit status 1."""
    args = build_parser().parse_args(argv)
    try:
        rehearse(args)
    except CdkCommandFailed as error:
        print(f"deploy-local: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
