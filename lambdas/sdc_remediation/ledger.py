"""The remediation ledger (DynamoDB): one open remediation per node, the blast-radius guard,
and a transition history per node (repeat offenders).

Items (docs/CONTRACT.md, "DynamoDB tables"):
- ``pk=<instance id>, sk=STATE``: the node's current remediation (``open``, ``remediation_id``,
  ``status``, ``cluster``, ``admitted_at``, ``node_name``, ``execution``).
- ``pk=<instance id>, sk=EVENT#<iso time>#<remediation id>#<n>``: one per transition.
  Cluster-level transitions (ambiguous, no suspects, a failure before any node is known) use
  ``pk=CLUSTER#<cluster>``.
- ``pk=GUARD#<cluster>, sk=GUARD``: the guard's own item (``version``, ``admissions`` in the last
  hour, ``open_instances``). It carries no ``cluster``/``admitted_at``, so the ``by_cluster`` GSI
  never sees it.

A remediation is open from its admission until ``record`` writes any terminal transition for
it (released, replaced, replaced_by_hyperpod, rejected, approval_timed_out, failed): ``close``
then frees the node and its place in ``open_instances``. ``duplicate`` therefore means a
remediation still in flight; a node left cordoned after a human decision, a timeout or a failure
is admitted again (as a new remediation) by its next alarm. The hourly admission count is kept
regardless of closing.

Why a guard item: the GSI is eventually consistent, so counting admissions through it lets two
concurrent alarms both see "1 admitted" and both admit. Every admission instead rewrites the
guard item under ``version = :read_version`` in the same transaction that claims the node's STATE
(``open`` must be false or absent), so concurrent admissions serialise: a loser re-reads and
re-decides. The same transaction makes a duplicate event a no-op.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import botocore.exceptions

from . import aws, clock
from .dynamo import from_item, to_item
from .errors import AwsApiUnavailable

STATE_SK = "STATE"
GUARD_SK = "GUARD"
WINDOW = timedelta(hours=1)
_MAX_ATTEMPTS = 8


def guard_pk(cluster: str) -> str:
    """Partition key of a cluster's guard item."""
    return f"GUARD#{cluster}"


def cluster_pk(cluster: str) -> str:
    """Partition key for transitions that concern no single node."""
    return f"CLUSTER#{cluster}"


@dataclass(frozen=True)
class AdmitRequest:
    """What admission needs to know about one suspect."""

    cluster: str
    instance_id: str
    node_name: str
    execution: str
    cluster_nodes: int
    max_nodes_per_hour: int
    max_fraction: float
    suspects_in_alarm: int = 1
    """How many nodes the alarm that named this one names in all."""


@dataclass(frozen=True)
class AdmitDecision:
    """The ledger's answer: admitted, duplicate or circuit_open, and why."""

    decision: str
    remediation_id: str | None
    reason: str


def max_open(cluster_nodes: int, max_fraction: float) -> int:
    """How many nodes may be in remediation at once.

    At least one: on a small cluster ``MAX_FRACTION`` of the nodes is below one node, and a guard
    that can never admit anything would disable the system there. ``MAX_NODES_PER_HOUR`` still
    caps the rate.
    """
    return max(1, math.floor(cluster_nodes * max_fraction))


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

    def guard(self, cluster: str) -> dict[str, Any]:
        """The cluster's guard item (a fresh one at version 0 when absent)."""
        item = self._get(guard_pk(cluster), GUARD_SK)
        return item or {"version": 0, "admissions": [], "open_instances": []}

    # -- admission ----------------------------------------------------------------------------

    def admit(self, req: AdmitRequest) -> AdmitDecision:
        """Claim the node for a remediation, unless it is open already or the guard trips."""
        for _ in range(_MAX_ATTEMPTS):
            state = self.state(req.instance_id)
            if state and state.get("open"):
                if state.get("execution") == req.execution:
                    # Our own earlier attempt wrote it (the Lambda was retried): same answer.
                    return AdmitDecision(
                        "admitted", state["remediation_id"], "already admitted by this execution"
                    )
                return AdmitDecision(
                    "duplicate",
                    state.get("remediation_id"),
                    f"node {req.node_name} already has open remediation {state.get('remediation_id')} "
                    f"({state.get('status')})",
                )
            guard = self.guard(req.cluster)
            now = clock.now()
            recent = [a for a in guard["admissions"] if a["at"] > int((now - WINDOW).timestamp())]
            open_now = [i for i in guard["open_instances"] if i != req.instance_id]
            limit_open = max_open(req.cluster_nodes, req.max_fraction)
            budget = min(req.max_nodes_per_hour, limit_open)
            if req.suspects_in_alarm > budget:
                # An alarm naming more nodes than the guard would ever admit is a storm on its
                # own: cordoning the first few of them would be arbitrary. Refuse them all.
                return AdmitDecision(
                    "circuit_open",
                    None,
                    f"one alarm names {req.suspects_in_alarm} nodes, more than the blast radius "
                    f"allows ({budget}): many nodes at once is more likely software than hardware; "
                    "nothing is cordoned",
                )
            if len(recent) >= req.max_nodes_per_hour:
                return AdmitDecision(
                    "circuit_open",
                    None,
                    f"{len(recent)} node(s) admitted in the last hour (MAX_NODES_PER_HOUR="
                    f"{req.max_nodes_per_hour}): many nodes at once is more likely software than hardware",
                )
            if len(open_now) + 1 > limit_open:
                return AdmitDecision(
                    "circuit_open",
                    None,
                    f"{len(open_now)} of {req.cluster_nodes} node(s) already in remediation; one more "
                    f"exceeds MAX_FRACTION={req.max_fraction} (limit {limit_open})",
                )
            remediation_id = f"r-{uuid.uuid4().hex[:16]}"
            if self._commit_admission(req, remediation_id, guard, recent, open_now, now):
                return AdmitDecision("admitted", remediation_id, "admitted")
        raise AwsApiUnavailable(
            f"admission of {req.instance_id} lost {_MAX_ATTEMPTS} races on the guard item; retry"
        )

    def _commit_admission(
        self,
        req: AdmitRequest,
        remediation_id: str,
        guard: dict[str, Any],
        recent: list[dict[str, Any]],
        open_now: list[str],
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
        }
        new_guard = {
            "pk": guard_pk(req.cluster),
            "sk": GUARD_SK,
            "version": version + 1,
            "admissions": [*recent, {"instance_id": req.instance_id, "at": int(now.timestamp())}],
            "open_instances": [*open_now, req.instance_id],
        }
        guard_condition: dict[str, Any] = (
            {"ConditionExpression": "attribute_not_exists(pk)"}
            if version == 0
            else {
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": to_item({":v": version}),
            }
        )
        items = [
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

    def close(self, cluster: str, instance_id: str, remediation_id: str, status: str) -> bool:
        """Mark the node's remediation closed (any terminal transition) and free its place in
        the guard; its admission still counts towards the hourly cap.

        Returns False when the node's open remediation is another one (nothing to close).
        """
        for _ in range(_MAX_ATTEMPTS):
            state = self.state(instance_id)
            if not state or state.get("remediation_id") != remediation_id or not state.get("open"):
                return False
            guard = self.guard(cluster)
            version = int(guard["version"])
            items = [
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": to_item({"pk": instance_id, "sk": STATE_SK}),
                        "UpdateExpression": "SET #open = :false, #status = :status, closed_at = :at",
                        "ConditionExpression": "remediation_id = :rid",
                        "ExpressionAttributeNames": {"#open": "open", "#status": "status"},
                        "ExpressionAttributeValues": to_item(
                            {
                                ":false": False,
                                ":status": status,
                                ":at": clock.iso(clock.now()),
                                ":rid": remediation_id,
                            }
                        ),
                    }
                }
            ]
            if version > 0:
                items.append(
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": guard_pk(cluster), "sk": GUARD_SK}),
                            "UpdateExpression": "SET open_instances = :open, version = :next",
                            "ConditionExpression": "version = :v",
                            "ExpressionAttributeValues": to_item(
                                {
                                    ":open": [
                                        i for i in guard["open_instances"] if i != instance_id
                                    ],
                                    ":next": version + 1,
                                    ":v": version,
                                }
                            ),
                        }
                    }
                )
            try:
                with aws.aws_errors("dynamodb:TransactWriteItems"):
                    self._ddb.transact_write_items(TransactItems=items)
                return True
            except botocore.exceptions.ClientError as exc:
                if not _lost_race(exc):
                    raise
        raise AwsApiUnavailable(f"closing {remediation_id} lost {_MAX_ATTEMPTS} races; retry")

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
