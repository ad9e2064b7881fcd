"""A deep-health-check verdict label left by an EARLIER check (cluster creation, a previous
remediation) is not taken for the verdict of the check this remediation started."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from botocore.stub import Stubber
from remediation_factories import item_state

from sdc_remediation import aws

INSTANCE = "i-0123456789abcdef0"
NODE = f"hyperpod-{INSTANCE}"
DHC = "sagemaker.amazonaws.com/deep-health-check-status"


def _node(status: str) -> dict:
    return {
        "NodeDetails": {
            "InstanceGroupName": "workers",
            "InstanceId": INSTANCE,
            "InstanceStatus": {"Status": status, "Message": ""},
        }
    }


def _health(label_before: str | None, started: datetime | None = None, **extra) -> dict:
    return {
        "status": "in_progress",
        "started_at": (started or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
        "checks": ["InstanceStress"],
        "dry_run": False,
        "detail": "",
        "label_before": label_before,
        **extra,
    }


@pytest.fixture
def sagemaker(cloud):
    """The code's own SageMaker client, stubbed: any unexpected call fails the test."""
    with Stubber(aws.client("sagemaker")) as stub:
        yield stub
        stub.assert_no_pending_responses()


@pytest.mark.parametrize("verdict", ["Passed", "Failed"])
def test_an_unchanged_verdict_label_is_not_this_checks_verdict(sagemaker, k8s, invoke, verdict):
    # Given a node that carried the verdict before the check, and HyperPod has not yet shown the
    # new check running (instance Running, label unchanged)
    k8s.add_node(NODE, labels={DHC: verdict})
    sagemaker.add_response("describe_cluster_node", _node("Running"))

    # When
    out = invoke("poll_health_check", item_state(INSTANCE, health=_health(verdict)))

    # Then: still in progress, and the result says why
    assert out["status"] == "in_progress"
    assert out["seen_in_progress"] is False and out["label_before"] == verdict
    assert "unchanged since before this check" in out["detail"]


def test_a_stale_label_never_seen_replaced_ends_timed_out(sagemaker, k8s, invoke, monkeypatch):
    # Given a stale Passed label and a check started longer ago than the timeout
    monkeypatch.setenv("HEALTH_CHECK_TIMEOUT_SECONDS", "600")
    k8s.add_node(NODE, labels={DHC: "Passed"})
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    started = datetime.now(UTC) - timedelta(seconds=601)

    # When
    out = invoke("poll_health_check", item_state(INSTANCE, health=_health("Passed", started)))

    # Then: timed out, not passed
    assert out["status"] == "timed_out"


def test_a_verdict_after_the_check_was_seen_running_counts(sagemaker, k8s, invoke):
    # Given a node that passed an earlier check, now running the new one
    k8s.add_node(NODE, labels={DHC: "InProgress"})
    sagemaker.add_response("describe_cluster_node", _node("DeepHealthCheckInProgress"))
    state = item_state(INSTANCE, health=_health("Passed"))

    # When the workflow polls while it runs, then after HyperPod labelled the verdict (each poll's
    # output replaces $.health, as the workflow does)
    state["health"] = invoke("poll_health_check", state)
    while_running = dict(state["health"])
    k8s.set_labels(NODE, {DHC: "Passed"})
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    state["health"] = invoke("poll_health_check", state)

    # Then
    assert while_running["status"] == "in_progress" and while_running["seen_in_progress"] is True
    assert state["health"]["status"] == "passed"
    assert state["health"]["label_before"] == "Passed"


def test_a_verdict_label_that_changed_counts_without_seeing_the_check_run(sagemaker, k8s, invoke):
    # Given a node that failed an earlier check and whose new check passed between two polls
    k8s.add_node(NODE, labels={DHC: "Passed"})
    sagemaker.add_response("describe_cluster_node", _node("Running"))

    # When
    out = invoke("poll_health_check", item_state(INSTANCE, health=_health("Failed")))

    # Then
    assert out["status"] == "passed"


def test_a_failing_instance_is_failed_whatever_the_label_says(sagemaker, k8s, invoke):
    # Given a stale Passed label, but HyperPod reports the instance failing now
    k8s.add_node(NODE, labels={DHC: "Passed"})
    sagemaker.add_response("describe_cluster_node", _node("Failure"))

    # When
    out = invoke("poll_health_check", item_state(INSTANCE, health=_health("Passed")))

    # Then: the instance status is current, not stale
    assert out["status"] == "failed"


def test_start_carries_the_label_cordon_read(sagemaker, invoke):
    # Given cordon found the node labelled Passed by an earlier check
    cordon = {
        "node_name": NODE,
        "cordoned": True,
        "changed": True,
        "dry_run": False,
        "health_check_label": "Passed",
    }
    sagemaker.add_response("describe_cluster_node", _node("Running"))
    sagemaker.add_response(
        "start_cluster_health_check",
        {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef123456"},
    )

    # When
    out = invoke("start_health_check", item_state(INSTANCE, cordon=cordon))

    # Then
    assert out["status"] == "in_progress"
    assert out["label_before"] == "Passed" and out["seen_in_progress"] is False


def test_start_finding_a_check_running_counts_it_as_seen(sagemaker, invoke):
    # Given the check already runs (a retried start)
    sagemaker.add_response("describe_cluster_node", _node("DeepHealthCheckInProgress"))
    cordon = {"node_name": NODE, "cordoned": True, "changed": False, "dry_run": False}

    # When
    out = invoke("start_health_check", item_state(INSTANCE, cordon=cordon))

    # Then
    assert out["seen_in_progress"] is True
