"""Online-sensor jobs on a model sharded with FSDP2 / HSDP, run on every rank (importable: the
launcher spawns them)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

import sdc_agent as sdc
from sdc_agent.drills.job import make_batch, make_fault, make_loss
from sdc_agent.drills.sharded import ShardedDrillModel, shard
from sdc_agent.sensors import SensorConfig, protect
from tests.agent.sensor_scenarios import SensorCountingPublisher


def sensed_sharded_run(
    *,
    parallel: str,
    steps: int,
    faults: list[dict[str, Any]] = (),
    audit_every: int = 50,
    budget: float = math.inf,
    mixed_precision: bool = False,
) -> dict[str, Any]:
    """Protect the sharded drill model's layers, then shard it (``fully_shard`` per block, then
    the root; HSDP: 3 replicas x 2 shards) and train it guarded (``budget``: the sensors'; by
    default every GEMM and norm is checked on every step).

    Reports the alarm, the updates, the sensor counts, what the protected layer's autograd
    function saw (whether its weight was a DTensor, as FSDP2 keeps it at rest) and whether the
    parameters are still sharded DTensors after training."""
    torch.manual_seed(0)
    module = ShardedDrillModel()
    board = protect(module, config=SensorConfig())  # the defaults, as a user gets them
    fc = module.blocks[1].fc
    seen: list[str] = []

    def note_weight(_module: Any, _args: Any) -> None:
        seen.append(type(fc.weight).__name__)

    fc.register_forward_pre_hook(note_weight)
    model = shard(module, parallel, shards=2, mixed_precision=mixed_precision)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    publisher = SensorCountingPublisher()
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(False),
        rebuild_batch=make_batch,
        schedule=sdc.Schedule(
            audit_every=audit_every,
            check_every=0,
            ckpt_every=0,
            peer_offset=2,
            sensor_budget=budget,
        ),
        publisher=publisher,
    )
    injected = [make_fault(f).attach(guard) for f in faults]
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    alarm = guard.train(make_batch(s, dist.get_rank()) for s in range(steps))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "fired": sum(f.fired for f in injected),
        "unconfirmed": guard.sensors.unconfirmed,
        "published_unconfirmed": publisher.unconfirmed,
        "alarms_published": len(publisher.alarms),
        "coverage": guard.coverage()["checks"]["online_sensors"],
        "checks_run": sum(board.checks),
        "weight_types_in_forward": sorted(set(seen)),
        "sharded_at_rest": type(fc.weight).__name__,
    }
