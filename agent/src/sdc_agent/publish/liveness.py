"""Liveness batching: passing checks are counted and sent at most once per interval."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class LivenessCounts:
    """Passes counted since the previous send, and the last step that reported them."""

    audit_passes: int
    weight_check_passes: int
    last_step: int
    unconfirmed_sensor_flags: int = 0
    """Online sensor candidates the replays did not confirm (a noisy sensor shows here)."""
    audits_skipped: int = 0
    """Audits that did not run or could not judge (the job is less protected than it says)."""


class LivenessBatch:
    """Thread-safe counters with a send schedule; time is passed in, so it is testable.

    The first batch is due at once (a dashboard sees a new job within seconds); after a send the
    next batch waits ``interval`` seconds, so there is at most one send per interval.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._audit = 0
        self._weights = 0
        self._unconfirmed = 0
        self._skipped = 0
        self._last_step = -1
        self._next_due = -math.inf

    def add(
        self,
        step: int,
        audit_passes: int,
        weight_check_passes: int,
        unconfirmed_sensor_flags: int = 0,
        audits_skipped: int = 0,
    ) -> bool:
        """Count passes (and unconfirmed sensor flags); True when the batch was empty before
        (the sender may need waking)."""
        with self._lock:
            was_empty = not self._has_counts()
            self._audit += max(0, int(audit_passes))
            self._weights += max(0, int(weight_check_passes))
            self._unconfirmed += max(0, int(unconfirmed_sensor_flags))
            self._skipped += max(0, int(audits_skipped))
            self._last_step = max(self._last_step, int(step))
            return was_empty and self._has_counts()

    def _has_counts(self) -> bool:
        return self._audit > 0 or self._weights > 0 or self._unconfirmed > 0 or self._skipped > 0

    def pending(self) -> bool:
        """True when some passes have not been sent."""
        with self._lock:
            return self._has_counts()

    def seconds_until_due(self, now: float) -> float | None:
        """Seconds until the pending batch may be sent (0 when due); None when nothing pends."""
        with self._lock:
            if not self._has_counts():
                return None
            return max(0.0, self._next_due - now)

    def take(self, now: float, *, force: bool = False) -> LivenessCounts | None:
        """The pending counts when due (or ``force``), resetting them; else None."""
        with self._lock:
            if not self._has_counts():
                return None
            if not force and now < self._next_due:
                return None
            counts = LivenessCounts(
                self._audit, self._weights, self._last_step, self._unconfirmed, self._skipped
            )
            self._audit = self._weights = self._unconfirmed = self._skipped = 0
            self._next_due = now + self.interval
            return counts

    def restore(self, counts: LivenessCounts) -> None:
        """Put counts back after a failed send; they go out with the next batch."""
        with self._lock:
            self._audit += counts.audit_passes
            self._weights += counts.weight_check_passes
            self._unconfirmed += counts.unconfirmed_sensor_flags
            self._skipped += counts.audits_skipped
            self._last_step = max(self._last_step, counts.last_step)
