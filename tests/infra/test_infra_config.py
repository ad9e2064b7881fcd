"""Configuration: cdk.json context and SDC_* overrides validated into SdcConfig."""

from __future__ import annotations

import re

import pytest

from infra.app import example_context
from infra.config import METRIC_NAMES, ConfigError, env_name, load_config


def test_shipped_cdk_json_gives_the_documented_defaults() -> None:
    # Given the context cdk.json ships with
    context = example_context()
    # When it is loaded without environment overrides
    config = load_config(context, {})
    # Then the defaults of docs/architecture.md hold, with obvious placeholder cluster names
    assert config.hyperpod_cluster_name.startswith("example-")
    assert config.eks_cluster_name.startswith("example-")
    assert config.namespace == "SDC"
    assert config.alarm_period_seconds == 60
    assert config.approval_timeout_seconds == 24 * 3600
    assert config.max_nodes_per_hour == 2
    assert config.max_fraction == 0.05
    assert config.health_checks == ("InstanceStress",)
    assert config.replace_mode == "api"
    assert config.dry_run is False
    assert config.report_log_group == "/sdc/example-hyperpod-cluster"
    assert config.training_namespace == "default"
    assert config.agent_identity == "shared" and config.report_streams == "job"
    assert config.pod_identity_namespace is None
    assert config.flood_threshold == 50 and config.flood_watch_fraction == 0.8
    # and the node screen is not configured (no image), in its namespace, with a 30 m deadline
    assert config.screen_image is None
    assert config.screen_namespace == "sdc-screen" and config.screen_deadline_seconds == 1800


def test_missing_cluster_name_names_the_key_and_how_to_set_it() -> None:
    # Given a context without the HyperPod cluster name
    context = {k: v for k, v in example_context().items() if k != "hyperPodClusterName"}
    # When it is loaded / Then the error names the key, its variable and the -c form
    with pytest.raises(
        ConfigError,
        match=r"'hyperPodClusterName' \(SDC_HYPER_POD_CLUSTER_NAME\) is required.*-c hyperPodClusterName=",
    ):
        load_config(context, {})


def test_environment_overrides_context() -> None:
    # Given context values and SDC_* variables for some of them
    environ = {
        "SDC_MAX_NODES_PER_HOUR": "5",
        "SDC_DRY_RUN": "true",
        "SDC_NOTIFICATION_EMAILS": "a@example.com, b@example.com",
        "SDC_APPROVAL_TIMEOUT": "90m",
    }
    # When loaded
    config = load_config(example_context(), environ)
    # Then the environment wins, parsed to the field's type
    assert config.max_nodes_per_hour == 5
    assert config.dry_run is True
    assert config.notification_emails == ("a@example.com", "b@example.com")
    assert config.approval_timeout_seconds == 90 * 60


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(600, 600), ("600", 600), ("45s", 45), ("10m", 600), ("24h", 86400), ("7d", 604800)],
)
def test_durations_accept_seconds_or_a_unit(value: object, seconds: int) -> None:
    # Given a poll interval written as a number or with a unit / When loaded / Then seconds
    config = load_config(
        {**example_context(), "healthCheckPollInterval": value, "healthCheckTimeout": "8d"}, {}
    )
    assert config.health_check_poll_seconds == seconds


def test_partial_thresholds_keep_the_default_for_the_others() -> None:
    # Given thresholds for one metric only
    config = load_config({**example_context(), "alarmThresholds": {"sdc_replay_mismatch": 3}}, {})
    # Then that one changes and the others stay at 1
    assert config.alarm_thresholds == {
        **dict.fromkeys(METRIC_NAMES, 1.0),
        "sdc_replay_mismatch": 3.0,
    }


@pytest.mark.parametrize(
    ("key", "value", "message", "named"),
    [
        (
            "hyperPodClusterName",
            "bad_name!",
            "not a valid HyperPod cluster name",
            "hyperPodClusterName",
        ),
        (
            "hyperPodClusterArn",
            "arn:aws:sagemaker:us-west-2:123456789012:cluster/my-cluster",
            "not a HyperPod cluster ARN",
            "hyperPodClusterArn",
        ),
        ("alarmPeriod", "15s", "whole minutes", "alarmPeriod"),
        ("alarmPeriod", "10s", "10 s and 30 s are no longer possible", "alarmPeriod"),
        ("alarmThresholds", {"sdc_typo": 1}, "unknown metric", "alarmThresholds"),
        ("approvalTimeout", "10s", "outside 1 minute", "approvalTimeout"),
        ("approvalTimeout", "one day", "expected seconds or a duration", "approvalTimeout"),
        ("healthChecks", ["InstanceStress", "Burn"], "unknown check", "healthChecks"),
        ("maxNodesPerHour", 0, "at least 1", "maxNodesPerHour"),
        ("maxNodesPerHour", "two", "expected an integer", "maxNodesPerHour"),
        ("maxFraction", 1.5, "outside (0, 1]", "maxFraction"),
        ("replaceMode", "reboot", "expected one of", "replaceMode"),
        ("notificationEmails", ["not-an-address"], "not an email address", "notificationEmails"),
        ("dryRun", "maybe", "expected true or false", "dryRun"),
        ("subnetIds", ["subnet-0123456789abcdef0"], "required when subnetIds", "vpcId"),
        ("vpcId", "vpc-0123456789abcdef0", "required when vpcId", "subnetIds"),
        ("logRetentionDays", 10, "CloudWatch Logs accepts", "logRetentionDays"),
        ("livenessWindow", "90s", "between 5 minutes and 1 day", "livenessWindow"),
        ("trainingNamespace", "Team_A", "not a Kubernetes namespace name", "trainingNamespace"),
        ("floodThreshold", 1, "at least 2", "floodThreshold"),
        ("floodThreshold", "x", "expected an integer", "floodThreshold"),
        ("floodWatchFraction", 0, "outside (0, 1]", "floodWatchFraction"),
        ("floodWatchFraction", 1.5, "outside (0, 1]", "floodWatchFraction"),
        ("floodWatchFraction", "nan", "outside (0, 1]", "floodWatchFraction"),
        ("floodWatchFraction", "most", "expected a number", "floodWatchFraction"),
        ("agentIdentity", "irsa", "expected one of ['shared', 'pod-identity']", "agentIdentity"),
        ("screenImage", "my image:latest", "not a container image reference", "screenImage"),
        ("screenNamespace", "Screen_NS", "not a Kubernetes namespace name", "screenNamespace"),
        ("screenDeadlineSeconds", "30s", "outside 120 s .. 21600 s", "screenDeadlineSeconds"),
        ("screenDeadlineSeconds", "7h", "outside 120 s .. 21600 s", "screenDeadlineSeconds"),
        (
            "screenDeadlineSeconds",
            "soon",
            "expected seconds or a duration",
            "screenDeadlineSeconds",
        ),
        (
            "trainingNamespace",
            "../kube-system",
            "not a Kubernetes namespace name",
            "trainingNamespace",
        ),
    ],
)
def test_invalid_values_are_rejected_naming_the_key(
    key: str, value: object, message: str, named: str
) -> None:
    # Given one bad value (for cross-key rules the error names the key that must change)
    # When loaded / Then the error names the key and states the problem
    with pytest.raises(
        ConfigError, match=rf"^context key '{named}' \(SDC_\w+\): .*{re.escape(message)}"
    ):
        load_config({**example_context(), key: value}, {})


def test_a_screen_image_is_taken_as_given() -> None:
    # Given an ECR image with a digest
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/train@sha256:" + "a" * 64
    # When loaded (from the context, then from its SDC_ variable)
    config = load_config({**example_context(), "screenImage": image}, {})
    overridden = load_config(example_context(), {"SDC_SCREEN_IMAGE": image})
    # Then
    assert config.screen_image == image and overridden.screen_image == image


def test_env_name_maps_camel_case_to_upper_snake() -> None:
    # Given a context key / Then its override variable is SDC_ + UPPER_SNAKE
    assert env_name("maxNodesPerHour") == "SDC_MAX_NODES_PER_HOUR"
    assert env_name("hyperPodClusterArn") == "SDC_HYPER_POD_CLUSTER_ARN"
