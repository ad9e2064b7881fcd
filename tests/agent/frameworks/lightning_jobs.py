"""PyTorch Lightning jobs: Trainer.fit with SDCGuardCallback, under its DDP strategy and its
FSDP2 ModelParallelStrategy (HSDP: replicas across the 3 nodes, shards within one)."""

from __future__ import annotations

import os
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
    attach,
    classification_loss,
    micro_batch,
    quiet_environment,
    report,
    run_docs_example,
    sink_for,
    use_cloudwatch,
)

ACCUMULATION = 2
STEPS_PER_EPOCH = 5


def lightning_module(parallel: str) -> Any:
    import lightning.pytorch as L

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = MLP()

        def configure_model(self) -> None:
            if parallel != "hsdp":
                return
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("replicate", "shard"))
            for layer in self.model.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self, mesh=mesh)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return classification_loss(self.model, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return Classifier()


class RankBatches(torch.utils.data.Dataset):
    """This rank's micro-batches of one epoch (the same every epoch): item i is micro-batch i."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return STEPS_PER_EPOCH * ACCUMULATION

    def __getitem__(self, index: int) -> tuple:
        return micro_batch(index, self.rank)


def trainer_kwargs(steps: int) -> dict[str, Any]:
    """The Trainer's arguments for this machine: 3 nodes x 2 CPU processes, quiet."""
    return {
        "accelerator": "cpu",
        "devices": 2,
        "num_nodes": 3,
        "max_steps": steps,
        "accumulate_grad_batches": ACCUMULATION,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "use_distributed_sampler": False,
        "num_sanity_val_steps": 0,
    }


def rebuild_batch(step: int, rank: int) -> list[tuple]:
    """What rank's dataloader yielded at optimizer step ``step`` (epochs repeat the data)."""
    first = (step % STEPS_PER_EPOCH) * ACCUMULATION
    return [micro_batch(first + i, rank) for i in range(ACCUMULATION)]


def train(
    *,
    steps: int,
    parallel: str = "ddp",
    faults: tuple[str, ...] = (),
    ckpt_every: int = 0,
    run_dir: str | None = None,
    resume: bool = False,
    publish: dict[str, str] | None = None,
    termination_log: str | None = None,
) -> dict[str, Any]:
    """Trainer.fit for ``steps`` optimizer steps under SDCGuardCallback; ``faults`` as in the
    Accelerate jobs; ``ckpt_every``: ModelCheckpoint(every_n_train_steps=...) into ``run_dir``;
    ``resume``: fit from the newest checkpoint first (refused when an alarm covers it), then
    from the one clean_checkpoint chooses; ``publish``: CloudWatch (moto) instead of counting;
    ``termination_log``: keep the callback's default on_alarm (sdc.exit_on_alarm: this process
    exits with code 3, writing its termination message to ``termination_log``.rankN)."""
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from sdc_agent.integrations import AlarmStop
    from sdc_agent.integrations.lightning import SDCGuardCallback, clean_checkpoint

    quiet_environment()
    rank = dist.get_rank()
    counting = CountingPublisher()
    sink = sink_for(publish, counting)
    on_alarm_calls: list[int] = []
    on_alarm: dict[str, Any] = {"on_alarm": lambda alarm: on_alarm_calls.append(alarm.step)}
    if termination_log is not None:
        os.environ["SDC_TERMINATION_LOG"] = f"{termination_log}.rank{rank}"
        on_alarm = {}  # the default: sdc.exit_on_alarm
    guard_cb = SDCGuardCallback(
        rebuild_batch=rebuild_batch,
        schedule=sdc.Schedule(**SCHEDULE),
        publisher=sink,
        alarm_dir=run_dir,
        **on_alarm,
    )
    observed: dict[str, Any] = {}

    class Observe(L.Callback):
        """Attaches the faults and the update record once the guard exists."""

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            guard = guard_cb.guard
            target = pl_module.model.net[0].weight
            name = next(n for n, p in guard.module.named_parameters() if p is target)
            attach(guard, faults, forward=pl_module.model.net[2], weight=name)
            observed["optimizer"] = trainer.optimizers[0]
            observed["record"] = UpdateRecord(trainer.optimizers[0], guard.params).counting(
                lambda: trainer.global_step
            )
            observed["start"] = trainer.global_step

    callbacks: list[Any] = [guard_cb, Observe()]
    if ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=run_dir, every_n_train_steps=ckpt_every, save_top_k=-1, save_last=False
            )
        )

    trainers: list[L.Trainer] = []

    def fit(ckpt_path: str | None) -> None:
        trainer = L.Trainer(
            strategy=DDPStrategy()
            if parallel == "ddp"
            else ModelParallelStrategy(data_parallel_size=6, tensor_parallel_size=1),
            callbacks=callbacks,
            enable_checkpointing=bool(ckpt_every),
            **trainer_kwargs(steps),
        )
        trainers.append(trainer)
        loader = torch.utils.data.DataLoader(RankBatches(rank), batch_size=None)
        trainer.fit(lightning_module(parallel), loader, ckpt_path=ckpt_path)

    refused = stopped = None
    try:
        ckpt_path = None
        if resume:
            newest = max(Path(run_dir).glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
            try:
                fit(str(newest))
            except sdc.UnsafeResumeError as err:
                refused = f"{newest.name}: {err}"
            chosen = clean_checkpoint(run_dir, run_dir)
            ckpt_path = None if chosen is None else str(chosen)
        fit(ckpt_path)
    except AlarmStop as err:
        stopped = err.alarm
    trainer = trainers[-1]
    by_step = checkpoint_files(run_dir)
    tags = {}
    if by_step and dist.get_rank() == 0:
        tags = {s: torch.load(p, weights_only=False).get("sdc") for s, p in by_step.items()}
    return report(
        alarm=stopped or guard_cb.alarm,
        record=observed["record"],
        optimizers=[observed["optimizer"]],
        framework_step=trainer.global_step,
        counting=counting,
        sink=sink,
        on_alarm_calls=on_alarm_calls,
        refused=refused,
        start=observed["start"],
        saved=sorted(by_step),
        tags=tags,
    )


def checkpoint_files(run_dir: str | None) -> dict[int, Path]:
    """ModelCheckpoint's files by guard step (``step={global_step}``: guard step + 1)."""
    if run_dir is None or not Path(run_dir).is_dir():
        return {}
    return {
        int(p.name.split("step=")[1].split(".")[0].split("-")[0]) - 1: p
        for p in Path(run_dir).glob("*step=*.ckpt")
    }


def docs_example(*, steps: int, run_dir: str, publish: dict[str, str]) -> dict[str, Any]:
    """docs/integrations.md's Lightning example, as written, for ``steps`` steps."""
    quiet_environment()
    use_cloudwatch(**publish)
    rank = dist.get_rank()
    namespace = run_docs_example(
        "lightning",
        {
            "rebuild_batch": rebuild_batch,
            "CKPT_DIR": run_dir,
            "trainer_kwargs": trainer_kwargs(steps),
            "model": lightning_module("ddp"),
            "loader": torch.utils.data.DataLoader(RankBatches(rank), batch_size=None),
        },
    )
    guard = namespace["guard"]
    return {
        "alarm": alarm_dict(guard.alarm),
        "steps_applied": namespace["trainer"].global_step,
        "last_audit_pass": guard.guard.last_audit_pass,
        "delivered": guard.guard.flush(30.0),
    }
