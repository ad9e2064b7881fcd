"""The guard: the three SDC checks around a DistributedDataParallel training step.

Per step (DESIGN.md, "The agent"):
1. Non-finite gradients: the comm hook checks each bucket of the local gradient before the
   all-reduce (in the pass that divides it by the world size) and sums the reduced one after it; one small all-gather of two flags per rank
   names the ranks whose local gradient is NaN/Inf and says whether any rank's reduced (clipped)
   gradient is. Either fails the step. The all-gather is asynchronous: a rank waits for it only
   when its own flags are bad, on audit and checkpoint steps, and at the next step's check or
   the end of the loop (see :mod:`.gradflags`).
2. Ring replay audit (audit steps): every rank recomputes another rank's micro-batch on the bare
   module and the results are compared bit for bit; see :mod:`sdc_agent.audit`.
3. Weight fingerprints (after the update, every ``check_every`` steps and before checkpoints).
   Before a checkpoint the comparison is awaited at once; a periodic one is launched after the
   update and judged at the next agreement point (the next step's check, whose step is then
   not applied on a failure), naming the step whose weights were compared.
A step that fails check 1 or 2 is not applied: its gradients are dropped and the optimizer does
not step, so the exact state is still there for the confirmation replays. Every decision is made
from gathered data with the same code on every rank, so every rank returns the same Alarm and no
rank is left waiting in a collective the others skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .alarm import Alarm, CheckName, RankInfo, Verdict
from .audit import (
    FAILED_ROW,
    ROW_WIDTH,
    Outcome,
    confirmation_jobs,
    find_culprits,
    find_mismatches,
    is_failed,
    mismatch_verdict,
    nonfinite_verdict,
    replay_target,
    third_gpu,
    unexplained,
)
from .divergence import DivergenceCheck, DivergenceReport
from .gradflags import FlagExchange, FlagTable
from .gradstats import GradStatsState, grad_stats_hook
from .publisher import NullPublisher, Publisher
from .replay import DeterminismState, Replayer, RngState, outcome_of, seed_all, step_seed
from .schedule import Schedule
from .topology import TopologyError, collective_device, group_ranks, rank_map, validate_placement

logger = logging.getLogger("sdc_agent")

ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]
RebuildBatch = Callable[[int, int], Any]
SaveCheckpoint = Callable[[int, dict[str, Any]], None]

_DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")


class Guard:
    """Adds the three SDC checks to a DDP training loop and names the GPU that computed wrong.

    ``compute_loss(model, batch)`` must return the loss; it is called with the DDP wrapper in
    training and with the bare module in replays. ``rebuild_batch(step, rank)`` must return
    exactly the micro-batch global ``rank`` trained on at ``step``. Construction is collective
    (it gathers the rank map and checks the topology) and registers the DDP comm hook, so build
    the guard on every rank, before the first forward pass.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer: torch.optim.Optimizer,
        *,
        compute_loss: ComputeLoss,
        rebuild_batch: RebuildBatch,
        schedule: Schedule | None = None,
        dp_group: dist.ProcessGroup | None = None,
        publisher: Publisher | None = None,
    ) -> None:
        """Validate the set-up, gather the rank map, check the topology, register the hook."""
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"Guard needs a torch.nn.parallel.DistributedDataParallel model, got {type(model).__name__}"
            )
        if not callable(compute_loss) or not callable(rebuild_batch):
            raise TypeError(
                "Guard needs callables compute_loss(model, batch) and rebuild_batch(step, rank)"
            )
        self.model = model
        self.module: nn.Module = model.module
        self.optimizer = optimizer
        self.compute_loss = compute_loss
        self.rebuild_batch = rebuild_batch
        self.schedule = schedule or Schedule()
        self.dp_group = dp_group
        self.publisher: Publisher = publisher or NullPublisher()

        self.rank = dist.get_rank()
        self.dp_rank = dist.get_rank(dp_group)
        self.global_ranks = group_ranks(dp_group)
        self.world = len(self.global_ranks)
        self._device = collective_device(dp_group)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.named_weights = list(self.module.named_parameters())
        self._param_device = self.params[0].device if self.params else torch.device("cpu")
        self._check_determinism_preconditions()

        self.ranks: dict[int, RankInfo] = rank_map(dp_group)
        nodes = [self.ranks[g].node_name for g in self.global_ranks]
        try:
            validate_placement(nodes, self.schedule.peer_offset)
            self._can_confirm = True
        except TopologyError:
            if self.schedule.audit_every > 0:
                raise
            self._can_confirm = False  # no audits: check 1 still names ranks, without confirmation

        self._stats = GradStatsState(
            process_group=dp_group, param_index={id(p): i for i, p in enumerate(self.params)}
        )
        try:
            model.register_comm_hook(self._stats, grad_stats_hook)
        except RuntimeError as err:
            raise RuntimeError(
                f"sdc_agent.Guard could not register its DDP comm hook ({err}); a DDP model takes "
                "one comm hook, so build one Guard per model and register no other hook"
            ) from err
        self._replayer = Replayer(self.module, self.params, compute_loss)
        self._snapshot_pending = False
        if any(True for _ in self.module.buffers()):
            self.module.register_forward_pre_hook(self._before_module_forward)

        self.current_step: int | None = None
        """The step being run (fault drills read it); None before the first step."""
        self.start_step: int | None = None
        self.last_gradient_check_pass: int | None = None
        self.last_audit_pass: int | None = None
        self.last_weight_check_pass: int | None = None
        self.last_weights_digest: str | None = None
        self._flags: FlagExchange | None = None
        """The newest step's flag exchange, until it is settled (:meth:`_settle`)."""
        self._weights: tuple[int, DivergenceCheck] | None = None
        """A periodic weight comparison in flight (the step it was taken after), until settled."""
        self._pending_passes = {"audit": 0, "weights": 0}
        self._publish("rank map", lambda p: p.publish_rank_map(dict(self.ranks)))

    # ------------------------------------------------------------------ the training loop
    def train(
        self,
        batches: Iterable[Any],
        *,
        save_checkpoint: SaveCheckpoint | None = None,
        start_step: int = 0,
    ) -> Alarm | None:
        """Train on ``batches`` (this rank's, from ``start_step`` on) until they end or a check fails.

        Returns None when every batch was trained on, else the Alarm (the same on every rank);
        the failing step is not applied (by any rank whose gradient was bad; see :meth:`finish`). ``save_checkpoint(step, tags)`` is called on every rank
        when a checkpoint is due and nothing fired; ``tags`` holds ``last_audit_pass``,
        ``last_weight_check_pass`` and ``weights_digest`` (see :meth:`GuardedStep.checkpoint_tags`).
        """
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule.check_on_start and (alarm := self.check_weights(start_step)):
            return alarm
        for step, batch in zip(itertools.count(start_step), batches):
            with self.step(step) as guarded:
                loss = self.compute_loss(self.model, batch)
                loss.backward()
                if alarm := guarded.check_gradients(loss):
                    return alarm
                if guarded.update_allowed:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if alarm := guarded.after_update():
                    return alarm
                if guarded.checkpoint_due and save_checkpoint is not None:
                    save_checkpoint(step, guarded.checkpoint_tags())
        return self.finish()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[GuardedStep]:
        """The step API for loops you own. Decides before the forward pass whether ``step`` is
        an audit step and prepares it (hook armed, RNG seeded, deterministic kernels); restores
        RNG and kernel flags on exit. See :class:`GuardedStep` and the README for the loop.
        """
        guarded = GuardedStep(self, step)
        guarded.begin()
        try:
            yield guarded
        finally:
            guarded.end()

    def check_weights(self, step: int) -> Alarm | None:
        """Check 3 now (collective): every replica's weights must be bit-identical.

        Use it after loading a checkpoint or before saving one; :meth:`train` runs it for you.
        """
        if self.start_step is None:
            self.start_step = step
        if (alarm := self._settle()) is not None:
            return alarm
        return self._judge_weights(step, DivergenceCheck(self.named_weights, self.dp_group))

    def finish(self) -> Alarm | None:
        """Settle the last step's gradient check (collective); call it once after your own loop.

        A corruption after the all-reduce that only some ranks see is reported at the next
        agreement point (the next ``check_gradients``, a weight check, a checkpoint step, or
        this call), naming the step it happened at; :meth:`train` calls this for you.
        Returns that Alarm, or None.
        """
        return self._settle()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Let the publisher deliver what it queued (for the exit path); True when all is sent."""
        if self.dp_rank != 0:
            return True
        try:
            return bool(self.publisher.flush(timeout))
        except Exception:
            logger.exception("sdc_agent: publisher flush failed")
            return False

    # ------------------------------------------------------------------ internals
    def _check_determinism_preconditions(self) -> None:
        """Deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG before the first matmul."""
        audits = self.schedule.audit_every > 0 and self.schedule.deterministic_audits
        if audits and self._param_device.type == "cuda":
            value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
            if value not in _DETERMINISTIC_CUBLAS:
                raise ValueError(
                    "deterministic audits on CUDA need the environment variable "
                    f"CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before training, got {value!r}; "
                    "or use Schedule(deterministic_audits=False)"
                )

    def _before_module_forward(self, module: nn.Module, args: Any) -> None:
        """Snapshot buffers as the audited step's forward starts (after DDP's buffer broadcast)."""
        if self._snapshot_pending:
            self._snapshot_pending = False
            self._replayer.snapshot_buffers()

    def _global(self, dp_rank: int) -> int:
        return self.global_ranks[dp_rank]

    def _replay(self, step: int, target_dp: int, deterministic: bool) -> Outcome:
        """Recompute DP rank ``target_dp``'s micro-batch of ``step`` on the bare module."""
        target = self._global(target_dp)
        batch = self.rebuild_batch(step, target)
        return self._replayer.replay(
            batch, seed=step_seed(step, target), deterministic=deterministic
        )

    def _replay_row(self, step: int, target_dp: int, deterministic: bool) -> list[int]:
        """A replay as a collective row; a replay that raises (a bug in ``rebuild_batch`` or
        ``compute_loss``) is logged and sent as FAILED_ROW, so no rank is left in a collective."""
        try:
            return self._replay(step, target_dp, deterministic).to_row()
        except Exception:
            logger.exception(
                "sdc_agent: replaying rank %d's batch of step %d failed on rank %d",
                self._global(target_dp),
                step,
                self.rank,
            )
            return list(FAILED_ROW)

    def _confirm(
        self, step: int, targets: list[int], deterministic: bool
    ) -> list[tuple[Outcome, Outcome] | None]:
        """Replay each target's batch on its third GPU and on itself (collective).

        Returns, per target, (third GPU's outcome, target's own re-replay), or None when either
        replay raised (then the confirmation cannot judge anyone).
        """
        jobs = confirmation_jobs(targets, self.world, self.schedule.peer_offset, self.dp_rank)
        table = torch.zeros((len(targets), 2, ROW_WIDTH), dtype=torch.int64)
        for slot, column, target_dp in jobs:
            table[slot, column] = torch.tensor(self._replay_row(step, target_dp, deterministic))
        table = table.to(self._device)
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=self.dp_group)  # one writer per slot
        rows = table.cpu().tolist()
        return [
            None
            if is_failed(r[0]) or is_failed(r[1])
            else (Outcome.from_row(r[0]), Outcome.from_row(r[1]))
            for r in rows
        ]

    def _settle(self) -> Alarm | None:
        """The agreement point: judge what is in flight (collective; every rank calls it at the
        same points). Returns the first Alarm (raised), or None."""
        exchange, self._flags = self._flags, None
        weights, self._weights = self._weights, None
        alarm = None
        if exchange is not None:
            table = exchange.table()
            if table.clean:
                self.last_gradient_check_pass = table.step
            else:
                # Settled a step late: some ranks applied that step, so replays cannot see it.
                alarm = self._raise(self._flags_alarm(table, confirm=False))
        if weights is not None:
            step, check = weights
            if alarm is None:
                alarm = self._judge_weights(step, check)
            else:
                check.wait()  # every rank stops here; the comparison no longer matters
        return alarm

    def _start_weight_check(self, step: int) -> None:
        """Fingerprint the weights after ``step``'s update and launch their comparison."""
        if self._weights is not None:
            raise RuntimeError(
                "sdc_agent: a weight check is still in flight; call check_gradients (or "
                "Guard.finish) between two after_update calls"
            )
        self._weights = (step, DivergenceCheck(self.named_weights, self.dp_group))

    def _judge_weights(self, step: int, check: DivergenceCheck) -> Alarm | None:
        """Check 3's verdict on a comparison of the weights after ``step``'s update."""
        report = check.report()
        if report.agreed:
            self.last_weight_check_pass = step
            self.last_weights_digest = report.digest
            self._note_pass("weights", step)
            return None
        return self._raise(self._weights_alarm(step, report))

    def _flags_alarm(self, table: FlagTable, *, confirm: bool) -> Alarm:
        """Check 1's alarm for a table that is not clean."""
        if table.nonfinite:
            return self._nonfinite_alarm(
                table.step, table.nonfinite, confirm=confirm and self._can_confirm
            )
        return self._alarm(
            table.step, "reduced_gradient", last_pass=self.last_gradient_check_pass, suspects=None
        )

    def _nonfinite_alarm(self, step: int, nonfinite: list[int], *, confirm: bool) -> Alarm:
        """Name the ranks whose local gradient was non-finite, confirmed by replays if asked."""
        verdicts: list[Verdict] = []
        blamed = list(nonfinite)
        if confirm:
            deterministic = self.schedule.deterministic_audits
            results = self._confirm(step, nonfinite, deterministic)
            blamed = []
            for target, result in zip(nonfinite, results, strict=True):
                # A confirmation that could not run leaves check 1's own evidence standing.
                kind, who = (
                    nonfinite_verdict(*result, compare_grads=deterministic)
                    if result is not None
                    else ("unclear", "target")
                )
                suspect = self._global(target) if who else None
                third_rank = self._global(third_gpu(target, self.world, self.schedule.peer_offset))
                pair = (self._global(target), self._global(target))
                verdicts.append(Verdict(pair=pair, third=third_rank, suspect=suspect, kind=kind))
                if suspect is not None:
                    blamed.append(target)
        return self._alarm(
            step,
            "compute",
            last_pass=self.last_gradient_check_pass,
            suspects=[self._global(r) for r in blamed],
            nonfinite=[self._global(r) for r in nonfinite],
            verdicts=verdicts,
        )

    def _note_pass(self, kind: str, step: int) -> None:
        self._pending_passes[kind] += 1
        audits, weights = self._pending_passes["audit"], self._pending_passes["weights"]
        self._pending_passes = {"audit": 0, "weights": 0}
        self._publish("liveness", lambda p: p.publish_liveness(step, audits, weights))

    def _publish(self, what: str, call: Callable[[Publisher], None]) -> None:
        """Call the publisher from DP rank 0 only; nothing it does may reach training."""
        if self.dp_rank != 0:
            return
        try:
            call(self.publisher)
        except Exception:
            logger.exception("sdc_agent: publishing the %s failed; training goes on", what)

    def _raise(self, alarm: Alarm) -> Alarm:
        if self.dp_rank == 0:
            logger.error(
                "sdc_agent: %s check failed at step %d; suspects %s; report %s",
                alarm.check,
                alarm.step,
                alarm.suspects,
                alarm.to_dict(),
            )
        self._publish("alarm", lambda p: p.publish_alarm(alarm))
        return alarm

    def _window(self, step: int, last_pass: int | None) -> tuple[int, int]:
        first = last_pass if last_pass is not None else self.start_step
        return (first if first is not None else step, step)

    def _rank_infos(self, *groups: Iterable[int]) -> dict[str, RankInfo]:
        named = sorted({r for group in groups for r in group})
        return {str(r): self.ranks[r] for r in named}

    def _alarm(
        self,
        step: int,
        check: CheckName,
        *,
        last_pass: int | None,
        suspects: list[int] | None,
        nonfinite: Sequence[int] = (),
        pairs: Sequence[tuple[int, int]] = (),
        culprits: Sequence[int] = (),
        verdicts: Sequence[Verdict] = (),
        divergent: Sequence[str] = (),
    ) -> Alarm:
        """Assemble the alarm every rank returns; ``ranks`` covers every rank it names."""
        suspects = sorted(set(suspects)) if suspects else None
        return Alarm(
            step=step,
            check=check,
            nonfinite=list(nonfinite),
            mismatched_pairs=list(pairs),
            culprits=list(culprits),
            verdicts=list(verdicts),
            suspects=suspects,
            suspect_window=self._window(step, last_pass),
            last_audit_pass=self.last_audit_pass,
            last_weight_check_pass=self.last_weight_check_pass,
            divergent_tensors=list(divergent),
            ranks=self._rank_infos(suspects or [], nonfinite, culprits),
        )

    def _weights_alarm(self, step: int, report: DivergenceReport) -> Alarm:
        return self._alarm(
            step,
            "weights",
            last_pass=self.last_weight_check_pass,
            suspects=report.ranks,
            divergent=report.tensors,
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
    """

    def __init__(self, guard: Guard, step: int) -> None:
        """Decide what runs at ``step`` (before its forward pass)."""
        self.guard = guard
        self.step = step
        self.audit = guard.schedule.is_audit_step(step)
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
        self._deterministic = self.audit and guard.schedule.deterministic_audits
        self._rng: RngState | None = None
        self._kernels: DeterminismState | None = None
        self._weights_checked = False

    def begin(self) -> None:
        """Arm the comm hook; on audit steps seed the RNG and select deterministic kernels."""
        g = self.guard
        g.current_step = self.step
        if g.start_step is None:
            g.start_step = self.step
        g._stats.arm(capture_fingerprints=self._deterministic, device=g._param_device)
        g._replayer.forward_buffers = None
        g._replayer.zero_grads_at_start = None
        g._snapshot_pending = self.audit
        if self.audit:
            g._replayer.note_gradients_at_start(self.step)
            # The step's computation must be reproducible by another GPU: seed it from
            # (step, rank) instead of the job's RNG stream, which is put back afterwards.
            self._rng = RngState.capture()
            seed_all(step_seed(self.step, g.rank))
            if self._deterministic:
                self._kernels = DeterminismState.capture()
                DeterminismState.enforce()

    def end(self) -> None:
        """Restore RNG and kernel flags (idempotent) and disarm the hook."""
        if self._kernels is not None:
            self._kernels.restore()
            self._kernels = None
        if self._rng is not None:
            self._rng.restore()
            self._rng = None
        self.guard._stats.capture_fingerprints = False
        self.guard._snapshot_pending = False

    def check_gradients(self, loss: torch.Tensor) -> Alarm | None:
        """Checks 1 and 2 after ``loss.backward()`` and before ``optimizer.step()`` (collective).

        Clips the reduced gradient when ``Schedule.max_grad_norm`` is set. On an alarm the
        gradients are dropped (set to None) so the step cannot be applied; returns the Alarm.
        """
        g = self.guard
        stats = g._stats
        if not stats.local_flags or len(stats.reduced_sums) != len(stats.local_flags):
            raise RuntimeError(
                "check_gradients: DDP's all-reduce did not run this step; call it after "
                "loss.backward() on the DDP model, outside no_sync()"
            )
        # The previous step's exchanges ran during this step's forward and backward.
        if (alarm := g._settle()) is not None:
            return self._refuse(alarm)
        flags = torch.stack(
            [
                torch.cat(stats.local_flags).any(),
                ~torch.isfinite(self._reduced_sums()).all(),
            ]
        ).to(device=g._device, dtype=torch.int64)
        exchange = FlagExchange(self.step, flags, g.dp_group, g.world)  # the per-step collective
        # One host read of this rank's own flags (on a GPU, the sync GradScaler makes too).
        if not self.audit and not bool(flags.any()):
            g._flags = exchange  # settled at the next agreement point
            self.end()
            return None
        table = exchange.table()
        if table.clean:  # an audit step: every rank waited for this table
            g.last_gradient_check_pass = self.step
            alarm = self._audit(loss)
        elif self.audit or table.unanimous:
            # Every rank is here, at this step, with the step's exact state: decide now.
            alarm = g._flags_alarm(table, confirm=True)
        else:
            # Only some ranks see a bad gradient; the others have moved on. Drop ours, and let
            # every rank report it at the next agreement point.
            g._flags = exchange
            self._drop_step()
            return None
        self.end()
        return self._refuse(g._raise(alarm)) if alarm is not None else None

    def after_update(self) -> Alarm | None:
        """Check 3 after ``optimizer.step()`` when due (every ``check_every`` steps, and before
        a checkpoint when ``check_on_checkpoint``). Returns the Alarm, or None."""
        g = self.guard
        if self.checkpoint_due:
            # Nothing is saved before every rank agrees on the gradients (and weights, if asked).
            if (alarm := g._settle()) is not None:
                self.alarm = alarm
                return alarm
            if self.weight_check_due:
                self._weights_checked = True
                self.alarm = g.check_weights(self.step)
            return self.alarm
        if self.weight_check_due:
            g._start_weight_check(self.step)  # judged at the next agreement point
        return None

    def checkpoint_tags(self) -> dict[str, Any]:
        """Tags for a checkpoint saved after this step's update.

        ``weights_digest`` is the digest of the fingerprint table every replica agreed on at this
        step (None when the weights were not compared at this step: then ``weights_verified`` is
        False and ``last_weight_check_pass`` says when they last were).
        """
        g = self.guard
        verified = self._weights_checked and self.alarm is None
        return {
            "step": self.step,
            "last_audit_pass": g.last_audit_pass,
            "last_weight_check_pass": g.last_weight_check_pass,
            "weights_digest": g.last_weights_digest if verified else None,
            "weights_verified": verified,
        }

    # ------------------------------------------------------------------ internals
    def _reduced_sums(self) -> torch.Tensor:
        """Per-bucket sums of the reduced gradient (and its clipped norm when configured)."""
        g = self.guard
        sums = torch.stack(g._stats.reduced_sums)
        if g.schedule.max_grad_norm is None:
            return sums
        norm = torch.nn.utils.clip_grad_norm_(g.params, g.schedule.max_grad_norm).detach()
        return torch.cat([sums, norm.reshape(1).to(sums)])

    def _drop_gradients(self) -> None:
        """Set every gradient to None so that ``optimizer.step()`` cannot apply this step."""
        g = self.guard
        g.optimizer.zero_grad(set_to_none=True)
        for p in g.params:
            p.grad = None

    def _drop_step(self) -> None:
        """Do not apply this step: restore RNG and kernels, drop the gradients."""
        self.end()
        self._drop_gradients()
        self.update_allowed = False

    def _refuse(self, alarm: Alarm) -> Alarm:
        """Fail the step with an alarm already raised."""
        self._drop_step()
        self.alarm = alarm
        return alarm

    def _audit(self, loss: torch.Tensor) -> Alarm | None:
        """Check 2: replay the target's batch, gather every rank's results, attribute."""
        g = self.guard
        offset = g.schedule.peer_offset
        deterministic = self._deterministic
        own_table = g._stats.local_fingerprints if deterministic else None
        own = outcome_of(loss, own_table, True)  # audits run only when every flag was clean
        replayed = g._replay_row(
            self.step, replay_target(g.dp_rank, g.world, offset), deterministic
        )
        mine = torch.tensor([own.to_row(), replayed], dtype=torch.int64, device=g._device)
        gathered = [torch.zeros_like(mine) for _ in range(g.world)]
        dist.all_gather(gathered, mine, group=g.dp_group)
        rows = torch.stack(gathered).cpu().tolist()
        failed = [g._global(dp) for dp, r in enumerate(rows) if is_failed(r[1])]
        if failed:
            # Not a pass (liveness shows audits stopping) and not an alarm (no GPU is implicated).
            if g.dp_rank == 0:
                logger.error(
                    "sdc_agent: the audit of step %d did not run: replays raised on ranks %s "
                    "(see their logs); the step is applied unaudited",
                    self.step,
                    failed,
                )
            return None
        owns = [Outcome.from_row(r[0]) for r in rows]
        replays = [Outcome.from_row(r[1]) for r in rows]
        pairs = find_mismatches(owns, replays, offset, compare_grads=deterministic)
        if not pairs:
            g.last_audit_pass = self.step
            g._note_pass("audit", self.step)
            return None

        culprits = find_culprits(pairs)
        disputed = unexplained(pairs, culprits)
        results = g._confirm(self.step, [t for t, _ in disputed], deterministic) if disputed else []
        verdicts: list[Verdict] = []
        blamed = list(culprits)
        for (target, replayer), result in zip(disputed, results, strict=True):
            kind, who = (
                mismatch_verdict(
                    owns[target], replays[replayer], *result, compare_grads=deterministic
                )
                if result is not None
                else ("unattributable", "")
            )
            suspect = {"target": target, "replayer": replayer}.get(who)
            if suspect is not None:
                blamed.append(suspect)
            verdicts.append(
                Verdict(
                    pair=(g._global(target), g._global(replayer)),
                    third=g._global(third_gpu(target, g.world, offset)),
                    suspect=g._global(suspect) if suspect is not None else None,
                    kind=kind,
                )
            )
        return g._alarm(
            self.step,
            "compute",
            last_pass=g.last_audit_pass,
            suspects=[g._global(r) for r in blamed],
            pairs=[(g._global(t), g._global(r)) for t, r in pairs],
            culprits=[g._global(r) for r in culprits],
            verdicts=verdicts,
        )
