"""Pipeline-parallel jobs the multi-process tests run on every rank (importable by the launcher).

The drill's pipeline (:mod:`sdc_agent.drills.pipeline`): 3 replicas (one per simulated node) x 2
stages; each stage sharded with FSDP2 over the replicas (HSDP with one shard per group, so each
replica holds a whole copy of its stage, or full sharding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sdc_agent.checks.replay.environment import step_seed
from sdc_agent.drills.pipeline import build_pipeline, make_feed
from sdc_agent.fingerprint import fingerprints, table_digest
from tests.agent.scenarios import CountingPublisher


def long_clean_run(*, steps: int, schedule: dict[str, Any], tp: int = 1) -> dict[str, Any]:
    """Train the pipeline without faults (bf16 autocast, activation checkpointing; ``tp`` > 1:
    TP groups of ``tp`` ranks inside each stage); count the checks that ran and passed, and
    say what guard.coverage() reports."""
    publisher = CountingPublisher()
    _, _, optimizer, guard = build_pipeline(
        schedule, autocast_bf16=True, activation_checkpointing=True, publisher=publisher, tp=tp
    )
    updates: list[int | None] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    saves: list[dict[str, Any]] = []
    alarm = guard.train(
        (make_feed(s, dist.get_rank(), tp=tp) for s in range(steps)),
        save_checkpoint=lambda s, tags: saves.append(tags),
    )
    return {
        "rank": dist.get_rank(),
        "alarm": alarm.to_dict() if alarm else None,
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "alarms_published": len(publisher.alarms),
        "saves": saves,
        "updates": updates,
        "coverage": guard.coverage(),
    }


def replays_leave_training_unchanged(*, steps: int, data: str) -> dict[str, Any]:
    """Train the same steps twice from the same weights: audited every step, and not audited
    (each step seeded as an audit step is). Returns both runs' final shard digests and the
    audited run's last audit pass."""
    digests, last_pass = [], None
    for audit_every in (1, 0):
        module, _, optimizer, guard = build_pipeline(
            {"audit_every": audit_every, "check_every": 0, "peer_offset": 1}, data=data
        )
        for step in range(steps):
            with guard.step(step) as guarded:
                if audit_every == 0:  # the RNG an audit step runs with, without the audit
                    torch.manual_seed(step_seed(step, dist.get_rank()))
                guarded.run_pipeline(make_feed(step, dist.get_rank()))
                assert guarded.check_gradients() is None
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                assert guarded.after_update() is None
        assert guard.finish() is None
        last_pass = last_pass if audit_every == 0 else guard.last_audit_pass
        digests.append(table_digest(fingerprints([p.to_local() for p in module.parameters()])))
    return {"audited": digests[0], "unaudited": digests[1], "last_audit_pass": last_pass}
