"""The steps composed the way the workflow composes them (ResultPath per step), one node from
alarm to replacement: outputs of one handler are valid inputs of the next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from botocore.stub import ANY, Stubber
from click.testing import CliRunner
from remediation_factories import (
    APPROVALS,
    CLUSTER,
    LEDGER,
    alarm_event,
    put_node_metric,
    put_report,
    rank,
    report,
)

from sdc_remediation import aws
from sdc_remediation.cli import main


def test_alarm_to_approved_replacement(cloud, k8s, cluster_pods, invoke):
    # Given a report naming rank 3 on a node of the cluster
    t = datetime.now(UTC).replace(microsecond=0)
    instance = cloud.nodes[5]
    node = f"hyperpod-{instance}"
    # (its deep health check passed at cluster creation: the label says so until the next check)
    k8s.add_node(node, labels={"sagemaker.amazonaws.com/deep-health-check-status": "Passed"})
    put_node_metric(cloud.client("cloudwatch"), node, t - timedelta(seconds=10))
    body = report(
        time=t - timedelta(seconds=10), suspects=[3], ranks={"3": rank(node, instance, 3)}
    )
    put_report(cloud.client("logs"), f"/sdc/{CLUSTER}", body, t - timedelta(seconds=10))

    # When the workflow runs each step on the Map item, adding results under their keys
    located = invoke("localize", alarm_event(time=t))
    state = {
        "alarm": located["alarm"],
        "suspect": located["suspects"][0],
        "execution": "exec-chain",
    }
    state["admission"] = invoke("admit", state)
    state["cordon"] = invoke("cordon", state)
    invoke("record", {"transition": "cordoned", "notify": True, "state": state})
    sagemaker = aws.client("sagemaker")
    with Stubber(sagemaker) as sm:
        node_details = {
            "NodeDetails": {
                "InstanceGroupName": "workers",
                "InstanceId": instance,
                "InstanceStatus": {"Status": "Running"},
            }
        }
        sm.add_response("describe_cluster_node", node_details)
        sm.add_response(
            "start_cluster_health_check",
            {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef123456"},
        )
        state["health"] = invoke("start_health_check", state)
        # HyperPod runs the check (instance status and label), then labels the verdict
        running = {
            "NodeDetails": {
                **node_details["NodeDetails"],
                "InstanceStatus": {"Status": "DeepHealthCheckInProgress"},
            }
        }
        k8s.set_labels(node, {"sagemaker.amazonaws.com/deep-health-check-status": "InProgress"})
        sm.add_response("describe_cluster_node", running)
        state["health"] = invoke("poll_health_check", state)
        polled_while_running = state["health"]["status"]
        k8s.set_labels(node, {"sagemaker.amazonaws.com/deep-health-check-status": "Passed"})
        sm.add_response("describe_cluster_node", node_details)
        state["health"] = invoke("poll_health_check", state)
        invoke("request_approval", {**state, "task_token": "token-chain"})
        [pending] = [
            line
            for line in CliRunner()
            .invoke(main, ["--approvals-table", APPROVALS, "pending"])
            .output.splitlines()
            if line.startswith("a-")
        ]
        approval_id = pending.split()[0]
        with Stubber(aws.client("stepfunctions")) as sfn:
            sfn.add_response("send_task_success", {}, {"taskToken": "token-chain", "output": ANY})
            assert (
                CliRunner()
                .invoke(main, ["--approvals-table", APPROVALS, "approve", approval_id])
                .exit_code
                == 0
            )
        state["approval"] = {
            "decision": "approve",
            "release": False,
            "approver": "arn:aws:sts::123456789012:user/moto",
            "reason": "",
            "approval_id": approval_id,
        }
        sm.add_response("describe_cluster_node", node_details)
        sm.add_response("batch_replace_cluster_nodes", {"Successful": [instance]})
        state["replacement"] = invoke("replace", state)
    invoke("record", {"transition": "replaced", "notify": True, "state": state})

    # Then: cordoned once, checked, approved, replaced, and the remediation closed in the ledger
    assert state["admission"]["decision"] == "admitted"
    assert state["cordon"]["changed"] is True and len(k8s.patches) == 1
    assert polled_while_running == "in_progress"
    assert state["health"]["status"] == "passed"
    assert state["health"]["label_before"] == "Passed"
    assert state["replacement"]["requested"] is True
    history = CliRunner().invoke(main, ["--ledger-table", LEDGER, "history", "--node", node]).output
    lines = history.strip().splitlines()
    assert [line.split()[3] for line in lines if not line.startswith(" ")] == [
        "admitted",
        "cordoned",
        "replaced",
    ]
    # And the history states where the job may resume (the agent's rule for this alarm)
    assert [line.strip() for line in lines if line.startswith(" ")] == [
        f"resume rule: resume from the newest checkpoint at or before step {body['last_audit_pass']}"
    ]
    subjects = [m["subject"] for m in cloud.sns_messages()]
    assert (
        subjects[0].startswith("[sdc-guard] cordoned")
        and "approve replacing" in subjects[1]
        and subjects[2].startswith("[sdc-guard] replaced")
    )
