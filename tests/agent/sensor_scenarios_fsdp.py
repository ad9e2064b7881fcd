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
from sdc_agent.drills.tp import TP_KINDS, TPDrillModel, parallelize, tp_batches
from sdc_agent.fingerprint import fingerprints, table_digest
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
    the root; HSDP: 3 replicas x 2 shards; ``tp`` / ``fsdp+tp``: the tensor-parallel drill
    model, column- and row-parallel in TP groups of 2, then sharded) and train it guarded
    (``budget``: the sensors'; by default every GEMM and norm is checked on every step).

    Reports the alarm, the updates, the sensor counts, what the protected layer's autograd
    function saw (whether its weight was a DTensor, as FSDP2 keeps it at rest) and whether the
    parameters are still sharded DTensors after training."""
    torch.manual_seed(0)
    tensor_parallel = parallel in TP_KINDS
    module = TPDrillModel() if tensor_parallel else ShardedDrillModel()
    board = protect(module, config=SensorConfig())  # the defaults, as a user gets them
    fc = module.blocks[1].up if tensor_parallel else module.blocks[1].fc
    seen: list[str] = []

    def note_weight(_module: Any, _args: Any) -> None:
        seen.append(type(fc.weight).__name__)

    fc.register_forward_pre_hook(note_weight)
    if tensor_parallel:  # protect() before parallelize_module: the layers stay nn.Linear
        model = parallelize(module, parallel, tp=2, mixed_precision=mixed_precision)
    else:
        model = shard(module, parallel, shards=2, mixed_precision=mixed_precision)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    publisher = SensorCountingPublisher()

    def batch_of(step: int, rank: int) -> Any:
        return tp_batches(step, rank, tp=2) if tensor_parallel else make_batch(step, rank)

    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(False),
        rebuild_batch=batch_of,
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
    alarm = guard.train(batch_of(s, dist.get_rank()) for s in range(steps))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "fired": sum(f.fired for f in injected),
        "unconfirmed": guard._run.sensors.unconfirmed,
        "published_unconfirmed": publisher.unconfirmed,
        "alarms_published": len(publisher.alarms),
        "coverage": guard.coverage()["checks"]["online_sensors"],
        "checks_run": sum(board.checks),
        "weight_types_in_forward": sorted(set(seen)),
        "sharded_at_rest": type(fc.weight).__name__,
    }


def protected_tp_matches_unprotected(*, steps: int, sequence_parallel: bool) -> dict[str, Any]:
    """Train the tensor-parallel drill model (HSDP x TP, fp32) for ``steps`` steps unprotected
    and protected (``protect`` before ``parallelize_module``; no guard, so no sensor checks:
    the protected layers still take their local path); returns both runs' final slice digests
    and losses."""
    runs = []
    for protected in (False, True):
        torch.manual_seed(0)
        module = TPDrillModel()
        if protected:
            protect(module)
        model = parallelize(module, "tp", tp=2, sequence_parallel=sequence_parallel)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        compute_loss = make_loss(False)
        losses = []
        for step in range(steps):
            torch.manual_seed(step)
            loss = compute_loss(model, tp_batches(step, dist.get_rank(), tp=2))
            loss.backward()
            losses.append(loss.item())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        digest = table_digest(fingerprints([p.to_local() for p in model.parameters()]))
        runs.append({"digest": digest, "losses": losses})
    return {"unprotected": runs[0], "protected": runs[1]}
