"""The ledger's transition history: one event item per transition (``keys.event``), under the
node's instance id or, for a transition that concerns no single node, ``keys.cluster_pk``;
read back per node (repeat offenders, ``history``) or whole (the precision ledger)."""

from __future__ import annotations

import json
from typing import Any

from .. import clock
from ..errors import AwsApiUnavailable
from . import keys
from .dynamo import RACE_ATTEMPTS, Table


def encode_detail(detail: dict[str, Any]) -> str:
    """Transition details are stored as a JSON string (free-form, not queried)."""
    return json.dumps(detail, sort_keys=True, default=str)


def event_item(
    pk: str, remediation_id: str, transition: str, attrs: dict[str, Any], at: str, n: int = 0
) -> dict[str, Any]:
    """The event item of a transition (its None attributes left out)."""
    return {
        **keys.event(pk, at, remediation_id, n),
        "transition": transition,
        "remediation_id": remediation_id,
        "at": at,
        **{k: v for k, v in attrs.items() if v is not None},
    }


class Events:
    """Appends transitions and reads them back."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def record(
        self,
        pk: str,
        remediation_id: str,
        transition: str,
        attrs: dict[str, Any],
        update_status: bool = True,
    ) -> str:
        """Append a transition; returns its sort key. Also sets the node's STATE status to the
        transition when ``update_status`` and the open remediation is ``remediation_id``."""
        at = clock.iso(clock.now())
        for n in range(RACE_ATTEMPTS):
            # Two transitions in one clock tick: the second takes the next sort key.
            item = event_item(pk, remediation_id, transition, attrs, at, n)
            if self._table.put_if(item, "attribute_not_exists(pk)"):
                break
        else:
            raise AwsApiUnavailable(f"could not record {transition} for {pk}")
        if update_status:
            # No STATE (cluster-level event) or another remediation owns the node now: unchanged.
            self._table.update_if(
                keys.state(pk),
                "SET #status = :status",
                "remediation_id = :rid",
                names={"#status": "status"},
                values={":status": transition, ":rid": remediation_id},
            )
        return item["sk"]

    def events(self, pk: str) -> list[dict[str, Any]]:
        """Every transition recorded under ``pk`` (an instance id), oldest first."""
        return self._table.query(
            "pk = :pk AND begins_with(sk, :ev)", values={":pk": pk, ":ev": keys.EVENT_PREFIX}
        )

    def all_events(self) -> list[dict[str, Any]]:
        """Every transition in the table, oldest first (operator history; the table is small)."""
        out = self._table.scan("begins_with(sk, :ev)", values={":ev": keys.EVENT_PREFIX})
        return sorted(out, key=lambda e: keys.event_time(e["sk"]))

    def offender_history(self, instance_id: str) -> list[dict[str, Any]]:
        """Past remediations of this instance: one summary per remediation id, oldest first."""
        by_rid: dict[str, dict[str, Any]] = {}
        for event in self.events(instance_id):
            entry = by_rid.setdefault(
                event["remediation_id"],
                {
                    "remediation_id": event["remediation_id"],
                    "first": event["at"],
                    "transitions": [],
                },
            )
            entry["transitions"].append(event["transition"])
        return list(by_rid.values())


__all__ = ["Events", "encode_detail", "event_item"]
