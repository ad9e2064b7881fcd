"""The synthesized stack: what a deployment will contain, checked on the template."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

import sdc_contract as contract
from infra.config import METRIC_NAMES
from infra.constructs.functions import SERVICES, STEPS
from infra.template import STEP_HANDLER_SUFFIX
from sdc_contract.environment import FLOOD_WATCH_FRACTION
from sdc_contract.metrics import job_alarm_query, job_count_query
from sdc_remediation import config as remediation_config
from tests.infra.infra_template import (
    all_states,
    as_list,
    definition,
    flatten,
    function_ids,
    item_states,
    matches,
    resources,
    role_statements,
)

pytestmark = pytest.mark.slow

CONTRACT_ENV = set(contract.FUNCTION_ENVIRONMENT) | {
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "LOG_LEVEL",
}


def test_cdk_nag_reports_no_unacknowledged_finding(default_synth: Any, variant_synth: Any) -> None:
    # Given the stack as shipped and with every option on, synthesized with AwsSolutionsChecks
    # Then neither synthesis failed validation
    assert default_synth.nag_error is None, default_synth.nag_error
    assert variant_synth.nag_error is None, variant_synth.nag_error


@pytest.mark.parametrize("which", ["default_synth", "variant_synth"])
def test_cfn_lint_is_clean(which: str, request: pytest.FixtureRequest) -> None:
    # Given a synthesized template written to disk
    synth = request.getfixturevalue(which)
    path = synth.outdir / "template-for-lint.json"
    path.write_text(json.dumps(synth.template), encoding="utf-8")
    # When cfn-lint checks it (W3005: CDK's explicit DependsOn duplicates, noise)
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "cfn-lint"),
            "--ignore-checks",
            "W3005",
            "--",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    # Then it reports nothing
    assert result.returncode == 0, result.stdout + result.stderr


def test_resource_counts(default_synth: Any) -> None:
    # Given the default stack / Then it holds exactly the pipeline's resources
    template = Template.from_json(default_synth.template)
    # steps + services + the canary (on by default) + CDK's provider of the deploy-time
    # cluster-ARN lookup (no hyperPodClusterArn in the default config)
    template.resource_count_is("AWS::Lambda::Function", 10 + len(SERVICES) + 1 + 1)
    template.resource_count_is("AWS::Lambda::LayerVersion", 1)
    template.resource_count_is("AWS::StepFunctions::StateMachine", 1)
    template.resource_count_is("AWS::Events::Rule", 1)
    template.resource_count_is("AWS::Scheduler::Schedule", 2)  # the sweeper's, the canary's
    template.resource_count_is("AWS::DynamoDB::Table", 2)
    template.resource_count_is("AWS::SNS::Topic", 1)
    template.resource_count_is("AWS::SQS::Queue", 1)
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    # 3 SDC alarms + their 3 flood alarms + workflow failures + undelivered events (no
    # liveness job configured) + the canary's SDC alarm and its not-completed alarm
    template.resource_count_is("AWS::CloudWatch::Alarm", 10)
    template.resource_count_is("AWS::IAM::ManagedPolicy", 2)  # operators, agent


def query_metric(alarm: dict[str, Any]) -> str | None:
    """The SDC metric a per-job alarm's Metrics Insights query sums (None: not such an alarm)."""
    for query in alarm.get("Metrics", []):
        expression = str(query.get("Expression", ""))
        for name in METRIC_NAMES:
            if expression.startswith(f"SELECT SUM({name}) "):
                return name
    return None


def sdc_alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        query_metric(alarm["Properties"]): alarm["Properties"]
        for alarm in resources(template, "AWS::CloudWatch::Alarm").values()
        if query_metric(alarm["Properties"])
        and "canary" not in alarm["Properties"]["AlarmName"]  # the canary's: test_infra_canary
    }


def test_one_per_job_alarm_per_sdc_metric(default_synth: Any) -> None:
    # Given the default stack
    alarms = sdc_alarms(default_synth.template)
    # Then each SDC metric has one Metrics Insights alarm summing the per-node series of each
    # job of this cluster (one contributor per job, the canary job left out), per minute,
    # missing data = healthy. (Superseded: one 10 s alarm on the {ClusterName} series, which
    # one job's data could hold in ALARM for every other job.)
    assert set(alarms) == set(METRIC_NAMES)
    for name, alarm in alarms.items():
        (query,) = alarm["Metrics"]
        assert query["Expression"] == job_alarm_query(
            "SDC", name, "example-hyperpod-cluster", except_job="sdc-canary"
        )
        assert "GROUP BY JobName" in query["Expression"]
        assert query["Period"] == 60 and query["ReturnData"] is True
        assert alarm["Threshold"] == 1
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["EvaluationPeriods"] == 1
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmName"] == f"sdc-guard-example-hyperpod-cluster-{name}"
        # The rule starts the workflow; an alarm action would notify before localization.
        assert "AlarmActions" not in alarm


def test_a_flood_of_job_names_pages_and_starts_nothing(default_synth: Any) -> None:
    # Given the default stack's alarms on the count of job data points (issue 32: made-up
    # JobNames can crowd real jobs out of the per-job alarms)
    template = default_synth.template
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    floods = {
        a["Properties"]["AlarmName"]: (logical_id, a["Properties"])
        for logical_id, a in resources(template, "AWS::CloudWatch::Alarm").items()
        if a["Properties"].get("AlarmName", "").endswith("-flood")
    }
    # Then each SDC metric has one, on the contract's COUNT query (the canary left out),
    # paging at 50 data points a minute through the topic
    assert set(floods) == {f"sdc-guard-example-hyperpod-cluster-{m}-flood" for m in METRIC_NAMES}
    for name, (_, alarm) in floods.items():
        metric = name.removeprefix("sdc-guard-example-hyperpod-cluster-").removesuffix("-flood")
        (query,) = alarm["Metrics"]
        assert query["Expression"] == job_count_query(
            "SDC", metric, "example-hyperpod-cluster", except_job="sdc-canary"
        )
        assert query["Period"] == 60
        assert alarm["Threshold"] == 50
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["EvaluationPeriods"] == 1 and alarm["DatapointsToAlarm"] == 1
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
    # And the workflow's rule does not listen to them
    (rule,) = resources(template, "AWS::Events::Rule").values()
    routed = {res["Fn::GetAtt"][0] for res in rule["Properties"]["EventPattern"]["resources"]}
    assert routed.isdisjoint({logical_id for logical_id, _ in floods.values()})


def test_thresholds_follow_the_config(variant_synth: Any) -> None:
    # Given a config raising the replay-mismatch threshold to 2 / Then only that alarm changes
    alarms = sdc_alarms(variant_synth.template)
    assert alarms["sdc_replay_mismatch"]["Threshold"] == 2
    assert alarms["sdc_nonfinite_grad"]["Threshold"] == 1


def test_rule_matches_exactly_our_alarms_entering_alarm_and_starts_the_workflow(
    default_synth: Any,
) -> None:
    # Given the default stack
    template = default_synth.template
    (rule,) = resources(template, "AWS::Events::Rule").values()
    pattern = rule["Properties"]["EventPattern"]
    alarm_ids = {
        logical_id
        for logical_id, alarm in resources(template, "AWS::CloudWatch::Alarm").items()
        if query_metric(alarm["Properties"])
    }
    # Then it matches one job's contributor of these alarms (the three SDC alarms and the
    # canary's) entering ALARM only
    assert pattern["source"] == ["aws.cloudwatch"]
    assert pattern["detail-type"] == ["CloudWatch Alarm Contributor State Change"]
    assert pattern["detail"] == {"state": {"value": ["ALARM"]}}
    assert {res["Fn::GetAtt"][0] for res in pattern["resources"]} == alarm_ids
    # And its one target is the state machine, with retries and a dead-letter queue
    (target,) = rule["Properties"]["Targets"]
    (machine_id,) = resources(template, "AWS::StepFunctions::StateMachine")
    (queue_id,) = resources(template, "AWS::SQS::Queue")
    assert target["Arn"] == {"Ref": machine_id}
    assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1


def test_state_machine_is_standard_logged_and_traced(default_synth: Any) -> None:
    # Given the default stack
    (machine,) = resources(default_synth.template, "AWS::StepFunctions::StateMachine").values()
    props = machine["Properties"]
    # Then it is a Standard workflow with X-Ray, logging every event without payloads
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False


def test_definition_has_each_step_invoking_its_function(default_synth: Any) -> None:
    # Given the default stack's definition
    asl = definition(default_synth.template)
    ids = function_ids(default_synth.template)
    states = all_states(asl["States"])
    expected = {
        "Localize": "localize",
        "Admit": "admit",
        "Cordon": "cordon",
        "StartHealthCheck": "start_health_check",
        "PollHealthCheck": "poll_health_check",
        "RequestApproval": "request_approval",
        "Replace": "replace",
        "Uncordon": "uncordon",
        "RecordCordoned": "record",
        "RecordFailed": "record",
    }
    # Then every step is a plain lambda:invoke task on the function of its contract folder
    for state_name, folder in expected.items():
        state = states[state_name]
        assert state["Type"] == "Task"
        assert state["Resource"].startswith("arn:<AWS::Partition>:states:::lambda:invoke")
        assert state["Parameters"]["FunctionName"] == f"<{ids[folder]}.Arn>"
    # And the Map iterates the suspects, each item starting as {alarm, suspect, execution,
    # item} (the last two: what keys the remediation whatever the steps return)
    remediate = all_states(asl["States"])["RemediateSuspects"]
    assert remediate["Type"] == "Map"
    assert remediate["ItemsPath"] == "$.suspects"
    assert remediate["ItemSelector"] == {
        "alarm.$": "$.alarm",
        "suspect.$": "$$.Map.Item.Value",
        "execution.$": "$$.Execution.Id",
        "item.$": "$$.Map.Item.Index",
        # Every node the alarm names counts: the late ones and those beyond the listed 64.
        "suspects_in_alarm.$": "$.suspect_count",
    }
    # And the late nodes' Map runs beside it, each item looking for its report again first
    late = all_states(asl["States"])["RemediateLateNodes"]
    assert late["ItemsPath"] == "$.pending"
    assert late["ItemProcessor"]["StartAt"] == "LocalizeLate"
    parallel = asl["States"]["RemediateInParallel"]
    assert parallel["Type"] == "Parallel"
    assert [b["StartAt"] for b in parallel["Branches"]] == [
        "RemediateSuspects",
        "RemediateLateNodes",
    ]


def test_step_results_land_under_their_contract_keys(default_synth: Any) -> None:
    # Given the per-item states
    states = item_states(definition(default_synth.template))
    # Then each step's Payload ends up at its own key of the item state
    for step, key in [
        ("Admit", "admission"),
        ("Cordon", "cordon"),
        ("StartHealthCheck", "health"),
        ("PollHealthCheck", "health"),
        ("Replace", "replacement"),
        ("Uncordon", "uncordon"),
    ]:
        assert states[step]["ResultPath"] == f"$.{key}"
        unwrap = states[states[step]["Next"]]
        assert unwrap == {
            "Type": "Pass",
            "InputPath": f"$.{key}.Payload",
            "ResultPath": f"$.{key}",
            "Next": unwrap["Next"],
        }
    assert states["RequestApproval"]["ResultPath"] == "$.approval"


def test_every_task_retries_transient_errors_and_catches_terminal_ones(default_synth: Any) -> None:
    # Given every Lambda task of the definition
    asl = definition(default_synth.template)
    tasks = {name: s for name, s in all_states(asl["States"]).items() if s["Type"] == "Task"}
    assert len(tasks) >= 20
    terminal = {
        "InvalidAlarmEvent",
        "InvalidStepInput",
        "NodeNotFound",
        "InstanceNotInCluster",
        "HealthCheckRejected",
        "ReplaceFailed",
        "ConfigurationError",
    }
    for name, task in tasks.items():
        retried = {error for retrier in task["Retry"] for error in retrier["ErrorEquals"]}
        # Then the transient errors (and Lambda throttling) are retried with backoff
        assert {"ClusterApiUnavailable", "AwsApiUnavailable", "ReportNotYetVisible"} <= retried, (
            name
        )
        assert "Lambda.TooManyRequestsException" in retried, name
        assert not retried & terminal, name
        assert all(r["BackoffRate"] > 1 for r in task["Retry"]), name
        if name.endswith("Screen"):
            # The node screen's failure is no remediation failure: everything is caught into
            # $.screen (read as a failed screen) and the item goes on to the approval
            prefix = name.removesuffix("Screen")
            assert task["Catch"] == [
                {
                    "ErrorEquals": ["States.ALL"],
                    "ResultPath": "$.screen",
                    "Next": f"{prefix}RecordAwaitingApproval",
                }
            ], name
            continue
        # And everything else is caught into the state, with States.ALL last
        caught = [catcher["ErrorEquals"] for catcher in task["Catch"]]
        assert caught[-1] == ["States.ALL"], name
        assert all(catcher["ResultPath"] == "$.error" for catcher in task["Catch"]), name
        # these end in a Fail state
        if name not in ("RecordFailed", "RecordItemFailed", "LateRecordItemFailed",
                        "RecordLateNodeFailed"):  # fmt: skip
            assert terminal <= {e for errors in caught for e in errors}, name


def test_errors_never_lead_to_uncordon_or_replace(default_synth: Any) -> None:
    # Given the per-item states, as a graph
    states = item_states(definition(default_synth.template))

    def successors(name: str) -> set[str]:
        state = states[name]
        nxt = {state["Next"]} if "Next" in state else set()
        nxt |= {choice["Next"] for choice in state.get("Choices", [])}
        nxt |= {state["Default"]} if "Default" in state else set()
        nxt |= {catcher["Next"] for catcher in state.get("Catch", [])}
        return nxt

    # The node screen's failure (its Catch, and its status Choice's default) is not followed as
    # an error path: it leads to the approval, where a person decides as without a screen
    screen = {"Screen", "ScreenStatus", "LateScreen", "LateScreenStatus"}
    for name in screen & set(states):
        state = states[name]
        ahead = [c["Next"] for c in state.get("Catch", [])]
        ahead += [state["Default"]] if "Default" in state else []
        assert {n.removeprefix("Late") for n in ahead} == {"RecordAwaitingApproval"}, name
    # When following every path that starts at a Catch or a Choice's default
    frontier = [c["Next"] for n, s in states.items() if n not in screen for c in s.get("Catch", [])]
    frontier += [s["Default"] for n, s in states.items() if "Default" in s and n not in screen]
    seen: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name not in seen:
            seen.add(name)
            frontier.extend(successors(name))
    # Then none reaches a state that uncordons or replaces a node
    assert seen, "expected error paths"
    assert not seen & {"Uncordon", "Replace", "Cordon"}, seen


def test_approval_waits_for_the_task_token_with_the_configured_timeout(
    default_synth: Any, variant_synth: Any
) -> None:
    # Given the RequestApproval state of the default (24 h) and variant (2 h) configs
    default = item_states(definition(default_synth.template))["RequestApproval"]
    variant = item_states(definition(variant_synth.template))["RequestApproval"]
    # Then it is a waitForTaskToken invoke passing the token and the item's keys
    assert default["Resource"].endswith(":states:::lambda:invoke.waitForTaskToken")
    payload = default["Parameters"]["Payload"]
    assert payload["task_token.$"] == "$$.Task.Token"
    for key in ("alarm", "suspect", "execution", "admission", "cordon", "health", "screen"):
        assert payload[f"{key}.$"] == f"$.{key}"
    assert default["TimeoutSeconds"] == 86400
    assert variant["TimeoutSeconds"] == 7200
    # And a timeout is recorded (and notified) as approval_timed_out, leaving the node cordoned
    (timeout_catch,) = [c for c in default["Catch"] if c["ErrorEquals"] == ["States.Timeout"]]
    states = item_states(definition(default_synth.template))
    timed_out = states[timeout_catch["Next"]]
    assert timed_out["Parameters"]["Payload"]["transition"] == "approval_timed_out"
    assert timed_out["Parameters"]["Payload"]["notify"] is True
    # ... and the item ends there: at the Map's one recorded end (a Pass ending the item alone,
    # since items no longer end in Fail states inside the Map: issue 32)
    done = states[timed_out["Next"]]
    assert done["Type"] == "Pass" and done.get("End") is True


def test_decision_branches(default_synth: Any) -> None:
    # Given the ApprovalDecision and HealthCheckStatus choices
    states = item_states(definition(default_synth.template))
    guard, *decision = states["ApprovalDecision"]["Choices"]

    def target(choice: dict[str, Any]) -> str:
        return choice["Next"]

    # Then a decision without its decision or approver is a recorded failure, checked first
    assert target(guard) == "IncompleteDecision"
    assert states["IncompleteDecision"]["Next"] == "RecordItemFailed"
    # And approve -> record approved -> Replace; reject+release -> Uncordon; reject -> rejected
    assert target(decision[0]) == "RecordApproved" and states["RecordApproved"]["Next"] == "Replace"
    assert {target(c) for c in decision[1:]} == {"RecordRejected", "Uncordon"}
    assert states["UncordonResult"]["Next"] == "RecordReleased"
    assert states["ReplaceResult"]["Next"] == "RecordReplaced"
    # And the health poll loops while in progress, and skips approval when HyperPod replaced it
    no_status, *by_status = states["HealthCheckStatus"]["Choices"]
    assert no_status == {
        "Variable": "$.health.status",
        "IsPresent": False,
        "Next": "NoHealthStatus",
    }
    health = {c["StringEquals"]: c["Next"] for c in by_status}
    assert health["in_progress"] == "WaitForHealthCheck"
    assert states["WaitForHealthCheck"]["Next"] == "PollHealthCheck"
    # (the item ends at the Map's recorded end, a Pass: no Fail state inside a Map, issue 32)
    replaced = states[health["replaced_by_hyperpod"]]
    assert states[replaced["Next"]]["Type"] == "Pass" and states[replaced["Next"]].get("End")
    # And each health-check verdict leads to the node screen, which loops while in progress
    # and then asks for the approval
    for status in ("passed", "failed", "timed_out"):
        assert states[health[status]]["Next"] == "Screen"
    assert states["Screen"]["Next"] == "ScreenResult"
    assert states["ScreenResult"]["Next"] == "ScreenStatus"
    no_status, in_progress = states["ScreenStatus"]["Choices"]
    assert no_status["Next"] == "ScreenNoStatus"
    assert states["ScreenNoStatus"]["Next"] == "RecordAwaitingApproval"
    assert in_progress == {
        "Variable": "$.screen.status",
        "StringEquals": "in_progress",
        "Next": "WaitForScreen",
    }
    assert states["WaitForScreen"]["Next"] == "Screen"
    assert states["ScreenStatus"]["Default"] == "RecordAwaitingApproval"
    assert states["RecordAwaitingApproval"]["Next"] == "RequestApproval"


def test_record_payloads_use_the_contract_transitions(default_synth: Any) -> None:
    # Given every Record task
    asl = definition(default_synth.template)
    records = [s for n, s in all_states(asl["States"]).items() if "Record" in n]
    transitions = {r["Parameters"]["Payload"]["transition"] for r in records}
    # Then each uses a transition name of docs/CONTRACT.md and passes the whole state
    contract = {
        "ambiguous", "no_suspects", "duplicate", "circuit_open", "cordoned", "health_check_passed",
        "health_check_failed", "health_check_timed_out", "replaced_by_hyperpod", "awaiting_approval",
        "approved", "rejected", "released", "approval_timed_out", "replaced", "failed", "shadow",
        "refused",
    }  # fmt: skip
    assert transitions == contract
    for record in records:
        payload = record["Parameters"]["Payload"]
        assert payload["state.$"] == "$"
        assert isinstance(payload["notify"], bool)
        assert record["ResultPath"] is None
        if payload["transition"] == "failed":
            assert payload["error.$"] == "$.error"


def test_functions_share_the_defaults_and_the_contract_environment(default_synth: Any) -> None:
    # Given the nine functions
    functions = {
        k: fn
        for k, fn in resources(default_synth.template, "AWS::Lambda::Function").items()
        if fn["Properties"]["Handler"].endswith(STEP_HANDLER_SUFFIX)  # not CDK's lookup provider
    }
    handlers = sorted(fn["Properties"]["Handler"] for fn in functions.values())
    # Then one per contract folder, handler <folder>.handler.handler
    folders = {**STEPS, **SERVICES, "canary": None}  # the canary is on by default
    assert handlers == sorted(f"{folder}.handler.handler" for folder in folders)
    for fn in functions.values():
        props = fn["Properties"]
        assert props["Runtime"] == "python3.14"
        assert props["Architectures"] == ["arm64"]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["LoggingConfig"]["LogFormat"] == "JSON"
        assert len(props["Layers"]) == 1
        env = props["Environment"]["Variables"]
        # request_approval alone also names the approve function's URL (its messages quote it,
        # and the canary's approval is settled through it), and whether its auto-approval
        # policy needs a reproduced screen (autoApproveRequiresScreen)
        own = {
            "request_approval": {contract.APPROVAL_URL, contract.AUTO_APPROVE_REQUIRES_SCREEN},
            # approve alone knows request_approval's role (confined to the canary's action)
            "approve": {contract.APPROVAL_REQUESTER_ROLE},
            "canary": {contract.CANARY_TIMEOUT_SECONDS},  # how long a run stays open
            # the flood watch's share of the series limit, and the alarms' period (its crowd)
            "sweeper": {FLOOD_WATCH_FRACTION, contract.ALARM_PERIOD},
            # the node screen's Job: image (empty: not configured), namespace, deadline
            "screen": {
                contract.SCREEN_IMAGE,
                contract.SCREEN_NAMESPACE,
                contract.SCREEN_DEADLINE_SECONDS,
            },
        }.get(props["Handler"].split(".")[0], set())
        assert set(env) == CONTRACT_ENV | own
        assert env["REPORT_LOG_GROUP"] == "/sdc/example-hyperpod-cluster"
        assert env["MAX_NODES_PER_HOUR"] == "2"
        assert env["HEALTH_CHECKS"] == "InstanceStress"
        assert env["DRY_RUN"] == "false"
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "SDCRemediation"
        assert env["ALARM_ACCOUNT_ID"] == {"Ref": "AWS::AccountId"}
        assert env["ALARM_NAME_PREFIX"] == "sdc-guard-example-hyperpod-cluster-"
        assert env["TRAINING_NAMESPACE"] == "default"  # trainingNamespace
        assert int(env["APPROVAL_TTL_SECONDS"]) > 86400
        # The approval timeout is passed as itself (the functions no longer subtract a day)
        assert env["APPROVAL_TIMEOUT_SECONDS"] == "86400"
        assert "stateMachine:sdc-guard-example-hyperpod-cluster" in flatten(
            env["STATE_MACHINE_ARN"]
        )
    # And no function has a reserved concurrency (admit's guard transaction serialises; a
    # limit of one turned a storm into throttling and a failure per node)
    assert all("ReservedConcurrentExecutions" not in f["Properties"] for f in functions.values())


def test_tables_have_the_contract_keys_and_protection(default_synth: Any) -> None:
    # Given the two tables
    template = Template.from_json(default_synth.template)
    # Then the ledger is pk/sk (no secondary index: the guard counts from its own item), PITR
    # and KMS encryption
    template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "KeySchema": [
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                    "BillingMode": "PAY_PER_REQUEST",
                    "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                    # a customer managed key of the stack (test_infra_encryption; issue 32)
                    "SSESpecification": Match.object_like({"SSEEnabled": True, "SSEType": "KMS"}),
                }
            ),
        },
    )
    # And approvals are keyed by approval_id with a TTL on expires_at
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "approval_id", "KeyType": "HASH"}],
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            # a customer managed key of the stack (test_infra_encryption; issue 32)
            "SSESpecification": Match.object_like({"SSEEnabled": True, "SSEType": "KMS"}),
        },
    )


def test_topic_is_encrypted_and_subscribes_the_configured_emails(
    default_synth: Any, variant_synth: Any
) -> None:
    # Given both configs
    (topic,) = resources(default_synth.template, "AWS::SNS::Topic").values()
    # Then the topic uses a rotating key of the stack (its own: the tables and log groups have
    # theirs, test_infra_encryption)
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key_id.startswith("NotificationsKey")
    assert (
        resources(default_synth.template, "AWS::KMS::Key")[key_id]["Properties"][
            "EnableKeyRotation"
        ]
        is True
    )
    # And exactly the configured addresses are subscribed
    assert resources(default_synth.template, "AWS::SNS::Subscription") == {}
    subscriptions = resources(variant_synth.template, "AWS::SNS::Subscription").values()
    assert sorted(s["Properties"]["Endpoint"] for s in subscriptions) == [
        "ml-platform@example.com",
        "oncall@example.com",
    ]
    assert all(s["Properties"]["Protocol"] == "email" for s in subscriptions)


# Actions that have no resource-level permissions, the only ones allowed on "*".
STAR_ALLOWED = {
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "cloudwatch:ListMetrics",
    "cloudwatch:GetMetricData",
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
}


@pytest.mark.parametrize("which", ["default_synth", "variant_synth"])
def test_star_resources_only_for_actions_without_resource_permissions(
    which: str, request: pytest.FixtureRequest
) -> None:
    # Given every IAM statement of the stack (inline and managed policies)
    template = request.getfixturevalue(which).template
    docs = [
        p["Properties"]["PolicyDocument"] for p in resources(template, "AWS::IAM::Policy").values()
    ]
    docs += [
        p["Properties"]["PolicyDocument"]
        for p in resources(template, "AWS::IAM::ManagedPolicy").values()
    ]
    for statement in (s for doc in docs for s in doc["Statement"]):
        if "*" in as_list(statement["Resource"]):
            actions = set(as_list(statement["Action"]))
            # Then "*" appears only with those actions, or PutMetricData fenced by namespace
            if actions == {"cloudwatch:PutMetricData"}:
                # the agent's datum (SDC), the canary's in its own namespace (SDC/Canary, which
                # the agent's exact condition cannot reach: issue 32); the record step's
                # canary_completed (the functions' own namespace)
                namespace = statement["Condition"]["StringEquals"]["cloudwatch:namespace"]
                assert namespace in ("SDC", "SDC/Canary", "SDCRemediation")
                assert list(statement["Condition"]) == ["StringEquals"]
            else:
                assert actions <= STAR_ALLOWED, statement


def statements_by_step(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    functions = resources(template, "AWS::Lambda::Function")
    return {
        folder: role_statements(
            template, functions[logical_id]["Properties"]["Role"]["Fn::GetAtt"][0]
        )
        for folder, logical_id in function_ids(template).items()
    }


def actions_of(statements: list[dict[str, Any]]) -> dict[str, list[str]]:
    """action -> flattened resources it is allowed on."""
    allowed: dict[str, list[str]] = {}
    for statement in statements:
        for action in as_list(statement["Action"]):
            allowed.setdefault(action, []).extend(
                flatten(r) for r in as_list(statement["Resource"])
            )
    return allowed


def test_each_step_gets_only_its_own_permissions_on_named_resources(variant_synth: Any) -> None:
    # Given the variant (cluster ARN known, label replacement)
    template = variant_synth.template
    by_step = {folder: actions_of(s) for folder, s in statements_by_step(template).items()}
    (ledger_id,) = [
        k
        for k, t in resources(template, "AWS::DynamoDB::Table").items()
        if len(t["Properties"]["KeySchema"]) == 2
    ]
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    cluster_arn = "arn:aws:sagemaker:us-west-2:123456789012:cluster/abcdef123456"
    # Then HyperPod calls are scoped to the cluster ARN, by the steps that need them only
    assert by_step["start_health_check"]["sagemaker:StartClusterHealthCheck"] == [cluster_arn]
    assert by_step["replace"]["sagemaker:BatchReplaceClusterNodes"] == [cluster_arn]
    only = {
        "sagemaker:StartClusterHealthCheck": {"start_health_check"},
        "sagemaker:BatchReplaceClusterNodes": {"replace"},
    }
    for action, owners in only.items():
        assert {f for f, acts in by_step.items() if action in acts} == owners
    # And the ledger is written only by admit and record, on the table and its index
    writers = {
        f
        for f, acts in by_step.items()
        if "dynamodb:PutItem" in acts and any(ledger_id in r for r in acts["dynamodb:PutItem"])
    }
    # approve: releases; canary: its runs' items only (test_infra_canary)
    assert writers == {"admit", "record", "sweeper", "approve", "canary"}
    assert by_step["admit"]["dynamodb:Query"] == [f"<{ledger_id}.Arn>"]
    # And notifications are published only by record, request_approval and the sweeper
    assert {f for f, acts in by_step.items() if "sns:Publish" in acts} == {
        "record",
        "request_approval",
        "sweeper",
        "canary",  # where a canary stopped
    }
    assert by_step["record"]["sns:Publish"] == [f"<{topic_id}>"]
    # And eks:DescribeCluster is on the named cluster, for the Kubernetes-facing steps only
    eks_users = {f for f, acts in by_step.items() if "eks:DescribeCluster" in acts}
    assert eks_users == {
        "localize",
        "cordon",
        "uncordon",
        "poll_health_check",
        "replace",
        "start_health_check",  # a shadowed node's label, before its check
        "approve",  # release reads the node first
        "screen",  # the node screen's Job on the cordoned node
    }
    assert all(r.endswith(":cluster/ml-prod-eks") for r in by_step["cordon"]["eks:DescribeCluster"])
    # And no step may write to the approvals table except request_approval
    assert {f for f, acts in by_step.items() if "dynamodb:PutItem" in acts} == {
        "admit",
        "record",
        "request_approval",
        "sweeper",
        "approve",
        "canary",
    }


def test_eks_access_entries_put_each_kubernetes_step_in_its_own_group(
    default_synth: Any, variant_synth: Any
) -> None:
    # Given both configs (the variant replaces by node label, so replace talks to Kubernetes)
    def entries(template: dict[str, Any]) -> dict[str, list[str]]:
        roles = {
            fn["Properties"]["Role"]["Fn::GetAtt"][0]: fn["Properties"]["Handler"].split(".")[0]
            for fn in resources(template, "AWS::Lambda::Function").values()
        }
        found = {}
        for entry in resources(template, "AWS::EKS::AccessEntry").values():
            props = entry["Properties"]
            assert props["Type"] == "STANDARD"
            found[roles[props["PrincipalArn"]["Fn::GetAtt"][0]]] = props["KubernetesGroups"]
        return found

    # Then localize (which parses untrusted reports) and the health check's start and poll only
    # read; cordon and uncordon may cordon; approve (release reads the node, then takes
    # sdc-guard's marks off it) is the releaser, sdc.guard/* metadata only; only replace, in
    # label mode, is in the group that may trigger a replacement
    reading = {
        step: ["sdc-reader"] for step in ("localize", "poll_health_check", "start_health_check")
    }
    cordoning = {
        "cordon": ["sdc-cordoner"],
        "uncordon": ["sdc-cordoner"],
        "approve": ["sdc-releaser"],
    }
    # and the screen is the screener (nodes get; Jobs and pods in the screening namespace)
    cordoning["screen"] = ["sdc-screener"]
    assert entries(default_synth.template) == reading | cordoning
    assert entries(variant_synth.template) == reading | cordoning | {"replace": ["sdc-replacer"]}
    (entry,) = [e for e in resources(variant_synth.template, "AWS::EKS::AccessEntry").values()][:1]
    assert entry["Properties"]["ClusterName"] == "ml-prod-eks"


def test_only_kubernetes_steps_run_in_the_configured_vpc(variant_synth: Any) -> None:
    # Given the variant with a VPC for the private EKS endpoint
    functions = resources(variant_synth.template, "AWS::Lambda::Function").values()
    in_vpc = {
        fn["Properties"]["Handler"].split(".")[0]
        for fn in functions
        if "VpcConfig" in fn["Properties"]
    }
    # Then exactly the functions calling the EKS API are placed in its subnets
    assert in_vpc == {
        "localize",
        "cordon",
        "uncordon",
        "poll_health_check",
        "replace",
        "start_health_check",
        "approve",
        "screen",
    }
    for fn in functions:
        if "VpcConfig" in fn["Properties"]:
            assert fn["Properties"]["VpcConfig"]["SubnetIds"] == [
                "subnet-0123456789abcdef0",
                "subnet-0fedcba9876543210",
            ]


def test_liveness_alarm_notifies_when_the_job_stops_checking(variant_synth: Any) -> None:
    # Given the variant with livenessJobName
    (alarm,) = [
        a["Properties"]
        for a in resources(variant_synth.template, "AWS::CloudWatch::Alarm").values()
        if "liveness" in a["Properties"].get("AlarmName", "")
    ]
    # Then missing data breaches (no checks = unprotected), and it notifies the topic
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    dims = [m["MetricStat"]["Metric"]["Dimensions"] for m in alarm["Metrics"] if "MetricStat" in m]
    assert all({"Name": "JobName", "Value": "llama-70b"} in d for d in dims) and len(dims) == 2
    (topic_id,) = resources(variant_synth.template, "AWS::SNS::Topic")
    assert alarm["AlarmActions"] == [{"Ref": topic_id}]


def test_operators_decide_only_through_the_approve_function_url(default_synth: Any) -> None:
    # Given the operators' managed policy and every role of the stack
    template = default_synth.template
    (approvals_id,) = [
        k
        for k, t in resources(template, "AWS::DynamoDB::Table").items()
        if len(t["Properties"]["KeySchema"]) == 1
    ]
    approve_id = function_ids(template)["approve"]
    policies = [p["Properties"] for p in resources(template, "AWS::IAM::ManagedPolicy").values()]
    (operators,) = [p for p in policies if "operators" in p["Description"]]
    statements = operators["PolicyDocument"]["Statement"]
    allowed = actions_of(statements)
    # Then operators may call the approve function's AWS_IAM URL, and invoke it only that way
    assert allowed["lambda:InvokeFunctionUrl"] == [f"<{approve_id}.Arn>"]
    (url,) = [s for s in statements if "lambda:InvokeFunctionUrl" in as_list(s["Action"])]
    assert url["Condition"] == {"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}
    (invoke,) = [s for s in statements if "lambda:InvokeFunction" in as_list(s["Action"])]
    assert invoke["Condition"] == {"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}
    # And they can neither send task results nor read the approvals table (task tokens) nor
    # read execution histories (which hold the token too)
    assert not [a for a in allowed if a.startswith("states:")]
    assert not any(approvals_id in r for rs in allowed.values() for r in rs)
    assert not any(r == "*" for rs in allowed.values() for r in rs)
    # And of all the stack's roles, only the approve function's may send task results (the
    # canary, on by default, approves through it: RequestApproval may invoke it, nothing else)
    senders = set()
    for policy in resources(template, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if any(a.startswith("states:SendTask") for a in as_list(statement["Action"])):
                senders.update(r["Ref"] for r in policy["Properties"]["Roles"])
                assert as_list(statement["Action"]) == ["states:SendTaskSuccess"]
                (machine_arn,) = as_list(statement["Resource"])
                assert flatten(machine_arn).endswith(
                    ":stateMachine:sdc-guard-example-hyperpod-cluster"
                )
    approve_role = template["Resources"][approve_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    assert senders == {approve_role}
    # And RequestApproval reaches the approve function as operators do, through its URL only
    # (to settle the canary's approval), and knows the URL
    request_id = function_ids(template)["request_approval"]
    request_role = template["Resources"][request_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    invokes = [
        statement
        for policy in resources(template, "AWS::IAM::Policy").values()
        if request_role in [r["Ref"] for r in policy["Properties"]["Roles"]]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if any(a.startswith("lambda:") for a in as_list(statement["Action"]))
    ]
    assert sorted((tuple(as_list(s["Action"])), json.dumps(s["Condition"])) for s in invokes) == [
        (("lambda:InvokeFunction",), '{"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}'),
        (
            ("lambda:InvokeFunctionUrl",),
            '{"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}',
        ),
    ]
    request_env = template["Resources"][request_id]["Properties"]["Environment"]["Variables"]
    (url_id,) = resources(template, "AWS::Lambda::Url")
    assert request_env["APPROVAL_URL"] == {"Fn::GetAtt": [url_id, "FunctionUrl"]}


APPROVE_ARN_STAND_INS = (
    "arn:<AWS::Partition>:lambda:<AWS::Region>:<AWS::AccountId>:function:sdc-guard-approve",
    "arn:aws:lambda:us-east-1:123456789012:function:sdc-guard-approve",
)
"""What a wildcard function ARN is matched against, built from pseudo parameters or written out:
the approve function's name is CloudFormation's to choose, so any pattern that leaves the
function's name open covers it."""


def _grants_on(statement: dict[str, Any], action: str, resource_id: str) -> bool:
    """Whether ``statement`` allows ``action`` (or a wildcard covering it, in any case) on the
    resource with logical id ``resource_id``: named, or covered by ``*``, a wildcard function
    ARN or a ``NotResource`` that does not name it."""
    if statement.get("Effect", "Allow") != "Allow":
        return False
    if "NotAction" in statement:
        covers = not any(
            matches(a.lower(), action.lower()) for a in as_list(statement["NotAction"])
        )
    else:
        actions = as_list(statement.get("Action", []))
        covers = any(matches(a.lower(), action.lower()) for a in actions)
    if "NotResource" in statement:
        names = [flatten(r) for r in as_list(statement["NotResource"])]
        return covers and not any(resource_id in r for r in names)
    names = [flatten(r) for r in as_list(statement.get("Resource", []))]
    return covers and any(
        resource_id in r or any(matches(r, arn) for arn in APPROVE_ARN_STAND_INS) for r in names
    )


def _every_statement(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Every IAM statement of the stack: inline and managed policies, and roles' own policies."""
    statements = [
        statement
        for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
        for policy in resources(template, kind).values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    for role in resources(template, "AWS::IAM::Role").values():
        for policy in role["Properties"].get("Policies", []):
            statements.extend(policy["PolicyDocument"]["Statement"])
    return statements


@pytest.mark.parametrize(
    ("statement", "grants"),
    [
        ({"Action": "lambda:*", "Resource": "*"}, True),
        ({"Action": "lambda:Invoke*", "Resource": "arn:aws:lambda:*:*:function:*"}, True),
        ({"Action": "lambda:Invoke*", "Resource": "arn:aws:lambda:us-east-1:1:function:*"}, False),
        (
            {"Action": "Lambda:invokefunction", "Resource": f"{APPROVE_ARN_STAND_INS[0][:-7]}*"},
            True,
        ),
        ({"Action": "*", "Resource": "<FunctionsApproveFunction0E49A454.Arn>"}, True),
        ({"NotAction": "s3:*", "Resource": "*"}, True),
        ({"Action": "lambda:InvokeFunction", "NotResource": "<Other.Arn>"}, True),
        ({"Action": "lambda:InvokeFunction", "Resource": "<Other.Arn>"}, False),
        ({"Effect": "Deny", "Action": "lambda:*", "Resource": "*"}, False),
    ],
)
def test_the_invoke_check_sees_wildcards(statement: dict[str, Any], grants: bool) -> None:
    # The template test below is only as strong as this reading of a statement
    assert _grants_on(statement, "lambda:InvokeFunction", "FunctionsApproveFunction0E49A454") is (
        grants
    )


@pytest.mark.parametrize("synth", ["default_synth", "variant_synth"])
def test_no_role_may_invoke_approve_except_through_its_url(synth: str, request) -> None:
    # Given every IAM statement of the stack (inline policies, managed policies, roles' own),
    # and every resource-based permission on the approve function, the canary on or off
    template = request.getfixturevalue(synth).template
    approve_id = function_ids(template)["approve"]
    invokes = [
        s for s in _every_statement(template) if _grants_on(s, "lambda:InvokeFunction", approve_id)
    ]
    # Then each grant of lambda:InvokeFunction on it is conditioned on coming through the URL
    # (a handler cannot tell a direct invoke with a made-up requestContext from a URL request;
    # superseded: request_approval could invoke it directly while the canary was on)
    assert invokes, "operators (and request_approval with the canary) reach it through the URL"
    for statement in invokes:
        assert statement["Condition"] == {"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}
    # And no role attaches an AWS managed policy (those grant invoke on every function)
    for role_id, role in resources(template, "AWS::IAM::Role").items():
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert flatten(arn).endswith("service-role/AWSLambdaBasicExecutionRole"), role_id
    # And no resource-based permission lets any principal invoke it
    permissions = resources(template, "AWS::Lambda::Permission").values()
    assert not [p for p in permissions if approve_id in flatten(p["Properties"]["FunctionName"])]


def test_the_approve_function_has_an_aws_iam_url(default_synth: Any) -> None:
    template = default_synth.template
    approve_id = function_ids(template)["approve"]
    (url,) = resources(template, "AWS::Lambda::Url").values()
    assert url["Properties"]["AuthType"] == "AWS_IAM"
    assert url["Properties"]["TargetFunctionArn"] == {"Fn::GetAtt": [approve_id, "Arn"]}


def test_outputs_tell_the_user_what_to_run(default_synth: Any) -> None:
    # Given the stack outputs
    outputs = default_synth.template["Outputs"]
    # Then the names the CLI and docs refer to are there
    for name in (
        "StateMachineArn",
        "LedgerTableName",
        "ApprovalsTableName",
        "TopicArn",
        "DashboardUrl",
        "ApproveCommand",
        "ApprovalUrl",
        "OperatorPolicyArn",
        "AgentPolicyArn",
    ):
        assert name in outputs, name
    command = flatten(outputs["ApproveCommand"]["Value"])
    assert command.startswith("sdc-remediation --approval-url <")
    assert command.endswith(" approve APPROVAL_ID")
    assert "--ledger-table <" in command


def test_dashboard_shows_sdc_metrics_liveness_outcomes_and_open_remediations(
    default_synth: Any,
) -> None:
    # Given the dashboard body
    (dashboard,) = resources(default_synth.template, "AWS::CloudWatch::Dashboard").values()
    body = flatten(dashboard["Properties"]["DashboardBody"])
    # Then it graphs each SDC metric per job and node, liveness per job, the workflow and open items
    for name in METRIC_NAMES:
        assert (
            f'{{SDC,ClusterName,JobName,NodeName}} ClusterName=\\"example-hyperpod-cluster\\" MetricName=\\"{name}\\"'
            in body
        )
    for name in ("sdc_audit_pass", "sdc_weight_check_pass"):
        assert f'MetricName=\\"{name}\\"' in body
    assert "ExecutionsFailed" in body
    (record_logs,) = [
        k
        for k, v in resources(default_synth.template, "AWS::Lambda::Function").items()
        if v["Properties"]["Handler"] == "record.handler.handler"
    ]
    record_group = resources(default_synth.template, "AWS::Lambda::Function")[record_logs][
        "Properties"
    ]["LoggingConfig"]["LogGroup"]
    assert f"SOURCE '{flatten(record_group)}'" in body
    assert 'filter message = \\"recorded\\"' in body


def test_code_asset_is_the_lambdas_folder_without_build_leftovers(default_synth: Any) -> None:
    # Given the staged function code asset (bundling is skipped only for the layer)
    staged = [p for p in default_synth.outdir.glob("asset.*") if (p / "sdc_remediation").is_dir()]
    assert len(staged) == 1
    files = [p.relative_to(staged[0]).as_posix() for p in staged[0].rglob("*")]
    # Then it holds the domain package but no tests, caches, metadata or packaging files
    assert "sdc_remediation/__init__.py" in files
    assert not [f for f in files if "__pycache__" in f or ".egg-info" in f or f.endswith(".pyc")]
    assert not [f for f in files if f == "tests" or f.startswith("tests/") or "/tests/" in f]
    assert "pyproject.toml" not in files


def test_the_sweeper_runs_on_a_schedule_reads_executions_and_starts_only_the_backstop(
    default_synth: Any,
) -> None:
    # Given the sweeper function and its schedule
    template = default_synth.template
    sweeper = function_ids(template)["sweeper"]
    (schedule,) = [
        r["Properties"]
        for r in resources(template, "AWS::Scheduler::Schedule").values()
        if "canary" not in r["Properties"]["Description"]  # the canary's: test_infra_canary
    ]
    # Then it runs every 15 minutes
    assert schedule["ScheduleExpression"] == "rate(15 minutes)"
    assert schedule["Target"]["Arn"] == {"Fn::GetAtt": [sweeper, "Arn"]}
    # And its role reads executions of this state machine, starts that state machine only (the
    # backstop, issue 32), and never sends task results
    role = template["Resources"][sweeper]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = role_statements(template, role)
    states_actions = {
        a for s in statements for a in as_list(s["Action"]) if a.startswith("states:")
    }
    assert states_actions == {"states:DescribeExecution", "states:StartExecution"}
    (describe,) = [s for s in statements if "states:DescribeExecution" in as_list(s["Action"])]
    assert flatten(as_list(describe["Resource"])[0]).endswith(
        ":execution:sdc-guard-example-hyperpod-cluster:*"
    )
    (start,) = [s for s in statements if "states:StartExecution" in as_list(s["Action"])]
    assert as_list(start["Action"]) == ["states:StartExecution"]
    assert [flatten(r) for r in as_list(start["Resource"])] == [
        "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:stateMachine:"
        "sdc-guard-example-hyperpod-cluster"
    ]
    # And it reads the report group (the backstop's reports), and writes nothing there
    logs_actions = {
        a for s in statements for a in as_list(s["Action"]) if a.startswith("logs:")
    } - {"logs:CreateLogStream", "logs:PutLogEvents"}  # its own log group's
    assert logs_actions == {"logs:FilterLogEvents"}
    # And it lists the SDC series (the flood watch) and reads their data (its crowd watch,
    # issue 32: how many job series had data at once), and puts no SDC data
    cloudwatch_actions = {
        a for s in statements for a in as_list(s["Action"]) if a.startswith("cloudwatch:")
    }
    assert cloudwatch_actions == {"cloudwatch:ListMetrics", "cloudwatch:GetMetricData"}
    (listing,) = [s for s in statements if s.get("Sid") == "ListSdcSeries"]
    assert as_list(listing["Action"]) == ["cloudwatch:ListMetrics"]
    (reading,) = [s for s in statements if s.get("Sid") == "ReadCrowdedSdcSeries"]
    assert as_list(reading["Action"]) == ["cloudwatch:GetMetricData"]
    # And its flood watch tells at floodWatchFraction of the limit (cdk.json: 0.8), under the
    # variable name the function reads
    env = template["Resources"][sweeper]["Properties"]["Environment"]["Variables"]
    assert env[FLOOD_WATCH_FRACTION] == "0.8"
    assert remediation_config.Settings(env).flood_watch_fraction == 0.8
    # and counts the crowd in the alarms' period (alarmPeriod, 1 minute by default)
    assert env[contract.ALARM_PERIOD] == "60"
    assert remediation_config.Settings(env).alarm_period_seconds == 60
