"""The pipeline states the agent's resume rule, the same one: where a job may resume after an alarm
(docs/recovery.md), in the approval message, the transition notifications and the ledger.

The Lambdas cannot import the agent (it imports torch); both import the rule from the contract
(sdc_contract.resume), and these tests keep it one rule.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sdc_contract import resume as shipped
from sdc_remediation.logic import notify
from sdc_remediation.models import RecordInput, Suspect

REPO = Path(__file__).resolve().parents[2]
AGENT_RULE = REPO / "agent" / "src" / "sdc_agent" / "recovery.py"
INSTANCE = "i-0123456789abcdef0"


def _agent_recovery() -> Any:
    """The agent's recovery module, loaded by path (importing sdc_agent would import torch)."""
    spec = importlib.util.spec_from_file_location("sdc_agent_recovery_under_test", AGENT_RULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations there
    spec.loader.exec_module(module)
    return module


def _suspect(**fields: Any) -> Suspect:
    return Suspect.model_validate(
        {
            "node_name": f"hyperpod-{INSTANCE}",
            "instance_id": INSTANCE,
            "instance_group": "workers",
            "job": "llama",
            "ranks": {"3": {"gpu_uuid": "GPU-3", "local_rank": 3}},
            "verdict": "persistent",
            **fields,
        }
    )


# (suspect fields, the sdc.alarm/v1 report the agent wrote for that alarm)
CASES = [
    pytest.param(
        {"check": "compute", "step": 300, "suspect_window": [250, 300], "last_audit_pass": 250},
        {"nonfinite": []},
        id="compute-mismatch",
    ),
    pytest.param(
        {
            "check": "compute",
            "verdict": "nonfinite",
            "nonfinite_count": 1,
            "step": 300,
            "suspect_window": [299, 300],
            "last_audit_pass": 250,
            "last_weight_check_pass": 290,
        },
        {"nonfinite": [3]},
        id="compute-nonfinite-older-audit",
    ),
    pytest.param(
        {"check": "compute", "step": 40, "suspect_window": [31, 40]},
        {"nonfinite": []},
        id="compute-no-audit-passed-this-run",
    ),
    pytest.param(
        {
            "check": "weights",
            "verdict": "weights_minority",
            "step": 500,
            "suspect_window": [450, 500],
            "last_audit_pass": 480,
            "last_weight_check_pass": 450,
        },
        {"nonfinite": []},
        id="weights",
    ),
    pytest.param(
        {
            "check": "reduced_gradient",
            "verdict": "unknown",
            "step": 120,
            "suspect_window": [110, 120],
            "last_audit_pass": 100,
            "last_weight_check_pass": 110,
        },
        {"nonfinite": []},
        id="reduced-gradient-older-of-both-passes",
    ),
    pytest.param(
        {"check": "compute", "step": 1, "suspect_window": [0, 1]},
        {"nonfinite": []},
        id="first-step-no-clean-checkpoint",
    ),
    pytest.param(
        {"check": "compute", "step": 10, "suspect_window": [10, 10], "last_audit_pass": 10},
        {"nonfinite": []},
        id="window-of-one-step",
    ),
]


def test_the_agent_and_the_pipeline_share_one_rule_not_a_copy():
    # Given the agent's recovery module (loaded without torch) and what the pipeline calls
    agent = _agent_recovery()
    # Then the agent's rule is the contract's function itself, and no copy of it ships anywhere
    assert agent.resume_rule is shipped.resume_rule
    assert agent.ResumeRule is shipped.ResumeRule
    copies = [p for p in (REPO / "lambdas").rglob("*.py") if p.name in ("recovery.py", "resume.py")]
    assert copies == []


@pytest.mark.parametrize(("fields", "report_extra"), CASES)
def test_the_pipeline_states_what_the_agent_decides_for_the_same_alarm(fields, report_extra):
    # Given a suspect as the workflow carries it, and the report the agent wrote for that alarm
    suspect = _suspect(**fields)
    report = {
        key: fields.get(key)
        for key in ("check", "step", "suspect_window", "last_audit_pass", "last_weight_check_pass")
    } | report_extra

    # When the pipeline states its rule
    stated = notify.resume_rule_of(suspect)

    # Then it is exactly the agent's answer for that report
    assert tuple(stated) == tuple(_agent_recovery().resume_rule(report))
    assert isinstance(stated, shipped.ResumeRule)


def test_a_compute_alarm_no_longer_claims_the_weights_are_intact():
    # Given a persistent fault from step 250, caught by the audit at step 300
    suspect = _suspect(check="compute", step=300, suspect_window=[250, 300], last_audit_pass=250)
    ev = {
        "node_name": suspect.node_name,
        "instance_id": INSTANCE,
        "instance_group": "workers",
        "cluster": "c",
        "alarm": "a",
        "alarm_time": "t",
        "job": "llama",
        "check": "compute",
        "step": 300,
        "verdict": "persistent",
        "suspect_window": [250, 300],
        "last_audit_pass": 250,
        "last_weight_check_pass": 299,
        "ranks": {"3": {"gpu_uuid": "GPU-3", "local_rank": 3}},
        "health_check": None,
        "previous_remediations": [],
        "divergent_tensors": ["layers.0.w", "layers.1.w", "layers.2.w"],
        "divergent_tensor_count": 41,
        "report": "/sdc/c/llama-alarms",
        "resume": notify.resume_summary(suspect),
        "suggested_action": notify.suggested_action("compute", "persistent"),
    }

    # When the approval message is written
    _, body = notify.approval_message("a-1", ev, "sdc-remediation")

    # Then it gives the rule for this alarm and no false comfort
    assert "weights are intact" not in body
    assert "Resume rule: resume from the newest checkpoint at or before step 250 (" in body
    assert "never from a later checkpoint" in body
    # And the evidence says how many tensors diverged and where the full report is
    assert "41 tensor(s): layers.0.w, layers.1.w, layers.2.w and 38 more" in body
    assert "CloudWatch Logs /sdc/c/llama-alarms" in body


@pytest.mark.parametrize("check", ["compute", "weights", "reduced_gradient"])
@pytest.mark.parametrize("verdict", ["persistent", "transient", "nonfinite", "culprit"])
def test_no_suggested_action_says_the_model_is_intact(check, verdict):
    # A fault older than the alarm's step has reached every replica: no text may deny it
    text = notify.suggested_action(check, verdict)
    assert "intact" not in text and "resume rule" in text


@pytest.mark.parametrize("transition", ["replaced", "released", "approval_timed_out"])
def test_the_transition_notifications_state_the_resume_rule(transition):
    # Given a remediation of a weight-check alarm at step 500 (last pass at 450)
    suspect = _suspect(
        check="weights",
        verdict="weights_minority",
        step=500,
        suspect_window=[450, 500],
        last_weight_check_pass=450,
        report_log_group="/sdc/c",
        report_log_stream="llama-alarms",
    )
    inp = RecordInput.model_validate(
        {"transition": transition, "state": {"suspect": suspect.model_dump(by_alias=True)}}
    )

    # When it is notified
    _, body = notify.transition_message(inp, "c")

    # Then the message carries the rule and the report's place
    message = json.loads(body)
    assert message["resume"]["sentence"] == (
        "resume from the newest checkpoint at or before step 450"
    )
    assert message["resume"]["max_step"] == 450
    assert message["report"] == "/sdc/c/llama-alarms"
