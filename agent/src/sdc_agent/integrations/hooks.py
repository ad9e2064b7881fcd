"""The guard driven from a framework's hooks instead of a loop it owns.

A framework (PyTorch Lightning, the Hugging Face Trainer, Accelerate's ``accumulate``) runs the
forward, the backward and the optimizer step itself and offers hooks around them. The step API
(:meth:`sdc_agent.Guard.step`) expects one ``with`` block around a whole step; :class:`StepHooks`
turns the hooks' calls into that block's calls, in the order the guard needs them:

    begin_micro_batch(step)     before each micro-batch's forward (the first opens the step)
    record_backward(loss)       the framework back-propagated this micro-batch's loss share
    end_micro_batch()           after that backward
    before_update()             after the last backward, before the optimizer step: checks 1-2
    after_update()              after the optimizer step: check 3 when due
    verify_for_checkpoint()     before any checkpoint the framework writes (collective)
    checkpoint_tags()           the tags to store in it
    finish()                    after the last step (collective)

Every call that returns an Alarm returns the same one on every rank, at the same call; the
framework module decides how to stop (:func:`stop`). The guarantee is the guard's: a step whose
:meth:`before_update` returned an Alarm has no gradients left, so an optimizer step changes
nothing, and the integrations stop the framework before it even runs one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from .. import Alarm, Guard, GuardedStep, Schedule, exit_on_alarm
from ..errors import SdcAgentError

logger = logging.getLogger("sdc_agent")

ComputeLoss = Callable[[torch.nn.Module, Any], torch.Tensor]
"""``loss = compute_loss(model, batch)``, as :class:`sdc_agent.Guard` takes it."""
RebuildBatch = Callable[[int, int], Any]
"""``batch = rebuild_batch(step, rank)``, as :class:`sdc_agent.Guard` takes it."""
OnAlarm = Callable[[Alarm], object]
"""What an integration calls on every rank when the guard returns an Alarm, before it stops the
framework (:func:`sdc_agent.exit_on_alarm` by default: flush, termination message, exit 3)."""

TAGS_FILE = "sdc-checkpoint.json"
"""The file an integration writes next to a framework's checkpoint files: the guard's tags."""


class AlarmStop(SdcAgentError, RuntimeError):
    """Raised from a framework's hook to stop its training loop on an alarm, before the
    framework applies the alarmed step or writes a checkpoint (its step counter stays at the
    last applied step). Raised on every rank alike; ``alarm`` is the guard's Alarm."""

    def __init__(self, alarm: Alarm) -> None:
        """Keep ``alarm``; the message names the step, the check and the suspects."""
        super().__init__(
            f"sdc_agent stopped training: check {alarm.check!r} failed at step {alarm.step} "
            f"(suspects {alarm.suspects}); that step was not applied"
        )
        self.alarm = alarm


def stop(alarm: Alarm, on_alarm: OnAlarm | None) -> NoReturn:
    """Call ``on_alarm(alarm)`` (it may exit the process), then raise :class:`AlarmStop`."""
    if on_alarm is not None:
        on_alarm(alarm)
    raise AlarmStop(alarm)


def check_on_alarm(on_alarm: OnAlarm | None) -> OnAlarm | None:
    """Validate an integration's ``on_alarm`` argument (a callable or None)."""
    if on_alarm is not None and not callable(on_alarm):
        raise TypeError(
            f"on_alarm must be a callable taking the Alarm (default sdc_agent.exit_on_alarm) or "
            f"None, got {type(on_alarm).__name__}"
        )
    return on_alarm


DEFAULT_ON_ALARM: OnAlarm = exit_on_alarm
"""The default ``on_alarm`` of the integrations that stop a framework themselves."""


def with_accumulation(schedule: Schedule | None, grad_accum: int, source: str) -> Schedule:
    """``schedule`` (default: ``Schedule()``) with the framework's gradient accumulation, read
    from its setting ``source``; a different ``Schedule.grad_accum`` set by hand is refused."""
    schedule = schedule if schedule is not None else Schedule()
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a sdc_agent.Schedule, got {type(schedule).__name__}")
    if schedule.grad_accum not in (1, grad_accum):
        raise ValueError(
            f"Schedule.grad_accum={schedule.grad_accum} but {source}={grad_accum}: leave "
            f"Schedule.grad_accum at 1, the integration reads it from {source}"
        )
    return dataclasses.replace(schedule, grad_accum=grad_accum)


def write_tags(directory: str | os.PathLike, tags: dict[str, Any]) -> Path:
    """Write the guard's checkpoint ``tags`` as :data:`TAGS_FILE` in ``directory`` (atomic)."""
    path = Path(directory, TAGS_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(tags, sort_keys=True))
    os.replace(partial, path)
    return path


def read_tags(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The tags :func:`write_tags` left in ``directory``, or None when there are none."""
    path = Path(directory, TAGS_FILE)
    if not path.exists():
        return None
    tags = json.loads(path.read_text())
    if not isinstance(tags, dict) or not isinstance(tags.get("step"), int):
        raise ValueError(f"{path}: not the guard's checkpoint tags (no integer 'step')")
    return tags


class StepHooks:
    """Turns a framework's hook calls into the guard's step API (see the module docstring).

    Not thread-safe, and not re-entrant: one step at a time, as a training loop runs them.
    """

    def __init__(self, guard: Guard) -> None:
        """Drive ``guard``; nothing runs until the first :meth:`begin_micro_batch`."""
        self.guard = guard
        self.current: GuardedStep | None = None
        """The step being run, or the last one."""
        self.done: GuardedStep | None = None
        """The last step whose update :meth:`after_update` saw: the weights now are its (a
        checkpoint saved between steps, or mid-accumulation, holds them)."""
        self.alarm: Alarm | None = None
        """The first Alarm returned, the same on every rank; None while every check passed."""
        self.start_step: int | None = None
        """The first step run (after :meth:`start`), or None before it."""
        self._index = 0  # micro-batches begun in the current step
        self._micro: contextlib.AbstractContextManager | None = None
        self._updating = False  # before_update passed, after_update not yet run
        self._start_verified = False  # start() compared the weights it starts from

    # ------------------------------------------------------------------ start
    def start(self, start_step: int) -> Alarm | None:
        """Before the first step (collective): refuse to resume from a checkpoint a recorded
        alarm covers (:class:`sdc_agent.UnsafeResumeError` on every rank), then compare every
        replica's weights when ``Schedule.check_on_start`` (a bad load, a bad broadcast)."""
        self.start_step = start_step
        self.guard.check_resume(start_step)
        if self.guard.schedule.check_on_start:
            return self._verify_start(start_step)
        return None

    # ------------------------------------------------------------------ one step
    @property
    def in_micro_batch(self) -> bool:
        """Whether a micro-batch was begun and not ended."""
        return self._micro is not None

    @property
    def micro_batches_begun(self) -> int:
        """Micro-batches begun in the step being run (0 between steps)."""
        return self._index

    @property
    def updating(self) -> bool:
        """Whether the current step passed :meth:`before_update` and waits for its update."""
        return self._updating

    def current_step(self) -> GuardedStep:
        """The step being run, or the last one (:attr:`current`); RuntimeError before the first
        micro-batch began."""
        if self.current is None:
            raise RuntimeError("sdc_agent: no step began yet (begin_micro_batch)")
        return self.current

    def begin_micro_batch(self, step: int) -> None:
        """Before a micro-batch's forward: the first of ``step`` opens the step (the audit
        decision, the RNG seed, the comm hook); each enters the guard's micro-batch (``no_sync``
        on all but the last, the audited one's gradient isolated)."""
        if self._micro is not None:
            raise RuntimeError(
                f"sdc_agent: a micro-batch of step {step} began before the previous one ended"
            )
        if self._updating:
            raise RuntimeError(
                f"sdc_agent: step {step} began before step {self.current_step().step} was "
                "updated: call after_update() after each optimizer step"
            )
        if self._index == 0:
            self.current = self.guard.step(step)
            self.current.begin()
        current = self.current_step()
        if self._index > 0 and step != current.step:
            raise RuntimeError(
                f"sdc_agent: a micro-batch of step {step} began while step {current.step} "
                f"had run {self._index} of its {current.grad_accum} micro-batches"
            )
        if self._index >= current.grad_accum:
            raise RuntimeError(
                f"sdc_agent: step {step} has more micro-batches than Schedule.grad_accum="
                f"{current.grad_accum}"
            )
        self._micro = current.micro_batch(self._index)
        self._micro.__enter__()
        self._index += 1

    def record_backward(self, loss: torch.Tensor) -> None:
        """The framework back-propagated ``loss``, this micro-batch's share of the step's loss
        (:meth:`sdc_agent.GuardedStep.record_backward`)."""
        if self._micro is None:
            raise RuntimeError("sdc_agent: a backward outside a micro-batch (begin_micro_batch)")
        self.current_step().record_backward(loss)

    def end_micro_batch(self) -> None:
        """After the micro-batch's backward."""
        if self._micro is None:
            raise RuntimeError("sdc_agent: end_micro_batch without begin_micro_batch")
        micro, self._micro = self._micro, None
        micro.__exit__(None, None, None)

    def before_update(self) -> Alarm | None:
        """After the step's last backward, before the optimizer step: checks 1 and 2
        (collective). On an Alarm the step's gradients are gone (do not step). When
        :attr:`update_allowed` is False the optimizer may still be called: it finds no
        gradient on this rank and changes nothing (the alarm comes at the next step)."""
        step = self.current
        if step is None or self._micro is not None or self._index != step.grad_accum:
            ran = 0 if step is None else self._index
            need = self.guard.schedule.grad_accum
            raise RuntimeError(
                f"sdc_agent: the optimizer step came after {ran} of the step's {need} "
                "micro-batches (Schedule.grad_accum); the guard checks whole steps only"
            )
        self._index = 0
        alarm = self._note(step.check_gradients())
        self._updating = alarm is None
        return alarm

    @property
    def update_allowed(self) -> bool:
        """False when this rank dropped the step's gradients (see :meth:`before_update`)."""
        return self.current is not None and self.current.update_allowed

    def after_update(self) -> Alarm | None:
        """After the optimizer step (and ``zero_grad``): check 3 when due (collective)."""
        if not self._updating:
            raise RuntimeError("sdc_agent: after_update without a passing before_update")
        self._updating = False
        self.done = self.current_step()
        return self._note(self.done.after_update())

    # ------------------------------------------------------------------ checkpoints, end
    def verify_for_checkpoint(self) -> Alarm | None:
        """Before the framework writes a checkpoint (collective): settle what is in flight and,
        unless they were compared already, compare every replica's weights (those the last
        update left: mid-accumulation, the next update has not touched them yet). An Alarm
        means: do not write it."""
        if self.alarm is not None:
            return self.alarm
        if self.done is not None:
            return self._note(self.done.verify_weights())
        if self._start_verified:
            return None
        if self.start_step is None:
            raise RuntimeError("sdc_agent: a checkpoint before StepHooks.start()")
        return self._verify_start(self.start_step)

    def checkpoint_tags(self) -> dict[str, Any]:
        """The tags of a checkpoint of the weights the last update left (see
        :meth:`sdc_agent.GuardedStep.checkpoint_tags`); before any update in this run, those
        the run started from (the checkpoint it resumed: step ``start_step - 1``)."""
        if self.done is not None:
            return self.done.checkpoint_tags()
        start = self.start_step if self.start_step is not None else 0
        return self.guard.checkpoint_tags(start - 1, verified=self._start_verified)

    def finish(self) -> Alarm | None:
        """After the last step (collective): settle the last step's checks."""
        if self.alarm is not None:
            return self.alarm
        return self._note(self.guard.finish())

    def abort(self) -> None:
        """The framework raised inside a step: leave the micro-batch and the step (restores
        the RNG and kernel flags); the guard's collectives of that step are abandoned."""
        micro, self._micro = self._micro, None
        if micro is not None:
            with contextlib.suppress(Exception):
                micro.__exit__(RuntimeError, RuntimeError("aborted"), None)
        if self.current is not None:
            self.current.end()
        self._index = 0
        self._updating = False

    @contextlib.contextmanager
    def aborting_on_error(self) -> Iterator[None]:
        """Run a framework call; on any exception :meth:`abort` first, then re-raise."""
        try:
            yield
        except BaseException:
            self.abort()
            raise

    def _verify_start(self, start_step: int) -> Alarm | None:
        """Compare the weights the run starts from, ``start_step``'s (collective)."""
        alarm = self._note(self.guard.check_weights(start_step))
        # A pass is recorded only when weights were compared (not under FSDP2 full sharding).
        self._start_verified = alarm is None and self.guard.last_weight_check_pass == start_step
        return alarm

    def _note(self, alarm: Alarm | None) -> Alarm | None:
        if alarm is not None and self.alarm is None:
            self.alarm = alarm
        return alarm
