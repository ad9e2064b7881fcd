"""The sensors in the guard: arm them each step, carry their flag in check 1's reduction, and
turn a flag into a candidate that replays confirm or dismiss.

A flag is a candidate, never an alarm by itself. Every step on which some sensor checks, every
rank waits for check 1's flag reduction before its optimizer step (the sensor flag is one more
int64 in it; no new per-step collective), so a candidate is judged while every rank still holds
the step's exact state. Then, collectively and only on that step:

1. an all-gather of every rank's per-sensor flags and ratios says which sensors fired
   (:attr:`sdc_agent.Alarm.sensor_candidates`);
2. each flagged rank's micro-batches are replayed, with every warmed-up sensor checking, on its
   third GPU (another node) and on itself (the existing confirmation placement), and one
   all-reduce brings the rows back;
   Under FSDP2 (a forward needs every rank's shards) every rank replays each flagged rank's
   batch at once, one round per flagged rank, as check 2's collective confirmations do;
3. :func:`sensor_verdict` decides: the third GPU's sensor fires too -> ``reproducible`` (the
   data's numerics, not a GPU: counted as an unconfirmed flag, logged, published only as a
   liveness count, and the step is applied); the flagged rank's own replay fires again or
   disagrees with the third GPU's -> ``persistent``; otherwise ``transient``. A confirmed
   verdict is an alarm naming the rank, and the step is not applied.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..alarm import Alarm, SensorCandidate, Verdict, VerdictKind
from ..attribution import FAILED_ROW, Outcome, confirmation_jobs, is_failed, third_gpu
from ..gradients import FlagTable
from ..schedule import Schedule
from .board import SensorBoard
from .families import describe_families
from .linear import find_board
from .plan import SensorPlan, plan_sensors

if TYPE_CHECKING:
    from ..audit import RingAudit
    from ..parallel import DDPAdapter
    from ..reporting import Reporter

logger = logging.getLogger("sdc_agent")

BLIND = (
    "corrupted inputs or weights of a checked op (its result is self-consistent; checks 2 and 3 "
    "cover them)",
    "a corruption after the check (the rounding to bf16/fp16, a later memory write)",
    "ops that only move data (reshape, transpose, concatenation, dtype casts), the loss's "
    "reduction to a scalar, the optimizer",
    "the fused scaled_dot_product_attention kernel (protect(attention='fused'), the default): "
    "its forward only through the recompute comparison of an activation-checkpointed block, its "
    "backward not at all; protect(attention='checked') checks both",
    "functions not routed to a site: other activations, in-place adds, subtractions, matmuls "
    "outside the checked attention (eager attention), F.softmax in a forward, a loss computed "
    "outside the protected model's forward (only F.cross_entropy inside it is checked)",
    "GEMMs of layers not protected (nn.Linear subclasses, convolutions); norms other than "
    "nn.LayerNorm and the RMSNorms the probe recognises (BatchNorm, Gemma's (1 + w))",
    "faults below rounding: a 16-bit value's own rounding hides a 10% change of one element from "
    "row sums (LayerNorm, softmax, ResidualAdd modules); element-wise checks see it",
    "ops not sampled at a step (at the default budget every sensor checks on one step in "
    "`period`, none between), sensors in warm-up, function sites first met after the plan",
)
"""What the online sensors do not see (``Guard.coverage()`` reports it)."""

ROW = len(FAILED_ROW) + 1
"""A confirmation replay's row: its outcome (attribution's row) and whether a sensor fired."""


def sensor_verdict(
    third: Outcome, third_fired: bool, again: Outcome, again_fired: bool, *, compare_grads: bool
) -> tuple[VerdictKind, str]:
    """Settle one sensor candidate; returns (kind, who): who is "target" or "" (nobody).

    ``third``: the third GPU's replay of the flagged rank's micro-batches, ``again``: the flagged
    rank's own replay; ``*_fired``: whether a sensor flagged during that replay.
    """
    if third_fired:
        return "reproducible", ""  # a healthy GPU reads the same: numerics of the data
    if again_fired or not again.matches(third, compare_grads=compare_grads):
        return "persistent", "target"
    return "transient", "target"


class SensorCheck:
    """The online sensors of one guard (a do-nothing when the model has no protected layer or
    ``Schedule.sensors`` is False)."""

    def __init__(
        self,
        module: nn.Module,
        schedule: Schedule,
        *,
        unsupported: str | None = None,
        adapter: DDPAdapter | None = None,
    ) -> None:
        """Find ``module``'s sensor board; the plan under ``Schedule.sensor_budget`` follows at
        the first step.

        ``unsupported``: why this guard cannot run sensors (its parallelism); they stay off and
        :meth:`describe` says why. ``adapter``: the job's data-parallel ranks, which agree on
        the rows the plan assumes (one all-reduce, once), so that every rank has the same sensor
        steps; without it (a single process) the plan is local."""
        self._adapter = adapter
        self.unsupported = unsupported if find_board(module) is not None else None
        board = find_board(module) if schedule.sensors and unsupported is None else None
        self.board: SensorBoard | None = board
        self.budget = schedule.sensor_budget
        self.plan: SensorPlan | None = None
        """The plan (in bursts, :mod:`.plan`), made at the first step after a protected layer
        ran (the cost model needs the batch's rows); until then nothing checks."""
        self.sensing = False
        """Whether some sensor checks at the current step (every rank alike)."""
        self.unconfirmed = 0
        """Candidates the replays did not confirm, since the guard started."""
        self._flags: torch.Tensor | None = None
        self._ratios: torch.Tensor | None = None

    @property
    def enabled(self) -> bool:
        """Whether the model has protected layers and the schedule lets them check."""
        return self.board is not None

    # ------------------------------------------------------------------ per step (local)
    def _planned(self) -> SensorPlan | None:
        """The plan, made on first use once a protected layer has run. With an adapter this is
        collective (every rank calls it at the same step: each has run the same forwards)."""
        if self.plan is None and self.board is not None and self.board.rows is not None:
            rows = self.board.rows
            a = self._adapter
            if a is not None:
                # Every rank must have the same sensor steps: agree on the largest batch.
                agreed = torch.tensor([rows], dtype=torch.int64, device=a.collective_device)
                dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=a.dp_group)
                rows = int(agreed.item())
            self.plan = plan_sensors(
                self.board,
                self.budget,
                rows=rows,
                device_type=self.board.device_type,
                burst=True,
            )
        return self.plan

    def checks_at(self, step: int) -> bool:
        """Whether some sensor checks at ``step`` (the same on every rank): such a step is
        seeded, so that a candidate's confirmation replays it exactly (dropout included).
        Collective at the first step after the protected layers ran (see :meth:`_planned`)."""
        plan = self._planned()
        return plan is not None and bool(plan.active(step))

    def begin_step(self, step: int) -> None:
        """Arm the sensors the plan checks at ``step`` (before its forward pass)."""
        plan = self._planned()
        if self.board is None or plan is None:
            return
        active = plan.active(step)
        self.sensing = bool(active)
        self.board.arm(active)

    def take_flag(self) -> torch.Tensor | None:
        """This step's flag for check 1's reduction (a device tensor; no host read), and disarm
        the sensors: nothing checks during the audit's replays. None when nothing checked."""
        if self.board is None or not self.sensing:
            if self.board is not None:
                self.board.disarm()
            return None
        self._flags, self._ratios = self.board.take_flags()
        return self._flags.any()

    def end_step(self) -> None:
        """The step is decided: no sensor checks until the next step arms them."""
        self.sensing = False
        if self.board is not None:
            self.board.disarm()

    # ------------------------------------------------------------------ candidates (collective)
    def candidates(self, table: FlagTable, adapter: DDPAdapter) -> list[SensorCandidate]:
        """Which sensors fired on which flagged rank, with that rank's own ratio and threshold
        (collective: one all-gather, so every rank reports the same candidates)."""
        assert self.board is not None and self._flags is not None and self._ratios is not None
        thresholds = self.board.threshold_tensor().to(self._ratios.device)
        mine = torch.cat([self._flags.double(), self._ratios.double(), thresholds.double()]).to(
            adapter.collective_device
        )
        gathered = [torch.empty_like(mine) for _ in range(adapter.world)]
        dist.all_gather(gathered, mine, group=adapter.dp_group)
        n = len(self.board)
        found = []
        for dp in table.sensor_flagged:
            row = gathered[dp].cpu().tolist()
            for index in range(n):
                if row[index]:
                    ratio, threshold = row[n + index], row[2 * n + index]
                    sensor = self.board.sensors[index]
                    found.append(
                        SensorCandidate(
                            rank=adapter.global_rank(dp),
                            layer=sensor.layer,
                            gemm=sensor.gemm,
                            ratio=ratio if math.isfinite(ratio) else None,
                            threshold=threshold if math.isfinite(threshold) else None,
                            kind=sensor.kind,
                        )
                    )
        return found

    def _replay_row(
        self, audit: RingAudit, step: int, target_dp: int, deterministic: bool
    ) -> list[int]:
        """Replay ``target_dp``'s micro-batches with every warmed-up sensor checking (under
        FSDP2 collectively: every rank calls it for the same target at once)."""
        assert self.board is not None
        self.board.confirm_all()
        try:
            if _replays_collectively(audit):
                # Collective; a failure on any rank comes back as FAILED_ROW on every rank.
                row = audit._replay_row(step, target_dp, deterministic, whole_step=True)
                fired = bool(self.board.take_flags()[0].any()) and not is_failed(row)
                return [*row, int(fired)]
            outcome = audit.replay(step, target_dp, deterministic=deterministic, whole_step=True)
            fired = bool(self.board.take_flags()[0].any())
            return [*outcome.to_row(), int(fired)]
        except Exception:
            logger.exception(
                "sdc_agent: the sensor confirmation replay of rank %d's batch of step %d failed",
                audit.adapter.global_rank(target_dp),
                step,
            )
            return [*FAILED_ROW, 0]
        finally:
            self.board.disarm()

    def judge(
        self, table: FlagTable, audit: RingAudit, reporter: Reporter, *, deterministic: bool
    ) -> Alarm | None:
        """Confirm the sensor candidates of ``table`` by replays (collective: one all-gather,
        one all-reduce). Returns the Alarm naming the ranks the replays confirm (not yet logged
        nor published), or None when none is confirmed (counted in :attr:`unconfirmed`)."""
        a = audit.adapter
        found = self.candidates(table, a)
        targets = table.sensor_flagged
        rows = torch.zeros((len(targets), 2, ROW), dtype=torch.int64)
        # Without a third node for each target (the same answer on every rank) nothing is replayed.
        jobs = confirmation_jobs(targets, a.world, audit.peer_offset, a.dp_rank)
        if audit.can_confirm and _replays_collectively(audit):
            # FSDP2: a forward needs every rank's shards, so every rank replays each target's
            # batch at once (one round per target) and only the third GPU and the target keep
            # their row; each rank's sensors read its own computation of that batch.
            for slot, target_dp in enumerate(targets):
                row = torch.tensor(self._replay_row(audit, table.step, target_dp, deterministic))
                for job_slot, column, _ in jobs:
                    if job_slot == slot:
                        rows[slot, column] = row
        else:
            for slot, column, target_dp in jobs if audit.can_confirm else []:
                rows[slot, column] = torch.tensor(
                    self._replay_row(audit, table.step, target_dp, deterministic)
                )
        rows = rows.to(a.collective_device)
        dist.all_reduce(rows, op=dist.ReduceOp.SUM, group=a.dp_group)  # one writer per slot
        verdicts: list[Verdict] = []
        blamed: list[int] = []
        for target, (third_row, again_row) in zip(targets, rows.cpu().tolist(), strict=True):
            if not audit.can_confirm or is_failed(third_row[:-1]) or is_failed(again_row[:-1]):
                kind, who = "unattributable", ""  # a sensor never names a GPU by itself
            else:
                kind, who = sensor_verdict(
                    Outcome.from_row(third_row[:-1]),
                    bool(third_row[-1]),
                    Outcome.from_row(again_row[:-1]),
                    bool(again_row[-1]),
                    compare_grads=deterministic,
                )
            g = a.global_rank(target)
            if who:
                blamed.append(g)
            third = a.global_rank(third_gpu(target, a.world, audit.peer_offset))
            verdicts.append(
                Verdict(pair=(g, g), third=third, suspect=g if who else None, kind=kind)
            )
        if not blamed:
            self.unconfirmed += len(targets)
            if reporter.publishes:
                logger.warning(
                    "sdc_agent: sensor candidate at step %d not confirmed by replays (%s; "
                    "verdicts %s): counted (%d so far), the step is applied",
                    table.step,
                    [c.to_dict() for c in found],
                    [v.kind for v in verdicts],
                    self.unconfirmed,
                )
            reporter.publish(
                "unconfirmed sensor flags",
                lambda p: _publish_unconfirmed(p, table.step, len(targets)),
            )
            return None
        alarm = reporter.alarm(
            table.step,
            "compute",
            last_pass=reporter.passes.last_audit_pass,
            suspects=blamed,
            verdicts=verdicts,
        )
        return dataclasses.replace(alarm, sensor_candidates=found)

    # ------------------------------------------------------------------ coverage
    def describe(self) -> dict[str, Any]:
        """The sensors' part of ``Guard.coverage()``: which GEMMs are checked, at what rate."""
        if self.board is None:
            return {
                "on": False,
                "why": self.unsupported
                or "no protected layer (sdc_agent.sensors.protect) or Schedule.sensors=False",
                "layers": {},
            }
        # A report never makes the plan under an adapter (that is collective).
        plan = self.plan if self._adapter is not None else self._planned()
        layers: dict[str, dict[str, float | None]] = {}
        for index, sensor in enumerate(self.board.sensors):
            rate = plan.rate(index) if plan is not None else None
            layers.setdefault(sensor.layer, {})[sensor.gemm] = rate
        return {
            "on": True,
            "why": "row checksums of the forward, input-gradient and weight-gradient GEMMs of "
            "protected linear layers, on their fp32 result; row invariants of protected layer "
            "norms (output and input gradient), residual adds (sums) and (log-)softmax (row "
            "sums, output and input gradient); a flag is confirmed by replays on a third GPU "
            "before it is an alarm",
            "planned": plan is not None,
            "budget": self.budget,
            "rows": self.board.rows,
            "device": self.board.device_type,
            "period": plan.period if plan is not None else None,
            "estimated_cost": plan.mean_cost if plan is not None else None,
            "warmup_checks": self.board.config.warmup_checks,
            "layers": layers,
            "kinds": dict(self.board.layers),
            "families": describe_families(self.board, plan),
            "blind": list(BLIND),
        }


def _replays_collectively(audit: RingAudit) -> bool:
    """Whether ``audit`` replays as FSDP2 must: every rank at once (sdc_agent.replay_fsdp)."""
    from ..replay_fsdp import CollectiveRingAudit  # FSDP2 only; imports torch.distributed.tensor

    return isinstance(audit, CollectiveRingAudit)


def _publish_unconfirmed(publisher: Any, step: int, count: int) -> None:
    """Hand the count to publishers that take it (an optional method of the protocol)."""
    publish = getattr(publisher, "publish_unconfirmed_sensor_flags", None)
    if callable(publish):
        publish(step, count)
