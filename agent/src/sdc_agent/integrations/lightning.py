"""sdc-guard in PyTorch Lightning: a callback, ``pip install "./agent[lightning]"`` (from a clone).

    trainer = L.Trainer(strategy="ddp", callbacks=[SDCGuardCallback(
        rebuild_batch=rebuild_batch, schedule=sdc.Schedule(...), alarm_dir=CKPT_DIR)])
    trainer.fit(model, loader)      # stops with AlarmStop (after exit_on_alarm) on an alarm

Lightning runs the loop; the callback drives the guard from its hooks (what it does at each,
and what Lightning does not let it do: docs/integrations.md):

    on_train_start          build the guard on the wrapped model; refuse a covered checkpoint
                            (UnsafeResumeError) and compare the replicas' weights
    on_train_batch_start    open the step (first micro-batch) and the guard's micro-batch
    on_before_backward      record the loss Lightning back-propagates (training_step / N)
    on_before_optimizer_step  close the last micro-batch; checks 1-2: on an alarm,
                            ``on_alarm(alarm)`` then AlarmStop, raised before the optimizer
                            changes a weight
    on_train_batch_end      close an accumulating micro-batch; after an update: zero_grad,
                            check 3 when due (before ModelCheckpoint, which Lightning always
                            runs last)
    on_save_checkpoint      verify the weights unless the step did, tag ``checkpoint["sdc"]``
    on_train_end            settle the last step's checks

Strategies: DDP (``"ddp"``, :class:`~lightning.pytorch.strategies.DDPStrategy`) and FSDP2
(:class:`~lightning.pytorch.strategies.ModelParallelStrategy`, ``fully_shard`` in
``configure_model``, full sharding or HSDP). FSDP1 (``FSDPStrategy``), DeepSpeed and manual
optimization are refused with an error naming what to use instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
    )
except ImportError as err:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "sdc_agent.integrations.lightning needs Lightning: pip install lightning (or './agent[lightning]' from a clone)"
    ) from err

from .. import Guard, Publisher, Schedule, clean_resume_step
from .hooks import (
    DEFAULT_ON_ALARM,
    OnAlarm,
    RebuildBatch,
    StepHooks,
    check_on_alarm,
    stop,
    with_accumulation,
)

__all__ = ["SDCGuardCallback", "clean_checkpoint", "training_step_loss"]

ReplayLoss = Callable[["pl.LightningModule", Any, int], torch.Tensor]
"""``loss = replay_loss(lightning_module, batch, batch_idx)`` for a replay."""


def training_step_loss(module: pl.LightningModule, batch: Any, batch_idx: int) -> torch.Tensor:
    """The default replay loss: ``module.training_step(batch, batch_idx)``'s loss (the tensor,
    or the ``"loss"`` of the dict it returned), as automatic optimization reads it."""
    out = module.training_step(batch, batch_idx)
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            "SDCGuardCallback: training_step must return the loss (a tensor, or a dict with "
            f"'loss') for replays, got {type(out).__name__}"
        )
    return loss


class SDCGuardCallback(Callback):
    """Adds the guard to ``Trainer.fit`` (see the module docstring for the hooks).

    ``rebuild_batch(step, rank)``: what global ``rank``'s dataloader yielded at optimizer step
    ``step`` (``trainer.global_step``), before Lightning moved it to the device; with
    ``accumulate_grad_batches`` = N, the step's list of N batches. ``replay_loss``: how a replay
    computes a batch's loss (default :func:`training_step_loss`; it runs under the precision
    plugin's autocast, on the LightningModule itself, never through DDP). ``schedule``: when
    the checks run (``grad_accum`` comes from the Trainer). ``on_alarm``: called on every rank
    with the Alarm before the callback raises :class:`~sdc_agent.integrations.AlarmStop`
    (default :func:`sdc_agent.exit_on_alarm`: exit code 3; None: only raise).
    """

    def __init__(
        self,
        *,
        rebuild_batch: RebuildBatch,
        replay_loss: ReplayLoss = training_step_loss,
        schedule: Schedule | None = None,
        publisher: Publisher | None = None,
        alarm_dir: str | os.PathLike | None = None,
        allow_unsafe_resume: bool = False,
        on_alarm: OnAlarm | None = DEFAULT_ON_ALARM,
    ) -> None:
        """Keep the settings; the guard itself is built at ``on_train_start``."""
        if not callable(rebuild_batch) or not callable(replay_loss):
            raise TypeError("SDCGuardCallback needs callables rebuild_batch and replay_loss")
        self.rebuild_batch = rebuild_batch
        self.replay_loss = replay_loss
        self.schedule = schedule
        self.publisher = publisher
        self.alarm_dir = alarm_dir
        self.allow_unsafe_resume = allow_unsafe_resume
        self.on_alarm = check_on_alarm(on_alarm)
        self.guard: Guard | None = None
        """The guard, from ``on_train_start`` on."""
        self.hooks: StepHooks | None = None
        self.alarm = None
        """The Alarm that stopped training (the same on every rank), or None."""
        self._trainer: pl.Trainer | None = None
        self._batch_idx: list[int] = []  # the batch_idx of each micro-batch of the step

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Refuse what the guard cannot protect, before anything trains."""
        if stage != "fit":
            return
        strategy = trainer.strategy
        if isinstance(strategy, FSDPStrategy):
            raise ValueError(
                "SDCGuardCallback: FSDPStrategy (FSDP1) is not supported: its flat parameters "
                "hide the per-tensor shards the checks compare. Use "
                "ModelParallelStrategy and shard with torch.distributed.fsdp.fully_shard in "
                "configure_model (FSDP2, full sharding or HSDP)"
            )
        if isinstance(strategy, DeepSpeedStrategy) or not isinstance(
            strategy, (DDPStrategy, ModelParallelStrategy)
        ):
            raise ValueError(
                f"SDCGuardCallback: {type(strategy).__name__} is not supported; use "
                "strategy='ddp' (DDPStrategy) or ModelParallelStrategy with fully_shard (FSDP2)"
            )
        if not pl_module.automatic_optimization:
            raise ValueError(
                "SDCGuardCallback: manual optimization is not supported (the callback cannot "
                "hold an optimizer step you run yourself); run the guard's step API "
                "(guard.step(step)) in your training_step instead"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the guard on the wrapped model (collective), refuse to resume from a checkpoint
        a recorded alarm covers, and compare every replica's weights before the first step."""
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"SDCGuardCallback: one optimizer is supported, got {len(trainer.optimizers)}"
            )
        self._trainer = trainer
        model = trainer.strategy.model
        assert model is not None  # the strategy wrapped the model before on_train_start
        self.guard = Guard(
            model,
            trainer.optimizers[0],
            compute_loss=self._replay,
            rebuild_batch=self.rebuild_batch,
            schedule=with_accumulation(
                self.schedule, trainer.accumulate_grad_batches, "Trainer.accumulate_grad_batches"
            ),
            publisher=self.publisher,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            alarm_dir=self.alarm_dir,
            allow_unsafe_resume=self.allow_unsafe_resume,
        )
        self.hooks = StepHooks(self.guard)
        self._check(self.hooks.start(trainer.global_step))

    # ------------------------------------------------------------------ each step
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Open the step on its first micro-batch, then the guard's micro-batch."""
        hooks = self._started()
        if hooks.micro_batches_begun == 0:
            self._batch_idx = []
        self._batch_idx.append(batch_idx)
        hooks.begin_micro_batch(trainer.global_step)

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        """Record the loss Lightning back-propagates (training_step's loss / N)."""
        self._started().record_backward(loss)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Close the last micro-batch, then checks 1 and 2, before Lightning clips the
        gradients and steps the optimizer."""
        hooks = self._started()
        hooks.end_micro_batch()
        self._check(hooks.before_update())

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close an accumulating micro-batch; after an optimizer step, drop the gradients and
        run check 3 when due.

        An accumulating micro-batch closes here and not right after its backward: Lightning
        runs it inside DDP's ``no_sync``, entered after this callback's micro-batch began, and
        the two contexts must nest (``no_sync`` restores the flag it found on exit)."""
        hooks = self._started()
        if hooks.in_micro_batch:
            hooks.end_micro_batch()
        if hooks.updating:
            trainer.optimizers[0].zero_grad(set_to_none=True)
            self._check(hooks.after_update())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Settle the last step's checks (collective)."""
        self._check(self._started().finish())

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Leave the step the exception interrupted (RNG and kernel flags restored)."""
        if self.hooks is not None:
            self.hooks.abort()

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Before Lightning writes a checkpoint (every rank dumps it, so this is collective):
        verify every replica's weights unless the step's check did, and tag it
        (``checkpoint["sdc"]``). An alarm raises AlarmStop instead: nothing is written."""
        if self.hooks is None:
            return  # not fitting (a checkpoint outside Trainer.fit)
        self._check(self.hooks.verify_for_checkpoint())
        checkpoint["sdc"] = self.hooks.checkpoint_tags()

    # ------------------------------------------------------------------ internals
    def _replay(self, module: torch.nn.Module, batch: Any) -> torch.Tensor:
        """A replay's loss: the batch moved as Lightning moves it, then ``replay_loss`` on the
        LightningModule under the precision plugin's training context (never through DDP,
        whose hooks would wait for the other ranks)."""
        trainer, guard = self._trainer, self.guard
        assert trainer is not None and guard is not None  # replays run after on_train_start
        batch = trainer.strategy.batch_to_device(batch)
        position = guard.current_micro_batch or 0
        batch_idx = self._batch_idx[position] if position < len(self._batch_idx) else 0
        with trainer.precision_plugin.train_step_context():
            return self.replay_loss(trainer.lightning_module, batch, batch_idx)

    def _started(self) -> StepHooks:
        """The step hooks ``on_train_start`` made (a step callback before it raises)."""
        if self.hooks is None:
            raise RuntimeError("sdc_agent: SDCGuardCallback: a training step before on_train_start")
        return self.hooks

    def _check(self, alarm: Any) -> None:
        if alarm is not None:
            self.alarm = alarm
            stop(alarm, self.on_alarm)


_STEP = re.compile(r"step=(\d+)")


def clean_checkpoint(directory: str | os.PathLike, alarm_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``directory`` (ModelCheckpoint's files or directories named
    with ``step={global_step}``) that no alarm recorded in ``alarm_dir`` covers, for
    ``trainer.fit(..., ckpt_path=...)``; None: start from the initial weights.

    A checkpoint of ``global_step`` N holds the weights after guard step N - 1."""
    by_step: dict[int, Path] = {}
    for path in Path(directory).iterdir() if Path(directory).is_dir() else ():
        if (found := _STEP.search(path.name)) and path.name != "last.ckpt":
            by_step[int(found.group(1)) - 1] = path
    if not by_step:
        return None  # a first start: nothing saved yet (the alarm log may not exist either)
    step = clean_resume_step(sorted(by_step), alarm_dir)
    return None if step is None else by_step[step]
