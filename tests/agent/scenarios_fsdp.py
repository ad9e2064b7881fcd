"""FSDP2 / HSDP (and tensor parallel composed with them) jobs the multi-process tests run on
every rank (importable by the launcher)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import sdc_agent as sdc
from sdc_agent.checks.replay.environment import step_seed
from sdc_agent.drills.job import build_sharded, build_tp, make_batch, make_fault, make_loss
from sdc_agent.drills.sharded import ShardedDrillModel, shard
from sdc_agent.drills.tp import TP_KINDS, tp_batches
from sdc_agent.fingerprint import fingerprints, table_digest
from tests.agent import loops
from tests.agent.loops import RecordingPublisher
from tests.agent.scenarios import CountingPublisher


def _build(parallel: str, schedule: dict[str, Any], **options: Any) -> tuple[Any, Any, Any]:
    """(model, optimizer, guard): the sharded drill model, or the tensor-parallel one (TP
    groups of 2 ranks) for ``parallel`` in ``TP_KINDS``."""
    if parallel in TP_KINDS:
        return build_tp(schedule, parallel=parallel, **options)
    options.pop("sequence_parallel", None)
    return build_sharded(schedule, parallel=parallel, **options)


def _batch(parallel: str, step: int, rank: int) -> Any:
    """``rank``'s micro-batch at ``step`` for ``parallel``'s drill model."""
    return tp_batches(step, rank, tp=2) if parallel in TP_KINDS else make_batch(step, rank)


def long_clean_run(
    *, parallel: str, steps: int, schedule: dict[str, Any], sequence_parallel: bool = False
) -> dict[str, Any]:
    """Train without faults (bf16 autocast, activation checkpointing); count the checks.
    ``sequence_parallel``: the tensor-parallel model's sequence-parallel plan."""
    publisher = CountingPublisher()
    _, _, guard = _build(
        parallel,
        schedule,
        autocast_bf16=True,
        activation_checkpointing=True,
        publisher=publisher,
        sequence_parallel=sequence_parallel,
    )
    saves: list[dict[str, Any]] = []
    alarm = guard.train(
        (_batch(parallel, s, dist.get_rank()) for s in range(steps)),
        save_checkpoint=lambda s, tags: saves.append(tags),
    )
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "alarms_published": len(publisher.alarms),
        "saves": saves,
        "rank": dist.get_rank(),
        "weight_redundancy": guard._run.parallel.weight_redundancy,
        "coverage_facts": guard._run.parallel.coverage_facts(),
        "coverage": guard.coverage(),
    }


def replays_leave_training_unchanged(
    *, parallel: str, steps: int, mixed_precision: bool = False
) -> dict[str, Any]:
    """Train the same steps twice from the same weights: audited every step, and not audited
    (seeding each step as an audit step is seeded). Returns both runs' final shard digests.
    ``mixed_precision``: FSDP2's bf16-parameter / float32-reduction policy."""
    digests = []
    for audit_every in (1, 0):
        model, optimizer, guard = _build(
            parallel,
            {"audit_every": audit_every, "check_every": 0, "peer_offset": 2},
            mixed_precision=mixed_precision,
        )
        compute_loss = make_loss()
        for step in range(steps):
            with guard.step(step) as guarded:
                if audit_every == 0:  # the RNG an audit step runs with, without the audit
                    torch.manual_seed(
                        step_seed(step, guard._run.parallel.seed_rank(dist.get_rank()))
                    )
                loss = compute_loss(model, _batch(parallel, step, dist.get_rank()))
                loss.backward()
                assert guarded.check_gradients(loss) is None
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                assert guarded.after_update() is None
        assert guard.finish() is None
        assert guard.last_audit_pass == (steps - 1 if audit_every else None)
        digests.append(table_digest(fingerprints([p.to_local() for p in model.parameters()])))
    return {"audited": digests[0], "unaudited": digests[1]}


def unsupported_mesh() -> dict[str, Any]:
    """A 2-D mesh whose dimensions are not named ("replicate", "shard"): refused at construction."""
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    model = ShardedDrillModel()
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        sdc.Guard(
            model,
            optimizer,
            compute_loss=make_loss(),
            rebuild_batch=make_batch,
            schedule=sdc.Schedule(peer_offset=2),
        )
    except ValueError as err:
        return {"error_type": type(err).__name__, "message": str(err)}
    return {"error_type": None, "message": ""}


def fp16_run(
    *,
    parallel: str,
    steps: int,
    schedule: dict[str, Any],
    init_scale: float,
    faults: list[dict[str, Any]] = (),  # type: ignore[assignment]
    own_loop: bool = False,
) -> dict[str, Any]:
    """Train the sharded drill model in fp16 autocast with a GradScaler starting at
    ``init_scale`` (guard.train, or the README's owner loop); report what each rank did."""
    publisher = RecordingPublisher()
    torch.manual_seed(0)
    model = shard(ShardedDrillModel(), parallel, shards=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    n = schedule.get("grad_accum", 1)
    compute_loss = loops.make_loss("fp16")
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=compute_loss,
        rebuild_batch=lambda step, rank: loops.step_batch(step, rank, n, None),
        schedule=sdc.Schedule(**schedule),
        publisher=publisher,
        scaler=torch.amp.GradScaler("cpu", init_scale=init_scale),
    )
    for spec in faults:
        make_fault(spec).attach(guard)
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    batches = (loops.step_batch(s, dist.get_rank(), n, None) for s in range(steps))
    alarm = (
        loops.owner_loop(model, optimizer, guard, batches, compute_loss)
        if own_loop
        else guard.train(batches)
    )
    full = [p.full_tensor() for p in model.parameters()]  # collective: every rank's replica
    return {
        "rank": dist.get_rank(),
        "dp_rank": guard.dp_rank,
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "scale": guard.scaler.get_scale() if guard.scaler is not None else None,
        "weights": table_digest(fingerprints(full)),
        "alarms_published": len(publisher.alarms),
        "per_node_series": publisher.per_node_series,
        "cluster_series": publisher.cluster_series,
        "audit_passes": publisher.audit_passes,
        "precision": guard.coverage()["precision"],
    }
