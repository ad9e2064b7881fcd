"""Every error the agent raises on purpose has one base, ``sdc_agent.SdcAgentError``, and keeps
the built-in base users already catch (issue 33: the agent's exceptions had unrelated bases)."""

from __future__ import annotations

import pytest

import sdc_agent as sdc
from sdc_agent.integrations.hooks import AlarmStop
from sdc_agent.publish.settings import PublishConfigError
from sdc_agent.publish.spool import DeliveryFailed
from sdc_agent.publish.transport import LogEventRejected
from sdc_agent.topology import validate_placement

ERRORS = [
    (sdc.TopologyError, ValueError),
    (sdc.ShardingLayoutError, ValueError),
    (PublishConfigError, ValueError),
    (sdc.AuditSetupError, RuntimeError),
    (sdc.UnsafeResumeError, RuntimeError),
    (AlarmStop, RuntimeError),
    (DeliveryFailed, Exception),
    (LogEventRejected, Exception),
]


@pytest.mark.parametrize(("error", "builtin"), ERRORS, ids=[e.__name__ for e, _ in ERRORS])
def test_each_agent_error_is_an_sdc_agent_error_and_keeps_its_builtin_base(error, builtin):
    assert issubclass(error, sdc.SdcAgentError) and issubclass(error, builtin)


def test_one_except_clause_catches_a_raised_agent_error():
    # Given a placement on two nodes (the audit needs three)
    with pytest.raises(sdc.SdcAgentError, match="node name"):
        validate_placement(["a", "a", "b", "b"], 2)
    # And code written before the common base still catches it as a ValueError
    with pytest.raises(ValueError):
        validate_placement(["a", "a", "b", "b"], 2)


def test_every_exported_error_has_the_base():
    exported = [getattr(sdc, n) for n in sdc.__all__ if n.endswith("Error")]
    assert sdc.AlarmLogError in exported  # the contract's, shared with the Lambdas
    assert all(issubclass(e, sdc.SdcAgentError) for e in exported)
    assert issubclass(sdc.AlarmLogError, ValueError)
