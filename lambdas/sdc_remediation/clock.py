"""Time in one place, so tests can move it (rolling-hour guard, TTLs, health-check timeouts)."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds and a Z, sortable as a string (ledger sort keys)."""
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def parse_iso(text: str) -> datetime:
    """Inverse of ``iso`` (also accepts any ISO 8601 string with an offset)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment
