"""The remediation ledger (DynamoDB): one open remediation per node, the blast-radius guard,
and a transition history per node (repeat offenders).

Items (docs/CONTRACT.md, "DynamoDB tables"):
- ``pk=<instance id>, sk=STATE``: the node's current remediation (``open``, ``remediation_id``,
  ``status``, ``cluster``, ``admitted_at``, ``node_name``, ``execution``, ``item``).
- ``pk=<instance id>, sk=EVENT#<iso time>#<remediation id>#<n>``: one per transition.
  Cluster-level transitions (ambiguous, no suspects, a failure before any node is known) use
  ``pk=CLUSTER#<cluster>``.
- ``pk=GUARD#<cluster>, sk=GUARD``: the guard's own item (``version``, ``admissions`` in the last
  hour, ``open_instances`` in flight, ``held``: nodes admitted and not released).
- ``pk=<instance id>, sk=REPORT#<job>#<step>#<check>#<report time>``: the report that raised a
  remediation of the node (one remediation per report), written in the admission's transaction.

A remediation is open from its admission until ``record`` writes any terminal transition for
it (released, replaced, replaced_by_hyperpod, rejected, approval_timed_out, failed) or the
sweeper closes it (abandoned): ``close`` then frees the node and its place in
``open_instances``. ``duplicate`` therefore means a remediation still in flight. The node stays
in ``held`` (out of service: it counts against the guard, ``admission.decide``) until a
transition that puts it back or removes it (``RELEASING_TRANSITIONS``) or an operator's
``release``. The hourly admission count is kept regardless of closing.

Why a guard item: a secondary index is eventually consistent, so counting admissions through it
lets two concurrent alarms both see "1 admitted" and both admit. Every admission instead
rewrites the guard item under ``version = :read_version`` in the same transaction that claims
the node's STATE (``open`` must be false or absent), so concurrent admissions serialise: a loser
re-reads and re-decides. The same transaction makes a duplicate event a no-op.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import botocore.exceptions

from .. import aws, clock
from ..errors import AwsApiUnavailable, NodeInRemediation, NodeNotHeld
from ..models.admission import (
    AdmissionRule,
    AdmitDecision,
    AdmitRequest,
    GuardSnapshot,
    recent_admissions,
)
from .dynamo import from_item, to_item

STATE_SK = "STATE"
GUARD_SK = "GUARD"
_MAX_ATTEMPTS = 8


def guard_pk(cluster: str) -> str:
    """Partition key of a cluster's guard item."""
    return f"GUARD#{cluster}"


def report_sk(report: str) -> str:
    """Sort key of the item that says which remediation a report raised on a node."""
    return f"REPORT#{report}"[:1024]


def cluster_pk(cluster: str) -> str:
    """Partition key for transitions that concern no single node."""
    return f"CLUSTER#{cluster}"


# Transitions after which the node is back in service or gone: its guard hold ends with them.
# Every other closing transition (rejected and kept, approval timed out, failed, abandoned)
# leaves the node cordoned, and it keeps counting against the guard until released.
RELEASING_TRANSITIONS = frozenset({"released", "replaced", "replaced_by_hyperpod"})


class Ledger:
    """Reads and writes the ledger table."""

    def __init__(self, table: str) -> None:
        self.table = table

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        with aws.aws_errors("dynamodb:GetItem"):
            resp = self._ddb.get_item(
                TableName=self.table, Key=to_item({"pk": pk, "sk": sk}), ConsistentRead=True
            )
        return from_item(resp.get("Item"))

    def state(self, instance_id: str) -> dict[str, Any] | None:
        """The node's STATE item, if any."""
        return self._get(instance_id, STATE_SK)

    def report_claim(self, req: AdmitRequest) -> dict[str, Any] | None:
        """The remediation that already took ``req``'s report on this node, if any."""
        if not req.report:
            return None
        return self._get(req.instance_id, report_sk(req.report))

    def guard(self, cluster: str) -> dict[str, Any]:
        """The cluster's guard item (a fresh one at version 0 when absent)."""
        item = self._get(guard_pk(cluster), GUARD_SK)
        guard = item or {"version": 0, "admissions": [], "open_instances": []}
        guard.setdefault("held", [])
        return guard

    # -- admission ----------------------------------------------------------------------------

    def admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """Claim the node for a remediation, unless it is open already or the guard trips.

        The decision is ``rule`` (``logic.admission.decide``) on the node's STATE and the guard
        item; an ``admitted`` one is committed under the guard's version, and a lost race
        re-reads.
        """
        for _ in range(_MAX_ATTEMPTS):
            state = self.state(req.instance_id)
            guard = self.guard(req.cluster)
            now = clock.now()
            snapshot = GuardSnapshot(
                node=state,
                admissions=guard["admissions"],
                open_instances=guard["open_instances"],
                held=guard["held"],
                report=self.report_claim(req),
            )
            decision = rule(req, snapshot, now)
            if decision.decision != "admitted" or decision.remediation_id is not None:
                return decision
            remediation_id = f"r-{uuid.uuid4().hex[:16]}"
            recent = recent_admissions(guard["admissions"], now)
            if self._commit_admission(req, remediation_id, guard, recent, now):
                return AdmitDecision("admitted", remediation_id, "admitted")
        raise AwsApiUnavailable(
            f"admission of {req.instance_id} lost {_MAX_ATTEMPTS} races on the guard item; retry"
        )

    def would_admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """What ``admit`` would decide now with ``rule``, without claiming anything (shadow
        mode)."""
        guard = self.guard(req.cluster)
        snapshot = GuardSnapshot(
            node=self.state(req.instance_id),
            admissions=guard["admissions"],
            open_instances=guard["open_instances"],
            held=guard["held"],
            report=self.report_claim(req),
        )
        return rule(req, snapshot, clock.now())

    def claim_report(self, req: AdmitRequest, remediation_id: str) -> dict[str, Any] | None:
        """Claim ``req``'s report for ``remediation_id`` outside an admission (a shadowed
        alarm, which claims nothing else): None when claimed now (or by this very execution and
        item before: a retry), else the claim that took it first."""
        if not req.report:
            return None
        item = self._report_item(req, remediation_id)
        try:
            with aws.aws_errors("dynamodb:PutItem"):
                self._ddb.put_item(
                    TableName=self.table,
                    Item=to_item(item),
                    ConditionExpression="attribute_not_exists(pk)",
                )
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) != "ConditionalCheckFailedException":
                raise
            claimed = self.report_claim(req) or {}
            mine = claimed.get("execution") == req.execution and (
                claimed.get("item") is None or req.item is None or claimed["item"] == req.item
            )
            return None if mine else claimed
        return None

    def release_report(self, instance_id: str, report: str, remediation_id: str) -> None:
        """Give the report back after its remediation failed before anyone decided (cordon or
        the health check could not run): the same evidence may be remediated again. Only the
        claim ``remediation_id`` holds is removed."""
        try:
            with aws.aws_errors("dynamodb:DeleteItem"):
                self._ddb.delete_item(
                    TableName=self.table,
                    Key=to_item({"pk": instance_id, "sk": report_sk(report)}),
                    ConditionExpression="remediation_id = :rid",
                    ExpressionAttributeValues=to_item({":rid": remediation_id}),
                )
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) != "ConditionalCheckFailedException":
                raise

    @staticmethod
    def _report_item(req: AdmitRequest, remediation_id: str) -> dict[str, Any]:
        item = {
            "pk": req.instance_id,
            "sk": report_sk(req.report or "-"),
            "remediation_id": remediation_id,
            "execution": req.execution,
            "item": req.item,
            "at": clock.iso(clock.now()),
        }
        return {k: v for k, v in item.items() if v is not None}

    def _commit_admission(
        self,
        req: AdmitRequest,
        remediation_id: str,
        guard: dict[str, Any],
        recent: list[dict[str, Any]],
        now: Any,
    ) -> bool:
        """One optimistic attempt; False when another admission changed the guard or the node."""
        at = clock.iso(now)
        version = int(guard["version"])
        state = {
            "pk": req.instance_id,
            "sk": STATE_SK,
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
            "pk": guard_pk(req.cluster),
            "sk": GUARD_SK,
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
        state = {k: v for k, v in state.items() if v is not None}
        guard_condition: dict[str, Any] = (
            {"ConditionExpression": "attribute_not_exists(pk)"}
            if version == 0
            else {
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": to_item({":v": version}),
            }
        )
        claim = (
            [
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(self._report_item(req, remediation_id)),
                        # One remediation per report: a second admission of the same report
                        # loses here and re-reads it as a duplicate.
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            ]
            if req.report
            else []
        )
        items = [
            *claim,
            {
                "Put": {
                    "TableName": self.table,
                    "Item": to_item(state),
                    "ConditionExpression": "attribute_not_exists(pk) OR #open = :false",
                    "ExpressionAttributeNames": {"#open": "open"},
                    "ExpressionAttributeValues": to_item({":false": False}),
                }
            },
            {"Put": {"TableName": self.table, "Item": to_item(new_guard), **guard_condition}},
            {
                "Put": {
                    "TableName": self.table,
                    "Item": to_item(
                        self._event(
                            req.instance_id,
                            remediation_id,
                            "admitted",
                            {
                                "cluster": req.cluster,
                                "node_name": req.node_name,
                                "execution": req.execution,
                            },
                            at,
                        )
                    ),
                }
            },
        ]
        try:
            with aws.aws_errors("dynamodb:TransactWriteItems"):
                self._ddb.transact_write_items(TransactItems=items)
        except botocore.exceptions.ClientError as exc:
            if _lost_race(exc):
                return False
            raise
        return True

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
        for _ in range(_MAX_ATTEMPTS):
            state = self.state(instance_id)
            if not state or state.get("remediation_id") != remediation_id or not state.get("open"):
                return False
            guard = self.guard(cluster)
            held = [
                h for h in guard["held"] if not (release_hold and h["instance_id"] == instance_id)
            ]
            items = [
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": to_item({"pk": instance_id, "sk": STATE_SK}),
                        "UpdateExpression": "SET #open = :false, #status = :status, closed_at = :at",
                        "ConditionExpression": "remediation_id = :rid AND #open = :true",
                        "ExpressionAttributeNames": {"#open": "open", "#status": "status"},
                        "ExpressionAttributeValues": to_item(
                            {
                                ":false": False,
                                ":true": True,
                                ":status": status,
                                ":at": clock.iso(clock.now()),
                                ":rid": remediation_id,
                            }
                        ),
                    }
                }
            ]
            guard_update = self._guard_update(
                cluster,
                guard,
                open_instances=[i for i in guard["open_instances"] if i != instance_id],
                held=held,
            )
            if guard_update is not None:
                items.append(guard_update)
            try:
                with aws.aws_errors("dynamodb:TransactWriteItems"):
                    self._ddb.transact_write_items(TransactItems=items)
                return True
            except botocore.exceptions.ClientError as exc:
                if not _lost_race(exc):
                    raise
        raise AwsApiUnavailable(f"closing {remediation_id} lost {_MAX_ATTEMPTS} races; retry")

    def _guard_update(
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
        return {
            "Update": {
                "TableName": self.table,
                "Key": to_item({"pk": guard_pk(cluster), "sk": GUARD_SK}),
                "UpdateExpression": "SET open_instances = :open, held = :held, version = :next",
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": to_item(
                    {":open": open_instances, ":held": held, ":next": version + 1, ":v": version}
                ),
            }
        }

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
        state = self.state(instance_id)
        if not state or not state.get("open") or state.get("execution") != execution:
            return None
        if item is not None and state.get("item") is not None and int(state["item"]) != item:
            return None  # another item of the same alarm owns it (this one was a duplicate)
        rid = state["remediation_id"]
        closed = self.close(cluster, instance_id, rid, status, release_hold=release_hold)
        return rid if closed else None

    def open_remediations(self) -> list[dict[str, Any]]:
        """Every open STATE item (the sweeper's work list; the table is small)."""
        out: list[dict[str, Any]] = []
        with aws.aws_errors("dynamodb:Scan"):
            for page in self._ddb.get_paginator("scan").paginate(
                TableName=self.table,
                FilterExpression="sk = :state AND #open = :true",
                ExpressionAttributeNames={"#open": "open"},
                ExpressionAttributeValues=to_item({":state": STATE_SK, ":true": True}),
                ConsistentRead=True,
            ):
                out.extend(from_item(i) for i in page.get("Items", []))
        return out

    def held(self, cluster: str) -> list[dict[str, Any]]:
        """Nodes admitted (cordoned) and not released, oldest first."""
        return sorted(self.guard(cluster)["held"], key=lambda h: int(h["at"]))

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
            state = self.state(instance_id)
            if not state or not state.get("cluster"):
                raise NodeNotHeld(f"{node}: sdc-guard never remediated this node")
            cluster = str(state["cluster"])
        for _ in range(_MAX_ATTEMPTS):
            guard = self.guard(cluster)
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
            update = self._guard_update(
                cluster,
                guard,
                open_instances=list(guard["open_instances"]),
                held=[h for h in guard["held"] if h["instance_id"] != instance_id],
            )
            if update is None:  # unreachable: a held entry implies a written guard
                raise NodeNotHeld(f"{node} is not held (no guard item for {cluster})")
            try:
                with aws.aws_errors("dynamodb:TransactWriteItems"):
                    self._ddb.transact_write_items(TransactItems=[update])
                break
            except botocore.exceptions.ClientError as exc:
                if not _lost_race(exc):
                    raise
        else:
            raise AwsApiUnavailable(f"releasing {node} lost {_MAX_ATTEMPTS} races; retry")
        self.record(
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

    # -- transitions --------------------------------------------------------------------------

    @staticmethod
    def _event(
        pk: str, remediation_id: str, transition: str, attrs: dict[str, Any], at: str, n: int = 0
    ) -> dict[str, Any]:
        return {
            "pk": pk,
            "sk": f"EVENT#{at}#{remediation_id}#{n}",
            "transition": transition,
            "remediation_id": remediation_id,
            "at": at,
            **{k: v for k, v in attrs.items() if v is not None},
        }

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
        for n in range(_MAX_ATTEMPTS):
            item = self._event(pk, remediation_id, transition, attrs, at, n)
            try:
                with aws.aws_errors("dynamodb:PutItem"):
                    self._ddb.put_item(
                        TableName=self.table,
                        Item=to_item(item),
                        ConditionExpression="attribute_not_exists(pk)",
                    )
                break
            except botocore.exceptions.ClientError as exc:
                if aws.error_code(exc) != "ConditionalCheckFailedException":
                    raise
        else:
            raise AwsApiUnavailable(f"could not record {transition} for {pk}")
        if update_status:
            self._set_status(pk, remediation_id, transition)
        return item["sk"]

    def _set_status(self, instance_id: str, remediation_id: str, status: str) -> None:
        try:
            with aws.aws_errors("dynamodb:UpdateItem"):
                self._ddb.update_item(
                    TableName=self.table,
                    Key=to_item({"pk": instance_id, "sk": STATE_SK}),
                    UpdateExpression="SET #status = :status",
                    ConditionExpression="remediation_id = :rid",
                    ExpressionAttributeNames={"#status": "status"},
                    ExpressionAttributeValues=to_item({":status": status, ":rid": remediation_id}),
                )
        except botocore.exceptions.ClientError as exc:
            # No STATE (cluster-level event) or another remediation owns the node now.
            if aws.error_code(exc) != "ConditionalCheckFailedException":
                raise

    def first_in_episode(
        self, cluster: str, episode: str, transition: str, quiet_seconds: int
    ) -> bool:
        """Whether this ``transition`` of ``episode`` (an alarm contributor) is the first of
        its episode: True when none was recorded within the last ``quiet_seconds``.

        Every call extends the episode (the same item, its ``until`` moved on), so an alarm
        that flaps every 20 s is one episode and one message for as long as it flaps; one that
        stays quiet for ``quiet_seconds`` starts a new one. The item expires a day after.
        """
        now = int(clock.now().timestamp())
        until = now + quiet_seconds
        with aws.aws_errors("dynamodb:UpdateItem"):
            old = self._ddb.update_item(
                TableName=self.table,
                Key=to_item(
                    {"pk": cluster_pk(cluster), "sk": f"NOTICE#{episode}#{transition}"[:1024]}
                ),
                UpdateExpression=(
                    "SET #until = :until, expires_at = :expires, last_at = :at ADD occurrences :one"
                ),
                ExpressionAttributeNames={"#until": "until"},
                ExpressionAttributeValues=to_item(
                    {
                        ":until": until,
                        ":expires": until + 86400,
                        ":at": clock.iso(clock.now()),
                        ":one": 1,
                    }
                ),
                # The whole item as it was: an attribute set to the value it already had is
                # not "updated", so UPDATED_OLD may leave `until` out.
                ReturnValues="ALL_OLD",
            ).get("Attributes")
        previous = from_item(old) or {}
        return int(previous.get("until", 0)) < now

    def due(self, cluster: str, what: str, every_seconds: int) -> bool:
        """Claim the ``what`` that is due once every ``every_seconds`` (a reminder): True for
        the first caller after the period ended, False for everyone until the next one."""
        now = int(clock.now().timestamp())
        try:
            with aws.aws_errors("dynamodb:UpdateItem"):
                self._ddb.update_item(
                    TableName=self.table,
                    Key=to_item({"pk": cluster_pk(cluster), "sk": f"DUE#{what}"}),
                    UpdateExpression="SET next_at = :next, last_at = :at",
                    ConditionExpression="attribute_not_exists(next_at) OR next_at <= :now",
                    ExpressionAttributeValues=to_item(
                        {":next": now + every_seconds, ":now": now, ":at": clock.iso(clock.now())}
                    ),
                )
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def events(self, pk: str) -> list[dict[str, Any]]:
        """Every transition recorded under ``pk`` (an instance id), oldest first."""
        ddb = self._ddb
        out: list[dict[str, Any]] = []
        with aws.aws_errors("dynamodb:Query"):
            for page in ddb.get_paginator("query").paginate(
                TableName=self.table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :ev)",
                ExpressionAttributeValues=to_item({":pk": pk, ":ev": "EVENT#"}),
            ):
                out.extend(from_item(i) for i in page.get("Items", []))
        return out

    def all_events(self) -> list[dict[str, Any]]:
        """Every transition in the table, oldest first (operator history; the table is small)."""
        out: list[dict[str, Any]] = []
        with aws.aws_errors("dynamodb:Scan"):
            for page in self._ddb.get_paginator("scan").paginate(
                TableName=self.table,
                FilterExpression="begins_with(sk, :ev)",
                ExpressionAttributeValues=to_item({":ev": "EVENT#"}),
            ):
                out.extend(from_item(i) for i in page.get("Items", []))
        return sorted(out, key=lambda e: e["sk"].split("#", 2)[1])

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


__all__ = [
    "RELEASING_TRANSITIONS",
    "Ledger",
    "cluster_pk",
    "encode_detail",
    "guard_pk",
]

_RACE_REASONS = {"None", "ConditionalCheckFailed", "TransactionConflict", "ThrottlingError"}


def _lost_race(exc: botocore.exceptions.ClientError) -> bool:
    """Whether a failed transaction lost a race (re-read and retry) rather than being invalid."""
    code = aws.error_code(exc)
    if code == "TransactionConflictException":
        return True
    if code != "TransactionCanceledException":
        return False
    reasons = exc.response.get("CancellationReasons") or []
    return all(str(r.get("Code", "None")) in _RACE_REASONS for r in reasons)


def encode_detail(detail: dict[str, Any]) -> str:
    """Transition details are stored as a JSON string (free-form, not queried)."""
    return json.dumps(detail, sort_keys=True, default=str)
