"""Settings: defaults from docs/CONTRACT.md, and errors that name the variable."""

from __future__ import annotations

import pytest

from sdc_remediation.config import Settings
from sdc_remediation.errors import ConfigurationError


def test_defaults_match_the_contract():
    # Given only the required names
    s = Settings({"HYPERPOD_CLUSTER_NAME": "hp"})

    # Then
    assert s.metric_namespace == "SDC"
    assert s.report_log_group == "/sdc/hp"
    assert s.lookback_seconds == 600
    assert s.max_nodes_per_hour == 2
    assert s.max_fraction == 0.05
    assert s.health_checks == ["InstanceStress"]
    assert s.health_check_timeout_seconds == 9000
    assert s.replace_mode == "api"
    assert s.approval_ttl_seconds > 86400
    assert s.dry_run is False
    assert s.k8s_api_endpoint is None and s.k8s_api_ca_data is None


def test_nothing_is_read_until_used():
    # Given an empty environment, building the settings is fine
    s = Settings({})

    # When a required value is used, the error names it
    with pytest.raises(ConfigurationError, match="LEDGER_TABLE"):
        _ = s.ledger_table


@pytest.mark.parametrize(
    ("env", "attribute", "match"),
    [
        (
            {"MAX_NODES_PER_HOUR": "two"},
            "max_nodes_per_hour",
            "MAX_NODES_PER_HOUR must be an integer",
        ),
        ({"MAX_NODES_PER_HOUR": "0"}, "max_nodes_per_hour", "MAX_NODES_PER_HOUR must be >= 1"),
        ({"MAX_FRACTION": "1.5"}, "max_fraction", r"MAX_FRACTION must be in \(0, 1\]"),
        ({"MAX_FRACTION": "lots"}, "max_fraction", "MAX_FRACTION must be a number"),
        ({"HEALTH_CHECKS": "InstanceStress,Vibes"}, "health_checks", "HEALTH_CHECKS must be"),
        ({"REPLACE_MODE": "nuke"}, "replace_mode", "REPLACE_MODE must be 'api' or 'label'"),
        ({"DRY_RUN": "maybe"}, "dry_run", "DRY_RUN must be 'true' or 'false'"),
        ({"TOPIC_ARN": "my-topic"}, "topic_arn", "TOPIC_ARN must be an SNS topic ARN"),
        (
            {"K8S_API_ENDPOINT": "http://10.0.0.1"},
            "k8s_api_endpoint",
            "K8S_API_ENDPOINT must be an https",
        ),
        ({}, "eks_cluster_name", "EKS_CLUSTER_NAME is required"),
    ],
)
def test_invalid_values_name_the_variable(env, attribute, match):
    # Given a bad value / When it is read / Then the error says which variable and why
    with pytest.raises(ConfigurationError, match=match):
        getattr(Settings(env), attribute)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("", False)],
)
def test_dry_run_spellings(raw, expected):
    assert Settings({"DRY_RUN": raw}).dry_run is expected


def test_health_checks_list_is_parsed_in_order():
    s = Settings({"HEALTH_CHECKS": " InstanceConnectivity , InstanceStress "})
    assert s.health_checks == ["InstanceConnectivity", "InstanceStress"]


def test_the_approval_timeout_is_read_as_itself():
    # Given infra's variables for a 2 h wait (the record lives a day longer)
    s = Settings({"APPROVAL_TIMEOUT_SECONDS": "7200", "APPROVAL_TTL_SECONDS": str(7200 + 86400)})
    # Then the timeout is the variable, not a difference of two others
    assert s.approval_timeout_seconds == 7200
    # And a timeout longer than the record's life is a clear error naming both
    with pytest.raises(ConfigurationError, match="APPROVAL_TIMEOUT_SECONDS"):
        _ = Settings(
            {"APPROVAL_TIMEOUT_SECONDS": "90000", "APPROVAL_TTL_SECONDS": "3600"}
        ).approval_timeout_seconds


def test_every_variable_infra_sets_is_one_the_functions_read():
    # Given the contract module's list (infra sets exactly these: tests/infra)
    import inspect

    import sdc_contract as contract
    from sdc_remediation import config

    source = inspect.getsource(config)
    # Then the settings read each of them by the contract's name, and spell none of them again
    named = {value: attr for attr, value in vars(contract).items() if attr == value}
    assert set(contract.FUNCTION_ENVIRONMENT) <= named.keys()
    assert [n for n in contract.FUNCTION_ENVIRONMENT if f"contract.{named[n]}" not in source] == []
    assert [n for n in named if f'"{n}"' in source] == []
