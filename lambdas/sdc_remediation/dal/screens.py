"""Idle-node screens in the ledger table: ``keys.screen`` (``pk=SCREEN#<cluster>, sk=<node>``).

One item per node: its last screen (when it ended, its outcome, its Job) and the screen running
on it now, if any (``running_job``, ``running_since``). Starting a screen is a conditional
write on "no screen running": two runs of the screener at once cannot both start one on a node
(the loser's write fails and it creates no Job). Only the idle screener writes these items.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sdc_contract.idle_screen import screens_key

from .. import clock
from . import keys
from .dynamo import Table


@dataclass(frozen=True)
class NodeScreen:
    """A node's screens as the ledger holds them."""

    node_name: str
    last_at: str | None = None
    """When its last screen ended (ISO 8601; None: never screened)."""
    last_outcome: str | None = None
    """``clean``, ``reproduced``, ``inconclusive``, ``failed`` or ``aborted``."""
    last_job: str | None = None
    last_reason: str = ""
    running_job: str | None = None
    """The screen Job running on it now (None: none)."""
    running_since: str | None = None

    @classmethod
    def from_item(cls, item: dict[str, object]) -> NodeScreen:
        """The item's fields (absent ones None)."""

        def text(name: str) -> str | None:
            value = item.get(name)
            return str(value) if value is not None else None

        return cls(
            node_name=str(item["sk"]),
            last_at=text("last_at"),
            last_outcome=text("last_outcome"),
            last_job=text("last_job"),
            last_reason=text("last_reason") or "",
            running_job=text("running_job"),
            running_since=text("running_since"),
        )


class ScreenStore:
    """A cluster's node screens in the ledger table."""

    def __init__(self, table: str, cluster: str) -> None:
        self.cluster = cluster
        self._table = Table(table)

    def all(self) -> dict[str, NodeScreen]:
        """Every node's screens, by node name."""
        items = self._table.query(
            "pk = :pk", values={":pk": screens_key(self.cluster)}, ConsistentRead=True
        )
        return {str(i["sk"]): NodeScreen.from_item(i) for i in items}

    def get(self, node_name: str) -> NodeScreen | None:
        """One node's screens (None: never screened nor started)."""
        item = self._table.get(keys.screen(self.cluster, node_name))
        return NodeScreen.from_item(item) if item else None

    def begin(self, node_name: str, job: str, at: datetime) -> bool:
        """Record ``job`` running on the node, unless a screen already runs there (False: a
        concurrent run started one first; create no Job)."""
        return self._table.update_if(
            keys.screen(self.cluster, node_name),
            "SET running_job = :job, running_since = :at",
            "attribute_not_exists(running_job)",
            values={":job": job, ":at": clock.iso(at)},
        )

    def finish(
        self, node_name: str, job: str, outcome: str, at: datetime, reason: str = ""
    ) -> bool:
        """Record the outcome of ``job`` as the node's last screen and clear it as running;
        False when ``job`` is no longer the node's running screen (another run recorded it)."""
        return self._table.update_if(
            keys.screen(self.cluster, node_name),
            "SET last_at = :at, last_outcome = :outcome, last_job = :job, last_reason = :reason "
            "REMOVE running_job, running_since",
            "running_job = :job",
            values={
                ":job": job,
                ":at": clock.iso(at),
                ":outcome": outcome,
                ":reason": reason[:1000],
            },
        )


__all__ = ["NodeScreen", "ScreenStore"]
