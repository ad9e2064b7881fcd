"""Check 2, the ring replay audit: replays, the audit collective, confirmations, attribution.

On an audit step every rank recomputes another rank's micro-batch (the adapter's replayer,
:mod:`.replayer`) and the results are compared bit for bit; the pure reasoning over the gathered
results (who mismatched, who is to blame) is in :mod:`.attribution`. The same replays confirm
check 1: a rank whose local gradient was non-finite has its micro-batch replayed on a third GPU
and on itself; the online sensors' candidates are confirmed the same way
(:meth:`RingAudit.fill_confirmations`).

The replay unit decides how replays are scheduled (:func:`ring_audit_type` asks the adapter): each
rank replays alone (:class:`RingAudit`, DDP: the bare module needs no other rank), or every rank
replays at the same time, in lockstep (:class:`CollectiveRingAudit`, FSDP2: a forward needs the
other ranks' shards), and each confirmation is then a round in which every rank replays the
disputed micro-batch and only the third GPU and the target keep their result.

Every method that issues a collective says so; the guard calls them on every rank at the same
points, and a replay that raises is sent as a failed row instead, so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ...alarm import Alarm, Verdict
from ...reporting import Reporter
from ..gradients.exchange import FlagTable
from ..protocol import Check, StepStart
from .attribution import (
    FAILED_ROW,
    NONDETERMINISTIC_OP,
    ROW_WIDTH,
    SELF_DIFFERS_FROM_TRAINING,
    SELF_GRADS_DIFFER,
    SELF_LOSS_DIFFERS,
    SELF_REBUILD_DIFFERS,
    WRAPPER_IN_REPLAY,
    Outcome,
    confirmation_jobs,
    earliest_local_mismatches,
    find_culprits,
    find_mismatches,
    first_divergence,
    is_failed,
    mismatch_verdict,
    replay_target,
    third_gpu,
    unexplained,
)
from .batch_record import (
    BatchRecorder,
    ReplayCapture,
    batch_digest,
    combine_digests,
    fed_another_batch,
)
from .environment import StepEnvironment, nondeterministic_alerts, seed_all, step_seed
from .layout import ReplayLayout
from .replayer import Replayer, combine_outcomes, outcome_of
from .setup import (
    SetupFinding,
    batch_finding,
    pattern_finding,
    preflight,
    rebuild_finding,
    repeated_failure,
    third_batch_finding,
    wrapper_finding,
)

logger = logging.getLogger("sdc_agent")

RebuildBatch = Callable[[int, int], Any]


class RingAudit(Check):
    """Check 2 for one guard (and the confirmation replays check 1 asks for)."""

    coverage_key = "replay_audit"

    checks_batches = True
    """Record what each micro-batch's forward was fed and compare it with what each replay was
    fed, before any result (:mod:`.batch_record`). A pipeline's later stages are fed
    activations, not the batch: the pipeline audit compares stage inputs itself."""

    def __init__(
        self,
        adapter: ReplayLayout,
        replayer: Replayer,
        rebuild_batch: RebuildBatch,
        reporter: Reporter,
        *,
        peer_offset: int,
        can_confirm: bool,
        overflow_is_expected: bool = False,
        skipped_audits_allowed: int = 1,
        stops_on_setup_error: bool = False,
    ) -> None:
        """``can_confirm``: the placement puts a third GPU on a third node (see topology).
        ``overflow_is_expected``: a GradScaler scales the loss, so a non-finite gradient that
        another GPU reproduces is an overflow to skip, not an alarm
        (:meth:`sdc_agent.checks.gradients.verdicts.NonfiniteVerdicts.judge`).
        With accumulation (``replayer.grad_accum`` > 1) ``rebuild_batch(step, rank)`` returns
        the step's sequence of micro-batches and the audit replays one of them."""
        self.adapter = adapter
        self.replayer = replayer
        self.rebuild_batch = rebuild_batch
        self.reporter = reporter
        self.peer_offset = peer_offset
        self.can_confirm = can_confirm
        self.overflow_is_expected = overflow_is_expected
        self.skipped_audits_allowed = skipped_audits_allowed
        """Audits in a row whose replays may raise (each skipped, logged and counted as
        ``sdc_audit_skipped``) before the next one is a set-up finding."""
        self.skipped_in_a_row = 0
        self.stops_on_setup_error = stops_on_setup_error
        """A set-up finding stops the job (``Schedule(on_setup_error="stop")``) rather than the
        audits; it only says so in the report here, the guard acts on it."""
        self.compare_grads = True
        """Gradient fingerprints are compared (False once the preflight found two replays of
        one micro-batch on one GPU giving different gradient bits: then the loss bits only)."""
        self.preflight_done = False
        """The first audit replays each rank's own micro-batch twice (:func:`.setup.preflight`)."""
        self.preflight_notes: list[str] = []
        """What the preflight changed (for ``coverage()``)."""
        self.nondeterministic_ops: set[str] = set()
        """Ops without a deterministic kernel that deterministic mode warned about in replays."""
        self.batches = (
            BatchRecorder(adapter.module, getattr(adapter, "model", None))
            if self.checks_batches
            else None
        )
        """What each trained and replayed micro-batch's forward was fed (:mod:`.batch_record`)."""
        self.grad_accum = replayer.grad_accum
        self.isolation = replayer.micro_batch_isolation() if self.grad_accum > 1 else None
        """Isolates the audited micro-batch's gradient (accumulation only)."""
        self.position = 0
        """The micro-batch position the current step's audit replays."""
        self.isolated_fingerprints: torch.Tensor | None = None
        """[num_params, 2] fingerprints of the audited micro-batch's own local gradient
        (accumulation with deterministic audits; None otherwise)."""
        self.current_micro_batch: int | None = None
        """The micro-batch position being computed (trained or replayed), else None."""
        self._isolating = False
        self._snapshot_pending = False
        self.off_because: str | None = None
        """Why the audits stopped (a set-up finding, :meth:`turn_off`), or None while they run."""
        self._off_by_setup = True
        self.environment = StepEnvironment()
        """What the current step's computation runs under (its seed and kernels), put back by
        :meth:`StepEnvironment.restore` when it is over (:meth:`begin_step`)."""
        if any(True for _ in adapter.module.buffers()):
            adapter.module.register_forward_pre_hook(self._before_module_forward)

    # ------------------------------------------------------------------ the check protocol
    def begin_step(self, start: StepStart) -> None:
        """Prepare the step (:meth:`prepare_step`); its environment is :attr:`environment`."""
        self.environment = self.prepare_step(
            start.step,
            audit=start.audit,
            deterministic=start.deterministic,
            position=start.position,
            seeded=start.seeded,
        )

    def turn_off(self, reason: str, *, setup_finding: bool = True) -> None:
        """Stop the audits and their confirmations for good (a set-up finding, the same on
        every rank): they would judge GPUs on replays that do not reproduce training.
        ``setup_finding`` False: the layout itself cannot be replayed yet (expert parallel,
        :mod:`sdc_agent.parallel.ep`), which ``coverage()`` says as such."""
        self.off_because = reason
        self._off_by_setup = setup_finding
        self.can_confirm = False

    def describe(self, planned: dict[str, Any]) -> dict[str, Any]:
        """The planned audit, off when a set-up finding turned it off, comparing the loss bits
        only when the preflight found gradients not reproducible."""
        described = dict(planned)
        if self.off_because is not None:
            why = (
                f"turned off by a set-up finding: {self.off_because}"
                if self._off_by_setup
                else f"off for this layout: {self.off_because}"
            )
            described.update(on=False, why=why, pairs=[])
        elif described.get("on") and not self.compare_grads:
            described["compares"] = (
                "loss bits only (the preflight found gradients not reproducible)"
            )
        return described

    # ------------------------------------------------------------------ per step (local)
    def prepare_step(
        self,
        step: int,
        *,
        audit: bool,
        deterministic: bool,
        position: int = 0,
        seeded: bool = False,
    ) -> StepEnvironment:
        """Before ``step``'s forward pass: on audit steps note how the gradients start, snapshot
        the buffers as the (audited micro-batch's) forward begins, seed the RNG from (step,
        rank) and select deterministic kernels. ``position``: the micro-batch the audit
        replays; ``seeded``: seed a step that is not audited too (a confirmation can then
        replay it exactly). Returns what :meth:`StepEnvironment.restore` puts back."""
        self.replayer.forward_buffers = None
        self.replayer.zero_grads_at_start = None
        self.isolated_fingerprints = None
        self.position = position
        self._snapshot_pending = audit and self.grad_accum == 1
        if self.batches is not None:
            self.batches.new_step()
            if (audit or seeded) and self.grad_accum == 1:
                self.batches.begin_training(0)  # the step's one micro-batch, whatever the loop
        if not audit:
            if not seeded:
                return StepEnvironment()
            return StepEnvironment.enter(seed=self._seed(step), deterministic=False)
        self.replayer.note_gradients_at_start(step)
        if self.grad_accum > 1:
            # The audited micro-batch's gradient is isolated from no gradient (accumulation.py),
            # so its replay starts from None whatever the step started from.
            self.replayer.zero_grads_at_start = None
        # The step's computation must be reproducible by another GPU: seed it from
        # (step, rank) instead of the job's RNG stream, which is put back afterwards.
        return StepEnvironment.enter(seed=self._seed(step), deterministic=deterministic)

    def begin_micro_batch(
        self, step: int, index: int, *, audited: bool, seeded: bool, isolate: bool
    ) -> None:
        """Before micro-batch ``index``'s forward (accumulation): seed it from (step, rank,
        index) on seeded steps; for the audited one, snapshot the buffers as its forward starts
        and, with ``isolate``, set the accumulated gradient aside (:mod:`sdc_agent.checks.replay.accumulation`)."""
        self.current_micro_batch = index
        if seeded:
            seed_all(self._seed(step, index))
            if self.batches is not None:
                self.batches.begin_training(index)
        if audited:
            self._snapshot_pending = True
            if isolate and self.isolation is not None:
                self.isolation.begin()
                self._isolating = True

    def end_micro_batch(self) -> None:
        """After a micro-batch's backward: add the accumulated gradient back under the audited
        one's and keep its fingerprints (a no-op for the others)."""
        self.current_micro_batch = None
        self._snapshot_pending = False
        if self.batches is not None and self.grad_accum > 1:
            self.batches.end_training()
        if self._isolating and self.isolation is not None:
            self._isolating = False
            self.isolated_fingerprints = self.isolation.end()

    def end_step(self) -> None:
        """The step's forward passes are over: take no more buffer snapshots."""
        self._snapshot_pending = False
        if self.batches is not None:
            self.batches.end_training()
        if self._isolating:
            self.end_micro_batch()

    def _seed(self, step: int, micro_batch: int = 0) -> int:
        """The seed of this rank's computation of ``step`` (micro-batch ``micro_batch``)."""
        a = self.adapter
        return step_seed(step, a.seed_rank(a.rank), base=micro_batch)

    def _before_module_forward(self, module: torch.nn.Module, args: Any) -> None:
        """Snapshot buffers as the audited step's forward starts (after DDP's buffer broadcast)."""
        if self._snapshot_pending:
            self._snapshot_pending = False
            self.replayer.snapshot_buffers()

    # ------------------------------------------------------------------ replays
    def _micro_batches(self, step: int, target: int) -> list[Any]:
        """``rebuild_batch(step, target)`` as the step's list of micro-batches."""
        rebuilt = self.rebuild_batch(step, target)
        if self.grad_accum == 1:
            return [rebuilt]
        micros = list(rebuilt)
        if len(micros) != self.grad_accum:
            raise ValueError(
                f"rebuild_batch({step}, {target}) returned {len(micros)} micro-batches; "
                f"Schedule.grad_accum is {self.grad_accum}"
            )
        return micros

    def _replay(self, step: int, target_dp: int, deterministic: bool, whole_step: bool) -> Outcome:
        """Recompute DP rank ``target_dp``'s audited micro-batch of ``step`` on the bare module
        (``whole_step``: each of its micro-batches alone, combined)."""
        target = self.adapter.global_rank(target_dp)
        return self._replay_micro_batches(
            step, target, self._micro_batches(step, target), deterministic, whole_step
        )

    def _replay_micro_batches(
        self, step: int, target: int, micros: list[Any], deterministic: bool, whole_step: bool
    ) -> Outcome:
        """Recompute global rank ``target``'s audited micro-batch of ``step`` from its rebuilt
        ``micros`` (``whole_step``: each of them alone, combined)."""
        positions = list(range(len(micros))) if whole_step else [self.position]
        # What rebuild_batch returned, before compute_loss could change it in place.
        rebuilt = (
            combine_digests([batch_digest(micros[i]) for i in positions])
            if self.batches is not None
            else 0
        )
        outcomes = []
        digests: list[int] = []
        flags = 0
        try:
            for i in positions:
                self.current_micro_batch = i if self.grad_accum > 1 else None
                with self._recorded(deterministic) as capture:
                    outcomes.append(
                        self.replayer.replay(
                            micros[i],
                            seed=step_seed(step, self.adapter.seed_rank(target), base=i),
                            deterministic=deterministic,
                        )
                    )
                digests.append(capture.inputs.digest())
                flags |= WRAPPER_IN_REPLAY if capture.ran_wrapper else 0
                flags |= NONDETERMINISTIC_OP if capture.alerts else 0
        finally:
            self.current_micro_batch = None
        combined = self.combine(outcomes)
        if self.batches is None or not isinstance(combined, Outcome):
            return combined
        mine = target == self.adapter.rank  # only the owner knows what it trained on
        return dataclasses.replace(
            combined,
            batch=combine_digests(digests),
            trained=self.batches.trained_digest(positions) if mine else 0,
            flags=flags,
            rebuilt=rebuilt,
        )

    @contextlib.contextmanager
    def _recorded(self, deterministic: bool) -> Iterator[ReplayCapture]:
        """Record one replay's forward inputs, whether it ran the training wrapper, and the ops
        deterministic mode warned about (kept in :attr:`nondeterministic_ops`)."""
        recording = self.batches.replaying() if self.batches is not None else _no_recording()
        with recording as capture, nondeterministic_alerts(deterministic) as alerts:
            yield capture
        capture.alerts = list(alerts)
        self.nondeterministic_ops.update(alerts)

    def combine(self, outcomes: list[Any]) -> Any:
        """One outcome for the replays of several micro-batches of a step
        (:func:`~.replayer.combine_outcomes`)."""
        return combine_outcomes(outcomes)

    def failed_row(self) -> list[int]:
        """The row a replay that raised sends instead of an outcome (:data:`FAILED_ROW`)."""
        return list(FAILED_ROW)

    def replay_row(
        self, step: int, target_dp: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Recompute DP rank ``target_dp``'s audited micro-batch of ``step`` (``whole_step``: all
        of its micro-batches) as a row for a collective; a replay that raises (a bug in
        ``rebuild_batch`` or ``compute_loss``) is logged and sent as FAILED_ROW, so no rank is
        left in a collective. Here each rank replays alone; under lockstep replays every rank
        calls it at the same time (:class:`CollectiveRingAudit`)."""
        try:
            return self._replay(step, target_dp, deterministic, whole_step).to_row()
        except Exception:
            logger.exception(
                "sdc_agent: replaying rank %d's batch of step %d failed on rank %d",
                self.adapter.global_rank(target_dp),
                step,
                self.adapter.rank,
            )
            return list(FAILED_ROW)

    def fill_confirmations(
        self, targets: list[int], table: torch.Tensor, replay_row: Callable[[int], list[int]]
    ) -> None:
        """Run this rank's share of the confirmation replays of ``targets`` (DP ranks) and write
        their rows into ``table`` ([len(targets), 2, row width], zeros): column 0 the third
        GPU's replay of the target's batch, column 1 the target's own, each slot by its one
        writer, so that summing the tables over the ranks gathers them.

        ``replay_row(target_dp)`` replays one target's batch as a row (:meth:`replay_row`, or
        the sensors' own with their flags). Here each rank runs only its own jobs; under
        lockstep replays every rank runs every round (:class:`CollectiveRingAudit`)."""
        a = self.adapter
        for slot, column, target_dp in confirmation_jobs(
            targets, a.world, self.peer_offset, a.dp_rank
        ):
            table[slot, column] = torch.tensor(replay_row(target_dp))

    def confirm(
        self, step: int, targets: list[int], deterministic: bool, whole_step: bool = False
    ) -> list[tuple[Outcome, Outcome] | None]:
        """Replay each target's batch on its third GPU and on itself (collective: one all-reduce).

        ``whole_step``: replay every micro-batch of the step (a non-finite accumulated gradient
        does not say which micro-batch it came from); else the audited one.

        Returns, per target, (third GPU's outcome, target's own re-replay), or None when either
        replay raised (then the confirmation cannot judge anyone).
        """
        table = torch.zeros((len(targets), 2, ROW_WIDTH), dtype=torch.int64)
        self.fill_confirmations(
            targets,
            table,
            lambda target_dp: self.replay_row(step, target_dp, deterministic, whole_step),
        )
        return self._confirmations_of(table)

    def _confirmations_of(self, table: torch.Tensor) -> list[tuple[Outcome, Outcome] | None]:
        """Sum the confirmation table every rank filled its own slots of (one writer per slot)
        and read each target's (third GPU's outcome, target's own), None where either failed."""
        a = self.adapter
        table = table.to(a.collective_device)
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=a.dp_group)
        return [
            None
            if is_failed(r[0]) or is_failed(r[1])
            else (Outcome.from_row(r[0]), Outcome.from_row(r[1]))
            for r in table.cpu().tolist()
        ]

    # ------------------------------------------------------------------ check 2
    def audit(
        self,
        step: int,
        loss: torch.Tensor | None,
        own_fingerprints: torch.Tensor | None,
        *,
        deterministic: bool,
    ) -> Alarm | None:
        """Replay the target's batch, gather every rank's results, attribute (collective: one
        all-gather, then one all-reduce when a mismatch needs confirming; at the first audit,
        each rank's two replays of its own micro-batch before them, the preflight).

        The template every layout's audit follows: :meth:`audit_rows` (this rank's rows), the
        one all-gather, :meth:`failed_ranks` (a replay that raised skips the audit),
        :meth:`compare` (the verdict); the pipeline's audit overrides the three hooks.

        Call it on every rank after a clean check 1. Records a pass, or returns the Alarm (not
        yet logged nor published). Before any result is compared, the set-up is ruled out
        (:mod:`.setup`): a replay fed another batch than its target trained on, a replay that
        ran the training wrapper, a failed preflight, or a ring with more mismatches than one
        GPU explains is a set-up finding (``alarm.is_setup``: it names nobody). A replay that
        raised skips the audit on every rank, logged and counted; the
        ``skipped_audits_allowed + 1``-th skip in a row is a set-up finding too.
        """
        own, replayed = self.audit_rows(step, loss, own_fingerprints, deterministic=deterministic)
        a = self.adapter
        mine = torch.tensor([own, replayed], dtype=torch.int64, device=a.collective_device)
        gathered = [torch.zeros_like(mine) for _ in range(a.world)]
        dist.all_gather(gathered, mine, group=a.dp_group)
        rows = torch.stack(gathered).cpu().tolist()
        if failed := self.failed_ranks(rows):
            return self.skipped(step, failed)
        self.skipped_in_a_row = 0
        return self.compare(step, rows, own_fingerprints, deterministic=deterministic)

    # The template's steps, each a hook a layout's audit overrides (the pipeline's compares
    # stage by stage): this rank's two rows, which ranks' replays failed, the comparison.
    def _own_fingerprints(
        self, own_fingerprints: torch.Tensor | None, deterministic: bool
    ) -> torch.Tensor | None:
        """The audited micro-batch's local gradient fingerprints (isolated under accumulation)."""
        if self.grad_accum > 1:
            return self.isolated_fingerprints if deterministic else None
        return own_fingerprints

    def audit_rows(
        self,
        step: int,
        loss: torch.Tensor | None,
        own_fingerprints: torch.Tensor | None,
        *,
        deterministic: bool,
    ) -> tuple[list[int], list[int]]:
        """This rank's two rows of the audit's gather: its own training outcome (at the first
        audit, with its preflight self-replays' flags) and its replay of its target."""
        a, offset = self.adapter, self.peer_offset
        own_fingerprints = self._own_fingerprints(own_fingerprints, deterministic)
        if loss is None:
            raise RuntimeError(f"sdc_agent: audit step {step} has no loss to compare")
        own = outcome_of(loss, own_fingerprints, True)  # audits run only when every flag was clean
        if self.batches is not None:
            trained = self.batches.trained_digest([self.position])
            own = dataclasses.replace(own, batch=trained, trained=trained)
        if not self.preflight_done:
            own = dataclasses.replace(
                own, flags=own.flags | self._self_replays(step, own, deterministic)
            )
        replayed = self.replay_row(step, replay_target(a.dp_rank, a.world, offset), deterministic)
        return own.to_row(), replayed

    def failed_ranks(self, rows: list[list[list[int]]]) -> list[int]:
        """The global ranks whose replay raised (their row is FAILED_ROW), from the gather."""
        return [self.adapter.global_rank(dp) for dp, r in enumerate(rows) if is_failed(r[1])]

    def compare(
        self,
        step: int,
        rows: list[list[list[int]]],
        own_fingerprints: torch.Tensor | None,
        *,
        deterministic: bool,
    ) -> Alarm | None:
        """Judge the gathered rows (every rank's own outcome and replay): set-up findings first,
        then mismatches, culprits and confirmations (collective only when a mismatch needs
        confirming). Records a pass, or returns the Alarm."""
        a, offset = self.adapter, self.peer_offset
        own_fingerprints = self._own_fingerprints(own_fingerprints, deterministic)
        first_audit = not self.preflight_done
        owns = [Outcome.from_row(r[0]) for r in rows]
        replays = [Outcome.from_row(r[1]) for r in rows]
        # The most specific finding first: a replay fed another batch, then one that ran the
        # training wrapper, then the preflight's.
        finding = batch_finding(owns, replays, offset, a.global_rank) or wrapper_finding(
            replays, a.global_rank
        )
        if first_audit:
            self.preflight_done = True
            checked = preflight(owns, a.global_rank, compare_grads=self.compare_grads)
            self.compare_grads = checked.compare_grads
            self.preflight_notes = list(checked.notes)
            finding = finding or checked.finding
            if self.reporter.publishes and finding is None:
                logger.info(
                    "sdc_agent: preflight at step %d: %s",
                    step,
                    "; ".join(checked.notes)
                    or "two replays of each rank's own micro-batch agreed bit for bit with "
                    "each other and with its training",
                )
        if finding is not None:
            return self.setup_alarm(step, finding)
        compare_grads = deterministic and self.compare_grads
        pairs = find_mismatches(owns, replays, offset, compare_grads=compare_grads)
        if not pairs:
            self.reporter.record_pass("audit", step)
            return None
        diagnosis = None
        if a.compute_groups and compare_grads:
            # Ranks that compute one micro-batch together (tensor parallel): keep the pairs that
            # diverged first; the others received the wrong result through a collective.
            mixed = pairs
            pairs = self._earliest_local_pairs(pairs, own_fingerprints, self.replayer.last_table)
            if pairs != mixed:
                later = [
                    (a.global_rank(t), a.global_rank(r)) for t, r in mixed if (t, r) not in pairs
                ]
                diagnosis = (
                    "ranks that compute together (tensor parallel): the pairs "
                    f"{[(a.global_rank(t), a.global_rank(r)) for t, r in pairs]} diverged first, "
                    "in local results computed before a collective mixed their group's slices; "
                    f"the pairs {later} of the same groups diverged only later, after a "
                    "collective carried a wrong result to them"
                )
        if (finding := pattern_finding(pairs, a.world, offset, a.global_rank)) is not None:
            return self.setup_alarm(step, finding)
        alerted = (
            sorted(self.nondeterministic_ops)
            if any(o.flags & NONDETERMINISTIC_OP for o in replays)
            else []
        )
        if alerted:
            # Deterministic mode warned: the preflight's self-replays vouch for these ops only
            # if they ran there too; say so in the report.
            diagnosis = (
                f"{diagnosis + '; ' if diagnosis else ''}ops without a deterministic kernel ran "
                f"in these replays ({', '.join(alerted)}): the first audit's self-replays "
                "decided whether they reproduce bit for bit"
            )

        culprits = find_culprits(pairs)
        disputed = unexplained(pairs, culprits)
        results = self.confirm(step, [t for t, _ in disputed], deterministic) if disputed else []
        if self.reporter.publishes and self.nondeterministic_ops:
            logger.warning(
                "sdc_agent: ops without a deterministic kernel ran in this audit's replays: %s",
                sorted(self.nondeterministic_ops),
            )
        verdicts: list[Verdict] = []
        blamed = list(culprits)
        for (target, replayer), result in zip(disputed, results, strict=True):
            if result is not None and fed_another_batch(owns[target].trained, result[0]):
                # The third GPU rebuilt another batch than the target trained on (a
                # rebuild_batch that depends on the rank calling it): the set-up, not a GPU.
                return self.setup_alarm(
                    step, third_batch_finding(a.global_rank(target), self.third_rank(target))
                )
            if result is not None and (
                finding := self.rebuilds_differ(target, result, replayer, replays[replayer])
            ):
                # The same, seen where the forward was fed alike: the labels differed.
                return self.setup_alarm(step, finding)
            kind, who = (
                mismatch_verdict(
                    owns[target], replays[replayer], *result, compare_grads=compare_grads
                )
                if result is not None
                else ("unattributable", "")
            )
            suspect = {"target": target, "replayer": replayer}.get(who)
            if suspect is not None:
                blamed.append(suspect)
            verdicts.append(
                Verdict(
                    pair=(a.global_rank(target), a.global_rank(replayer)),
                    third=self.third_rank(target),
                    suspect=a.global_rank(suspect) if suspect is not None else None,
                    kind=kind,
                )
            )
        return self.reporter.alarm(
            step,
            "compute",
            last_pass=self.reporter.passes.last_audit_pass,
            suspects=[a.global_rank(r) for r in blamed],
            pairs=[(a.global_rank(t), a.global_rank(r)) for t, r in pairs],
            culprits=[a.global_rank(r) for r in culprits],
            verdicts=verdicts,
            diagnosis=diagnosis,
        )

    def skipped(self, step: int, failed: list[int]) -> Alarm | None:
        """The audit of ``step`` did not run: replays raised on global ranks ``failed``. Not a
        pass (liveness shows audits stopping) and not an alarm on a GPU (none is implicated):
        the skip is logged and counted (``sdc_audit_skipped``), and the
        ``skipped_audits_allowed + 1``-th in a row is a set-up finding (the audits stop, or the
        job does where so configured). Every rank gets the same ``failed``, so every rank takes
        the same branch."""
        self.skipped_in_a_row += 1
        self.reporter.record_skipped_audit(step)
        if self.skipped_in_a_row > self.skipped_audits_allowed:
            return self.setup_alarm(step, repeated_failure(step, failed, self.skipped_in_a_row))
        if self.reporter.publishes:
            logger.error(
                "sdc_agent: the audit of step %d did not run: replays raised on ranks %s "
                "(see their logs); the step is applied unaudited (%d of %d skipped audits "
                "in a row allowed before the audits stop)",
                step,
                failed,
                self.skipped_in_a_row,
                self.skipped_audits_allowed,
            )
        return None

    def _self_replays(self, step: int, own: Outcome, deterministic: bool) -> int:
        """The preflight's share of this rank (collective under lockstep replays: every rank
        replays its own micro-batch twice at once): two replays of this rank's own audited
        micro-batch, compared with each other and with its training. Returns the preflight
        flags for its own row (none when a replay raised: the ring's replay says so)."""
        rank = self.adapter.dp_rank
        rows = [self.replay_row(step, rank, deterministic) for _ in range(2)]
        if any(is_failed(r) for r in rows):
            return 0
        first, second = (Outcome.from_row(r) for r in rows)
        if first.rebuilt and second.rebuilt and first.rebuilt != second.rebuilt:
            return SELF_REBUILD_DIFFERS  # nothing else can be judged from two other batches
        flags = 0
        if first.loss_bits != second.loss_bits or first.finite != second.finite:
            flags |= SELF_LOSS_DIFFERS
        elif deterministic and first.grad_digest != second.grad_digest:
            flags |= SELF_GRADS_DIFFER
        compare_grads = deterministic and self.compare_grads and not flags & SELF_GRADS_DIFFER
        misfed = fed_another_batch(own.trained, first)  # the batch check reports that
        if not flags and not misfed and not first.matches(own, compare_grads=compare_grads):
            flags |= SELF_DIFFERS_FROM_TRAINING
        return flags

    def setup_alarm(self, step: int, finding: SetupFinding) -> Alarm:
        """The alarm of a set-up finding (``alarm.is_setup``): it names nobody, its verdicts are
        ``setup``, its report's ``setup`` entry says what failed and how to fix it."""
        a = self.adapter
        return self.reporter.alarm(
            step,
            "compute",
            last_pass=self.reporter.passes.last_audit_pass,
            suspects=None,
            pairs=[(a.global_rank(t), a.global_rank(r)) for t, r in finding.pairs],
            verdicts=[
                Verdict(
                    pair=(a.global_rank(t), a.global_rank(r)),
                    third=None,
                    suspect=None,
                    kind="setup",
                )
                for t, r in finding.pairs
            ],
            diagnosis=f"the job's set-up, not a GPU: {finding.message()}",
            setup=finding.to_dict("stopped" if self.stops_on_setup_error else "off"),
        )

    def _first_divergences_over(
        self,
        own_table: torch.Tensor | None,
        replay_table: torch.Tensor | None,
        *,
        target: int,
        replayer: int,
        world: int,
        group: dist.ProcessGroup | None,
    ) -> list[int]:
        """Per rank of ``group`` (``world`` of them): the index of the first of its own ordered
        local results ``own_table`` where its replayer's replay differs
        (:func:`.attribution.first_divergence`).

        Collective over ``group``: each rank sends its replay's local results
        (``replay_table``) to ``target``, the rank whose work it replayed, and receives its own
        ``replayer``'s (one point-to-point shift around the ring: the tables never travel
        further), finds where they first differ from its own, and one small all-gather shares
        that index. The TP audit and the pipeline audit (per stage) both use it."""
        device = self.adapter.collective_device
        empty = torch.zeros((0, 2), dtype=torch.int64)
        own = (own_table if own_table is not None else empty).to(device, torch.int64)
        replay = (replay_table if replay_table is not None else empty).to(device, torch.int64)
        length = torch.tensor([replay.shape[0]], dtype=torch.int64, device=device)
        received_length = torch.zeros_like(length)
        self._shift(length, target, received_length, replayer)
        received = torch.zeros((int(received_length.item()), 2), dtype=torch.int64, device=device)
        self._shift(replay.contiguous(), target, received, replayer)
        mine = torch.tensor(
            [first_divergence(own.cpu().tolist(), received.cpu().tolist())],
            dtype=torch.int64,
            device=device,
        )
        firsts = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(firsts, mine, group=group)
        return [int(f.item()) for f in firsts]

    def _earliest_local_pairs(
        self,
        pairs: list[tuple[int, int]],
        own_table: torch.Tensor | None,
        replay_table: torch.Tensor | None,
    ) -> list[tuple[int, int]]:
        """The mismatched pairs whose local results diverged first among the pairs of the same
        two groups of ranks that compute together (:func:`.attribution.earliest_local_mismatches`).

        Collective over the audit's group, only when some pair mismatched. Each rank sends its
        replay's local results to the rank whose micro-batch it replayed, and receives its own
        replayer's (one point-to-point shift around the ring: the tables never travel further),
        finds where they first differ from its own, and one small all-gather shares that index."""
        a = self.adapter
        firsts = self._first_divergences_over(
            own_table,
            replay_table,
            target=a.global_rank(replay_target(a.dp_rank, a.world, self.peer_offset)),
            replayer=a.global_rank((a.dp_rank - self.peer_offset) % a.world),
            world=a.world,
            group=a.dp_group,
        )
        first = {(t, r): firsts[t] for t, r in pairs}
        group_of = list(range(len(a.compute_groups), len(a.compute_groups) + a.world))
        for index, members in enumerate(a.compute_groups):
            for dp in members:
                group_of[dp] = index
        return earliest_local_mismatches(pairs, first, group_of)

    def _shift(self, send: torch.Tensor, to: int, receive: torch.Tensor, source: int) -> None:
        """Send ``send`` to global rank ``to`` while receiving ``receive`` from ``source``, every
        rank at once (batched, so that NCCL cannot deadlock on a ring of sends)."""
        group = self.adapter.dp_group
        ops = [
            dist.P2POp(dist.isend, send, to, group=group),
            dist.P2POp(dist.irecv, receive, source, group=group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def rebuilds_differ(
        self,
        target: int,
        confirmation: tuple[Any, Any],
        replayer: int | None = None,
        replayed: Any = None,
    ) -> SetupFinding | None:
        """Whether the replays of DP rank ``target``'s batch (its third GPU's and its own, from
        ``confirmation``, and ``replayer``'s ``replayed`` where given) rebuilt different
        micro-batches (:func:`.setup.rebuild_finding`); a pipeline's outcomes carry no digest."""
        a = self.adapter
        third, again = confirmation
        replays = [(third_gpu(target, a.world, self.peer_offset), third), (target, again)]
        if replayer is not None:
            replays.insert(0, (replayer, replayed))
        if not all(isinstance(o, Outcome) for _, o in replays):
            return None
        return rebuild_finding(target, replays, a.global_rank)

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        return self.adapter.global_rank(dp_rank)

    def third_rank(self, target_dp: int) -> int:
        """The global rank of the GPU that settles a dispute over DP rank ``target_dp``'s batch."""
        a = self.adapter
        return a.global_rank(third_gpu(target_dp, a.world, self.peer_offset))

    # ------------------------------------------------------------------ check 1's confirmation
    def scaler_skips_everywhere(self, table: FlagTable) -> bool:
        """Whether every rank's ``scaler.step`` will find an inf and skip ``table``'s step:
        under DDP, when every rank's reduced gradient is non-finite (each rank's scaler sees
        only its own copy)."""
        return all(table.reduced)


@contextlib.contextmanager
def _no_recording() -> Iterator[ReplayCapture]:
    """A capture that records nothing (an audit that does not compare batches)."""
    yield ReplayCapture()


class CollectiveRingAudit(RingAudit):
    """The ring audit with replays in lockstep: every rank runs every replay round at once (a
    replay's forward needs the other ranks' shards: FSDP2)."""

    def scaler_skips_everywhere(self, table: FlagTable) -> bool:
        """Whether every rank's ``scaler.step`` will skip ``table``'s step: when SOME rank's
        shard of the reduced gradient is non-finite. ``GradScaler.unscale_`` max-reduces
        ``found_inf`` over the mesh's shard dimension, and HSDP's replicas of a shard hold the
        same reduced values (:mod:`sdc_agent.parallel.fsdp`); the flags here are those shards'
        (or, with clipping, the global norm's)."""
        return any(table.reduced)

    def replay_row(
        self, step: int, target_dp: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Every rank replays one rank's micro-batch(es) (its own target's) at the same time; a
        batch that cannot be rebuilt on any rank makes every rank send FAILED_ROW before any
        forward. ``whole_step``: every micro-batch of the step, as RingAudit's."""
        return self.lockstep_row(
            step, self.adapter.global_rank(target_dp), deterministic, whole_step
        )

    def lockstep_row(
        self, step: int, target: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Replay global rank ``target``'s micro-batch(es) as a row, every rank at once (each
        its own target's): rebuilt first, and a failure on any rank makes every rank send
        :meth:`failed_row` before any forward (collective)."""
        a = self.adapter
        micros: list[Any] = []
        failed = 0
        try:
            micros = self._micro_batches(step, target)
        except Exception:
            logger.exception(
                "sdc_agent: rebuilding rank %d's batch of step %d failed on rank %d",
                target,
                step,
                a.rank,
            )
            failed = 1
        flag = torch.tensor([failed], dtype=torch.int64, device=a.collective_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=a.dp_group)  # nobody starts alone
        if int(flag.item()):
            return self.failed_row()
        try:
            # Every rank replays the same number of micro-batches (grad_accum is the job's), so
            # FSDP2's all-gathers pair up.
            outcome = self._replay_micro_batches(step, target, micros, deterministic, whole_step)
        except Exception:
            logger.exception(
                "sdc_agent: replaying rank %d's batch of step %d failed on rank %d",
                target,
                step,
                a.rank,
            )
            return self.failed_row()
        return outcome.to_row()

    def fill_confirmations(
        self, targets: list[int], table: torch.Tensor, replay_row: Callable[[int], list[int]]
    ) -> None:
        """One round per disputed target: every rank replays the target's batch (collective);
        the third GPU's row fills column 0 and the target's own column 1."""
        a = self.adapter
        jobs = confirmation_jobs(targets, a.world, self.peer_offset, a.dp_rank)
        for slot, target_dp in enumerate(targets):
            row = torch.tensor(replay_row(target_dp))
            for job_slot, column, _ in jobs:
                if job_slot == slot:
                    table[slot, column] = row


def ring_audit_type(adapter: ReplayLayout) -> type[RingAudit]:
    """Check 2's audit for ``adapter``'s replay unit: :class:`CollectiveRingAudit` when a replay
    needs every rank at once (``adapter.replays_in_lockstep``), else :class:`RingAudit`."""
    return CollectiveRingAudit if adapter.replays_in_lockstep else RingAudit
