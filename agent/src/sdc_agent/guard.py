"""The guard: the wiring of the three SDC checks around a data-parallel training step.

Each check lives in its own module; this one decides when each runs and, above all, fixes the
ORDER of the collectives: every rank must issue the same collectives in the same order, or the
job hangs (or, worse, pairs up the wrong tensors). The checks (architecture: docs/architecture.md,
"The agent"):

1. Non-finite gradients, every step (:mod:`sdc_agent.checks.gradients`): the comm hook flags each
   bucket of the local gradient before the all-reduce and sums the reduced one after it; one small
   asynchronous all-reduce of three flags says whether any rank's local or reduced (clipped)
   gradient is NaN/Inf, and only then a gather names the ranks. Either fails the step. A rank
   waits for the reduction only when its own flags are bad, on audit and checkpoint steps, and at
   the next step's check or the end of the loop.
2. Ring replay audit, on audit steps (:mod:`sdc_agent.checks.replay`): every rank recomputes
   another rank's micro-batch on the bare module and the results are compared bit for bit.
3. Weight fingerprints (:mod:`sdc_agent.checks.weights`), after the update every ``check_every``
   steps and before checkpoints. Before a checkpoint the comparison is awaited at once; a periodic
   one is launched after the update and judged at the next agreement point (the next step's
   check, whose step is then not applied on a failure), naming the step whose weights were
   compared.

A step that fails check 1 or 2 is not applied: its gradients are dropped and the optimizer does
not step, so the exact state is still there for the confirmation replays. Every decision is made
from gathered data with the same code on every rank, so every rank returns the same Alarm and no
rank is left waiting in a collective the others skipped. Alarms are built, logged and published
in :mod:`sdc_agent.reporting`; the parallelism-specific parts are behind an adapter
(:class:`sdc_agent.parallel.ParallelAdapter`), picked from the model:
:class:`~sdc_agent.parallel.ddp.DDPAdapter` for DDP, :class:`~sdc_agent.parallel.fsdp.FSDP2Adapter`
for FSDP2 (``fully_shard``: full sharding or HSDP), :class:`~sdc_agent.parallel.tp.TensorParallelAdapter`
for tensor parallelism composed with them. Each check asks it what it compares: where
check 1's taps go, check 2's replay unit and whether replays run in lockstep, and which ranks
hold copies of the weights check 3 compares.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .alarm import Alarm, RankInfo
from .checks.gradients.exchange import FlagExchange, GradientCheck, StepFlags
from .checks.replay.audit import RebuildBatch, ring_audit_type
from .checks.replay.environment import StepEnvironment
from .checks.replay.pipeline import PipelineReplayer
from .checks.replay.pipeline_audit import PipelineRingAudit
from .checks.replay.replayer import ComputeLoss, micro_batch_loss, scaled_for_backward
from .checks.replay.setup import (
    AuditSetupError,
    SetupFinding,
    compute_signature,
    heterogeneity_finding,
)
from .checks.weights.check import weight_check
from .coverage import describe
from .fingerprint import prepare_backend
from .parallel import ParallelAdapter, adapter_for
from .publisher import NullPublisher, Publisher
from .recording import open_alarm_log
from .reporting import Reporter
from .schedule import Schedule
from .sensors.abft import sensor_backend
from .sensors.check import SensorCheck
from .topology import TopologyError, all_gather_text, groups_on, rank_map, validate_placement

logger = logging.getLogger("sdc_agent")

SaveCheckpoint = Callable[[int, dict[str, Any]], None]

_DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")


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
        """
        self.pipelined = pipeline is not None
        """A pipeline schedule drives the model: each step runs its ``step``."""
        schedule = schedule or Schedule()
        if self.pipelined:  # before the adapter's collectives: every rank refuses alike
            _check_pipeline_options(pipeline, compute_loss, scaler, schedule)
        self.parallel: ParallelAdapter = adapter_for(model, dp_group, pipeline)
        """The parallelism-specific parts (the training model, the bare module, where check 1's
        taps go, check 2's replay unit, the replicas check 3 compares)."""
        if not isinstance(divide_loss, bool):
            raise TypeError(f"Guard divide_loss must be True or False, got {divide_loss!r}")
        self.divide_loss = divide_loss
        """Whether each micro-batch's loss is divided by ``Schedule.grad_accum`` before its
        backward (False: ``compute_loss`` returns the share already)."""
        if not self.pipelined and not callable(compute_loss):
            raise TypeError(
                "Guard needs callables compute_loss(model, batch) and rebuild_batch(step, rank)"
            )
        if not callable(rebuild_batch):
            raise TypeError(
                "Guard needs callables compute_loss(model, batch) and rebuild_batch(step, rank)"
            )
        if scaler is not None and not all(
            callable(getattr(scaler, name, None))
            for name in ("scale", "step", "update", "unscale_")
        ):
            raise TypeError(
                f"Guard scaler must be a torch.amp.GradScaler (or None), got {type(scaler).__name__}"
            )
        if scaler is not None and not scaler.is_enabled():
            scaler = None  # a disabled scaler scales nothing: plain bf16/fp32 rules apply
        self.scaler = scaler
        """The fp16 loss scaler, or None (bf16/fp32: a reproducible NaN is an alarm naming nobody)."""
        a = self.parallel
        self.decides_every_step = (scaler is not None and a.unscale_is_collective) or (
            self.pipelined
        )
        """Every rank waits for each step's flags and judges a flagged step with the others:
        with a scaler whose ``step`` is a collective (FSDP2), no rank may skip an update that
        another applies; under a pipeline, the stages of the model update together or not at
        all (a NaN sent back to one stage reaches neither the later stages nor their
        replicas, which would otherwise apply the step). A pipeline's ranks wait for each other
        at every step anyway (its sends and receives), so the wait costs little."""
        self.model = model
        self.module: nn.Module = a.module
        self.optimizer = optimizer
        self.compute_loss = compute_loss
        self.schedule = schedule
        self.dp_group = a.dp_group
        self.rank = a.rank
        self.dp_rank = a.dp_rank
        self.global_ranks = a.global_ranks
        self.world = a.world
        self.params = a.params
        self.named_weights = a.named_weights
        self._check_determinism_preconditions()
        _check_optimizer_owns(optimizer, self.module)
        self.audits_off: str | None = None
        """Why the replay audit stopped (a set-up finding), or None while it runs."""

        # Collective: every rank gathers the rank map at construction.
        self.ranks: dict[int, RankInfo] = rank_map(a.dp_group)
        self.node_source = "NODE_NAME" if os.environ.get("NODE_NAME") else "hostname"
        """Where this rank's node name came from: NODE_NAME (the pod's spec.nodeName through
        the downward API) or, when it is unset, the hostname (a pod's, which is not its node)."""
        try:
            # Along each ring of replicas (one per pipeline stage under a pipeline), with the
            # ranks that compute together (tensor parallel) by their positions on that ring.
            for column in a.replica_columns():
                nodes = [self.ranks[g].node_name for g in column]
                validate_placement(
                    nodes, self.schedule.peer_offset, groups_on(column, a.compute_groups)
                )
            can_confirm = True
        except TopologyError as exc:
            # Audits need the placement; so does a scaler (an overflow is told from a faulty
            # GPU by a replay on a third node).
            if self.schedule.audit_every > 0 or self.scaler is not None:
                if self.node_source == "hostname":
                    raise TopologyError(
                        f"NODE_NAME is not set on rank {self.rank}, so node names came from "
                        f"the hostname ({self.ranks[self.rank].node_name!r}), which in a pod is "
                        "the pod's name, not its node's: set NODE_NAME from the pod's "
                        "spec.nodeName (downward API, docs/agent-install.md) before changing "
                        f"peer_offset. The placement check said: {exc}"
                    ) from exc
                raise
            can_confirm = False  # no audits: check 1 still names ranks, without confirmation
        self._can_confirm = can_confirm
        # Collective: bitwise replays need ranks that compute alike (checks/replay/setup.py).
        heterogeneous = (
            heterogeneity_finding(
                all_gather_text(compute_signature(a.param_device), a.dp_group),
                list(a.global_ranks),
            )
            if self.schedule.audit_every > 0
            else None
        )

        self.reporter = Reporter(
            self.ranks, publisher or NullPublisher(), publishes=self.dp_rank == 0
        )
        """Builds, logs and publishes Alarms; records when each check last passed."""
        self.alarm_log = open_alarm_log(alarm_dir, a.dp_group, writes=self.dp_rank == 0)
        """Where every alarm is recorded (docs/recovery.md); a no-op without ``alarm_dir``."""
        self.reporter.record_alarm = self.alarm_log.record
        self.allow_unsafe_resume = allow_unsafe_resume
        self.gradients = GradientCheck(self.params, a.dp_group, self.world)
        """Check 1: the gradient taps' statistics and the per-step flag exchange."""
        a.install_gradient_taps(self.gradients.hook_state)
        replayer = a.make_replayer(
            compute_loss,  # type: ignore[arg-type]
            self.gradients.hook_state,
            grad_accum=self.schedule.grad_accum,
            scaler=self.scaler,
            divide_loss=divide_loss,
        )
        # The audit for the adapter's replay unit: each rank alone, every rank in lockstep, or
        # whole pipeline steps compared stage by stage.
        audit_type = (
            PipelineRingAudit if isinstance(replayer, PipelineReplayer) else ring_audit_type(a)
        )
        self.audit = audit_type(
            a,  # type: ignore[arg-type]
            replayer,  # type: ignore[arg-type]
            rebuild_batch,
            self.reporter,
            peer_offset=self.schedule.peer_offset,
            can_confirm=can_confirm,
            overflow_is_expected=self.scaler is not None,
            skipped_audits_allowed=self.schedule.max_skipped_audits,
            stops_on_setup_error=self.schedule.on_setup_error == "stop",
        )
        """Check 2: the ring replay audit and the confirmation replays."""
        if heterogeneous is not None:
            self._refuse_audits_at_start(heterogeneous)
        self.weights = weight_check(a.weight_replicas(), self.reporter)
        """Check 3: weight fingerprint comparisons."""
        # SENSORS: under DDP and FSDP2/HSDP (a candidate's confirmation replays collectively
        # there, as check 2's do).
        self.sensors = SensorCheck(
            self.module,
            self.schedule,
            adapter=a,
            unsupported=(
                "pipeline parallelism: a candidate would be confirmed by replaying one stage, "
                "which the pipeline cannot do without its other stages"
                if self.pipelined
                else None
            ),
        )
        """Online GEMM sensors of protected layers (sdc_agent.sensors); candidates confirmed by
        replays. A do-nothing without protected layers."""
        self.sensors_planned = self.sensors.enabled
        """Whether online sensors run in this job (decided once: without them, a step skips
        every sensor call). Their plan itself is made at the first step (the cost model needs
        the batch's rows), so this asks whether there is a board to plan for, not a plan."""
        # The kernels' backends chosen now: on a GPU with Triton, their compiles and
        # self-checks (one sync each) run here, not inside the first forward or backward.
        prepare_backend(a.param_device)
        if self.sensors_planned:
            sensor_backend(a.param_device)

        self.current_step: int | None = None
        """The step being run (fault drills read it); None before the first step."""
        self.reporter.publish_rank_map()
        if self.reporter.publishes:
            if self.node_source == "hostname":
                logger.warning(
                    "sdc_agent: NODE_NAME is not set: node names come from the hostname (%s), "
                    "which in a Kubernetes pod is the pod's name; set NODE_NAME from the pod's "
                    "spec.nodeName (downward API) so that replays land on other nodes and an "
                    "alarm names the right node",
                    self.ranks[self.rank].node_name,
                )
            if self.schedule.sensors and not self.sensors_planned and not self.sensors.unsupported:
                # Schedule(sensors=True) is the default, but only protected layers have
                # sensors: say so plainly, with the line that turns them on.
                logger.warning(
                    "sdc_agent: no online sensor checks this model: none of its layers is "
                    "protected. Add `sdc.protect(model)` before wrapping it in DDP or "
                    "fully_shard (and before building the Guard); or pass "
                    "Schedule(sensors=False) to silence this"
                )
            logger.info("sdc_agent: coverage %s", json.dumps(self.coverage()))

    def coverage(self) -> dict[str, Any]:
        """What this guard checks for this job, JSON-ready (the same on every rank).

        Keys: ``schema`` (``sdc.coverage/v1``), ``parallelism`` (``ddp``, ``fsdp``, ``hsdp``,
        ``fsdp+tp`` or ``hsdp+tp``; ``pp+fsdp`` / ``pp+hsdp``, or ``pp+fsdp+tp`` /
        ``pp+hsdp+tp`` with tensor parallel stages, under a pipeline, which adds ``pipeline``:
        its stages, schedule, micro-batches, the ranks holding each stage by replica and the
        stages' TP groups), ``mesh`` (sharded layouts: each dimension's role and size),
        ``sharding`` (replicas, shards, the ranks holding each shard, whether weights have a
        second copy), ``world``, ``ranks``, ``grad_accum``; ``checks`` with
        ``nonfinite_gradients`` (and its ``confirmation``), ``replay_audit`` (``pairs`` of
        replayer/target/third global ranks, ``micro_batches``: which positions are audited) and
        ``weight_fingerprints`` (``replicas`` compared; off under FSDP2 full sharding), each
        with ``on`` and ``why``; ``precision`` (the scaler and how a non-finite gradient is
        judged); ``not_covered``: what no check catches. Logged once at start by DP rank 0.
        """
        # SENSORS: which protected layers' GEMMs are checked online, and at what rate.
        sensors = self.sensors.describe()
        report = describe(
            self.schedule,
            global_ranks=list(self.global_ranks),
            can_confirm=self._can_confirm,
            scaler=self.scaler,
            param_dtypes=[str(p.dtype).removeprefix("torch.") for p in self.params],
            layout=self.parallel.coverage_facts(),
            sensors_on=bool(sensors["on"]),
            replica_columns=self.parallel.replica_columns(),
            pipeline=self.parallel.pipeline_facts() if self.pipelined else None,  # type: ignore[attr-defined]
        )
        report["checks"]["online_sensors"] = sensors
        audit = report["checks"]["replay_audit"]
        if self.audits_off is not None:
            audit.update(on=False, why=f"turned off by a set-up finding: {self.audits_off}")
            audit["pairs"] = []
        elif audit["on"] and not self.audit.compare_grads:
            audit["compares"] = "loss bits only (the preflight found gradients not reproducible)"
        report["preflight"] = {
            "done": self.audit.preflight_done,
            "at": "the first audit step: two replays of each rank's own micro-batch, compared "
            "with each other and with its training; every replay's batch compared with the "
            "trained one",
            "notes": list(self.audit.preflight_notes),
            "nondeterministic_ops": sorted(self.audit.nondeterministic_ops),
            "node_names_from": self.node_source,
        }
        return report

    # ------------------------------------------------------------------ attributes kept public
    @property
    def rebuild_batch(self) -> RebuildBatch:
        """``rebuild_batch(step, rank)``: the micro-batch global ``rank`` trained on at ``step``
        (replaceable: the audit reads it at each replay)."""
        return self.audit.rebuild_batch

    @rebuild_batch.setter
    def rebuild_batch(self, rebuild: RebuildBatch) -> None:
        self.audit.rebuild_batch = rebuild

    @property
    def publisher(self) -> Publisher:
        """Where alarms, liveness and the rank map go (from DP rank 0 only); replaceable."""
        return self.reporter.publisher

    @publisher.setter
    def publisher(self, publisher: Publisher) -> None:
        self.reporter.publisher = publisher

    @property
    def current_micro_batch(self) -> int | None:
        """The micro-batch position being trained or replayed (fault drills read it); None
        outside micro-batches and without accumulation."""
        return self.audit.current_micro_batch

    # ------------------------------------------------------------------ progress
    @property
    def start_step(self) -> int | None:
        """The first step this guard ran or checked the weights at."""
        return self.reporter.passes.start_step

    @start_step.setter
    def start_step(self, step: int | None) -> None:
        self.reporter.passes.start_step = step

    @property
    def last_gradient_check_pass(self) -> int | None:
        """The last step whose gradients every rank agreed were finite."""
        return self.reporter.passes.last_gradient_check_pass

    @last_gradient_check_pass.setter
    def last_gradient_check_pass(self, step: int | None) -> None:
        self.reporter.passes.last_gradient_check_pass = step

    @property
    def last_audit_pass(self) -> int | None:
        """The last step whose replay audit passed."""
        return self.reporter.passes.last_audit_pass

    @last_audit_pass.setter
    def last_audit_pass(self, step: int | None) -> None:
        self.reporter.passes.last_audit_pass = step

    @property
    def last_weight_check_pass(self) -> int | None:
        """The last step after whose update every replica's weights were bit-identical."""
        return self.reporter.passes.last_weight_check_pass

    @last_weight_check_pass.setter
    def last_weight_check_pass(self, step: int | None) -> None:
        self.reporter.passes.last_weight_check_pass = step

    @property
    def last_weights_digest(self) -> str | None:
        """Digest of the fingerprint table the replicas agreed on at ``last_weight_check_pass``."""
        return self.reporter.passes.last_weights_digest

    @last_weights_digest.setter
    def last_weights_digest(self, digest: str | None) -> None:
        self.reporter.passes.last_weights_digest = digest

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
        self.check_resume(start_step)
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule.check_on_start and (alarm := self.check_weights(start_step)):
            return alarm
        plain = self.schedule.grad_accum == 1 and self.scaler is None and not self.pipelined
        for step, batch in zip(itertools.count(start_step), batches):
            with self.step(step) as guarded:
                loss: torch.Tensor | None = None
                if self.pipelined:
                    # One pipeline step (the schedule's micro-batches), or grad_accum of them.
                    for feed in batch if self.schedule.grad_accum > 1 else [batch]:
                        guarded.run_pipeline(feed)
                elif plain:
                    loss = self.compute_loss(self.parallel.model, batch)  # type: ignore[misc]
                    loss.backward()
                else:
                    micros = batch if self.schedule.grad_accum > 1 else [batch]
                    for micro in guarded.micro_batches(micros):
                        guarded.backward(self.compute_loss(self.parallel.model, micro))  # type: ignore[misc]
                if alarm := guarded.check_gradients(loss):
                    return alarm
                if guarded.update_allowed:
                    if self.scaler is not None:
                        self.scaler.step(self.optimizer)  # skips a step that overflowed
                        self.scaler.update()
                    else:
                        self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
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
        self.alarm_log.check_resume(start_step, allow_unsafe=self.allow_unsafe_resume)

    def check_weights(self, step: int) -> Alarm | None:
        """Check 3 now (collective): every replica's weights must be bit-identical.

        Use it after loading a checkpoint or before saving one; :meth:`train` runs it for you.
        """
        if self.start_step is None:
            self.start_step = step
        if (alarm := self.settle()) is not None:
            return alarm
        return self.weights.compare_now(step)

    def finish(self) -> Alarm | None:
        """Settle the last step's gradient check (collective); call it once after your own loop.

        A corruption after the all-reduce that only some ranks see is reported at the next
        agreement point (the next ``check_gradients``, a weight check, a checkpoint step, or
        this call), naming the step it happened at; :meth:`train` calls this for you.
        Returns that Alarm, or None.
        """
        return self.settle()

    def checkpoint_tags(self, step: int, *, verified: bool) -> dict[str, Any]:
        """Tags for a checkpoint of the weights after ``step``'s update: ``step``,
        ``last_audit_pass``, ``last_weight_check_pass``, ``weights_verified`` (``verified``:
        every replica's weights were compared at that step and agreed) and ``weights_digest``
        (the agreed fingerprint table's digest when verified, else None).
        :meth:`GuardedStep.checkpoint_tags` is this for its step; a framework integration calls
        it for weights no step of this run produced (a checkpoint saved before the first update
        after a resume, of the weights :meth:`check_weights` compared on start)."""
        return {
            "step": step,
            "last_audit_pass": self.last_audit_pass,
            "last_weight_check_pass": self.last_weight_check_pass,
            "weights_digest": self.last_weights_digest if verified else None,
            "weights_verified": verified,
        }

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Let the publisher deliver what it queued (for the exit path); True when all is sent."""
        return self.reporter.flush(timeout)

    # ------------------------------------------------------------------ steps (GuardedStep uses these)
    def begin_step(
        self,
        step: int,
        *,
        audit: bool,
        deterministic: bool,
        position: int = 0,
        seeded: bool = False,
    ) -> StepEnvironment:
        """Before ``step``'s forward pass: arm check 1's hook and prepare an audit step
        (``position``: the micro-batch it replays; ``seeded``: seed a step that is not audited
        too, so that a confirmation replays it exactly).

        Returns the RNG and kernel state to restore when the step's computation is over.
        """
        self.current_step = step
        passes = self.reporter.passes
        if passes.start_step is None:
            passes.start_step = step
        # With accumulation the comm hook sees the accumulated gradient; the audited
        # micro-batch's own is fingerprinted by the audit's isolation instead.
        # A pipeline step's local gradient starts from none: each audited one captures its own.
        capture = deterministic and (self.schedule.grad_accum == 1 or self.pipelined)
        self.gradients.arm(capture_fingerprints=capture, device=self.parallel.param_device)
        if self.sensors_planned:
            self.sensors.begin_step(step)  # SENSORS: arm this step's share of the rotation
        return self.audit.prepare_step(
            step, audit=audit, deterministic=deterministic, position=position, seeded=seeded
        )

    def end_step(self) -> None:
        """The step's forward and backward are over: stop capturing (idempotent)."""
        self.gradients.disarm()
        self.audit.end_step()
        if self.sensors_planned:
            self.sensors.end_step()

    def read_flags(self, step: int) -> StepFlags:
        """Check 1's one host read of a step: this rank's flags, read with the previous step's
        flag reduction (waited for, so that :meth:`settle` then judges it without reading
        again; :meth:`GradientCheck.read_flags`).

        With a scaler and ``max_grad_norm`` the gradients are unscaled first
        (``scaler.unscale_``), so the clipping sees true values; ``scaler.step`` then does not
        unscale them again."""
        if self.scaler is not None and self.schedule.max_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
        return self.gradients.read_flags(
            step,
            max_grad_norm=self.schedule.max_grad_norm,
            # SENSORS: travels in the same reduction
            sensor_flag=self.sensors.take_flag() if self.sensors_planned else None,
        )

    def start_flag_exchange(self, flags: StepFlags | int) -> tuple[FlagExchange, bool]:
        """Check 1's per-step collective: launch the reduction of ``flags`` (from
        :meth:`read_flags`, after :meth:`settle`, which every rank does first, at the same
        point; a step number reads them here). Returns the exchange and whether this rank's own
        flags are bad."""
        if isinstance(flags, int):
            flags = self.read_flags(flags)
        exchange = self.gradients.launch(flags, device=self.parallel.collective_device)
        return exchange, flags.bad

    def defer(self, exchange: FlagExchange) -> None:
        """Leave ``exchange`` to be settled by every rank at the next agreement point."""
        self.gradients.pending = exchange

    def judge_flags(
        self,
        exchange: FlagExchange,
        loss: torch.Tensor | None,
        *,
        deterministic: bool,
        audit: bool = True,
    ) -> Alarm | None:
        """Judge a step's flags while every rank is at that step with its exact state (an audit
        step, or every rank flagged something). Collective, in this order: the detail gather
        when something is set, then the confirmation replays, or, when every flag is clean
        (only on an audit step), the audit of ``loss``'s step.

        ``audit``: the step is an audit step (False: a step judged at once only because its
        online sensors checked; a clean table then needs nothing more).

        Returns the Alarm, logged and published, or None (the step may be applied).
        """
        table = exchange.table()
        if table.clean:
            self.last_gradient_check_pass = exchange.step
            if not audit:
                return None  # SENSORS: a sensed step that every rank agrees is clean
            alarm = self.audit.audit(
                exchange.step,
                loss,
                self.gradients.local_table() if deterministic else None,
                deterministic=deterministic,
            )
            if alarm is not None and alarm.is_setup:
                return self._set_up_wrong(alarm)
        elif not table.nonfinite and not any(table.reduced):
            # SENSORS: only online sensors flagged: a candidate, confirmed or dismissed by replays.
            alarm = self.sensors.judge(
                table,
                self.audit,
                self.reporter,
                deterministic=self.schedule.deterministic_audits,
            )
            if alarm is None:
                self.last_gradient_check_pass = exchange.step
        else:
            # None for an fp16 overflow that replays reproduce: the scaler skips the step.
            alarm = self.audit.judge_nonfinite(
                table, deterministic=self.schedule.deterministic_audits
            )
        return self.reporter.log_and_publish(alarm) if alarm is not None else None

    def audits_due(self, step: int) -> bool:
        """Whether ``step`` runs the replay audit: the schedule's audit step, unless a set-up
        finding turned the audits off."""
        return self.audits_off is None and self.schedule.is_audit_step(step)

    def _set_up_wrong(self, alarm: Alarm) -> None:
        """A set-up finding (the same on every rank): report it naming nobody, then turn the
        audits and their confirmations off (they would judge GPUs on replays that do not
        reproduce training), or, with ``Schedule(on_setup_error="stop")``, raise
        :class:`AuditSetupError` on every rank. The step itself is applied: its gradients were
        finite on every rank, and nothing says a GPU computed them wrong."""
        self.reporter.publish_setup(alarm)
        setup = alarm.setup or {}
        reason = f"{setup.get('cause')}: {setup.get('detail')}"
        self.audits_off = reason
        self.audit.can_confirm = False
        self.reporter.record_skipped_audit(alarm.step)
        if self.schedule.on_setup_error == "stop":
            raise AuditSetupError(
                f"sdc_agent: stopped at step {alarm.step}: the replay audit found the job's "
                f"set-up wrong, not a GPU (nobody is named): {reason}. Fix: {setup.get('fix')}"
            )
        return None

    def _refuse_audits_at_start(self, finding: SetupFinding) -> None:
        """A set-up finding before the first step (the same on every rank): the audits never
        start (logged, in ``coverage()``), or ``Schedule(on_setup_error="stop")`` raises
        :class:`AuditSetupError` on every rank."""
        if self.schedule.on_setup_error == "stop":
            raise AuditSetupError(f"sdc_agent: {finding.message()}")
        self.audits_off = f"{finding.cause}: {finding.detail}"
        self.audit.can_confirm = False
        if self.reporter.publishes:
            logger.error(
                "sdc_agent: the replay audit is off from the start, a set-up finding (not a "
                "GPU): %s",
                finding.message(),
            )

    def settle(self) -> Alarm | None:
        """The agreement point: judge what is in flight (collective; every rank calls it at the
        same points, in this order: the previous step's flags, then a launched weight check).
        Returns the first Alarm (logged and published), or None."""
        exchange, self.gradients.pending = self.gradients.pending, None
        weights = self.weights.take_in_flight()
        alarm = None
        if exchange is not None:
            if exchange.summary().clean:  # the usual step: no per-rank table is built
                self.reporter.passes.last_gradient_check_pass = exchange.step
            else:
                table = exchange.table()  # collective: some rank flagged something
                # Settled a step late: some ranks applied that step, so replays cannot see it.
                alarm = self.reporter.log_and_publish(
                    self.audit.flags_alarm(
                        table, confirm=False, deterministic=self.schedule.deterministic_audits
                    )
                )
        if weights is not None:
            step, check = weights
            if alarm is None:
                alarm = self.weights.judge(step, check)
            else:
                check.wait()  # every rank stops here; the comparison no longer matters
        return alarm

    def launch_weight_check(self, step: int) -> None:
        """Check 3 after ``step``'s update, judged at the next agreement point (collective)."""
        self.weights.launch(step)

    def drop_gradients(self) -> None:
        """Set every gradient to None so that ``optimizer.step()`` cannot apply this step."""
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------------------ internals
    def _check_determinism_preconditions(self) -> None:
        """Deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG before the first matmul."""
        audits = self.schedule.audit_every > 0 and self.schedule.deterministic_audits
        if audits and self.parallel.param_device.type == "cuda":
            value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
            if value not in _DETERMINISTIC_CUBLAS:
                raise ValueError(
                    "deterministic audits on CUDA need the environment variable "
                    f"CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before training, got {value!r}; "
                    "or use Schedule(deterministic_audits=False)"
                )


def _check_optimizer_owns(optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
    """Refuse an optimizer that does not own every trainable parameter of the model: those
    parameters would get gradients that no step applies, and a replay audit would compare a
    model that training never changes (a clear error now, on every rank alike, instead of a
    misleading one later)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(
            f"Guard optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    owned = {id(p) for group in groups for p in group["params"]}
    missing = [
        name for name, p in module.named_parameters() if p.requires_grad and id(p) not in owned
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ValueError(
            f"sdc_agent.Guard: the optimizer does not own {len(missing)} trainable parameter(s) "
            f"of the model ({shown}): they would train without ever changing. Build the "
            "optimizer from this model's parameters (after wrapping it in DDP or fully_shard, "
            "whose parameters are the ones that train), or set requires_grad=False on what is "
            "frozen"
        )


def _check_pipeline_options(
    pipeline: Any, compute_loss: ComputeLoss | None, scaler: Any, schedule: Schedule
) -> None:
    """Refuse what a pipeline-driven guard cannot honour, before any collective."""
    if compute_loss is not None:
        raise TypeError(
            "sdc_agent.Guard: with a pipeline the loss is the schedule's loss_fn (on the last "
            "stage); leave compute_loss out"
        )
    if scaler is not None:
        raise ValueError(
            "sdc_agent.Guard: a GradScaler with a pipeline schedule is not supported (the loss "
            "is scaled inside the schedule, out of the guard's reach); train in bf16 or fp32"
        )
    if schedule.grad_accum > 1 and getattr(pipeline, "scale_grads", False):
        raise ValueError(
            f"sdc_agent.Guard: Schedule.grad_accum={schedule.grad_accum} runs that many pipeline "
            "steps per optimizer step, and a schedule built with scale_grads=True divides the "
            "accumulated gradient by its micro-batches at every one of them; build it with "
            "scale_grads=False and scale the loss in loss_fn"
        )


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
        self.step = step
        self.audit = guard.audits_due(step)
        """Whether this step runs the ring replay audit."""
        self.weight_check_due = guard.schedule.is_weight_check_step(step)
        """Whether :meth:`after_update` compares weight fingerprints."""
        self.checkpoint_due = guard.schedule.is_checkpoint_step(step)
        """Whether a checkpoint is due after this step's update."""
        self.update_allowed = True
        """False when this rank dropped the step's gradients (its reduced gradient was bad while
        other ranks' were not); ``optimizer.step()`` then finds no gradients and changes
        nothing, and the alarm follows at the next agreement point (:meth:`Guard.finish`)."""
        self.alarm: Alarm | None = None
        self.grad_accum = guard.schedule.grad_accum
        """Micro-batches in this step (``Schedule.grad_accum``)."""
        self.audited_micro_batch: int | None = (
            guard.schedule.audited_micro_batch(step) if self.audit else None
        )
        """The position of the micro-batch this step's audit replays (None: not an audit step)."""
        self._deterministic = self.audit and guard.schedule.deterministic_audits
        # With a scaler every step is seeded, so that confirming an overflow replays the
        # micro-batches exactly as they trained (dropout included).
        # SENSORS: with online sensors too, so that a candidate's confirmation replays it exactly.
        self._seeded = (
            self.audit
            or guard.scaler is not None
            or (guard.sensors_planned and guard.sensors.checks_at(step))
        )
        self._environment: StepEnvironment | None = None
        self._ended = False  # end() ran since begin(): a second end() has nothing to undo
        self._weights_checked = False
        self._weights_launched = False  # after_update launched this step's periodic comparison
        self._entered = 0  # micro-batches entered so far
        self._current: int | None = None  # the micro-batch being run
        self._backwards = 0
        self._recorded_loss: torch.Tensor | None = None

    def __enter__(self) -> GuardedStep:
        """Enter the step: :meth:`begin` (``with guard.step(step) as guarded``)."""
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        """Leave the step: :meth:`end` (also on an exception)."""
        self.end()

    def begin(self) -> None:
        """Arm the comm hook; on audit steps seed the RNG and select deterministic kernels."""
        self._ended = False
        self._environment = self.guard.begin_step(
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
        g = self.guard
        if not g.pipelined:
            raise RuntimeError(
                "sdc_agent: GuardedStep.run_pipeline needs a guard built with pipeline=schedule"
            )
        with self.micro_batch(self._entered):
            losses = g.parallel.run_pipeline_step(feed)  # type: ignore[attr-defined]
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
        g = self.guard
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
        share = micro_batch_loss(loss, self.grad_accum if self.guard.divide_loss else 1)
        self._record_loss(share)
        scaled_for_backward(share, self.guard.scaler).backward()
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
        if self._ended:
            return
        self._ended = True
        if self._environment is not None:
            self._environment.restore()
            self._environment = None
        self.guard.end_step()

    def check_gradients(self, loss: torch.Tensor | None = None) -> Alarm | None:
        """Checks 1 and 2 after ``loss.backward()`` and before ``optimizer.step()`` (collective).

        ``loss``: the step's loss; leave it out when the step ran :meth:`backward` (which
        recorded the audited micro-batch's). Clips the reduced gradient when
        ``Schedule.max_grad_norm`` is set (after ``scaler.unscale_`` with a scaler). On an
        alarm the gradients are dropped (set to None) so the step cannot be applied; returns the
        Alarm. An fp16 overflow is not an alarm: the gradients stay non-finite, so
        ``scaler.step`` skips the step and ``scaler.update`` lowers the scale.
        """
        g = self.guard
        # Misuse raises before any collective, on every rank alike.
        if self._backwards and self._backwards != self.grad_accum:
            raise RuntimeError(
                f"check_gradients: step {self.step} back-propagated {self._backwards} of its "
                f"{self.grad_accum} micro-batches through GuardedStep.backward"
            )
        if g.pipelined and self._backwards != self.grad_accum:
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
        if loss is None and not g.pipelined:  # a pipeline's loss is in its last stage's rows
            raise TypeError("check_gradients needs the step's loss (or use guarded.backward)")
        g.gradients.require_reduction()
        # The step's one host read: this rank's flags and the previous step's reduction, which
        # ran during this step's forward and backward (clipping first, a collective).
        flags = g.read_flags(self.step)
        # Every rank settles the previous step's exchanges before launching this step's, so
        # the collectives pair up in order.
        if (alarm := g.settle()) is not None:
            return self._refuse(alarm)
        sensing = g.sensors.sensing  # the same on every rank (a function of the step)
        exchange, own_flags_bad = g.start_flag_exchange(flags)
        together = g.decides_every_step  # FSDP2 + scaler: scaler.step is a collective
        if not self.audit and not own_flags_bad and not sensing and not together:
            g.defer(exchange)  # settled at the next agreement point
            self.end()
            return None
        summary = exchange.summary()
        # SENSORS: on a step whose sensors checked, every rank waits here, so that a candidate
        # is replayed while every rank still holds the step's state (and none has applied it).
        if self.audit or summary.unanimous or sensing or together:
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
        g = self.guard
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
            self._weights_launched = True
        return None

    def verify_weights(self) -> Alarm | None:
        """Compare every replica's weights now, after this step's update (collective): for a
        checkpoint the framework saves at a step where :attr:`checkpoint_due` was False (an
        epoch end, a best model, a save the user asked for). Settles what is in flight first.

        On success :meth:`checkpoint_tags` then says ``weights_verified``; returns the Alarm
        otherwise (do not save). Does nothing more once this step's weights were compared (by
        :meth:`after_update` before a due checkpoint, or an earlier call)."""
        if self._weights_checked:
            return self.alarm
        self._weights_checked = True
        g = self.guard
        if (alarm := g.settle()) is not None:
            self.alarm = alarm
            return alarm
        if self._weights_launched and g.last_weight_check_pass == self.step:
            return None  # the periodic comparison after_update launched at this step passed
        self.alarm = g.check_weights(self.step)
        return self.alarm

    def checkpoint_tags(self) -> dict[str, Any]:
        """Tags for a checkpoint saved after this step's update.

        ``weights_digest`` is the digest of the fingerprint table every replica agreed on at this
        step (None when the weights were not compared at this step: then ``weights_verified`` is
        False and ``last_weight_check_pass`` says when they last were).
        """
        g = self.guard
        # A pass recorded at this very step: a comparison that compared nothing (check 3 off,
        # FSDP2 full sharding) verifies nothing.
        verified = (
            self._weights_checked and self.alarm is None and g.last_weight_check_pass == self.step
        )
        return g.checkpoint_tags(self.step, verified=verified)

    # ------------------------------------------------------------------ internals
    def _refuse_under_pipeline(self, name: str) -> None:
        """A pipeline's step is its schedule's: the guard does not run its backward."""
        if self.guard.pipelined:
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
        self.guard.drop_gradients()
        self.update_allowed = False

    def _refuse(self, alarm: Alarm) -> Alarm:
        """Fail the step with an alarm already logged and published."""
        self._drop_step()
        self.alarm = alarm
        return alarm
