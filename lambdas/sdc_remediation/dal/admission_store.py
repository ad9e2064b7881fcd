"""Admission: the node's STATE (one open remediation per node) and the cluster's guard item (the
blast-radius guard), read and claimed together.

- ``keys.state(instance id)``: the node's current remediation (``open``, ``remediation_id``,
  ``status``, ``cluster``, ``admitted_at``, ``node_name``, ``execution``, ``item``).
- ``keys.guard(cluster)``: the guard's own item (``version``, ``admissions`` in the last hour,
  ``open_instances`` in flight, ``held``: nodes admitted and not released).

Why a guard item: a secondary index is eventually consistent, so counting admissions through it
lets two concurrent alarms both see "1 admitted" and both admit. Every admission instead
rewrites the guard item under ``version = :read_version`` in the same transaction that claims
the node's STATE (``open`` must be false or absent), so concurrent admissions serialise: a loser
re-reads and re-decides. The same transaction makes a duplicate event a no-op, claims the
report (``claims``) and records the ``admitted`` transition (``events``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from .. import clock
from ..errors import AwsApiUnavailable
from ..models.admission import (
    AdmissionRule,
    AdmitDecision,
    AdmitRequest,
    GuardSnapshot,
    recent_admissions,
)
from . import keys
from .claims import ReportClaims
from .dynamo import RACE_ATTEMPTS, Table, at_version
from .events import event_item


class AdmissionStore:
    """The nodes' STATE items and the clusters' guard items."""

    def __init__(self, table: Table, claims: ReportClaims) -> None:
        self._table = table
        self._claims = claims

    def state(self, instance_id: str) -> dict[str, Any] | None:
        """The node's STATE item, if any."""
        return self._table.get(keys.state(instance_id))

    def guard(self, cluster: str) -> dict[str, Any]:
        """The cluster's guard item (a fresh one at version 0 when absent)."""
        item = self._table.get(keys.guard(cluster))
        guard = item or {"version": 0, "admissions": [], "open_instances": []}
        guard.setdefault("held", [])
        return guard

    def held(self, cluster: str) -> list[dict[str, Any]]:
        """Nodes admitted (cordoned) and not released, oldest first."""
        return sorted(self.guard(cluster)["held"], key=lambda h: int(h["at"]))

    def open_remediations(self) -> list[dict[str, Any]]:
        """Every open STATE item (the sweeper's work list; the table is small)."""
        return self._table.scan(
            "sk = :state AND #open = :true",
            names={"#open": "open"},
            values={":state": keys.STATE_SK, ":true": True},
            ConsistentRead=True,
        )

    def guard_update_op(
        self,
        cluster: str,
        guard: dict[str, Any],
        *,
        open_instances: list[str],
        held: list[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The transaction item that rewrites the guard's sets under its version (None when
        the guard item does not exist: nothing was ever admitted)."""
        version = int(guard["version"])
        if version == 0:
            return None
        return self._table.update_op(
            keys.guard(cluster),
            "SET open_instances = :open, held = :held, version = :next",
            condition="version = :v",
            values={":open": open_instances, ":held": held, ":next": version + 1, ":v": version},
        )

    def admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """Claim the node for a remediation, unless it is open already or the guard trips.

        The decision is ``rule`` (``logic.admission.decide``) on the node's STATE and the guard
        item; an ``admitted`` one is committed under the guard's version, and a lost race
        re-reads.
        """
        for _ in range(RACE_ATTEMPTS):
            state = self.state(req.instance_id)
            guard = self.guard(req.cluster)
            now = clock.now()
            decision = rule(req, self._snapshot(req, state, guard), now)
            if decision.decision != "admitted" or decision.remediation_id is not None:
                return decision
            remediation_id = f"r-{uuid.uuid4().hex[:16]}"
            recent = recent_admissions(guard["admissions"], now)
            if self._commit(req, remediation_id, guard, recent, now):
                return AdmitDecision("admitted", remediation_id, "admitted")
        raise AwsApiUnavailable(
            f"admission of {req.instance_id} lost {RACE_ATTEMPTS} races on the guard item; retry"
        )

    def would_admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """What ``admit`` would decide now with ``rule``, without claiming anything (shadow
        mode)."""
        guard = self.guard(req.cluster)
        snapshot = self._snapshot(req, self.state(req.instance_id), guard)
        return rule(req, snapshot, clock.now())

    def _snapshot(
        self, req: AdmitRequest, state: dict[str, Any] | None, guard: dict[str, Any]
    ) -> GuardSnapshot:
        return GuardSnapshot(
            node=state,
            admissions=guard["admissions"],
            open_instances=guard["open_instances"],
            held=guard["held"],
            report=self._claims.get(req),
        )

    def _commit(
        self,
        req: AdmitRequest,
        remediation_id: str,
        guard: dict[str, Any],
        recent: list[dict[str, Any]],
        now: datetime,
    ) -> bool:
        """One optimistic attempt; False when another admission changed the guard or the node."""
        at = clock.iso(now)
        version = int(guard["version"])
        state = {
            **keys.state(req.instance_id),
            "open": True,
            "remediation_id": remediation_id,
            "status": "admitted",
            "cluster": req.cluster,
            "admitted_at": at,
            "node_name": req.node_name,
            "execution": req.execution,
            "item": req.item,
        }
        at_s = int(now.timestamp())
        admission = {
            "instance_id": req.instance_id,
            "at": at_s,
            "execution": req.execution,
            "item": req.item,
        }
        new_guard = {
            **keys.guard(req.cluster),
            "version": version + 1,
            "admissions": [*recent, {k: v for k, v in admission.items() if v is not None}],
            "open_instances": [
                *(i for i in guard["open_instances"] if i != req.instance_id),
                req.instance_id,
            ],
            # Admitted means cordoned next: the node counts until it is released.
            "held": [
                *(h for h in guard["held"] if h["instance_id"] != req.instance_id),
                {"instance_id": req.instance_id, "remediation_id": remediation_id, "at": at_s},
            ],
        }
        admitted = event_item(
            req.instance_id,
            remediation_id,
            "admitted",
            {"cluster": req.cluster, "node_name": req.node_name, "execution": req.execution},
            at,
        )
        return self._table.transact(
            [
                *([self._claims.claim_op(req, remediation_id)] if req.report else []),
                self._table.put_op(
                    {k: v for k, v in state.items() if v is not None},
                    condition="attribute_not_exists(pk) OR #open = :false",
                    names={"#open": "open"},
                    values={":false": False},
                ),
                self._table.put_op(new_guard, **at_version(version)),
                self._table.put_op(admitted),
            ]
        )


__all__ = ["AdmissionStore"]
