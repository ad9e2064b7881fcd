"""Settings that are JSON objects (``checkModes``, ``autoApprove``): given as an object in
cdk.json, as its JSON text in an environment variable."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def json_object(value: Any, example: str) -> Mapping[str, Any] | None:
    """``value`` as a mapping (parsed when it is JSON text); None for empty text. ValueError
    says what is wrong, showing ``example`` when it is not an object."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON object: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an object like {example}, got {value!r}")
    return value
