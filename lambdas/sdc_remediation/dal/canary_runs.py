"""Canary runs in the ledger table: ``keys.run`` (``pk=CANARY#<cluster>, sk=RUN#<run id>``).

Apart from the nodes' items (``pk`` an instance id) and so from the precision ledger: the
canary remediation's own events are under the reserved instance id, which ``logic.outcomes``
leaves out. Only the canary function creates a run; the steps may only append to one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import clock
from ..models.canary import FAILED, STEP_NAMES, Run
from . import keys
from .dynamo import Table

RUN_RETENTION_SECONDS = 30 * 86400
"""A run's item is removed (the ledger table's TTL, ``expires_at``) this long after it started:
``sdc-remediation canary`` shows the newest runs, not every run ever."""


class RunStore:
    """A cluster's canary runs in the ledger table."""

    def __init__(self, table: str, cluster: str) -> None:
        self.table = table
        self.cluster = cluster
        self._table = Table(table)

    def start(self, run_id: str, at: datetime, open_seconds: int) -> Run:
        """Record a new run (its first step, ``scheduled``), open for ``open_seconds`` (the
        canary's timeout): after that its report and approval are refused."""
        stamp = clock.iso(at)
        open_until = int(at.timestamp()) + open_seconds
        run = Run(
            run_id=run_id,
            started_at=stamp,
            steps=[{"step": "scheduled", "at": stamp}],
            open_until=open_until,
        )
        item = {
            **keys.run(self.cluster, run_id),
            "run_id": run_id,
            "started_at": stamp,
            "steps": run.steps,
            "last_step": "scheduled",
            "completed": False,
            "open_until": open_until,
            "expires_at": int(at.timestamp()) + RUN_RETENTION_SECONDS,
        }
        self._table.put(item)
        return run

    def get(self, run_id: str) -> Run | None:
        """A run by id (None: the ledger has no such run)."""
        item = self._table.get(keys.run(self.cluster, run_id))
        return Run.from_item(item) if item else None

    def latest(self) -> Run | None:
        """The newest run (None: no canary ever ran)."""
        items = self._table.query_page(
            "pk = :pk AND begins_with(sk, :run)",
            values={":pk": keys.run_pk(self.cluster), ":run": keys.RUN_PREFIX},
            ScanIndexForward=False,
            Limit=1,
            ConsistentRead=True,
        )
        return Run.from_item(items[0]) if items else None

    def reach(self, run_id: str, step: str, *, error: str | None = None) -> None:
        """Append ``step`` to the run (``completed`` when it is ``closed``)."""
        if step not in STEP_NAMES and step != FAILED:
            raise ValueError(f"unknown canary step {step!r}; expected one of {STEP_NAMES}")
        values: dict[str, Any] = {
            ":step": [{"step": step, "at": clock.iso(clock.now())}],
            ":name": step,
        }
        update = "SET steps = list_append(steps, :step), last_step = :name"
        if step == "closed":
            update += ", completed = :done"
            values[":done"] = True
        names: dict[str, str] = {}
        if error is not None:
            update += ", #error = :error"
            values[":error"] = error[:1000]
            names["#error"] = "error"
        # Only a run the canary function recorded: a step never creates one.
        self._table.update(
            keys.run(self.cluster, run_id),
            update,
            condition="attribute_exists(pk)",
            names=names,
            values=values,
        )

    def mark_stopped(self, run_id: str, step: str) -> None:
        """Write where the canary alarm found the run stopped."""
        self._table.update(
            keys.run(self.cluster, run_id),
            "SET stopped_at = :step",
            condition="attribute_exists(pk)",
            values={":step": step},
        )


__all__ = ["RUN_RETENTION_SECONDS", "RunStore"]
