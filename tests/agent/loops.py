"""Jobs for real training loops (accumulation, fp16 + GradScaler, bf16, activation
checkpointing), run on every rank of a multi-process launch (importable: spawned processes)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import sdc_agent as sdc
from sdc_agent.drills.job import DrillModel, make_batch, make_fault
from sdc_agent.fingerprint import fingerprints, table_digest
from sdc_agent.publish.events import alarm_metric_data


class RecordingPublisher:
    """Records what the guard publishes, and the CloudWatch series each alarm would write."""

    def __init__(self) -> None:
        self.alarms: list[dict[str, Any]] = []
        self.per_node_series = 0
        self.cluster_series = 0
        self.audit_passes = 0
        self.weight_check_passes = 0

    def publish_rank_map(self, ranks: dict) -> None:
        pass

    def publish_alarm(self, alarm: sdc.Alarm) -> None:
        self.alarms.append(alarm.to_dict())
        for entry in alarm_metric_data(alarm, "cluster", "job"):
            names = {d["Name"] for d in entry["Dimensions"]}
            if "NodeName" in names:
                self.per_node_series += 1
            elif names == {"ClusterName"}:
                self.cluster_series += 1

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        self.audit_passes += audit_passes
        self.weight_check_passes += weight_check_passes

    def flush(self, timeout: float | None = None) -> bool:
        return True


class CheckpointedDrillModel(DrillModel):
    """The drill model with both halves under non-reentrant activation checkpointing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.net[:3], x, use_reentrant=False)
        return checkpoint(self.net[3:], h, use_reentrant=False)


def make_loss(precision: str):
    """compute_loss(model, batch) under CPU autocast in ``precision`` (fp32: no autocast)."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

    def compute_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
        return F.cross_entropy(logits.float(), y)

    return compute_loss


def step_batch(step: int, rank: int, grad_accum: int, poison: dict[str, int] | None) -> Any:
    """What ``rank`` trains on at ``step``: one batch, or ``grad_accum`` micro-batches; with
    ``poison`` a NaN in the input of that (step, rank), on every GPU that rebuilds it."""
    micros = [make_batch(step, rank, seed=i + 1) for i in range(grad_accum)]
    if poison and (step, rank) == (poison["step"], poison["rank"]):
        micros[0][0][0, 0] = math.nan
    return micros if grad_accum > 1 else micros[0]


def build(
    schedule: dict[str, Any],
    *,
    precision: str = "fp32",
    checkpointing: bool = False,
    init_scale: float | None = None,
    poison: dict[str, int] | None = None,
    publisher: Any = None,
) -> tuple[nn.parallel.DistributedDataParallel, torch.optim.Optimizer, sdc.Guard]:
    """(ddp_model, optimizer, guard), identical initial weights on every rank."""
    torch.manual_seed(0)
    module = CheckpointedDrillModel() if checkpointing else DrillModel()
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    n = schedule.get("grad_accum", 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if init_scale else None
    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=make_loss(precision),
        rebuild_batch=lambda step, rank: step_batch(step, rank, n, poison),
        schedule=sdc.Schedule(**schedule),
        publisher=publisher,
        scaler=scaler,
    )
    return ddp, optimizer, guard


def run(
    *,
    steps: int,
    schedule: dict[str, Any],
    faults: list[dict[str, Any]] = (),  # type: ignore[assignment]
    own_loop: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Train under the guard (its own loop, or the documented owner loop); report."""
    publisher = RecordingPublisher()
    ddp, optimizer, guard = build(schedule, publisher=publisher, **options)
    for spec in faults:
        make_fault(spec).attach(guard)
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    n = guard.schedule.grad_accum
    poison = options.get("poison")
    batches = (step_batch(s, dist.get_rank(), n, poison) for s in range(steps))
    alarm = (
        owner_loop(ddp, optimizer, guard, batches, make_loss(options.get("precision", "fp32")))
        if own_loop
        else guard.train(batches)
    )
    return {
        "rank": dist.get_rank(),
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "scale": guard.scaler.get_scale() if guard.scaler is not None else None,
        "weights": table_digest(fingerprints(list(ddp.module.parameters()))),
        "alarms_published": len(publisher.alarms),
        "per_node_series": publisher.per_node_series,
        "cluster_series": publisher.cluster_series,
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "dp_rank": guard.dp_rank,
    }


def owner_loop(ddp, optimizer, guard, batches, compute_loss) -> sdc.Alarm | None:
    """The README's owner loop with accumulation (and a scaler when the guard has one)."""
    scaler = guard.scaler
    alarm = None
    for step, batch in enumerate(batches):
        micros = batch if guard.schedule.grad_accum > 1 else [batch]
        with guard.step(step) as guarded:
            for micro in guarded.micro_batches(micros):
                guarded.backward(compute_loss(ddp, micro))
            if alarm := guarded.check_gradients():
                break
            if guarded.update_allowed:
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if alarm := guarded.after_update():
                break
    else:
        alarm = guard.finish()
    return alarm


def isolation_changes_no_bit(*, steps: int, grad_accum: int) -> dict[str, Any]:
    """Train twice from the same weights on the same micro-batches: audited every step with the
    audited micro-batch's gradient isolated (every position in turn, the synchronised last one
    included), and audited without isolation (loss-only audits, the same RNG seeding). The
    weights must end bit-identical."""
    digests = []
    for deterministic in (True, False):
        result = run(
            steps=steps,
            schedule={
                "audit_every": 1,
                "deterministic_audits": deterministic,
                "check_every": 0,
                "peer_offset": 2,
                "grad_accum": grad_accum,
            },
        )
        assert result["alarm"] is None, result["alarm"]
        digests.append(result["weights"])
    return {"isolated": digests[0], "plain": digests[1]}


def coverage() -> dict[str, Any]:
    """guard.coverage() for a 6-rank job with N=4 and a GradScaler, and one without audits."""
    _, _, accumulating = build(
        {"audit_every": 10, "check_every": 5, "peer_offset": 2, "grad_accum": 4},
        init_scale=2.0**16,
    )
    _, _, no_audits = build({"audit_every": 0, "check_every": 0, "peer_offset": 2})
    return {"accumulating": accumulating.coverage(), "no_audits": no_audits.coverage()}


def misuse() -> dict[str, Any]:
    """Accumulation steps run wrongly, each on every rank alike: the errors each one raises."""
    ddp, _, guard = build({"audit_every": 1, "peer_offset": 2, "grad_accum": 2})
    compute_loss = make_loss("fp32")
    micros = step_batch(0, dist.get_rank(), 2, None)
    errors = {}
    try:  # three micro-batches for a step of two
        with guard.step(0) as guarded:
            for _ in guarded.micro_batches([*micros, micros[0]]):
                pass
    except ValueError as err:
        errors["count"] = str(err)
    try:  # a plain backward on the DDP model, not through guarded.backward
        with guard.step(0) as guarded:
            compute_loss(ddp, micros[0]).backward()
            guarded.check_gradients()
    except RuntimeError as err:
        errors["plain_backward"] = str(err)
    ddp.zero_grad(set_to_none=True)
    try:  # guarded.backward outside any micro-batch
        with guard.step(1) as guarded:
            guarded.backward(compute_loss(ddp, micros[0]))
    except RuntimeError as err:
        errors["outside"] = str(err)
    return errors
