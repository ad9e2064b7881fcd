"""The auto-approval policy: off by default, validated naming the field (context key
`autoApprove`, AUTO_APPROVE), and its rules as a pure function."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, load_config
from sdc_contract.autoapprove import AutoApprovePolicy, parse_policy
from sdc_remediation.logic.autoapprove import Precision, evaluate

REQUIRED = {"hyperPodClusterName": "hp", "eksClusterName": "eks"}


def test_the_policy_is_off_unless_configured():
    config = load_config(REQUIRED)
    assert config.auto_approve == AutoApprovePolicy() and not config.auto_approve.enabled
    decision = evaluate(
        config.auto_approve, check="compute", verdict="persistent", health_status="failed",
        precision=Precision(100, 0, 0.96, 1.0),
    )  # fmt: skip
    assert decision.approve is False


def test_context_key_errors_name_the_key_and_the_field():
    for bad, problem in (
        ({"minPrecision": 0}, "minPrecision must be a number in (0, 1]"),
        ({"minEvents": 0, "minPrecision": 0.9}, "minEvents must be an integer >= 1"),
        ({"onHealthCheckFailed": "yes"}, "onHealthCheckFailed must be true or false"),
        ({"threshold": 0.9}, "unknown field(s) ['threshold']"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config({**REQUIRED, "autoApprove": bad})
        assert "'autoApprove' (SDC_AUTO_APPROVE)" in str(err.value)
        assert problem in str(err.value)


def test_the_precision_rule_needs_enough_events_and_the_threshold():
    policy = parse_policy('{"minPrecision": 0.9, "minEvents": 10}')

    def decide(right: int, wrong: int) -> bool:
        return evaluate(
            policy, check="weights", verdict="weights_minority", health_status="passed",
            precision=Precision(right, wrong, None, None),
        ).approve  # fmt: skip

    assert decide(9, 1) is True  # 0.9 over 10: at the threshold
    assert decide(8, 1) is False  # 9 events: too few
    assert decide(17, 3) is False  # 0.85: below
