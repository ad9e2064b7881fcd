"""Accelerate jobs: a prepared DDP or FSDP2 model, ``accelerator.accumulate`` and
``accelerator.backward``, under :class:`sdc_agent.integrations.accelerate.AcceleratorGuard`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import sdc_agent as sdc
from tests.agent.frameworks.common import (
    MLP,
    SCHEDULE,
    CountingPublisher,
    UpdateRecord,
    alarm_dict,
    classification_loss,
    fault,
    micro_batch,
    quiet_environment,
    run_docs_example,
    sink_for,
    step_micro_batches,
    use_cloudwatch,
    weight_flip,
)

ACCUMULATION = 2


def prepared(parallel: str) -> tuple[Any, Any, Any]:
    """(accelerator, model, optimizer) prepared by Accelerate: DDP, or its FSDP2 plugin."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    if parallel == "fsdp2":
        # Accelerate enables FSDP only on accelerators (its state never picks FSDP on
        # MULTI_CPU): give the state what it would hold on GPUs, so that prepare() runs its own
        # FSDP2 path (fully_shard over every rank) on gloo.
        from accelerate import FullyShardedDataParallelPlugin
        from accelerate.utils import DistributedType

        accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        accelerator.state.distributed_type = DistributedType.FSDP
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def train(
    *,
    steps: int,
    parallel: str = "ddp",
    faults: tuple[str, ...] = (),
    ckpt_every: int = 0,
    run_dir: str | None = None,
    resume_from: int | None = None,
    publish: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train the MLP with Accelerate under the guard (``faults``: "forward" x1000 on net.2 of
    rank R from step 7, "weight" a bit flip on rank 0 after step 6); ``resume_from``: load the
    checkpoint of that step from ``run_dir`` first (refused when an alarm covers it: then the
    one sdc.clean_resume_step chooses); ``publish``: CloudWatch (moto) instead of counting.
    Reports what this rank applied and saved."""
    from sdc_agent.integrations.accelerate import AcceleratorGuard

    quiet_environment()
    accelerator, model, optimizer = prepared(parallel)
    counts = CountingPublisher()
    sink = sink_for(publish, counts)
    guard = AcceleratorGuard(
        accelerator,
        model,
        optimizer,
        compute_loss=classification_loss,
        rebuild_batch=lambda step, r: step_micro_batches(step, r, ACCUMULATION),
        schedule=sdc.Schedule(**SCHEDULE, ckpt_every=ckpt_every),
        publisher=sink,
        alarm_dir=run_dir,
    )
    if "forward" in faults:
        fault("net.2").attach(guard.guard)
    if "weight" in faults:
        weight_flip("net.0.weight").attach(guard.guard)
    record = UpdateRecord(guard.guard.optimizer, guard.guard.params).counting(
        lambda: guard.next_step
    )
    refused = None
    if resume_from is not None:
        try:
            guard.load_state(Path(run_dir, f"step-{resume_from}"))
        except sdc.UnsafeResumeError as err:
            refused = str(err)
            resume_from = sdc.clean_resume_step(saved_steps(run_dir), run_dir)
            guard.load_state(Path(run_dir, f"step-{resume_from}"))
    start = guard.next_step
    rank = dist.get_rank()
    saves: list[list[Any]] = []
    alarm = None
    for index in range(start * ACCUMULATION, (start + steps) * ACCUMULATION):
        with guard.accumulate(model):
            guard.backward(classification_loss(model, micro_batch(index, rank)))
            alarm = guard.optimizer_step()
        if alarm:
            break
        if guard.checkpoint_due and run_dir is not None:
            step = guard.next_step - 1
            if alarm := guard.save_state(Path(run_dir, f"step-{step}")):
                break
            saves.append([step, guard.checkpoint_tags()])
    else:
        alarm = guard.finish()
    delivered = sink.flush(30.0)
    return {
        "rank": rank,
        "alarm": alarm_dict(alarm),
        "start": start,
        "refused": refused,
        "saves": saves,
        "delivered": delivered,
        "adamw_steps": adamw_steps(guard.guard.optimizer),
        **record.summary(),
        **counts.counts(),
    }


def saved_steps(run_dir: str) -> list[int]:
    """The steps of the checkpoints in ``run_dir`` (directories ``step-N``)."""
    return sorted(int(p.name.split("-")[1]) for p in Path(run_dir).glob("step-*"))


def adamw_steps(optimizer: torch.optim.Optimizer) -> list[int]:
    """AdamW's own update count of each parameter (its ``step`` state)."""
    return sorted({int(s["step"]) for s in optimizer.state.values()})


def docs_example(*, steps: int, run_dir: str, publish: dict[str, str]) -> dict[str, Any]:
    """docs/integrations.md's Accelerate example, as written, on ``steps`` steps of data."""
    from accelerate import Accelerator

    quiet_environment()
    use_cloudwatch(**publish)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MLP()
    namespace = run_docs_example(
        "accelerate",
        {
            "accelerator": Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION),
            "model": model,
            "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2),
            "loader": [micro_batch(i, rank) for i in range(steps * ACCUMULATION)],
            "compute_loss": classification_loss,
            "rebuild_batch": lambda step, r: step_micro_batches(step, r, ACCUMULATION),
            "CKPT_DIR": run_dir,
        },
    )
    guard = namespace["guard"]
    return {
        "alarm": alarm_dict(namespace["alarm"]),
        "steps_applied": guard.next_step,
        "last_audit_pass": guard.guard.last_audit_pass,
        "delivered": guard.guard.flush(30.0),
    }
