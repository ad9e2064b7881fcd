"""The publisher protocol: how the guard reports outward, with a do-nothing default.

The guard calls a publisher from exactly one rank (DP rank 0). A publisher must never block or
raise into training; the guard still wraps every call and logs what escapes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .alarm import Alarm, RankInfo


@runtime_checkable
class Publisher(Protocol):
    """Receives the guard's alarm, liveness counts and the rank map."""

    def publish_rank_map(self, ranks: dict[int, RankInfo]) -> None:
        """Called once at start with every rank's node, instance, GPU and pod."""

    def publish_alarm(self, alarm: Alarm) -> None:
        """Called once per alarm, before the guard returns it."""

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        """Called after checks pass with the passes since the previous call (batch as you like)."""

    def flush(self, timeout: float | None = None) -> bool:
        """Deliver what is queued; True when nothing is left. Called on the exit path."""


@runtime_checkable
class SensorFlagPublisher(Protocol):
    """An optional addition to :class:`Publisher` (kept apart so that publishers written before
    it still satisfy :class:`Publisher`): the guard calls it, when present, with the online
    sensor candidates that replays did not confirm, so a noisy sensor is visible."""

    def publish_unconfirmed_sensor_flags(self, step: int, count: int) -> None:
        """Called (DP rank 0) with the unconfirmed candidates of ``step``; batch as you like."""


@runtime_checkable
class AuditSkipPublisher(Protocol):
    """An optional addition to :class:`Publisher`: the guard calls it, when present, with the
    audits that did not run or could not judge (a replay that raised, audits turned off by a
    set-up finding), so that an alarm can catch a job that is no longer protected."""

    def publish_audit_skipped(self, step: int, count: int) -> None:
        """Called (DP rank 0) with the audits skipped at ``step``; batch as you like."""


class NullPublisher:
    """The default: publishes nothing, so the guard needs no ``if enabled:`` branches."""

    def publish_rank_map(self, ranks: dict[int, RankInfo]) -> None:
        """Do nothing."""

    def publish_alarm(self, alarm: Alarm) -> None:
        """Do nothing."""

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        """Do nothing."""

    def publish_unconfirmed_sensor_flags(self, step: int, count: int) -> None:
        """Do nothing."""

    def publish_audit_skipped(self, step: int, count: int) -> None:
        """Do nothing."""

    def flush(self, timeout: float | None = None) -> bool:
        """Nothing is ever queued."""
        return True
