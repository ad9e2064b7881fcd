"""`shadowHealthCheck` through the synthesized definition: a shadowed alarm runs the deep health
check (and its poll loop) before it is recorded, its verdict reaches the shadow message and the
ledger, and still nothing is cordoned, approved or replaced. Off by default (the shadow tests
of test_infra_workflow_shadow.py see no health-check step)."""

from __future__ import annotations

import json

import pytest

from sdc_remediation.dal.ledger import Ledger
from tests.infra.infra_synth import Synth, synthesize
from tests.infra.test_infra_workflow import EVENT, SUSPECT
from tests.infra.test_infra_workflow_shadow import LEDGER, _messages, _moto_account, _real_steps
from tests.infra.workflow_harness import finish, start, workflow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shadow_check_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with shadowHealthCheck on and a 1-second poll."""
    return synthesize(
        tmp_path_factory,
        "shadow-health",
        {"healthCheckPollInterval": "1s", "shadowHealthCheck": True},
    )


@pytest.fixture(autouse=True)
def region(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real steps create their clients from the environment (as in Lambda)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")


def test_shadow_runs_the_health_check_when_asked_and_still_touches_nothing(
    shadow_check_synth: Synth,
) -> None:
    # Given compute/persistent in shadow, and a health check that fails on its first poll
    handlers = _real_steps({"compute/persistent": "shadow"}, shadow_health_check=True)

    # When its alarm runs through the definition synthesized with shadowHealthCheck
    with workflow(shadow_check_synth.template, handlers) as (sfn, machine, run):
        _moto_account()
        result = finish(sfn, start(sfn, machine, EVENT, "shadow-health"))
        events = Ledger(LEDGER).events(SUSPECT["instance_id"])
        messages = _messages()

    # Then the health check was started and polled, and the alarm recorded as shadow
    assert result["status"] == "SUCCEEDED"
    assert len(run.inputs("start_health_check")) == 1
    assert len(run.inputs("poll_health_check")) == 1
    assert run.transitions() == ["shadow"]
    # ... nothing was cordoned, asked or replaced
    for folder in ("cordon", "request_approval", "replace", "uncordon"):
        assert run.inputs(folder) == [], folder
    # ... and the health check's verdict is in the message and in the ledger
    ((subject, body),) = messages
    assert "would have cordoned" in subject
    message = json.loads(body)
    assert message["health_check"].startswith("the deep health check ran in shadow: failed")
    assert message["evidence"]["health_check"]["status"] == "failed"
    (event,) = [e for e in events if e.get("transition") == "shadow"]
    assert json.loads(event["detail"])["health"]["status"] == "failed"
