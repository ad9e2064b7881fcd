"""The live canary in the synthesized stack: its schedule, its function's least privilege, its
SDC alarm on the stack's one rule, the not-completed alarm with its two actions, the context
keys, and `canarySchedule: off` removing all of it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sdc_contract as contract
from infra.app import synthesize_template
from infra.config import ConfigError, load_config
from tests.infra.infra_synth import Synth
from tests.infra.infra_template import as_list, flatten, function_ids, resources, role_statements

pytestmark = pytest.mark.slow

CLUSTER = "example-hyperpod-cluster"
PREFIX = f"sdc-guard-{CLUSTER}"


def _role_of(template: dict[str, Any], folder: str) -> str:
    return template["Resources"][function_ids(template)[folder]]["Properties"]["Role"][
        "Fn::GetAtt"
    ][0]


def _alarm(template: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (k, a["Properties"])
        for k, a in resources(template, "AWS::CloudWatch::Alarm").items()
        if a["Properties"]["AlarmName"] == name
    ]
    return found


def test_the_schedule_starts_the_canary_daily(default_synth: Synth) -> None:
    # Given the default stack
    template = default_synth.template
    canary_fn = function_ids(template)["canary"]
    (schedule,) = [
        s["Properties"]
        for s in resources(template, "AWS::Scheduler::Schedule").values()
        if "canary" in s["Properties"]["Description"]
    ]
    # Then the schedule invokes the canary function once a day with the start input
    assert schedule["ScheduleExpression"] == "rate(1 day)"
    assert schedule["State"] == "ENABLED"
    assert flatten(schedule["Target"]["Arn"]) == f"<{canary_fn}.Arn>"
    assert json.loads(schedule["Target"]["Input"]) == {"action": "start"}
    # ... through a role that may invoke that function and nothing else
    role = schedule["Target"]["RoleArn"]["Fn::GetAtt"][0]
    statements = role_statements(template, role)
    assert {a for s in statements for a in as_list(s["Action"])} == {"lambda:InvokeFunction"}
    targets = {flatten(r) for s in statements for r in as_list(s["Resource"])}
    assert targets == {f"<{canary_fn}.Arn>", f"<{canary_fn}.Arn>:*"}


def test_the_canary_function_has_least_privilege(default_synth: Synth) -> None:
    # Given the canary function's statements (besides its own log group and X-Ray)
    template = default_synth.template
    statements = {
        s["Sid"]: s for s in role_statements(template, _role_of(template, "canary")) if "Sid" in s
    }
    # Then it reads and writes only its runs' items of the ledger
    runs = statements["CanaryRuns"]
    assert set(runs["Action"]) == {
        "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"
    }  # fmt: skip
    assert runs["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [f"CANARY#{CLUSTER}"]}
    }
    # ... writes its report into the agent's group, in the canary job's stream only
    report = {flatten(r) for r in statements["CanaryReport"]["Resource"]}
    assert {r.split(":log-group:")[1] for r in report} == {
        f"/sdc/{CLUSTER}", f"/sdc/{CLUSTER}:log-stream:{contract.CANARY_JOB}"
    }  # fmt: skip
    # ... puts metrics in the canary's own namespace only (not the training pods' SDC)
    assert statements["CanaryDatum"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": "SDC/Canary"}
    }
    # ... reads its own alarm and lists this state machine's executions, nothing else of them
    assert flatten(statements["WhereTheCanaryStopped"]["Resource"]).endswith(
        f":alarm:{PREFIX}-{contract.CANARY_ALARM_SUFFIX}"
    )
    assert flatten(statements["CanaryExecutions"]["Resource"]).endswith(f":stateMachine:{PREFIX}")
    # And it can touch no node, cluster, approval or task token
    actions = {a for s in statements.values() for a in as_list(s["Action"])}
    assert not [a for a in actions if a.split(":")[0] in ("sagemaker", "eks", "lambda")]
    assert not [a for a in actions if a.startswith("states:") and a != "states:ListExecutions"]
    assert set(statements) == {
        "CanaryRuns", "CanaryReport", "CanaryDatum", "WhereTheCanaryStopped",
        "CanaryExecutions", "Notify", "EncryptNotifications",
        # the ledger's key, to write its runs (through DynamoDB only: test_infra_encryption)
        "WriteLedgerKey",
    }  # fmt: skip


def test_the_steps_write_canary_progress_only_on_canary_items(default_synth: Synth) -> None:
    template = default_synth.template
    for folder in ("localize", "admit", "record"):
        (progress,) = [
            s
            for s in role_statements(template, _role_of(template, folder))
            if s.get("Sid") == "CanaryProgress"
        ]
        assert set(progress["Action"]) == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
        assert progress["Condition"]["ForAllValues:StringEquals"] == {
            "dynamodb:LeadingKeys": [f"CANARY#{CLUSTER}"]
        }
    # And localize gains no other write: it still reads the ledger only through the canary's
    localize = role_statements(template, _role_of(template, "localize"))
    writes = [s for s in localize if any(a.startswith("dynamodb:") for a in as_list(s["Action"]))]
    assert [s["Sid"] for s in writes] == ["CanaryProgress"]


def test_the_canary_alarm_takes_the_stacks_one_rule(default_synth: Synth) -> None:
    template = default_synth.template
    alarm_id, alarm = _alarm(template, f"{PREFIX}-{contract.CANARY_ALARM_SUFFIX}")
    # Then it is a per-job alarm like an SDC alarm, on the canary job's contributor only, with
    # no action of its own
    (query,) = alarm["Metrics"]
    assert query["Expression"] == contract.job_alarm_query(
        "SDC/Canary", contract.CANARY_METRIC, CLUSTER, only_job=contract.CANARY_JOB
    )
    assert "AlarmActions" not in alarm
    # And the one rule routes it into the workflow beside the real alarms
    (rule,) = resources(template, "AWS::Events::Rule").values()
    routed = [flatten(r) for r in rule["Properties"]["EventPattern"]["resources"]]
    assert f"<{alarm_id}.Arn>" in routed and len(routed) == 4


def test_the_not_completed_alarm_notifies_and_asks_the_canary_where_it_stopped(
    default_synth: Synth,
) -> None:
    template = default_synth.template
    alarm_id, alarm = _alarm(template, f"{PREFIX}-canary-not-completed")
    canary_fn = function_ids(template)["canary"]
    # Then it fires when no canary_completed arrived in one day plus the canary timeout
    assert alarm["Namespace"] == contract.POWERTOOLS_METRICS_NAMESPACE
    assert alarm["MetricName"] == contract.CANARY_COMPLETED_METRIC
    assert alarm["Dimensions"] == [{"Name": "ClusterName", "Value": CLUSTER}]
    assert alarm["Period"] == 86400 + 3600
    assert alarm["ComparisonOperator"] == "LessThanThreshold" and alarm["Threshold"] == 1
    assert alarm["TreatMissingData"] == "breaching"
    # ... to the topic and to the canary function, which CloudWatch alarms may invoke
    (topic,) = resources(template, "AWS::SNS::Topic")
    assert [flatten(a) for a in alarm["AlarmActions"]] == [f"<{topic}>", f"<{canary_fn}.Arn>"]
    (permission,) = [
        p["Properties"]
        for p in resources(template, "AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "lambda.alarms.cloudwatch.amazonaws.com"
    ]
    assert flatten(permission["FunctionName"]) == f"<{canary_fn}.Arn>"
    assert flatten(permission["SourceArn"]) == f"<{alarm_id}.Arn>"


def test_the_canary_keys_are_validated_by_name() -> None:
    base = {"hyperPodClusterName": "a", "eksClusterName": "b"}
    # Given valid keys / Then the window is the period plus the timeout
    config = load_config({**base, "canarySchedule": "12h", "canaryTimeout": "30m"})
    assert config.canary_enabled and config.canary_window_seconds == 12 * 3600 + 1800
    assert not load_config({**base, "canarySchedule": "off"}).canary_enabled
    assert load_config({**base, "shadowHealthCheck": "true"}).shadow_health_check
    # And bad values fail naming the key and its variable
    with pytest.raises(ConfigError, match=r"'canarySchedule' \(SDC_CANARY_SCHEDULE\)"):
        load_config({**base, "canarySchedule": "10m"})
    with pytest.raises(ConfigError, match="'canaryTimeout'"):
        load_config({**base, "canaryTimeout": "2d"})


def test_canary_off_removes_it_and_its_grants() -> None:
    # Given the stack with `canarySchedule: off`
    template = synthesize_template({"canarySchedule": "off"})
    # Then no canary function, schedule or alarm, and only approve may send task results
    assert "canary" not in function_ids(template)
    names = [
        a["Properties"]["AlarmName"] for a in resources(template, "AWS::CloudWatch::Alarm").values()
    ]
    assert not [n for n in names if "canary" in n]
    assert len(resources(template, "AWS::Scheduler::Schedule")) == 1  # the sweeper's
    flat = json.dumps(template)
    assert "CanaryApproval" not in flat and "CanaryProgress" not in flat


def test_no_training_pod_can_put_a_datum_the_canary_alarm_reads(default_synth: Synth) -> None:
    # Given the agent's managed policy (what the training pods' role gets) and the canary alarm
    template = default_synth.template
    (policy,) = [
        p
        for logical_id, p in resources(template, "AWS::IAM::ManagedPolicy").items()
        if logical_id.startswith("Agent")
    ]
    puts = [
        s
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if "cloudwatch:PutMetricData" in as_list(s["Action"])
    ]
    _, alarm = _alarm(template, f"{PREFIX}-{contract.CANARY_ALARM_SUFFIX}")
    (query,) = alarm["Metrics"]
    # Then every PutMetricData the pods have is bound to namespaces by exact match, and the
    # canary alarm's namespace is none of them
    canary_namespace = contract.canary_namespace("SDC")
    assert f'SCHEMA("{canary_namespace}"' in query["Expression"]
    for statement in puts:
        assert set(statement["Condition"]) == {"StringEquals"}, statement
        allowed = as_list(statement["Condition"]["StringEquals"]["cloudwatch:namespace"])
        assert canary_namespace not in allowed and not any("*" in a for a in allowed)
