"""The one way ``dal`` talks to DynamoDB: plain-Python <-> attribute values, and ``Table``.

Every read and write of a table goes through ``Table`` (the low-level client, one per service),
so its idioms are written once:

- a conditional write says whether its condition held: ``put_if``, ``update_if`` and
  ``delete_if`` answer False on ConditionalCheckFailed (the item was not as the caller read it:
  a lost race, or a claim someone else holds); a transaction answers False when it lost a race
  (``transact``, ``lost_race``). A caller that loses re-reads and decides again, at most
  ``RACE_ATTEMPTS`` times;
- a read of many items follows LastEvaluatedKey to the end (``query``, ``scan``).

Keys and items are plain dicts (keys from ``keys``); expression values are plain too, and
serialised here. Every call is wrapped in ``aws.aws_errors`` (throttling, 5xx, denials).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import botocore.exceptions
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from .. import aws

_ser = TypeSerializer()
_de = TypeDeserializer()

RACE_ATTEMPTS = 8
"""How often a read-decide-write loop tries before giving up (``AwsApiUnavailable``: the
workflow retries the step)."""

CONDITION_FAILED = "ConditionalCheckFailedException"
_RACE_REASONS = {"None", "ConditionalCheckFailed", "TransactionConflict", "ThrottlingError"}


def to_item(values: Mapping[str, Any]) -> dict[str, Any]:
    """Serialise a dict of str/int/bool/list/dict/None values into a DynamoDB item."""
    return {k: _ser.serialize(v) for k, v in values.items()}


def from_item(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """Deserialise an item; numbers come back as int where integral."""
    if item is None:
        return None
    return {k: _plain(_de.deserialize(v)) for k, v in item.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


def condition_failed(exc: botocore.exceptions.ClientError) -> bool:
    """Whether a write was refused because its condition did not hold."""
    return aws.error_code(exc) == CONDITION_FAILED


def lost_race(exc: botocore.exceptions.ClientError) -> bool:
    """Whether a failed transaction lost a race (re-read and retry) rather than being invalid."""
    code = aws.error_code(exc)
    if code == "TransactionConflictException":
        return True
    if code != "TransactionCanceledException":
        return False
    reasons = exc.response.get("CancellationReasons") or []
    return all(str(r.get("Code", "None")) in _RACE_REASONS for r in reasons)


def expression(
    *,
    key_condition: str | None = None,
    where: str | None = None,
    update: str | None = None,
    condition: str | None = None,
    names: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A request's expression parameters, only those given (``values`` serialised)."""
    request: dict[str, Any] = {}
    if key_condition is not None:
        request["KeyConditionExpression"] = key_condition
    if where is not None:
        request["FilterExpression"] = where
    if update is not None:
        request["UpdateExpression"] = update
    if condition is not None:
        request["ConditionExpression"] = condition
    if names:
        request["ExpressionAttributeNames"] = dict(names)
    if values:
        request["ExpressionAttributeValues"] = to_item(values)
    return request


def at_version(version: int) -> dict[str, Any]:
    """The condition of an optimistic rewrite of an item read at ``version`` (0: it did not
    exist), for ``put_if`` and ``put_op``: a writer that changed it first makes it fail."""
    if version == 0:
        return {"condition": "attribute_not_exists(pk)"}
    return {"condition": "version = :v", "values": {":v": version}}


Names = Mapping[str, str] | None
Values = Mapping[str, Any] | None


class Table:
    """One table through the low-level client (built lazily: ``aws.client``). Expressions are
    DynamoDB's; ``names`` and ``values`` are their placeholders, ``values`` plain."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _call(self, operation: str, method: str, **request: Any) -> dict[str, Any]:
        with aws.aws_errors(f"dynamodb:{operation}"):
            return getattr(aws.client("dynamodb"), method)(TableName=self.name, **request)

    def _written(self, operation: str, method: str, **request: Any) -> bool:
        """A conditional write: False when its condition did not hold."""
        try:
            self._call(operation, method, **request)
        except botocore.exceptions.ClientError as exc:
            if not condition_failed(exc):
                raise
            return False
        return True

    # -- single items ---------------------------------------------------------------------------

    def get(self, key: Mapping[str, Any], **request: Any) -> dict[str, Any] | None:
        """The item (a consistent read), or None."""
        resp = self._call("GetItem", "get_item", Key=to_item(key), ConsistentRead=True, **request)
        return from_item(resp.get("Item"))

    def put(self, item: Mapping[str, Any]) -> None:
        """Write ``item`` whatever was there."""
        self._call("PutItem", "put_item", Item=to_item(item))

    def put_if(
        self, item: Mapping[str, Any], condition: str, *, names: Names = None, values: Values = None
    ) -> bool:
        """Write ``item`` if ``condition`` holds; False when it did not."""
        request = expression(condition=condition, names=names, values=values)
        return self._written("PutItem", "put_item", Item=to_item(item), **request)

    def update(
        self,
        key: Mapping[str, Any],
        update: str,
        *,
        condition: str | None = None,
        names: Names = None,
        values: Values = None,
        **request: Any,
    ) -> dict[str, Any] | None:
        """Update the item; a ``condition`` that fails raises (the caller expects it to hold).
        Returns the attributes ``ReturnValues`` asked for (None: none)."""
        request |= expression(update=update, condition=condition, names=names, values=values)
        resp = self._call("UpdateItem", "update_item", Key=to_item(key), **request)
        return from_item(resp.get("Attributes"))

    def update_if(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str,
        *,
        names: Names = None,
        values: Values = None,
    ) -> bool:
        """Update the item if ``condition`` holds; False when it did not."""
        request = expression(update=update, condition=condition, names=names, values=values)
        return self._written("UpdateItem", "update_item", Key=to_item(key), **request)

    def delete_if(
        self, key: Mapping[str, Any], condition: str, *, names: Names = None, values: Values = None
    ) -> bool:
        """Delete the item if ``condition`` holds; False when it did not."""
        request = expression(condition=condition, names=names, values=values)
        return self._written("DeleteItem", "delete_item", Key=to_item(key), **request)

    # -- transactions ---------------------------------------------------------------------------

    def put_op(
        self,
        item: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Names = None,
        values: Values = None,
    ) -> dict[str, Any]:
        """A transaction's Put of ``item``."""
        request = expression(condition=condition, names=names, values=values)
        return {"Put": {"TableName": self.name, "Item": to_item(item), **request}}

    def update_op(
        self,
        key: Mapping[str, Any],
        update: str,
        *,
        condition: str | None = None,
        names: Names = None,
        values: Values = None,
    ) -> dict[str, Any]:
        """A transaction's Update of the item at ``key``."""
        request = expression(update=update, condition=condition, names=names, values=values)
        return {"Update": {"TableName": self.name, "Key": to_item(key), **request}}

    def transact(self, items: list[dict[str, Any]]) -> bool:
        """Write ``items`` (``put_op``, ``update_op``) all or none; False when the transaction
        lost a race (a condition that no longer held, a conflicting writer): re-read."""
        try:
            with aws.aws_errors("dynamodb:TransactWriteItems"):
                aws.client("dynamodb").transact_write_items(TransactItems=items)
        except botocore.exceptions.ClientError as exc:
            if not lost_race(exc):
                raise
            return False
        return True

    # -- many items -----------------------------------------------------------------------------

    def query(
        self, key_condition: str, *, names: Names = None, values: Values = None, **request: Any
    ) -> list[dict[str, Any]]:
        """Every item the query matches, page after page."""
        request |= expression(key_condition=key_condition, names=names, values=values)
        return self._pages("Query", "query", request)

    def query_page(
        self, key_condition: str, *, names: Names = None, values: Values = None, **request: Any
    ) -> list[dict[str, Any]]:
        """The items of the query's first page only (with ``Limit``: the first ones)."""
        request |= expression(key_condition=key_condition, names=names, values=values)
        resp = self._call("Query", "query", **request)
        return [from_item(i) or {} for i in resp.get("Items") or []]

    def scan(
        self, where: str, *, names: Names = None, values: Values = None, **request: Any
    ) -> list[dict[str, Any]]:
        """Every item the scan keeps (``where``: its FilterExpression), page after page."""
        request |= expression(where=where, names=names, values=values)
        return self._pages("Scan", "scan", request)

    def _pages(self, operation: str, method: str, request: dict[str, Any]) -> list[dict[str, Any]]:
        """Follow LastEvaluatedKey to the last page (botocore's paginator)."""
        out: list[dict[str, Any]] = []
        with aws.aws_errors(f"dynamodb:{operation}"):
            paginator = aws.client("dynamodb").get_paginator(method)
            for page in paginator.paginate(TableName=self.name, **request):
                out.extend(from_item(i) or {} for i in page.get("Items", []))
        return out


__all__ = [
    "RACE_ATTEMPTS",
    "Table",
    "at_version",
    "condition_failed",
    "expression",
    "from_item",
    "lost_race",
    "to_item",
]
