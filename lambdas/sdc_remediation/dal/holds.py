"""The end of a remediation and of the node's hold.

A remediation is open from its admission until ``record`` writes any terminal transition for
it (released, replaced, replaced_by_hyperpod, rejected, approval_timed_out, failed) or the
sweeper closes it (abandoned): ``close`` then frees the node and its place in
``open_instances``. ``duplicate`` therefore means a remediation still in flight. The node stays
in ``held`` (out of service: it counts against the guard, ``admission.decide``) until a
transition that puts it back or removes it (``RELEASING_TRANSITIONS``) or an operator's
``release``. The hourly admission count is kept regardless of closing.
"""

from __future__ import annotations

from .. import clock
from ..errors import AwsApiUnavailable, NodeInRemediation, NodeNotHeld
from . import keys
from .admission_store import AdmissionStore
from .dynamo import RACE_ATTEMPTS, Table
from .events import Events, encode_detail

# Transitions after which the node is back in service or gone: its guard hold ends with them.
# Every other closing transition (rejected and kept, approval timed out, failed, abandoned)
# leaves the node cordoned, and it keeps counting against the guard until released.
RELEASING_TRANSITIONS = frozenset({"released", "replaced", "replaced_by_hyperpod"})


class Holds:
    """Closes remediations and releases held nodes, under the guard's version."""

    def __init__(self, table: Table, admissions: AdmissionStore, events: Events) -> None:
        self._table = table
        self._admissions = admissions
        self._events = events

    def close(
        self,
        cluster: str,
        instance_id: str,
        remediation_id: str,
        status: str,
        *,
        release_hold: bool | None = None,
    ) -> bool:
        """Mark the node's remediation closed (any terminal transition) and free its place in
        flight; its admission still counts towards the hourly cap.

        The node's hold (it counts as out of service) ends only when ``release_hold`` (default:
        ``status`` is one of ``RELEASING_TRANSITIONS``); otherwise the node stays cordoned and
        counts until ``release``. Returns False when the node's open remediation is another one
        (nothing to close).
        """
        if release_hold is None:
            release_hold = status in RELEASING_TRANSITIONS
        for _ in range(RACE_ATTEMPTS):
            state = self._admissions.state(instance_id)
            if not state or state.get("remediation_id") != remediation_id or not state.get("open"):
                return False
            guard = self._admissions.guard(cluster)
            held = [
                h for h in guard["held"] if not (release_hold and h["instance_id"] == instance_id)
            ]
            items = [
                self._table.update_op(
                    keys.state(instance_id),
                    "SET #open = :false, #status = :status, closed_at = :at",
                    condition="remediation_id = :rid AND #open = :true",
                    names={"#open": "open", "#status": "status"},
                    values={
                        ":false": False,
                        ":true": True,
                        ":status": status,
                        ":at": clock.iso(clock.now()),
                        ":rid": remediation_id,
                    },
                )
            ]
            guard_update = self._admissions.guard_update_op(
                cluster,
                guard,
                open_instances=[i for i in guard["open_instances"] if i != instance_id],
                held=held,
            )
            if guard_update is not None:
                items.append(guard_update)
            if self._table.transact(items):
                return True
        raise AwsApiUnavailable(f"closing {remediation_id} lost {RACE_ATTEMPTS} races; retry")

    def close_execution(
        self,
        cluster: str,
        instance_id: str,
        execution: str,
        item: int | None,
        status: str,
        *,
        release_hold: bool | None = None,
    ) -> str | None:
        """Close the node's open remediation if this execution (and Map item) admitted it.

        Keyed by what the execution itself knows (``$$.Execution.Id``, ``$$.Map.Item``), not by
        a step's output: an admission that committed and then timed out, or a state whose
        ``$.admission`` went missing, still closes. Returns the closed remediation id, or None.
        """
        if not execution:
            return None
        state = self._admissions.state(instance_id)
        if not state or not state.get("open") or state.get("execution") != execution:
            return None
        if item is not None and state.get("item") is not None and int(state["item"]) != item:
            return None  # another item of the same alarm owns it (this one was a duplicate)
        rid = state["remediation_id"]
        closed = self.close(cluster, instance_id, rid, status, release_hold=release_hold)
        return rid if closed else None

    def release(self, cluster: str | None, node: str, *, released_by: str, reason: str = "") -> str:
        """An operator's word that a held node is back in service (or gone): it stops counting
        against the guard. ``node`` is an instance id or a node name (``hyperpod-<id>``).

        Records a ``released`` transition with ``approver`` = ``released_by`` (the caller's
        authenticated IAM ARN). Does not uncordon (run ``kubectl uncordon`` first, or replace
        the node). ``cluster`` None: the one the node's STATE names. Returns the instance id;
        ``NodeNotHeld`` when the guard does not hold it, ``NodeInRemediation`` while a
        remediation of it is open (refused, not deferred: the operator decides that one).
        """
        instance_id = node.removeprefix("hyperpod-")
        if cluster is None:
            state = self._admissions.state(instance_id)
            if not state or not state.get("cluster"):
                raise NodeNotHeld(f"{node}: sdc-guard never remediated this node")
            cluster = str(state["cluster"])
        for _ in range(RACE_ATTEMPTS):
            guard = self._admissions.guard(cluster)
            if instance_id in guard["open_instances"]:
                # Read in the same guard item the release is conditioned on (its version): a
                # remediation admitted between admit and cordon still holds the node.
                raise NodeInRemediation(
                    f"{node} has a remediation in flight (cluster {cluster}): releasing it now "
                    "would drop the guard's hold of a node that remediation cordons; decide its "
                    "approval (`sdc-remediation reject ID --release` to uncordon it) or wait "
                    "for it to end, then release"
                )
            entry = next((h for h in guard["held"] if h["instance_id"] == instance_id), None)
            if entry is None:
                raise NodeNotHeld(
                    f"{node} is not held by sdc-guard's blast-radius guard of cluster {cluster} "
                    "(never cordoned by it, already released, or replaced)"
                )
            update = self._admissions.guard_update_op(
                cluster,
                guard,
                open_instances=list(guard["open_instances"]),
                held=[h for h in guard["held"] if h["instance_id"] != instance_id],
            )
            if update is None:  # unreachable: a held entry implies a written guard
                raise NodeNotHeld(f"{node} is not held (no guard item for {cluster})")
            if self._table.transact([update]):
                break
        else:
            raise AwsApiUnavailable(f"releasing {node} lost {RACE_ATTEMPTS} races; retry")
        self._events.record(
            instance_id,
            str(entry.get("remediation_id") or f"x-release-{instance_id}"),
            "released",
            {
                "cluster": cluster,
                "approver": released_by,
                "reason": reason or None,
                "detail": encode_detail({"released_by_operator": True}),
            },
            update_status=False,
        )
        return instance_id


__all__ = ["RELEASING_TRANSITIONS", "Holds"]
