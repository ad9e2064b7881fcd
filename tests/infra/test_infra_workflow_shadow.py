"""Shadow mode through the synthesized definition: a check x verdict in shadow (CHECK_MODES)
is admitted as shadow by the real admit step, recorded and notified by the real record step
("would have cordoned"), and the node is never cordoned, checked or replaced; the ledger keeps
the shadow outcome against the check and verdict. An enforced one still cordons."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sns.models import sns_backends

from sdc_remediation import aws
from sdc_remediation.config import Settings
from sdc_remediation.dal.ledger import Ledger
from sdc_remediation.logic import outcomes, recording, steps
from sdc_remediation.models import ItemState, parse_step
from tests.infra.infra_synth import Synth, synthesize
from tests.infra.test_infra_workflow import ALARM, EVENT, SUSPECT, decide, happy_steps
from tests.infra.workflow_harness import REGION, finish, start, workflow

pytestmark = pytest.mark.slow

CLUSTER = ALARM["cluster_name"]
LEDGER = "sdc-ledger"
TOPIC = f"arn:aws:sns:{REGION}:{DEFAULT_ACCOUNT_ID}:sdc-remediation"
SUSPECT_REAL = {
    **SUSPECT,
    "ranks": {"5": {"gpu_uuid": "GPU-5", "local_rank": 5}},
    "last_audit_pass": 1180,
}


@pytest.fixture(scope="module")
def fast_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The shipped config with a 1-second health-check poll."""
    return synthesize(tmp_path_factory, "fast-shadow", {"healthCheckPollInterval": "1s"})


@pytest.fixture(autouse=True)
def region(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real steps create their clients from the environment (as in Lambda)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)


def _settings(modes: dict[str, str], *, shadow_health_check: bool = False) -> Settings:
    return Settings(
        {
            "HYPERPOD_CLUSTER_NAME": CLUSTER,
            "LEDGER_TABLE": LEDGER,
            "TOPIC_ARN": TOPIC,
            "CHECK_MODES": json.dumps(modes),
            "DRY_RUN": "false",
            "SHADOW_HEALTH_CHECK": "true" if shadow_health_check else "false",
        }
    )


def _moto_account() -> None:
    """The ledger table, the topic and a 20-node HyperPod cluster (admit counts its nodes)."""
    aws.reset_clients()
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName=LEDGER,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    boto3.client("sns", region_name=REGION).create_topic(Name="sdc-remediation")
    boto3.client("sagemaker", region_name=REGION).create_cluster(
        ClusterName=CLUSTER,
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceCount": 20,
                "LifeCycleConfig": {
                    "SourceS3Uri": "s3://sagemaker-lifecycle/x",
                    "OnCreate": "x.sh",
                },
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
                "ThreadsPerCore": 1,
            }
        ],
    )


def _real_steps(modes: dict[str, str], *, shadow_health_check: bool = False) -> dict[str, Any]:
    """The happy path's stand-ins, with the real admit and record steps on moto."""
    settings = _settings(modes, shadow_health_check=shadow_health_check)
    handlers = happy_steps(["failed"])
    handlers["localize"] = lambda event: {
        "alarm": ALARM,
        "suspects": [SUSPECT_REAL],
        "pending": [],
        "suspect_count": 1,
        "refused": [],
        "ambiguous": False,
        "reports": 1,
    }
    handlers["admit"] = lambda s: steps.admit(parse_step(s, ItemState), settings).model_dump(
        mode="json"
    )
    handlers["record"] = lambda p: recording.record(
        recording.parse_record_input(p)[0], settings
    ).model_dump(mode="json")
    return handlers


def _messages() -> list[tuple[str, str]]:
    topic = sns_backends[DEFAULT_ACCOUNT_ID][REGION].topics[TOPIC]
    return [(subject, message) for _, message, subject, *_ in topic.sent_notifications]


def test_a_shadowed_check_is_recorded_and_notified_and_nothing_is_touched(
    fast_synth: Synth,
) -> None:
    # Given compute/persistent in shadow (everything else enforced)
    handlers = _real_steps({"compute/persistent": "shadow"})

    # When an alarm of that check runs through the definition
    with workflow(fast_synth.template, handlers) as (sfn, machine, run):
        _moto_account()
        result = finish(sfn, start(sfn, machine, EVENT, "shadow"))
        ledger = Ledger(LEDGER)
        events = ledger.events(SUSPECT["instance_id"])
        state = ledger.state(SUSPECT["instance_id"])
        guard = ledger.guard(CLUSTER)
        messages = _messages()

    # Then it succeeds with one `shadow` record, and no step that touches the node ran
    assert result["status"] == "SUCCEEDED"
    assert run.transitions() == ["shadow"]
    for folder in ("cordon", "start_health_check", "poll_health_check", "request_approval"):
        assert run.inputs(folder) == [], folder
    assert run.inputs("replace") == [] and run.inputs("uncordon") == []
    # And the on-call is told, with the evidence, what would have happened
    ((subject, body),) = messages
    assert "would have cordoned hyperpod-i-0123456789abcdef0" in subject
    assert "(compute, persistent)" in subject
    evidence = json.loads(body)["evidence"]
    assert (evidence["check"], evidence["verdict"], evidence["step"]) == (
        "compute",
        "persistent",
        1200,
    )
    # And the ledger has the shadow outcome against compute/persistent; nothing was claimed
    (remediation,) = outcomes.summarise(events)
    assert (remediation.outcome, remediation.check, remediation.verdict) == (
        "shadow",
        "compute",
        "persistent",
    )
    assert state is None
    assert guard["version"] == 0 and guard["held"] == []


def test_an_enforced_check_beside_a_shadowed_one_still_cordons(fast_synth: Synth) -> None:
    # Given every check in shadow except compute/persistent
    handlers = _real_steps({"*": "shadow", "compute/persistent": "enforce"})

    # When its alarm runs and the approver approves
    with workflow(fast_synth.template, handlers) as (sfn, machine, run):
        _moto_account()
        execution = start(sfn, machine, EVENT, "enforced")
        decide(
            sfn,
            run,
            {"decision": "approve", "approver": "arn:aws:iam::1:user/a", "approval_id": "a-1"},
        )
        result = finish(sfn, execution)

    # Then it took today's path: cordoned, checked, approved, replaced
    assert result["status"] == "SUCCEEDED"
    assert "shadow" not in run.transitions()
    assert len(run.inputs("cordon")) == 1 and len(run.inputs("replace")) == 1
