"""Check 2 on a pipeline: replicas replay each other's pipeline step; each stage is compared with
the same stage of the replica it replayed, and the earliest local divergence names one GPU.

The replay unit is a whole replica (every stage of one pipeline), so every rank replays at once
(:class:`~.audit.CollectiveRingAudit`'s lockstep): replica r's ranks replay replica
``r + peer_offset``'s pipeline step, each rank feeding its stage what the target replica's rank
at the same pipeline coordinate fed it (``rebuild_batch(step, that rank)``) and seeding the RNG
as that rank did. Every rank's row (its own training outcome and its replay) is gathered over
the job; the verdict is computed from them with the same code on every rank, so every rank
returns the same Alarm.

The ring logic is :mod:`.attribution`'s, run along each pipeline coordinate
(:func:`~.pipeline.compare_pipelines`): a rank is in a mismatch only where ITS stage diverged
locally (same inputs, different outputs), so a stage downstream of a faulty one, whose inputs
already differ, is not blamed. With tensor parallelism inside the stages, a divergence (and only
a divergence: no collective on a step that agrees) sends each rank's replay's ordered local
results to the rank whose step it replayed, one small all-gather shares where each first
differs, and per stage the pairs that diverged first are kept
(:func:`~.pipeline.earliest_in_stages`). A disputed pair is settled on a third replica, on
another node: in a confirmation round every replica replays the disputed replica's pipeline
step, and the third replica's and the target's own rows, stage by stage, decide with the
existing verdicts (``persistent``, ``transient``, ``replayer_wrong``, ``unclear``). Check 1's
confirmations of a non-finite gradient run the same rounds.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from ...alarm import Alarm, Verdict, VerdictKind
from ...reporting import Reporter
from .attribution import mismatch_verdict, replay_target, third_gpu
from .audit import CollectiveRingAudit, RebuildBatch
from .environment import StepEnvironment
from .layout import ReplayLayout
from .pipeline import (
    PipelinedModel,
    PipelineOutcome,
    PipelineReplayer,
    StageRecord,
    combine_pipeline_outcomes,
    compare_pipelines,
    earliest_in_stages,
    failed_row,
    is_failed_row,
    ordered_local_results,
    row_width,
    tp_group_ids,
)


class PipelineLayout(ReplayLayout, PipelinedModel, Protocol):
    """What the pipeline audit asks of its layout, beside a replay's: the grid of replicas x
    pipeline coordinates (:class:`sdc_agent.parallel.pp.PipelineAdapter` answers it)."""

    pipeline_ranks: int
    """Ranks in one pipeline (one stage each)."""
    coordinate: int
    """This rank's position in its pipeline."""
    replicas: int
    """Pipeline replicas (the audit's ring runs over them)."""
    replica_index: int
    """This rank's replica."""

    def rank_at(self, replica: int, coordinate: int | None = None) -> int:
        """The global rank holding ``coordinate`` (default: this rank's) of ``replica``."""
        ...

    def coordinates_of(self, rank: int) -> tuple[int, int]:
        """(replica, pipeline coordinate) of global ``rank``."""
        ...


class PipelineRingAudit(CollectiveRingAudit):
    """Check 2 (and check 1's confirmations) for a pipeline-parallel job; see the module
    docstring. ``adapter`` is a :class:`PipelineLayout` (the pipeline adapter)."""

    checks_batches = False  # a later stage is fed activations: compare_pipelines checks inputs

    def __init__(
        self,
        adapter: PipelineLayout,
        replayer: PipelineReplayer,
        rebuild_batch: RebuildBatch,
        reporter: Reporter,
        *,
        peer_offset: int,
        can_confirm: bool,
        overflow_is_expected: bool = False,
        skipped_audits_allowed: int = 1,
        stops_on_setup_error: bool = False,
    ) -> None:
        """As :class:`~.audit.RingAudit`; ``peer_offset`` counts replicas (pipelines)."""
        super().__init__(
            adapter,
            replayer,
            rebuild_batch,
            reporter,
            peer_offset=peer_offset,
            can_confirm=can_confirm,
            overflow_is_expected=overflow_is_expected,
            skipped_audits_allowed=skipped_audits_allowed,
            stops_on_setup_error=stops_on_setup_error,
        )
        self.pipeline = adapter
        self.pipeline_replayer = replayer
        self._kept: dict[int, StageRecord] | None = None
        self._own_results: torch.Tensor | None = None
        """The audited pipeline step's ordered local results (tensor parallel inside the stage)."""
        self._audited_now = False
        self._width = row_width(len(adapter.rows_of_stage))

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
        """As :meth:`~.audit.RingAudit.prepare_step`; the pipeline's boundary flags start
        lowered (check 1 reads them every step)."""
        self._kept = None
        self.pipeline.recorder.arm_step()
        return super().prepare_step(
            step, audit=audit, deterministic=deterministic, position=position, seeded=seeded
        )

    def begin_micro_batch(
        self, step: int, index: int, *, audited: bool, seeded: bool, isolate: bool
    ) -> None:
        """Before pipeline step ``index`` of ``step``: seed it on seeded steps; on the audited
        one, fingerprint what the stages receive and send, and start a fresh table of local
        gradient fingerprints (its own: a stage's local gradient starts from none at every
        pipeline step, so nothing needs isolating)."""
        del isolate
        super().begin_micro_batch(step, index, audited=audited, seeded=seeded, isolate=False)
        self._audited_now = audited
        self.pipeline.recorder.start(fingerprinting=audited)
        state = self.pipeline_replayer.step_state
        if audited and state.local_fingerprints is not None:
            state.restart_fingerprints(self.pipeline.param_device)
        if audited and state.local_events is not None:
            # The TP probes' ordered local results: this pipeline step's own, as the replay's.
            state.local_events, state.local_event_keys = [], []

    def end_micro_batch(self) -> None:
        """After a pipeline step: its boundary flags join the step's; the audited one's record
        is kept for the audit."""
        super().end_micro_batch()
        recorder = self.pipeline.recorder
        recorder.end_pipeline_step()
        if self._audited_now:
            self._kept = recorder.records
            self.pipeline_replayer.step_state.capture_fingerprints = False
        self._audited_now = False

    # ------------------------------------------------------------------ replays
    def replica_row(
        self, step: int, replica: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Every rank replays ``replica``'s pipeline step at once, each rank its stage's part
        of it: what the replica's rank at its own pipeline coordinate fed (collective)."""
        return self.lockstep_row(step, self.pipeline.rank_at(replica), deterministic, whole_step)

    def combine(self, outcomes: list[Any]) -> PipelineOutcome:
        """One outcome for several replayed pipeline steps, stage by stage."""
        return combine_pipeline_outcomes(outcomes)

    def failed_row(self) -> list[int]:
        """A failed replay's row, as wide as this job's pipeline rows."""
        return failed_row(len(self.pipeline.rows_of_stage))

    def replay_row(
        self, step: int, target_dp: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Replay the pipeline step of global rank ``target_dp``'s replica (collective)."""
        replica, _ = self.pipeline.coordinates_of(self.adapter.global_rank(target_dp))
        return self.replica_row(step, replica, deterministic, whole_step)

    def third_rank(self, target_dp: int) -> int:
        """The rank at the same pipeline coordinate on the third replica."""
        a = self.pipeline
        replica, coordinate = a.coordinates_of(a.global_rank(target_dp))
        return a.rank_at(third_gpu(replica, a.replicas, self.peer_offset), coordinate)

    def _confirm_replicas(
        self, step: int, replicas: list[int], deterministic: bool, whole_step: bool
    ) -> dict[int, tuple[list[PipelineOutcome], list[PipelineOutcome]] | None]:
        """One round per disputed replica: every replica replays its pipeline step (collective);
        the third replica's rows and the replica's own are kept, coordinate by coordinate, and
        summed over the job (one writer per cell). Returns per replica (third's outcomes, own
        outcomes) by coordinate, or None when some replay of it raised."""
        a = self.pipeline
        table = torch.zeros((len(replicas), 2, a.pipeline_ranks, self._width), dtype=torch.int64)
        for slot, replica in enumerate(replicas):
            row = torch.tensor(self.replica_row(step, replica, deterministic, whole_step))
            if a.replica_index == third_gpu(replica, a.replicas, self.peer_offset):
                table[slot, 0, a.coordinate] = row
            if a.replica_index == replica:
                table[slot, 1, a.coordinate] = row
        table = table.to(a.collective_device)
        dist.all_reduce(table, op=dist.ReduceOp.SUM)
        results: dict[int, tuple[list[PipelineOutcome], list[PipelineOutcome]] | None] = {}
        for slot, replica in enumerate(replicas):
            cells = table[slot].cpu().tolist()
            if any(is_failed_row(row) for column in cells for row in column):
                results[replica] = None
                continue
            results[replica] = (
                [PipelineOutcome.from_row(row) for row in cells[0]],
                [PipelineOutcome.from_row(row) for row in cells[1]],
            )
        return results

    def confirm(
        self, step: int, targets: list[int], deterministic: bool, whole_step: bool = False
    ) -> list[tuple[Any, Any] | None]:
        """Check 1's confirmations of DP ranks ``targets`` (global ranks here): their replicas'
        pipeline steps replayed on the third replica and on themselves; each target judged on
        its own stage's outcome."""
        a = self.pipeline
        places = [a.coordinates_of(a.global_rank(t)) for t in targets]
        results = self._confirm_replicas(
            step, sorted({r for r, _ in places}), deterministic, whole_step
        )
        confirmed: list[tuple[Any, Any] | None] = []
        for replica, coordinate in places:
            result = results[replica]
            confirmed.append(
                None if result is None else (result[0][coordinate], result[1][coordinate])
            )
        return confirmed

    # ------------------------------------------------------------------ check 2
    # RingAudit.audit's template (one all-gather over the job, then one confirmation round per
    # disputed replica), with the pipeline's three hooks: each rank's rows are its stage's, and
    # the comparison is stage by stage.
    def audit_rows(
        self,
        step: int,
        loss: torch.Tensor | None,
        own_fingerprints: torch.Tensor | None,
        *,
        deterministic: bool,
    ) -> tuple[list[int], list[int]]:
        """This rank's stage's outcome of the kept pipeline step and its replay of the target
        replica's. ``loss`` is not used: the loss is the last stage's, in its rows."""
        del loss
        a = self.pipeline
        if self._kept is None:
            raise RuntimeError(
                f"sdc_agent: audit step {step} ran no pipeline step through the guard "
                "(GuardedStep.run_pipeline)"
            )
        # The per-parameter table: ``own_fingerprints`` is the ordered local results instead
        # when the TP probes record them (GradStatsState.local_table).
        state = self.pipeline_replayer.step_state
        gradients = state.local_fingerprints if own_fingerprints is not None else None
        own = a.recorder.outcome(
            self._kept, gradients if deterministic else None, a.rows_of_stage, True
        )
        self._own_results = ordered_local_results(state) if deterministic else None
        replayed = self.replica_row(
            step, replay_target(a.replica_index, a.replicas, self.peer_offset), deterministic
        )
        return own.to_row(), replayed

    def failed_ranks(self, rows: list[list[list[int]]]) -> list[int]:
        """The global ranks whose replay raised (the gather is over the whole job)."""
        return [rank for rank, r in enumerate(rows) if is_failed_row(r[1])]

    def compare(
        self,
        step: int,
        rows: list[list[list[int]]],
        own_fingerprints: torch.Tensor | None,
        *,
        deterministic: bool,
    ) -> Alarm | None:
        """Compare every replica's rows stage by stage along each pipeline coordinate, settle
        disputes on a third replica; records a pass, or returns the Alarm."""
        del own_fingerprints  # in the rows already
        a = self.pipeline
        offset = self.peer_offset
        columns = a.replica_columns()
        owns = [[PipelineOutcome.from_row(rows[g][0]) for g in column] for column in columns]
        replays = [[PipelineOutcome.from_row(rows[g][1]) for g in column] for column in columns]
        found = compare_pipelines(owns, replays, offset, compare_grads=deterministic)
        if found.agreed:
            self.reporter.record_pass("audit", step)
            return None
        diagnosis = None
        if deterministic and a.compute_groups and any(found.local.values()):
            # Tensor parallel inside the stages: keep the pairs that diverged first; the others
            # received a wrong result through a TP collective (collective: only on a divergence).
            firsts = self._first_divergences()
            first = {
                c: {(t, r): firsts[column[t]] for t, r in found.local[c]}
                for c, column in enumerate(columns)
            }
            kept = earliest_in_stages(found.local, first, tp_group_ids(columns, a.compute_groups))
            if kept != found.local:
                named = [(columns[c][t], columns[c][r]) for c in kept for t, r in kept[c]]
                later = [
                    (columns[c][t], columns[c][r])
                    for c, pairs in found.local.items()
                    for t, r in pairs
                    if (t, r) not in kept[c]
                ]
                diagnosis = (
                    "ranks that compute together (tensor parallel inside a pipeline stage): the "
                    f"pairs {sorted(named)} diverged first, in local results computed before a "
                    f"collective mixed their group's slices; the pairs {sorted(later)} of the "
                    "same groups diverged only later, after a collective carried a wrong result "
                    "to them"
                )
                found = found.keeping(kept)

        disputed_replicas = sorted({t for pairs in found.disputed.values() for t, _ in pairs})
        confirmations = (
            self._confirm_replicas(step, disputed_replicas, deterministic, False)
            if disputed_replicas
            else {}
        )
        pairs: list[tuple[int, int]] = []
        culprits: list[int] = []
        blamed: list[int] = []
        verdicts: list[Verdict] = []
        for c, column in enumerate(columns):
            pairs += [(column[t], column[r]) for t, r in found.local[c]]
            culprits += [column[r] for r in found.culprits[c]]
            for target, replayer in found.disputed[c]:
                result = confirmations.get(target)
                kind: VerdictKind
                who: str
                if result is None:
                    kind, who = "unattributable", ""
                else:
                    # (original, replayed, third, again): mismatch_verdict reads only their
                    # ``matches``, which PipelineOutcome has as attribution's Outcome does.
                    outcomes = (owns[c][target], replays[c][replayer], result[0][c], result[1][c])
                    kind, who = mismatch_verdict(*outcomes, compare_grads=deterministic)
                suspect = {"target": target, "replayer": replayer}.get(who)
                if suspect is not None:
                    blamed.append(column[suspect])
                verdicts.append(
                    Verdict(
                        pair=(column[target], column[replayer]),
                        third=column[third_gpu(target, a.replicas, offset)],
                        suspect=column[suspect] if suspect is not None else None,
                        kind=kind,
                    )
                )
            for target, replayer in found.unexplained[c]:
                # Disagreement with no local divergence anywhere: what one stage sent is not
                # what the next received, or a fault every stage of a replica saw alike.
                pairs.append((column[target], column[replayer]))
                verdicts.append(
                    Verdict(
                        pair=(column[target], column[replayer]),
                        third=None,
                        suspect=None,
                        kind="unclear",
                    )
                )
        if any(found.unexplained.values()):
            lost = (
                "replicas disagree but no pipeline stage diverged from the same inputs: what a "
                "stage sent differs from what the next one received (a corruption in transit), "
                "or every stage of a replica was affected alike"
            )
            diagnosis = f"{diagnosis}; {lost}" if diagnosis else lost
        return self.reporter.alarm(
            step,
            "compute",
            last_pass=self.reporter.passes.last_audit_pass,
            suspects=sorted(set(culprits + blamed)),
            pairs=sorted(pairs),
            culprits=sorted(culprits),
            verdicts=verdicts,
            diagnosis=diagnosis,
        )

    def _first_divergences(self) -> list[int]:
        """Per global rank: the index of the first of its own ordered local results (the
        audited pipeline step's) where its replayer's replay differs
        (:func:`.attribution.first_divergence`).

        Collective over the job, run only when some stage diverged: each rank sends its
        replay's ordered local results to the rank whose pipeline step it replayed (the same
        pipeline coordinate of the target replica) and receives its own replayer's (one
        point-to-point shift along each stage's ring: the tables never travel further), finds
        where they first differ from its own, and one small all-gather shares that index."""
        a = self.pipeline
        return self._first_divergences_over(
            self._own_results,
            self.pipeline_replayer.last_table,
            target=a.rank_at(replay_target(a.replica_index, a.replicas, self.peer_offset)),
            replayer=a.rank_at((a.replica_index - self.peer_offset) % a.replicas),
            world=a.world,
            group=None,
        )
