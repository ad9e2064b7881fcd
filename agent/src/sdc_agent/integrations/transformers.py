"""sdc-guard in the Hugging Face ``Trainer``: ``pip install "./agent[transformers]"`` (from a clone).

    trainer = GuardedTrainer(model=model, args=args, train_dataset=dataset,
                             schedule=sdc.Schedule(...), alarm_dir=args.output_dir)
    trainer.train()     # stops with AlarmStop (after exit_on_alarm) on an alarm

A :class:`~transformers.TrainerCallback` does most of the work; what a callback cannot do is
overridden in the Trainer subclass (docs/integrations.md says what happens at each hook):

- ``on_train_begin`` (callback): build the guard on the wrapped model, refuse to resume from a
  checkpoint a recorded alarm covers (UnsafeResumeError), compare the replicas' weights;
- ``training_step`` (override; a callback sees no micro-batch): open the step on its first
  micro-batch, run the Trainer's own forward and backward inside the guard's micro-batch, record
  the loss it back-propagated;
- ``on_pre_optimizer_step`` (callback): checks 1-2; an alarm calls ``on_alarm`` then raises
  AlarmStop before ``optimizer.step()`` (so ``state.global_step`` stays at the last applied step);
- ``on_optimizer_step`` (callback): check 3 when due;
- ``_save_checkpoint`` (override; ``on_save`` runs after the files are written): verify the
  weights unless the step did, then save and write the tags beside the checkpoint;
- ``get_train_dataloader`` (override): each rank's micro-batches from one seeded shuffle,
  sharded by rank, so that any rank can rebuild any rank's micro-batch (Accelerate's sharded
  loader cannot be rebuilt for another rank); pass ``rebuild_batch`` to keep your own loader;
- ``on_train_end`` (callback): settle the last step's checks.

The Trainer normalises each micro-batch's loss by the step's token count (``num_items_in_batch``
across the accumulated micro-batches and, with ``average_tokens_across_devices``, every rank),
so the guard back-propagates and replays that share as is (``Guard(divide_loss=False)``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

try:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as err:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "sdc_agent.integrations.transformers needs transformers and accelerate: "
        "pip install transformers accelerate (or './agent[transformers]' from a clone)"
    ) from err

from .. import Alarm, Guard, Publisher, Schedule, clean_resume_step
from .hooks import (
    DEFAULT_ON_ALARM,
    OnAlarm,
    RebuildBatch,
    StepHooks,
    check_on_alarm,
    stop,
    with_accumulation,
    write_tags,
)

__all__ = ["GuardedTrainer", "RankBatchSampler", "clean_checkpoint"]


class RankBatchSampler(Sampler[list[int]]):
    """One rank's micro-batches: epoch ``e`` shuffles the dataset with seed ``seed + e`` (or
    keeps its order), cuts it into global steps of ``world x accumulation x batch`` samples
    (dropping the incomplete tail, so every step has its ``accumulation`` micro-batches) and
    gives micro-batch ``k`` of rank ``r`` the slice ``[(k * world + r) * batch, + batch)``.

    A pure function of (epoch, micro-batch, rank): :meth:`indices` rebuilds any rank's."""

    def __init__(
        self,
        size: int,
        *,
        batch: int,
        world: int,
        rank: int,
        accumulation: int,
        seed: int,
        shuffle: bool,
    ) -> None:
        """Sample ``size`` items for ``rank`` of ``world``."""
        self.size, self.batch, self.world, self.rank = size, batch, world, rank
        self.accumulation, self.seed, self.shuffle = accumulation, seed, shuffle
        self.steps_per_epoch = size // (batch * world * accumulation)
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"GuardedTrainer: {size} training samples make no whole step of {world} ranks x "
                f"{accumulation} micro-batches x {batch} samples"
            )
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for ``epoch`` (the Trainer calls it at each epoch's start)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Micro-batches of one epoch on this rank."""
        return self.steps_per_epoch * self.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches of the current epoch."""
        order = self._order(self.epoch)
        for k in range(len(self)):
            yield self._slice(order, k, self.rank)

    def indices(self, step: int, rank: int) -> list[list[int]]:
        """The dataset indices of ``rank``'s micro-batches at optimizer step ``step`` (counted
        from the first epoch)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self._order(epoch)
        first = within * self.accumulation
        return [self._slice(order, first + i, rank) for i in range(self.accumulation)]

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch))

    def _slice(self, order: torch.Tensor, k: int, rank: int) -> list[int]:
        start = (k * self.world + rank) * self.batch
        return order[start : start + self.batch].tolist()


class _EpochLoader(DataLoader):
    """A DataLoader whose ``set_epoch`` reaches its batch sampler (the Trainer calls it)."""

    def set_epoch(self, epoch: int) -> None:
        sampler = self.batch_sampler
        assert isinstance(sampler, RankBatchSampler)  # the one it is built with
        sampler.set_epoch(epoch)


class _Micro(dict):
    """A rebuilt micro-batch (the collated inputs) with the ``num_items_in_batch`` its loss
    was normalised by in training."""

    num_items: Any = None


class _GuardCallback(TrainerCallback):
    """The callback half of :class:`GuardedTrainer` (see the module docstring)."""

    def __init__(self, trainer: GuardedTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._sdc_begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        trainer._sdc_check(trainer._sdc_started().before_update())

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        trainer._sdc_check(trainer._sdc_started().after_update())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        trainer._sdc_check(trainer._sdc_started().finish())


class GuardedTrainer(Trainer):
    """The Hugging Face ``Trainer`` under the guard (see the module docstring).

    Takes the Trainer's arguments, plus: ``schedule`` (when the checks run; ``grad_accum``
    comes from ``TrainingArguments.gradient_accumulation_steps``), ``publisher``, ``alarm_dir``
    and ``allow_unsafe_resume`` as :class:`sdc_agent.Guard`'s; ``on_alarm`` called on every rank
    with the Alarm before the Trainer is stopped with
    :class:`~sdc_agent.integrations.AlarmStop` (default :func:`sdc_agent.exit_on_alarm`:
    exit code 3; None: only raise); ``rebuild_batch(step, rank)``: the collated micro-batches of
    ``rank`` at ``step``, only when you keep your own train dataloader (by default the trainer
    shards a map-style dataset itself, :class:`RankBatchSampler`, and rebuilds from it).
    """

    def __init__(
        self,
        *args: Any,
        schedule: Schedule | None = None,
        publisher: Publisher | None = None,
        alarm_dir: str | os.PathLike | None = None,
        allow_unsafe_resume: bool = False,
        on_alarm: OnAlarm | None = DEFAULT_ON_ALARM,
        rebuild_batch: RebuildBatch | None = None,
        **kwargs: Any,
    ) -> None:
        """Build the Trainer, refuse what the guard cannot protect, add the callback."""
        super().__init__(*args, **kwargs)
        self._sdc_refuse_unsupported()
        self._sdc_schedule = with_accumulation(
            schedule,
            self.args.gradient_accumulation_steps,
            "TrainingArguments.gradient_accumulation_steps",
        )
        self._sdc_publisher = publisher
        self._sdc_alarm_dir = alarm_dir
        self._sdc_allow_unsafe_resume = allow_unsafe_resume
        self._sdc_on_alarm = check_on_alarm(on_alarm)
        self._sdc_rebuild = rebuild_batch
        self._sdc_sampler: RankBatchSampler | None = None
        self._sdc_num_items: dict[int, Any] = {}  # step -> num_items_in_batch (global value)
        self.sdc_guard: Guard | None = None
        """The guard, from the start of ``train()``."""
        self._sdc_hooks: StepHooks | None = None
        self.sdc_alarm: Alarm | None = None
        """The Alarm that stopped training (the same on every rank), or None."""
        self.add_callback(_GuardCallback(self))

    # ------------------------------------------------------------------ Trainer overrides
    def get_train_dataloader(self) -> DataLoader:
        """Each rank's micro-batches from :class:`RankBatchSampler` (the same batch size,
        collator, seed and column removal as the Trainer's own loader), unless you passed
        ``rebuild_batch`` (then the Trainer's own loader, which must match it)."""
        if self._sdc_rebuild is not None:
            return super().get_train_dataloader()
        dataset, collator = self._sdc_dataset()
        args = self.args
        self._sdc_sampler = RankBatchSampler(
            len(dataset),
            batch=self._train_batch_size,
            world=max(1, args.world_size),
            rank=args.process_index,
            accumulation=args.gradient_accumulation_steps,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            shuffle=args.train_sampling_strategy != "sequential",
        )
        return _EpochLoader(
            dataset,
            batch_sampler=self._sdc_sampler,
            collate_fn=collator,
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
        )

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        """The Trainer's forward and backward of one micro-batch, inside the guard's
        micro-batch (the first one of a step opens it); the loss it back-propagated is recorded
        for the audit."""
        hooks = self._sdc_started()
        step = self.state.global_step
        if hooks.micro_batches_begun == 0:
            self._sdc_num_items = {step: num_items_in_batch}  # replays are of this step only
        hooks.begin_micro_batch(step)
        with hooks.aborting_on_error():
            loss = super().training_step(model, inputs, num_items_in_batch)
            hooks.record_backward(loss)  # what accelerator.backward back-propagated (/ 1)
            hooks.end_micro_batch()
        return loss

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Verify every replica's weights (collective: every rank saves) unless the step's
        check did; an alarm stops training instead of saving. Then the Trainer's save, and the
        guard's tags beside it (``sdc-checkpoint.json``)."""
        hooks = self._sdc_hooks
        if hooks is None:  # a save outside train()
            super()._save_checkpoint(model, trial)
            return
        self._sdc_check(hooks.verify_for_checkpoint())
        tags = hooks.checkpoint_tags()
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            write_tags(Path(self._get_output_dir(trial=trial), folder), tags)

    # ------------------------------------------------------------------ the guard
    def _sdc_begin(self) -> None:
        """At ``on_train_begin`` (every rank): build the guard on the wrapped model, refuse a
        covered checkpoint, compare the weights."""
        optimizer = self.optimizer
        assert optimizer is not None  # the Trainer creates it before on_train_begin
        self.sdc_guard = Guard(
            self.model_wrapped,
            getattr(optimizer, "optimizer", optimizer),  # the torch optimizer inside Accelerate's
            compute_loss=self._sdc_replay_loss,
            rebuild_batch=self._sdc_rebuild_batch,
            schedule=self._sdc_schedule,
            publisher=self._sdc_publisher,
            scaler=self.accelerator.scaler,
            alarm_dir=self._sdc_alarm_dir,
            allow_unsafe_resume=self._sdc_allow_unsafe_resume,
            divide_loss=False,
        )
        self._sdc_hooks = StepHooks(self.sdc_guard)
        self._sdc_check(self._sdc_hooks.start(self.state.global_step))

    def _sdc_started(self) -> StepHooks:
        """The step hooks ``on_train_begin`` made (a step before it raises)."""
        if self._sdc_hooks is None:
            raise RuntimeError("sdc_agent: GuardedTrainer: a training step before on_train_begin")
        return self._sdc_hooks

    def _sdc_check(self, alarm: Alarm | None) -> None:
        if alarm is not None:
            self.sdc_alarm = alarm
            stop(alarm, self._sdc_on_alarm)

    def _sdc_dataset(self) -> tuple[Any, Any]:
        """The training set and collator as the Trainer's own loader prepares them."""
        dataset, collator = self.train_dataset, self.data_collator
        if dataset is None:
            raise ValueError("GuardedTrainer: training requires a train_dataset")
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError(
                "GuardedTrainer: an IterableDataset cannot be rebuilt by index for another rank's "
                "replay; use a map-style dataset, or pass rebuild_batch(step, rank) and shard "
                "your data to match it"
            )
        try:
            import datasets
        except ImportError:
            datasets = None
        if datasets is not None and isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return dataset, collator

    def _sdc_rebuild_batch(self, step: int, rank: int) -> Any:
        """``rank``'s collated micro-batches at ``step`` (from :class:`RankBatchSampler`, or
        your ``rebuild_batch``), each with the ``num_items_in_batch`` training used."""
        if self._sdc_rebuild is not None:
            rebuilt = self._sdc_rebuild(step, rank)
            batches = rebuilt if self.args.gradient_accumulation_steps > 1 else [rebuilt]
            micros = [_Micro(batch) for batch in batches]
        else:
            dataset, collator = self._sdc_dataset()
            sampler = self._sdc_sampler
            assert sampler is not None  # get_train_dataloader made it (no rebuild_batch)
            micros = [
                _Micro(collator([dataset[i] for i in indices]))
                for indices in sampler.indices(step, rank)
            ]
        num_items = self._sdc_num_items.get(step)
        per_device = not self.args.average_tokens_across_devices or self.args.world_size <= 1
        if per_device and num_items is not None:
            # Counted over this rank's own micro-batches (no collective on this path).
            num_items = self._get_num_items_in_batch(micros, self.args.device)
        for micro in micros:
            micro.num_items = num_items
        return micros if self.args.gradient_accumulation_steps > 1 else micros[0]

    def _sdc_replay_loss(self, module: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss ``training_step`` back-propagates, recomputed on ``module`` (the bare
        model): the Trainer's ``compute_loss`` with the step's ``num_items_in_batch``, divided
        by the accumulation steps unless that count already normalised it."""
        num_items = getattr(batch, "num_items", None)
        if num_items is None:
            num_items = self._sdc_num_items.get(self.state.global_step)
        inputs = self._prepare_inputs(dict(batch))
        with self.compute_loss_context_manager():
            # Without return_outputs, compute_loss returns the loss alone (not (loss, outputs)).
            loss = cast(
                torch.Tensor, self.compute_loss(module, inputs, num_items_in_batch=num_items)
            )
        if self.loss_is_scaled_for_ga is not None:
            scaled = self.loss_is_scaled_for_ga
        else:
            scaled = (
                self.model_accepts_loss_kwargs and num_items is not None
            ) or self.compute_loss_func is not None
        if not scaled:
            loss = loss / self.current_gradient_accumulation_steps
        return loss

    def _sdc_refuse_unsupported(self) -> None:
        """Raise for set-ups whose backward or data the guard cannot see or replay."""
        args = self.args
        problems = []
        if self.is_deepspeed_enabled:
            problems.append("DeepSpeed (it runs its own backward and optimizer step)")
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if plugin is not None and getattr(plugin, "fsdp_version", 1) != 2:
            problems.append("FSDP1 (use fsdp_config={'fsdp_version': 2})")
        if args.n_gpu > 1:
            problems.append("torch.nn.DataParallel (n_gpu > 1; launch one process per GPU)")
        if self.get_cp_size() > 1 or self.get_sp_size() > 1:
            problems.append("context or sequence parallelism")
        if "lomo" in str(args.optim).lower():
            problems.append("LOMO optimizers (they update inside the backward)")
        if problems:
            raise ValueError(f"GuardedTrainer does not support {', '.join(problems)}")


_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def clean_checkpoint(output_dir: str | os.PathLike, alarm_dir: str | os.PathLike) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` that no alarm recorded in
    ``alarm_dir`` covers, for ``trainer.train(resume_from_checkpoint=...)``; None: start
    from the initial weights. ``checkpoint-N`` holds the weights after guard step N - 1."""
    by_step: dict[int, Path] = {}
    for path in Path(output_dir).iterdir() if Path(output_dir).is_dir() else ():
        if path.is_dir() and (found := _CHECKPOINT.match(path.name)):
            by_step[int(found.group(1)) - 1] = path
    if not by_step:
        return None  # a first start: nothing saved yet (the alarm log may not exist either)
    step = clean_resume_step(sorted(by_step), alarm_dir)
    return None if step is None else str(by_step[step])
