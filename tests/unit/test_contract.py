"""The contract (sdc_contract): standard library only, Python 3.10, one source that the agent,
the Lambdas and infra all read the crossing names from."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import sdc_contract
from sdc_contract import report
from sdc_contract.modes import mode_for, parse_modes

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "agent" / "contract"
MODULES = sorted(m.name for m in pkgutil.iter_modules(sdc_contract.__path__))


def test_importing_the_contract_needs_only_the_standard_library():
    # Given a Python without site-packages (-S) or user paths (-I), only the contract's folder
    code = (
        "import importlib, sys, sysconfig\n"
        f"sys.path.insert(0, {str(CONTRACT)!r})\n"
        f"for name in {['sdc_contract', *(f'sdc_contract.{m}' for m in MODULES)]!r}:\n"
        "    importlib.import_module(name)\n"
        "stdlib = sysconfig.get_paths()['stdlib']\n"
        "print('\\n'.join(sorted(\n"
        "    name for name, module in list(sys.modules.items())\n"
        "    if getattr(module, '__file__', None)\n"
        "    and not module.__file__.startswith((stdlib, " + repr(str(CONTRACT)) + "))\n"
        ")))\n"
    )
    # When every module of it is imported
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, check=False
    )
    # Then that works, and nothing outside the standard library and the contract was loaded
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("module", MODULES)
def test_the_contract_parses_as_python_3_10(module):
    # The agent's floor is Python 3.10 (agent/pyproject.toml): no newer syntax in the contract
    source = (CONTRACT / "sdc_contract" / f"{module}.py").read_text()
    ast.parse(source, feature_version=(3, 10))
    # nor names the 3.10 standard library lacks
    assert "datetime.UTC" not in source and "from datetime import UTC" not in source
    assert "typing.Self" not in source and "import tomllib" not in source


def test_verdict_names_outside_the_list_read_unknown():
    assert report.verdict_name("persistent") == "persistent"
    assert report.verdict_name("weights_minority") == "weights_minority"
    assert report.verdict_name("flaky_interconnect") == "unknown"
    assert report.verdict_name("Persistent\nBcc: x") == "unknown"
    assert report.verdict_name(None) == "unknown"
    # And the suspect verdicts are the confirmation kinds, the naming reasons and unknown
    assert set(report.SUSPECT_VERDICTS) == {
        *report.VERDICT_KINDS,
        *report.NAMING_REASONS,
        report.UNKNOWN_VERDICT,
    }
    assert typing.get_args(report.SuspectVerdict) == report.SUSPECT_VERDICTS


def test_modes_look_a_newer_verdict_up_as_unknown_and_refuse_keys_that_never_match():
    table = parse_modes({"compute/unknown": "shadow", "weights/*": "shadow"})
    assert mode_for(table, "compute", "flaky_interconnect") == "shadow"
    assert mode_for(table, "compute", "persistent") == "enforce"
    assert mode_for(table, "weights", "anything") == "shadow"
    with pytest.raises(ValueError, match="'compute/flaky' is not '<check>/<verdict>'"):
        parse_modes(json.dumps({"compute/flaky": "shadow"}))


def test_the_agents_report_has_exactly_the_contracts_keys():
    # Given an alarm as the agent builds it, and its report as the publisher writes it
    from sdc_agent.alarm import Alarm, RankInfo, Verdict
    from sdc_agent.publish.events import report_event

    alarm = Alarm(
        step=7,
        check="compute",
        mismatched_pairs=[(1, 2)],
        verdicts=[Verdict(pair=(1, 2), third=3, suspect=1, kind="persistent")],
        suspects=[1],
        suspect_window=(5, 7),
        ranks={"1": RankInfo(1, "hyperpod-i-0123456789abcdef0", "i-0123456789abcdef0", "G", 1)},
    )
    body = report_event(alarm, "c", "j", "2026-01-01T00:00:00.000Z")
    # Then its keys, its rank entries' keys and its verdict entries' keys are the contract's
    assert set(body) == set(report.REPORT_KEYS)
    assert set(body["ranks"]["1"]) <= set(report.RANK_KEYS)
    assert set(body["verdicts"][0]) == set(report.VERDICT_ENTRY_KEYS)
    assert body["schema"] == report.ALARM_SCHEMA


def test_the_agent_names_checks_and_verdicts_from_the_contract():
    from sdc_agent import alarm

    assert alarm.CheckName is report.Check
    assert alarm.VerdictKind is report.VerdictKind
    assert alarm.SCHEMA == report.ALARM_SCHEMA


def test_the_lambdas_read_every_report_key_the_contract_lists():
    from sdc_remediation.models import Report

    read = {field.alias or name for name, field in Report.model_fields.items()}
    # The Lambdas read every key but the agent's free-text diagnosis and sensor details, and
    # the three the publisher adds are required there
    assert set(report.REPORT_KEYS) - read == {"diagnosis"}
    assert {"cluster", "job", "time"} <= read
    assert "canary_run" in read


def test_the_agents_package_still_exports_the_resume_names_from_the_same_rule():
    import sdc_agent
    from sdc_agent import recovery
    from sdc_contract import resume

    names = (
        "resume_rule",
        "ResumeRule",
        "clean_resume_step",
        "explain_resume",
        "ResumeDecision",
        "AlarmLogError",
        "UnsafeResumeError",
    )
    for name in names:
        assert getattr(sdc_agent, name) is getattr(recovery, name), name
        assert name in sdc_agent.__all__ and name in recovery.__all__, name
    assert recovery.resume_rule is resume.resume_rule
    assert recovery.AlarmLogError is resume.AlarmLogError


def test_every_check_of_the_contract_has_a_suggested_action_in_the_messages():
    from sdc_remediation.logic import notify

    # A check added to the contract must come with the action the approver is advised to take
    assert set(report.CHECKS) <= set(notify.SUGGESTED_ACTIONS)


def test_infra_and_the_functions_share_the_defaults():
    from infra.config import SdcConfig
    from sdc_remediation.config import Settings

    config = SdcConfig(hyperpod_cluster_name="hp", eks_cluster_name="eks")
    unset = Settings({})
    assert config.max_nodes_per_hour == unset.max_nodes_per_hour
    assert config.max_fraction == unset.max_fraction
    assert config.health_check_timeout_seconds == unset.health_check_timeout_seconds
    assert config.approval_ttl_seconds == unset.approval_ttl_seconds
    assert config.health_checks == tuple(unset.health_checks)
    assert config.replace_mode == unset.replace_mode
    assert config.training_namespace == unset.training_namespace
