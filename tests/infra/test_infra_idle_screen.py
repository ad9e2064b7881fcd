"""Screening idle and standby nodes in the synthesized stack: the idle screener exists only
with `screenImage` and a schedule; its function's settings and least privilege, its schedule,
the idle screen's SDC alarm on the stack's one rule, its Kubernetes group and RBAC, the
dashboard's screens row, and the context keys validated by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import sdc_contract as contract
from infra.app import synthesize_template
from infra.config import ConfigError, load_config
from infra.constructs.eks_access import STEP_GROUPS
from tests.infra.infra_synth import Synth, synthesize
from tests.infra.infra_template import (
    as_list,
    evaluate_for,
    flatten,
    function_ids,
    resources,
    role_statements,
)

CLUSTER = "example-hyperpod-cluster"
PREFIX = f"sdc-guard-{CLUSTER}"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/training:2026-12-01"
ALARM_NAME = f"{PREFIX}-{contract.IDLE_SCREEN_ALARM_SUFFIX}"
IDLE_CONTEXT: dict[str, Any] = {
    "screenImage": IMAGE,
    "screenNamespace": "gpu-screens",
    "screenDeadlineSeconds": "40m",
    "screenIdleSchedule": "cron(0 */2 * * ? *)",
    "screenRescreenDays": 14,
    "screenIdleMaxNodes": 3,
}
RBAC = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "idle-screen-rbac.yaml"
BASE = {"hyperPodClusterName": "a", "eksClusterName": "b"}


@pytest.fixture(scope="module")
def idle_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with the screen image and idle-screen settings of IDLE_CONTEXT."""
    return synthesize(tmp_path_factory, "idle-screen", IDLE_CONTEXT)


def _function(template: dict[str, Any]) -> dict[str, Any]:
    return template["Resources"][function_ids(template)["screen_idle"]]["Properties"]


def _statements(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    role = _function(template)["Role"]["Fn::GetAtt"][0]
    return {s["Sid"]: s for s in role_statements(template, role) if "Sid" in s}


def _idle_schedules(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        s["Properties"]
        for s in resources(template, "AWS::Scheduler::Schedule").values()
        if "idle" in s["Properties"]["Description"]
    ]


def _alarm_names(template: dict[str, Any]) -> list[str]:
    return [
        a["Properties"]["AlarmName"] for a in resources(template, "AWS::CloudWatch::Alarm").values()
    ]


def _dashboard_body(template: dict[str, Any]) -> str:
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    return flatten(dashboard["Properties"]["DashboardBody"])


def _assert_no_idle_screener(template: dict[str, Any]) -> None:
    assert "screen_idle" not in function_ids(template)
    assert not _idle_schedules(template)
    assert ALARM_NAME not in _alarm_names(template)
    groups = [
        g
        for e in resources(template, "AWS::EKS::AccessEntry").values()
        for g in e["Properties"]["KubernetesGroups"]
    ]
    assert "sdc-idle-screener" not in groups
    assert "IdleScreenCommand" not in template["Outputs"]
    assert "idle-screen-rbac.yaml" not in template["Outputs"]["KubernetesRbacCommand"]["Value"]
    assert contract.NODES_UNSCREENED_METRIC not in _dashboard_body(template)
    assert "IdleScreen" not in json.dumps(template)  # no grant, no Sid, no construct


# ---- without it ----------------------------------------------------------------------------


@pytest.mark.slow
def test_without_a_screen_image_there_is_no_idle_screener(default_synth: Synth) -> None:
    # Given the stack as cdk.json ships it (no screenImage; the default schedule applies)
    template = default_synth.template
    # Then no screener function, schedule, alarm, access entry, output or dashboard row
    _assert_no_idle_screener(template)
    # And the RBAC command binds the main groups only: no screening namespace is created
    command = template["Outputs"]["KubernetesRbacCommand"]["Value"]
    assert command == (
        "kubectl apply -n default -f infra/k8s/rbac.yaml -f infra/k8s/admission-policy.yaml"
    )


@pytest.mark.slow
def test_schedule_off_removes_the_idle_screener_but_keeps_the_screen_step() -> None:
    # Given a screen image and `screenIdleSchedule: off`
    template = synthesize_template({"screenImage": IMAGE, "screenIdleSchedule": "off"})
    # Then there is no idle screener at all
    _assert_no_idle_screener(template)
    # But the workflow's Screen step keeps its image, and its RBAC is still applied
    screen = template["Resources"][function_ids(template)["screen"]]["Properties"]
    assert screen["Environment"]["Variables"][contract.SCREEN_IMAGE] == IMAGE
    assert "infra/k8s/screen-rbac.yaml" in template["Outputs"]["KubernetesRbacCommand"]["Value"]


# ---- with it -------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_stack_with_an_idle_screener_passes_cdk_nag(idle_synth: Synth) -> None:
    assert idle_synth.nag_error is None, idle_synth.nag_error


@pytest.mark.slow
def test_the_screener_gets_the_screen_settings_and_its_own(idle_synth: Synth) -> None:
    # Given the idle screener's function
    function = _function(idle_synth.template)
    env = function["Environment"]["Variables"]
    # Then it reads the screen Job's settings, the rescreen age and the bound on screens
    assert env[contract.SCREEN_IMAGE] == IMAGE
    assert env[contract.SCREEN_NAMESPACE] == "gpu-screens"
    assert env[contract.SCREEN_DEADLINE_SECONDS] == str(40 * 60)
    assert env[contract.SCREEN_RESCREEN_DAYS] == "14"
    assert env[contract.SCREEN_IDLE_MAX_NODES] == "3"
    # ... beside the common environment (the report group, the alarm prefix localize accepts)
    assert env[contract.REPORT_LOG_GROUP] == f"/sdc/{CLUSTER}"
    assert env[contract.ALARM_NAME_PREFIX] == f"{PREFIX}-"
    assert function["Handler"] == "screen_idle.handler.handler"
    # And the workflow's Screen step is not given the screener's own settings
    screen = idle_synth.template["Resources"][function_ids(idle_synth.template)["screen"]]
    assert contract.SCREEN_RESCREEN_DAYS not in screen["Properties"]["Environment"]["Variables"]


@pytest.mark.slow
def test_the_schedule_runs_the_screener_with_the_configured_expression(idle_synth: Synth) -> None:
    # Given the idle screener's schedule
    template = idle_synth.template
    screener = function_ids(template)["screen_idle"]
    (schedule,) = _idle_schedules(template)
    # Then it runs on screenIdleSchedule, sending the `run` action to the screener
    assert schedule["ScheduleExpression"] == "cron(0 */2 * * ? *)"
    assert schedule["State"] == "ENABLED"
    assert flatten(schedule["Target"]["Arn"]) == f"<{screener}.Arn>"
    assert json.loads(schedule["Target"]["Input"]) == {"action": "run"}
    # ... through a role that may invoke that function and nothing else
    statements = role_statements(template, schedule["Target"]["RoleArn"]["Fn::GetAtt"][0])
    assert {a for s in statements for a in as_list(s["Action"])} == {"lambda:InvokeFunction"}
    invoked = {flatten(r) for s in statements for r in as_list(s["Resource"])}
    assert invoked == {f"<{screener}.Arn>", f"<{screener}.Arn>:*"}


@pytest.mark.slow
def test_the_default_schedule_is_the_contracts() -> None:
    template = synthesize_template({"screenImage": IMAGE})
    (schedule,) = _idle_schedules(template)
    assert schedule["ScheduleExpression"] == contract.DEFAULT_SCREEN_IDLE_SCHEDULE


@pytest.mark.slow
def test_the_idle_screen_alarm_takes_the_stacks_one_rule(idle_synth: Synth) -> None:
    # Given the idle screen's alarm
    template = idle_synth.template
    ((alarm_id, alarm),) = [
        (k, a["Properties"])
        for k, a in resources(template, "AWS::CloudWatch::Alarm").items()
        if a["Properties"]["AlarmName"] == ALARM_NAME
    ]
    # Then it is a per-job alarm on the idle-screen job's contributor only, in the screener's
    # own namespace, with no action of its own
    (query,) = alarm["Metrics"]
    assert query["Expression"] == contract.job_alarm_query(
        "SDC/Screen", contract.IDLE_SCREEN_METRIC, CLUSTER, only_job=contract.IDLE_SCREEN_JOB
    )
    assert 'FROM SCHEMA("SDC/Screen", ClusterName, JobName)' in query["Expression"]
    assert f"JobName = '{contract.IDLE_SCREEN_JOB}'" in query["Expression"]
    assert alarm["Threshold"] == 1 and alarm["TreatMissingData"] == "notBreaching"
    assert "AlarmActions" not in alarm
    # And its name carries the prefix localize accepts
    assert alarm["AlarmName"].startswith(f"{PREFIX}-")
    # And the one rule routes it beside the SDC alarms and the canary's
    (rule,) = resources(template, "AWS::Events::Rule").values()
    routed = [flatten(r) for r in rule["Properties"]["EventPattern"]["resources"]]
    assert f"<{alarm_id}.Arn>" in routed and len(routed) == 5


@pytest.mark.slow
def test_the_screener_has_least_privilege(idle_synth: Synth) -> None:
    # Given the screener's statements (besides its own log group and X-Ray)
    statements = _statements(idle_synth.template)
    # Then it reads and writes only the screens' items of the ledger
    screens = statements["NodeScreens"]
    assert set(screens["Action"]) == {
        "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"
    }  # fmt: skip
    assert screens["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [f"SCREEN#{CLUSTER}"]}
    }
    # ... writes its report into the report group, the idle-screen job's stream only
    report = {flatten(r) for r in statements["IdleScreenReport"]["Resource"]}
    assert {r.split(":log-group:")[1] for r in report} == {
        f"/sdc/{CLUSTER}", f"/sdc/{CLUSTER}:log-stream:{contract.IDLE_SCREEN_JOB}"
    }  # fmt: skip
    # ... puts metric data into its own namespace only (not the pods' SDC, not the canary's)
    datum = statements["IdleScreenDatum"]
    assert datum["Action"] == "cloudwatch:PutMetricData"
    assert datum["Condition"] == {"StringEquals": {"cloudwatch:namespace": "SDC/Screen"}}
    assert evaluate_for(
        list(statements.values()), "cloudwatch:PutMetricData", "*",
        {"cloudwatch:namespace": "SDC/Screen"},
    )  # fmt: skip
    for other in ("SDC", "SDC/Canary", contract.POWERTOOLS_METRICS_NAMESPACE):
        assert not evaluate_for(
            list(statements.values()), "cloudwatch:PutMetricData", "*",
            {"cloudwatch:namespace": other},
        )  # fmt: skip
    # ... finds its EKS cluster; and nothing else: no node API, workflow, approval or topic
    assert set(statements) == {
        "NodeScreens", "WriteLedgerKey", "IdleScreenReport", "IdleScreenDatum",
        "DescribeEksCluster",
    }  # fmt: skip
    actions = {a for s in statements.values() for a in as_list(s["Action"])}
    assert not [a for a in actions if a.split(":")[0] in ("sagemaker", "states", "sns", "lambda")]


@pytest.mark.slow
def test_the_screener_reaches_kubernetes_in_its_own_group(idle_synth: Synth) -> None:
    template = idle_synth.template
    role = _function(template)["Role"]["Fn::GetAtt"][0]
    (entry,) = [
        e["Properties"]
        for e in resources(template, "AWS::EKS::AccessEntry").values()
        if e["Properties"]["PrincipalArn"] == {"Fn::GetAtt": [role, "Arn"]}
    ]
    assert entry["KubernetesGroups"] == ["sdc-idle-screener"] == [STEP_GROUPS["screen_idle"]]
    assert entry["Type"] == "STANDARD"


@pytest.mark.slow
def test_operators_may_screen_a_node_by_hand_and_pods_may_not_raise_the_alarm(
    idle_synth: Synth,
) -> None:
    template = idle_synth.template
    screener = function_ids(template)["screen_idle"]
    policies = {
        k.split("Policy")[0]: p["Properties"]["PolicyDocument"]["Statement"]
        for k, p in resources(template, "AWS::IAM::ManagedPolicy").items()
    }
    operators = next(v for k, v in policies.items() if k.startswith("Operators"))
    agent = next(v for k, v in policies.items() if k.startswith("Agent"))
    # Then operators may invoke the screener (that function only)
    (by_hand,) = [s for s in operators if s.get("Sid") == "ScreenANodeByHand"]
    assert by_hand["Action"] == "lambda:InvokeFunction"
    assert flatten(by_hand["Resource"]) == f"<{screener}.Arn>"
    # And the output says how
    command = flatten(template["Outputs"]["IdleScreenCommand"]["Value"])
    assert command == f"sdc-remediation screen --function <{screener}> NODE"
    # And no training pod may put a datum into the namespace the idle screen's alarm reads
    assert not evaluate_for(
        agent, "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "SDC/Screen"}
    )


@pytest.mark.slow
def test_the_rbac_command_applies_the_screen_and_idle_screen_rbac(idle_synth: Synth) -> None:
    command = idle_synth.template["Outputs"]["KubernetesRbacCommand"]["Value"]
    steps = command.split(" && ")
    assert steps == [
        "kubectl apply -n default -f infra/k8s/rbac.yaml -f infra/k8s/admission-policy.yaml",
        "kubectl create namespace gpu-screens --dry-run=client -o yaml | kubectl apply -f -",
        "kubectl apply -n gpu-screens -f infra/k8s/screen-rbac.yaml "
        "-f infra/k8s/idle-screen-rbac.yaml",
    ]


@pytest.mark.slow
def test_the_dashboard_shows_the_screens_and_the_nodes_unscreened(idle_synth: Synth) -> None:
    body = json.loads(_dashboard_body(idle_synth.template))
    widgets = {w["properties"].get("title", ""): w for w in body["widgets"]}
    # Then a "Screens" graph searches every outcome the screener counts
    (screens,) = [w for t, w in widgets.items() if t.startswith("Screens")]
    (expression,) = [m[0]["expression"] for m in screens["properties"]["metrics"]]
    for name in contract.IDLE_SCREEN_METRICS:
        if name != contract.NODES_UNSCREENED_METRIC:
            assert f'MetricName="{name}"' in expression
    assert f'ClusterName="{CLUSTER}"' in expression
    assert contract.POWERTOOLS_METRICS_NAMESPACE in expression
    # And a single value (with its trend) shows the nodes unscreened within the rescreen age
    unscreened = widgets["Nodes not screened within 14 days"]
    assert unscreened["type"] == "metric"
    assert unscreened["properties"]["view"] == "singleValue"
    assert unscreened["properties"]["sparkline"] is True
    (metric,) = unscreened["properties"]["metrics"]
    assert metric[:2] == [contract.POWERTOOLS_METRICS_NAMESPACE, contract.NODES_UNSCREENED_METRIC]
    assert "ClusterName" in metric and CLUSTER in metric


# ---- RBAC ----------------------------------------------------------------------------------


def _rbac() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text(encoding="utf-8")) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    return {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_the_idle_screener_reads_nodes_and_pods_and_handles_jobs_in_the_screening_namespace() -> (
    None
):
    # Given the idle screener's RBAC file
    docs = _rbac()
    group = STEP_GROUPS["screen_idle"]
    assert set(docs) == {
        ("ClusterRole", group), ("ClusterRoleBinding", group),
        ("Role", group), ("RoleBinding", group),
    }  # fmt: skip
    # Then cluster-wide it reads nodes and pods, nothing else (no write, no subresource)
    assert _rules(docs["ClusterRole", group]) == {
        ("", "nodes"): {"get", "list"},
        ("", "pods"): {"get", "list"},
    }
    # And in the namespace `kubectl apply -n` places it in: the screen Jobs and their pods
    assert _rules(docs["Role", group]) == {
        ("batch", "jobs"): {"create", "get", "list", "delete"},
        ("", "pods"): {"get", "list"},
    }
    assert all("namespace" not in d["metadata"] for d in docs.values())
    # And each binding ties its role to the group, and only to it
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = docs[kind, group]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": group,
        }
        assert binding["subjects"] == [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
        ]


# ---- the context keys ----------------------------------------------------------------------


def test_the_idle_screen_keys_default_and_turn_off() -> None:
    # Given no idle-screen keys / Then the contract's defaults, and off without an image
    config = load_config(BASE)
    assert config.screen_idle_schedule == contract.DEFAULT_SCREEN_IDLE_SCHEDULE
    assert config.screen_rescreen_days == contract.DEFAULT_SCREEN_RESCREEN_DAYS
    assert config.screen_idle_max_nodes == contract.DEFAULT_SCREEN_IDLE_MAX_NODES
    assert not config.idle_screen_enabled
    # And with an image it is on, on the default schedule
    assert load_config({**BASE, "screenImage": IMAGE}).idle_screen_enabled
    # And an explicit null, `off` (context or environment) or false turns it off
    for off in (None, "off", "OFF", False):
        config = load_config({**BASE, "screenImage": IMAGE, "screenIdleSchedule": off})
        assert config.screen_idle_schedule is None and not config.idle_screen_enabled
    environ = {"SDC_SCREEN_IDLE_SCHEDULE": "off"}
    assert not load_config({**BASE, "screenImage": IMAGE}, environ).idle_screen_enabled
    # And rate and cron expressions are taken as written
    for expression in ("rate(1 hour)", "rate(5 minutes)", "rate(2 days)", "cron(0 3 * * ? *)"):
        assert load_config({**BASE, "screenIdleSchedule": expression}).screen_idle_schedule == (
            expression
        )


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("screenIdleSchedule", "every 30 minutes", "expected an EventBridge Scheduler expression"),
        ("screenIdleSchedule", "rate(2 minutes)", "at most one run every 5 minutes"),
        ("screenIdleSchedule", "rate(1 hours)", r"write rate\(1 hour\)"),
        ("screenIdleSchedule", "cron(0 3 * * ?)", "six fields"),
        ("screenIdleSchedule", "at(2027-01-01T00:00:00)", "one-time"),
        ("screenIdleSchedule", 30, "expected a schedule expression"),
        ("screenRescreenDays", 0, r"0 days is outside 1 \.\. 365"),
        ("screenRescreenDays", 366, "outside"),
        ("screenRescreenDays", "soon", "expected an integer"),
        ("screenIdleMaxNodes", 0, r"0 nodes is outside 1 \.\. 64"),
        ("screenIdleMaxNodes", 65, "outside"),
    ],
)
def test_bad_idle_screen_values_fail_naming_the_key(key: str, value: Any, problem: str) -> None:
    variable = {
        "screenIdleSchedule": "SDC_SCREEN_IDLE_SCHEDULE",
        "screenRescreenDays": "SDC_SCREEN_RESCREEN_DAYS",
        "screenIdleMaxNodes": "SDC_SCREEN_IDLE_MAX_NODES",
    }[key]
    with pytest.raises(ConfigError, match=rf"'{key}' \({variable}\): .*{problem}"):
        load_config({**BASE, key: value})
