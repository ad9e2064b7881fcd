"""The drill job: a small model trained under the guard, with faults injected on one rank.

Every rank of a drill runs :func:`train_drill` (started by :mod:`.launch`, from the CLI
``python -m sdc_agent.drill`` or from the tests): it builds the model (DDP, or FSDP2/HSDP with
:mod:`.sharded`), the optimizer and the guard, attaches the fault injectors of :mod:`.faults`,
trains and reports what the guard caught on that rank. The batches are pure functions of (step,
rank), so any rank can rebuild any other's (``rebuild_batch``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import checkpoints
from . import tp as tp_drill
from .batches import make_batch
from .pipeline import build_pipeline, make_feed
from .sharded import ShardedDrillModel, shard


class DrillModel(nn.Module):
    """A small MLP with the parts that make replays hard: BatchNorm buffers and dropout."""

    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 4) -> None:
        """Layers: net.0 Linear, net.1 BatchNorm1d, net.2 GELU, net.3 Dropout, net.4 Linear,
        net.5 GELU, net.6 Linear."""
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.BatchNorm1d(hidden),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        return self.net(x)


def make_step_batch(step: int, rank: int, *, seed: int = 0, grad_accum: int = 1) -> Any:
    """What ``rank`` trains on at ``step``: :func:`make_batch`'s micro-batch, or with
    ``grad_accum`` > 1 a list of that many distinct micro-batches (what ``rebuild_batch``
    returns too)."""
    if grad_accum == 1:
        return make_batch(step, rank, seed=seed)
    return [make_batch(step * grad_accum + i, rank, seed=seed) for i in range(grad_accum)]


def make_loss(autocast_bf16: bool = False) -> Callable[[nn.Module, Any], torch.Tensor]:
    """compute_loss(model, batch) for the drill model (optionally under CPU bf16 autocast)."""

    def compute_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            logits = model(x)
        if logits.dim() > 2:  # per token (the tensor-parallel drill model's sequences)
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        return F.cross_entropy(logits.float(), y)

    return compute_loss


def build(
    schedule: dict[str, Any],
    *,
    seed: int = 0,
    autocast_bf16: bool = False,
    publisher: Any = None,
    state: dict[str, Any] | None = None,
    alarm_dir: str | None = None,
) -> tuple[Any, Any, Any]:
    """(ddp_model, optimizer, guard) for the drill model, identical initial weights on all ranks.

    ``state``: a checkpoint (``{"model", "optimizer", ...}``) to load before the guard is built,
    the same on every rank; ``alarm_dir``: the guard's alarm log (``Guard(alarm_dir=...)``).
    """
    torch.manual_seed(seed)
    module = DrillModel()
    if state is not None:
        module.load_state_dict(state["model"])
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer, guard = guarded_sgd(
        ddp,
        schedule,
        seed=seed,
        autocast_bf16=autocast_bf16,
        publisher=publisher,
        optimizer_state=None if state is None else state["optimizer"],
        alarm_dir=alarm_dir,
    )
    return ddp, optimizer, guard


def guarded_sgd(
    model: nn.Module,
    schedule: dict[str, Any],
    *,
    seed: int,
    autocast_bf16: bool,
    publisher: Any,
    scaler: Any = None,
    optimizer_state: dict[str, Any] | None = None,
    alarm_dir: str | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, guard) for a wrapped drill model (DDP or FSDP2): SGD with momentum and a
    guard that rebuilds any rank's batch from (step, rank, ``seed``).

    ``optimizer_state``: a checkpoint's optimizer state, loaded before the guard is built;
    ``alarm_dir``: where the guard records its alarms and checks a resume (None: nowhere).
    """
    import sdc_agent as sdc

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(autocast_bf16),
        rebuild_batch=lambda step, rank: make_step_batch(
            step, rank, seed=seed, grad_accum=schedule.get("grad_accum", 1)
        ),
        # The drill model is not protected (the drills exercise checks 1-3; the sensor drills
        # protect their own models): sensors off unless asked, so the guard does not warn
        # that nothing is protected.
        schedule=sdc.Schedule(**{"sensors": False, **schedule}),
        publisher=publisher,
        scaler=scaler,
        alarm_dir=alarm_dir,
    )
    return optimizer, guard


def build_sharded(
    schedule: dict[str, Any],
    *,
    parallel: str,
    shards: int = 2,
    seed: int = 0,
    autocast_bf16: bool = False,
    activation_checkpointing: bool = False,
    mixed_precision: bool = False,
    publisher: Any = None,
    scaler: Any = None,
) -> tuple[Any, Any, Any]:
    """(fsdp_model, optimizer, guard) for the sharded drill model, identical initial weights.

    ``schedule``: ``sdc_agent.Schedule``'s keywords (with ``grad_accum`` > 1 ``rebuild_batch``
    returns the step's micro-batches, :func:`make_step_batch`); ``scaler``: passed to the guard
    as is."""
    torch.manual_seed(seed)
    model = shard(
        ShardedDrillModel(activation_checkpointing=activation_checkpointing),
        parallel,
        shards=shards,
        mixed_precision=mixed_precision,
    )
    optimizer, guard = guarded_sgd(
        model, schedule, seed=seed, autocast_bf16=autocast_bf16, publisher=publisher, scaler=scaler
    )
    return model, optimizer, guard


def build_tp(
    schedule: dict[str, Any],
    *,
    parallel: str = "tp",
    tp: int = 2,
    seed: int = 0,
    autocast_bf16: bool = False,
    activation_checkpointing: bool = False,
    sequence_parallel: bool = False,
    mixed_precision: bool = False,
    publisher: Any = None,
    scaler: Any = None,
) -> tuple[Any, Any, Any]:
    """(model, optimizer, guard) for the tensor-parallel drill model (:mod:`.tp`): ``parallel``
    ``tp`` (HSDP x TP) or ``fsdp+tp``, TP groups of ``tp`` consecutive ranks, identical initial
    weights; ``rebuild_batch(step, rank)`` returns ``rank``'s TP group's micro-batch."""
    import sdc_agent as sdc

    torch.manual_seed(seed)
    model = tp_drill.parallelize(
        tp_drill.TPDrillModel(activation_checkpointing=activation_checkpointing),
        parallel,
        tp=tp,
        sequence_parallel=sequence_parallel,
        mixed_precision=mixed_precision,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grad_accum = schedule.get("grad_accum", 1)
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(autocast_bf16),
        rebuild_batch=lambda step, rank: tp_drill.tp_batches(
            step, rank, tp=tp, seed=seed, grad_accum=grad_accum
        ),
        # Unprotected, as the other drill models (a pipeline runs no sensors at all): sensors off
        # unless asked, so the guard does not warn that nothing is protected.
        schedule=sdc.Schedule(**{"sensors": False, **schedule}),
        publisher=publisher,
        scaler=scaler,
    )
    return model, optimizer, guard


def make_fault(spec: dict[str, Any]) -> Any:
    """A fault injector from ``{"kind": "ScaleOutputElement", ...keyword arguments}``."""
    from . import faults

    spec = dict(spec)
    kind = spec.pop("kind")
    if kind not in faults.__all__:
        raise ValueError(f"unknown fault kind {kind!r}; choose from {sorted(faults.__all__)}")
    return getattr(faults, kind)(**spec)


def train_drill(
    *,
    steps: int,
    schedule: dict[str, Any],
    faults: Sequence[dict[str, Any]] = (),
    seed: int = 0,
    autocast_bf16: bool = False,
    start_step: int = 0,
    publisher: dict[str, Any] | None = None,
    parallel: str = "ddp",
    shards: int = 2,
    activation_checkpointing: bool = False,
    sequence_parallel: bool = False,
    run_dir: str | None = None,
    resume: bool = False,
    pipeline_data: str = "hsdp",
    pipeline_schedule: str = "gpipe",
) -> dict[str, Any]:
    """Train the drill model for ``steps`` steps under the guard; report what happened here.

    ``publisher``: keyword arguments of ``sdc_agent.publish.CloudWatchPublisher`` to publish
    to CloudWatch (or an endpoint such as the local demo's); None publishes nothing.
    ``parallel``: ``ddp`` (the default), or ``fsdp`` / ``hsdp`` (FSDP2, ``shards`` ranks per
    replica under HSDP; ``activation_checkpointing`` applies to the sharded model's blocks),
    ``tp`` / ``fsdp+tp`` (tensor parallel in groups of ``shards`` ranks, composed with HSDP or
    FSDP2: :mod:`.tp`; ``sequence_parallel``: torchtitan's sequence-parallel plan), or
    ``pp`` (2 pipeline stages per replica, :mod:`.pipeline`: each stage sharded over the
    replicas as ``pipeline_data``, ``fsdp`` or ``hsdp`` with ``shards`` ranks per shard
    group, driven by ``pipeline_schedule``, ``gpipe`` or ``1f1b``; ``peer_offset`` then counts
    replicas), or ``3d`` (the same pipeline with TP groups of ``shards`` ranks inside each stage,
    each stage a whole copy per replica under ``pipeline_data="hsdp"``: TP x PP x HSDP;
    ``peer_offset`` counts pipelines, ``shards`` per replica).
    ``run_dir`` (DDP only): rank 0 saves each due checkpoint there with the guard's tags
    (:mod:`.checkpoints`), and the guard records its alarms there
    (``alarm_dir``). ``resume``: the restart after a stop: load the checkpoint of ``run_dir``
    that ``sdc.clean_resume_step`` chooses and start after it (``start_step`` must then be 0;
    no clean checkpoint: the initial weights from step 0); the guard refuses a checkpoint inside
    a recorded alarm's window and verifies the loaded weights before the first step. The
    decision is reported under ``"resume"``.
    """
    if run_dir is not None and parallel != "ddp":
        raise ValueError(
            f"run_dir: the drill saves checkpoints with parallel='ddp' only, not {parallel!r}"
        )
    if resume and (run_dir is None or start_step != 0):
        raise ValueError("resume: needs run_dir, and chooses start_step itself (leave it 0)")
    sink = None
    if publisher is not None:
        from ..publish import CloudWatchPublisher

        sink = CloudWatchPublisher(**publisher)
    decision: dict[str, Any] | None = None
    state = None
    if resume:
        assert run_dir is not None  # resume needs run_dir: checked above
        decision = checkpoints.choose_resume(run_dir)
        state = decision.pop("state")
        start_step = 0 if decision["step"] is None else decision["step"] + 1
        decision["loaded_tags"] = None if state is None else state["sdc"]
    tp = parallel in tp_drill.TP_KINDS
    # 3d: TP groups of ``shards`` ranks inside each pipeline stage, one shard per HSDP replica.
    pipeline_tp = shards if parallel == "3d" else 1
    if parallel in ("pp", "3d"):
        _, _, optimizer, guard = build_pipeline(
            schedule,
            data=pipeline_data,
            shards=1 if parallel == "3d" else shards,
            tp=pipeline_tp,
            pipeline=pipeline_schedule,
            seed=seed,
            autocast_bf16=autocast_bf16,
            activation_checkpointing=activation_checkpointing,
            publisher=sink,
        )
    elif parallel == "ddp":
        _, optimizer, guard = build(
            schedule,
            seed=seed,
            autocast_bf16=autocast_bf16,
            publisher=sink,
            state=state,
            alarm_dir=run_dir,
        )
    elif tp:
        _, optimizer, guard = build_tp(
            schedule,
            parallel=parallel,
            tp=shards,
            seed=seed,
            autocast_bf16=autocast_bf16,
            activation_checkpointing=activation_checkpointing,
            sequence_parallel=sequence_parallel,
            publisher=sink,
        )
    else:
        _, optimizer, guard = build_sharded(
            schedule,
            parallel=parallel,
            shards=shards,
            seed=seed,
            autocast_bf16=autocast_bf16,
            activation_checkpointing=activation_checkpointing,
            publisher=sink,
        )
    injected = [make_fault(f).attach(guard) for f in faults]
    updates: list[int | None] = []
    # The weight check the guard ran before the first step (Schedule.check_on_start), as it
    # stood at the first update: no periodic check has run by then.
    on_start: list[int | None] = []

    def after_update(*_: Any) -> None:
        if not updates:
            on_start.append(guard.last_weight_check_pass)
        updates.append(guard.current_step)

    optimizer.register_step_post_hook(after_update)
    saves: list[list[Any]] = []

    def save(step: int, tags: dict[str, Any]) -> None:
        saves.append([step, tags])
        if run_dir is not None and dist.get_rank() == 0:
            checkpoints.save_checkpoint(run_dir, step, guard.module, optimizer, tags)

    grad_accum = guard.schedule.grad_accum
    batches = (
        tp_drill.tp_batches(s, dist.get_rank(), tp=shards, seed=seed, grad_accum=grad_accum)
        if tp
        else make_feed(s, dist.get_rank(), seed=seed, grad_accum=grad_accum, tp=pipeline_tp)
        if parallel in ("pp", "3d")
        else make_step_batch(s, dist.get_rank(), seed=seed, grad_accum=grad_accum)
        for s in range(start_step, start_step + steps)
    )
    alarm = guard.train(batches, save_checkpoint=save, start_step=start_step)
    delivered = guard.flush(30.0) if sink is not None else True
    if decision is not None:
        decision["start_step"] = start_step
        decision["weights_verified_on_start"] = bool(on_start) and on_start[0] == start_step
    return {
        "delivered": delivered,
        "rank": dist.get_rank(),
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "saves": saves,
        "fired": sum(f.fired for f in injected),
        "last_audit_pass": guard.last_audit_pass,
        "last_weight_check_pass": guard.last_weight_check_pass,
        "resume": decision,
    }
