"""Context key `autoApproveRequiresScreen` (issue 35): validated at synth with its name, off by
default, and passed to request_approval alone as AUTO_APPROVE_REQUIRES_SCREEN."""

from __future__ import annotations

from typing import Any

import pytest

import sdc_contract as contract
from infra.app import example_context
from infra.config import ConfigError, load_config
from infra.template import function_logical_ids
from tests.infra.infra_synth import Synth, synthesize

KEY = "autoApproveRequiresScreen"


def _environments(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each step folder's function environment."""
    resources = template["Resources"]
    return {
        folder: resources[logical_id]["Properties"]["Environment"]["Variables"]
        for folder, logical_id in function_logical_ids(template).items()
    }


def test_it_is_off_by_default() -> None:
    assert load_config(example_context(), {}).auto_approve_requires_screen is False


@pytest.mark.parametrize("value", [True, "true", "yes", "1"])
def test_it_is_read_from_the_context(value: Any) -> None:
    config = load_config({**example_context(), KEY: value}, {})
    assert config.auto_approve_requires_screen is True


def test_its_sdc_variable_overrides_the_context() -> None:
    config = load_config(
        {**example_context(), KEY: True}, {"SDC_AUTO_APPROVE_REQUIRES_SCREEN": "false"}
    )
    assert config.auto_approve_requires_screen is False


@pytest.mark.parametrize("value", ["maybe", "reproduced", 2, ["true"]])
def test_a_bad_value_is_refused_naming_the_key(value: Any) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"^context key '{KEY}' \(SDC_AUTO_APPROVE_REQUIRES_SCREEN\): expected true or false",
    ):
        load_config({**example_context(), KEY: value}, {})


@pytest.mark.slow
def test_request_approval_alone_gets_the_variable_false_by_default(default_synth: Synth) -> None:
    environments = _environments(default_synth.template)
    assert environments["request_approval"][contract.AUTO_APPROVE_REQUIRES_SCREEN] == "false"
    others = [
        folder
        for folder, env in environments.items()
        if folder != "request_approval" and contract.AUTO_APPROVE_REQUIRES_SCREEN in env
    ]
    assert others == []


@pytest.fixture(scope="module")
def requires_screen_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with an auto-approval policy that requires a reproduced screen."""
    return synthesize(
        tmp_path_factory,
        "auto-approve-screen",
        {"autoApprove": {"onHealthCheckFailed": True}, KEY: True},
    )


@pytest.mark.slow
def test_the_key_on_sets_it_true_beside_the_policy(requires_screen_synth: Synth) -> None:
    env = _environments(requires_screen_synth.template)["request_approval"]
    assert env[contract.AUTO_APPROVE_REQUIRES_SCREEN] == "true"
    assert (
        env[contract.AUTO_APPROVE]
        == '{"minEvents":20,"minPrecision":null,"onHealthCheckFailed":true}'
    )
    assert requires_screen_synth.nag_error is None, requires_screen_synth.nag_error
