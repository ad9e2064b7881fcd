"""The guard: the public face of the SDC checks around a data-parallel training step.

:class:`Guard` is what a training loop calls (:meth:`Guard.train`, or :meth:`Guard.step` in a
loop you own, then :meth:`Guard.finish`); :class:`GuardedStep` is one step of a loop you own,
driven by a :class:`StepPhase`. What runs behind them (the set-up checks, the four checks and
the agreement protocol every rank runs in the same order) is the private
:mod:`sdc_agent._coordinator`; the parallelism-specific parts are behind an adapter
(:class:`sdc_agent.parallel.ParallelAdapter`), picked from the model. Architecture:
docs/architecture.md, "The agent".
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ._coordinator import Coordinator
from .alarm import Alarm
from .checks.replay.audit import RebuildBatch
from .checks.replay.environment import StepEnvironment
from .checks.replay.replayer import ComputeLoss, micro_batch_loss, scaled_for_backward
from .config import GuardConfig
from .publisher import Publisher
from .reporting import Passes
from .schedule import Schedule

SaveCheckpoint = Callable[[int, dict[str, Any]], None]

_INTERNAL = frozenset(
    {
        "parallel",
        "sensors",
        "gradients",
        "audit",
        "weights",
        "reporter",
        "alarm_log",
        "ranks",
        "dp_group",
        "global_ranks",
        "named_weights",
        "compute_loss",
        "divide_loss",
        "sensors_planned",
        "decides_every_step",
        "audits_off",
        "node_source",
        "allow_unsafe_resume",
        "begin_step",
        "end_step",
        "read_flags",
        "start_flag_exchange",
        "defer",
        "judge_flags",
        "audits_due",
        "settle",
        "launch_weight_check",
        "drop_gradients",
    }
)
"""Attributes a Guard had before its internals moved to the coordinator (issue 33): still
readable, with a DeprecationWarning, so code written against them keeps working."""


class Guard:
    """Adds the three SDC checks to a DDP, FSDP2 or pipeline-parallel training loop and names the
    GPU that computed wrong.

    ``model`` is a ``DistributedDataParallel`` model, or a module sharded with FSDP2's
    ``fully_shard`` on a 1-D mesh (full sharding) or a 2-D ``("replicate", "shard")`` mesh (HSDP;
    torchtitan's ``("dp_replicate", "fsdp")`` names too), optionally tensor parallel inside (``parallelize_module`` on the ``tp`` dimension of a
    ``("dp", "tp")`` or ``("replicate", "shard", "tp")`` mesh); the guard learns the whole mesh
    from the parameters. ``compute_loss(model, batch)`` must return the loss; it is called with
    the DDP wrapper in training and with the bare module in replays (with FSDP2: the FSDP module
    in both, replays running on every rank at once). ``rebuild_batch(step, rank)`` must return
    exactly the micro-batch global ``rank`` trained on at ``step`` (with ``Schedule.grad_accum``
    = N > 1, the same sequence of N micro-batches); under tensor parallelism the ranks of a TP
    group train on one micro-batch, their group's, and ``Schedule.peer_offset`` must be a
    multiple of the TP degree (the GPUs per node when TP fills a node).
    Construction is collective (it gathers the rank map and checks the topology) and registers
    check 1's hooks (DDP's comm hook, or FSDP2's gradient taps), so build the guard on every
    rank, before the first forward pass.

    With ``pipeline=schedule`` (a ``torch.distributed.pipelining`` schedule driving ``model``,
    this rank's stage, sharded with FSDP2 over the replicas) each step is the schedule's
    ``step`` and ``rebuild_batch(step, rank)`` returns what global ``rank`` fed it (the first
    stage's inputs, the last stage's targets); ``Schedule.peer_offset`` then counts replicas
    (whole pipelines). See :mod:`sdc_agent.parallel.pp`.
    """

    def __init__(
        self,
        model: DistributedDataParallel | nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        compute_loss: ComputeLoss | None = None,
        rebuild_batch: RebuildBatch,
        schedule: Schedule | None = None,
        dp_group: dist.ProcessGroup | None = None,
        publisher: Publisher | None = None,
        scaler: torch.amp.GradScaler | None = None,
        alarm_dir: str | os.PathLike | None = None,
        allow_unsafe_resume: bool = False,
        divide_loss: bool = True,
        pipeline: Any = None,
        config: GuardConfig | None = None,
    ) -> None:
        """Validate the set-up, gather the rank map, check the topology, register the hook.

        ``scaler``: the ``torch.amp.GradScaler`` of fp16 training. Each micro-batch's loss is
        then back-propagated scaled (:meth:`GuardedStep.backward`), replays scale it the same
        way, and a non-finite gradient that a third GPU reproduces at the same scale is an
        overflow: the scaler skips the step and lowers the scale, with no alarm. Under FSDP2
        ``scaler.step`` is a collective (``unscale_`` reduces ``found_inf`` over the mesh), so
        every rank then waits for each step's flags and decides with the others
        (:mod:`sdc_agent.parallel.fsdp`).

        ``alarm_dir``: record every alarm returned in this directory (the checkpoint directory,
        on shared storage; the same value on every rank) and refuse to resume from a checkpoint
        a recorded alarm covers (:meth:`check_resume`, docs/recovery.md); an unwritable directory
        raises OSError here. ``allow_unsafe_resume``: resume anyway, logged (forensics only).

        ``divide_loss``: with ``Schedule.grad_accum`` = N > 1, each micro-batch's
        ``compute_loss`` is divided by N before its backward, in training
        (:meth:`GuardedStep.backward`) and in replays. False: ``compute_loss`` already returns
        the micro-batch's share of the step's loss and is back-propagated as is (the Hugging
        Face Trainer and torchtitan normalise each micro-batch's loss by the whole step's token
        count, so dividing again would change the gradient).

        ``pipeline``: the ``torch.distributed.pipelining`` schedule (``ScheduleGPipe``,
        ``Schedule1F1B``) that drives ``model``, this rank's pipeline stage, sharded with FSDP2
        over the data-parallel dimension. The step is then the schedule's ``step``
        (:meth:`GuardedStep.run_pipeline`), the loss its ``loss_fn`` (leave ``compute_loss``
        out), and ``rebuild_batch(step, rank)`` returns what global ``rank`` fed the pipeline:
        the first stage's inputs, the last stage's targets (:mod:`sdc_agent.parallel.pp`).

        ``config``: the whole configuration as one tree (:class:`sdc_agent.GuardConfig`: audit,
        weights, sensors with their thresholds, training, the report's workload), instead of
        ``schedule``; give one or the other.
        """
        if config is not None:
            if schedule is not None:
                raise TypeError("sdc_agent.Guard takes schedule= or config=, not both")
            if not isinstance(config, GuardConfig):
                raise TypeError(
                    f"Guard config must be a sdc_agent.GuardConfig, got {type(config).__name__}"
                )
            schedule = config.schedule()
        schedule = schedule or Schedule()
        self._config = config or GuardConfig.from_schedule(schedule)
        self._run = Coordinator(
            model,
            optimizer,
            compute_loss=compute_loss,
            rebuild_batch=rebuild_batch,
            schedule=schedule,
            dp_group=dp_group,
            publisher=publisher,
            scaler=scaler,
            alarm_dir=alarm_dir,
            allow_unsafe_resume=allow_unsafe_resume,
            divide_loss=divide_loss,
            pipeline=pipeline,
            sensor_thresholds=config.sensors.thresholds if config is not None else None,
            record_workload=self._config.report.workload,
        )
        """What runs behind the facade (private: :mod:`sdc_agent._coordinator`)."""

    # ------------------------------------------------------------------ what the job is
    @property
    def model(self) -> nn.Module:
        """The model as passed (the DDP wrapper, the FSDP2 module, or the pipeline stage)."""
        return self._run.model

    @property
    def module(self) -> nn.Module:
        """The module replays run on (DDP's bare module; the FSDP2 module itself)."""
        return self._run.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer the guard checks the updates of."""
        return self._run.optimizer

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters, in the order of every fingerprint table."""
        return self._run.params

    @property
    def config(self) -> GuardConfig:
        """The guard's configuration as one tree (given as ``config=``, or mapped from
        ``schedule=``)."""
        return self._config

    @property
    def schedule(self) -> Schedule:
        """When each check runs (:class:`sdc_agent.Schedule`)."""
        return self._run.schedule

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 loss scaler, or None."""
        return self._run.scaler

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self._run.rank

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel rank (DP rank 0 logs and publishes)."""
        return self._run.dp_rank

    @property
    def world(self) -> int:
        """Number of data-parallel ranks."""
        return self._run.world

    # ------------------------------------------------------------------ replaceable parts
    @property
    def rebuild_batch(self) -> RebuildBatch:
        """``rebuild_batch(step, rank)``: the micro-batch global ``rank`` trained on at ``step``
        (replaceable: the audit reads it at each replay)."""
        return self._run.audit.rebuild_batch

    @rebuild_batch.setter
    def rebuild_batch(self, rebuild: RebuildBatch) -> None:
        self._run.audit.rebuild_batch = rebuild

    @property
    def publisher(self) -> Publisher:
        """Where alarms, liveness and the rank map go (from DP rank 0 only); replaceable."""
        return self._run.reporter.publisher

    @publisher.setter
    def publisher(self, publisher: Publisher) -> None:
        self._run.reporter.publisher = publisher

    # ------------------------------------------------------------------ progress (read-only)
    @property
    def passes(self) -> Passes:
        """When each check last passed: ``start_step``, ``last_gradient_check_pass``,
        ``last_audit_pass``, ``last_weight_check_pass``, ``last_weights_digest`` (frozen: the
        checks move it on, nothing else can)."""
        return self._run.reporter.passes

    @property
    def start_step(self) -> int | None:
        """The first step this guard ran or checked the weights at (``passes.start_step``)."""
        return self.passes.start_step

    @property
    def last_gradient_check_pass(self) -> int | None:
        """The last step whose gradients every rank agreed were finite."""
        return self.passes.last_gradient_check_pass

    @property
    def last_audit_pass(self) -> int | None:
        """The last step whose replay audit passed."""
        return self.passes.last_audit_pass

    @property
    def last_weight_check_pass(self) -> int | None:
        """The last step after whose update every replica's weights were bit-identical."""
        return self.passes.last_weight_check_pass

    @property
    def last_weights_digest(self) -> str | None:
        """Digest of the fingerprint table the replicas agreed on at ``last_weight_check_pass``."""
        return self.passes.last_weights_digest

    @property
    def current_step(self) -> int | None:
        """The step being run (fault drills read it); None before the first step."""
        return self._run.current_step

    @property
    def current_micro_batch(self) -> int | None:
        """The micro-batch position being trained or replayed (fault drills read it); None
        outside micro-batches and without accumulation."""
        return self._run.audit.current_micro_batch

    def __getattr__(self, name: str) -> Any:
        """An attribute that moved to the coordinator (:data:`_INTERNAL`): read it there, with a
        DeprecationWarning; anything else is an AttributeError."""
        if name in _INTERNAL and "_run" in self.__dict__:
            warnings.warn(
                f"sdc_agent.Guard.{name} is internal since the guard became a facade; it will "
                "go: use the Guard's public methods and properties",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(self._run, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a moved attribute (:data:`_INTERNAL`) sets it on the coordinator, with a
        DeprecationWarning, rather than shadowing it on the facade where nothing reads it."""
        if name in _INTERNAL and "_run" in self.__dict__:
            warnings.warn(
                f"sdc_agent.Guard.{name} is internal since the guard became a facade; it will "
                "go: pass it to Guard(...) instead",
                DeprecationWarning,
                stacklevel=2,
            )
            setattr(self._run, name, value)
            return
        super().__setattr__(name, value)

    def coverage(self) -> dict[str, Any]:
        """What this guard checks for this job, JSON-ready (the same on every rank).

        Keys: ``schema`` (``sdc.coverage/v1``), ``parallelism`` (``ddp``, ``fsdp``, ``hsdp``,
        ``fsdp+tp`` or ``hsdp+tp``; ``pp+fsdp`` / ``pp+hsdp``, or ``pp+fsdp+tp`` /
        ``pp+hsdp+tp`` with tensor parallel stages, under a pipeline, which adds ``pipeline``:
        its stages, schedule, micro-batches, the ranks holding each stage by replica and the
        stages' TP groups), ``mesh`` (sharded layouts: each dimension's role and size),
        ``sharding`` (replicas, shards, the ranks holding each shard, whether weights have a
        second copy), ``world``, ``ranks``, ``grad_accum``; ``checks`` with
        ``nonfinite_gradients`` (its ``confirmation``, and ``bad_step_skipped``: on the device
        by a fused optimizer's ``found_inf`` or on the host), ``replay_audit`` (``pairs`` of
        replayer/target/third global ranks, ``micro_batches``: which positions are audited) and
        ``weight_fingerprints`` (``replicas`` compared; off under FSDP2 full sharding), each
        with ``on`` and ``why``; ``precision`` (the scaler and how a non-finite gradient is
        judged); ``not_covered``: what no check catches. Logged once at start by DP rank 0.
        """
        return self._run.coverage()

    # ------------------------------------------------------------------ the training loop
    def train(
        self,
        batches: Iterable[Any],
        *,
        save_checkpoint: SaveCheckpoint | None = None,
        start_step: int = 0,
    ) -> Alarm | None:
        """Train on ``batches`` (this rank's, from ``start_step`` on) until they end or a check fails.

        With ``Schedule.grad_accum`` = N > 1 each item of ``batches`` is a sequence of N
        micro-batches: each one's ``compute_loss / N`` is back-propagated, gradients are
        synchronised on the last (:meth:`GuardedStep.micro_batches`). With a ``scaler`` the
        loss is scaled and the update is ``scaler.step(optimizer); scaler.update()``.

        With a ``pipeline`` each item is what this rank feeds the pipeline at that step (the
        first stage's inputs, the last stage's targets, anything elsewhere; with
        ``grad_accum`` = N > 1 a sequence of N of them, one per pipeline step), and the update
        is ``optimizer.step()`` on every rank.

        Returns None when every batch was trained on, else the Alarm (the same on every rank);
        the failing step is not applied (by any rank whose gradient was bad; see :meth:`finish`).
        ``save_checkpoint(step, tags)`` is called on every rank when a checkpoint is due and
        nothing fired; ``tags`` holds ``last_audit_pass``, ``last_weight_check_pass`` and
        ``weights_digest`` (see :meth:`GuardedStep.checkpoint_tags`). With ``alarm_dir``, a
        ``start_step`` whose checkpoint (``start_step - 1``) a recorded alarm covers raises
        UnsafeResumeError (:meth:`check_resume`).
        """
        run = self._run
        self.check_resume(start_step)
        run.optimizer.zero_grad(set_to_none=True)
        if run.schedule.check_on_start and (alarm := self.check_weights(start_step)):
            return alarm
        for step, batch in zip(itertools.count(start_step), batches):
            with self.step(step) as guarded:
                # The forward and backward, as the layout runs them (a pipeline's schedule).
                loss = run.parallel.run_step(guarded, batch, run.compute_loss)
                if alarm := guarded.check_gradients(loss):
                    return alarm
                if guarded.update_allowed:
                    if run.scaler is not None:
                        run.scaler.step(run.optimizer)  # skips a step that overflowed
                        run.scaler.update()
                    else:
                        run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
                if alarm := guarded.after_update():
                    return alarm
                if guarded.checkpoint_due and save_checkpoint is not None:
                    save_checkpoint(step, guarded.checkpoint_tags())
        return self.finish()

    def step(self, step: int) -> GuardedStep:
        """The step API for loops you own, used as ``with guard.step(step) as guarded:``.
        Decides before the forward pass whether ``step`` is an audit step and prepares it on
        entry (hook armed, RNG seeded, deterministic kernels); restores RNG and kernel flags on
        exit. See :class:`GuardedStep` and the README for the loop.
        """
        return GuardedStep(self, step)

    def check_resume(self, start_step: int) -> None:
        """Refuse to resume at ``start_step`` from a checkpoint an alarm covers (collective).

        The run starts at ``start_step`` from the checkpoint saved after step ``start_step - 1``.
        With ``alarm_dir`` set, raises :class:`sdc_agent.UnsafeResumeError` on every rank when a
        recorded alarm's suspect window covers that checkpoint, naming the alarm and the newest
        clean step (unless ``allow_unsafe_resume``); without it, does nothing. :meth:`train` calls
        it; in a loop you own, call it once before the first step, then :meth:`check_weights`.
        """
        run = self._run
        run.alarm_log.check_resume(start_step, allow_unsafe=run.allow_unsafe_resume)

    def check_weights(self, step: int) -> Alarm | None:
        """Check 3 now (collective): every replica's weights must be bit-identical.

        Use it after loading a checkpoint or before saving one; :meth:`train` runs it for you.
        """
        return self._run.check_weights(step)

    def finish(self) -> Alarm | None:
        """Settle the last step's gradient check (collective); call it once after your own loop.

        A corruption after the all-reduce that only some ranks see is reported at the next
        agreement point (the next ``check_gradients``, a weight check, a checkpoint step, or
        this call), naming the step it happened at; :meth:`train` calls this for you.
        Returns that Alarm, or None.
        """
        return self._run.settle()

    def checkpoint_tags(self, step: int, *, verified: bool) -> dict[str, Any]:
        """Tags for a checkpoint of the weights after ``step``'s update: ``step``,
        ``last_audit_pass``, ``last_weight_check_pass``, ``weights_verified`` (``verified``:
        every replica's weights were compared at that step and agreed) and ``weights_digest``
        (the agreed fingerprint table's digest when verified, else None).
        :meth:`GuardedStep.checkpoint_tags` is this for its step; a framework integration calls
        it for weights no step of this run produced (a checkpoint saved before the first update
        after a resume, of the weights :meth:`check_weights` compared on start)."""
        return self._run.checkpoint_tags(step, verified=verified)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Let the publisher deliver what it queued (for the exit path); True when all is sent."""
        return self._run.reporter.flush(timeout)


class StepPhase(enum.Enum):
    """Where a :class:`GuardedStep` is. It moves one way: READY -> COMPUTING -> ENDED, or
    DROPPED instead of ENDED when this rank dropped the step's gradients."""

    READY = "ready"
    """Made by :meth:`Guard.step`: what runs at the step is decided, nothing is armed yet."""
    COMPUTING = "computing"
    """Begun: check 1's taps armed; on seeded steps the RNG seeded, on audited ones the
    kernels deterministic. The forward and backward run now."""
    ENDED = "ended"
    """The computation is over: RNG and kernel flags restored, taps disarmed. The update may
    be applied."""
    DROPPED = "dropped"
    """Ended, and this rank dropped the step's gradients (an alarm, or a bad gradient the other
    ranks judge later): the update applies nothing."""


class WeightsCheck(enum.Enum):
    """Whether check 3 compared a step's weights after its update."""

    NONE = "none"
    """Not compared at this step."""
    LAUNCHED = "launched"
    """A periodic comparison launched by :meth:`GuardedStep.after_update`, judged at the next
    agreement point."""
    COMPARED = "compared"
    """Compared now and judged (a due checkpoint, :meth:`GuardedStep.verify_weights`)."""


class GuardedStep:
    """One guarded training step; made by :meth:`Guard.step`.

    In a loop you own::

        with guard.step(step) as guarded:
            loss = compute_loss(ddp_model, batch)
            loss.backward()
            if alarm := guarded.check_gradients(loss):   # checks 1 and 2; grads dropped
                break
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if alarm := guarded.after_update():          # check 3 when due
                break
            if guarded.checkpoint_due:
                save(step, guarded.checkpoint_tags())

    With gradient accumulation (``Schedule(grad_accum=N)``) and/or a GradScaler, let the step
    run each micro-batch and its backward::

        with guard.step(step) as guarded:
            for micro in guarded.micro_batches(micros):  # N of them; no_sync but the last
                guarded.backward(compute_loss(ddp_model, micro))  # loss / N, scaled
            if alarm := guarded.check_gradients():
                break
            if guarded.update_allowed:
                scaler.step(optimizer)                   # or optimizer.step() without one
                scaler.update()
            optimizer.zero_grad(set_to_none=True)
            ...
    """

    def __init__(self, guard: Guard, step: int) -> None:
        """Decide what runs at ``step`` (before its forward pass)."""
        self.guard = guard
        """The guard this step belongs to."""
        self._run = run = guard._run
        self.step = step
        self.audit = run.audits_due(step)
        """Whether this step runs the ring replay audit."""
        self.weight_check_due = run.schedule.is_weight_check_step(step)
        """Whether :meth:`after_update` compares weight fingerprints."""
        self.checkpoint_due = run.schedule.is_checkpoint_step(step)
        """Whether a checkpoint is due after this step's update."""
        self.phase = StepPhase.READY
        """Where the step is: decided, computing, ended, or ended with its gradients dropped."""
        self.weights = WeightsCheck.NONE
        """Whether this step's weights were compared: not, launched for the next agreement
        point (:meth:`after_update`), or compared now (:meth:`verify_weights`)."""
        self.alarm: Alarm | None = None
        self.grad_accum = run.schedule.grad_accum
        """Micro-batches in this step (``Schedule.grad_accum``)."""
        self.audited_micro_batch: int | None = (
            run.schedule.audited_micro_batch(step) if self.audit else None
        )
        """The position of the micro-batch this step's audit replays (None: not an audit step)."""
        self._deterministic = self.audit and run.schedule.deterministic_audits
        self._seeded = run.seeds(step, audit=self.audit)
        self._environment: StepEnvironment | None = None
        self._entered = 0  # micro-batches entered so far
        self._current: int | None = None  # the micro-batch being run
        self._backwards = 0
        self._recorded_loss: torch.Tensor | None = None

    @property
    def update_allowed(self) -> bool:
        """False when this rank dropped the step's gradients (its reduced gradient was bad while
        other ranks' were not, or an alarm failed the step); ``optimizer.step()`` then finds no
        gradients and changes nothing, and the alarm follows at the next agreement point
        (:meth:`Guard.finish`).

        On a common step of a guard whose optimizer skips a bad step on the device (a fused
        Adam/AdamW, docs/usage/checks.md) the host does not know the verdict yet: True, and
        ``optimizer.step()`` itself applies nothing when this rank's flags were bad (its
        ``found_inf``); the alarm follows at the next agreement point all the same. Checkpoint
        and weight-check steps are decided on the host, so nothing is saved or compared on a
        verdict not yet known."""
        return self.phase is not StepPhase.DROPPED

    @property
    def scaled(self) -> bool:
        """Whether the guard's GradScaler scales each micro-batch's loss (:meth:`backward`)."""
        return self._run.scaler is not None

    def __enter__(self) -> GuardedStep:
        """Enter the step: :meth:`begin` (``with guard.step(step) as guarded``)."""
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        """Leave the step: :meth:`end` (also on an exception), and give the optimizer its
        ``found_inf`` back when this step set it (:meth:`check_gradients`)."""
        self.end()
        self._run.disarm_skip()

    def begin(self) -> None:
        """Arm the comm hook; on audit steps seed the RNG and select deterministic kernels."""
        if self.phase is not StepPhase.READY:
            raise RuntimeError(
                f"sdc_agent: step {self.step} was already begun (it is {self.phase.value}): "
                "make a new guard.step(step) for each step"
            )
        self.phase = StepPhase.COMPUTING  # before arming: end() undoes a half-armed begin
        self._environment = self._run.begin_step(
            self.step,
            audit=self.audit,
            deterministic=self._deterministic,
            position=self.audited_micro_batch or 0,
            seeded=self._seeded,
        )

    # ------------------------------------------------------------------ micro-batches
    def run_pipeline(self, feed: Any) -> list[torch.Tensor]:
        """Run one step of the guard's pipeline schedule with what this rank feeds it (the
        first stage's inputs, the last stage's targets); returns the last stage's losses, one
        per micro-batch of the schedule (empty on the other stages). Call it ``grad_accum``
        times per step (once without accumulation), then :meth:`check_gradients`."""
        g = self._run
        if not g.parallel.schedule_runs_backward:
            raise RuntimeError(
                "sdc_agent: GuardedStep.run_pipeline needs a guard built with pipeline=schedule"
            )
        with self.micro_batch(self._entered):
            losses = g.parallel.run_pipeline_step(feed)
        self._backwards += 1
        return losses

    def micro_batches(self, micros: Iterable[Any]) -> Iterator[Any]:
        """Yield the step's ``grad_accum`` micro-batches in order, each inside
        :meth:`micro_batch`: call :meth:`backward` once for each."""
        self._refuse_under_pipeline("micro_batches")
        micros = list(micros)
        if len(micros) != self.grad_accum:
            raise ValueError(
                f"step {self.step} has {len(micros)} micro-batches; Schedule.grad_accum is "
                f"{self.grad_accum}"
            )
        for index, micro in enumerate(micros):
            with self.micro_batch(index):
                yield micro

    @contextlib.contextmanager
    def micro_batch(self, index: int) -> Iterator[None]:
        """Run micro-batch ``index``'s forward and backward inside: gradients are synchronised
        only on the last one (the others run in the adapter's ``no_sync``); on a seeded step the
        RNG is seeded for it; the audited one's gradient is isolated for the audit."""
        if index != self._entered or index >= self.grad_accum or self._current is not None:
            raise RuntimeError(
                f"sdc_agent: micro-batch {index} of step {self.step}: run the step's "
                f"{self.grad_accum} micro-batches once each, in order, one at a time"
            )
        audited = index == self.audited_micro_batch
        g = self._run
        g.audit.begin_micro_batch(
            self.step,
            index,
            audited=audited,
            seeded=self._seeded,
            isolate=audited and self._deterministic and self.grad_accum > 1,
        )
        self._current = index
        sync = index == self.grad_accum - 1
        try:
            with contextlib.nullcontext() if sync else g.parallel.no_sync():
                yield
        finally:
            self._current = None
            self._entered += 1
            g.audit.end_micro_batch()

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's ``loss``: ``loss / grad_accum`` (as is without
        accumulation or with ``Guard(divide_loss=False)``), times the scaler's scale when the
        guard has one. Inside :meth:`micro_batch` (or :meth:`micro_batches`); without
        accumulation it may also be called on its own, once."""
        self._refuse_under_pipeline("backward")
        self._expect_backward("backward")
        share = micro_batch_loss(loss, self.grad_accum if self._run.divide_loss else 1)
        self._record_loss(share)
        scaled_for_backward(share, self._run.scaler).backward()
        self._backwards += 1

    def record_backward(self, loss: torch.Tensor) -> None:
        """Record a micro-batch's backward that a framework ran itself (PyTorch Lightning's
        closure, the Hugging Face Trainer's ``training_step``, ``accelerator.backward``),
        instead of :meth:`backward`. Same rules as :meth:`backward`: inside :meth:`micro_batch`,
        once per micro-batch.

        ``loss``: exactly what the framework back-propagated for this micro-batch, before any
        loss scaling: ``compute_loss(model, micro) / grad_accum`` (``compute_loss`` itself
        without accumulation or with ``Guard(divide_loss=False)``), so that a replay, which
        computes the same, compares bit for bit. ``scaler.scale(loss).backward()`` with the
        guard's scaler, or ``loss.backward()`` without one, must be what the framework ran."""
        self._refuse_under_pipeline("record_backward")
        self._expect_backward("record_backward")
        self._record_loss(loss)
        self._backwards += 1

    def end(self) -> None:
        """Restore RNG and kernel flags (idempotent) and disarm the hook."""
        if self.phase in (StepPhase.ENDED, StepPhase.DROPPED):
            return
        self.phase = StepPhase.ENDED
        if self._environment is not None:
            self._environment.restore()
            self._environment = None
        self._run.end_step()

    def check_gradients(self, loss: torch.Tensor | None = None) -> Alarm | None:
        """Checks 1 and 2 after ``loss.backward()`` and before ``optimizer.step()`` (collective).

        ``loss``: the step's loss; leave it out when the step ran :meth:`backward` (which
        recorded the audited micro-batch's). Clips the reduced gradient when
        ``Schedule.max_grad_norm`` is set (after ``scaler.unscale_`` with a scaler). On an
        alarm the gradients are dropped (set to None) so the step cannot be applied; returns the
        Alarm. An fp16 overflow is not an alarm: the gradients stay non-finite, so
        ``scaler.step`` skips the step and ``scaler.update`` lowers the scale.

        With a fused Adam/AdamW and no scaler (``Schedule.skip_on_device``), a common step
        reads nothing to the host: the flags go to the optimizer as its ``found_inf`` (it
        skips the update on the device when they are bad) and a bad step's Alarm comes at the
        next agreement point, as for a step only some ranks flagged.
        """
        g = self._run
        # Misuse raises before any collective, on every rank alike.
        if self._backwards and self._backwards != self.grad_accum:
            raise RuntimeError(
                f"check_gradients: step {self.step} back-propagated {self._backwards} of its "
                f"{self.grad_accum} micro-batches through GuardedStep.backward"
            )
        if g.parallel.schedule_runs_backward and self._backwards != self.grad_accum:
            raise RuntimeError(
                f"check_gradients: step {self.step} ran {self._backwards} of its "
                f"{self.grad_accum} pipeline steps through GuardedStep.run_pipeline"
            )
        if self.grad_accum > 1 and not self._backwards:
            raise RuntimeError(
                f"check_gradients: Schedule.grad_accum is {self.grad_accum}: run each "
                "micro-batch with guarded.micro_batches(...) and guarded.backward(loss)"
            )
        if self._backwards:
            loss = self._recorded_loss
        if loss is None and not g.parallel.schedule_runs_backward:  # in the schedule's rows
            raise TypeError("check_gradients needs the step's loss (or use guarded.backward)")
        g.gradients.require_reduction()
        if g.skips_on_device:
            # This rank's flags stay on the device (clipping first, a collective); the previous
            # step's were copied to host memory without blocking (HostFlags).
            own = g.device_flags()
            if (alarm := g.settle()) is not None:
                return self._refuse(alarm)
            if self._decided_later():
                # The common step: no host read. The optimizer skips the update on the device
                # when this rank's flags are bad; every rank settles them at the next agreement
                # point, where a bad step is reported as the host path reports it.
                g.skip_on_device(self.step, own)
                self.end()
                return None
            flags = g.read_own(self.step, own)  # decided on the host: the step's one read
        else:
            # The step's one host read: this rank's flags and the previous step's reduction,
            # which ran during this step's forward and backward (clipping first, a collective).
            flags = g.read_flags(self.step)
            # Every rank settles the previous step's exchanges before launching this step's, so
            # the collectives pair up in order.
            if (alarm := g.settle()) is not None:
                return self._refuse(alarm)
        now = g.decides_now  # the same on every rank (a function of the step)
        exchange, own_flags_bad = g.start_flag_exchange(flags)
        together = g.decides_every_step  # FSDP2 + scaler: scaler.step is a collective
        if not self.audit and not own_flags_bad and not now and not together:
            g.defer(exchange)  # settled at the next agreement point
            self.end()
            return None
        summary = exchange.summary()
        # On a step a check decides now (its sensors checked), every rank waits here, so that a
        # candidate is replayed while every rank still holds the step's state.
        if self.audit or summary.unanimous or now or together:
            # Every rank is here, at this step, with the step's exact state: decide now.
            alarm = g.judge_flags(
                exchange, loss, deterministic=self._deterministic, audit=self.audit
            )
        else:
            # Only some ranks see a bad gradient; the others have moved on. Drop ours, and let
            # every rank report it at the next agreement point.
            g.defer(exchange)
            self._drop_step()
            return None
        self.end()
        return self._refuse(alarm) if alarm is not None else None

    def after_update(self) -> Alarm | None:
        """Check 3 after ``optimizer.step()`` when due (every ``check_every`` steps, and before
        a checkpoint when ``check_on_checkpoint``). Returns the Alarm, or None."""
        g = self._run
        g.disarm_skip()  # the update is over: the optimizer's found_inf is the user's again
        if self.checkpoint_due:
            # Nothing is saved before every rank agrees on the gradients (and weights, if asked).
            if (alarm := g.settle()) is not None:
                self.alarm = alarm
                return alarm
            if self.weight_check_due:
                return self.verify_weights()
            return self.alarm
        if self.weight_check_due:
            g.launch_weight_check(self.step)  # judged at the next agreement point
            self.weights = WeightsCheck.LAUNCHED
        return None

    def verify_weights(self) -> Alarm | None:
        """Compare every replica's weights now, after this step's update (collective): for a
        checkpoint the framework saves at a step where :attr:`checkpoint_due` was False (an
        epoch end, a best model, a save the user asked for). Settles what is in flight first.

        On success :meth:`checkpoint_tags` then says ``weights_verified``; returns the Alarm
        otherwise (do not save). Does nothing more once this step's weights were compared (by
        :meth:`after_update` before a due checkpoint, or an earlier call)."""
        if self.weights is WeightsCheck.COMPARED:
            return self.alarm
        launched = self.weights is WeightsCheck.LAUNCHED
        self.weights = WeightsCheck.COMPARED
        g = self._run
        if (alarm := g.settle()) is not None:
            self.alarm = alarm
            return alarm
        if launched and g.reporter.passes.last_weight_check_pass == self.step:
            return None  # the periodic comparison after_update launched at this step passed
        self.alarm = g.check_weights(self.step)
        return self.alarm

    def checkpoint_tags(self) -> dict[str, Any]:
        """Tags for a checkpoint saved after this step's update.

        ``weights_digest`` is the digest of the fingerprint table every replica agreed on at this
        step (None when the weights were not compared at this step: then ``weights_verified`` is
        False and ``last_weight_check_pass`` says when they last were).
        """
        g = self._run
        # A pass recorded at this very step: a comparison that compared nothing (check 3 off,
        # FSDP2 full sharding) verifies nothing.
        verified = (
            self.weights is WeightsCheck.COMPARED
            and self.alarm is None
            and g.reporter.passes.last_weight_check_pass == self.step
        )
        return g.checkpoint_tags(self.step, verified=verified)

    # ------------------------------------------------------------------ internals
    def _decided_later(self) -> bool:
        """Whether this step's flags may be settled at the next agreement point, with a bad
        step skipped by the optimizer on the device: a common step (no audit, no check that
        decides now, no checkpoint or weight comparison after its update, which must not run
        on a verdict not yet known). The same on every rank (a function of the step)."""
        return not (
            self.audit or self.checkpoint_due or self.weight_check_due or self._run.decides_now
        )

    def _refuse_under_pipeline(self, name: str) -> None:
        """A pipeline's step is its schedule's: the guard does not run its backward."""
        if self._run.parallel.schedule_runs_backward:
            raise RuntimeError(
                f"sdc_agent: GuardedStep.{name} runs a micro-batch's backward; with a pipeline "
                "the schedule runs them: call guarded.run_pipeline(feed)"
            )

    def _expect_backward(self, name: str) -> None:
        """Refuse a second backward outside the micro-batches (``name``: the method called)."""
        if self._current is None and (self.grad_accum > 1 or self._backwards):
            raise RuntimeError(
                f"sdc_agent: GuardedStep.{name} is one micro-batch's backward: call it once "
                "inside each micro-batch of guarded.micro_batches(...)"
            )

    def _record_loss(self, share: torch.Tensor) -> None:
        """Keep the audited micro-batch's loss share: what the audit compares with the replay."""
        position = self.audited_micro_batch if self.audit else self.grad_accum - 1
        if self._current is None or self._current == position:
            self._recorded_loss = share.detach()

    def _drop_step(self) -> None:
        """Do not apply this step: restore RNG and kernels, drop the gradients."""
        self.end()
        self._run.drop_gradients()
        self.phase = StepPhase.DROPPED

    def _refuse(self, alarm: Alarm) -> Alarm:
        """Fail the step with an alarm already logged and published."""
        self._drop_step()
        self.alarm = alarm
        return alarm
