"""What became of a report outside its claims: the admission's refusal of it
(``keys.report_refusal``), the sweeper's backstop having started the workflow for it
(``keys.backstop_start``), and where the backstop's reading of the report group stands
(``keys.backstop_cursor``). Refusals and starts expire (the table's TTL, ``expires_at``): the
backstop looks at reports of the last hours only, so a week is ample."""

from __future__ import annotations

from typing import Any

from .. import clock
from . import keys
from .dynamo import Table

OUTCOME_TTL_SECONDS = 7 * 86400
"""How long a refusal or a backstop start is kept (longer than any window the backstop reads)."""


class ReportOutcomes:
    """Refusals, backstop starts and the backstop's cursor in the ledger table."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def refuse(self, cluster: str, report: str, *, reason: str, instance_id: str) -> None:
        """Record that the admission refused ``report`` (on ``instance_id``; the first refusal
        of a report is enough: a later one overwrites it)."""
        self._table.put(
            {
                **keys.report_refusal(cluster, report),
                "instance_id": instance_id,
                "reason": reason[:500],
                "at": clock.iso(clock.now()),
                "expires_at": _expiry(),
            }
        )

    def refusal(self, cluster: str, report: str) -> dict[str, Any] | None:
        """The admission's refusal of ``report``, if any."""
        return self._table.get(keys.report_refusal(cluster, report))

    def started(self, cluster: str, report: str) -> dict[str, Any] | None:
        """The backstop's start of the workflow for ``report``, if any."""
        return self._table.get(keys.backstop_start(cluster, report))

    def mark_started(self, cluster: str, report: str, *, execution: str) -> None:
        """Record the backstop's start of ``execution`` for ``report``."""
        self._table.put(
            {
                **keys.backstop_start(cluster, report),
                "execution": execution,
                "at": clock.iso(clock.now()),
                "expires_at": _expiry(),
            }
        )

    def cursor(self, cluster: str) -> dict[str, Any] | None:
        """Where the backstop stands: ``start_ms``, ``end_ms`` of the window it reads and the
        ``token`` of the page it reads next (absent: the window was read to its end)."""
        return self._table.get(keys.backstop_cursor(cluster))

    def save_cursor(
        self, cluster: str, *, start_ms: int, end_ms: int, token: str | None, done: bool
    ) -> None:
        """Store where the backstop stands (``done``: the window was read to its end)."""
        item: dict[str, Any] = {
            **keys.backstop_cursor(cluster),
            "start_ms": start_ms,
            "end_ms": end_ms,
            "done": done,
            "at": clock.iso(clock.now()),
        }
        if token is not None:
            item["token"] = token
        self._table.put(item)


def _expiry() -> int:
    return int(clock.now().timestamp()) + OUTCOME_TTL_SECONDS


__all__ = ["OUTCOME_TTL_SECONDS", "ReportOutcomes"]
