"""The sensors in the guard: arm them each step, carry their flag in check 1's reduction, agree
on their thresholds, and turn a flag into a candidate that the numbers confirm or dismiss.

A flag is a candidate, never an alarm by itself. Every step on which some sensor checks, every
rank waits for check 1's flag reduction before its optimizer step (the sensor flag is one more
int64 in it; no new per-step collective), so a candidate is judged while every rank still holds
the step's exact state. Then, collectively and only on that step:

1. an all-gather of every rank's per-sensor flags, ratios and thresholds says which sensors
   fired where (:attr:`sdc_agent.Alarm.sensor_candidates`); the thresholds are the same on
   every rank (:mod:`.board`), so a ratio is judged alike everywhere;
2. each flagged rank's micro-batches are replayed, with the step's sensors checking (on the
   step's kernels, so the replays compute as the step did), on its third GPU
   (another node) and on itself (the existing confirmation placement), and one all-reduce
   brings back each replay's outcome (loss bits, gradient digest) and every sensor's ratio.
   Under FSDP2 (a forward needs every rank's shards) every rank replays each flagged rank's
   batch at once, one round per flagged rank, as check 2's collective confirmations do;
3. :func:`sensor_verdict` decides by the numbers, never by a rank's own flag: the flagged
   ratio must stand apart from what a healthy GPU computes from the same inputs. Not confirmed
   -> ``reproducible`` (the data's numerics: counted as an unconfirmed flag, logged, published
   only as a liveness count, the step applied, and the sensor's threshold relaxed to what the
   healthy GPU reproduced); confirmed -> ``persistent`` when the flagged rank's own replay
   reads it again or differs from the third GPU's, else ``transient``: an alarm naming the
   rank, and the step is not applied.

What checks when (:meth:`SensorCheck.active`): every sensor on every step of the burn-in
(``Schedule.sensor_burn_in`` steps from the guard's first step), so hardware bad from the start
is named within them; then the budget's plan (:mod:`.plan`, in bursts). The ranks agree on
their thresholds once, at the sensor step that ends the observation window
(``SensorConfig.warmup_checks`` sensor steps), with one all-gather issued by every rank at the
same point (sensor steps are a pure function of the step).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ...alarm import Alarm, SensorCandidate, Verdict, VerdictKind
from ...schedule import Schedule
from ...sensors.ops.linear import find_board
from ...sensors.runtime.board import SEPARATION, SensorBoard
from ...sensors.runtime.families import describe_families
from ...sensors.runtime.plan import SensorPlan, plan_sensors
from ..gradients.exchange import FlagTable
from ..protocol import Check, StepStart
from ..replay.attribution import FAILED_ROW, ROW_WIDTH, Outcome, is_failed, third_gpu

if TYPE_CHECKING:
    from ...parallel.adapter import ParallelAdapter
    from ...reporting import Reporter
    from ..replay.audit import RingAudit
    from ..replay.layout import ReplayLayout

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
    "ops not sampled at a step after the burn-in (at the default budget every sensor checks on "
    "one step in `period`, none between; see each layer's rate), function sites first met "
    "after the plan was made, and faults smaller than the threshold in force (the first-check "
    "threshold until the ranks agree on theirs)",
)
"""What the online sensors do not see (``Guard.coverage()`` reports it)."""


@dataclass(frozen=True)
class SensorReading:
    """One flagged sensor of a candidate, by the numbers (ratios in units of its rounding bound;
    +Inf for a NaN/Inf checksum)."""

    threshold: float
    """The threshold in force (the same on every rank)."""
    original: float
    """The flagged rank's ratio in training."""
    third: float
    """The third GPU's ratio when it recomputed the same micro-batches."""
    again: float
    """The flagged rank's own ratio when it recomputed them."""

    def bar(self, compare_grads: bool) -> float:
        """What a ratio must exceed to count against a GPU: the threshold with deterministic
        replays, ``SEPARATION`` times it without (see :func:`sensor_verdict`)."""
        return self.threshold if compare_grads else SEPARATION * self.threshold

    def stands_apart(self, ratio: float, compare_grads: bool) -> bool:
        """Whether ``ratio`` (the original or the flagged rank's replay) is above the bar and
        more than ``SEPARATION`` times what the healthy GPU read. NaN counts as +Inf."""
        ratio = math.inf if math.isnan(ratio) else ratio
        third = math.inf if math.isnan(self.third) else self.third
        return ratio > self.bar(compare_grads) and SEPARATION * third < ratio


def sensor_verdict(
    readings: Sequence[SensorReading],
    third: Outcome,
    again: Outcome,
    *,
    compare_grads: bool,
) -> tuple[VerdictKind, str]:
    """Settle one sensor candidate by the numbers; returns (kind, who): who is "target" or ""
    (nobody).

    ``readings``: the candidate's flagged sensors; ``third``/``again``: the outcomes of the third
    GPU's and the flagged rank's own replay of its micro-batches; ``compare_grads``: the replays
    ran deterministic kernels (``Schedule.deterministic_audits``).

    Confirmed when some flagged sensor's original ratio stands apart from the third GPU's
    recomputation: above the bar and more than ``SEPARATION`` (2) times the healthy reading; or,
    with deterministic kernels, when the two replays differ in their bits (the flagged rank
    computes the same micro-batches differently from a healthy GPU now). Else ``reproducible``.
    Why a separation and not "the third GPU does not exceed the threshold": a ratio is a
    rounding error, and a recomputation with other rounding (non-deterministic kernels) is a
    fresh draw of it, so a healthy tail ratio just above the threshold may come back just under
    it, or anywhere in the healthy range; a factor of 2 between two readings of one datum, and
    without deterministic replays a bar of twice the threshold (already above every healthy
    ratio measured, with margin), is what a rounding difference does not produce and a fault
    worth naming does (x1000 reads 1e5 and more). With deterministic kernels a healthy
    recomputation reproduces the flagged ratio to the bit, so the bar is the threshold itself.
    A rank's own flag never decides: the false alarm this replaces named a healthy GPU whose
    own learned threshold sat just under a healthy ratio that the third GPU, judged against a
    higher threshold of its own, reproduced bit for bit.

    A confirmed candidate is ``persistent`` when the flagged rank's own replay stands apart
    again or its outcome differs from the third GPU's, else ``transient``."""
    bits_differ = compare_grads and not again.matches(third, compare_grads=True)
    if not bits_differ and not any(r.stands_apart(r.original, compare_grads) for r in readings):
        return "reproducible", ""  # a healthy GPU reads it too: the data's numerics
    if not again.matches(third, compare_grads=compare_grads) or any(
        r.stands_apart(r.again, compare_grads) for r in readings
    ):
        return "persistent", "target"
    return "transient", "target"


class SensorCheck(Check):
    """The online sensors of one guard (a do-nothing when the model has no protected layer or
    ``Schedule.sensors`` is False): check 4. Its flag travels in check 1's reduction
    (:meth:`take_flag`), a step it checked is seeded (:meth:`seeds`) and decided at once
    (:attr:`decides_now`), and its candidates are confirmed by check 2's replays
    (:meth:`judge`)."""

    coverage_key = "online_sensors"

    def __init__(
        self,
        module: nn.Module,
        schedule: Schedule,
        *,
        unsupported: str | None = None,
        adapter: ParallelAdapter | None = None,
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
        self._audit_every = schedule.audit_every
        self.burn_in = schedule.sensor_burn_in
        """Steps from the guard's first step on which every sensor checks (``Schedule``)."""
        self.plan: SensorPlan | None = None
        """The plan (in bursts, :mod:`.plan`), made at the first step after a protected layer
        ran (the cost model needs the batch's rows); until then only the burn-in checks."""
        self.sensing = False
        """Whether some sensor checks at the current step (every rank alike)."""
        self.unconfirmed = 0
        """Candidates the replays did not confirm, since the guard started."""
        self.sensor_steps = 0
        """Training steps on which some sensor checked, since the guard started (every rank
        alike: it decides when the ranks agree on the thresholds)."""
        self.first_step: int | None = None
        """The guard's first step (the burn-in counts from it)."""
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
            period, audits = self.plan.period, self._audit_every
            if 0 < audits < period and (a is None or a.dp_rank == 0):
                logger.warning(
                    "sdc_agent: at sensor_budget=%s each sensor checks once every %d steps "
                    "after the %d-step burn-in, less often than the audits (every %d): a "
                    "persistent fault that starts later may be named by an audit first; a "
                    "larger budget shortens the period (coverage()['checks']['online_sensors'])",
                    self.budget,
                    period,
                    self.burn_in,
                    audits,
                )
        return self.plan

    def in_burn_in(self, step: int) -> bool:
        """Whether ``step`` is in the burn-in (the first ``Schedule.sensor_burn_in`` steps from
        the guard's first step, which the first call of this or :meth:`active` records)."""
        if self.first_step is None:
            self.first_step = step
        return 0 <= step - self.first_step < self.burn_in

    def active(self, step: int) -> frozenset[int]:
        """The sensors that check at ``step`` (the same on every rank): every one in the burn-in,
        then the plan's group. Collective at the first call after the protected layers ran
        (see :meth:`_planned`), which every rank makes at the same step."""
        if self.board is None:
            return frozenset()
        burn_in = self.in_burn_in(step)
        plan = self._planned()  # made during the burn-in too, so coverage() reports it
        if burn_in:
            return frozenset(range(len(self.board)))
        return plan.active(step) if plan is not None else frozenset()

    def checks_at(self, step: int) -> bool:
        """Whether some sensor checks at ``step`` (the same on every rank): such a step is
        seeded, so that a candidate's confirmation replays it exactly (dropout included)."""
        return bool(self.active(step))

    def seeds(self, step: int) -> bool:
        """A step some sensor checks is seeded, so that a candidate's confirmation replays it
        exactly (:meth:`checks_at`)."""
        return self.checks_at(step)

    @property
    def decides_now(self) -> bool:
        """On a step whose sensors checked, every rank waits for the flags, so that a candidate
        is replayed while every rank still holds the step's state (and none has applied it)."""
        return self.sensing

    def begin_step(self, start: StepStart) -> None:
        """Arm the sensors that check at the step (before its forward pass)."""
        self._ratios = None
        if self.board is None:
            return
        active = self.active(start.step)
        self.sensing = bool(active)
        self.board.arm(active)

    def take_flag(self) -> torch.Tensor | None:
        """This step's flag for check 1's reduction (a device tensor; no host read), and stop
        the sensors checking: the audit's replays of this step run unchecked, on the kernels the
        step ran (:meth:`SensorBoard.stop_checking`), so their bits compare with the step's.
        None when nothing checked.

        At the sensor step that ends the observation window, first the ranks agree on the
        thresholds (:meth:`agree`: collective, every rank at this same point), and this step's
        readings are judged against them."""
        if self.board is None or not self.sensing:
            if self.board is not None:
                self.board.disarm()
            return None
        self.sensor_steps += 1
        if self.board.learning and self.sensor_steps >= self.board.config.warmup_checks:
            self.agree()
        self._flags, self._ratios = self.board.take_flags()
        return self._flags.any()

    @property
    def last_ratios(self) -> torch.Tensor | None:
        """The largest ratio of each sensor at the current step, on the device (None when no
        sensor checked it): what a soak or a dashboard reads after ``check_gradients``."""
        return self._ratios

    def agree(self) -> None:
        """Agree with the other ranks on every sensor's threshold (collective: one all-gather of
        each rank's observations; a world of one without an adapter), and log the outliers."""
        assert self.board is not None
        mine = self.board.observations()
        a = self._adapter
        if a is None:
            gathered = mine.unsqueeze(0)
        else:
            local = mine.to(a.collective_device)
            parts = [torch.empty_like(local) for _ in range(a.world)]
            dist.all_gather(parts, local, group=a.dp_group)
            gathered = torch.stack(parts)
        outliers = self.board.agree(gathered)
        if outliers and (a is None or a.dp_rank == 0):
            logger.warning(
                "sdc_agent: sensor thresholds agreed after %d sensor steps; ranks whose healthy "
                "ratios were outliers taught nothing and are judged against the agreed "
                "thresholds from this step on: %s",
                self.sensor_steps,
                [
                    {
                        "rank": a.global_rank(o.dp_rank) if a is not None else o.dp_rank,
                        **self.board.sensors[o.sensor].to_dict(),
                        "ratio": round(o.ratio, 3),
                        "threshold": round(o.threshold, 3),
                    }
                    for o in outliers[:20]
                ],
            )

    def end_step(self) -> None:
        """The step is decided: no sensor checks until the next step arms them."""
        self.sensing = False
        if self.board is not None:
            self.board.disarm()

    # ------------------------------------------------------------------ candidates (collective)
    def candidates(self, table: FlagTable, adapter: ParallelAdapter) -> list[SensorCandidate]:
        """Which sensors fired on which flagged rank, with that rank's own ratio and the
        threshold in force (collective: one all-gather, so every rank reports the same)."""
        return self._gather_candidates(table, adapter)[0]

    def _gather_candidates(
        self, table: FlagTable, adapter: ReplayLayout
    ) -> tuple[list[SensorCandidate], dict[int, list[tuple[int, float, float]]]]:
        """:meth:`candidates`, and per flagged DP rank its (sensor, ratio, threshold) readings
        (ratio +Inf for a NaN/Inf checksum)."""
        assert self.board is not None and self._flags is not None and self._ratios is not None
        thresholds = self.board.threshold_tensor().to(self._ratios.device)
        mine = torch.cat([self._flags.double(), self._ratios.double(), thresholds.double()]).to(
            adapter.collective_device
        )
        gathered = [torch.empty_like(mine) for _ in range(adapter.world)]
        dist.all_gather(gathered, mine, group=adapter.dp_group)
        n = len(self.board)
        found = []
        flagged: dict[int, list[tuple[int, float, float]]] = {}
        for dp in table.sensor_flagged:
            row = gathered[dp].cpu().tolist()
            for index in range(n):
                if row[index]:
                    ratio, threshold = row[n + index], row[2 * n + index]
                    flagged.setdefault(dp, []).append(
                        (index, math.inf if math.isnan(ratio) else ratio, threshold)
                    )
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
        return found, flagged

    def _replay_row(
        self, audit: RingAudit, step: int, target_dp: int, deterministic: bool
    ) -> list[int]:
        """Replay ``target_dp``'s micro-batches with the step's sensors checking, on the step's
        kernels (:meth:`SensorBoard.confirm_step`: the flagged sensors are among them, and the
        replay computes as the step did; under FSDP2 collectively: every rank calls it for the
        same target at once). Returns the outcome's
        row and then every sensor's largest ratio, as the bits of an fp64 (zeros when the
        replay failed), so that one int64 all-reduce carries the numbers."""
        assert self.board is not None
        self.board.confirm_step()
        zeros = [0] * len(self.board)
        try:
            # Collective under lockstep replays; a replay that fails comes back as FAILED_ROW.
            row = audit.replay_row(step, target_dp, deterministic, whole_step=True)
            ratios = self.board.take_flags()[1]
            return [*row, *(zeros if is_failed(row) else _ratio_bits(ratios))]
        except Exception:
            logger.exception(
                "sdc_agent: the sensor confirmation replay of rank %d's batch of step %d failed",
                audit.adapter.global_rank(target_dp),
                step,
            )
            return [*FAILED_ROW, *zeros]
        finally:
            self.board.stop_checking()  # the next target's replay needs the step's kernels

    def judge(
        self, table: FlagTable, audit: RingAudit, reporter: Reporter, *, deterministic: bool
    ) -> Alarm | None:
        """Confirm the sensor candidates of ``table`` by the numbers of replays (collective: one
        all-gather, one all-reduce; :func:`sensor_verdict`). Returns the Alarm naming the ranks
        the numbers confirm (not yet logged nor published), or None when none is confirmed
        (counted in :attr:`unconfirmed`; each flagged sensor's threshold relaxed to what the
        healthy GPU reproduced, :meth:`SensorBoard.relax`)."""
        assert self.board is not None
        a = audit.adapter
        found, flagged = self._gather_candidates(table, a)
        targets = table.sensor_flagged
        rows = torch.zeros((len(targets), 2, ROW_WIDTH + len(self.board)), dtype=torch.int64)
        # Without a third node for each target (the same answer on every rank) nothing is replayed.
        if audit.can_confirm:
            # The audit's confirmation placement (under FSDP2 in rounds, every rank replaying each
            # target's batch at once); each rank's sensors read its own computation of that batch.
            audit.fill_confirmations(
                targets,
                rows,
                lambda target_dp: self._replay_row(audit, table.step, target_dp, deterministic),
            )
        rows = rows.to(a.collective_device)
        dist.all_reduce(rows, op=dist.ReduceOp.SUM, group=a.dp_group)  # one writer per slot
        rows = rows.cpu()
        outcomes = rows[:, :, :ROW_WIDTH].tolist()
        ratios = rows[:, :, ROW_WIDTH:].contiguous().view(torch.float64).tolist()
        verdicts: list[Verdict] = []
        blamed: list[int] = []
        readings: list[list[SensorReading]] = []
        for slot, target in enumerate(targets):
            (third_row, again_row), (third_ratios, again_ratios) = outcomes[slot], ratios[slot]
            mine = [
                SensorReading(
                    threshold=threshold,
                    original=ratio,
                    third=third_ratios[index],
                    again=again_ratios[index],
                )
                for index, ratio, threshold in flagged.get(target, [])
            ]
            readings.append(mine)
            kind: VerdictKind
            who: str
            if not audit.can_confirm or is_failed(third_row) or is_failed(again_row):
                kind, who = "unattributable", ""  # a sensor never names a GPU by itself
            else:
                third_outcome, again = Outcome.from_row(third_row), Outcome.from_row(again_row)
                if audit.rebuilds_differ(target, (third_outcome, again)):
                    # The third GPU rebuilt another micro-batch: its numbers judge nothing.
                    kind, who = "unattributable", ""
                else:
                    kind, who = sensor_verdict(
                        mine, third_outcome, again, compare_grads=deterministic
                    )
            if kind == "reproducible":
                # What a healthy GPU reproduced is the data's: no need to replay it again
                # (every rank relaxes alike: the rows and readings are the same everywhere).
                for (index, _, _), reading in zip(flagged.get(target, []), mine, strict=True):
                    self.board.relax(index, reading.third)
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
                    "verdicts %s; ratios recomputed by the third GPU %s): counted (%d so far), "
                    "the step is applied",
                    table.step,
                    [c.to_dict() for c in found],
                    [v.kind for v in verdicts],
                    [[round(r.third, 4) for r in mine] for mine in readings],
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
    def describe(self, planned: dict[str, Any] | None = None) -> dict[str, Any]:
        """The sensors' part of ``Guard.coverage()``: which GEMMs are checked, at what rate
        (the schedule plans nothing for them: ``planned`` is not read)."""
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
        config = self.board.config
        # Every sensor has a threshold from its first check (SensorBoard.thresholds).
        in_force = [t for t in self.board.thresholds() if t is not None]
        period = plan.period if plan is not None else None
        return {
            "on": True,
            "why": "row checksums of the forward, input-gradient and weight-gradient GEMMs of "
            "protected linear layers, on their fp32 result; row invariants of protected layer "
            "norms (output and input gradient), residual adds (sums) and (log-)softmax (row "
            "sums, output and input gradient); a flag is a candidate, confirmed only when its "
            "ratio stands apart from a third GPU's recomputation of the same inputs",
            "covers": (
                f"every sensor on every step of the first {self.burn_in} steps (burn-in), then "
                + (
                    "every sensor on every step (full coverage)"
                    if period == 1
                    else f"every sensor once every {period} steps within the budget "
                    "(sensor_budget=math.inf: every step)"
                    if period is not None
                    else "the budget's rotation, planned at the first step a protected layer ran"
                )
            ),
            "planned": plan is not None,
            "budget": self.budget,
            "burn_in": self.burn_in,
            "rows": self.board.rows,
            "device": self.board.device_type,
            "period": period,
            "estimated_cost": plan.mean_cost if plan is not None else None,
            "warmup_checks": config.warmup_checks,
            "thresholds": {
                "how": "the same on every rank: initial_threshold from the first check (in "
                "units of each op's rounding bound); after warmup_checks sensor steps, margin x "
                "the ranks' median of their largest healthy ratio, within [min_threshold, "
                "initial]; a ratio a healthy GPU reproduced raises its sensor's threshold to "
                f"{SEPARATION:g} x that ratio",
                "initial": config.initial_threshold,
                "margin": config.margin,
                "min": config.min_threshold,
                "agreed": not self.board.learning and config.warmup_checks > 0,
                "in_force": [min(in_force), max(in_force)] if in_force else None,
                "outliers": len(self.board.outliers),
                "relaxed": self.board.relaxed,
            },
            "layers": layers,
            "kinds": dict(self.board.layers),
            "families": describe_families(self.board, plan),
            "blind": list(BLIND),
        }


def _ratio_bits(ratios: torch.Tensor) -> list[int]:
    """Each fp32 ratio as the int64 bit pattern of its fp64 value (exact through a SUM
    all-reduce in which one rank writes and every other adds zero bits)."""
    return ratios.detach().double().cpu().view(torch.int64).tolist()


def _publish_unconfirmed(publisher: Any, step: int, count: int) -> None:
    """Hand the count to publishers that take it (an optional method of the protocol)."""
    publish = getattr(publisher, "publish_unconfirmed_sensor_flags", None)
    if callable(publish):
        publish(step, count)
