"""Per check x verdict modes: the context key `checkModes` (infra) and CHECK_MODES (the
functions) accept one table, refuse a bad entry naming it, and resolve the most specific key."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, load_config
from sdc_contract.modes import mode_for, parse_modes
from sdc_remediation.config import Settings
from sdc_remediation.errors import ConfigurationError

REQUIRED = {"hyperPodClusterName": "hp", "eksClusterName": "eks"}


def test_the_most_specific_key_wins_and_unlisted_checks_are_enforced():
    # Given everything in shadow except compute, where only transient stays in shadow
    table = parse_modes({"*": "shadow", "compute/*": "enforce", "compute/transient": "shadow"})

    # Then
    assert mode_for(table, "compute", "transient") == "shadow"
    assert mode_for(table, "compute", "persistent") == "enforce"
    assert mode_for(table, "weights", "weights_minority") == "shadow"
    assert mode_for({}, "reduced_gradient", "named") == "enforce"


def test_context_key_is_validated_with_its_name():
    # Given/When a valid table: it reaches the functions as sorted JSON
    config = load_config({**REQUIRED, "checkModes": {"compute/culprit": "shadow"}})
    assert config.check_modes_json == '{"compute/culprit":"shadow"}'
    # And from the environment (JSON text)
    env = load_config(REQUIRED, {"SDC_CHECK_MODES": '{"*": "shadow"}'})
    assert dict(env.check_modes) == {"*": "shadow"}
    # Then bad entries fail naming the key, the environment variable and the entry
    for bad, problem in (
        ({"gpu/persistent": "shadow"}, "'gpu/persistent' is not '<check>/<verdict>'"),
        ({"compute/persistent": "observe"}, "mode must be one of enforce, shadow"),
        (["compute/persistent"], "expected an object"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config({**REQUIRED, "checkModes": bad})
        assert "'checkModes' (SDC_CHECK_MODES)" in str(err.value)
        assert problem in str(err.value)


def test_the_functions_refuse_a_bad_check_modes_variable_naming_it():
    assert Settings({"CHECK_MODES": ""}).mode_for("compute", "persistent") == "enforce"
    assert Settings({"CHECK_MODES": '{"weights/*": "shadow"}'}).mode_for("weights", "x") == "shadow"
    with pytest.raises(ConfigurationError, match="CHECK_MODES: invalid JSON"):
        Settings({"CHECK_MODES": "{shadow"}).mode_for("compute", "persistent")
