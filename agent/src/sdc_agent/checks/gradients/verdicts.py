"""Check 1's verdicts: who a non-finite gradient names, once the flag table is not clean.

A rank whose LOCAL gradient was non-finite is a suspect; while every rank still holds the step's
state its micro-batches are replayed on a third GPU and on itself (check 2's confirmation
replays, :class:`Confirmations`) and the pair of outcomes decides
(:func:`~sdc_agent.checks.replay.attribution.nonfinite_verdict`): reproduced elsewhere is the
numerics or the data (nobody named; with a GradScaler, an overflow the scaler skips), only on
the rank itself is that GPU, and a third GPU fed another batch is the set-up (nobody named). A
non-finite REDUCED gradient with finite local ones happened in or after the all-reduce and names
nobody. Every rank computes the same verdict from gathered data.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ...alarm import Alarm, Verdict, VerdictKind
from ...reporting import Reporter
from ..replay.attribution import Outcome, nonfinite_verdict
from ..replay.batch_record import fed_another_batch
from .exchange import FlagTable

logger = logging.getLogger("sdc_agent")


class Confirmations(Protocol):
    """What check 1 asks of check 2 to confirm a suspect (the ring audit answers it)."""

    can_confirm: bool
    """The placement puts a third GPU on a third node, and the audits are on."""
    compare_grads: bool
    """Gradient fingerprints compare (else the loss bits only)."""
    overflow_is_expected: bool
    """A GradScaler scales the loss: a reproduced non-finite gradient is an overflow."""

    def global_rank(self, dp_rank: int) -> int:
        """The global rank of DP rank ``dp_rank``."""
        ...

    def confirm(
        self, step: int, targets: list[int], deterministic: bool, whole_step: bool = False
    ) -> list[tuple[Outcome, Outcome] | None]:
        """Per target: (its third GPU's replay, its own re-replay), or None (collective)."""
        ...

    def rebuilds_differ(self, target: int, confirmation: tuple[Any, Any]) -> object:
        """A set-up finding (truthy) when the third GPU and the target rebuilt different
        micro-batches, else None."""
        ...

    def third_rank(self, target_dp: int) -> int:
        """The global rank of the GPU that settles a dispute over ``target_dp``'s batch."""
        ...

    def scaler_skips_everywhere(self, table: FlagTable) -> bool:
        """Whether every rank's ``scaler.step`` will skip the table's step."""
        ...


class NonfiniteVerdicts:
    """Check 1's verdict on a flag table that is not clean (see the module docstring)."""

    def __init__(self, confirmations: Confirmations, reporter: Reporter) -> None:
        """``confirmations``: check 2's replays (read at each verdict: whether they can run
        changes when a set-up finding turns the audits off)."""
        self.confirmations = confirmations
        self.reporter = reporter

    def judge(self, table: FlagTable, *, deterministic: bool) -> Alarm | None:
        """The verdict while every rank still holds the step's state (collective like
        :meth:`alarm` with ``confirm``).

        Returns None for an fp16 overflow: a GradScaler is in use, every rank's ``scaler.step``
        will skip the step and ``scaler.update`` lower the scale, and every non-finite local
        gradient reproduced on a third GPU at the same scale. Anything else is :meth:`alarm`'s.
        """
        c = self.confirmations
        overflow_possible = (
            c.overflow_is_expected
            and c.can_confirm
            and bool(table.nonfinite)
            and c.scaler_skips_everywhere(table)
        )
        alarm = self.alarm(table, confirm=True, deterministic=deterministic)
        if (
            overflow_possible
            and alarm.verdicts
            and all(v.kind == "reproducible" for v in alarm.verdicts)
        ):
            if self.reporter.publishes:
                logger.info(
                    "sdc_agent: step %d overflowed (non-finite gradients on ranks %s reproduced "
                    "on other GPUs at the same loss scale): not SDC; the GradScaler skips the "
                    "step and lowers the scale",
                    table.step,
                    alarm.nonfinite,
                )
            return None
        return alarm

    def alarm(self, table: FlagTable, *, confirm: bool, deterministic: bool) -> Alarm:
        """The alarm for a table that is not clean (not yet logged nor published).

        With ``confirm`` (and a placement that allows it) each rank whose local gradient was
        non-finite has its batch replayed on its third GPU and on itself (collective: one
        all-reduce); call it with ``confirm`` only while every rank still holds the step's state.
        """
        if table.nonfinite:
            return self._nonfinite_alarm(
                table.step,
                table.nonfinite,
                confirm=confirm and self.confirmations.can_confirm,
                deterministic=deterministic,
            )
        return self.reporter.alarm(
            table.step,
            "reduced_gradient",
            last_pass=self.reporter.passes.last_gradient_check_pass,
            suspects=None,
        )

    def _nonfinite_alarm(
        self, step: int, nonfinite: list[int], *, confirm: bool, deterministic: bool
    ) -> Alarm:
        """Name the ranks whose local gradient was non-finite, confirmed by replays if asked."""
        c = self.confirmations
        verdicts: list[Verdict] = []
        blamed = list(nonfinite)
        if confirm:
            results = c.confirm(step, nonfinite, deterministic, whole_step=True)
            blamed = []
            for target, result in zip(nonfinite, results, strict=True):
                kind: VerdictKind
                who: str
                # A confirmation that could not run leaves check 1's own evidence standing.
                # (A pipeline's outcomes carry no batch digest: its audit compares stage inputs.)
                if result is not None and (
                    fed_another_batch(getattr(result[1], "trained", 0), result[0])
                    or c.rebuilds_differ(target, result)
                ):
                    # The third GPU replayed another batch than the target trained on: no
                    # confirmation can judge it (the set-up, not a GPU), so nobody is blamed.
                    kind, who = "setup", ""
                else:
                    kind, who = (
                        nonfinite_verdict(*result, compare_grads=deterministic and c.compare_grads)
                        if result is not None
                        else ("unclear", "target")
                    )
                suspect = c.global_rank(target) if who else None
                pair = (c.global_rank(target), c.global_rank(target))
                verdicts.append(
                    Verdict(pair=pair, third=c.third_rank(target), suspect=suspect, kind=kind)
                )
                if suspect is not None:
                    blamed.append(target)
        reproduced = [v.pair[0] for v in verdicts if v.kind == "reproducible"]
        misfed = [v.pair[0] for v in verdicts if v.kind == "setup"]
        diagnosis = (
            f"numerics or data, not a GPU: the non-finite gradient of ranks {reproduced} "
            "reproduced on a third GPU on another node from the same micro-batches"
            if reproduced
            else None
        )
        if misfed:
            diagnosis = (
                f"{diagnosis + '; ' if diagnosis else ''}the confirmations of ranks {misfed} "
                "could not judge: the third GPU's rebuild_batch returned another batch than the "
                "rank trained on (the set-up: nobody is named for them)"
            )
        return self.reporter.alarm(
            step,
            "compute",
            last_pass=self.reporter.passes.last_gradient_check_pass,
            suspects=[c.global_rank(r) for r in blamed],
            nonfinite=[c.global_rank(r) for r in nonfinite],
            verdicts=verdicts,
            diagnosis=diagnosis,
        )
