"""Accelerate jobs: a prepared DDP or FSDP2 model, ``accelerator.accumulate`` and
``accelerator.backward``, under :class:`sdc_agent.integrations.accelerate.AcceleratorGuard`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import sdc_agent as sdc
from sdc_agent.integrations import read_tags
from tests.agent.frameworks.common import (
    MLP,
    SCHEDULE,
    CountingPublisher,
    UpdateRecord,
    alarm_dict,
    attach,
    classification_loss,
    micro_batch,
    quiet_environment,
    report,
    run_docs_example,
    sink_for,
    step_micro_batches,
    use_cloudwatch,
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
    resume: bool = False,
    publish: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train the MLP with Accelerate under the guard up to step ``steps``; ``faults``: "forward"
    x1000 on net.2 of rank R from step 7, "weight" a bit flip on rank 0 after step 6;
    ``ckpt_every``: save_state into ``run_dir/step-N``; ``resume``: load the newest checkpoint
    first (refused when an alarm covers it: then the one sdc.clean_resume_step chooses);
    ``publish``: CloudWatch (moto) instead of counting."""
    from sdc_agent.integrations.accelerate import AcceleratorGuard

    quiet_environment()
    accelerator, model, optimizer = prepared(parallel)
    counting = CountingPublisher()
    sink = sink_for(publish, counting)
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
    attach(guard.guard, faults, forward="net.2", weight="net.0.weight")
    record = UpdateRecord(guard.guard.optimizer, guard.guard.params).counting(
        lambda: guard.next_step
    )
    refused = None
    if resume:
        newest = f"step-{saved_steps(run_dir)[-1]}"
        try:
            guard.load_state(Path(run_dir, newest))
        except sdc.UnsafeResumeError as err:
            refused = f"{newest}: {err}"
            clean = sdc.clean_resume_step(saved_steps(run_dir), run_dir)
            guard.load_state(Path(run_dir, f"step-{clean}"))
    start = guard.next_step
    rank = dist.get_rank()
    alarm = None
    for index in range(start * ACCUMULATION, steps * ACCUMULATION):
        with guard.accumulate(model):
            guard.backward(classification_loss(model, micro_batch(index, rank)))
            alarm = guard.optimizer_step()
        if not alarm and guard.checkpoint_due and run_dir is not None:
            alarm = guard.save_state(Path(run_dir, f"step-{guard.next_step - 1}"))
        if alarm:
            break
    else:
        alarm = guard.finish()
    saved = saved_steps(run_dir) if run_dir else []
    return report(
        alarm=alarm,
        record=record,
        optimizers=[guard.guard.optimizer],
        framework_step=guard.next_step,
        counting=counting,
        sink=sink,
        refused=refused,
        start=start,
        saved=saved,
        tags={step: read_tags(Path(run_dir, f"step-{step}")) for step in saved},
    )


def saved_steps(run_dir: str) -> list[int]:
    """The steps of the checkpoints in ``run_dir`` (directories ``step-N``)."""
    return sorted(int(p.name.split("-")[1]) for p in Path(run_dir).glob("step-*"))


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
