"""Jobs of the online-sensor tests, run on every rank (importable: the launcher spawns them)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.job import DrillModel, make_batch, make_fault, make_loss
from sdc_agent.sensors import ResidualAdd, SensorConfig, protect
from sdc_agent.sensors.runtime.board import SensorBoard
from sdc_agent.sensors.runtime.plan import plan_sensors, sensor_costs


def x1000_from(layer: str, step: int, *, rank: int, gemm: str = "forward") -> dict[str, Any]:
    """A fault spec: x1000 on one element of a protected GEMM's fp32 result on ``rank``, every
    step from ``step`` on (a GPU that computes wrong and stays wrong)."""
    return x1_1_once(layer, gemm, rank=rank, factor=1000.0, step=step, persistent=True)


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """A digest of the weights and the optimizer's state (momentum buffers): equal digests, the
    same training state, bit for bit."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor):
                h.update(value.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def x1_1_once(layer: str, gemm: str = "forward", *, rank: int, **kw: Any) -> dict[str, Any]:
    """A fault spec: x1.1 on one element of a protected GEMM's (or op's) fp32 result on
    ``rank``, once at step 8 (``kw`` overrides any field: kind, step, persistent, ...)."""
    return {
        "kind": "ScaleGemmElement",
        "layer": layer,
        "gemm": gemm,
        "factor": 1.1,
        "index": 5,
        "rank": rank,
        "step": 8,
        "persistent": False,
        **kw,
    }


class OpsDrillModel(nn.Module):
    """The op families beyond GEMMs in one small model: a LayerNorm, a softmax gate, a residual
    add (written as ``ResidualAdd``) and log-softmax outputs, around three linear layers."""

    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.act = nn.GELU()
        self.mlp = nn.Linear(hidden, hidden)
        self.gate = nn.Softmax(dim=-1)
        self.add = ResidualAdd(hidden)
        self.head = nn.Linear(hidden, classes)
        self.out = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.norm(self.embed(x)))
        h = self.add(h, self.mlp(h) * self.gate(h) * h.shape[-1])
        return self.out(self.head(h))


def ops_loss(autocast_bf16: bool = False) -> Any:
    """compute_loss for :class:`OpsDrillModel` (log-probabilities in, NLL out)."""

    def compute_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            logp = model(x)
        return F.nll_loss(logp.float(), y)

    return compute_loss


class SensorCountingPublisher:
    """Counts alarms, liveness and unconfirmed sensor flags (from DP rank 0 only)."""

    def __init__(self) -> None:
        self.alarms: list[dict[str, Any]] = []
        self.audit_passes = 0
        self.unconfirmed = 0

    def publish_rank_map(self, ranks: dict) -> None:
        pass

    def publish_alarm(self, alarm: sdc.Alarm) -> None:
        self.alarms.append(alarm.to_dict())

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        self.audit_passes += audit_passes

    def publish_unconfirmed_sensor_flags(self, step: int, count: int) -> None:
        self.unconfirmed += count

    def flush(self, timeout: float | None = None) -> bool:
        return True


def _planned_board(*, ops_model: bool, layer_norm: bool) -> SensorBoard:
    """:func:`sensed_run`'s protected model after one step: the board the guard plans from
    (its rows, its device, the function sites the first forward met)."""
    torch.manual_seed(0)
    module = OpsDrillModel() if ops_model else DrillModel()
    if layer_norm:
        module.net[1] = nn.LayerNorm(module.net[1].num_features)
    board = protect(module)
    loss = ops_loss() if ops_model else make_loss()
    loss(module, make_batch(0, 0)).backward()
    return board


def planned_period(budget: float, *, ops_model: bool = False, layer_norm: bool = False) -> int:
    """The sensor period the guard plans for :func:`sensed_run`'s model at ``budget``: the
    same plan (``plan_sensors`` in bursts, at the rows and device the board saw in its first
    step), computed here so that a test's step counts follow the plan's cost model instead of
    a number written down under an older one."""
    board = _planned_board(ops_model=ops_model, layer_norm=layer_norm)
    return plan_sensors(
        board, budget, rows=board.rows, device_type=board.device_type, burst=True
    ).period


def budget_for_period(period: int, *, ops_model: bool = False, layer_norm: bool = False) -> float:
    """The sensor budget at which the guard plans a ``period``-step rotation (in bursts, whose
    period is ``ceil(total cost / budget)``) for :func:`sensed_run`'s model."""
    if period < 2:
        raise ValueError(f"period must be >= 2 (1: every sensor every step), got {period}")
    board = _planned_board(ops_model=ops_model, layer_norm=layer_norm)
    total = sum(sensor_costs(board, rows=board.rows, device_type=board.device_type))
    budget = total / (period - 0.5)
    assert planned_period(budget, ops_model=ops_model, layer_norm=layer_norm) == period
    return budget


def sensed_run(
    *,
    steps: int,
    faults: list[dict[str, Any]] = (),
    audit_every: int = 50,
    budget: float = math.inf,
    config: dict[str, Any] | None = None,
    autocast_bf16: bool = False,
    grad_accum: int = 1,
    layer_norm: bool = False,
    ops_model: bool = False,
) -> dict[str, Any]:
    """Train the protected drill model; report the alarm, updates and sensor counts here.

    ``config``: the sensors' ``SensorConfig`` fields (default: the defaults, as a user gets
    them); ``budget``: ``Schedule.sensor_budget`` (default: every sensor on every step).
    ``digests`` maps each applied step to the digest of the weights and optimizer state after
    it (``-1``: before the first step), and ``final_digest`` is the state at the end.
    With ``grad_accum`` = N > 1 step s trains on micro-batches ``make_batch(s * N + i, rank)``;
    ``layer_norm``: net.1 is an ``nn.LayerNorm`` instead of the drill's BatchNorm;
    ``ops_model``: train :class:`OpsDrillModel` instead."""

    def batch_of(step: int, rank: int) -> Any:
        if grad_accum == 1:
            return make_batch(step, rank)
        return [make_batch(step * grad_accum + i, rank) for i in range(grad_accum)]

    torch.manual_seed(0)
    module = OpsDrillModel() if ops_model else DrillModel()
    if layer_norm:
        module.net[1] = nn.LayerNorm(module.net[1].num_features)
    protect(module, config=SensorConfig(**(config or {})))
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    publisher = SensorCountingPublisher()
    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=ops_loss(autocast_bf16) if ops_model else make_loss(autocast_bf16),
        rebuild_batch=batch_of,
        schedule=sdc.Schedule(
            audit_every=audit_every,
            check_every=0,
            peer_offset=2,
            sensor_budget=budget,
            grad_accum=grad_accum,
        ),
        publisher=publisher,
    )
    injected = [make_fault(f).attach(guard) for f in faults]
    updates: list[int] = []
    digests = {-1: state_digest(module, optimizer)}

    def after_update(*_: Any) -> None:
        updates.append(guard.current_step)
        digests[guard.current_step] = state_digest(module, optimizer)

    optimizer.register_step_post_hook(after_update)
    alarm = guard.train(batch_of(s, dist.get_rank()) for s in range(steps))
    return {
        **sensed_outcome(guard, alarm, updates, injected, publisher),
        "digests": digests,
        "final_digest": state_digest(module, optimizer),
        "last_audit_pass": guard.last_audit_pass,
        "dp_rank": guard.dp_rank,
    }


def sensed_outcome(
    guard: sdc.Guard,
    alarm: sdc.Alarm | None,
    updates: list[int],
    injected: list[Any],
    publisher: SensorCountingPublisher,
) -> dict[str, Any]:
    """What every sensor job reports: the alarm, the steps applied, the faults fired here, the
    unconfirmed candidates (counted and published), the alarms and audit passes published, and
    the sensors' coverage."""
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "fired": sum(f.fired for f in injected),
        "unconfirmed": guard._run.sensors.unconfirmed,
        "published_unconfirmed": publisher.unconfirmed,
        "alarms_published": len(publisher.alarms),
        "audit_passes": publisher.audit_passes,
        "coverage": guard.coverage()["checks"]["online_sensors"],
    }
