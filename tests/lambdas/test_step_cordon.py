"""cordon / uncordon against the loopback HTTPS Kubernetes API (real TLS, EKS token checks)."""

from __future__ import annotations

import base64
import urllib.parse

import pytest
from remediation_factories import EKS_CLUSTER, approved, item_state

from sdc_remediation import aws
from sdc_remediation.clients import kube
from sdc_remediation.config import Settings
from sdc_remediation.errors import (
    ClusterApiUnavailable,
    ConfigurationError,
    InvalidStepInput,
    NodeNotFound,
)
from tests.support.kube_standin import KubeStandIn, decode_token

NODE_ID = "i-0123456789abcdef0"
NODE = f"hyperpod-{NODE_ID}"
ADMITTED = {"decision": "admitted", "remediation_id": "r-cordon-1", "reason": "admitted"}


def _item(remediation_id: str = "r-cordon-1", **results: object) -> dict:
    """The item state of the remediation ``remediation_id`` (admitted), as cordon receives it."""
    admission = {**ADMITTED, "remediation_id": remediation_id}
    return item_state(NODE_ID, admission=admission, **results)


def test_cordon_patches_the_node_with_a_verified_eks_token(cloud, k8s, invoke):
    # Given a schedulable node
    k8s.add_node(NODE)

    # When
    out = invoke("cordon", _item())

    # Then: one strategic-merge PATCH with the cordon, our label and the alarm summary
    assert out == {
        "node_name": NODE,
        "cordoned": True,
        "changed": True,
        "dry_run": False,
        "health_check_label": None,
    }
    [patch] = k8s.patches
    assert patch.path == f"/api/v1/nodes/{NODE}"
    assert patch.headers["content-type"] == "application/strategic-merge-patch+json"
    assert patch.body["spec"] == {"unschedulable": True}
    assert patch.body["metadata"]["labels"] == {"sdc.guard/suspect": "true"}
    summary = patch.body["metadata"]["annotations"]["sdc.guard/alarm"]
    assert "check=compute" in summary and "step=120" in summary and "ranks=3" in summary
    # and the bearer token is k8s-aws-v1. + unpadded base64url of a presigned STS URL
    auth = patch.headers["authorization"]
    assert auth.startswith("Bearer k8s-aws-v1.")
    assert "=" not in auth.removeprefix("Bearer k8s-aws-v1.")
    url = urllib.parse.urlsplit(decode_token(auth))
    query = urllib.parse.parse_qs(url.query)
    assert url.hostname == "sts.us-east-1.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"]
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"][0].split(";")
    assert query["X-Amz-Expires"] == ["60"]
    # and the stand-in's node really is cordoned now
    assert k8s.nodes[NODE]["spec"]["unschedulable"] is True


def test_cordon_is_idempotent(cloud, k8s, invoke):
    # Given a node we already cordoned
    k8s.add_node(NODE)
    invoke("cordon", _item())

    # When cordon runs again (a retry or a second alarm)
    out = invoke("cordon", _item())

    # Then: nothing is sent
    assert out["changed"] is False and out["cordoned"] is True
    assert len(k8s.patches) == 1


def test_cordon_of_a_node_missing_from_kubernetes_is_node_not_found(cloud, k8s, invoke):
    # Given no such node
    # When / Then
    with pytest.raises(NodeNotFound, match=NODE):
        invoke("cordon", _item())


@pytest.mark.parametrize("status", [500, 503, 429])
def test_kubernetes_server_errors_are_transient(cloud, k8s, invoke, status):
    # Given the API server answers an error once
    k8s.add_node(NODE)
    k8s.fail_statuses.append(status)

    # When / Then: the retried error, and no PATCH was applied
    with pytest.raises(ClusterApiUnavailable, match=str(status)):
        invoke("cordon", _item())
    assert k8s.nodes[NODE]["spec"] == {}


def test_a_hanging_kubernetes_api_times_out_as_transient(cloud, k8s, invoke, monkeypatch):
    # Given an API server that does not answer within the read timeout
    k8s.add_node(NODE)
    k8s.hang_seconds = 2.0
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", (1.0, 0.3))

    # When / Then
    with pytest.raises(ClusterApiUnavailable, match="unreachable"):
        invoke("cordon", _item())


def test_forbidden_is_a_configuration_error(cloud, k8s, invoke):
    # Given RBAC does not let the function patch nodes
    k8s.add_node(NODE)
    k8s.fail_statuses.append(403)

    # When / Then
    with pytest.raises(ConfigurationError, match="RBAC"):
        invoke("cordon", _item())


def test_tls_is_verified_against_the_cluster_ca(cloud, k8s, invoke, monkeypatch):
    # Given the CA of a different cluster
    with KubeStandIn() as other:
        monkeypatch.setenv("K8S_API_CA_DATA", other.ca_b64)
    k8s.add_node(NODE)

    # When / Then: the connection is refused, nothing was received
    with pytest.raises(ConfigurationError, match="TLS verification"):
        invoke("cordon", _item())
    assert k8s.requests == []


def test_endpoint_and_ca_come_from_eks_describe_cluster_without_overrides(cloud):
    # Given no override variables (the deployed configuration)

    described = aws.client("eks").describe_cluster(name=EKS_CLUSTER)["cluster"]

    # When
    endpoint, ca = kube._endpoint_and_ca(Settings())

    # Then
    assert endpoint == described["endpoint"]
    assert ca == described["certificateAuthority"]["data"]


def test_cordon_reports_the_verdict_an_earlier_health_check_left_on_the_node(cloud, k8s, invoke):
    # Given a node whose deep health check passed at cluster creation
    k8s.add_node(NODE, labels={"sagemaker.amazonaws.com/deep-health-check-status": "Passed"})

    # When
    out = invoke("cordon", _item())

    # Then: the label is passed on, so the coming check's poll can tell it is not its verdict
    assert out["cordoned"] is True
    assert out["health_check_label"] == "Passed"


def test_uncordon_releases_only_what_we_cordoned(cloud, k8s, invoke):
    # Given a node we cordoned, and a rejection that asks for release
    k8s.add_node(NODE)
    invoke("cordon", _item())
    approval = approved(NODE_ID, decision="reject", release=True)  # alice's, in the table

    # When
    out = invoke("uncordon", _item(approval=approval))

    # Then: schedulable again, our label and annotation gone, the release annotated
    assert out == {
        "node_name": NODE,
        "cordoned": False,
        "changed": True,
        "dry_run": False,
        "health_check_label": None,
    }
    node = k8s.nodes[NODE]
    assert node["spec"]["unschedulable"] is False
    assert "sdc.guard/suspect" not in node["metadata"]["labels"]
    assert "sdc.guard/alarm" not in node["metadata"]["annotations"]
    assert "alice" in node["metadata"]["annotations"]["sdc.guard/released"]


def test_uncordon_keeps_a_cordon_someone_else_set_before_us(cloud, k8s, invoke):
    # Given a node an operator had cordoned before our alarm
    k8s.add_node(NODE, unschedulable=True)
    invoke("cordon", _item())
    approval = approved(NODE_ID, decision="reject", release=True)

    # When
    out = invoke("uncordon", _item(approval=approval))

    # Then: our mark is gone but their cordon stays
    assert out["cordoned"] is True
    assert k8s.nodes[NODE]["spec"]["unschedulable"] is True
    assert "sdc.guard/suspect" not in k8s.nodes[NODE]["metadata"]["labels"]


def test_uncordon_without_a_release_decision_is_refused(cloud, k8s, invoke):
    # Given an approval (not a rejection with release)
    k8s.add_node(NODE)
    approval = {"decision": "approve", "approver": "arn:aws:iam::1:user/a", "approval_id": "a-1"}

    # When / Then: never uncordon by mistake
    with pytest.raises(InvalidStepInput, match="release"):
        invoke("uncordon", _item(approval=approval))
    assert k8s.requests == []


def test_ca_data_that_is_not_base64_is_a_configuration_error(cloud, k8s, invoke, monkeypatch):
    # Given a broken override
    monkeypatch.setenv("K8S_API_CA_DATA", "not base64!")

    # When / Then
    with pytest.raises(ConfigurationError, match="base64"):
        invoke("cordon", _item())
    assert base64  # the module is used by the stand-in's token decoder too


@pytest.mark.parametrize("name", ["../nodes/victim", "victim/status", "hyperpod-i-1?x=1", "A"])
def test_the_kubernetes_client_never_puts_a_non_name_in_a_url_path(cloud, k8s, name):
    # Given a node "victim", and a name that is not a Kubernetes node name
    k8s.add_node("victim")
    api = kube.KubeApi.from_settings(Settings())

    # When / Then: refused before any request, whatever reaches the client
    with pytest.raises(InvalidStepInput, match="not a valid Kubernetes name"):
        api.patch_node(name, {"spec": {"unschedulable": True}})
    assert k8s.requests == []
