"""The settings the embedded chains give every in-process handler at once (Powertools reads them
from the process environment, which all handlers share): agreed on, or refused by name."""

from __future__ import annotations

import pytest

from tests.e2e.harness.runtime import shared_runtime_env


def test_functions_that_agree_share_their_powertools_settings_only():
    # Given two functions with the same Powertools settings and their own other variables
    environments = {
        "localize": {"LOG_LEVEL": "INFO", "POWERTOOLS_SERVICE_NAME": "sdc", "TABLE": "a"},
        "admit": {"LOG_LEVEL": "INFO", "POWERTOOLS_SERVICE_NAME": "sdc", "TABLE": "b"},
    }
    # When the shared settings are derived for a quiet chain
    shared = shared_runtime_env(environments, quiet=True)
    # Then only the Powertools settings are shared, with tracing and (quiet) metrics off
    assert shared == {
        "LOG_LEVEL": "INFO",
        "POWERTOOLS_SERVICE_NAME": "sdc",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_DISABLED": "true",
    }


def test_functions_that_disagree_on_a_shared_setting_are_refused_by_name():
    # Given two functions that log at different levels
    environments = {"localize": {"LOG_LEVEL": "INFO"}, "admit": {"LOG_LEVEL": "DEBUG"}}
    # When the shared settings are derived, then the variable and both functions are named
    with pytest.raises(ValueError, match=r"LOG_LEVEL; localize has 'INFO', admit 'DEBUG'"):
        shared_runtime_env(environments)
