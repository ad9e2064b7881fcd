"""sdc-guard in a Hugging Face Accelerate loop: ``pip install "./agent[accelerate]"`` (from a clone).

The loop keeps its shape; three calls go through the guard::

    guard = AcceleratorGuard(accelerator, model, optimizer, compute_loss=compute_loss,
                             rebuild_batch=rebuild_batch, schedule=sdc.Schedule(...))
    for batch in loader:
        with guard.accumulate(model):                 # accelerator.accumulate + the guard
            guard.backward(compute_loss(model, batch))  # accelerator.backward, recorded
            alarm = guard.optimizer_step()          # checks 1-2, optimizer.step(), check 3
        if alarm:
            sdc.exit_on_alarm(alarm)

``model`` and ``optimizer`` are what ``accelerator.prepare`` returned: a DDP model, or a model
sharded by Accelerate's FSDP2 plugin (``FullyShardedDataParallelPlugin(fsdp_version=2)``).
Accumulation is Accelerate's (``Accelerator(gradient_accumulation_steps=N)``): the guard reads N,
enters its micro-batch inside ``accelerator.accumulate`` (whose ``no_sync`` it keeps), and its
loss share is Accelerate's ``loss / N``. fp16 is Accelerate's GradScaler, given to the guard.
What Accelerate does not let the guard do, and what it refuses: docs/integrations.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

try:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
except ImportError as err:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "sdc_agent.integrations.accelerate needs Accelerate: pip install accelerate (or './agent[accelerate]' from a clone)"
    ) from err

from .. import Alarm, Guard, Publisher, Schedule
from .hooks import ComputeLoss, RebuildBatch, StepHooks, read_tags, with_accumulation, write_tags

__all__ = ["AcceleratorGuard"]

_REFUSED = {
    DistributedType.DEEPSPEED: "DeepSpeed runs its own backward and optimizer step",
    DistributedType.MEGATRON_LM: "Megatron-LM runs its own backward and optimizer step",
    DistributedType.XLA: "XLA steps are traced, not run eagerly",
}


class AcceleratorGuard:
    """The guard around an Accelerate loop (see the module docstring for the loop).

    ``compute_loss(model, batch)`` returns one micro-batch's loss (called with the prepared
    model in training and with the bare module in replays); ``rebuild_batch(step, rank)``
    returns the micro-batch global ``rank`` trained on at ``step`` (with accumulation, the
    step's list of N micro-batches). Steps count optimizer steps from ``start_step`` (or from
    the checkpoint :meth:`load_state` loaded). Construction is collective (as
    :class:`sdc_agent.Guard`'s): build it on every rank, after ``accelerator.prepare``.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        compute_loss: ComputeLoss,
        rebuild_batch: RebuildBatch,
        schedule: Schedule | None = None,
        publisher: Publisher | None = None,
        alarm_dir: str | os.PathLike | None = None,
        allow_unsafe_resume: bool = False,
        start_step: int = 0,
    ) -> None:
        """Check Accelerate's set-up and build the guard (collective)."""
        kind = accelerator.distributed_type
        if kind in _REFUSED:
            raise ValueError(
                f"AcceleratorGuard: {kind} is not supported: {_REFUSED[kind]}; use DDP "
                "(multi-GPU or multi-CPU) or the FSDP2 plugin"
            )
        plugin = getattr(accelerator.state, "fsdp_plugin", None)
        if kind == DistributedType.FSDP and getattr(plugin, "fsdp_version", 1) != 2:
            raise ValueError(
                "AcceleratorGuard: FSDP1 (FullyShardedDataParallelPlugin(fsdp_version=1)) is not "
                "supported: its flat parameters hide the per-tensor shards the checks compare; "
                "use FullyShardedDataParallelPlugin(fsdp_version=2)"
            )
        if not getattr(model, "_is_accelerate_prepared", False):
            raise ValueError(
                "AcceleratorGuard: pass the model accelerator.prepare(...) returned (wrapped in DDP "
                "or sharded by FSDP2), not the bare module"
            )
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        """The optimizer as prepared (``AcceleratedOptimizer``): what :meth:`optimizer_step`
        steps."""
        self.accumulation = accelerator.gradient_accumulation_steps
        """Micro-batches per optimizer step (Accelerate's ``gradient_accumulation_steps``)."""
        self.guard = Guard(
            model,
            getattr(optimizer, "optimizer", optimizer),  # the torch optimizer inside
            compute_loss=compute_loss,
            rebuild_batch=rebuild_batch,
            schedule=with_accumulation(
                schedule, self.accumulation, "Accelerator.gradient_accumulation_steps"
            ),
            publisher=publisher,
            scaler=accelerator.scaler,
            alarm_dir=alarm_dir,
            allow_unsafe_resume=allow_unsafe_resume,
        )
        """The guard (``sdc_agent.Guard``) this loop drives."""
        self.hooks = StepHooks(self.guard)
        self.next_step = start_step
        """The step the next micro-batch belongs to (optimizer steps applied so far, counted
        from ``start_step``)."""
        self._started = False
        self._stepped = False  # the last micro-batch ended with an applied optimizer step

    # ------------------------------------------------------------------ the loop
    @contextlib.contextmanager
    def accumulate(self, model: nn.Module | None = None) -> Iterator[AcceleratorGuard]:
        """``accelerator.accumulate(model)`` and the guard's micro-batch, for one micro-batch's
        forward, :meth:`backward` and :meth:`optimizer_step` (the model defaults to this
        guard's). The first one of the run compares every replica's weights first
        (``Schedule.check_on_start``); an alarm there is returned by :meth:`optimizer_step`."""
        self._stepped = False
        with self.accelerator.accumulate(model if model is not None else self.model):
            if not self._started:
                self._started = True
                self.hooks.start(self.next_step)  # an alarm is returned by optimizer_step
            with self.hooks.aborting_on_error():
                self.hooks.begin_micro_batch(self.next_step)
                yield self
                if self.hooks.in_micro_batch:
                    raise RuntimeError(
                        "AcceleratorGuard: a micro-batch ended without guard.backward(loss)"
                    )

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``accelerator.backward(loss, **kwargs)`` (the loss divided by the accumulation
        steps, scaled under fp16), recorded for the audit; ends the guard's micro-batch."""
        if not self.hooks.in_micro_batch:
            raise RuntimeError(
                "AcceleratorGuard.backward: call it inside `with guard.accumulate(model):`"
            )
        self.accelerator.backward(loss, **kwargs)
        # Accelerate back-propagated loss / N (N = 1 without accumulation: the same bits).
        self.hooks.record_backward(loss.detach() / self.accumulation)
        self.hooks.end_micro_batch()

    def optimizer_step(self) -> Alarm | None:
        """On the step's last micro-batch (``accelerator.sync_gradients``): checks 1 and 2,
        then ``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)`` when they pass,
        then check 3 when due. On the other micro-batches: nothing (Accelerate accumulates).

        Returns the Alarm (the same on every rank; the alarmed step was not applied), or None.
        Step your learning-rate scheduler after it, as usual."""
        if self.hooks.alarm is not None:  # e.g. the weights compared before the first step
            self.hooks.abort()
            self.guard._run.drop_gradients()
            return self.hooks.alarm
        if not self.accelerator.sync_gradients:
            return None
        if (alarm := self.hooks.before_update()) is not None:
            return alarm
        if self.hooks.update_allowed:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.next_step += 1
        self._stepped = True
        return self.hooks.after_update()

    def finish(self) -> Alarm | None:
        """After the loop (collective): settles the last step's checks; returns an Alarm or
        None."""
        return self.hooks.finish()

    # ------------------------------------------------------------------ checkpoints
    @property
    def checkpoint_due(self) -> bool:
        """Whether ``Schedule.ckpt_every`` asks for a checkpoint after the step the last
        :meth:`optimizer_step` applied (False again once the next micro-batch begins)."""
        return self._stepped and self.hooks.current_step().checkpoint_due

    def checkpoint_tags(self) -> dict[str, Any]:
        """The guard's tags for a checkpoint of the last step (see
        :meth:`sdc_agent.GuardedStep.checkpoint_tags`)."""
        return self.hooks.checkpoint_tags()

    def save_state(self, output_dir: str | os.PathLike, **kwargs: Any) -> Alarm | None:
        """``accelerator.save_state(output_dir, **kwargs)`` after the guard verified every
        replica's weights (collective; compared now unless the step's check did), with the
        guard's tags written next to it (:data:`sdc_agent.integrations.TAGS_FILE`). Returns the
        Alarm instead of saving when the weights diverged."""
        if (alarm := self.hooks.verify_for_checkpoint()) is not None:
            return alarm
        tags = self.hooks.checkpoint_tags()
        self.accelerator.save_state(os.fspath(output_dir), **kwargs)
        if self.accelerator.is_main_process:
            write_tags(output_dir, tags)
        self.accelerator.wait_for_everyone()
        return None

    def load_state(self, input_dir: str | os.PathLike, **kwargs: Any) -> int:
        """Resume from a checkpoint :meth:`save_state` wrote: refuses one that a recorded
        alarm covers (:class:`sdc_agent.UnsafeResumeError` on every rank, before loading),
        then ``accelerator.load_state(input_dir, **kwargs)``; the next step follows the
        checkpoint's and the first micro-batch compares the loaded weights on every replica.
        Returns that next step (collective). Choose the directory with
        ``sdc.clean_resume_step``."""
        tags = read_tags(input_dir)
        if tags is None:
            raise FileNotFoundError(
                f"AcceleratorGuard.load_state: {os.fspath(input_dir)!r} has no sdc checkpoint "
                "tags: save it with AcceleratorGuard.save_state"
            )
        start = tags["step"] + 1
        self.guard.check_resume(start)
        self.accelerator.load_state(os.fspath(input_dir), **kwargs)
        self.next_step = start
        self._started = False
        dist.barrier()
        return start
