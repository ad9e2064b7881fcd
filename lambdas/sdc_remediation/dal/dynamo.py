"""Plain-Python <-> DynamoDB attribute values, for the low-level client (one client per service)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

_ser = TypeSerializer()
_de = TypeDeserializer()


def to_item(values: dict[str, Any]) -> dict[str, Any]:
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
