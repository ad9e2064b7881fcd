"""The guard's coordinator (private): the assembly of the four checks around a training step,
and the agreement protocol every rank runs in the same order.

:class:`sdc_agent.Guard` is the public facade over it; :class:`sdc_agent.GuardedStep` drives
it through one step. Nothing here is public API: its members change as the checks do.

The coordinator decides when each check runs and, above all, fixes the ORDER of the
collectives: every rank must issue the same collectives in the same order, or the job hangs
(or, worse, pairs up the wrong tensors). The checks (architecture: docs/architecture.md,
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
4. Online sensors (:mod:`sdc_agent.checks.sensors`, over :mod:`sdc_agent.sensors`): checksums of
   protected layers' GEMMs, their flag in check 1's reduction, candidates confirmed by check 2's
   replays.

The four follow one protocol (:class:`sdc_agent.checks.protocol.Check`): the coordinator holds
them in one tuple and calls each at the same points of a step (seeding, begin, end, its flag,
whether the step is decided at once, its coverage), so no check is spliced into the others'
code; only judging, whose inputs and order the agreement protocol fixes, is each check's own.

A step that fails check 1 or 2 is not applied: its gradients are dropped and the optimizer does
not step, so the exact state is still there for the confirmation replays. With a fused
Adam/AdamW a common step is instead skipped by the optimizer on the device when this rank's
flags are bad (:meth:`Coordinator.skip_on_device`), and judged at the next agreement point.
Every decision is made from gathered data with the same code on every rank, so every rank
returns the same Alarm and no rank is left waiting in a collective the others skipped. Alarms
are built, logged and published in :mod:`sdc_agent.reporting`; the parallelism-specific parts
are behind an adapter (:class:`sdc_agent.parallel.ParallelAdapter`), picked from the model,
which also builds check 2's audit for its replay unit and runs a step's forward and backward (a
pipeline's schedule), so nothing here branches on the wrapper.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .alarm import Alarm, RankInfo
from .checks.gradients.exchange import FlagExchange, GradientCheck, HostFlags, StepFlags
from .checks.gradients.verdicts import NonfiniteVerdicts
from .checks.protocol import Check, StepStart
from .checks.replay.audit import RebuildBatch
from .checks.replay.environment import StepEnvironment
from .checks.replay.replayer import ComputeLoss
from .checks.replay.setup import (
    AuditSetupError,
    SetupFinding,
    compute_signature,
    heterogeneity_finding,
)
from .checks.sensors.check import SensorCheck
from .checks.weights.check import WeightCheck, weight_check
from .coverage import describe
from .fingerprint import prepare_backend
from .parallel import ParallelAdapter, adapter_for, check_step_options
from .publisher import NullPublisher, Publisher
from .recording import open_alarm_log
from .reporting import Reporter
from .schedule import Schedule
from .sensors.maths.abft import sensor_backend
from .sensors.runtime.board import SensorConfig
from .topology import TopologyError, all_gather_text, groups_on, rank_map, validate_placement
from .workload import WorkloadRecorder

logger = logging.getLogger("sdc_agent")

_DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")


class Coordinator:
    """What a :class:`sdc_agent.Guard` runs: the set-up checks, the four checks, and the
    agreement protocol (see the module docstring). Built by the Guard, with its arguments."""

    def __init__(
        self,
        model: DistributedDataParallel | nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        compute_loss: ComputeLoss | None,
        rebuild_batch: RebuildBatch,
        schedule: Schedule | None,
        dp_group: dist.ProcessGroup | None,
        publisher: Publisher | None,
        scaler: torch.amp.GradScaler | None,
        alarm_dir: str | os.PathLike | None,
        allow_unsafe_resume: bool,
        divide_loss: bool,
        pipeline: Any,
        sensor_thresholds: SensorConfig | None = None,
        record_workload: bool = True,
    ) -> None:
        """Validate the set-up, gather the rank map, check the topology, register the hooks
        (collective; the arguments are :class:`sdc_agent.Guard`'s; ``sensor_thresholds``:
        ``GuardConfig.sensors.thresholds``; ``record_workload``: record the job's op shapes on
        the first forward pass for the alarm report's ``workload``)."""
        schedule = schedule or Schedule()
        # Before the adapter's collectives: every rank refuses alike.
        check_step_options(pipeline, compute_loss, scaler, schedule.grad_accum)
        self.parallel: ParallelAdapter = adapter_for(model, dp_group, pipeline)
        """The parallelism-specific parts (the training model, the bare module, where check 1's
        taps go, check 2's replay unit, the replicas check 3 compares)."""
        if not isinstance(divide_loss, bool):
            raise TypeError(f"Guard divide_loss must be True or False, got {divide_loss!r}")
        self.divide_loss = divide_loss
        """Whether each micro-batch's loss is divided by ``Schedule.grad_accum`` before its
        backward (False: ``compute_loss`` returns the share already)."""
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
        self.decides_every_step = (
            scaler is not None and a.unscale_is_collective
        ) or a.steps_judged_together
        """Every rank waits for each step's flags and judges a flagged step with the others:
        with a scaler whose ``step`` is a collective (FSDP2), no rank may skip an update that
        another applies; on a layout whose steps are judged together (a pipeline's stages
        update together or not at all)."""
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
        self.gradients = GradientCheck(
            self.params,
            a.dp_group,
            self.world,
            grad_accum=self.schedule.grad_accum,
            taps_see_each_micro_batch=a.taps_see_each_micro_batch,
            device=a.param_device,
        )
        """Check 1: the gradient taps' statistics and the per-step flag exchange."""
        a.install_gradient_taps(self.gradients.hook_state)
        self.skips_on_device = (
            self.schedule.skip_on_device
            and not self.decides_every_step
            and can_skip_on_device(optimizer, self.scaler)
            and a.collective_device == a.param_device
        )
        """Whether a common step's bad gradient is skipped by the optimizer on the device
        (``found_inf``), its flags read at the next agreement point: a fused Adam/AdamW, no
        GradScaler (which owns ``found_inf``), every rank deciding alone, and the flags'
        collective on the parameters' device (else the flags would be copied to the host)."""
        self._host_flags = HostFlags(a.collective_device) if self.skips_on_device else None
        self._skip_armed: tuple[Any, Any] | None = None
        replayer = a.make_replayer(
            compute_loss,  # type: ignore[arg-type]  # None only with a pipeline, whose adapter takes None (check_step_options refused it elsewhere)
            self.gradients.hook_state,
            grad_accum=self.schedule.grad_accum,
            scaler=self.scaler,
            divide_loss=divide_loss,
        )
        # The audit for the adapter's replay unit: each rank alone, every rank in lockstep, or
        # whole pipeline steps compared stage by stage.
        self.audit = a.make_audit(
            replayer,
            rebuild_batch,
            self.reporter,
            peer_offset=self.schedule.peer_offset,
            can_confirm=can_confirm,
            overflow_is_expected=self.scaler is not None,
            skipped_audits_allowed=self.schedule.max_skipped_audits,
            stops_on_setup_error=self.schedule.on_setup_error == "stop",
        )
        """Check 2: the ring replay audit and the confirmation replays."""
        self.nonfinite = NonfiniteVerdicts(self.audit, self.reporter)
        """Check 1's verdicts on a flag table that is not clean (confirmed by check 2's replays)."""
        if heterogeneous is not None:
            self._refuse_audits_at_start(heterogeneous)
        self.weights = weight_check(a.weight_replicas(), self.reporter)
        """Check 3: weight fingerprint comparisons."""
        # Under DDP and FSDP2/HSDP (a candidate's confirmation replays collectively there, as
        # check 2's do); the adapter says why not elsewhere.
        self.sensors = SensorCheck(
            self.module,
            self.schedule,
            adapter=a,
            unsupported=a.sensors_unsupported,
        )
        """Check 4: online GEMM sensors of protected layers (sdc_agent.sensors); candidates
        confirmed by replays. A do-nothing without protected layers."""
        self.checks: tuple[Check, ...] = (self.gradients, self.audit, self.weights, self.sensors)
        """The four checks, in the order every rank calls them at each point of a step
        (:mod:`sdc_agent.checks.protocol`)."""
        if sensor_thresholds is not None and self.sensors.board is not None:
            self.sensors.board.configure(sensor_thresholds)
        self.sensors_planned = self.sensors.enabled
        """Whether online sensors run in this job (decided once: without them, a step skips
        every sensor call). Their plan itself is made at the first step (the cost model needs
        the batch's rows), so this asks whether there is a board to plan for, not a plan."""
        # The kernels' backends chosen now: on a GPU with Triton, their compiles and
        # self-checks (one sync each) run here, not inside the first forward or backward.
        prepare_backend(a.param_device)
        if self.sensors_planned:
            sensor_backend(a.param_device)

        # Not under a pipeline: its stages hold different layers, and the Alarm must be the
        # same on every rank.
        self.workload: WorkloadRecorder | None = (
            WorkloadRecorder(self.module, on_recorded=self.reporter.set_workload)
            if record_workload and pipeline is None
            else None
        )
        """Records the job's op shapes (on the bare module's inner layers: DDP's, FSDP2's) on
        the first forward pass for the alarm report's ``workload``, then removes its hooks;
        never raises into training (sdc_agent.workload). None under a pipeline."""

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
            if self.schedule.sensors and self.sensors.unsupported:
                # Protected layers on a layout where sensors cannot run: they are not checked.
                logger.warning(
                    "sdc_agent: the protected layers are not checked online here: %s; the "
                    "other checks run (Schedule(sensors=False) silences this)",
                    self.sensors.unsupported,
                )
            elif self.schedule.sensors and not self.sensors_planned and a.sensors_unsupported:
                # Nothing protected, and protecting would not help on this layout: say what is
                # true (no advice to call sdc.protect).
                logger.info(
                    "sdc_agent: no online sensors on this layout (%s)", a.sensors_unsupported
                )
            elif self.schedule.sensors and not self.sensors_planned:
                # Schedule(sensors=True) is the default, but only protected layers have
                # sensors: say so plainly, with the line that turns them on.
                logger.warning(
                    "sdc_agent: no online sensor checks this model: none of its layers is "
                    "protected. Add `sdc.protect(model)` before wrapping it in DDP or "
                    "fully_shard (and before building the Guard); or pass "
                    "Schedule(sensors=False) to silence this"
                )
            logger.info("sdc_agent: coverage %s", json.dumps(self.coverage()))

    @property
    def audits_off(self) -> str | None:
        """Why the replay audit stopped (a set-up finding), or None while it runs."""
        return self.audit.off_because

    def coverage(self) -> dict[str, Any]:
        """What the guard checks for this job, JSON-ready (``Guard.coverage`` says the keys):
        what the schedule and the layout plan (:func:`sdc_agent.coverage.describe`), each
        check's entry as the check itself describes it, and the preflight's findings."""
        report = describe(
            self.schedule,
            global_ranks=list(self.global_ranks),
            can_confirm=self._can_confirm,
            scaler=self.scaler,
            param_dtypes=[str(p.dtype).removeprefix("torch.") for p in self.params],
            layout=self.parallel.coverage_facts(),
            sensors_on=self.sensors.enabled,
            replica_columns=self.parallel.replica_columns(),
            pipeline=self.parallel.pipeline_facts(),
        )
        entries = report["checks"]
        for check in self.checks:
            entries[check.coverage_key] = check.describe(entries.get(check.coverage_key, {}))
        entries["nonfinite_gradients"]["bad_step_skipped"] = (
            "on the device: the fused optimizer's found_inf skips a common step whose flags are "
            "bad, read at the next agreement point (no host read on a healthy common step)"
            if self.skips_on_device
            else "on the host: the step's flags are read before optimizer.step(), and a bad "
            "step's gradients are dropped"
        )
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

    def check_weights(self, step: int) -> Alarm | None:
        """Check 3 now (collective): every replica's weights must be bit-identical.

        ``Guard.check_weights``.
        """
        self.reporter.record_start(step)
        if (alarm := self.settle()) is not None:
            return alarm
        return self.weights.compare_now(step)

    def checkpoint_tags(self, step: int, *, verified: bool) -> dict[str, Any]:
        """Tags for a checkpoint of the weights after ``step``'s update: ``step``,
        ``last_audit_pass``, ``last_weight_check_pass``, ``weights_verified`` (``verified``:
        every replica's weights were compared at that step and agreed) and ``weights_digest``
        (the agreed fingerprint table's digest when verified, else None).
        ``Guard.checkpoint_tags``."""
        passes = self.reporter.passes
        return {
            "step": step,
            "last_audit_pass": passes.last_audit_pass,
            "last_weight_check_pass": passes.last_weight_check_pass,
            "weights_digest": passes.last_weights_digest if verified else None,
            "weights_verified": verified,
        }

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
        self.disarm_skip()  # the previous step's update is over
        self.current_step = step
        self.reporter.record_start(step)
        start = StepStart(
            step, audit=audit, deterministic=deterministic, position=position, seeded=seeded
        )
        for check in self.checks:
            check.begin_step(start)
        return self.audit.environment

    def seeds(self, step: int, *, audit: bool) -> bool:
        """Whether ``step``'s computation is seeded from (step, rank) (the same on every rank):
        an audit step; with a scaler every step, so that confirming an overflow replays the
        micro-batches exactly as they trained (dropout included); and a step a check asks for
        (:meth:`Check.seeds`: one its candidates' confirmation replays)."""
        return audit or self.scaler is not None or any(c.seeds(step) for c in self.checks)

    @property
    def decides_now(self) -> bool:
        """Whether a check needs this step's flags judged at once, every rank at the step with
        its exact state (:attr:`Check.decides_now`)."""
        return any(check.decides_now for check in self.checks)

    def device_flags(self) -> torch.Tensor:
        """This rank's flags of the step as an int64 tensor on the device, nothing read to the
        host (:meth:`GradientCheck.device_flags`; clipping first, a collective): for a guard
        that :attr:`skips_on_device`. The checks' flag is taken here, as :meth:`read_flags`
        takes it."""
        return self.gradients.device_flags(
            max_grad_norm=self.schedule.max_grad_norm, sensor_flag=self._checks_flag()
        )

    def skip_on_device(self, step: int, own: torch.Tensor) -> None:
        """A common step on a guard that :attr:`skips_on_device`, after :meth:`settle`: launch
        the exchange of ``own`` (from :meth:`device_flags`), stage its values for the next
        agreement point's read, and have the optimizer's next ``step()`` skip the update on
        the device when ``own`` is bad: nothing is read to the host.

        The outcome is the host path's: a rank whose flags are bad applies nothing (there the
        gradients are dropped; here the fused kernel returns early and takes its step count
        back), the others apply the step, and every rank settles the exchange at the next
        agreement point (:meth:`settle`), which raises the same alarm."""
        exchange = self.gradients.launch_device(step, own)
        exchange.skipped_on_device = True
        assert self._host_flags is not None
        exchange.stage(self._host_flags)
        # Exactly 1.0 or 0.0: the fused kernels skip on found_inf == 1 and subtract it from
        # each parameter's step count (torch/optim/adam.py _fused_adam).
        self._arm_skip(own.amax().to(torch.float32))
        self.defer(exchange)

    def _arm_skip(self, found_inf: torch.Tensor) -> None:
        """Set the optimizer's ``found_inf`` for its next step (``grad_scale`` None: the
        gradients are not scaled), keeping what the user had there."""
        self.disarm_skip()
        o = self.optimizer
        self._skip_armed = (getattr(o, "found_inf", _ABSENT), getattr(o, "grad_scale", _ABSENT))
        o.found_inf = found_inf  # type: ignore[attr-defined]  # read by torch's fused step
        o.grad_scale = None  # type: ignore[attr-defined]  # the same (None: not scaled)

    def disarm_skip(self) -> None:
        """Restore the optimizer's ``found_inf`` and ``grad_scale`` as the user had them
        (removed when they had none), once the armed step is over: after the update, at the
        next step or agreement point. Idempotent."""
        if self._skip_armed is None:
            return
        saved, self._skip_armed = self._skip_armed, None
        for name, value in zip(("found_inf", "grad_scale"), saved, strict=True):
            if value is _ABSENT:
                if name in vars(self.optimizer):
                    delattr(self.optimizer, name)
            else:
                setattr(self.optimizer, name, value)

    def end_step(self) -> None:
        """The step's forward and backward are over: stop capturing (idempotent)."""
        for check in self.checks:
            check.end_step()
        if self.workload is not None and not self.workload.done:
            self.workload.finish()  # the first step is over, even if the model's hook never ran

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
            step, max_grad_norm=self.schedule.max_grad_norm, sensor_flag=self._checks_flag()
        )

    def _checks_flag(self) -> torch.Tensor | None:
        """The checks' flags of this step as the one value check 1's reduction carries for them
        (:meth:`Check.take_flag`, each at this point on every rank, in order), or None when no
        check flagged anything this step."""
        flags = [flag for check in self.checks if (flag := check.take_flag()) is not None]
        if len(flags) <= 1:
            return flags[0] if flags else None
        return torch.stack([flag.reshape(()) for flag in flags]).any()

    def start_flag_exchange(self, flags: StepFlags | int) -> tuple[FlagExchange, bool]:
        """Check 1's per-step collective: launch the reduction of ``flags`` (from
        :meth:`read_flags`, after :meth:`settle`, which every rank does first, at the same
        point; a step number reads them here). Returns the exchange and whether this rank's own
        flags are bad."""
        if isinstance(flags, int):
            flags = self.read_flags(flags)
        exchange = self.gradients.launch(flags, device=self.parallel.collective_device)
        if self._host_flags is not None:  # read from host memory when it is settled
            exchange.stage(self._host_flags)
        return exchange, flags.bad

    def read_own(self, step: int, own: torch.Tensor) -> StepFlags:
        """The host read of :meth:`device_flags`' ``own`` on a step that is decided on the
        host (an audit, checkpoint or weight-check step, or one a check decides now) by a
        guard that :attr:`skips_on_device`: that step's one host sync."""
        local, reduced, sensor = (bool(v) for v in own.tolist())
        return StepFlags(step, local, reduced, sensor)

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

        ``audit``: the step is an audit step (False: a step judged at once only because a check
        asked for it, :attr:`decides_now`; a clean table then needs nothing more).

        Returns the Alarm, logged and published, or None (the step may be applied).
        """
        table = exchange.table()
        if table.clean:
            self.reporter.record_gradient_pass(exchange.step)
            if not audit:
                return None  # decided now for a check, and every rank agrees it is clean
            alarm = self.audit.audit(
                exchange.step,
                loss,  # None on a pipeline's non-last stages
                self.gradients.local_table() if deterministic else None,
                deterministic=deterministic,
            )
            if alarm is not None and alarm.is_setup:
                self._set_up_wrong(alarm)
                return None
        elif not table.nonfinite and not any(table.reduced):
            # Only the checks' flag is set (the online sensors are the one check that
            # contributes one): a candidate, confirmed or dismissed by replays.
            alarm = self.sensors.judge(
                table,
                self.audit,
                self.reporter,
                deterministic=self.schedule.deterministic_audits,
            )
            if alarm is None:
                self.reporter.record_gradient_pass(exchange.step)
        else:
            # None for an fp16 overflow that replays reproduce: the scaler skips the step.
            alarm = self.nonfinite.judge(table, deterministic=self.schedule.deterministic_audits)
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
        self.audit.turn_off(reason)
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
        self.audit.turn_off(f"{finding.cause}: {finding.detail}")
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
        self.disarm_skip()  # every agreement point comes after the armed step's update
        exchange, self.gradients.pending = self.gradients.pending, None
        weights = self.weights.take_in_flight()
        alarm = None
        if exchange is not None:
            if exchange.summary().clean:  # the usual step: no per-rank table is built
                self.reporter.record_gradient_pass(exchange.step)
            else:
                table = exchange.table()  # collective: some rank flagged something
                deterministic = self.schedule.deterministic_audits
                if exchange.skipped_on_device and table.unanimous:
                    # Every rank flagged the step, so every rank's optimizer skipped it on the
                    # device: every rank still holds its weights, and its verdict is confirmed
                    # by replays as the host path confirms it at the step itself.
                    alarm = self.nonfinite.judge(table, deterministic=deterministic)
                else:
                    # Settled a step late: some ranks applied that step, so replays cannot
                    # see it.
                    alarm = self.nonfinite.alarm(table, confirm=False, deterministic=deterministic)
                alarm = self.reporter.log_and_publish(alarm) if alarm is not None else None
        if weights is not None:
            step, check = weights
            if alarm is None:
                if not isinstance(self.weights, WeightCheck):
                    raise RuntimeError(
                        "sdc_agent: a weight comparison is in flight but check 3 is off"
                    )
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


_ABSENT = object()
"""An optimizer attribute the user had not set (removed again, not set to None)."""


def can_skip_on_device(optimizer: torch.optim.Optimizer, scaler: object) -> bool:
    """Whether ``optimizer.step()`` skips a step on the device when told so: torch's fused
    Adam/AdamW (``fused=True``) honour ``found_inf`` (return early when it is 1, take the step
    count back), as GradScaler uses them; with a GradScaler the scaler owns ``found_inf``."""
    return (
        scaler is None
        and isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
        and bool(optimizer.defaults.get("fused"))
        and bool(getattr(optimizer, "_step_supports_amp_scaling", False))
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
