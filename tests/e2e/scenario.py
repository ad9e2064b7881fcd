"""Steps the end-to-end scenarios and the demo share: raise an alarm, decide an approval."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

import sdc_agent as sdc
from tests.e2e.harness.account import Cluster
from tests.e2e.harness.pipeline import LocalPipeline


def local_cluster(nodes: int = 6, *, job: str = "llama-pretrain") -> Cluster:
    """A HyperPod cluster of ``nodes`` instances, named like the demo's DDP job names them."""
    return Cluster(
        hyperpod_name="sdc-local",
        eks_name="sdc-local-eks",
        instance_ids=[f"i-{n:017x}" for n in range(nodes)],
        job=job,
    )


def rank_info(cluster: Cluster, rank: int) -> sdc.RankInfo:
    """Where global ``rank`` runs in ``cluster`` (2 ranks per node)."""
    instance = cluster.instance_ids[rank // cluster.ranks_per_node]
    return sdc.RankInfo(
        rank=rank,
        node_name=cluster.node_name(instance),
        instance_id=instance,
        gpu_uuid=f"GPU-{rank:08x}",
        local_rank=rank % cluster.ranks_per_node,
        pod_name=cluster.pod_name(rank),
    )


def culprit_alarm(cluster: Cluster, ranks: list[int], step: int = 120) -> sdc.Alarm:
    """A ring-replay alarm naming ``ranks`` as culprits, as the agent reports it."""
    return sdc.Alarm(
        step=step,
        check="compute",
        mismatched_pairs=[(r, r - 2) for r in ranks] + [(r + 2, r) for r in ranks],
        culprits=list(ranks),
        suspects=sorted(ranks),
        suspect_window=(step - 10, step),
        last_audit_pass=step - 10,
        last_weight_check_pass=step - 1,
        ranks={str(r): rank_info(cluster, r) for r in ranks},
    )


def raise_alarm(pipeline: LocalPipeline, alarm: sdc.Alarm, spool_dir: str) -> str:
    """Publish ``alarm`` like the job would, evaluate the alarms; returns the execution ARN."""
    pipeline.publish(alarm, spool_dir=spool_dir)
    fired = pipeline.evaluator.evaluate()
    if len(fired) != 1:
        raise AssertionError(f"expected one alarm state change, got {len(fired)}")
    return pipeline.executions[-1]


def pending_for(pipeline: LocalPipeline, execution: str, timeout: float = 180.0) -> str:
    """Wait until ``execution`` asks for approval; returns the approval id."""

    def find() -> str | None:
        if pipeline.execution(execution)["status"] != "RUNNING":
            raise AssertionError(
                f"execution ended before asking for approval: {pipeline.execution(execution)}"
            )
        for item in pipeline.pending_approvals():
            if execution in json.dumps(item):
                return item["approval_id"]["S"]
        return None

    return pipeline.wait(find, timeout, "the approval request")


def operator(pipeline: LocalPipeline, *args: str) -> tuple[int, str]:
    """Run the operator CLI (``sdc-remediation ...``) against the embedded AWS.

    The tables go as options, not as environment: CliRunner would write its ``env`` into
    os.environ while the workflow's threads read it.
    """
    from sdc_remediation.cli import main

    result = CliRunner().invoke(main, [*pipeline.cli_options(), *args])
    return result.exit_code, result.output


def ended_states(pipeline: LocalPipeline, execution: str) -> list[str]:
    """Names of the states the execution entered, in order."""
    return [
        e["stateEnteredEventDetails"]["name"]
        for e in pipeline.history(execution)
        if "stateEnteredEventDetails" in e
    ]


def recorded(pipeline: LocalPipeline) -> list[dict[str, Any]]:
    """What the record step was asked to record (transition and notify), in order."""
    return [
        {"transition": c.payload.get("transition"), "notify": c.payload.get("notify")}
        for c in pipeline.invocations
        if c.folder == "record"
    ]
