"""Ordinary user mistakes and nondeterministic kernels, run on every rank of a gloo job
(importable: the launcher spawns processes). None of them is a GPU fault: the guard must name
nobody, publish no per-node series, and not crash the job (or stop it with a clear error where
``Schedule(on_setup_error="stop")`` asks for it)."""

from __future__ import annotations

import os
import random
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.job import DrillModel, make_loss, make_step_batch
from sdc_agent.publish.events import alarm_metric_data
from tests.agent.scenarios import SCHEDULE

_noise = random.Random(os.getpid())
"""Randomness outside torch's generator (which the guard seeds for replays): what a kernel
with atomics or autotuning amounts to."""


class NoisyBackward(torch.autograd.Function):
    """Identity forward; a backward that adds tiny noise on every call (flash_attn-like: deterministic
    mode does not govern it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad + _noise.random() * 1e-6


class NoisyUnlessDeterministic(torch.autograd.Function):
    """A backward that adds noise unless deterministic mode is on (an atomics kernel that has a
    deterministic variant)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if torch.are_deterministic_algorithms_enabled():
            return grad
        return grad + _noise.random() * 1e-6


class OpModel(DrillModel):
    """The drill model with one extra op after net.4: ``noisy_backward``, ``noisy_unless_deterministic``,
    ``noisy_forward`` (output noise from outside torch's generator) or ``no_deterministic_kernel``
    (an op that raises under ``torch.use_deterministic_algorithms(True)``: ``put_``, as an MoE
    router's ``histc``/``bincount`` does on CUDA)."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.register_buffer("routed", torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[:5](x)
        if self.op == "noisy_backward":
            h = NoisyBackward.apply(h)
        elif self.op == "noisy_unless_deterministic":
            h = NoisyUnlessDeterministic.apply(h)
        elif self.op == "noisy_forward":
            h = h + _noise.random() * 1e-4
        elif self.op == "no_deterministic_kernel":
            with torch.no_grad():
                self.routed.put_(torch.tensor([0]), h.detach().sum().reshape(1))
        return self.net[5:](h)


class RecordingPublisher:
    """Keeps every report the guard publishes and the per-node series each would write."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.node_series: list[str] = []
        self.metrics: list[str] = []
        self.audits_skipped = 0
        self.audit_passes = 0

    def publish_rank_map(self, ranks: dict) -> None:
        pass

    def publish_alarm(self, alarm: sdc.Alarm) -> None:
        self.reports.append(alarm.to_dict())
        for datum in alarm_metric_data(alarm, "cluster", "job"):
            self.metrics.append(datum["MetricName"])
            for dim in datum["Dimensions"]:
                if dim["Name"] == "NodeName":
                    self.node_series.append(dim["Value"])

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        self.audit_passes += audit_passes

    def publish_audit_skipped(self, step: int, count: int) -> None:
        self.audits_skipped += count

    def flush(self, timeout: float | None = None) -> bool:
        return True


def user_mistake(
    *, mistake: str, steps: int = 12, schedule: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train the drill model under the guard with one user mistake; report what the guard did."""
    node, threads = os.environ.get("NODE_NAME"), torch.get_num_threads()
    if mistake == "uneven_threads" and dist.get_rank() == 3:
        torch.set_num_threads(threads + 1)  # one rank computes its reductions differently
    try:
        return _user_mistake(mistake, steps, schedule)
    finally:  # the launcher runs the next scenario in this process
        torch.set_num_threads(threads)
        if node is not None:
            os.environ["NODE_NAME"] = node


def _user_mistake(mistake: str, steps: int, schedule: dict[str, Any] | None) -> dict[str, Any]:
    schedule = {**SCHEDULE, "sensors": False, **(schedule or {})}
    grad_accum = schedule.get("grad_accum", 1)
    rank = dist.get_rank()
    if mistake == "node_name_unset":
        os.environ.pop("NODE_NAME", None)
    torch.manual_seed(0)
    op = mistake if mistake.startswith(("noisy", "no_deterministic")) else None
    module = OpModel(op) if op else DrillModel()
    ddp = nn.parallel.DistributedDataParallel(module)
    params = ddp.parameters()
    if mistake == "optimizer_on_other_params":
        params = DrillModel().parameters()  # built on another model (a copy made too early)
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    loss_of = make_loss()

    def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        if mistake == "compute_loss_ignores_model":
            return loss_of(ddp, batch)  # a closed-over model instead of the argument
        return loss_of(model, batch)

    def trained_batch(step: int) -> Any:
        if mistake == "unseeded_loader":
            g = torch.Generator().manual_seed(_noise.randrange(1 << 30))
            x = torch.randn(8, 16, generator=g)
            return x, torch.randint(0, 4, (8,), generator=g)
        return make_step_batch(step, rank, grad_accum=grad_accum)

    def rebuild_batch(step: int, target: int) -> Any:
        if mistake == "rebuild_off_by_one":
            return make_step_batch(step + 1, target, grad_accum=grad_accum)
        if mistake == "resume_not_shifted":
            return make_step_batch(step - start, target, grad_accum=grad_accum)
        if mistake == "one_rank_data_bug" and rank == 1:
            return make_step_batch(step, (target + 1) % dist.get_world_size())
        if mistake == "rebuild_raises":
            raise KeyError(f"no batch cached for step {step}")
        if mistake == "wrong_micro_batch_count":
            return make_step_batch(step, target, grad_accum=grad_accum + 1)
        return make_step_batch(step, target, grad_accum=grad_accum)

    start = 5 if mistake == "resume_not_shifted" else 0
    publisher = RecordingPublisher()
    result: dict[str, Any] = {"error_type": None, "message": ""}
    try:
        guard = sdc.Guard(
            ddp,
            optimizer,
            compute_loss=compute_loss,
            rebuild_batch=rebuild_batch,
            schedule=sdc.Schedule(**schedule),
            publisher=publisher,
        )
    except (ValueError, sdc.TopologyError) as err:
        return {**result, "error_type": type(err).__name__, "message": str(err), "built": False}
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    alarm = None
    try:
        alarm = guard.train(
            (trained_batch(s) for s in range(start, start + steps)), start_step=start
        )
    except sdc.AuditSetupError as err:
        result.update(error_type=type(err).__name__, message=str(err))
    coverage = guard.coverage()
    return {
        **result,
        "built": True,
        "alarm": alarm.to_dict() if alarm else None,
        "reports": publisher.reports if guard.dp_rank == 0 else None,
        "node_series": publisher.node_series,
        "metrics": publisher.metrics,
        "audits_skipped": publisher.audits_skipped,
        "audit_passes": publisher.audit_passes,
        "updates": updates,
        "audit": coverage["checks"]["replay_audit"],
        "preflight": coverage["preflight"],
        "dp_rank": guard.dp_rank,
    }


def sharded_mistake(*, parallel: str, mistake: str, steps: int = 8) -> dict[str, Any]:
    """The sharded drill model (FSDP2, HSDP, or tensor parallel with them) with a mistaken
    rebuild_batch: ``off_by_one`` on every rank, or ``one_rank`` (rank 1 rebuilds another rank's
    batch). Replays run in lockstep there; the batch check must still name nobody."""
    from sdc_agent.drills.job import build_sharded, build_tp, make_batch
    from sdc_agent.drills.tp import TP_KINDS, tp_batches

    schedule = {**SCHEDULE, "sensors": False}
    publisher = RecordingPublisher()
    build = build_tp if parallel in TP_KINDS else build_sharded
    _, optimizer, guard = build(schedule, parallel=parallel, publisher=publisher)
    rebuild = guard.rebuild_batch
    rank, world = dist.get_rank(), dist.get_world_size()

    def mistaken(step: int, target: int) -> Any:
        if mistake == "off_by_one":
            return rebuild(step + 1, target)
        if rank == 1:
            return rebuild(step, (target + 2) % world)  # another TP group's batch under TP
        return rebuild(step, target)

    guard.rebuild_batch = mistaken
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))

    def batch(step: int) -> Any:
        return tp_batches(step, rank, tp=2) if parallel in TP_KINDS else make_batch(step, rank)

    alarm = guard.train(batch(s) for s in range(steps))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "reports": publisher.reports if guard.dp_rank == 0 and rank == 0 else None,
        "node_series": publisher.node_series,
        "metrics": publisher.metrics,
        "updates": updates,
        "audit": guard.coverage()["checks"]["replay_audit"],
        "dp_rank": guard.dp_rank if rank == 0 else -1,
        "error_type": None,
    }


def pipeline_mistake(*, mistake: str, steps: int = 12) -> dict[str, Any]:
    """The drill's pipeline (3 replicas x 2 stages, HSDP) with a rebuild_batch that raises at
    every audit (``rebuild_raises``): the pipeline's audits must count the skips and turn
    themselves off loudly, as the data-parallel audit does."""
    from sdc_agent.drills.pipeline import build_pipeline, make_feed

    schedule = {**SCHEDULE, "peer_offset": 1}
    publisher = RecordingPublisher()
    _, _, optimizer, guard = build_pipeline(schedule, publisher=publisher)
    if mistake != "rebuild_raises":
        raise ValueError(f"unknown pipeline mistake {mistake!r}")

    def raising(step: int, target: int) -> Any:
        raise KeyError(f"no batch cached for step {step}")

    guard.rebuild_batch = raising
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    rank = dist.get_rank()
    alarm = guard.train(make_feed(s, rank) for s in range(steps))
    return {
        "alarm": alarm.to_dict() if alarm else None,
        "reports": publisher.reports if rank == 0 else None,
        "node_series": publisher.node_series,
        "metrics": publisher.metrics,
        "updates": updates,
        "audit": guard.coverage()["checks"]["replay_audit"],
        "dp_rank": 0 if rank == 0 else -1,
        "audits_skipped": publisher.audits_skipped,
        "audit_passes": publisher.audit_passes,
        "error_type": None,
    }
