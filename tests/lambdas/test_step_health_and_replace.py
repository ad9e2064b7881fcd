"""Deep health check and replacement: botocore Stubber (validated against the SageMaker model in
botocore) for StartClusterHealthCheck / BatchReplaceClusterNodes, which moto lacks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import Stubber
from remediation_factories import CLUSTER, approved, item_state

from sdc_remediation import aws
from sdc_remediation.errors import (
    AwsApiUnavailable,
    HealthCheckRejected,
    InstanceNotInCluster,
    InvalidStepInput,
    ReplaceFailed,
)

INSTANCE = "i-0123456789abcdef0"
NODE = f"hyperpod-{INSTANCE}"
APPROVED = {
    "decision": "approve",
    "release": False,
    "approver": "arn:aws:iam::123456789012:user/alice",
    "reason": "persistent",
    "approval_id": "a-1",
}


def _node(status: str) -> dict:
    return {
        "NodeDetails": {
            "InstanceGroupName": "workers",
            "InstanceId": INSTANCE,
            "InstanceStatus": {"Status": status, "Message": ""},
        }
    }


@pytest.fixture
def sagemaker(cloud):
    """The code's own SageMaker client, stubbed: any unexpected call fails the test."""
    with Stubber(aws.client("sagemaker")) as stub:
        yield stub
        stub.assert_no_pending_responses()


def test_start_health_check_requests_the_configured_checks_for_the_instance_and_group(
    sagemaker, invoke, monkeypatch
):
    # Given two configured checks and a running instance
    monkeypatch.setenv("HEALTH_CHECKS", "InstanceStress,InstanceConnectivity")
    sagemaker.add_response(
        "describe_cluster_node", _node("Running"), {"ClusterName": CLUSTER, "NodeId": INSTANCE}
    )
    sagemaker.add_response(
        "start_cluster_health_check",
        {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef123456"},
        {
            "ClusterName": CLUSTER,
            "DeepHealthCheckConfigurations": [
                {
                    "InstanceGroupName": "workers",
                    "InstanceIds": [INSTANCE],
                    "DeepHealthChecks": ["InstanceStress", "InstanceConnectivity"],
                }
            ],
        },
    )

    # When
    out = invoke("start_health_check", item_state(INSTANCE))

    # Then
    assert out["status"] == "in_progress"
    assert out["checks"] == ["InstanceStress", "InstanceConnectivity"]
    assert out["dry_run"] is False


def test_start_health_check_does_not_start_a_second_one(sagemaker, invoke):
    # Given a check already running on the instance (our retried Lambda, or someone else's)
    sagemaker.add_response("describe_cluster_node", _node("DeepHealthCheckInProgress"))

    # When
    out = invoke("start_health_check", item_state(INSTANCE))

    # Then: no StartClusterHealthCheck call (the Stubber would fail on an unexpected call)
    assert out["status"] == "in_progress"
    assert "already in progress" in out["detail"]


def test_a_refused_health_check_is_health_check_rejected(sagemaker, invoke):
    # Given HyperPod refuses the request
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    sagemaker.add_client_error(
        "start_cluster_health_check", "ValidationException", "instance busy", 400
    )

    # When / Then
    with pytest.raises(HealthCheckRejected, match="instance busy"):
        invoke("start_health_check", item_state(INSTANCE))


def _health(started: datetime) -> dict:
    return {
        "status": "in_progress",
        "started_at": started.isoformat().replace("+00:00", "Z"),
        "checks": ["InstanceStress"],
        "dry_run": False,
        "detail": "",
    }


@pytest.mark.parametrize(
    ("status", "labels", "expected"),
    [
        (
            "DeepHealthCheckInProgress",
            {"sagemaker.amazonaws.com/deep-health-check-status": "InProgress"},
            "in_progress",
        ),
        ("Running", {"sagemaker.amazonaws.com/deep-health-check-status": "Passed"}, "passed"),
        ("Running", {"sagemaker.amazonaws.com/deep-health-check-status": "Failed"}, "failed"),
        ("Failure", {}, "failed"),
        (
            "Running",
            {"sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReplacement"},
            "failed",
        ),
        ("ShuttingDown", {}, "replaced_by_hyperpod"),
    ],
)
def test_poll_reads_instance_status_and_node_labels(
    sagemaker, k8s, invoke, status, labels, expected
):
    # Given HyperPod's view of the instance and the labels it put on the node
    k8s.add_node(NODE, labels=labels)
    sagemaker.add_response("describe_cluster_node", _node(status))

    # When
    out = invoke("poll_health_check", item_state(INSTANCE, health=_health(datetime.now(UTC))))

    # Then
    assert out["status"] == expected


def test_poll_reports_replaced_by_hyperpod_when_the_instance_is_gone(cloud, k8s, invoke):
    # Given (moto) HyperPod no longer knows the instance after a failed check
    # When
    out = invoke(
        "poll_health_check", item_state("i-0aaaaaaaaaaaaaaa0", health=_health(datetime.now(UTC)))
    )

    # Then: recorded as HyperPod's own replacement; the node was not even looked up
    assert out["status"] == "replaced_by_hyperpod"
    assert k8s.requests == []


def test_poll_times_out_after_the_configured_time(cloud, k8s, invoke, monkeypatch):
    # Given a check started longer ago than HEALTH_CHECK_TIMEOUT_SECONDS with no verdict yet
    monkeypatch.setenv("HEALTH_CHECK_TIMEOUT_SECONDS", "600")
    node = cloud.nodes[0]
    k8s.add_node(
        f"hyperpod-{node}",
        labels={"sagemaker.amazonaws.com/deep-health-check-status": "InProgress"},
    )

    # When
    out = invoke(
        "poll_health_check",
        item_state(node, health=_health(datetime.now(UTC) - timedelta(seconds=601))),
    )

    # Then
    assert out["status"] == "timed_out"
    assert "600s" in out["detail"]


def test_replace_calls_batch_replace_for_the_approved_instance(sagemaker, invoke):
    # Given an approved suspect on a running instance
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    sagemaker.add_response(
        "batch_replace_cluster_nodes",
        {"Successful": [INSTANCE]},
        {"ClusterName": CLUSTER, "NodeIds": [INSTANCE]},
    )

    # When
    out = invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))

    # Then
    assert out == {
        "mode": "api",
        "requested": True,
        "dry_run": False,
        "detail": "BatchReplaceClusterNodes accepted",
    }


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("InvalidInstanceStatus", ReplaceFailed),
        ("InstanceIdInUse", ReplaceFailed),
        ("InstanceIdNotFound", ReplaceFailed),
        ("InternalServerError", AwsApiUnavailable),
    ],
)
def test_replace_failed_entries_raise_typed_errors(sagemaker, invoke, code, error):
    # Given BatchReplaceClusterNodes puts the instance in Failed[] (a partial failure of the batch)
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    sagemaker.add_response(
        "batch_replace_cluster_nodes",
        {
            "Successful": ["i-0fedcba9876543210"],
            "Failed": [{"NodeId": INSTANCE, "ErrorCode": code, "Message": f"{code} for test"}],
        },
    )

    # When / Then: the error code is in the message; InternalServerError is retried
    with pytest.raises(error, match=code):
        invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))


def test_replace_is_idempotent_when_the_instance_is_already_leaving(sagemaker, invoke):
    # Given our earlier call already started the replacement
    sagemaker.add_response("describe_cluster_node", _node("ShuttingDown"))

    # When (no BatchReplaceClusterNodes is stubbed: a call would fail the test)
    out = invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))

    # Then
    assert out["requested"] is True
    assert "already leaving" in out["detail"]


def test_replace_by_label_marks_the_node_for_hyperpod(cloud, k8s, invoke, monkeypatch):
    # Given REPLACE_MODE=label
    monkeypatch.setenv("REPLACE_MODE", "label")
    k8s.add_node(NODE)

    # When
    out = invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))
    again = invoke("replace", item_state(INSTANCE, approval=approved(INSTANCE)))

    # Then: one PATCH with HyperPod's replacement label; the retry sends nothing
    assert out["mode"] == "label" and out["requested"] is True
    [patch] = k8s.patches
    assert patch.body == {
        "metadata": {
            "labels": {
                "sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReplacement"
            }
        }
    }
    assert again["detail"] == "label already set"


@pytest.mark.parametrize("approval", [None, {**APPROVED, "decision": "reject"}])
def test_replace_never_runs_without_an_approval(sagemaker, invoke, approval):
    # Given no approval, or a rejection
    state = item_state(INSTANCE) if approval is None else item_state(INSTANCE, approval=approval)

    # When / Then
    with pytest.raises(InvalidStepInput, match="approve"):
        invoke("replace", state)


def test_start_health_check_for_an_instance_hyperpod_does_not_know_is_an_error(cloud, invoke):
    # Given (moto) no such instance in the cluster
    # When / Then: nothing is started for a node we cannot find
    with pytest.raises(InstanceNotInCluster, match="i-0aaaaaaaaaaaaaaa0"):
        invoke("start_health_check", item_state("i-0aaaaaaaaaaaaaaa0"))
