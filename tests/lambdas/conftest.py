"""Fixtures for the remediation Lambdas: environment, moto account, Kubernetes stand-in, context.

The handler folders are put on sys.path exactly as Lambda does with the ``lambdas/`` asset, so a
test imports ``cordon.handler`` like the runtime resolves ``cordon.handler.handler``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

LAMBDAS = Path(__file__).resolve().parents[2] / "lambdas"
if str(LAMBDAS) not in sys.path:
    sys.path.insert(0, str(LAMBDAS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from remediation_factories import (  # noqa: E402
    APPROVALS,
    CLUSTER,
    EKS_CLUSTER,
    JOB,
    LEDGER,
    NODES,
    REGION,
    TOPIC,
    TRAINING_NAMESPACE,
    job_pods,
)

from sdc_remediation import aws  # noqa: E402
from tests.support.kube_standin import KubeStandIn  # noqa: E402

# Powertools' singletons read their settings and keep the sys.stdout they see when created.
# Create them now, outside any test, with the values the CDK app sets, so the Logger writes to
# pytest's session capture and not to a capsys stream that is closed after one test.
for _key, _value in {
    "POWERTOOLS_SERVICE_NAME": "sdc-remediation",
    "POWERTOOLS_METRICS_NAMESPACE": "SDCRemediation",
    "POWERTOOLS_TRACE_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)
from sdc_remediation import observability  # noqa: E402, F401

_OWNED_VARS = [
    "HYPERPOD_CLUSTER_NAME",
    "EKS_CLUSTER_NAME",
    "METRIC_NAMESPACE",
    "REPORT_LOG_GROUP",
    "LOOKBACK_SECONDS",
    "LEDGER_TABLE",
    "APPROVALS_TABLE",
    "TOPIC_ARN",
    "MAX_NODES_PER_HOUR",
    "MAX_FRACTION",
    "HEALTH_CHECKS",
    "HEALTH_CHECK_TIMEOUT_SECONDS",
    "REPLACE_MODE",
    "APPROVAL_TTL_SECONDS",
    "APPROVAL_TIMEOUT_SECONDS",
    "DRY_RUN",
    "STATE_MACHINE_ARN",
    "K8S_API_ENDPOINT",
    "K8S_API_CA_DATA",
    "ALARM_ACCOUNT_ID",
    "ALARM_NAME_PREFIX",
    "TRAINING_NAMESPACE",
    "JOB_LABEL",
    "REPORT_STREAMS",
    "CHECK_MODES",
    "AUTO_APPROVE",
    "SCREEN_IMAGE",
    "SCREEN_NAMESPACE",
    "SCREEN_DEADLINE_SECONDS",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_SESSION_TOKEN",
    "SDC_APPROVALS_TABLE",
    "SDC_LEDGER_TABLE",
]


@pytest.fixture(autouse=True)
def remediation_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean, complete environment like the CDK functions construct sets, fake credentials."""
    for var in _OWNED_VARS:
        monkeypatch.delenv(var, raising=False)
    values = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_SERVICE_NAME": "sdc-remediation",
        "POWERTOOLS_METRICS_NAMESPACE": "SDCRemediation",
        "LOG_LEVEL": "INFO",
        "HYPERPOD_CLUSTER_NAME": CLUSTER,
        "EKS_CLUSTER_NAME": EKS_CLUSTER,
        "METRIC_NAMESPACE": "SDC",
        "REPORT_LOG_GROUP": f"/sdc/{CLUSTER}",
        "LEDGER_TABLE": LEDGER,
        "APPROVALS_TABLE": APPROVALS,
        "TOPIC_ARN": f"arn:aws:sns:{REGION}:123456789012:{TOPIC}",
        "DRY_RUN": "false",
        "ALARM_ACCOUNT_ID": "123456789012",
        "ALARM_NAME_PREFIX": "sdc-",
        "TRAINING_NAMESPACE": TRAINING_NAMESPACE,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    aws.reset_clients()
    yield
    aws.reset_clients()


def _test_client(service: str, region_name: str = REGION) -> Any:
    """A client for setting up and inspecting the moto account (shares parsed models)."""
    return aws.session().client(service, region_name=region_name)


@dataclass
class Cloud:
    """The moto account the tests run against."""

    nodes: list[str]  # HyperPod instance ids, in order ("i-00000000000000001", ...)

    def client(self, service: str) -> Any:
        """A test-side client (separate from the code's cached ones)."""
        return aws.session().client(service, region_name=REGION)

    def sns_messages(self) -> list[dict[str, Any]]:
        """Every message published to the topic (moto keeps them per region)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sns.models import sns_backends

        topic = sns_backends[DEFAULT_ACCOUNT_ID][REGION].topics[
            f"arn:aws:sns:{REGION}:123456789012:{TOPIC}"
        ]
        return [
            {"subject": subject, "message": message}
            for _, message, subject, *_ in topic.sent_notifications
        ]


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """Tables, topic, log group, an EKS cluster and a HyperPod cluster of ``NODES`` nodes."""
    with mock_aws():
        ddb = _test_client("dynamodb", region_name=REGION)
        ddb.create_table(
            TableName=LEDGER,
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.create_table(
            TableName=APPROVALS,
            KeySchema=[{"AttributeName": "approval_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "approval_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        _test_client("sns", region_name=REGION).create_topic(Name=TOPIC)
        _test_client("logs", region_name=REGION).create_log_group(logGroupName=f"/sdc/{CLUSTER}")
        _test_client("eks", region_name=REGION).create_cluster(
            name=EKS_CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={}
        )
        sm = _test_client("sagemaker", region_name=REGION)
        sm.create_cluster(
            ClusterName=CLUSTER,
            InstanceGroups=[
                {
                    "InstanceGroupName": "workers",
                    "InstanceType": "ml.p5.48xlarge",
                    "InstanceCount": NODES,
                    "LifeCycleConfig": {
                        "SourceS3Uri": "s3://sagemaker-lifecycle/on-create",
                        "OnCreate": "on_create.sh",
                    },
                    "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
                    "ThreadsPerCore": 1,
                }
            ],
        )
        yield Cloud(nodes=_real_looking_instance_ids(CLUSTER))


def _real_looking_instance_ids(cluster_name: str) -> list[str]:
    """Give moto's nodes (``workers-0``, ...) EC2-shaped ids (``i-`` + 17 hex digits), as
    HyperPod reports them and as localize insists; the ids in node order."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    cluster = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[cluster_name]
    old = sorted(cluster.nodes.values(), key=lambda n: int(n.instance_id.rsplit("-", 1)[1]))
    cluster.nodes.clear()
    ids = []
    for index, node in enumerate(old):
        node.instance_id = f"i-{index + 1:017x}"
        cluster.nodes[node.instance_id] = node
        ids.append(node.instance_id)
    return ids


@pytest.fixture
def k8s(monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeStandIn]:
    """The loopback HTTPS Kubernetes API, wired in through the documented override variables."""
    with KubeStandIn() as api:
        monkeypatch.setenv("K8S_API_ENDPOINT", api.url)
        monkeypatch.setenv("K8S_API_CA_DATA", api.ca_b64)
        yield api


@pytest.fixture
def cluster_pods(cloud: Cloud, k8s: KubeStandIn) -> KubeStandIn:
    """The training job ``JOB`` runs a pod on every node of the cluster (in the training
    namespace, with its job-name label): what localize's corroboration finds."""
    job_pods(k8s, cloud.nodes, JOB)
    return k8s


@dataclass
class FakeLambdaContext:
    """What Powertools reads from the Lambda context."""

    function_name: str = "sdc-remediation-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = (
        f"arn:aws:lambda:{REGION}:123456789012:function:sdc-remediation-test"
    )
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@pytest.fixture
def invoke() -> Callable[[str, Any], Any]:
    """Call a step's real handler (``<folder>.handler.handler``) with a Lambda-like context."""

    def _invoke(folder: str, event: Any) -> Any:
        module = importlib.import_module(f"{folder}.handler")
        return module.handler(event, FakeLambdaContext())

    return _invoke


@pytest.fixture
def machine(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> str:
    """The workflow's stand-in (one long Wait), named in STATE_MACHINE_ARN as infra sets it."""
    arn = aws.client("stepfunctions").create_state_machine(
        name="sdc-guard-test",
        definition='{"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 3600, "End": true}}}',
        roleArn="arn:aws:iam::123456789012:role/sfn",
    )["stateMachineArn"]
    monkeypatch.setenv("STATE_MACHINE_ARN", arn)
    return arn
