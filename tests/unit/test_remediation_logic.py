"""Pure remediation logic: health outcomes, verdicts, guard limits, the EKS token, messages, and
the names docs/CONTRACT.md fixes."""

from __future__ import annotations

import base64
import re
import urllib.parse
from pathlib import Path

import boto3
import pytest
from botocore.credentials import Credentials

from sdc_remediation import errors
from sdc_remediation.clients.kube import eks_token
from sdc_remediation.logic.admission import max_open
from sdc_remediation.logic.cordon import cordon_body
from sdc_remediation.logic.health import classify
from sdc_remediation.logic.localize import verdict_for
from sdc_remediation.logic.notify import approval_message, suggested_action
from sdc_remediation.models import Report

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "CONTRACT.md"
DHC = "sagemaker.amazonaws.com/deep-health-check-status"


@pytest.mark.parametrize(
    ("status", "labels", "expected"),
    [
        (None, {}, "replaced_by_hyperpod"),
        ("ShuttingDown", {DHC: "Failed"}, "replaced_by_hyperpod"),
        ("Running", {DHC: "Failed"}, "failed"),
        ("Failure", {DHC: "InProgress"}, "failed"),
        ("DeepHealthCheckInProgress", {}, "in_progress"),
        ("Running", {DHC: "InProgress"}, "in_progress"),
        ("Running", {DHC: "Passed"}, "passed"),
        ("Running", {}, "in_progress"),  # HyperPod has not picked the request up yet
        (
            "Running",
            {"sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReboot"},
            "failed",
        ),
    ],
)
def test_health_outcome_from_status_and_labels(status, labels, expected):
    assert classify(status, labels)[0] == expected


def _report(**kw) -> Report:
    base = {
        "schema": "sdc.alarm/v1",
        "cluster": "c",
        "job": "j",
        "time": "2026-01-01T00:00:00Z",
        "step": 5,
        "check": "compute",
    }
    return Report.model_validate(base | kw)


def test_verdict_prefers_the_confirmation_kind_then_the_check_reason():
    r = _report(
        verdicts=[{"pair": [1, 2], "third": 3, "suspect": 1, "kind": "transient"}],
        culprits=[4],
        nonfinite=[6],
    )
    assert verdict_for(r, 1) == "transient"
    assert verdict_for(r, 4) == "culprit"
    assert verdict_for(r, 6) == "nonfinite"
    assert verdict_for(_report(check="weights"), 2) == "weights_minority"


@pytest.mark.parametrize(
    ("nodes", "fraction", "limit"),
    [(10, 0.05, 1), (40, 0.05, 2), (128, 0.05, 6), (10, 1.0, 10), (0, 0.05, 1)],
)
def test_the_open_limit_is_a_fraction_of_the_cluster_but_at_least_one(nodes, fraction, limit):
    assert max_open(nodes, fraction) == limit


def test_eks_token_is_an_unpadded_base64url_presigned_get_caller_identity():
    # Given fixed credentials
    session = boto3.session.Session(region_name="eu-west-1")
    session._session._credentials = Credentials("AKIDEXAMPLE", "secret")

    # When
    token = eks_token("my-cluster", session)

    # Then
    assert token.startswith("k8s-aws-v1.")
    b64 = token.removeprefix("k8s-aws-v1.")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", b64)  # url-safe alphabet, no padding
    url = urllib.parse.urlsplit(base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).decode())
    query = urllib.parse.parse_qs(url.query)
    assert url.netloc == "sts.eu-west-1.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"] and query["Version"] == ["2011-06-15"]
    assert query["X-Amz-Credential"][0].startswith("AKIDEXAMPLE/")
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]
    assert query["X-Amz-Expires"] == ["60"]


def test_cordon_body_remembers_an_earlier_cordon():
    assert "sdc.guard/was-unschedulable" not in cordon_body("s", False)["metadata"]["annotations"]
    assert (
        cordon_body("s", True)["metadata"]["annotations"]["sdc.guard/was-unschedulable"] == "true"
    )


def test_suggested_actions_differ_by_alarm_type():
    weights = suggested_action("weights", "weights_minority")
    assert "last_weight_check_pass" in weights
    assert suggested_action("compute", "nonfinite") != suggested_action("compute", "persistent")


def test_approval_message_carries_the_commands():
    ev = {
        "node_name": "hyperpod-i-1",
        "instance_id": "i-1",
        "instance_group": "g",
        "cluster": "c",
        "alarm": "a",
        "alarm_time": "t",
        "job": "j",
        "check": "compute",
        "step": 9,
        "verdict": "persistent",
        "suspect_window": [1, 9],
        "last_audit_pass": 1,
        "last_weight_check_pass": 0,
        "ranks": {"3": {"gpu_uuid": "GPU-x", "local_rank": 3}},
        "health_check": None,
        "previous_remediations": [],
        "suggested_action": "do it",
    }
    subject, body = approval_message("a-42", ev, "sdc-remediation --approvals-table T")
    assert len(subject) <= 100 and "\n" not in subject
    assert "sdc-remediation --approvals-table T approve a-42" in body
    assert "sdc-remediation --approvals-table T reject a-42" in body


def test_every_error_named_in_the_contract_exists_and_derives_from_remediation_error():
    # Given the error names docs/CONTRACT.md fixes (the workflow's retries/catches match on them)
    text = CONTRACT.read_text()
    section = text[text.index("## Errors") : text.index("## Operator CLI")]
    names = set(re.findall(r"`([A-Z][A-Za-z]+)`", section))

    # Then every one is a class of that exact name in errors.py
    assert {
        "ClusterApiUnavailable",
        "InstanceNotInCluster",
        "ApprovalExpired",
        "RemediationError",
    } <= names
    for name in names:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.RemediationError) and cls.__name__ == name
    assert {c.__name__ for c in errors.TRANSIENT} == {
        "ClusterApiUnavailable",
        "AwsApiUnavailable",
        "ReportNotYetVisible",
    }


def test_clients_follow_the_standard_aws_configuration(monkeypatch):
    # Given the variables a harness or a VPC-endpoint setup uses (and only AWS_REGION, as some set)
    from sdc_remediation import aws

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SNS", "http://127.0.0.1:9999")
    aws.reset_clients()
    try:
        # When / Then: lazily built clients honour them
        assert aws.client("dynamodb").meta.endpoint_url == "http://127.0.0.1:4566"
        assert aws.client("sns").meta.endpoint_url == "http://127.0.0.1:9999"
        assert aws.client("sts").meta.region_name == "eu-west-1"
    finally:
        aws.reset_clients()
