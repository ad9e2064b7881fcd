"""Rehearsed ``cdk deploy``: the real pinned CDK CLI deploys, updates and destroys the stack on an
embedded AWS, and the remediation chain runs on what CloudFormation created.

One test on purpose: a deploy costs a synth with the layer's pip bundling (tens of seconds on a
busy machine), and each later step needs the stack the earlier one left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from infra.app import STACK_ID
from infra.template import STEP_HANDLER_SUFFIX
from tests.e2e.harness import moto_cloudformation
from tests.e2e.harness.account import create_hyperpod_cluster
from tests.e2e.harness.deployed import DeployedChain
from tests.e2e.harness.deployment import (
    ACCOUNT,
    REGION,
    CdkCli,
    EmbeddedAws,
    rehearsal_context,
    stack_outputs,
    stack_resources,
)
from tests.e2e.scenario import culprit_alarm, local_cluster, operator

pytestmark = pytest.mark.slow

CLUSTER = local_cluster(4)
CONTEXT = rehearsal_context(
    {
        "hyperPodClusterName": CLUSTER.hyperpod_name,
        "eksClusterName": CLUSTER.eks_name,
        "healthCheckPollInterval": "1s",
    }
)
STACK = f"{STACK_ID}-{CLUSTER.hyperpod_name}"


def resources_of(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """Logical id -> properties of the template's resources of one type."""
    return {k: r["Properties"] for k, r in template["Resources"].items() if r["Type"] == kind}


def resolve(value: Any, physical: dict[str, str]) -> Any:
    """A template value with Ref resolved to the deployed physical ids (None if it cannot)."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return physical.get(value["Ref"])
    return value if isinstance(value, str | int | float) else None


def assert_every_resource_deployed(aws: EmbeddedAws, template: dict[str, Any]) -> dict[str, str]:
    """Every template resource (but CDK's metadata) was created, with its type; returns the
    physical ids by logical id."""
    created = stack_resources(aws, STACK)
    expected = {
        k: r["Type"] for k, r in template["Resources"].items() if r["Type"] != "AWS::CDK::Metadata"
    }
    assert {k: r["type"] for k, r in created.items()} == expected
    return {k: r["physical_id"] for k, r in created.items()}


def assert_key_properties(
    aws: EmbeddedAws, template: dict[str, Any], physical: dict[str, str]
) -> None:
    outputs = stack_outputs(aws, STACK)
    # Alarms: thresholds, periods, evaluation as synthesized.
    cloudwatch = aws.client("cloudwatch")
    for props in resources_of(template, "AWS::CloudWatch::Alarm").values():
        (alarm,) = cloudwatch.describe_alarms(AlarmNames=[props["AlarmName"]])["MetricAlarms"]
        assert alarm["Threshold"] == float(props["Threshold"])
        assert alarm["ComparisonOperator"] == props["ComparisonOperator"]
        assert alarm["EvaluationPeriods"] == int(props["EvaluationPeriods"])
        if "Period" in props:
            assert alarm["Period"] == int(props["Period"])
            assert alarm["MetricName"] == props["MetricName"]
    # The rule: the synthesized pattern on the deployed alarms' ARNs, targeting the workflow.
    events = aws.client("events")
    ((rule_id, rule_props),) = resources_of(template, "AWS::Events::Rule").items()
    pattern = json.loads(events.describe_rule(Name=physical[rule_id])["EventPattern"])
    expected_pattern = {k: v for k, v in rule_props["EventPattern"].items() if k != "resources"}
    assert {k: v for k, v in pattern.items() if k != "resources"} == expected_pattern
    alarm_arns = {
        a["AlarmArn"]
        for a in cloudwatch.describe_alarms(
            AlarmNames=[
                physical[ref["Fn::GetAtt"][0]] for ref in rule_props["EventPattern"]["resources"]
            ]
        )["MetricAlarms"]
    }
    # the three SDC alarms and the canary's
    assert set(pattern["resources"]) == alarm_arns and len(alarm_arns) == 4
    (target,) = events.list_targets_by_rule(Rule=physical[rule_id])["Targets"]
    assert target["Arn"] == outputs["StateMachineArn"]
    # Functions: environment, handler, runtime, architecture, layer, tracing as synthesized.
    lam = aws.client("lambda")
    (layer_id,) = resources_of(template, "AWS::Lambda::LayerVersion")
    for logical_id, props in resources_of(template, "AWS::Lambda::Function").items():
        if not props["Handler"].endswith(STEP_HANDLER_SUFFIX):
            continue  # CDK's provider of the cluster-ARN lookup: not ours
        config = lam.get_function_configuration(FunctionName=physical[logical_id])
        deployed_env = config["Environment"]["Variables"]
        for key, value in props["Environment"]["Variables"].items():
            wanted = resolve(value, physical)
            if wanted is not None:
                assert deployed_env[key] == str(wanted), (logical_id, key)
        assert config["Handler"] == props["Handler"]
        assert config["Runtime"] == props["Runtime"]
        assert config["Architectures"] == props["Architectures"]
        assert [layer["Arn"] for layer in config["Layers"]] == [physical[layer_id]]
        assert config["TracingConfig"]["Mode"] == props["TracingConfig"]["Mode"]
    # Tables: keys and TTL.
    ddb = aws.client("dynamodb")
    for logical_id, props in resources_of(template, "AWS::DynamoDB::Table").items():
        table = ddb.describe_table(TableName=physical[logical_id])["Table"]
        assert table["KeySchema"] == props["KeySchema"]
        if "TimeToLiveSpecification" in props:
            ttl = ddb.describe_time_to_live(TableName=physical[logical_id])
            assert ttl["TimeToLiveDescription"] == {
                "TimeToLiveStatus": "ENABLED",
                "AttributeName": props["TimeToLiveSpecification"]["AttributeName"],
            }
    # The tables and log groups under the stack's customer managed keys (issue 32) deploy:
    # moto's CloudFormation models accept SSESpecification's KMSMasterKeyId and a log group's
    # KmsKeyId but do not record them (it reads "Enabled" and "kmsKeyId"), so only that they
    # exist is checked here; the template's keys are pinned by tests/infra/test_infra_encryption.
    logs_client = aws.client("logs")
    for logical_id in resources_of(template, "AWS::Logs::LogGroup"):
        found = logs_client.describe_log_groups(logGroupNamePrefix=physical[logical_id])
        assert physical[logical_id] in [g["logGroupName"] for g in found["logGroups"]]
    # The topic: encrypted with the stack's key (its own).
    (topic,) = resources_of(template, "AWS::SNS::Topic").values()
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    attributes = aws.client("sns").get_topic_attributes(TopicArn=outputs["TopicArn"])
    key_arn = aws.client("kms").describe_key(KeyId=physical[key_id])["KeyMetadata"]["Arn"]
    assert attributes["Attributes"]["KmsMasterKeyId"] in (key_arn, physical[key_id])
    # EKS access entries: one per Kubernetes-calling function's role, recorded only.
    entries = moto_cloudformation.ACCESS_ENTRIES[(ACCOUNT, REGION)]
    for props in resources_of(template, "AWS::EKS::AccessEntry").values():
        role = physical[props["PrincipalArn"]["Fn::GetAtt"][0]]
        (entry,) = [e for arn, e in entries.items() if arn.endswith(f"/{role}")]
        assert entry["KubernetesGroups"] == props["KubernetesGroups"]


# Two synths (the layer's pip bundling) and three CLI runs: more than the suite's default per-test
# timeout on a busy machine; the CLI's own timeout (CDK_TIMEOUT_SECONDS) says what hung.
@pytest.mark.timeout(900)
def test_cdk_deploys_updates_and_destroys_the_stack_and_the_deployed_chain_runs(
    tmp_path: Path,
) -> None:
    with EmbeddedAws() as aws:
        cli = CdkCli(aws, assembly=tmp_path / "cdk.out")
        # Given the stack synthesized with the README's context keys for a cluster
        cli.synth(CONTEXT)
        template = json.loads((tmp_path / "cdk.out" / f"{STACK}.template.json").read_text())

        # When the pinned CDK CLI bootstraps the account and deploys it (the HyperPod cluster
        # exists first: the stack looks its ARN up at deploy time)
        cli.bootstrap()
        create_hyperpod_cluster(aws.client, CLUSTER)
        cli.deploy(STACK)

        # Then every resource exists with the template's key properties, and every output is set
        physical = assert_every_resource_deployed(aws, template)
        assert_key_properties(aws, template, physical)
        outputs = stack_outputs(aws, STACK)
        assert set(outputs) == set(template["Outputs"])

        # When the job's alarm reaches the deployed alarms, rule, state machine and functions
        with DeployedChain(aws, STACK, CLUSTER) as chain:
            chain.publish(culprit_alarm(CLUSTER, [3]), spool_dir=str(tmp_path / "spool"))
            fired = chain.evaluator.evaluate()
            # Then the deployed rule starts the deployed workflow, which asks for approval
            assert len(fired) == 1 and len(chain.executions) == 1
            assert chain.executions[0].startswith(
                outputs["StateMachineArn"].replace(":stateMachine:", ":execution:")
            )
            approval = chain.pending_approval(chain.executions[0], outputs["ApprovalsTableName"])
            ledger = aws.client("dynamodb").scan(TableName=outputs["LedgerTableName"])["Items"]
            assert any(i.get("transition", {}).get("S") == "awaiting_approval" for i in ledger)

            # When the operator CLI approves through the deployed ApprovalUrl (its stand-in)
            assert chain.deployed_approval_url == outputs["ApprovalUrl"]
            me = aws.client("sts").get_caller_identity()["Arn"]
            code, said = operator(chain, "approve", approval, "--reason", "deployed")
            # Then the deployed approve function decided as the authenticated principal, and
            # the deployed workflow replaced the node with that approver recorded
            assert code == 0, said
            (event,) = chain.function_url.events
            assert event["requestContext"]["authorizer"]["iam"]["userArn"] == me
            assert chain.finish(chain.executions[0])["status"] == "SUCCEEDED"
            assert chain.hyperpod.replaced.keys() == {CLUSTER.instance_ids[1]}
            approved = [
                c.payload["state"]["approval"]["approver"]
                for c in chain.invocations
                if c.folder == "record" and c.payload.get("transition") == "approved"
            ]
            assert approved == [me]

        # When one context key changes and the stack is deployed again
        cli.synth({**CONTEXT, "maxNodesPerHour": 3})
        cli.deploy(STACK)
        # Then every deployed function runs with the new value
        lam = aws.client("lambda")
        for r in stack_resources(aws, STACK).values():
            if r["type"] == "AWS::Lambda::Function":
                env = lam.get_function_configuration(FunctionName=r["physical_id"])
                if not env["Handler"].endswith(STEP_HANDLER_SUFFIX):
                    continue  # CDK's provider of the cluster-ARN lookup: not ours
                assert env["Environment"]["Variables"]["MAX_NODES_PER_HOUR"] == "3"

        # When the stack is destroyed
        cli.destroy(STACK)
        # Then its resources are gone but the retained ledger stays, as in AWS
        with pytest.raises(botocore.exceptions.ClientError):
            aws.client("cloudformation").describe_stacks(StackName=STACK)
        assert aws.client("lambda").list_functions()["Functions"] == []
        assert aws.client("dynamodb").list_tables()["TableNames"] == [outputs["LedgerTableName"]]
