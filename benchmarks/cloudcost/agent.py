"""The agent's publishing, measured: one job's DP rank 0 (``CloudWatchPublisher``) against an
in-process moto, with the call counter on its clients.

What the agents' share of the bill is made of: one rank map, a few intervals of liveness, one
alarm naming one node. It needs only the agent package and moto (no synth, no harness), which is
what ``--skip-pipeline`` measures.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from .counting import CallCounter, diff
from .prices import PRICES_REGION


def _rank_infos(nodes: int, gpus_per_node: int) -> dict[int, Any]:
    """Placements named as on HyperPod: 17-hex instance ids, NVIDIA-style GPU UUIDs, Kubeflow
    pod names (their lengths are what the log bytes depend on)."""
    import sdc_agent as sdc

    return {
        rank: sdc.RankInfo(
            rank=rank,
            node_name=f"hyperpod-i-{rank // gpus_per_node:017x}",
            instance_id=f"i-{rank // gpus_per_node:017x}",
            gpu_uuid=f"GPU-{rank:08x}-1c2d-3e4f-5a6b-{rank:012x}",
            local_rank=rank % gpus_per_node,
            pod_name=f"llama-pretrain-worker-{rank // gpus_per_node}",
        )
        for rank in range(nodes * gpus_per_node)
    }


def _culprit_alarm(ranks: dict[int, Any], culprit: int, peer: int) -> Any:
    """A ring-replay alarm naming one rank, as the agent reports one: the culprit mismatches
    both its comparisons (with the rank it replays and the rank replaying it)."""
    import sdc_agent as sdc

    n = len(ranks)
    before, after = (culprit - peer) % n, (culprit + peer) % n
    return sdc.Alarm(
        step=12_000,
        check="compute",
        mismatched_pairs=[(culprit, after), (before, culprit)],
        culprits=[culprit],
        suspects=[culprit],
        suspect_window=(11_990, 12_000),
        last_audit_pass=11_990,
        last_weight_check_pass=11_999,
        ranks={str(r): ranks[r] for r in sorted({culprit, before, after})},
    )


def measure_agent(*, ranks_per_job: int, gpus_per_node: int) -> dict[str, Any]:
    """One job's DP rank 0 publishing to an in-process moto: the rank map of ``ranks_per_job``
    ranks, liveness for a few intervals, and one alarm naming one node."""
    import boto3
    from moto import mock_aws

    from sdc_agent.publish import CloudWatchPublisher, PublishSettings

    counter = CallCounter(default="agent")
    default_interval = PublishSettings.__dataclass_fields__["liveness_interval"].default
    nodes = max(1, ranks_per_job // gpus_per_node)
    ranks = _rank_infos(nodes, gpus_per_node)
    out: dict[str, Any] = {"liveness_interval_s": default_interval, "ranks": len(ranks)}
    with tempfile.TemporaryDirectory() as spool, mock_aws():
        cloudwatch = counter.attach(boto3.client("cloudwatch", region_name=PRICES_REGION))
        logs = counter.attach(boto3.client("logs", region_name=PRICES_REGION))
        # The stack creates the report log group (infra/constructs/reports.py); the agent
        # creates its job's stream on first use.
        logs.create_log_group(logGroupName="/sdc/cost-cluster")

        def publisher(**options: Any) -> Any:
            return CloudWatchPublisher(
                cluster_name="cost-cluster",
                job_name="llama-pretrain",
                spool_dir=spool,
                cloudwatch_client=cloudwatch,
                logs_client=logs,
                **options,
            )

        start = counter.snapshot()
        pub = publisher()
        pub.publish_rank_map(ranks)
        assert pub.flush(60), "rank map not delivered"
        pub.close(5)
        out["rank_map"] = diff(counter.snapshot(), start)["agent"].to_dict()

        # Liveness: the guard calls publish_liveness after every passing step; the sender puts
        # at most one batch per interval. A short interval and steps every few ms show the
        # batching; per hour it is 3600 / the default interval sends of this size.
        interval, run_for = 0.5, 3.0
        start = counter.snapshot()
        pub = publisher(liveness_interval=interval)
        began, step = time.monotonic(), 0
        while time.monotonic() - began < run_for:
            pub.publish_liveness(step, 1, 1 if step % 10 == 0 else 0)
            step += 1
            time.sleep(0.005)
        elapsed = time.monotonic() - began
        pub.close(10)
        live = diff(counter.snapshot(), start)["agent"]
        sends = live.operations["cloudwatch:PutMetricData"]
        out["liveness"] = {
            **live.to_dict(),
            "steps": step,
            "intervals": round(elapsed / interval, 2),
            "sends_per_interval": round(sends / (elapsed / interval), 2),
            "datapoints_per_send": live.datapoints / max(1, sends),
            "series": sorted(f"{m}{dict(d)}" for _, m, d in live.series),
        }

        start = counter.snapshot()
        pub = publisher()
        pub.publish_alarm(_culprit_alarm(ranks, culprit=min(3, len(ranks) - 1), peer=gpus_per_node))
        assert pub.flush(60), "alarm not delivered"
        pub.close(5)
        alarm = diff(counter.snapshot(), start)["agent"]
        out["alarm"] = {
            **alarm.to_dict(),
            "series": sorted(f"{m}{dict(d)}" for _, m, d in alarm.series),
        }
    out["rank_map_bytes_per_rank"] = out["rank_map"]["log_bytes"] / len(ranks)
    return out
