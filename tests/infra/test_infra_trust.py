"""What the template lets a pod, an operator or a step do, read from the IAM it grants: the agent
cannot write the canary's stream, no role may mutate every HyperPod cluster of the account, and
the cluster's ARN is looked up at deploy time when the config does not name it."""

from __future__ import annotations

from typing import Any

import pytest

import sdc_contract as contract
from tests.infra.infra_template import (
    as_list,
    evaluate,
    evaluate_for,
    flatten,
    function_ids,
    resources,
    role_statements,
)

pytestmark = pytest.mark.slow

GROUP = "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/sdc/example-hyperpod-cluster"
READ_ONLY = ("sagemaker:Describe", "sagemaker:List")


def _agent_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    (agent,) = [
        p["Properties"]
        for p in resources(template, "AWS::IAM::ManagedPolicy").values()
        if "agent" in p["Properties"]["Description"]
    ]
    return agent["PolicyDocument"]["Statement"]


def test_the_agent_may_write_training_jobs_streams_but_never_the_canarys(default_synth) -> None:
    # Given the agent's managed policy (what every training pod's role gets)
    statements = _agent_statements(default_synth.template)
    canary = f"{GROUP}:log-stream:{contract.CANARY_JOB}"
    job = f"{GROUP}:log-stream:llama-pretrain"
    # Then a job's own stream may be created and written
    assert evaluate(statements, "logs:CreateLogStream", job)
    assert evaluate(statements, "logs:PutLogEvents", job)
    # And the canary's may not (superseded: any stream of the group): a pod that could write it
    # could forge canary reports, or page the on-call with a false "canary stopped"
    assert not evaluate(statements, "logs:CreateLogStream", canary)
    assert not evaluate(statements, "logs:PutLogEvents", canary)
    # nor the idle screener's (issue 35): a pod there could forge a reproduced screen
    idle = f"{GROUP}:log-stream:{contract.IDLE_SCREEN_JOB}"
    assert not evaluate(statements, "logs:CreateLogStream", idle)
    assert not evaluate(statements, "logs:PutLogEvents", idle)
    (deny,) = [s for s in statements if s.get("Effect") == "Deny"]
    assert deny["Sid"] == "NotTheReservedStreams"
    # And no pod lists the group's streams, every job's name (superseded: DescribeLogStreams
    # was granted, and the agent never called it)
    assert not evaluate(statements, "logs:DescribeLogStreams", GROUP)


VARIANT_GROUP = "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/sdc/ml-prod"


def _pod(name: str, namespace: str = "ml-training", **more: str) -> dict[str, str]:
    """The request context of a pod's call under EKS Pod Identity (its session tags)."""
    return {
        "aws:PrincipalTag/kubernetes-namespace": namespace,
        "aws:PrincipalTag/kubernetes-pod-name": name,
        **more,
    }


def test_under_pod_identity_a_pod_writes_only_its_own_stream(variant_synth) -> None:
    # Given the agent's policy with agentIdentity pod-identity, trainingNamespace ml-training
    statements = _agent_statements(variant_synth.template)
    stream = f"{VARIANT_GROUP}:log-stream:"
    pod = _pod("llama-worker-0")
    # Then the pod writes its own stream under any job's part (localize checks the job)
    assert evaluate_for(
        statements, "logs:PutLogEvents", f"{stream}ml-training/llama/llama-worker-0", pod
    )
    assert evaluate_for(
        statements, "logs:CreateLogStream", f"{stream}ml-training/llama/llama-worker-0", pod
    )
    # And no other pod's stream, nor the job-named stream, nor the canary's (superseded: any
    # pod wrote any job's stream <job>)
    for other in (
        "ml-training/llama/llama-worker-1",
        "ml-training/llama/x-llama-worker-0",
        "llama",
        contract.CANARY_JOB,
        "other-ns/llama/llama-worker-0",
    ):
        assert not evaluate_for(statements, "logs:PutLogEvents", f"{stream}{other}", pod), other
    # And a pod of another namespace writes nothing, not even a stream named like its own
    stranger = _pod("llama-worker-0", namespace="other-ns")
    for target in ("other-ns/llama/llama-worker-0", "ml-training/llama/llama-worker-0"):
        assert not evaluate_for(statements, "logs:PutLogEvents", f"{stream}{target}", stranger)
    # And a principal without Pod Identity's tags (an IRSA role with this policy) writes nothing
    assert not evaluate_for(statements, "logs:PutLogEvents", f"{stream}llama", {})
    # And nobody lists the group's streams (every job's names)
    assert not evaluate_for(statements, "logs:DescribeLogStreams", VARIANT_GROUP, pod)


def test_under_pod_identity_only_the_training_namespace_puts_sdc_metrics(variant_synth) -> None:
    statements = _agent_statements(variant_synth.template)
    sdc = {"cloudwatch:namespace": contract.DEFAULT_NAMESPACE}
    assert evaluate_for(statements, "cloudwatch:PutMetricData", "*", _pod("p", **sdc))
    assert not evaluate_for(
        statements, "cloudwatch:PutMetricData", "*", _pod("p", namespace="other-ns", **sdc)
    )
    canary = {"cloudwatch:namespace": contract.canary_namespace(contract.DEFAULT_NAMESPACE)}
    assert not evaluate_for(statements, "cloudwatch:PutMetricData", "*", _pod("p", **canary))


def _sagemaker_grants(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    roles = {logical_id: r for logical_id, r in resources(template, "AWS::IAM::Role").items()}
    return [
        (role_id, statement)
        for role_id in roles
        for statement in role_statements(template, role_id)
        if any(a.startswith("sagemaker:") for a in as_list(statement["Action"]))
    ]


@pytest.mark.parametrize("synth", ["default_synth", "variant_synth"])
def test_no_mutating_sagemaker_action_on_every_cluster(synth: str, request) -> None:
    # Given every SageMaker statement of every role (the cluster ARN given or not)
    template = request.getfixturevalue(synth).template
    grants = _sagemaker_grants(template)
    assert grants
    # Then an action that changes something (StartClusterHealthCheck, BatchReplaceClusterNodes)
    # is granted on one cluster only; only the deploy-time lookup reads cluster/* (superseded:
    # without hyperPodClusterArn every HyperPod role had cluster/* of the account)
    for role_id, statement in grants:
        resources_ = [flatten(r) for r in as_list(statement["Resource"])]
        mutating = [a for a in as_list(statement["Action"]) if not a.startswith(READ_ONLY)]
        if mutating:
            assert not any("cluster/*" in r for r in resources_), (role_id, statement)
    wide = [
        (role_id, s)
        for role_id, s in grants
        if any("cluster/*" in flatten(r) for r in as_list(s["Resource"]))
    ]
    assert all(as_list(s["Action"]) == ["sagemaker:DescribeCluster"] for _, s in wide), wide


def test_without_the_arn_the_cluster_is_looked_up_at_deploy_time(default_synth) -> None:
    # Given the default stack (no hyperPodClusterArn)
    template = default_synth.template
    (lookup_id, lookup) = next(iter(resources(template, "Custom::HyperPodClusterArn").items()))
    # Then a custom resource calls SageMaker DescribeCluster with the cluster's name at deploy
    assert '"action":"describeCluster"' in lookup["Properties"]["Create"]
    assert '"ClusterName":"example-hyperpod-cluster"' in lookup["Properties"]["Create"]
    # And the health-check and replace roles act on its answer, the one cluster
    ids = function_ids(template)
    for folder in ("start_health_check", "replace"):
        role = template["Resources"][ids[folder]]["Properties"]["Role"]["Fn::GetAtt"][0]
        (statement,) = [
            s
            for s in role_statements(template, role)
            if any(a.startswith("sagemaker:") for a in as_list(s["Action"]))
        ]
        assert statement["Resource"] == {"Fn::GetAtt": [lookup_id, "ClusterArn"]}


def test_with_the_arn_nothing_is_looked_up(variant_synth) -> None:
    assert resources(variant_synth.template, "Custom::HyperPodClusterArn") == {}


def test_canary_runs_expire(default_synth) -> None:
    # Given the ledger table and the canary function
    template = default_synth.template
    (ledger,) = [
        t["Properties"]
        for t in resources(template, "AWS::DynamoDB::Table").values()
        if len(t["Properties"]["KeySchema"]) == 2
    ]
    canary = template["Resources"][function_ids(template)["canary"]]["Properties"]
    # Then the ledger removes what carries expires_at (canary runs, alarm-episode notices), and
    # the canary function knows how long a run stays open (canaryTimeout)
    assert ledger["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert canary["Environment"]["Variables"][contract.CANARY_TIMEOUT_SECONDS] == "3600"
