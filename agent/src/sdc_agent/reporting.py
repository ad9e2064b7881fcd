"""The one place where Alarms are built, logged and published, and passes recorded.

Every rank builds the same Alarm from gathered data; only DP rank 0 logs it and hands it to the
publisher, and nothing the publisher does (or raises) may reach training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from .alarm import Alarm, CheckName, RankInfo, Verdict
from .publisher import Publisher

if TYPE_CHECKING:
    from .checks.weights.report import DivergenceReport

logger = logging.getLogger("sdc_agent")


@dataclass(frozen=True)
class Passes:
    """When each check last passed (steps); the alarm's suspect window starts there. Frozen:
    only the :class:`Reporter`'s ``record_*`` methods move it on (``Guard.passes`` hands it out
    read-only)."""

    start_step: int | None = None
    """The first step this guard ran (or checked the weights at)."""
    last_gradient_check_pass: int | None = None
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    last_weights_digest: str | None = None
    """Digest of the fingerprint table every replica agreed on at ``last_weight_check_pass``."""


class Reporter:
    """Builds Alarms, logs and publishes them, and publishes passes as liveness."""

    def __init__(
        self, ranks: dict[int, RankInfo], publisher: Publisher, *, publishes: bool
    ) -> None:
        """``ranks``: the rank map; ``publishes``: this rank logs and publishes (DP rank 0)."""
        self.ranks = ranks
        self.publisher = publisher
        self.publishes = publishes
        self.passes = Passes()
        self.record_alarm: Callable[[Alarm], None] = lambda alarm: None
        """What else receives each alarm: the guard's alarm log when it has an ``alarm_dir``."""
        self.workload: dict[str, Any] | None = None
        """The job's workload (``sdc.workload/v1``) this rank recorded, or None: set once by
        the guard's :class:`sdc_agent.workload.WorkloadRecorder`; every alarm built from then on
        carries it (the same on every rank of a data-parallel job, whose ranks run the same
        layers on batches of one shape)."""

    def set_workload(self, document: dict[str, Any] | None) -> None:
        """The recorded workload (or None: nothing was recorded) for the alarms to come."""
        self.workload = document

    # ------------------------------------------------------------------ building
    def alarm(
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
        diagnosis: str | None = None,
        setup: dict[str, Any] | None = None,
    ) -> Alarm:
        """Assemble the alarm every rank returns (global ranks); ``ranks`` covers every rank it
        names, and the suspect window runs from ``last_pass`` (or the start) to ``step``."""
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
            last_audit_pass=self.passes.last_audit_pass,
            last_weight_check_pass=self.passes.last_weight_check_pass,
            divergent_tensors=list(divergent),
            ranks=self._rank_infos(suspects or [], nonfinite, culprits),
            diagnosis=diagnosis,
            setup=setup,
            workload=self.workload,
        )

    def weights_alarm(self, step: int, report: DivergenceReport) -> Alarm:
        """Check 3's alarm for a comparison whose replicas disagreed."""
        return self.alarm(
            step,
            "weights",
            last_pass=self.passes.last_weight_check_pass,
            suspects=report.ranks,
            divergent=report.tensors,
        )

    def _window(self, step: int, last_pass: int | None) -> tuple[int, int]:
        first = last_pass if last_pass is not None else self.passes.start_step
        return (first if first is not None else step, step)

    def _rank_infos(self, *groups: Iterable[int]) -> dict[str, RankInfo]:
        named = sorted({r for group in groups for r in group})
        return {str(r): self.ranks[r] for r in named}

    # ------------------------------------------------------------------ reporting
    def log_and_publish(self, alarm: Alarm) -> Alarm:
        """Log the alarm, record it in the alarm log and hand it to the publisher (DP rank 0
        only); returns it. Every alarm the guard returns passes here exactly once."""
        if self.publishes:
            logger.error(
                "sdc_agent: %s check failed at step %d; suspects %s; report %s",
                alarm.check,
                alarm.step,
                alarm.suspects,
                alarm.to_dict(),
            )
        self.record_alarm(alarm)  # durable before the caller gets it (never raises)
        self.publish("alarm", lambda p: p.publish_alarm(alarm))
        return alarm

    def publish_setup(self, alarm: Alarm) -> Alarm:
        """Log and publish a set-up finding (DP rank 0 only); returns it. Unlike
        :meth:`log_and_publish` it is not recorded in the alarm log: it says nothing about the
        weights, so it blocks no resume; its report names nobody and its metric is
        ``sdc_audit_skipped``, so no remediation starts."""
        if self.publishes:
            setup = alarm.setup or {}
            logger.error(
                "sdc_agent: the replay audit found the job's set-up wrong at step %d, not a GPU "
                "(nobody is named; audits %s): %s: %s. Fix: %s; report %s",
                alarm.step,
                setup.get("audits"),
                setup.get("cause"),
                setup.get("detail"),
                setup.get("fix"),
                alarm.to_dict(),
            )
        self.publish("set-up finding", lambda p: p.publish_alarm(alarm))
        return alarm

    def record_start(self, step: int) -> None:
        """Note the first step this guard ran or checked the weights at (once)."""
        if self.passes.start_step is None:
            self.passes = replace(self.passes, start_step=step)

    def record_gradient_pass(self, step: int) -> None:
        """Note that every rank agreed ``step``'s gradients were finite."""
        self.passes = replace(self.passes, last_gradient_check_pass=step)

    def record_pass(
        self, check: Literal["audit", "weights"], step: int, *, digest: str | None = None
    ) -> None:
        """Note that an audit or a weight check (whose replicas agreed on the fingerprint
        table ``digest``) passed at ``step``, and publish it as liveness."""
        if check == "audit":
            self.passes = replace(self.passes, last_audit_pass=step)
        else:
            self.passes = replace(
                self.passes, last_weight_check_pass=step, last_weights_digest=digest
            )
        audits, weights = (1, 0) if check == "audit" else (0, 1)
        self.publish("liveness", lambda p: p.publish_liveness(step, audits, weights))

    def record_skipped_audit(self, step: int) -> None:
        """Publish one audit that did not run or could not judge (``sdc_audit_skipped``, with
        the liveness counts, through a publisher that has ``publish_audit_skipped``)."""

        def call(publisher: Publisher) -> None:
            publish = getattr(publisher, "publish_audit_skipped", None)
            if publish is not None:
                publish(step, 1)

        self.publish("skipped audit", call)

    def publish_rank_map(self) -> None:
        """Publish the rank map (once, at start)."""
        self.publish("rank map", lambda p: p.publish_rank_map(dict(self.ranks)))

    def publish(self, what: str, call: Callable[[Publisher], None]) -> None:
        """Call the publisher from DP rank 0 only; nothing it does may reach training."""
        if not self.publishes:
            return
        try:
            call(self.publisher)
        except Exception:
            logger.exception("sdc_agent: publishing the %s failed; training goes on", what)

    def flush(self, timeout: float | None) -> bool:
        """Let the publisher deliver what it queued; True when all is sent (or nothing to send)."""
        if not self.publishes:
            return True
        try:
            return bool(self.publisher.flush(timeout))
        except Exception:
            logger.exception("sdc_agent: publisher flush failed")
            return False
