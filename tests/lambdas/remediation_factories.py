"""Builders for the remediation tests: alarm events, agent reports, workflow item states."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import sdc_contract as contract

CLUSTER = "hp-test"
EKS_CLUSTER = "eks-test"
NAMESPACE = "SDC"
JOB = "llama-pretrain"
REGION = "us-east-1"
LEDGER = "sdc-ledger"
APPROVALS = "sdc-approvals"
TOPIC = "sdc-remediation"
TRAINING_NAMESPACE = "training"  # where the guarded jobs' pods run (TRAINING_NAMESPACE)
NODES = 40  # HyperPod nodes in the moto cluster: MAX_FRACTION 0.05 then allows 2 open


def iso(moment: datetime) -> str:
    """ISO 8601 UTC as the agent writes it."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def alarm_event(
    *,
    time: datetime,
    cluster: str = CLUSTER,
    metric: str = "sdc_replay_mismatch",
    state: str = "ALARM",
    namespace: str = NAMESPACE,
    alarm_name: str = "sdc-replay-mismatch-hp-test",
    account: str = "123456789012",
    job: str = JOB,
) -> dict[str, Any]:
    """The EventBridge event of one job's contributor of a per-job SDC alarm (a Metrics
    Insights query grouped by JobName) changing state, as CloudWatch sends it."""
    stamp = time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
    scope = (
        {"only_job": contract.CANARY_JOB}
        if job == contract.CANARY_JOB
        else {"except_job": contract.CANARY_JOB}
    )
    return {
        "version": "0",
        "id": "c4c1c1c9-6542-e61b-6ef0-8c4d36933a92",
        "detail-type": "CloudWatch Alarm Contributor State Change",
        "source": "aws.cloudwatch",
        "account": account,
        "time": iso(time),
        "region": REGION,
        "resources": [f"arn:aws:cloudwatch:{REGION}:{account}:alarm:{alarm_name}"],
        "detail": {
            "alarmName": alarm_name,
            "alarmContributor": {"id": "6d442278dba546f6", "attributes": {"JobName": job}},
            "state": {
                "value": state,
                "reason": "Threshold Crossed: 1 datapoint was greater than or equal to the "
                "threshold (1.0). The most recent datapoint which crossed the threshold: [1.0].",
                "timestamp": stamp,
            },
            "configuration": {
                "description": "SDC",
                "metrics": [
                    {
                        "id": "m1",
                        # The canary's alarm reads its own namespace (canary_namespace).
                        "expression": contract.job_alarm_query(
                            contract.canary_namespace(namespace)
                            if job == contract.CANARY_JOB
                            else namespace,
                            metric,
                            cluster,
                            **scope,
                        ),
                        "returnData": True,
                        "period": 60,
                    }
                ],
            },
        },
    }


def rank(
    node: str,
    instance: str | None,
    local_rank: int = 0,
    pod: str | None = None,
    with_node: bool = True,
) -> dict[str, Any]:
    """One entry of a report's ``ranks``."""
    gpu = re.sub(r"[^A-Za-z0-9._:-]", "_", f"GPU-{node}-{local_rank}")
    out: dict[str, Any] = {"gpu_uuid": gpu, "local_rank": local_rank}
    if with_node:
        out["node_name"] = node
    if instance:
        out["instance_id"] = instance
    if pod:
        out["pod_name"] = pod
    return out


def report(
    *,
    time: datetime,
    suspects: list[int] | None,
    ranks: dict[str, dict[str, Any]],
    check: str = "compute",
    step: int = 120,
    cluster: str = CLUSTER,
    job: str = JOB,
    verdicts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An ``sdc.alarm/v1`` report like ``Alarm.to_dict()`` plus cluster, job and time."""
    return {
        "schema": "sdc.alarm/v1",
        "step": step,
        "check": check,
        "nonfinite": [],
        "mismatched_pairs": [[s, (s + 1) % 8] for s in suspects or []],
        "culprits": [],
        "verdicts": verdicts
        if verdicts is not None
        else [
            {"pair": [s, (s + 1) % 8], "third": (s + 2) % 8, "suspect": s, "kind": "persistent"}
            for s in suspects or []
        ],
        "suspects": suspects,
        "suspect_window": [step - 20, step],
        "last_audit_pass": step - 20,
        "last_weight_check_pass": step - 50,
        "divergent_tensors": [],
        "ranks": ranks,
        "metric": {"name": "sdc_replay_mismatch", "value": max(1, len(suspects or []))},
        "cluster": cluster,
        "job": job,
        "time": iso(time),
    }


def put_report(
    logs: Any, group: str, body: dict[str, Any], at: datetime, stream: str = JOB
) -> None:
    """Write a report (or rank map) as the agent does: one JSON log event in stream <JobName>."""
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    logs.put_log_events(
        logGroupName=group,
        logStreamName=stream,
        logEvents=[{"timestamp": int(at.timestamp() * 1000), "message": json.dumps(body)}],
    )


def put_node_metric(
    cw: Any,
    node: str,
    at: datetime,
    value: float = 1.0,
    metric: str = "sdc_replay_mismatch",
    job: str = JOB,
    cluster: str = CLUSTER,
    namespace: str = NAMESPACE,
) -> None:
    """The per-node series, the job series and the cluster series, as the agent publishes
    them (``namespace``: the agent's, unless a test writes the canary's)."""
    cw.put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [
                    {"Name": "ClusterName", "Value": cluster},
                    {"Name": "JobName", "Value": job},
                    {"Name": "NodeName", "Value": node},
                ],
                "Timestamp": at,
                "Value": value,
                "Unit": "Count",
                "StorageResolution": 1,
            },
            {
                "MetricName": metric,
                "Dimensions": [
                    {"Name": "ClusterName", "Value": cluster},
                    {"Name": "JobName", "Value": job},
                ],
                "Timestamp": at,
                "Value": value,
                "Unit": "Count",
                "StorageResolution": 1,
            },
            {
                "MetricName": metric,
                "Dimensions": [{"Name": "ClusterName", "Value": cluster}],
                "Timestamp": at,
                "Value": value,
                "Unit": "Count",
                "StorageResolution": 1,
            },
        ],
    )


def job_pods(k8s: Any, instance_ids: list[str], job: str = JOB) -> None:
    """A pod of ``job`` (its job-name label) on each of these nodes, in the training namespace:
    the cluster's corroboration that the job runs there."""
    for instance_id in instance_ids:
        k8s.add_job_pod(job, f"hyperpod-{instance_id}", TRAINING_NAMESPACE)


def alarm_state(time: datetime | None = None) -> dict[str, Any]:
    """localize's ``alarm`` object."""
    t = time or datetime.now(UTC)
    return {
        "alarm_name": "sdc-replay-mismatch-hp-test",
        "alarm_arn": f"arn:aws:cloudwatch:{REGION}:123456789012:alarm:sdc-replay-mismatch-hp-test",
        "state": "ALARM",
        "reason": "Threshold Crossed",
        "time": iso(t),
        "metric_name": "sdc_replay_mismatch",
        "namespace": NAMESPACE,
        "cluster_name": CLUSTER,
        "window_start": iso(t - timedelta(seconds=600)),
        "window_end": iso(t + timedelta(seconds=120)),
        "job": JOB,
    }


def suspect_state(
    instance_id: str, group: str = "workers", node_name: str | None = None
) -> dict[str, Any]:
    """localize's ``suspect`` object for an instance."""
    node = node_name or f"hyperpod-{instance_id}"
    return {
        "node_name": node,
        "instance_id": instance_id,
        "instance_group": group,
        "job": JOB,
        "ranks": {
            "3": {
                "node_name": node,
                "instance_id": instance_id,
                "gpu_uuid": "GPU-3",
                "local_rank": 3,
            }
        },
        "check": "compute",
        "verdict": "persistent",
        "step": 120,
        "suspect_window": [100, 120],
        "last_audit_pass": 100,
        "last_weight_check_pass": 70,
    }


def item_state(instance_id: str, execution: str = "exec-1", **results: Any) -> dict[str, Any]:
    """A Map item's state: alarm, suspect, execution, plus step results by key."""
    return {
        "alarm": alarm_state(),
        "suspect": suspect_state(instance_id),
        "execution": execution,
        **results,
    }


def held_after_rejection(invoke: Any, instance_id: str, execution: str = "e1") -> dict[str, Any]:
    """Admit a remediation of the node and record a person's rejection: the node stays cordoned
    and the guard holds it until someone releases it. Returns the admission."""
    state = item_state(instance_id, execution=execution)
    state["admission"] = invoke("admit", state)
    invoke("record", {"transition": "rejected", "state": state})
    return state["admission"]


def ledger_item(key: dict[str, Any]) -> dict[str, Any] | None:
    """The ledger's item at ``key`` (built with ``sdc_remediation.dal.keys``), as stored."""
    from sdc_remediation import aws
    from sdc_remediation.dal.dynamo import from_item, to_item

    return from_item(
        aws.client("dynamodb").get_item(TableName=LEDGER, Key=to_item(key)).get("Item")
    )


def grow_cluster(total: int) -> list[str]:
    """Add nodes to the moto HyperPod cluster up to ``total``; all instance ids, in order."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    cluster = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[CLUSTER]
    template = next(iter(cluster.nodes.values()))
    for index in range(len(cluster.nodes), total):
        node = copy.copy(template)
        node.instance_id = f"i-{index + 1:017x}"
        cluster.nodes[node.instance_id] = node
    return list(cluster.nodes)


ALICE = "arn:aws:iam::123456789012:user/alice"


def approved(
    instance_id: str,
    execution: str = "exec-1",
    *,
    approver: str = ALICE,
    decision: str = "approve",
    release: bool = False,
    node_name: str | None = None,
    reason: str = "persistent",
) -> dict[str, Any]:
    """A decision as the approve function makes it: the request stored in the approvals table
    (as request_approval stores it), claimed and sent by ``Approvals.decide`` (SendTaskSuccess
    stubbed). Returns what the workflow then receives in ``$.approval``."""
    from botocore.stub import ANY, Stubber

    from sdc_remediation import aws
    from sdc_remediation.dal.approvals import Approvals

    approvals = Approvals(APPROVALS)
    token = f"token-{execution}-{instance_id}-{len(_TOKENS)}"
    _TOKENS.append(token)
    approval_id, _ = approvals.create(
        task_token=token,
        remediation_id=None,
        instance_id=instance_id,
        node_name=node_name or f"hyperpod-{instance_id}",
        evidence={},
        ttl_seconds=2 * 86400,
        execution=execution,
        timeout_seconds=86400,
    )
    with Stubber(aws.client("stepfunctions")) as sfn:
        sfn.add_response("send_task_success", {}, {"taskToken": token, "output": ANY})
        result = approvals.decide(
            approval_id, decision, release=release, reason=reason, approver=approver
        )
    return result.model_dump()


_TOKENS: list[str] = []
